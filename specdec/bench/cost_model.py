"""From measured costs to predicted speedups: arithmetic only, no decoding and no timing.

* The in-loop prediction (`predicted_speedup_in_loop`, `predicted_speedup_in_loop_batched`): Σ baseline time /
  Σ speculative time from the costs `profiling.in_loop_costs` measures and each example's (or batch's) token and
  target-call counts, a shrinking batch's loop stage by stage (`shrinking_stages`).
* Costs fitted to whole decodes (`fit_fixed_and_per_step`, `fitted_costs`): each decoder's per-example fixed cost
  and per-step cost, least squares over examples; and a step's cost pooled over the examples'
  `profiling.real_step_cost`s (`pooled_step_cost`).
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from specdec import batch_shrink


# ----------------------------------------------------------------------------------------------------------
# Speedups predicted from the costs inside the loop.
# ----------------------------------------------------------------------------------------------------------


def predicted_speedup_in_loop(costs: Mapping[str, float], baseline_tokens, target_calls) -> float:
  """Σ baseline time / Σ speculative time that the in-loop costs predict for examples with these token and
  target-call counts (each example pays its fixed cost once); batch 1."""
  return predicted_speedup_in_loop_batched({1: costs}, [([n], [k]) for n, k in zip(baseline_tokens,
                                                                                     target_calls)])


def shrinking_stages(steps_r: Sequence[int], min_rows: Optional[int] = None) -> List[Tuple[int, int]]:
  """(rows, steps) of each stage of `batch_shrink.shrinking_while_loop` for rows taking these step counts.

  A stage of b rows runs until no more rows are active than the next stage holds, i.e. until the (B - next)-th
  row to finish has finished; the last stage (`batch_shrink.stage_sizes` with `min_rows`) runs until the slowest
  row has.
  """
  sizes = batch_shrink.stage_sizes(len(steps_r), min_rows)
  ends = sorted(int(k) for k in steps_r)
  done, stages = 0, []
  for rows, next_rows in zip(sizes, sizes[1:]):
    stop = max(ends[len(ends) - next_rows - 1], done)
    stages.append((rows, stop - done))
    done = stop
  stages.append((sizes[-1], max(ends[-1] - done, 0)))
  return stages


def predicted_speedup_in_loop_batched(costs_by_rows: Mapping[int, Mapping[str, float]],
                                      batches: Sequence[Tuple[Sequence[int], Sequence[int]]],
                                      shrink: bool = True) -> float:
  """Σ baseline time / Σ speculative time the in-loop costs predict, batch by batch.

  `batches`: (baseline tokens per row, target calls per row) of each batch; `costs_by_rows`: `profiling.in_loop_costs`
  measured at every batch size the loops run at (B, B/2, ..., 1 when `shrink`, else B). A batch pays its
  fixed costs once and, in each stage of its shrinking loop (`shrinking_stages`), that stage's steps at the
  stage's per-step cost; without `shrink` its slowest row's steps at B rows.
  """

  def steps_cost(steps_r, key):
    stages = shrinking_stages(steps_r) if shrink else [(len(steps_r), max(steps_r))]
    return sum(n * costs_by_rows[rows][key] for rows, n in stages)

  base = spec = 0.0
  for tokens_r, calls_r in batches:
    full = costs_by_rows[len(tokens_r)]
    base += full['baseline_fixed_s'] + steps_cost(tokens_r, 'baseline_round_s')
    spec += full['speculative_fixed_s'] + steps_cost(calls_r, 'round_s')
  return base / spec


# ----------------------------------------------------------------------------------------------------------
# Costs fitted to whole decodes.
# ----------------------------------------------------------------------------------------------------------


def fit_fixed_and_per_step(steps: Sequence[float], seconds: Sequence[float]) -> Dict[str, float]:
  """Least-squares `seconds ≈ fixed + steps × per_step` over examples.

  Fitted to real decodes (one row per example: its baseline tokens or its speculative rounds, and its median
  time), this is what a step costs inside the real compiled loop, every control-flow region, copy and
  statistic included, which the replayed round of `profiling.time_phases` can miss. Needs two or more distinct step
  counts (a single count cannot separate the two terms).
  """
  x = np.asarray(steps, np.float64)
  y = np.asarray(seconds, np.float64)
  if x.shape != y.shape or x.ndim != 1:
    raise ValueError(f'steps and seconds must be 1-D and of one length, got {x.shape} and {y.shape}.')
  if len(np.unique(x)) < 2:
    raise ValueError('fitting a fixed and a per-step cost needs examples with at least two distinct step '
                     f'counts, got {sorted(set(x.tolist()))}.')
  design = np.stack([np.ones_like(x), x], axis=1)
  (fixed, per_step), *_ = np.linalg.lstsq(design, y, rcond=None)
  residual = y - design @ np.array([fixed, per_step])
  return {'fixed_s': float(fixed), 'per_step_s': float(per_step),
          'rms_residual_s': float(np.sqrt(np.mean(residual ** 2)))}


def fitted_costs(rows: Sequence[Mapping[str, float]]) -> Dict[str, float]:
  """Per-example fixed cost and per-step cost of both decoders from end-to-end rows (`tokens`,
  `target_calls`, `baseline_s`, `speculative_s`), and the round in baseline tokens."""
  base = fit_fixed_and_per_step([r['tokens'] for r in rows], [r['baseline_s'] for r in rows])
  spec = fit_fixed_and_per_step([r['target_calls'] for r in rows], [r['speculative_s'] for r in rows])
  tokens = sum(r['tokens'] for r in rows)
  rounds = sum(r['target_calls'] for r in rows)
  return {'baseline_fixed_s': base['fixed_s'], 'baseline_token_s': base['per_step_s'],
          'speculative_fixed_s': spec['fixed_s'], 'round_s': spec['per_step_s'],
          'round_in_baseline_tokens': spec['per_step_s'] / base['per_step_s'],
          'tokens_per_round': tokens / rounds if rounds else 0.0,
          'baseline_rms_residual_s': base['rms_residual_s'],
          'speculative_rms_residual_s': spec['rms_residual_s']}


def pooled_step_cost(measurements: Sequence[Mapping[str, Any]]) -> Optional[float]:
  """Seconds a step over the examples' `profiling.real_step_cost`s: Σ Δseconds / Σ Δsteps (examples that ended
  before the lower budget add nothing); None if none has a step between its budgets."""
  pairs = [(m['seconds'][1] - m['seconds'][0], m['steps'][1] - m['steps'][0]) for m in measurements
           if m['steps'][1] > m['steps'][0]]
  return sum(t for t, _ in pairs) / sum(n for _, n in pairs) if pairs else None
