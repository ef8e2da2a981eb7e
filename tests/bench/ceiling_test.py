"""Tests for specdec/bench/ceiling.py: the grid measured end to end on a tiny target (and resumed), and the report's
arithmetic on a hand-made state (its Markdown: ceiling_report_test.py). Timings are only checked to be positive; speed is measured by
scripts/ceiling.py, never asserted here."""

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from specdec.bench import ceiling
from specdec.bench import ceiling_report
from specdec import network
from specdec.bench import plots
from specdec.bench import profiling
from specdec import theory
from tests import ceiling_states

V = 64
LENGTHS = {'inputs': 8, 'targets': 10}
SETTINGS = ceiling.Settings(alphas=(0.5, 1.0), gammas=(2,), batch_sizes=(1, 2), repeats=1,
                            max_verify_tokens=3)


def _tiny(seed, **overrides):
  config = network.t5_1_1_config('tiny', vocab_size=V, **overrides)
  return network.Transformer(config), network.init_params(config, jax.random.PRNGKey(seed))


def _examples(n=2):
  rng = np.random.RandomState(0)
  return [{'inputs': rng.randint(2, V, size=rng.randint(3, 8))} for _ in range(n)]


@pytest.mark.parametrize('overrides, match', [
    (dict(alphas=(1.2,)), 'alphas'),
    (dict(alphas=()), 'alphas'),
    (dict(gammas=(0,)), 'gammas'),
    (dict(batch_sizes=(0,)), 'batch_sizes'),
    (dict(repeats=0), 'repeats'),
    (dict(cost_repeats=0), 'cost_repeats'),
    (dict(gammas=(8,), max_verify_tokens=8), 'widest verify call'),
])
def test_bad_settings_are_refused(overrides, match):
  with pytest.raises(ValueError, match=match):
    ceiling.Settings(**overrides).validate()


def test_a_given_verify_curve_is_used_not_measured_again(monkeypatch):
  curve = {'tokens': [1, 2, 3], 'call_s': [1e-3, 2e-3, 3e-3], 'ratio': [1.0, 2.0, 3.0]}
  monkeypatch.setattr(profiling, 'verify_cost_curve', lambda *a, **k: pytest.fail('the curve was measured again'))
  settings = dataclasses.replace(SETTINGS, batch_sizes=(1,), alphas=(1.0,), cost_repeats=1)
  target = _tiny(0)
  state = ceiling.measure(*target, _examples(1), LENGTHS, settings, verify_curves={1: curve}, log=lambda _: None)
  assert state['costs']['1']['verify_curve'] == curve
  with pytest.raises(ValueError, match='covers k'):
    ceiling.measure(*target, _examples(1), LENGTHS, settings, verify_curves={1: dict(curve, tokens=[1, 2])})


@pytest.mark.parametrize('kwargs, match', [
    (dict(alpha=0.0), r'alpha must be in \(0, 1\]'), (dict(alpha=1.2), 'alpha'),
    (dict(max_verify_tokens=1), 'max_verify_tokens must be an integer >= 2'), (dict(examples=[]), 'at least one'),
])
def test_controlled_row_refuses_bad_settings_before_measuring(kwargs, match, monkeypatch):
  monkeypatch.setattr(profiling, 'verify_cost_curve', lambda *a, **k: pytest.fail('measured before the check'))
  examples = kwargs.pop('examples', _examples(1))
  with pytest.raises(ValueError, match=match):
    ceiling.controlled_row(*_tiny(0), examples, LENGTHS, **kwargs)


@pytest.fixture(scope='module')
def measured(tmp_path_factory):
  target = _tiny(0)
  drafter = _tiny(1)
  state_path = str(tmp_path_factory.mktemp('ceiling') / 'state.json')
  lines = []
  state = ceiling.measure(*target, _examples(), LENGTHS, SETTINGS, {'tiny_drafter': (*drafter, 1)},
                          state_path=state_path, log=lines.append)
  return target, drafter, state_path, state, lines


def test_measure_times_every_decoder_and_keeps_outputs_identical(measured):
  _, _, _, state, lines = measured
  assert any('ETA' in line for line in lines)
  for key, batch_size in (('1', 1), ('2', 2)):
    records = state['batches'][key]
    assert len(records) == 2 // batch_size
    for record in records:
      assert record['baseline_s'] > 0
      assert set(record['oracle']) == {ceiling.oracle_label(a, g) for a in SETTINGS.alphas
                                       for g in SETTINGS.gammas}
      for row in list(record['oracle'].values()) + list(record['shipped'].values()):
        assert row['identical'] and row['seconds'] > 0
    assert set(state['costs'][key]['in_loop']) == {f'{g}/{rows}' for g in SETTINGS.gammas
                                                   for rows in ((1,) if batch_size == 1 else (2, 1))}
  one = state['batches']['1']
  label = ceiling.oracle_label(1.0, 2)
  assert sum(sum(r['oracle'][label]['accepted']) for r in one) == sum(sum(r['oracle'][label]['judged'])
                                                                      for r in one)


def test_measure_resumes_without_timing_again(measured, monkeypatch):
  target, drafter, state_path, state, _ = measured

  def refuse(*args, **kwargs):
    raise AssertionError('a finished step was measured again')

  monkeypatch.setattr(profiling, 'time_side_by_side', refuse)
  monkeypatch.setattr(profiling, 'in_loop_costs', refuse)
  monkeypatch.setattr(profiling, 'verify_cost_curve', refuse)
  again = ceiling.measure(*target, _examples(), LENGTHS, SETTINGS, {'tiny_drafter': (*drafter, 1)},
                          state_path=state_path, log=lambda line: None)
  assert again['batches'] == state['batches'] and again['costs'] == state['costs']
  # Other inputs are refused, before anything is measured: the state of another run is never overwritten.
  with pytest.raises(ValueError, match='holds a run of other settings or inputs'):
    ceiling.measure(*target, _examples(3), LENGTHS, SETTINGS, {'tiny_drafter': (*drafter, 1)},
                    state_path=state_path, log=lambda line: None)


def test_report_markdown_and_plot_of_a_measured_state(measured, tmp_path):
  _, _, _, state, _ = measured
  rep = ceiling.report(state, {'examples': 2, 'positions': 9, 'top1_median': 0.3, 'top1_mean': 0.4,
                               'share_top1_at_least_0.5': 0.3, 'share_top1_at_least_0.9': 0.1,
                               'entropy_mean_nats': 3.0, 'argmax_agreement': 1.0})
  assert len(rep['rows']) == len(SETTINGS.alphas) * len(SETTINGS.gammas) * len(SETTINGS.batch_sizes)
  for row in rep['rows']:
    for key in ('alpha_target', 'alpha_measured', 'gamma', 'batch', 'measured_speedup', 'predicted_in_loop',
                'predicted_thm38'):
      assert isinstance(row[key], (int, float)) and math.isfinite(row[key])
    assert row['drafter'] == ceiling.CONTROLLED and row['identical']
  assert {r['drafter'] for r in rep['shipped']} == {'tiny_drafter'}
  json.dumps(rep)  # the report is plain JSON
  text = ceiling_report.markdown(rep, 'header line')
  assert 'controlled acceptance' in text and 'header line' in text and 'tiny_drafter' in text
  plots.plot_ceiling(str(tmp_path / 'ceiling.png'), rep)
  assert (tmp_path / 'ceiling.png').read_bytes()[:4] == b'\x89PNG'


def test_report_arithmetic_by_hand():
  rep = ceiling.report(ceiling_states.hand_state())
  (row,) = rep['rows']
  assert row['measured_speedup'] == pytest.approx(0.050 / 0.027)
  assert row['alpha_measured'] == pytest.approx(21 / 26)
  assert row['tokens_per_call'] == pytest.approx(30 / 14)
  # Fixed costs once per example, then tokens × baseline round against rounds × round.
  predicted = (2 * 0.002 + 30 * 0.001) / (2 * 0.003 + 14 * 0.0014)
  assert row['predicted_in_loop'] == pytest.approx(predicted)
  assert row['measured_over_predicted'] == pytest.approx(row['measured_speedup'] / predicted)
  assert row['predicted_thm38'] == pytest.approx(theory.expected_speedup(21 / 26, 2, 0.1))
  (best,) = rep['best_gamma']
  assert best['best_gamma_measured'] == 2
  assert best['best_gamma_helper'] == theory.best_gamma(21 / 26, 0.1, {3: 1.3})[0] == 2
  assert best['optimal_gamma_thm38'] == theory.optimal_gamma(21 / 26, 0.1, max_gamma=2)[0]
  fitted = rep['costs']['1']['fitted']['2']
  assert fitted['per_step_s'] == pytest.approx((0.015 - 0.012) / (9 - 5))
  # α's binomial standard error over the 26 judged drafts.
  assert row['alpha_stderr'] == pytest.approx(math.sqrt(21 / 26 * 5 / 26 / 26))
