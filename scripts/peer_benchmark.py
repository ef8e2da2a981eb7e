"""specdec beside Hugging Face assisted generation on the same weights.

  pip install -e '.[peers]'
  python scripts/peer_benchmark.py --target target --drafter d1kd --task ende --gamma 4 --examples 16

Exports the target and the drafter (compact directories, e.g. models/cpu/<name>) to transformers T5 and, in one
process, on the first examples of a local test split, times HF `generate` (greedy / sampling), HF assisted
generation (constant γ drafts, transformers 5's default schedule, optionally transformers 4's heuristic one) and
our baseline and speculative decoding (fixed γ and adaptive drafting), interleaved example by example. Writes
`<out>/<run>.{md,json,png}` (`specdec.bench.peers.run`): e.g. `--run peers` writes results/peers/peers.{md,json,png}
(the default name is <task>_<drafter>_g<γ>). Measure on a quiet machine.

The report also shows where each framework's time goes: its model calls timed by themselves (encoders, 1-token
and γ+1-token cached decoder calls of target and drafter, on the first examples) and, per system, the measured ms
per token beside what its counted calls cost at those prices; --no_call_costs leaves this out.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))

from specdec import task_names
from specdec.bench import benchmark  # pylint: disable=g-import-not-at-top
from specdec.bench import peers
from specdec.bench import reporting
from specdec import tasks

TASKS = {name: (task, dict(task_names.LOCAL_FEATURE_LENGTHS)) for name, task in task_names.LOCAL_TASK_BY_NAME.items()}


def _model_dir(name: str, models_dir: str) -> str:
  return name if os.path.isdir(name) else os.path.join(models_dir, name)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--target', default='target', help='name under --models, or a directory')
  parser.add_argument('--drafter', default='d1kd', help='name under --models, or a directory')
  parser.add_argument('--models', default='models/cpu')
  parser.add_argument('--task', choices=sorted(TASKS), default='ende')
  parser.add_argument('--split', default='test')
  parser.add_argument('--inputs_length', type=int, default=None)
  parser.add_argument('--targets_length', type=int, default=None)
  parser.add_argument('--examples', type=int, default=16)
  parser.add_argument('--gamma', type=int, default=4)
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  parser.add_argument('--hf_settings', nargs='+', default=['constant', 'hf_default'],
                      choices=list(peers.ASSISTANT_SETTINGS))
  parser.add_argument('--draft_confidence', type=float, default=0.5,
                      help='our adaptive-drafting row (0: none)')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--ours_batch_size', type=int, default=0,
                      help='> 1: also our decoders at this batch size (vs HF at batch 1 x this)')
  parser.add_argument('--torch_threads', type=int, default=None,
                      help="PyTorch's threads (default: os.cpu_count(), as XLA's CPU client)")
  parser.add_argument('--corpus_dir', default=None,
                      help='local corpus (default: data/corpus, else the embedded test slices)')
  parser.add_argument('--no_call_costs', action='store_true',
                      help="skip timing each framework's model calls by themselves (the report's "
                           "'Where the time goes' section)")
  parser.add_argument('--run', default=None,
                      help='report name (default: <task>_<drafter>_g<γ>; --run peers writes <out>/peers.md)')
  parser.add_argument('--out', default='results/peers')
  return parser.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    peers.require_peers()
  except ImportError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  corpus_dir = args.corpus_dir or (tasks.DEFAULT_CORPUS_DIR if os.path.exists(tasks.DEFAULT_CORPUS_DIR)
                                   else tasks.EMBEDDED_TEST_SLICES)
  tasks.register_local_tasks(corpus_dir)
  task_name, lengths = TASKS[args.task]
  lengths = dict(inputs=args.inputs_length or lengths['inputs'],
                 targets=args.targets_length or lengths['targets'])
  run_name = args.run or f'{args.task}_{os.path.basename(os.path.normpath(args.drafter))}_g{args.gamma}'
  summary = peers.run(
      _model_dir(args.target, args.models), _model_dir(args.drafter, args.models),
      benchmark.TaskSplit(task_name, args.split, lengths, args.examples),
      peers.PeerSetting(gamma=args.gamma, temperatures=tuple(args.temperatures), hf_settings=tuple(args.hf_settings),
                        draft_confidence=args.draft_confidence, repeats=args.repeats, seed=args.seed,
                        ours_batch_size=args.ours_batch_size, torch_threads=args.torch_threads),
      call_costs=peers.CallCostSetting(measure=not args.no_call_costs),
      output=peers.PeerOutput(args.out, run_name=run_name))
  for r in summary['rows']:
    print(f"t={r['temperature']:g} {r['framework']:>4} {r['system']:<22} {r['tokens_per_s']:8.0f} tokens/s  "
          f"speedup {reporting.fmt(r['speedup_vs_own_baseline'])}x  "
          f"target calls/example {r['target_calls_per_example']:.1f}")
  costs = summary.get('call_costs')
  if costs:
    hf_over_ours = costs['ratios']['hf_over_ours']
    print(f"call costs, HF / ours: target step {reporting.fmt(hf_over_ours['target_step'])}x, verify "
          f"{reporting.fmt(hf_over_ours['target_verify'])}x, drafter step {reporting.fmt(hf_over_ours['drafter_step'])}x")
  if summary['identity']:
    print(f"greedy HF vs ours identical: {100 * summary['identity']['hf_vs_ours_baseline']:.1f}%")
  print(f"Wrote {os.path.join(args.out, run_name)}.{{md,json,png}}")
  return 0


if __name__ == '__main__':
  sys.exit(main())
