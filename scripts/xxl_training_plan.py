"""Per-chip memory and chip-hours of the eight Table-2 fine-tunes on TPU v4.

  python scripts/xxl_training_plan.py

The runs are gin/train/table2/{xxl,large,base,small}_{ende,cnndm}.gin, laid
out abstractly (no TPU needed) on every v4 slice from v4-8 to v4-256; what
is counted and how chip-hours are estimated: specdec/bench/xxl_training_plan.py.

Writes results/xxl_training_plan.md and results/xxl_training_plan.json.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, installed or not
from specdec import fileio
from specdec.bench import xxl_training_plan as plan


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--out_dir', default='results')
  parser.add_argument('--mfu', type=float, default=plan.MFU)
  parser.add_argument('--headroom', type=float, default=plan.HEADROOM)
  parser.add_argument('--microbatches', type=int, nargs='+', default=[1, 2, 4],
                      help='gradient-accumulation counts to tabulate (1: what '
                           'specdec.training.train does)')
  args = parser.parse_args(argv)
  report = plan.build_report(
      command=' '.join(['python scripts/xxl_training_plan.py'] + list(
          sys.argv[1:] if argv is None else argv)),
      mfu=args.mfu, headroom=args.headroom, microbatches=args.microbatches,
      runs=plan.RUNS, slices=plan.SLICES)
  stem = os.path.join(args.out_dir, 'xxl_training_plan')
  fileio.atomic_write(stem + '.json', json.dumps(report, indent=1).encode())
  fileio.atomic_write(stem + '.md', plan.render_markdown(report).encode())
  print(f'Wrote {stem}.md and {stem}.json.')
  return report


if __name__ == '__main__':
  main()
