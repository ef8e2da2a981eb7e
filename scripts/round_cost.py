"""What a round costs in the real decode loop, by difference, beside the replayed round the in-loop model uses.

  python scripts/round_cost.py --models models/cpu_v2 --runs f128:1 f128:3 bigram:3 --run v2_round_cost_ende_t0

The benchmark predicts a speedup from a replayed round (`profiling.time_phases`: each phase of one round, timed
in its own compiled loop from a real mid-decode state). A fit of real decode times over examples
(`cost_model.fit_fixed_and_per_step`) has put a feature head's real round 0.2-0.45 baseline tokens above its replay;
such a fit also carries the examples' variation. Here each of the first --examples test examples is decoded whole
by the real programs at two length budgets (`max_decode_steps` --budgets, an argument of one compiled program)
and the seconds between them are divided by the loop steps between them (`profiling.real_step_cost`): the
baseline's token and each run's round as the real loop pays them, every kernel, copy, branch and statistic
included, no fixed cost and no example-to-example variation; greedy, also without the statistics the benchmark
keeps (the replay keeps none). Beside them, the replay of the same round on the
first example (`profiling.in_loop_costs`). Writes `results/profile/<run>.{md,json}`. Measure on a quiet machine.
"""

import argparse
import datetime
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec.bench import cost_model  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import decoding
from specdec import evaluation
from specdec import fileio
from specdec import loading
from specdec.bench import machine_load
from specdec import models
from specdec import task_names
from specdec.bench import profiling
from specdec.bench import reporting

TASKS = dict(task_names.LOCAL_TASK_BY_NAME)
LENGTHS = dict(task_names.LOCAL_FEATURE_LENGTHS)


def parse_run(text: str):
  """'DRAFTER:γ' -> (drafter, γ)."""
  drafter, _, gamma = text.rpartition(':')
  if not drafter or not gamma.isdigit() or int(gamma) < 1:
    raise argparse.ArgumentTypeError(f'a run is DRAFTER:GAMMA with GAMMA >= 1, got {text!r}')
  return drafter, int(gamma)


def measure(args) -> dict:
  target_module, target_params = loading.load_module_and_params(os.path.join(args.models, 'target'))
  examples = evaluation.task_examples(TASKS[args.task], 'test', LENGTHS, args.examples)
  batches = [batch for _, batch in evaluation.batches(examples, LENGTHS, 1, True)]
  sampling = {'temperature': args.temperature, 'topk': 0, 'topp': 0.0}
  budgets = tuple(args.budgets)
  base = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=decoding.temperature_sample)
  base_params = {'target': target_params}
  base_predict = profiling.budgeted_predict(base, sampling)
  tokens_of = lambda out: max(evaluation.num_tokens(row, 1) for row in np.asarray(out[0]))
  rows = []
  with machine_load.CpuMeter() as meter:
    baseline = [profiling.real_step_cost(base_predict, base_params, b, budgets, tokens_of, args.repeats)
                for b in batches]
    token_s = cost_model.pooled_step_cost(baseline)
    decoded_l = np.asarray(base.compile_predict(sampling)(base_params, batches[0])[0])[0]
    for drafter, gamma in args.runs:
      drafter_module, drafter_params, vocab_ids = loading.load_drafter(loading.model_path(drafter, args.models),
                                                                       target_params)
      spec = models.SpeculativeEncoderDecoderModel(target_module, drafter_module,
                                                   decode_fn=decoding.speculative_sample, draft_vocab_ids=vocab_ids)
      params = spec.with_draft_projection({'target': target_params, 'drafter': drafter_params})
      spec_params = dict(sampling, gamma=gamma, return_stats=True)
      predict = profiling.budgeted_predict(spec, spec_params)
      rounds_of = lambda out: int(np.asarray(out[1]['stats']['target_calls']).max())
      real = [profiling.real_step_cost(predict, params, b, budgets, rounds_of, args.repeats) for b in batches]
      round_s = cost_model.pooled_step_cost(real)
      # The same decodes without the statistics (greedy: the same rounds, counted by the run above).
      bare_predict = profiling.budgeted_predict(spec, dict(spec_params, return_stats=False))
      bare = [profiling.real_step_cost(bare_predict, params, b, budgets,
                                       lambda out, counted=iter(with_stats['steps']): next(counted),
                                       args.repeats)
              for b, with_stats in zip(batches, real)] if args.temperature == 0 else None
      replay = profiling.in_loop_costs(target_module, target_params, drafter_module, drafter_params, batches[0],
                                       decoded_l, gamma, spec_params, repeats=args.repeats,
                                       parts=profiling.ALL_PARTS, draft_vocab_ids=vocab_ids)
      print(f'{drafter}:{gamma}: real round {1000 * round_s:.3f} ms, replayed {1000 * replay["round_s"]:.3f} ms',
            flush=True)
      rows.append({'run': f'{drafter}:{gamma}', 'real_round_s': round_s,
                   'real_round_without_stats_s': cost_model.pooled_step_cost(bare) if bare else None,
                   'real_round_in_tokens': round_s / token_s if round_s and token_s else None,
                   'replay': replay,
                   'replay_round_in_rounds': replay['round_s'] / replay['baseline_round_s'],
                   'per_example': real})
  return {'command': 'python ' + ' '.join(['scripts/round_cost.py'] + sys.argv[1:]),
          'date': datetime.date.today().isoformat(), 'machine': reporting.machine_info(),
          'models': args.models, 'task': TASKS[args.task], 'temperature': args.temperature,
          'examples': len(batches), 'budgets': list(budgets), 'repeats': args.repeats,
          'others_cpu_share': meter.share,
          'baseline': {'real_token_s': token_s, 'per_example': baseline}, 'rows': rows}


def markdown(report: dict) -> str:
  ms = lambda s: '-' if s is None else f'{1000 * s:.3f}'
  fmt = reporting.fmt
  token_s = report['baseline']['real_token_s']
  replay_base = [r['replay']['baseline_round_s'] for r in report['rows']]
  lines = [f"# A round in the real loop and in the replay: {report['task']}, temperature {report['temperature']:g}",
           '', f"`{report['command']}` · {report['date']} · {report['machine']['processor']}, "
           f"{report['machine']['cpu_count']} CPUs, jax {report['machine']['jax']}"
           f"{reporting.xla_flags_note(report['machine'])} · `{report['models']}`, first {report['examples']} test "
           f"examples, batch 1, budgets {report['budgets'][0]} and {report['budgets'][1]} tokens, fastest of "
           f"{report['repeats']}", '',
           'Real: each example decoded whole at both budgets by one compiled program, Δseconds / Δloop steps '
           'pooled over the examples (`profiling.real_step_cost`). Replay: each phase of one round timed in its own '
           'compiled loop from a mid-decode state of the first example (`profiling.time_phases`), as the '
           "benchmark's in-loop prediction uses it.", '',
           f"Baseline token: real {ms(token_s)} ms; replayed baseline round "
           + ', '.join(dict.fromkeys(ms(s) for s in replay_base)) + ' ms.', '',
           '| run | real round ms | without statistics | replayed round ms | real / replayed | real round in real '
           'baseline tokens | replayed round in replayed baseline rounds | replay: draft / verify / accept / commit ms |',
           '|---|---|---|---|---|---|---|---|']
  for r in report['rows']:
    rp = r['replay']
    ratio = r['real_round_s'] / rp['round_s'] if r['real_round_s'] else None
    lines.append(f"| {r['run']} | {ms(r['real_round_s'])} | {ms(r.get('real_round_without_stats_s'))} | "
                 f"{ms(rp['round_s'])} | {fmt(ratio, '.2f')} | "
                 f"{fmt(r['real_round_in_tokens'], '.2f')} | {r['replay_round_in_rounds']:.2f} | "
                 f"{ms(rp['draft_s'])} / {ms(rp['verify_s'])} / {ms(rp['accept_s'])} / {ms(rp['commit_s'])} |")
  lines += machine_load.warning_lines(report.get('others_cpu_share'), 'this measurement')
  return '\n'.join(lines) + '\n'


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='models/cpu_v2')
  parser.add_argument('--runs', nargs='+', type=parse_run, required=True, help='DRAFTER:GAMMA ...')
  parser.add_argument('--task', choices=sorted(TASKS), default='ende')
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--examples', type=int, default=8)
  parser.add_argument('--budgets', type=int, nargs=2, default=[8, 40], metavar=('LOW', 'HIGH'))
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--run', required=True, help='report name')
  parser.add_argument('--out', default='results/profile')
  args = parser.parse_args(argv)
  low, high = args.budgets
  if not 0 < low < high <= LENGTHS['targets']:
    parser.error(f"--budgets must be 0 < LOW < HIGH <= {LENGTHS['targets']}, got {low} {high}")
  if args.temperature < 0:
    parser.error(f'--temperature must be >= 0, got {args.temperature}')
  report = measure(args)
  os.makedirs(args.out, exist_ok=True)
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.json'), json.dumps(report, indent=2).encode())
  text = markdown(report)
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.md'), text.encode())
  print(text)


if __name__ == '__main__':
  main()
