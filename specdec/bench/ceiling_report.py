"""The ceiling's report (`ceiling.report`, from `ceiling.measure`'s state) as Markdown.

Every oracle row is labelled `CONTROLLED`: the oracle drafter is an instrument of controlled acceptance, never a
drafter. The figure is `plots.plot_ceiling`.
"""

from typing import Any, List, Mapping, Optional

from specdec.bench import reporting

# What every oracle row is called in a table: it is an instrument, not a drafter.
CONTROLLED = 'controlled acceptance'


def best_at(rep: Mapping[str, Any], alpha: float, batch: int) -> Optional[Mapping[str, Any]]:
  """The measured best-γ entry at α* and batch size (None if not measured)."""
  for b in rep['best_gamma']:
    if b['batch'] == batch and b['alpha_target'] == alpha:
      return b
  return None


def markdown(rep: Mapping[str, Any], header: str = '') -> str:
  """ceiling.md: the summary, the shipped drafters, the target's confidence, the verify-cost curve, the best
  γ against α, every row and the costs replayed against the fitted ones; `header` (e.g. the command) on top."""
  s = rep['settings']
  lines = ['# The ceiling: measured speedup against a controlled acceptance rate', '']
  if header:
    lines += [header, '']
  lines += [
      'Every speculative row below is the **oracle** drafter (`specdec/bench/oracle.py`), a measuring instrument of '
      f'*{CONTROLLED}*, not a trained drafter: it proposes the target\'s own greedy token with probability α* '
      '(i.i.d. per row and position, from a seeded hash) and a wrong token otherwise, at the cost of a table '
      'lookup. The target verifies every draft, so greedy outputs stay the baseline\'s. Each row: the '
      'baseline and every decoder interleaved batch by batch (fastest of '
      f"{s['repeats']} repeats per batch), speedup = Σ baseline / Σ speculative; c and a are a draft step and "
      'the round less its drafting, inside the compiled loop, in baseline rounds; "in-loop predicted" is the '
      'model the benchmark uses (fixed costs once per batch, each shrinking stage at its own measured round '
      'cost); Thm 3.8 uses the measured α and the in-loop c.', '']
  sizes = sorted({r['batch'] for r in rep['rows']})
  lines += ['## Summary', '', '| batch | α* | best γ (measured) | α measured | **speedup** | in-loop predicted |',
            '|---|---|---|---|---|---|']
  for b in sizes:
    for alpha in (0.8, 0.9, 1.0):
      e = best_at(rep, alpha, b)
      if e is None:
        continue
      row = next(r for r in rep['rows'] if r['batch'] == b and r['alpha_target'] == alpha
                 and r['gamma'] == e['best_gamma_measured'])
      lines.append(f"| {b} | {alpha:g} | {e['best_gamma_measured']} | {row['alpha_measured']:.3f} | "
                   f"**{e['best_speedup_measured']:.2f}×** | {row['predicted_in_loop']:.2f}× |")
  if rep['shipped']:
    lines += ['', 'The shipped (trained) drafters, measured in the same interleave:', '',
              '| batch | drafter | γ | α measured | tokens per target call | **speedup** | identical |',
              '|---|---|---|---|---|---|---|']
    for r in rep['shipped']:
      lines.append(f"| {r['batch']} | {r['drafter']} | {r['gamma']} | {r['alpha_measured']:.3f} | "
                   f"{r['tokens_per_call']:.2f} | **{r['measured_speedup']:.2f}×** | "
                   f"{'100%' if r['identical'] else 'NO'} |")
  lines += ['', '![speedup against α](ceiling.png)', '']
  conf = rep.get('target_confidence')
  if conf:
    lines += ['## Why the trained drafters sit low: the target\'s confidence', '',
              f"Teacher-forced on its own greedy decodes of {conf['examples']} held-out inputs "
              f"({conf['positions']} positions), the target's top-1 probability has median "
              f"{conf['top1_median']:.2f} (mean {conf['top1_mean']:.2f}); it is >= 0.5 at "
              f"{100 * conf['share_top1_at_least_0.5']:.0f}% of positions and >= 0.9 at "
              f"{100 * conf['share_top1_at_least_0.9']:.0f}%; mean entropy {conf['entropy_mean_nats']:.2f} nats. "
              'A drafter matches a greedy target only where it can tell its top token from the near-ties.', '']
  lines += ['## Verify-cost curve (the machine\'s side)', '',
            'A k-token target call over a 1-token call, each timed inside one compiled scan '
            '(`profiling.verify_cost_curve`).', '']
  keys = sorted(rep['costs'], key=int)
  lines += ['| k tokens | ' + ' | '.join(f'batch {k}: ms | batch {k}: ratio' for k in keys) + ' |',
            '|---|' + '---|---|' * len(keys)]
  first_curve = rep['costs'][keys[0]]['verify_curve']
  for i, k in enumerate(first_curve['tokens']):
    cells = []
    for key in keys:
      curve = rep['costs'][key]['verify_curve']
      cells += [f"{1000 * curve['call_s'][i]:.3f}", f"{curve['ratio'][i]:.2f}"]
    lines.append(f'| {k} | ' + ' | '.join(cells) + ' |')
  lines += ['', '## The best γ against α', '',
            '`theory.best_gamma` picks γ from (α, c, the verify-cost curve): max E[tokens] / (γc + r(γ+1)); '
            'the paper\'s optimal γ (`theory.optimal_gamma`, Thm 3.8) assumes r ≡ 1. Both with the pooled '
            'measured α and the median in-loop c over γ, over the grid\'s γs.', '',
            '| batch | α* | best γ measured | its speedup | best_gamma (verify curve) | measured there | '
            'Thm 3.8 optimal γ | measured there |', '|---|---|---|---|---|---|---|---|']
  for e in rep['best_gamma']:
    lines.append(f"| {e['batch']} | {e['alpha_target']:g} | {e['best_gamma_measured']} | "
                 f"{e['best_speedup_measured']:.2f}× | {e['best_gamma_helper']} | "
                 f"{reporting.fmt(e['measured_at_helper_gamma'])}× | {e['optimal_gamma_thm38']} | "
                 f"{reporting.fmt(e['measured_at_thm38_gamma'])}× |")
  for b in sizes:
    lines += ['', f'## Every row, batch {b}', '',
              'r(γ+1) is the (γ+1)-token verify call over a 1-token call from the verify-cost curve above.', '',
              '| α* | γ | α measured (± s.e.) | tokens per target call | c in loop | a in loop | r(γ+1) | '
              '**measured** | Thm 3.8 | in-loop predicted | measured / predicted | identical |',
              '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rep['rows']:
      if r['batch'] != b:
        continue
      flag = '' if 0.9 <= r['measured_over_predicted'] <= 1.1 else ' ⚠'
      lines.append(f"| {r['alpha_target']:g} | {r['gamma']} | {r['alpha_measured']:.3f} ± "
                   f"{reporting.fmt(r['alpha_stderr'], '.3f')} | {r['tokens_per_call']:.2f} | {r['c_in_loop']:.3f} | "
                   f"{r['a_in_loop']:.2f} | {reporting.fmt(r['verify_ratio'])} | **{r['measured_speedup']:.2f}×** | "
                   f"{r['predicted_thm38']:.2f}× | "
                   f"{r['predicted_in_loop']:.2f}× | {r['measured_over_predicted']:.2f}{flag} | "
                   f"{'100%' if r['identical'] else 'NO'} |")
  lines += _cost_lines(rep)
  return '\n'.join(lines) + '\n'


def _cost_lines(rep) -> List[str]:
  """The in-loop costs replayed at one position beside the same costs fitted to the real decodes (batch 1),
  and the rows whose measured / predicted leaves 0.90-1.10."""
  lines = []
  one = rep['costs'].get('1')
  if one and one.get('fitted'):
    fitted = one['fitted']
    base = fitted['baseline']
    lines += ['', '## Costs inside the loop: replayed against fitted (batch 1)', '',
              'Replayed: one round timed at one mid-decode position inside a compiled loop (what the in-loop '
              'prediction uses). Fitted: seconds ≈ fixed + steps × per-step over every example and α* of the '
              'real decodes (`cost_model.fit_fixed_and_per_step`). Where they differ, the prediction misses by '
              'that much.', '',
              f"Baseline: round {1000 * one['baseline_round_s']:.3f} ms replayed, "
              f"{1000 * base['per_step_s']:.3f} ms fitted; fixed {1000 * one['baseline_fixed_s']:.2f} ms measured, "
              f"{1000 * base['fixed_s']:.2f} ms fitted.", '',
              '| γ | round ms replayed | round ms fitted | fitted / replayed | fixed ms measured | fixed ms fitted |',
              '|---|---|---|---|---|---|']
    for g, replayed in one['round_s'].items():
      f = fitted.get(g)
      if not f:
        continue
      lines.append(f"| {g} | {1000 * replayed:.3f} | {1000 * f['per_step_s']:.3f} | "
                   f"{f['per_step_s'] / replayed:.2f} | {1000 * one['speculative_fixed_s'][g]:.2f} | "
                   f"{1000 * f['fixed_s']:.2f} |")
  misses = [r for r in rep['rows'] if not 0.9 <= r['measured_over_predicted'] <= 1.1]
  lines += ['', '## Rows outside measured / predicted 0.90-1.10', '']
  if not misses:
    lines.append('None.')
  for r in misses:
    lines.append(f"- batch {r['batch']}, α* {r['alpha_target']:g}, γ {r['gamma']}: measured "
                 f"{r['measured_speedup']:.2f}×, predicted {r['predicted_in_loop']:.2f}× "
                 f"({r['measured_over_predicted']:.2f}).")
  return lines


def controlled_row_markdown(row: Mapping[str, Any], task_label: str) -> str:
  """The section a table prints under its rows for `ceiling.controlled_row`: what the loop gives on this machine
  when drafts are good, marked as controlled acceptance, with the verify-cost curve that chose γ."""
  curve = row['verify_curve']
  ratios = ', '.join(f'{k}: {r:.2f}' for k, r in zip(curve['tokens'][1:], curve['ratio'][1:]))
  return '\n'.join([
      f'### When drafts are good: {CONTROLLED} (not a drafter)', '',
      'The **oracle** drafter (`specdec/bench/oracle.py`) proposes the target\'s own greedy token with probability α* '
      'and a wrong one otherwise, at the cost of a lookup; the target verifies every draft. Batch 1, greedy, '
      'interleaved with the baseline. γ is the best for α* on this machine\'s verify-cost curve '
      '(`theory.best_gamma`).', '',
      '| task | drafter | α* | γ | α measured | tokens/call | predicted (in loop) | **measured speedup** | '
      'identical | examples |',
      '|---|---|---|---|---|---|---|---|---|---|',
      f"| {task_label} | {CONTROLLED} (oracle) | {row['alpha_target']:g} | {row['gamma']} | "
      f"{row['alpha_measured']:.2f} | {row['tokens_per_call']:.2f} | {row['predicted_in_loop']:.2f}× | "
      f"**{row['measured_speedup']:.2f}×** | {'100%' if row['identical'] else 'NO'} | {row['examples']} |", '',
      f'A k-token target call over a 1-token call on this machine (k: ratio): {ratios}.', ''])
