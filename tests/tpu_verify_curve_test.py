"""Tests for specdec/tpu_verify_curve.py: call times from compiled figures, and Table 2's predicted speedups."""

import pytest

from specdec import tables
from specdec import theory
from specdec import tpu_verify_curve as curve


def _record(flops, bytes_accessed, collectives=0):
  return {'flops': flops, 'bytes_accessed': bytes_accessed,
          'collectives': {'all-reduce': collectives, 'all-gather': 0}}


def test_call_seconds_is_the_roofline_plus_collectives():
  # Memory-bound: 1.2 GB at 1.2 TB/s is 1 ms, 2.75 GFLOP at 275 TFLOP/s only 10 µs.
  assert curve.call_seconds(_record(2.75e9, 1.2e9)) == pytest.approx(1e-3)
  # Compute-bound, plus 3 collectives at the stated cost.
  assert curve.call_seconds(_record(2.75e12, 1.2e9, 3)) == pytest.approx(1e-2 + 3 * curve.COLLECTIVE_SECONDS)


def _programs():
  programs = {curve.target_name(k, b): _record(1e9, 1.2e9 * (1 + 0.05 * (k - 1)), 10)
              for k in curve.KS for b in curve.BATCHES}
  for drafter, scale in (('small', 0.02), ('base', 0.05), ('large', 0.1)):
    for b in curve.BATCHES:
      programs[curve.drafter_name(drafter, b)] = _record(1e8, 1.2e9 * scale, 10)
  return programs


def test_predictions_cover_table2_with_the_paper_s_alpha_and_gamma():
  rows = curve.predictions(_programs())
  assert len(rows) == 12
  row = next(r for r in rows if (r['task'], r['drafter'], r['temperature']) == ('ende', 'small', 0.0))
  gamma, alpha, paper = tables.PAPER_TABLE2[('ende', 'small', 0.0)]
  t_p = curve.call_seconds(_programs()[curve.target_name(1, 1)])
  t_v = curve.call_seconds(_programs()[curve.target_name(gamma + 1, 1)])
  t_q = curve.call_seconds(_programs()[curve.drafter_name('small', 1)])
  assert row['c'] == pytest.approx(t_q / t_p) and row['verify_ratio'] == pytest.approx(t_v / t_p)
  assert row['predicted_speedup'] == pytest.approx(float(theory.predicted_speedup_from_costs(alpha, gamma, t_q,
                                                                                             t_p, t_v)))
  assert row['paper_speedup'] == paper


def test_markdown_says_predicted_not_measured_everywhere():
  results = {'slice': {'name': 'v4-8'}, 'commands': ['python scripts/tpu_compile.py --slice=v4-8 --verify_curve'],
             'programs': _programs()}
  md = curve.markdown(results)
  assert md.count(curve.LABEL) >= 3
  assert '| ende | small | 0 | 7 | 0.75 |' in md
  # Without the drafters' steps compiled yet, the curve is shown and the predictions wait.
  partial = dict(results, programs={k: v for k, v in results['programs'].items() if k.startswith('target')})
  assert 'need' in curve.markdown(partial)
