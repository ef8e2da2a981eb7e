"""Numbers from measured records: α, the benchmark's summary, its CSV and Markdown, and where a result was made.

Pure functions over records (dicts), no decoding and no timing. α, the acceptance rate, is computed from the
decode loop's statistics by `theory.acceptance_rate` (with its binomial standard error
`theory.acceptance_stderr`): accepted / judged drafts, 0 when nothing was judged (no evidence). The benchmark's
records are the per-example dicts `benchmark.run` writes to examples.jsonl; its summary (`summarize_benchmark`)
is what benchmark.json holds. The figures are in `specdec.bench.plots`; the peer benchmark's and the ceiling's
Markdown in `specdec.bench.peers_report` and `specdec.bench.ceiling_report`.
"""

import os
import platform
import sys
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec.bench import cost_model
from specdec import theory


def fmt(x: Any, spec: str = '.2f', none: str = '-') -> str:
  """`x` formatted by `spec`, or `none` for a missing value (None or nan)."""
  return none if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def finite_or_none(x: float) -> Optional[float]:
  """None for nan/inf, so the JSON written is strict (nan: e.g. a speedup out of reach at any α)."""
  return float(x) if np.isfinite(x) else None


# ----------------------------------------------------------------------------------------------------------
# Baseline steps per batch, padded.
# ----------------------------------------------------------------------------------------------------------


def steps_per_batch(batches: Iterable[Tuple[Sequence[int], Sequence[int]]],
                    batch_size: int) -> List[Tuple[List[int], List[int]]]:
  """Each batch's (baseline tokens per row, target calls per row), padded to `batch_size` rows with rows that
  take no steps (a short last batch still runs at the full batch's size):
  `cost_model.predicted_speedup_in_loop_batched`'s input."""
  pad = lambda xs: list(xs) + [0] * (batch_size - len(xs))
  return [(pad(tokens), pad(calls)) for tokens, calls in batches]


# ----------------------------------------------------------------------------------------------------------
# Where a result was made.
# ----------------------------------------------------------------------------------------------------------


def run_command(argv: Optional[Sequence[str]] = None) -> str:
  """The command line that made a result, relative to the repository: `python -m specdec.main ...` for a
  module run with -m (whose argv[0] is its absolute file path), else argv[0] relative to the working directory."""
  argv = list(sys.argv if argv is None else argv)
  program = os.path.abspath(argv[0]) if argv else ''
  package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # specdec/, above this sub-package
  if program.startswith(package_dir + os.sep) and program.endswith('.py'):
    head = 'python -m specdec.' + os.path.relpath(program, package_dir)[:-3].replace(os.sep, '.')
  else:
    head = 'python ' + os.path.relpath(program) if program else 'python'
  return ' '.join([head] + argv[1:])


def machine_info() -> Dict[str, Any]:
  """The platform, processor, CPU count, Python and jax versions, backend and devices of this process, and
  the XLA_FLAGS it runs under (they change which kernels XLA emits, and so the speed)."""
  return {'platform': platform.platform(), 'processor': platform.processor() or platform.machine(),
          'cpu_count': os.cpu_count(), 'python': platform.python_version(), 'jax': jax.__version__,
          'backend': jax.default_backend(), 'devices': [str(d) for d in jax.devices()],
          'xla_flags': os.environ.get('XLA_FLAGS', '')}


def xla_flags_note(machine: Mapping[str, Any]) -> str:
  """' · XLA_FLAGS `...`' for a report's header line when the run set any, else ''."""
  flags = machine.get('xla_flags', '')
  return f' · XLA_FLAGS `{flags}`' if flags else ''


# ----------------------------------------------------------------------------------------------------------
# The benchmark's summary.
# ----------------------------------------------------------------------------------------------------------


def batch_heads(records: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
  """One record per batch (batch times are stored on every row of the batch)."""
  seen, out = set(), []
  for r in records:
    if r['batch'] not in seen:
      seen.add(r['batch'])
      out.append(r)
  return out


def summarize_benchmark(records: Sequence[Mapping[str, Any]], costs: Mapping[str, float], setting,
                        in_loop_by_rows: Optional[Mapping[int, Mapping[str, float]]] = None) -> Dict[str, Any]:
  """The benchmark's numbers from per-example records and the measured call costs.

  `setting`: the run's `settings.Setting` (its gamma, temperature and batch_size are read).
  `in_loop_by_rows`: `profiling.in_loop_costs` at each batch size the loops run at (`batch_shrink.stage_sizes`);
  the summary's `in_loop` is the full batch's.
  """
  heads = batch_heads(records)
  in_loop = in_loop_by_rows[setting.batch_size] if in_loop_by_rows else None
  base_total = sum(r['baseline_s'] for r in heads)
  spec_total = sum(r['speculative_s'] for r in heads)
  base_tokens = sum(r['baseline_tokens'] for r in records)
  spec_tokens = sum(r['speculative_tokens'] for r in records)
  tot = lambda key: float(sum(r[key] for r in records))
  judged, accepted, drafted = tot('judged'), tot('accepted'), tot('drafted')
  calls = tot('target_calls')
  alpha_accept = theory.acceptance_rate(accepted, judged)
  alpha_overlap = tot('overlap_sum') / tot('overlap_count') if tot('overlap_count') else 0.0
  accepted_at = np.sum([r['accepted_at'] for r in records], axis=0).astype(float)
  # P(draft j kept | drafts < j kept): rounds reaching position j are those that kept j-1 (or all rounds).
  reached = np.concatenate([[calls], accepted_at[:-1]])
  per_position = np.where(reached > 0, accepted_at / np.maximum(reached, 1), np.nan)
  gamma = setting.gamma
  alpha_for_theory = min(max(alpha_accept, 0.0), 1.0)
  thm38 = float(theory.expected_speedup(alpha_for_theory, gamma, costs['c']))
  from_costs = float(theory.predicted_speedup_from_costs(
      alpha_for_theory, gamma, costs['draft_call_s'], costs['target_call_s'], costs['verify_call_s']))
  speedup = base_total / spec_total
  identical = [r['identical'] for r in records]
  mismatches = [dict(index=r['index'], **r['mismatch']) for r in records if 'mismatch' in r]
  return {
      'examples': len(records),
      'baseline_seconds': base_total, 'speculative_seconds': spec_total,
      'baseline_ms_per_example': 1000 * float(np.median([r['baseline_s'] for r in heads])),
      'speculative_ms_per_example': 1000 * float(np.median([r['speculative_s'] for r in heads])),
      'speedup': speedup,
      'median_example_speedup': float(np.median([r['baseline_s'] / r['speculative_s'] for r in heads])),
      'baseline_tokens': base_tokens, 'speculative_tokens': spec_tokens,
      'baseline_tokens_per_s': base_tokens / base_total, 'speculative_tokens_per_s': spec_tokens / spec_total,
      'alpha_accept': alpha_accept, 'alpha_overlap': alpha_overlap,
      'accepted_per_drafted': accepted / drafted if drafted else 0.0,
      'tokens_per_target_call': tot('emitted') / calls if calls else 0.0,
      'target_calls': calls, 'drafted': drafted, 'judged': judged, 'accepted': accepted,
      'acceptance_per_position': [None if np.isnan(x) else float(x) for x in per_position],
      'predicted_speedup_thm38': thm38,
      'predicted_speedup_costs': from_costs,
      'measured_over_predicted': speedup / from_costs,
      'expected_tokens_per_call': float(theory.expected_tokens(alpha_for_theory, gamma)),
      # The α this γ and these measured costs would need for 1.5× and 2× (None: unreachable).
      'alpha_needed': {str(x): finite_or_none(theory.required_alpha(x, gamma, costs['c'],
                                                                    costs['verify_cost_ratio']))
                       for x in (1.5, 2.0)},
      'identical_rate': float(np.mean(identical)) if setting.temperature == 0 else None,
      'mismatches': mismatches,
      'in_loop': dict(in_loop) if in_loop else None,
      'in_loop_by_rows': ({str(rows): dict(c) for rows, c in in_loop_by_rows.items()}
                          if in_loop_by_rows and setting.batch_size > 1 else None),
      'fitted': _fitted_costs(records),
      'predicted_speedup_in_loop': (cost_model.predicted_speedup_in_loop_batched(
          in_loop_by_rows, _benchmark_steps_per_batch(records, setting.batch_size)) if in_loop else None),
  }


def _benchmark_steps_per_batch(records: Sequence[Mapping[str, Any]], batch_size: int):
  """`steps_per_batch` of benchmark records, grouped by their batch."""
  by_batch: Dict[int, Tuple[List[int], List[int]]] = {}
  for r in records:
    tokens_r, calls_r = by_batch.setdefault(r['batch'], ([], []))
    tokens_r.append(r['baseline_tokens'])
    calls_r.append(r['target_calls'])
  return steps_per_batch(by_batch.values(), batch_size)


def _fitted_costs(records: Sequence[Mapping[str, Any]]) -> Optional[Dict[str, float]]:
  """Fixed and per-step costs of both decoders fitted over the examples (`cost_model.fitted_costs`): what a
  round costs in the real loop. Batch 1 only (a batch's time is its slowest row's); None when it cannot be fitted."""
  if (not records or any(r.get('batch_rows', 1) != 1 for r in records)
      or len({r.get('batch') for r in records}) != len(records)):
    return None
  rows = [{'tokens': r['baseline_tokens'], 'target_calls': r['target_calls'], 'baseline_s': r['baseline_s'],
           'speculative_s': r['speculative_s']} for r in records]
  try:
    return cost_model.fitted_costs(rows)
  except ValueError:  # every example took the same number of steps
    return None


# ----------------------------------------------------------------------------------------------------------
# The benchmark's CSV and Markdown.
# ----------------------------------------------------------------------------------------------------------


BENCHMARK_CSV_FIELDS = ('index', 'input_length', 'padded_input_length', 'baseline_s', 'speculative_s',
                        'baseline_tokens', 'speculative_tokens', 'identical', 'target_calls', 'drafted', 'judged',
                        'accepted', 'emitted')


def benchmark_csv(records: Sequence[Mapping[str, Any]]) -> str:
  """One line per example record (`BENCHMARK_CSV_FIELDS`), after a header line."""
  rows = [','.join(BENCHMARK_CSV_FIELDS)]
  rows += [','.join(str(r[k]) for k in BENCHMARK_CSV_FIELDS) for r in records]
  return '\n'.join(rows) + '\n'


def benchmark_markdown(summary: Mapping[str, Any]) -> str:
  """benchmark.md: the summary as one table of quantities, and the greedy mismatches."""
  s = summary
  setting = s['setting']
  lines = [
      f"# Benchmark: {s['task']}:{s['split']}, drafter {s['drafter']}, γ={setting['gamma']}"
      f"{' (auto)' if s.get('gamma_auto') else ''}, "
      f"temperature {setting['temperature']:g}, batch {setting['batch_size']}",
      '',
      f"{s['date']} · {s['machine']['processor']}, {s['machine']['cpu_count']} CPUs · "
      f"jax {s['machine']['jax']} ({s['machine']['backend']}){xla_flags_note(s['machine'])} · `{s['command']}`",
      '',
      '| quantity | value |', '|---|---|',
      f"| examples | {s['examples']} |",
      f"| measured speedup (Σ baseline / Σ speculative wall time) | **{s['speedup']:.2f}×** |",
      f"| median per-example speedup | {s['median_example_speedup']:.2f}× |",
      f"| baseline / speculative ms per example (median) | {s['baseline_ms_per_example']:.1f} / "
      f"{s['speculative_ms_per_example']:.1f} |",
      f"| tokens/s baseline / speculative | {s['baseline_tokens_per_s']:.0f} / "
      f"{s['speculative_tokens_per_s']:.0f} |",
      f"| α (accepted / judged) | {s['alpha_accept']:.3f} |",
      f"| α (E[Σ min(p, q)]) | {s['alpha_overlap']:.3f} |",
      f"| accepted / drafted | {s['accepted_per_drafted']:.3f} |",
      f"| tokens per target call (Eq. 1 predicts) | {s['tokens_per_target_call']:.2f} "
      f"({s['expected_tokens_per_call']:.2f}) |",
      f"| acceptance per draft position | {', '.join('-' if x is None else f'{x:.2f}' for x in s['acceptance_per_position'])} |",
      f"| c = drafter call / target call | {s['costs']['c']:.3f} "
      f"({1000 * s['costs']['draft_call_s']:.3f} / {1000 * s['costs']['target_call_s']:.3f} ms) |",
      f"| verify call (γ+1 tokens) / 1-token call | {s['costs']['verify_cost_ratio']:.2f} |",
      f"| predicted speedup, Thm 3.8 (α, c) | {s['predicted_speedup_thm38']:.2f}× |",
      f"| predicted speedup, measured call costs | {s['predicted_speedup_costs']:.2f}× |",
      f"| measured / predicted (costs) | {s['measured_over_predicted']:.2f} |",
      f"| α needed at this γ and these costs for 1.5× / 2× | {fmt(s['alpha_needed']['1.5'], none='unreachable')} / "
      f"{fmt(s['alpha_needed']['2.0'], none='unreachable')} |",
  ]
  if s.get('in_loop'):
    il = s['in_loop']
    lines += [
        f"| inside the loop: c (draft step / baseline round) | {il['c_in_loop']:.3f} "
        f"({1000 * il['draft_s'] / setting['gamma']:.3f} / {1000 * il['baseline_round_s']:.3f} ms) |",
        f"| inside the loop: round less drafting (a) / baseline round | {il['round_fixed_in_loop']:.2f} "
        f"({1000 * (il['round_s'] - il['draft_s']):.3f} / {1000 * il['baseline_round_s']:.3f} ms) |",
        f"| per-example fixed cost, baseline / speculative | {1000 * il['baseline_fixed_s']:.2f} / "
        f"{1000 * il['speculative_fixed_s']:.2f} ms |",
        f"| predicted speedup, in-loop costs | {s['predicted_speedup_in_loop']:.2f}× "
        f"(measured / predicted {s['speedup'] / s['predicted_speedup_in_loop']:.2f}) |",
    ]
  if s.get('in_loop_by_rows'):  # batch > 1: the shrinking loops' stages, each at its own cost
    by_rows = sorted(s['in_loop_by_rows'].items(), key=lambda kv: -int(kv[0]))
    lines.append('| baseline step / speculative round at ' + ', '.join(k for k, _ in by_rows) + ' rows | '
                 + ', '.join(f"{1000 * c['baseline_round_s']:.2f} / {1000 * c['round_s']:.2f}" for _, c in by_rows)
                 + ' ms |')
  if s.get('fitted'):
    fit = s['fitted']
    lines.append(
        f"| the real loop (fitted over the examples): round / baseline token | {fit['round_in_baseline_tokens']:.2f} "
        f"({1000 * fit['round_s']:.3f} / {1000 * fit['baseline_token_s']:.3f} ms), "
        f"{fit['tokens_per_round']:.2f} tokens a round |")
  others = {k: v for k, v in (s.get('others_cpu_share') or {}).items() if v is not None}
  if others:
    lines.append("| other processes' share of the machine while timed (`machine_load`) | "
                 + ', '.join(f"{k.replace('_', ' ')} {100 * v:.0f}%" for k, v in others.items()) + ' |')
  if s['identical_rate'] is not None:
    lines.append(f"| identical greedy outputs | {100 * s['identical_rate']:.1f}% "
                 f"({s['examples'] - len(s['mismatches'])}/{s['examples']}) |")
  for name in ('baseline', 'speculative'):
    q = ', '.join(f'{k} {v:.2f}' for k, v in sorted(s['quality'][name].items()))
    lines.append(f'| quality, {name} | {q} |')
  if s['mismatches']:
    lines += ['', '## Greedy mismatches', '', '| example | position | baseline token | speculative token | '
              'logit margin | top-2 gap |', '|---|---|---|---|---|---|']
    lines += [f"| {m['index']} | {m['position']} | {m['baseline_token']} | {m['speculative_token']} | "
              f"{m['margin']:.2e} | {m['top2_gap']:.2e} |" for m in s['mismatches']]
  return '\n'.join(lines) + '\n'
