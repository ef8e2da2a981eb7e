"""Drafters and γ side by side against one baseline, interleaved example by example.

  python scripts/compare_drafters.py --models models/cpu_v2 --runs bigram:1 trigram:1 trigram:2 --temperature 0 --run v2_ngrams_t0

For each of the first --examples test examples (batch 1) the baseline and every speculative setting run in turn,
--repeats times, keeping each example's fastest run (`profiling.time_side_by_side`): a slow spell of the machine
hits all of them alike, so their ratios are steadier than those of separately timed benchmark rows (about ±0.05
on 2 cores). Reports the speedup (Σ baseline / Σ speculative), α, tokens per target call and the per-round cost
fitted to the real decodes in baseline tokens. Writes `results/compare/<run>.{md,json}`. Measure on a quiet machine.
"""

import argparse
import datetime
import functools
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec import benchmark  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import checkpoints
from specdec import decoding
from specdec import evaluation
from specdec import fileio
from specdec import models
from specdec import profiling
from specdec import tasks

TASKS = {'ende': tasks.ENDE_LOCAL_TASK, 'summarize': tasks.SUMMARIZE_LOCAL_TASK}
LENGTHS = {'inputs': 96, 'targets': 48}


def parse_run(text: str):
  """'drafter:γ' -> (drafter, γ)."""
  drafter, _, gamma = text.rpartition(':')
  if not drafter or not gamma.isdigit() or int(gamma) < 1:
    raise argparse.ArgumentTypeError(f'a run is DRAFTER:GAMMA with GAMMA >= 1, got {text!r}')
  return drafter, int(gamma)


def compare(args) -> dict:
  target_module, target_params = checkpoints.load_module_and_params(os.path.join(args.models, 'target'))
  examples = evaluation.task_examples(TASKS[args.task], 'test', LENGTHS, args.examples)
  batches = [batch for _, batch in benchmark.make_batches(examples, LENGTHS, 1, True)]
  sampling_params = {'temperature': args.temperature, 'topk': 0, 'topp': 0.0}
  base = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=decoding.temperature_sample)
  base_predict = base.compile_predict(sampling_params)
  decoders = {'baseline': functools.partial(base_predict, {'target': target_params})}
  for drafter, gamma in args.runs:
    path = drafter if os.path.isdir(drafter) else os.path.join(args.models, drafter)
    drafter_module, drafter_params = checkpoints.load_module_and_params(path)
    spec = models.SpeculativeEncoderDecoderModel(target_module, drafter_module,
                                                 decode_fn=decoding.speculative_sample)
    predict = spec.compile_predict(dict(sampling_params, gamma=gamma, return_stats=True))
    decoders[f'{drafter}:{gamma}'] = functools.partial(
        predict, {'target': target_params, 'drafter': drafter_params})
  timed = profiling.time_side_by_side(decoders, batches, repeats=args.repeats)

  base_tokens = [benchmark.num_tokens(np.asarray(out[0])[0], 1) for out in timed['baseline']['outputs']]
  token_s = profiling.fit_fixed_and_per_step(base_tokens, timed['baseline']['seconds'])['per_step_s']
  rows = []
  for name, entry in timed.items():
    if name == 'baseline':
      continue
    stats = [jax.tree_util.tree_map(np.asarray, out[1]['stats']) for out in entry['outputs']]
    rounds = [int(s['target_calls'].max()) for s in stats]
    judged = sum(int(s['judged'].sum()) for s in stats)
    try:
      round_s = profiling.fit_fixed_and_per_step(rounds, entry['seconds'])['per_step_s']
    except ValueError:  # every example took the same number of rounds
      round_s = float('nan')
    rows.append({
        'run': name, 'speedup': sum(timed['baseline']['seconds']) / sum(entry['seconds']),
        'alpha': sum(int(s['accepted'].sum()) for s in stats) / judged if judged else 0.0,
        'tokens_per_call': sum(int(s['emitted'].sum()) for s in stats) / sum(rounds),
        'round_in_baseline_tokens': round_s / token_s,
        'identical': (all(np.array_equal(np.asarray(a[0]), np.asarray(b[0])) for a, b in
                          zip(entry['outputs'], timed['baseline']['outputs']))
                      if args.temperature == 0 else None)})
  return {'command': 'python ' + ' '.join(['scripts/compare_drafters.py'] + sys.argv[1:]),
          'date': datetime.date.today().isoformat(), 'machine': benchmark.machine_info(),
          'task': TASKS[args.task], 'temperature': args.temperature, 'examples': len(batches),
          'repeats': args.repeats, 'baseline_seconds': sum(timed['baseline']['seconds']),
          'baseline_token_s': token_s, 'rows': rows}


def markdown(report: dict) -> str:
  lines = [f"# Drafters side by side: {report['task']}, temperature {report['temperature']}", '',
           f"`{report['command']}` · {report['date']} · {report['machine']['processor']}, {report['machine']['cpu_count']} CPUs, jax "
           f"{report['machine']['jax']} · first "
           f"{report['examples']} test examples, batch 1, interleaved, fastest of {report['repeats']} per example", '',
           f"Baseline: {1000 * report['baseline_seconds']:.1f} ms in all, {1000 * report['baseline_token_s']:.3f} ms "
           'a token (fitted).', '',
           '| drafter:γ | α (kept/judged) | tokens per target call | round (baseline tokens, fitted) | '
           '**speedup** | identical |', '|---|---|---|---|---|---|']
  for r in report['rows']:
    identical = '-' if r['identical'] is None else ('100%' if r['identical'] else 'NO')
    lines.append(f"| {r['run']} | {r['alpha']:.3f} | {r['tokens_per_call']:.2f} | "
                 f"{r['round_in_baseline_tokens']:.2f} | **{r['speedup']:.3f}×** | {identical} |")
  return '\n'.join(lines) + '\n'


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='models/cpu_v2')
  parser.add_argument('--runs', nargs='+', type=parse_run, required=True, help='DRAFTER:GAMMA ...')
  parser.add_argument('--task', choices=sorted(TASKS), default='ende')
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--examples', type=int, default=32)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--run', required=True, help='report name')
  parser.add_argument('--out', default='results/compare')
  args = parser.parse_args(argv)
  if args.temperature < 0:
    parser.error(f'--temperature must be >= 0, got {args.temperature}')
  report = compare(args)
  os.makedirs(args.out, exist_ok=True)
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.json'),
                      json.dumps(report, indent=2, sort_keys=True).encode())
  text = markdown(report)
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.md'), text.encode())
  print(text)


if __name__ == '__main__':
  main()
