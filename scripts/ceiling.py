"""The ceiling: measured speedup of the real loop against a controlled acceptance rate.

  python scripts/ceiling.py                       # the full grid on models/cpu_v2, 32 En→De test examples
  python scripts/ceiling.py --alphas 0.5 0.9 --gammas 1 4 --batch_sizes 1 --examples 8 \
      --out runs/ceiling_try --state runs/ceiling_try/state.json

Decodes the first --examples test examples greedily with the baseline and, interleaved with it batch by batch,
with the oracle drafter of controlled acceptance (`specdec/bench/oracle.py`) at every α* × γ, and with the shipped
drafters (--shipped) so the report places them under the ceiling; measures the target's verify-cost curve and
the in-loop costs in the same run, and the target's confidence on --confidence_examples held-out inputs.
Writes <out>/ceiling.{md,json,png}. Resumable: progress is kept in --state (delete it to measure afresh; a
state file of other settings or inputs is refused, never overwritten).
Takes about 45 minutes on 2 cores; measure on a quiet machine.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compare_drafters import LENGTHS, TASKS, parse_run  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.bench import ceiling  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.bench import ceiling_report
from specdec import evaluation
from specdec import fileio
from specdec import loading
from specdec.bench import plots
from specdec.bench import reporting
from specdec import tasks


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='models/cpu_v2', help='a model family directory (target/ and drafters)')
  parser.add_argument('--task', choices=sorted(TASKS), default='ende')
  parser.add_argument('--examples', type=int, default=32)
  parser.add_argument('--alphas', type=float, nargs='+', default=list(ceiling.ALPHAS))
  parser.add_argument('--gammas', type=int, nargs='+', default=list(ceiling.GAMMAS))
  parser.add_argument('--batch_sizes', type=int, nargs='+', default=list(ceiling.BATCH_SIZES))
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--seed', type=int, default=0, help="the oracle's draws")
  parser.add_argument('--max_verify_tokens', type=int, default=16)
  parser.add_argument('--shipped', nargs='*', type=parse_run, default=[('bigram', 1), ('trigram', 1),
                                                                            ('d1kd', 1)],
                      help='trained drafters to place under the ceiling, NAME:GAMMA (looked up in --models)')
  parser.add_argument('--confidence_examples', type=int, default=256,
                      help="held-out inputs for the target's confidence (0: skip)")
  parser.add_argument('--out', default='results/ceiling')
  parser.add_argument('--state', default='runs/ceiling/state.json', help='progress file of a resumable run')
  args = parser.parse_args(argv)
  settings = ceiling.Settings(alphas=tuple(args.alphas), gammas=tuple(args.gammas),
                              batch_sizes=tuple(args.batch_sizes), repeats=args.repeats, seed=args.seed,
                              max_verify_tokens=args.max_verify_tokens)
  try:
    settings.validate()
  except ValueError as e:
    parser.error(str(e))
  if args.examples < 1:
    parser.error(f'--examples must be >= 1, got {args.examples}')
  for name, _ in args.shipped:
    path = name if os.path.isdir(name) else os.path.join(args.models, name)
    if not os.path.isdir(path):
      parser.error(f'no drafter {name!r}: {path} is not a directory')
  if not os.path.isdir(os.path.join(args.models, 'target')):
    parser.error(f'no target in {args.models} (expected {os.path.join(args.models, "target")}/)')
  return args, settings


def main(argv=None):
  args, settings = parse_args(argv)
  tasks.register_tasks()
  target_module, target_params = loading.load_module_and_params(os.path.join(args.models, 'target'))
  examples = evaluation.task_examples(TASKS[args.task], 'test', LENGTHS, args.examples)
  shipped = {}
  for name, gamma in args.shipped:
    path = name if os.path.isdir(name) else os.path.join(args.models, name)
    module, params = loading.load_module_and_params(path)
    shipped[name] = (module, params, gamma)
  state = ceiling.measure(target_module, target_params, examples, LENGTHS, settings, shipped,
                          state_path=args.state, log=lambda line: print(line, flush=True))
  confidence = None
  if args.confidence_examples:
    confidence = state.get('target_confidence')
    if not confidence or confidence.get('requested') != args.confidence_examples:
      print(f'target confidence on {args.confidence_examples} held-out inputs', flush=True)
      held_out = evaluation.task_examples(TASKS[args.task], 'test', LENGTHS, args.confidence_examples)
      confidence = dict(evaluation.target_confidence(target_module, target_params, held_out, LENGTHS),
                        requested=args.confidence_examples)
      state['target_confidence'] = confidence
      fileio.atomic_write(args.state, json.dumps(state, sort_keys=True).encode())
  rep = ceiling.report(state, confidence)
  machine = reporting.machine_info()
  command = 'python ' + ' '.join(['scripts/ceiling.py'] + sys.argv[1:] if argv is None else
                                 ['scripts/ceiling.py'] + list(argv))
  rep.update(command=command, machine=machine, task=TASKS[args.task], models=args.models)
  header = (f"`{command}` · {rep['date']} · {machine['processor']}, {machine['cpu_count']} CPUs, jax "
            f"{machine['jax']}{reporting.xla_flags_note(machine)} · target {os.path.join(args.models, 'target')} · first {args.examples} "
            f"{TASKS[args.task]} test examples, greedy")
  os.makedirs(args.out, exist_ok=True)
  fileio.atomic_write(os.path.join(args.out, 'ceiling.json'), json.dumps(rep, indent=2, sort_keys=True).encode())
  text = ceiling_report.markdown(rep, header)
  fileio.atomic_write(os.path.join(args.out, 'ceiling.md'), text.encode())
  plots.plot_ceiling(os.path.join(args.out, 'ceiling.png'), rep)
  print(text)


if __name__ == '__main__':
  main()
