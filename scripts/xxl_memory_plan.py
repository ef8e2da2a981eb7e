"""Per-chip memory of T5-XXL (target) + T5-small (drafter) on TPU v4 slices.

  python scripts/xxl_memory_plan.py

Lays both networks out abstractly (no TPU needed) on every v4 slice from
v4-8 to v4-128 and every power-of-two model width, for WMT EnDe and CNN/DM
at batch 1 and 32; what is counted, and why these lengths:
specdec/bench/xxl_memory_plan.py.

Writes results/xxl_memory_plan.md and results/xxl_memory_plan.json.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, installed or not
from specdec import fileio
from specdec import network
from specdec.bench import xxl_memory_plan as plan


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--out_dir', default='results')
  parser.add_argument('--gamma', type=int, default=plan.GAMMA)
  parser.add_argument('--param_dtype', default='bfloat16')
  parser.add_argument('--headroom', type=float, default=plan.HEADROOM)
  parser.add_argument('--parameter_partitioning_dims', type=int, default=1)
  parser.add_argument('--activation_partitioning_dims', type=int, default=1)
  args = parser.parse_args(argv)
  report = plan.build_report(
      network.t5_1_1_config('xxl', dtype='bfloat16'),
      network.t5_1_1_config('small', dtype='bfloat16'),
      command=' '.join(['python scripts/xxl_memory_plan.py'] + list(
          sys.argv[1:] if argv is None else argv)),
      slices=plan.SLICES, tasks=plan.TASKS, batches=plan.BATCHES,
      gamma=args.gamma, param_dtype=args.param_dtype, headroom=args.headroom,
      parameter_partitioning_dims=args.parameter_partitioning_dims,
      activation_partitioning_dims=args.activation_partitioning_dims)
  stem = os.path.join(args.out_dir, 'xxl_memory_plan')
  fileio.atomic_write(stem + '.json', json.dumps(report, indent=1).encode())
  fileio.atomic_write(stem + '.md', plan.render_markdown(report).encode())
  print(f'Wrote {stem}.md and {stem}.json ({len(report["rows"])} layouts).')
  return report


if __name__ == '__main__':
  main()
