"""Ablations on the shipped CPU family: γ sweeps per drafter, and drafters side by side (the Table 3 analogue).

  python scripts/ablate.py gamma   --drafters d1 d3 bigram --gammas 1 2 3 4 5 6 7 8 9 10 --out results/ablate_gamma
  python scripts/ablate.py drafter --drafters unigram bigram d3 d2 d1 --temperatures 0 1 --out results/ablate_drafter

Each (drafter, task, temperature, γ) is one `specdec.bench.benchmark.run` (baseline and speculative in the same run)
in its own directory under OUT/runs/; a finished run (benchmark.json present) is skipped and an interrupted one
resumes, so re-running the command continues where it stopped. A run directory is resumed or kept only if it was
made by the same configuration (its fingerprint.json: checkpoints and their contents, task, γ, temperature, lengths,
max_examples, repeats, seed; `specdec.fingerprint`): every run is checked before the first is measured, and a
mismatch stops the sweep naming the differing fields (--overwrite discards such runs and measures them afresh). A
larger --max_examples extends the finished runs. Everything runs in one process, so each decode function is compiled
once per input shape. The summary (Markdown, JSON, plot) is rewritten from all finished runs at the end.
"""

import argparse
import datetime
import json
import os
import sys

import numpy as np

# Runnable from a checkout without the package installed (as the repo's shell scripts call it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec import import_order  # pylint: disable=g-import-not-at-top,wrong-import-position

import_order.import_tensorflow_quietly()  # before the modules below import seqio, and with it TF

from specdec.bench import benchmark  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.bench import cost_model
from specdec import fileio
from specdec import fingerprint
from specdec import loading
from specdec.bench import plots
from specdec.bench import reporting
from specdec import settings
from specdec import task_names
from specdec.bench import tables
from specdec import tasks
from specdec import theory

TASKS = {'ende': tasks.ENDE_LOCAL_TASK, 'summ': tasks.SUMMARIZE_LOCAL_TASK}
LENGTHS = dict(task_names.LOCAL_FEATURE_LENGTHS)
REMEDY = 'use another --out, or --overwrite to discard such runs and measure them afresh'


def plan_runs(args, grid):
  """One dict per (drafter, task key, temperature, γ) of `grid`: its name, directory, setting, fingerprint."""
  target_dir = os.path.join(args.models, 'target')
  plans = []
  for drafter, task_key, temperature, gamma in grid:
    name = f'{task_key}_{_drafter_label(drafter)}_t{temperature:g}_g{gamma}'
    if args.draft_confidence:
      name += f'_c{args.draft_confidence:g}'
    setting = settings.Setting(gamma=gamma, temperature=temperature, repeats=args.repeats, seed=args.seed,
                               draft_confidence=args.draft_confidence)
    provenance = fingerprint.models_fields(target_dir, _drafter_dir(args, drafter))
    plans.append({'name': name, 'drafter': drafter, 'task': TASKS[task_key], 'setting': setting,
                  'dir': os.path.join(args.out, 'runs', name), 'provenance': provenance,
                  'fingerprint': benchmark.fingerprint_fields(TASKS[task_key], 'test', LENGTHS, setting,
                                                              args.max_examples, drafter, provenance)})
  return plans


def _drafter_dir(args, drafter: str) -> str:
  """A drafter beside the target (`--models`), or a checkpoint directory given as a path (e.g. the v1 family's
  target-independent bigram table, models/cpu/bigram, against the v2 target)."""
  return drafter if os.sep in drafter and os.path.isdir(drafter) else os.path.join(args.models, drafter)


def _drafter_label(drafter: str) -> str:
  # A path keeps its folders in the run's name: models/cpu/bigram and models/cpu_v2's bigram are two runs.
  return os.path.normpath(drafter).replace(os.sep, '_')


def refusals(plans):
  """Why each run directory that cannot be resumed or kept can't (one line each), before anything is measured."""
  reasons = (fingerprint.problem(p['dir'], p['fingerprint'], benchmark.OUTPUT_FILES, REMEDY) for p in plans)
  return [reason for reason in reasons if reason]


def is_finished(plan):
  """The run was measured to the end by this very configuration (not one with fewer examples)."""
  return (os.path.exists(os.path.join(plan['dir'], 'benchmark.json'))
          and fingerprint.read(plan['dir']) == fingerprint.normalised(plan['fingerprint']))


def _run_all(args, grid):
  """Runs (or resumes) every (drafter, task key, temperature, γ) in `grid`; returns their summaries."""
  plans = plan_runs(args, grid)
  refused = [] if args.overwrite else refusals(plans)
  if refused:
    more = f' ({len(refused) - 1} more run(s) refused alike)' if len(refused) > 1 else ''
    raise SystemExit(f'ablate: {refused[0]}{more}')
  tasks.register_tasks(args.corpus_dir)
  target = loading.restore(os.path.join(args.models, 'target'))
  target_module, target_params = target.module, target.params
  loaded = {}
  summaries = []
  for n, plan in enumerate(plans):
    name, drafter = plan['name'], plan['drafter']
    if not args.overwrite and is_finished(plan):
      with open(os.path.join(plan['dir'], 'benchmark.json'), encoding='utf-8') as f:
        summaries.append(json.load(f))
      print(f'[{n + 1}/{len(plans)}] {name}: done earlier, kept.', flush=True)
      continue
    print(f'[{n + 1}/{len(plans)}] {name}', flush=True)
    if drafter not in loaded:
      loaded[drafter] = loading.restore(_drafter_dir(args, drafter), target_params=target_params)
    summaries.append(benchmark.run(
        benchmark.ModelPair(target_module, target_params, loaded[drafter].module, loaded[drafter].params,
                            drafter_name=drafter, draft_vocab_ids=loaded[drafter].draft_vocab_ids),
        benchmark.TaskSplit(plan['task'], 'test', LENGTHS, args.max_examples), plan['setting'],
        benchmark.Output(plan['dir'], overwrite=args.overwrite, provenance=plan['provenance'], remedy=REMEDY,
                         write_plot=False, extra_info={'command_full': ' '.join(['python'] + sys.argv)})))
  return summaries


def _header(args, title):
  machine = reporting.machine_info()
  return (f'# {title}\n\n`{" ".join(["python"] + sys.argv)}` · {datetime.date.today().isoformat()} · '
          f'{machine["processor"]}, {machine["cpu_count"]} CPUs, jax {machine["jax"]}'
          f'{reporting.xla_flags_note(machine)}'
          f' · first {args.max_examples} test examples per task, batch 1, {args.repeats} timed repeat(s) per '
          'example (median), compile excluded'
          + (f' · adaptive drafting: draft confidence {args.draft_confidence:g}' if args.draft_confidence else '')
          + f' · target {os.path.join(args.models, "target")}\n\n')


def gamma_sweep(args):
  grid = [(d, args.task, t, g) for d in args.drafters for t in args.temperatures for g in args.gammas]
  summaries = _run_all(args, grid)
  lines = [_header(args, f'γ ablation ({TASKS[args.task]})'),
           '| drafter | temp | γ | α (kept/judged) | c | verify/1-token | tokens/call | predicted Thm 3.8 | '
           'predicted (costs) | measured speedup | identical |', '|---|---|---|---|---|---|---|---|---|---|---|']
  best = {}
  for s in summaries:
    temp = s['setting']['temperature']
    key = (s['drafter'], temp)
    if key not in best or s['speedup'] > best[key]['speedup']:
      best[key] = s
    ident = '-' if s['identical_rate'] is None else f"{100 * s['identical_rate']:.0f}%"
    lines.append(f"| {s['drafter']} | {temp:g} | {s['setting']['gamma']} | {s['alpha_accept']:.2f} | "
                 f"{s['costs']['c']:.3f} | {s['costs']['verify_cost_ratio']:.2f} | "
                 f"{s['tokens_per_target_call']:.2f} | {s['predicted_speedup_thm38']:.2f}× | "
                 f"{s['predicted_speedup_costs']:.2f}× | **{s['speedup']:.2f}×** | {ident} |")
  lines += ['', '| drafter | temp | best γ (measured) | speedup there | best γ from the measured verify costs '
            '(`theory.best_gamma`) | optimal γ by Thm 3.8 (pooled α, c) |', '|---|---|---|---|---|---|']
  curves = {}
  for (drafter, temp), s_best in sorted(best.items()):
    runs = [s for s in summaries if s['drafter'] == drafter and s['setting']['temperature'] == temp]
    alpha = _pooled_alpha(runs)
    c = float(np.median([s['costs']['c'] for s in runs]))
    opt, _ = theory.optimal_gamma(alpha, c, max_gamma=max(args.gammas))
    picked, _ = theory.best_gamma(alpha, c, verify_curve(runs))
    curves[(drafter, temp)] = (runs, alpha, c)
    lines.append(f"| {drafter} | {temp:g} | {s_best['setting']['gamma']} | {s_best['speedup']:.2f}× | {picked} | "
                 f'{opt} (α {alpha:.2f}, c {c:.3f}) |')
  lines += ['', '### Costs inside the loop', '',
            'A straight-line fit over γ of the measured speculative time per target call, '
            't_iter(γ) = a + b·γ (Σ speculative time / Σ target calls of each run), against the baseline\'s '
            'time per token t_tok (Σ baseline time / Σ tokens): b / t_tok is the drafter call\'s cost inside the '
            'decode loop (c in situ) and a / t_tok the verify call plus the loop\'s own work per iteration, both '
            'in baseline-token units. Per-example fixed costs (encoders, caches) are spread over the iterations.',
            '',
            'The last columns: the α these in-loop costs need for 1.5× and 2× (`theory.required_alpha` with a / t_tok '
            'as the verify cost and c in situ), at the best γ in the sweep\'s range.',
            '', '| drafter | temp | t_tok ms | a ms | b ms | c in situ (b / t_tok) | a / t_tok | c isolated (median) | '
            'α needed for 1.5× | α needed for 2× |',
            '|---|---|---|---|---|---|---|---|---|---|']
  for (drafter, temp), (runs, alpha, c) in sorted(curves.items()):
    fit = in_loop_costs(runs)
    needed = [needed_alpha(fit, x, max(args.gammas)) for x in (1.5, 2.0)]
    lines.append(f"| {drafter} | {temp:g} | {1000 * fit['t_tok']:.3f} | {1000 * fit['a']:.3f} | "
                 f"{1000 * fit['b']:.3f} | {fit['c_in_situ']:.3f} | {fit['a_over_t_tok']:.2f} | {c:.3f} | "
                 + ' | '.join('unreachable' if a is None else f'{a:.2f} (γ={g})' for a, g in needed) + ' |')
  lines += ['', '![γ ablation](ablate_gamma.png)', '',
            'Thm 3.8 curve: (1 − α^(γ+1)) / ((1 − α)(γc + 1)) with the drafter\'s pooled α (kept/judged over all '
            'its runs) and median measured c; it assumes a γ+1-token verify call costs one 1-token call. The '
            '"costs" curve uses the measured verify cost instead.']
  _write(args.out, 'ablate_gamma', '\n'.join(lines) + '\n', summaries)
  _plot_gamma(os.path.join(args.out, 'ablate_gamma.png'), curves, TASKS[args.task])


def verify_curve(runs):
  """{γ + 1: verify call / 1-token call} measured by a drafter's runs (`theory.best_gamma`'s curve)."""
  return {s['setting']['gamma'] + 1: s['costs']['verify_cost_ratio'] for s in runs}


def in_loop_costs(runs):
  """Fits t_iter(γ) = a + b·γ over a drafter's γ runs (`cost_model.fit_fixed_and_per_step`, γ as the steps);
  returns a, b, t_tok and their ratios (seconds). With a single γ there is no slope: b is nan."""
  gammas = [s['setting']['gamma'] for s in runs]
  t_iter = np.array([s['speculative_seconds'] / s['target_calls'] for s in runs])
  t_tok = float(sum(s['baseline_seconds'] for s in runs) / sum(s['baseline_tokens'] for s in runs))
  try:
    fit = cost_model.fit_fixed_and_per_step(gammas, t_iter)
  except ValueError:  # a single γ: no slope
    return {'a': float(t_iter.mean()), 'b': float('nan'), 't_tok': t_tok, 'c_in_situ': float('nan'),
            'a_over_t_tok': float(t_iter.mean()) / t_tok}
  a, b = fit['fixed_s'], fit['per_step_s']
  return {'a': a, 'b': b, 't_tok': t_tok, 'c_in_situ': b / t_tok, 'a_over_t_tok': a / t_tok}


def needed_alpha(fit, speedup, max_gamma):
  """(smallest α, its γ) reaching `speedup` with the fitted in-loop costs, γ in 1..max_gamma; (None, None) if none."""
  if not np.isfinite(fit['c_in_situ']) or fit['c_in_situ'] < 0:
    return None, None
  best = None
  for gamma in range(1, max_gamma + 1):
    a = theory.required_alpha(speedup, gamma, fit['c_in_situ'], max(fit['a_over_t_tok'], 1e-9))
    if np.isfinite(a) and (best is None or a < best[0]):
      best = (float(a), gamma)
  return best or (None, None)


def _pooled_alpha(runs):
  """Kept / judged drafts over all runs of one drafter (the MLE of α under Thm 3.8's i.i.d. model)."""
  return float(theory.acceptance_rate(sum(s['accepted'] for s in runs), sum(s['judged'] for s in runs)))


def _plot_gamma(path, curves, task_name):
  plt = plots.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for n, ((drafter, temp), (runs, alpha, c)) in enumerate(sorted(curves.items())):
    color = f'C{n}'
    runs = sorted(runs, key=lambda s: s['setting']['gamma'])
    gammas = [s['setting']['gamma'] for s in runs]
    ax.plot(gammas, [s['speedup'] for s in runs], 'o-', color=color,
            label=f'{drafter}, t={temp:g}: measured (α={alpha:.2f}, c={c:.3f})')
    grid = np.arange(1, max(gammas) + 1)
    ax.plot(grid, [float(theory.expected_speedup(alpha, int(g), c)) for g in grid], '--', color=color,
            label=f'{drafter}, t={temp:g}: Thm 3.8')
    ax.plot(gammas, [s['predicted_speedup_costs'] for s in runs], ':', color=color,
            label=f'{drafter}, t={temp:g}: measured call costs')
  ax.axhline(1.0, color='k', lw=0.8)
  ax.set_xlabel('γ (drafts per target call)')
  ax.set_ylabel('speedup over the baseline')
  ax.set_title(f'γ ablation, {task_name}, batch 1, CPU')
  ax.legend(fontsize=7)
  plots.save_png(fig, path)


def drafter_sweep(args):
  grid = [(d, k, t, args.gamma) for k in args.tasks for t in args.temperatures for d in args.drafters]
  summaries = _run_all(args, grid)
  lines = [_header(args, 'Drafter ablation'),
           '| task | drafter | temp | γ | α (kept/judged) | α (Σmin) | c | tokens/call | predicted Thm 3.8 | '
           'predicted (costs) | measured speedup | identical |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|']
  alphas = {}
  for s in summaries:
    temp = s['setting']['temperature']
    alphas.setdefault((s['task'], s['drafter']), {})[temp] = s['alpha_overlap']
    ident = '-' if s['identical_rate'] is None else f"{100 * s['identical_rate']:.0f}%"
    lines.append(f"| {tables.TASK_LABEL.get(s['task'], s['task'])} | {s['drafter']} | {temp:g} | "
                 f"{s['setting']['gamma']} | {s['alpha_accept']:.2f} | {s['alpha_overlap']:.2f} | "
                 f"{s['costs']['c']:.3f} | {s['tokens_per_target_call']:.2f} | "
                 f"{s['predicted_speedup_thm38']:.2f}× | {s['predicted_speedup_costs']:.2f}× | "
                 f"**{s['speedup']:.2f}×** | {ident} |")
  lines += ['', '![drafter ablation](ablate_drafter.png)', '',
            tables.table3_markdown(alphas, args.drafters, title='Table 3 analogue (α = E[Σ min(p, q)])')]
  _write(args.out, 'ablate_drafter', '\n'.join(lines) + '\n', summaries)
  _plot_drafters(os.path.join(args.out, 'ablate_drafter.png'), summaries, args.drafters)


def _plot_drafters(path, summaries, drafters):
  plt = plots.pyplot()
  keys = sorted({(s['task'], s['setting']['temperature']) for s in summaries})
  fig, axes = plt.subplots(1, 3, figsize=(13, 4))
  width = 0.8 / max(len(keys), 1)
  x = np.arange(len(drafters))
  for n, (task, temp) in enumerate(keys):
    by = {s['drafter']: s for s in summaries if s['task'] == task and s['setting']['temperature'] == temp}
    label = f"{tables.TASK_LABEL.get(task, task)}, t={temp:g}"
    for ax, field in zip(axes, ('alpha_overlap', 'c', 'speedup')):
      vals = [(by[d]['costs']['c'] if field == 'c' else by[d][field]) if d in by else np.nan for d in drafters]
      ax.bar(x + n * width, vals, width, label=label)
  for ax, title in zip(axes, ('α = E[Σ min(p, q)]', 'c = drafter / target call time', 'measured speedup')):
    ax.set_xticks(x + width * (len(keys) - 1) / 2)
    ax.set_xticklabels(drafters)
    ax.set_title(title)
  axes[2].axhline(1.0, color='k', lw=0.8)
  axes[0].legend(fontsize=7)
  plots.save_png(fig, path)


def _write(out, name, text, summaries):
  fileio.atomic_write(os.path.join(out, f'{name}.md'), text.encode())
  fileio.atomic_write(os.path.join(out, f'{name}.json'), json.dumps(summaries, indent=2).encode())
  print(text, flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('kind', choices=('gamma', 'drafter'))
  parser.add_argument('--models', default='models/cpu')
  parser.add_argument('--drafters', nargs='+', default=['unigram', 'bigram', 'd3', 'd2', 'd1'])
  parser.add_argument('--gammas', nargs='+', type=int, default=list(range(1, 11)))
  parser.add_argument('--gamma', type=int, default=4, help='γ of the drafter ablation')
  parser.add_argument('--task', choices=sorted(TASKS), default='ende', help='task of the γ ablation')
  parser.add_argument('--tasks', nargs='+', choices=sorted(TASKS), default=['ende', 'summ'])
  parser.add_argument('--temperatures', nargs='+', type=float, default=[0.0])
  parser.add_argument('--draft_confidence', type=float, default=0.0,
                      help='adaptive drafting: a row stops drafting after a draft below this confidence (0 = off)')
  parser.add_argument('--max_examples', type=int, default=32)
  parser.add_argument('--repeats', type=int, default=1)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--corpus_dir', default=None)
  parser.add_argument('--out', required=True)
  parser.add_argument('--overwrite', action='store_true',
                      help='discard the runs already in OUT/runs and measure them afresh')
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  (gamma_sweep if args.kind == 'gamma' else drafter_sweep)(args)


if __name__ == '__main__':
  main()
