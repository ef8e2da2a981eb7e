"""Profile one speculative decode: where a round's time goes, inside the compiled loop and in isolation.

  python scripts/profile_decode.py --drafter d1kd --gamma 4 --temperature 0 --run main_job_ende_t0

For a target and drafter from `models/cpu` (or any model directory: a T5 network, an n-gram model or a feature
head with its draft vocabulary), γ and a temperature, on the
first examples of a local test split: the isolated model calls, each phase of a round (draft, verify, accept,
commit) and the whole round inside a compiled loop, the baseline's round, the per-example fixed costs, the HLO
of both decode loops (kernels per iteration, copies, scatters), and the end-to-end times of both decoders on
the examples with the speedup each cost model predicts, the per-example fixed cost and per-round cost fitted to
those real decodes (what a round costs in the real loop, every branch and copy included: the replayed round can
miss them), and a kernel-by-kernel breakdown of one decode of each decoder from a `jax.profiler` trace.
Writes `results/profile/<run>.{md,json}`.
Runs on any JAX backend unchanged. Measure on a quiet machine.
"""

import argparse
import datetime
import json
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))

from specdec.bench import cost_model  # pylint: disable=g-import-not-at-top
from specdec import decoding
from specdec import evaluation
from specdec import fileio
from specdec.bench import hlo_facts
from specdec import loading
from specdec import models
from specdec import task_names
from specdec.bench import profiling
from specdec.bench import reporting
from specdec import theory

TASKS = {name: (task, dict(task_names.LOCAL_FEATURE_LENGTHS)) for name, task in task_names.LOCAL_TASK_BY_NAME.items()}


def profile(args) -> dict:
  target_module, target_params = loading.load_module_and_params(loading.model_path(args.target, args.models))
  drafter_dir = loading.model_path(args.drafter, args.models)
  drafter_module, drafter_params, draft_vocab_ids = loading.load_drafter(drafter_dir, target_params)
  task_name, lengths = TASKS[args.task]
  lengths = dict(lengths, targets=args.targets_length or lengths['targets'])
  examples = evaluation.task_examples(task_name, 'test', lengths, args.examples * args.batch_size)
  batches = evaluation.batches(examples, lengths, args.batch_size, True)
  decoder_params = {'temperature': args.temperature, 'topk': 0, 'topp': 0.0}
  spec_params = dict(decoder_params, gamma=args.gamma, return_stats=True)
  if args.draft_confidence:
    spec_params['draft_confidence'] = args.draft_confidence
  base = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=decoding.temperature_sample)
  spec = models.SpeculativeEncoderDecoderModel(target_module, drafter_module,
                                               decode_fn=decoding.speculative_sample,
                                               draft_vocab_ids=draft_vocab_ids)
  base_predict, spec_predict = base.compile_predict(decoder_params), spec.compile_predict(spec_params)
  bp = {'target': target_params}
  sp = spec.with_draft_projection({'target': target_params, 'drafter': drafter_params})

  print('end to end ...', flush=True)
  rows = []
  for n, (_, batch) in enumerate(batches):
    rng = jax.random.PRNGKey(n)
    jax.block_until_ready(base_predict(bp, batch, rng))
    jax.block_until_ready(spec_predict(sp, batch, rng))
    tb, ts = [], []
    for _ in range(args.repeats):
      start = time.perf_counter()
      base_out = jax.block_until_ready(base_predict(bp, batch, rng))[0]
      tb.append(time.perf_counter() - start)
      start = time.perf_counter()
      spec_out, aux = jax.block_until_ready(spec_predict(sp, batch, rng))
      ts.append(time.perf_counter() - start)
    stats = jax.tree_util.tree_map(np.asarray, aux['stats'])
    rows.append({'baseline_s': float(np.median(tb)), 'speculative_s': float(np.median(ts)),
                 'tokens': int(sum(evaluation.num_tokens(np.asarray(r), 1) for r in base_out)),
                 'target_calls': int(stats['target_calls'].max()),
                 'accepted': int(stats['accepted'].sum()), 'judged': int(stats['judged'].sum()),
                 'drafted': int(stats['drafted'].sum()),
                 'identical': bool(np.array_equal(np.asarray(base_out), np.asarray(spec_out)))})
  first = batches[0][1]
  decoded_l = np.asarray(base_predict(bp, first, jax.random.PRNGKey(0))[0])[0]

  print('isolated calls ...', flush=True)
  isolated = profiling.measure_costs(target_module, target_params, drafter_module, drafter_params,
                                     first['encoder_input_tokens'], lengths['targets'], args.gamma,
                                     draft_vocab_ids=draft_vocab_ids)
  chain = [profiling.time_chained_calls(target_module, target_params, drafter_module, drafter_params,
                                       first['encoder_input_tokens'], lengths['targets'], args.gamma + 1, steps,
                                       repeats=args.repeats + 2, draft_vocab_ids=draft_vocab_ids)
           for steps in (0, args.gamma)]
  isolated.update(chained_verify_s=chain[0], chained_draft_step_s=(chain[1] - chain[0]) / args.gamma,
                  c_chained=(chain[1] - chain[0]) / args.gamma / isolated['target_call_s'])
  print('one drafter call, kernel by kernel ...', flush=True)
  draft_kernels = profiling.drafter_call_kernels(target_module, target_params, drafter_module, drafter_params,
                                                 first['encoder_input_tokens'], lengths['targets'],
                                                 draft_vocab_ids=draft_vocab_ids)
  print('phases inside the loop ...', flush=True)
  in_loop = profiling.in_loop_costs(target_module, target_params, drafter_module, drafter_params, first,
                                    decoded_l, args.gamma, spec_params, repeats=args.repeats + 2,
                                    parts=profiling.ALL_PARTS, draft_vocab_ids=draft_vocab_ids)
  print('baseline at call width 2 ...', flush=True)
  wide = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=profiling.widened_decode_fn(2))
  wide_predict = wide.compile_predict(decoder_params)
  width_check = {'baseline_s': 0.0, 'width2_s': 0.0, 'identical': True}
  for n, (_, batch) in enumerate(batches):
    rng = jax.random.PRNGKey(n)
    width_check['identical'] &= bool(np.array_equal(np.asarray(base_predict(bp, batch, rng)[0]),
                                                    np.asarray(wide_predict(bp, batch, rng)[0])))
    width_check['baseline_s'] += profiling.median_seconds(lambda: base_predict(bp, batch, rng), repeats=args.repeats)
    width_check['width2_s'] += profiling.median_seconds(lambda: wide_predict(bp, batch, rng), repeats=args.repeats)
  print('kernels (jax.profiler) ...', flush=True)
  traces = {'baseline': hlo_facts.trace_kernel_breakdown(lambda: base_predict(bp, first, jax.random.PRNGKey(0))),
            'speculative': hlo_facts.trace_kernel_breakdown(lambda: spec_predict(sp, first, jax.random.PRNGKey(0)))}
  try:
    fitted = cost_model.fitted_costs(rows)
  except ValueError as e:  # every example took the same number of steps
    print(f'no fit: {e}', flush=True)
    fitted = None
  print('HLO ...', flush=True)
  # Each program compiled once; both readings come from its text.
  texts = {'baseline': hlo_facts.compiled_predict_text(base, bp, first, decoder_params),
           'speculative': hlo_facts.compiled_predict_text(spec, sp, first,
                                                          dict(spec_params, return_stats=False))}
  hlo = {decoder: hlo_facts.loop_facts(text) for decoder, text in texts.items()}
  loop_kernels = {decoder: hlo_facts.loop_kernels_by_origin(text) for decoder, text in texts.items()}

  base_total = sum(r['baseline_s'] for r in rows)
  spec_total = sum(r['speculative_s'] for r in rows)
  alpha = theory.acceptance_rate(sum(r['accepted'] for r in rows), sum(r['judged'] for r in rows))
  return {
      'run': args.run, 'target': args.target, 'drafter': args.drafter, 'task': task_name, 'gamma': args.gamma,
      'temperature': args.temperature, 'draft_confidence': args.draft_confidence,
      'batch_size': args.batch_size, 'examples': len(rows) * args.batch_size, 'lengths': lengths,
      'isolated': isolated, 'draft_kernels': draft_kernels, 'in_loop': in_loop, 'fitted': fitted,
      'traces': traces, 'hlo': hlo,
      'loop_kernels': loop_kernels,
      'baseline_width_check': width_check, 'end_to_end': rows,
      'measured_speedup': base_total / spec_total, 'alpha': alpha,
      'identical': all(r['identical'] for r in rows) if args.temperature == 0 else None,
      'predicted_speedup_isolated': float(theory.predicted_speedup_from_costs(
          alpha, args.gamma, isolated['draft_call_s'], isolated['target_call_s'], isolated['verify_call_s'])),
      'predicted_speedup_in_loop': cost_model.predicted_speedup_in_loop(
          in_loop, [r['tokens'] for r in rows], [r['target_calls'] for r in rows]),
      'machine': reporting.machine_info(), 'date': datetime.date.today().isoformat(),
      'command': 'python ' + ' '.join(['scripts/profile_decode.py'] + sys.argv[1:]),
  }


def markdown(p: dict) -> str:
  iso, il = p['isolated'], p['in_loop']
  base_round = il['baseline_round_s']
  ms = lambda s: f'{1000 * s:.3f}'
  unit = lambda s: f'{s / base_round:.2f}'
  lines = [
      f"# Profile: {p['run']}", '',
      f"`{p['command']}` · {p['date']} · {p['machine']['processor']}, {p['machine']['cpu_count']} CPUs, "
      f"jax {p['machine']['jax']} ({p['machine']['backend']}){reporting.xla_flags_note(p['machine'])}", '',
      f"Target `{p['target']}`, drafter `{p['drafter']}`, {p['task']}, γ = {p['gamma']}, temperature "
      f"{p['temperature']:g}, draft confidence {p['draft_confidence']:g}, batch {p['batch_size']}, "
      f"{p['examples']} examples.", '',
      '## One round, inside the compiled loop', '',
      'Each part runs 32 times in one jitted `fori_loop` from a real mid-decode state (median of repeats); '
      '"baseline rounds" divides by the baseline\'s round (one 1-token target call plus its bookkeeping, '
      'timed the same way).', '',
      '| part | ms | baseline rounds |', '|---|---|---|',
      f"| draft phase (γ = {p['gamma']} drafter steps + catch-up) | {ms(il['draft_s'])} | {unit(il['draft_s'])} |",
      f"| per draft step (c in the loop) | {ms(il['draft_s'] / p['gamma'])} | {il['c_in_loop']:.3f} |",
      f"| verify phase (γ+1-token target call) | {ms(il['verify_s'])} | {unit(il['verify_s'])} |",
      f"| accept phase (Algorithm 1's test) | {ms(il['accept_s'])} | {unit(il['accept_s'])} |",
      f"| commit phase (writes, bookkeeping) | {ms(il['commit_s'])} | {unit(il['commit_s'])} |",
      f"| whole round | {ms(il['round_s'])} | {unit(il['round_s'])} |",
      f"| whole round less drafting (a) | {ms(il['round_s'] - il['draft_s'])} | {il['round_fixed_in_loop']:.2f} |",
      f"| baseline round | {ms(base_round)} | 1.00 |", '',
      '## Model calls in isolation', '',
      '| call | ms | target calls |', '|---|---|---|',
      f"| target, 1 token | {ms(iso['target_call_s'])} | 1.00 |",
      f"| target, γ+1 = {p['gamma'] + 1} tokens (verify) | {ms(iso['verify_call_s'])} | "
      f"{iso['verify_cost_ratio']:.2f} |",
      f"| drafter, 1 token | {ms(iso['draft_call_s'])} | {iso['c']:.3f} (c) |",
      f"| drafter step after a γ+1-token target call (chained) | {ms(iso['chained_draft_step_s'])} | "
      f"{iso['c_chained']:.3f} (c chained) |", '',
      'Chained: one jitted scan of a verify call then γ drafter calls, each fed the previous call\'s argmax, '
      'as in the decode loop (no overlap of independent calls across cores, the drafter\'s weights just '
      'evicted by the target\'s); (chained(γ) − chained(0)) / γ.', '',
      *drafter_call_lines(p.get('draft_kernels'), iso['target_call_s']),
      '## Per-example fixed costs', '',
      'The jitted encoder(s) and cache init(s) every example pays before its decode loop.', '',
      f"| baseline | {ms(il['baseline_fixed_s'])} ms |", '|---|---|',
      f"| speculative | {ms(il['speculative_fixed_s'])} ms |", '',
      '## End to end', '',
      '| | value |', '|---|---|',
      f"| measured speedup (Σ baseline / Σ speculative) | **{p['measured_speedup']:.2f}×** |",
      f"| α (kept / judged) | {p['alpha']:.3f} |",
      f"| predicted from isolated call costs | {p['predicted_speedup_isolated']:.2f}× |",
      f"| predicted from in-loop costs (+ fixed costs) | {p['predicted_speedup_in_loop']:.2f}× |",
      f"| measured / predicted (isolated) | {p['measured_speedup'] / p['predicted_speedup_isolated']:.2f} |",
  ]
  if p['identical'] is not None:
    lines.append(f"| greedy outputs identical | {p['identical']} |")
  fit = p.get('fitted')
  if fit:
    lines += ['', '## Costs fitted to the real decodes', '',
              'Least squares over the examples: time = fixed + steps × per-step (steps: tokens for the baseline, '
              'rounds for speculative). This is what a round costs in the real compiled loop, every branch, '
              'copy and statistic included; compare it with the replayed round above.', '',
              '| | fixed ms | per step ms | rms residual ms |', '|---|---|---|---|',
              f"| baseline (per token) | {ms(fit['baseline_fixed_s'])} | {ms(fit['baseline_token_s'])} | "
              f"{ms(fit['baseline_rms_residual_s'])} |",
              f"| speculative (per round) | {ms(fit['speculative_fixed_s'])} | {ms(fit['round_s'])} | "
              f"{ms(fit['speculative_rms_residual_s'])} |", '',
              f"A real round costs **{fit['round_in_baseline_tokens']:.2f} baseline tokens** (the replayed round: "
              f"{il['round_over_baseline']:.2f}) and yields {fit['tokens_per_round']:.2f} tokens.",]
  if p.get('traces'):
    lines += ['', '## Kernels of one decode of the first example (jax.profiler)', '',
              'Exclusive time per kind of kernel (XLA thunks on the compute threads on CPU; device ops on '
              'GPU/TPU), ms per decode; `ThunkExecutor::Execute` is the runtime\'s own cost of running a '
              'region (loop body, branch), `SlinkyThreadPool::Await` the wait for work split across threads.', '',
              '| kernel | baseline ms | launches | speculative ms | launches |', '|---|---|---|---|---|']
    tb, tsp = p['traces']['baseline'], p['traces']['speculative']
    by = lambda t: {r['kernel']: r for r in t['families']}
    b_rows, s_rows = by(tb), by(tsp)
    names = [r['kernel'] for r in tsp['families'][:12]]
    names += [r['kernel'] for r in tb['families'][:12] if r['kernel'] not in names]
    cell = lambda rows, n: (f"{rows[n]['ms_per_call']:.2f} | {rows[n]['launches_per_call']:.0f}"
                            if n in rows else '– | –')
    for n in names:
      lines.append(f"| `{n}` | {cell(b_rows, n)} | {cell(s_rows, n)} |")
    lines.append(f"| busy (all kernels) | {tb['busy_ms_per_call']:.2f} | | {tsp['busy_ms_per_call']:.2f} | |")
    lines.append(f"| wall (under the profiler) | {tb['wall_ms_per_call']:.2f} | | {tsp['wall_ms_per_call']:.2f} | |")
  wc = p.get('baseline_width_check')
  if wc:
    lines += ['', '## Is the baseline the fastest loop here?', '',
              'T5X\'s loop calls the target with one token a step. Where a 2-token call costs less than a 1-token '
              'one (in isolation above), a baseline fed two tokens a step (the second overwritten next step; the '
              'same outputs) could be faster; timed on the same examples:', '',
              '| baseline | Σ ms | / 1-token loop |', '|---|---|---|',
              f"| 1 token a step (T5X's loop, the denominator) | {1000 * wc['baseline_s']:.1f} | 1.00 |",
              f"| 2 tokens a step | {1000 * wc['width2_s']:.1f} | {wc['width2_s'] / wc['baseline_s']:.2f} |", '',
              f"Outputs identical: {wc['identical']}."]
  lines += ['', '## HLO of the decode loops', '',
            'Instructions per iteration of each `while` body (a fusion is one kernel; nested loops counted '
            'once where they appear).', '',
            '| decoder | loop | kernels | fusion | dot/custom-call | copy | scatter | gather | '
            'dynamic-update-slice | while | conditional |', '|---|---|---|---|---|---|---|---|---|---|---|']
  for decoder, loops in p['hlo'].items():
    for name, f in loops.items():
      lines.append(f"| {decoder} | `{name}` | {f['kernels']} | {f['fusion']} | {f['dot/custom-call']} | "
                   f"{f['copy']} | {f['scatter']} | {f['gather']} | {f['dynamic-update-slice']} | "
                   f"{f['while']} | {f['conditional']} |")
  lines += kernel_origin_lines(p.get('loop_kernels'))
  return '\n'.join(lines) + '\n'


def drafter_call_lines(dk, target_call_s):
  """The 'one drafter call, kernel by kernel' section (`profiling.drafter_call_kernels`)."""
  if not dk:
    return []
  lines = ['## One drafter call, kernel by kernel (jax.profiler)', '',
           f"{dk['calls']} 1-token drafter calls in one jitted scan, as draft steps make them, traced: "
           f"{dk['busy_us']:.0f} µs "
           f"of kernels a call ({dk['wall_us']:.0f} µs wall under the profiler; the 1-token target call: "
           f"{1e6 * target_call_s:.0f} µs untraced), **{100 * dk['dot_share']:.0f}% of it in matrix products**. "
           'The costliest kernels, each with the largest array it reads: a 1-row matrix product reads its '
           'whole weight matrix, so compare its µs with that matrix\'s MB.', '',
           '| kernel | µs | output | largest operand | MB |', '|---|---|---|---|---|']
  for k in dk['top']:
    if not k['largest_operand']:  # the runtime's own cost: no instruction, no shape
      lines.append(f"| `{k['kernel']}` | {k['us']:.1f} | | | |")
      continue
    mb = hlo_facts.shape_bytes(k['largest_operand']) / 1e6
    lines.append(f"| `{k['kernel']}` | {k['us']:.1f} | `{k['shape']}` | `{k['largest_operand']}` | {mb:.2f} |")
  return lines + ['']


def kernel_origin_lines(loop_kernels):
  """The 'where a round's kernels come from' table: kernels per loop iteration by phase and layer part."""
  if not loop_kernels:
    return []
  base = loop_kernels['baseline']
  spec = loop_kernels['speculative']
  phases = [ph for ph in hlo_facts.PHASES + ('loop',) if ph in spec]
  merged_base = {}
  for parts in base.values():
    for part, n in parts.items():
      merged_base[part] = merged_base.get(part, 0) + n
  parts = sorted({part for ph in phases for part in spec[ph]} | set(merged_base),
                 key=lambda part: -sum(spec.get(ph, {}).get(part, 0) for ph in phases))
  header = ['part', 'baseline step'] + [ph.replace('_phase', '') for ph in phases]
  lines = ['', '## Where the loop\'s kernels come from', '',
           'Kernels per iteration of each decode loop, by the phase of the speculative round '
           '(`decoding.speculative_step`\'s named scopes; "loop" is what no phase wrote: the loop\'s carry, '
           'and layout copies XLA inserts) and by the part of a T5 decoder step their op names give '
           '(`hlo_facts.kernel_origin`). On a CPU each kernel pays a dispatch and, when split across threads, a '
           'wait: compare a phase\'s kernels with its time in the first table.', '',
           '| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for part in parts:
    lines.append(f"| {part} | {merged_base.get(part, 0)} | "
                 + ' | '.join(str(spec[ph].get(part, 0)) for ph in phases) + ' |')
  lines.append(f"| **all** | {sum(merged_base.values())} | "
               + ' | '.join(str(sum(spec[ph].values())) for ph in phases) + ' |')
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--target', default='target')
  parser.add_argument('--drafter', default='d1kd')
  parser.add_argument('--models', default='models/cpu')
  parser.add_argument('--task', choices=sorted(TASKS), default='ende')
  parser.add_argument('--targets_length', type=int, default=None)
  parser.add_argument('--gamma', type=int, default=4)
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--draft_confidence', type=float, default=0.0)
  parser.add_argument('--batch_size', type=int, default=1)
  parser.add_argument('--examples', type=int, default=8, help='batches timed end to end')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--run', default=None, help='report name (default: drafter_g<γ>_t<temperature>)')
  parser.add_argument('--out', default='results/profile')
  args = parser.parse_args()
  if args.gamma < 1:
    parser.error(f'--gamma must be >= 1, got {args.gamma}')
  if args.temperature < 0:
    parser.error(f'--temperature must be >= 0, got {args.temperature}')
  args.run = args.run or f'{args.drafter}_g{args.gamma}_t{args.temperature:g}_b{args.batch_size}'
  report = profile(args)
  os.makedirs(args.out, exist_ok=True)
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.json'),
                      json.dumps(report, indent=2).encode())
  text = markdown(report)
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.md'), text.encode())
  print(text)


if __name__ == '__main__':
  main()
