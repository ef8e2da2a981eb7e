"""Tests for specdec/bench/cost_model.py: predicted speedups and fitted costs, by hand."""

import pytest

from specdec.bench import cost_model


def test_predicted_speedup_in_loop_by_hand():
  costs = {'baseline_fixed_s': 1.0, 'speculative_fixed_s': 2.0, 'baseline_round_s': 0.5, 'round_s': 1.0}
  # baseline: (1 + 10·0.5) + (1 + 4·0.5) = 9; speculative: (2 + 4·1) + (2 + 1·1) = 9.
  assert cost_model.predicted_speedup_in_loop(costs, [10, 4], [4, 1]) == pytest.approx(1.0)
  assert cost_model.predicted_speedup_in_loop(costs, [20], [2]) == pytest.approx(11 / 4)


def test_shrinking_stages_follow_the_loop():
  # Rows ending after 3, 8, 1, 6, 2, 7, 4, 5 steps: 4 steps at 8 rows (4 left), 2 at 4, 1 at 2, 1 at 1.
  assert cost_model.shrinking_stages([3, 8, 1, 6, 2, 7, 4, 5]) == [(8, 4), (4, 2), (2, 1), (1, 1)]
  assert cost_model.shrinking_stages([3, 8, 1, 6, 2, 7, 4, 5], min_rows=2) == [(8, 4), (4, 2), (2, 2)]
  assert cost_model.shrinking_stages([5, 5, 5]) == [(3, 5), (1, 0)]
  assert cost_model.shrinking_stages([7]) == [(1, 7)]
  # The same row-steps as the loop itself pays (tests/batch_shrink_test.py counts them: 43 of 64).
  assert sum(r * n for r, n in cost_model.shrinking_stages([3, 8, 1, 6, 2, 7, 4, 5])) == 43


def test_predicted_speedup_in_loop_batched_by_hand():
  costs = {2: {'baseline_fixed_s': 1.0, 'speculative_fixed_s': 2.0, 'baseline_round_s': 0.8, 'round_s': 1.6},
           1: {'baseline_fixed_s': 0.5, 'speculative_fixed_s': 1.0, 'baseline_round_s': 0.5, 'round_s': 1.0}}
  batches = [([10, 4], [5, 2])]
  # Shrinking: baseline 1 + 4·0.8 + 6·0.5 = 7.2; speculative 2 + 2·1.6 + 3·1.0 = 8.2.
  assert cost_model.predicted_speedup_in_loop_batched(costs, batches) == pytest.approx(7.2 / 8.2)
  # Full batch: baseline 1 + 10·0.8 = 9; speculative 2 + 5·1.6 = 10.
  assert cost_model.predicted_speedup_in_loop_batched(costs, batches, shrink=False) == pytest.approx(0.9)


def test_fit_fixed_and_per_step_recovers_a_line():
  fit = cost_model.fit_fixed_and_per_step([3, 10, 20, 7], [0.003 + 0.002 * n for n in (3, 10, 20, 7)])
  assert fit['fixed_s'] == pytest.approx(0.003)
  assert fit['per_step_s'] == pytest.approx(0.002)
  assert fit['rms_residual_s'] == pytest.approx(0.0, abs=1e-12)


def test_fit_fixed_and_per_step_refuses_what_it_cannot_separate():
  with pytest.raises(ValueError, match='two distinct step counts'):
    cost_model.fit_fixed_and_per_step([5, 5, 5], [1.0, 1.1, 0.9])
  with pytest.raises(ValueError, match='one length'):
    cost_model.fit_fixed_and_per_step([1, 2], [1.0, 2.0, 3.0])


def test_fitted_costs_by_hand():
  # baseline 1 ms + 0.5 ms/token; speculative 2 ms + 1.5 ms/round: a round is 3 baseline tokens.
  rows = [{'tokens': t, 'target_calls': r, 'baseline_s': 1e-3 + 5e-4 * t, 'speculative_s': 2e-3 + 1.5e-3 * r}
          for t, r in ((10, 4), (20, 9), (6, 2))]
  fit = cost_model.fitted_costs(rows)
  assert fit['baseline_fixed_s'] == pytest.approx(1e-3)
  assert fit['speculative_fixed_s'] == pytest.approx(2e-3)
  assert fit['round_in_baseline_tokens'] == pytest.approx(3.0)
  assert fit['tokens_per_round'] == pytest.approx(36 / 15)


def test_pooled_step_cost_by_hand():
  m = lambda steps, seconds: {'steps': steps, 'seconds': seconds}
  # (0.6 + 0.0 + 0.3) / (3 + 0 + 2); the ended example adds nothing.
  assert cost_model.pooled_step_cost([m([2, 5], [0.5, 1.1]), m([4, 4], [0.2, 0.2]), m([1, 3], [0.1, 0.4])]) == (
      pytest.approx(0.9 / 5))
  assert cost_model.pooled_step_cost([m([4, 4], [0.2, 0.2])]) is None
