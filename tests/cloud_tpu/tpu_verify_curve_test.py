"""Tests for specdec/cloud_tpu/tpu_verify_curve.py: call times from compiled figures, and Table 2's predicted speedups."""

import pytest

from specdec.bench import tables
from specdec import theory
from specdec.cloud_tpu import tpu_verify_curve as curve


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


# A measured curve (scripts/accelerator_check.py's report.json) instead of the predicted one.

def _report(platform='tpu', date='2027-01-02T00:00:00', target='xxl'):
  tokens = list(range(1, 17))
  return {'command': 'python scripts/accelerator_check.py', 'date': date,
          'machine': {'platform': platform, 'device_kind': 'TPU v4', 'device_count': 4, 'jax': '0.10.2'},
          'verify_curves': {target: {'1': {'tokens': tokens, 'call_s': [0.010 + 0.001 * (k - 1) for k in tokens]},
                                     '8': {'tokens': tokens, 'call_s': [0.012 + 0.002 * (k - 1) for k in tokens]}}},
          'costs': {target: {'target_call_s': 0.010,
                             'draft_call_s': {'small': 0.0005, 'base': 0.001, 'large': 0.002, 'bigram': 1e-5}}}}


def test_measured_seconds_read_the_report():
  seconds = curve.measured_seconds(_report())
  assert seconds['target'][(1, 1)] == pytest.approx(0.010)
  assert seconds['target'][(8, 1)] == pytest.approx(0.017)
  assert seconds['target'][(16, 8)] == pytest.approx(0.042)
  assert seconds['drafter'][('large', 1)] == 0.002


def test_table2_from_measured_costs():
  rows = curve.table2_rows(curve.measured_seconds(_report()))
  row = next(r for r in rows if (r['task'], r['drafter'], r['temperature']) == ('ende', 'base', 1.0))
  gamma, alpha, _ = tables.PAPER_TABLE2[('ende', 'base', 1.0)]
  t_v = 0.010 + 0.001 * gamma
  assert row['c'] == pytest.approx(0.1) and row['verify_ratio'] == pytest.approx(t_v / 0.010)
  assert row['predicted_speedup'] == pytest.approx(
      float(theory.predicted_speedup_from_costs(alpha, gamma, 0.001, 0.010, t_v)))


def test_a_report_without_the_target_is_a_clear_error():
  with pytest.raises(ValueError, match=r"no verify-cost curve and costs for the 'xxl' target .*\['base'\]"):
    curve.measured_seconds(_report(target='base'))


def test_find_measured_report_takes_the_newest_tpu_report(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  assert curve.find_measured_report(str(tmp_path)) == ''
  for name, report in (('cpu_cpu', _report(platform='cpu')), ('tpu_old', _report(date='2027-01-01')),
                       ('tpu_new', _report(date='2027-02-01')), ('tpu_no_xxl', _report(target='large'))):
    folder = tmp_path / curve.ACCELERATOR_RESULTS / name
    folder.mkdir(parents=True)
    (folder / 'report.json').write_text(json.dumps(report))
  assert curve.find_measured_report(str(tmp_path)).endswith('tpu_new/report.json')


def test_measured_markdown_beside_the_compiled_prediction():
  compiled = {'slice': {'name': 'v4-8'}, 'programs': _programs()}
  md = curve.measured_markdown(_report(), 'results/accelerator/tpu_TPU_v4/report.json', compiled)
  assert 'measured on TPU v4 ×4' in md and curve.LABEL not in md
  predicted_ms = curve.call_seconds(_programs()[curve.target_name(1, 1)]) * 1e3
  assert f'| 1 | 1 | 10.000 | 1.00 | {predicted_ms:.3f} | {10.0 / predicted_ms:.2f} |' in md
  assert '| ende | small | 0 | 7 | 0.75 | 0.050 | 1.70 |' in md
