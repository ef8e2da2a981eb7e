"""Whether γ 'auto' picks otherwise from acceptance by depth than from one α, on stored main-job tables.

  python scripts/gamma_auto_by_depth.py results/main_job/main_job_v2_f128_bigram_auto.json \
      results/main_job/main_job_v3_f128_bigram_auto.json results/main_job/main_job_v2_beside_v3.json \
      --out results/compare/gamma_auto_by_depth

Choices stored before `auto_gamma` counted acceptance by depth hold one α. Each such row's benchmark summary
holds `acceptance_per_position` of its timed decode (the same first examples, at the chosen γ): P(draft k kept |
drafts < k kept), the first over target calls. From it (counts rebuilt with the row's target calls, then
`auto_gamma.acceptance_by_depth` with its judged drafts) and the stored verify-cost curve and c, this re-picks γ
two ways: from depths 1..PROBE_GAMMA, what today's calibration measures, and from every depth the row decoded.
Reads stored numbers only: nothing is decoded or timed. Writes `<out>.{md,json}`.
"""

import argparse
import datetime
import json
import os
import sys
from typing import Any, Dict, List, Mapping

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec.bench import auto_gamma  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import fileio  # pylint: disable=g-import-not-at-top,wrong-import-position


def repick(summary: Mapping[str, Any]) -> Dict[str, Any]:
  """One stored row's picks: one α (as stored), the calibration's depths, and every depth its decode reached."""
  choice = summary['gamma_auto']
  per_position = summary['acceptance_per_position']
  # A depth no round reached is stored as NaN; it and what lies beyond it add nothing.
  per_position = [a for a in per_position if a is not None and np.isfinite(a)]
  kept = np.round(summary['target_calls'] * np.cumprod(per_position))
  acceptance = auto_gamma.acceptance_by_depth(kept, summary['judged'])
  c, curve = choice['c_in_loop'], choice['verify_curve']
  one = auto_gamma.pick(choice['alpha'], c, curve)
  probe = auto_gamma.pick(choice['alpha'], c, curve, acceptance=acceptance[:auto_gamma.PROBE_GAMMA])
  every = auto_gamma.pick(choice['alpha'], c, curve, acceptance=acceptance)
  return {'task': summary['task'], 'drafter': summary['drafter'],
          'temperature': summary['setting']['temperature'], 'gamma_stored': choice['gamma'],
          'gamma_one_alpha': one['gamma'], 'calibration_alpha': choice['alpha'],
          'decoded_gamma': summary['setting']['gamma'], 'acceptance_by_depth': acceptance,
          'gamma_probe_depths': probe['gamma'], 'predicted_probe_depths': probe['predicted_speedup'],
          'gamma_every_depth': every['gamma'], 'predicted_every_depth': every['predicted_speedup'],
          'measured_speedup': summary['speedup']}


def report(paths: List[str]) -> Dict[str, Any]:
  rows = []
  for path in paths:
    with open(path, encoding='utf-8') as f:
      summaries = json.load(f)
    if not isinstance(summaries, list):
      raise SystemExit(f'{path}: expected a main-job table.json (a list of row summaries).')
    rows += [dict(repick(s), file=path) for s in summaries if s.get('gamma_auto')]
  if not rows:
    raise SystemExit(f"no γ 'auto' row in {', '.join(paths)}.")
  return {'command': 'python ' + ' '.join(['scripts/gamma_auto_by_depth.py'] + sys.argv[1:]),
          'date': datetime.date.today().isoformat(), 'probe_gamma': auto_gamma.PROBE_GAMMA, 'rows': rows}


def markdown(rep: Mapping[str, Any]) -> str:
  probe = rep['probe_gamma']
  lines = ["# γ 'auto' from acceptance by depth, on stored main-job rows", '',
           f"`{rep['command']}` · {rep['date']} · stored numbers only, nothing decoded or timed", '',
           f'Acceptance by depth is of each row\'s timed decode at its γ (the stored calibrations predate '
           f'per-depth counts); "depths 1..{probe}" is what the calibration at γ {probe} measures (the deepest '
           'standing for deeper drafts), "every depth" uses all the row decoded. Same verify-cost curve and c '
           'as the stored choice.', '',
           '| file | task | drafter | t | stored γ (one α) | acceptance by depth | '
           f'γ from depths 1..{probe} | γ from every depth | measured at stored γ |',
           '|---|---|---|---|---|---|---|---|---|']
  for r in rep['rows']:
    depths = ', '.join(f'{a:.2f}' for a in r['acceptance_by_depth'])
    mark = lambda g: f"**{g}**" if g != r['gamma_stored'] else str(g)
    lines.append(f"| {os.path.basename(r['file'])} | {r['task']} | {r['drafter']} | {r['temperature']:g} | "
                 f"{r['gamma_stored']} | {depths} | {mark(r['gamma_probe_depths'])} "
                 f"({r['predicted_probe_depths']:.2f}×) | {mark(r['gamma_every_depth'])} "
                 f"({r['predicted_every_depth']:.2f}×) | {r['measured_speedup']:.3f}× |")
  changed = sum(r['gamma_probe_depths'] != r['gamma_stored'] for r in rep['rows'])
  lines += ['', f"Bold: a pick that differs from the stored one. From depths 1..{probe}: {changed} of "
            f"{len(rep['rows'])} rows change."]
  return '\n'.join(lines) + '\n'


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('tables', nargs='+', help="main-job table.json files with γ 'auto' rows")
  parser.add_argument('--out', required=True, help='writes OUT.md and OUT.json')
  args = parser.parse_args(argv)
  rep = report(args.tables)
  fileio.write_json(args.out + '.json', rep)
  with open(args.out + '.md', 'w', encoding='utf-8') as f:
    f.write(markdown(rep))
  print(markdown(rep))


if __name__ == '__main__':
  main()
