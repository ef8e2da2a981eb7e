"""Collects benchmark rows (benchmark.json files) into one Table-2 style table beside the paper's numbers.

  python scripts/make_table2.py --rows results/table2_cpu/rows results/table2_cpu/rows_b8 --out results/table2_cpu

Writes OUT/table2.md, OUT/table2.json and OUT/table2.png (measured vs predicted speedups per row).
"""

import argparse
import glob
import json
import os
import sys

import numpy as np

# Runnable from a checkout without the package installed (as the repo's shell scripts call it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec import fileio  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.bench import plots
from specdec.bench import tables

ORDER = {'specdec_ende_local': 0, 'specdec_wmt_ende': 0, 'specdec_summarize_local': 1,
         'specdec_cnn_dailymail': 1}
DRAFTER_ORDER = {'d3': 0, 'small': 0, 'd2': 1, 'base': 1, 'd1': 2, 'large': 2, 'd1kd': 3}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rows', nargs='+', required=True, help='folders of rows (e.g. one per batch size)')
  parser.add_argument('--out', required=True)
  parser.add_argument('--command', default='')
  parser.add_argument('--title', default='CPU Table-2 analogue (shipped family, local DDTP test splits)')
  args = parser.parse_args()
  summaries = []
  for rows in args.rows:
    for path in glob.glob(os.path.join(rows, '*', 'benchmark.json')):
      with open(path, encoding='utf-8') as f:
        summaries.append(json.load(f))
  if not summaries:
    raise SystemExit(f'No benchmark.json under {args.rows}.')
  summaries.sort(key=lambda s: (ORDER.get(s['task'], 9), s['setting']['temperature'],
                                DRAFTER_ORDER.get(s['drafter'], 9), s['setting'].get('batch_size', 1)))
  text = tables.table2_markdown(summaries, title=args.title)
  if args.command:
    text = f'`{args.command}`\n\n' + text
  text += ('\n"paper drafter" is the paper\'s T5-XXL row for the drafter of corresponding relative size '
           '(d3 ≈ T5-small, d2 ≈ T5-base, d1 ≈ T5-large). Per-row details (acceptance per position, '
           'mismatches, quality, wall times): rows/*/benchmark.md.\n\n![Table 2 analogue](table2.png)\n')
  os.makedirs(args.out, exist_ok=True)
  fileio.atomic_write(os.path.join(args.out, 'table2.md'), text.encode())
  fileio.atomic_write(os.path.join(args.out, 'table2.json'), json.dumps(summaries, indent=2).encode())
  plot(os.path.join(args.out, 'table2.png'), summaries)
  print(text)


def plot(path, summaries):
  plt = plots.pyplot()
  labels = [f"{tables.TASK_LABEL.get(s['task'], s['task'])}\n{s['drafter']} t={s['setting']['temperature']:g}"
            f"\nbatch {s['setting'].get('batch_size', 1)}" for s in summaries]
  x = np.arange(len(summaries))
  fig, ax = plt.subplots(figsize=(max(8, len(summaries) * 0.9), 4.5))
  ax.bar(x - 0.2, [s['speedup'] for s in summaries], 0.2, label='measured')
  ax.bar(x, [s['predicted_speedup_costs'] for s in summaries], 0.2, label='predicted (measured costs)')
  ax.bar(x + 0.2, [s['predicted_speedup_thm38'] for s in summaries], 0.2, label='predicted (Thm 3.8)')
  paper = [tables.paper_row(s['task'], s['drafter'], s['setting']['temperature']) for s in summaries]
  ax.plot(x, [p[2] if p else np.nan for p in paper], 'k*', label='paper (T5-XXL, TPU)')
  ax.axhline(1.0, color='k', lw=0.8)
  ax.set_xticks(x)
  ax.set_xticklabels(labels, fontsize=7)
  ax.set_ylabel('speedup over the baseline')
  ax.legend(fontsize=8)
  plots.save_png(fig, path)


if __name__ == '__main__':
  main()
