"""Tests for specdec/auto_gamma.py: the choice follows the machine's verify-cost curve, α and c; `choose` measures
them on the run's batches, keeps its record and returns it unchanged when the run resumes. Speed is not asserted:
the measurements are replaced by fixed values where the choice is checked."""

import types

import numpy as np
import pytest

from specdec import auto_gamma
from specdec import profiling
from specdec import theory


def _curve(ratios):
  return {'tokens': list(range(1, len(ratios) + 1)), 'ratio': list(ratios), 'call_s': [1e-3 * r for r in ratios]}


FLAT = _curve([1.0] * 9)  # the paper's accelerators: a verify call costs one call at any width
STEEP = _curve([1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8, 3.1, 3.4])  # each extra token costs 0.3 calls


def test_a_flat_curve_and_good_drafts_take_the_widest_round():
  choice = auto_gamma.pick(0.9, 0.0, FLAT)
  assert choice['gamma'] == 8  # the curve's widest call (9 tokens)
  assert choice['predicted_speedup'] == pytest.approx(theory.expected_tokens(0.9, 8))


def test_a_steep_curve_takes_a_narrower_round_than_thm38():
  choice = auto_gamma.pick(0.6, 0.05, STEEP)
  assert choice['gamma'] < choice['thm38_gamma']
  assert (choice['gamma'], choice['predicted_speedup']) == pytest.approx(
      theory.best_gamma(0.6, 0.05, dict(zip(STEEP['tokens'], STEEP['ratio'])), max_gamma=8))


def test_pick_stays_within_the_curve_and_max_gamma():
  assert auto_gamma.pick(0.95, 0.0, _curve([1.0] * 4))['gamma'] == 3
  assert auto_gamma.pick(0.95, 0.0, FLAT, max_gamma=2)['gamma'] == 2


def _batch(rows=1, length=12):
  return {'encoder_input_tokens': np.ones((rows, 6), np.int32),
          'decoder_input_tokens': np.zeros((rows, length), np.int32)}


@pytest.fixture
def fake_measures(monkeypatch):
  """The curve and the phases replaced by fixed values; counts the calls."""
  calls = {'curve': 0, 'phases': 0}

  def curve(module, params, enc, length, max_tokens, *args, **kwargs):
    calls['curve'] += 1
    return _curve(STEEP['ratio'][:max_tokens])

  def phases(*args, **kwargs):
    calls['phases'] += 1
    assert kwargs['parts'] == ('draft', 'baseline_round') and args[7] == auto_gamma.PROBE_GAMMA
    return types.SimpleNamespace(draft=2 * 0.05, baseline_round=1.0)  # c = 0.05

  monkeypatch.setattr(profiling, 'verify_cost_curve', curve)
  monkeypatch.setattr(profiling, 'time_phases', phases)
  return calls


def _choose(batches, state_path, accepted=(3, 3), judged=(5, 5)):
  outcomes = iter(zip(accepted, judged))

  def spec_predict(params, batch, rng):
    a, j = next(outcomes)
    return None, {'stats': {'accepted': np.asarray([a]), 'judged': np.asarray([j])}}

  def base_predict(params, batch, rng):
    return np.zeros((1, 1, batch['decoder_input_tokens'].shape[1]), np.int32), {}

  return auto_gamma.choose(None, None, None, None, batches, spec_predict, base_predict, {}, {},
                           {'temperature': 0.0}, state_path=state_path, log=lambda _: None)


def test_choose_measures_alpha_c_and_the_curve_then_keeps_its_choice(fake_measures, tmp_path):
  path = str(tmp_path / auto_gamma.FILE_NAME)
  record = _choose([_batch(), _batch()], path)
  assert record['alpha'] == pytest.approx(0.6) and record['judged'] == 10
  assert record['c_in_loop'] == pytest.approx(0.05)
  assert record['verify_curve']['tokens'] == list(range(1, auto_gamma.MAX_GAMMA + 2))
  assert record['gamma'] == auto_gamma.pick(0.6, 0.05, record['verify_curve'])['gamma']
  assert fake_measures == {'curve': 1, 'phases': 1}
  # Resumed: the record as it was, nothing measured.
  assert _choose([_batch(), _batch()], path, accepted=(5, 5)) == record
  assert fake_measures == {'curve': 1, 'phases': 1}


def test_the_curve_is_no_wider_than_the_decode(fake_measures):
  record = _choose([_batch(length=5)], None, accepted=(1,), judged=(4,))
  assert record['verify_curve']['tokens'] == [1, 2, 3, 4] and record['gamma'] <= 3


@pytest.mark.parametrize('batches, match', [([], 'at least one batch'), ([_batch(length=2)], 'at least 3 tokens')])
def test_bad_input_is_refused_before_measuring(fake_measures, batches, match):
  with pytest.raises(ValueError, match=match):
    _choose(batches, None)
  assert fake_measures == {'curve': 0, 'phases': 0}


def test_alpha_is_calibrated_on_at_least_sixteen_examples():
  # At batch 1 the first 16 batches; at batch 8 the first 2; at batch 5 the first 4; fewer batches than that: all.
  assert auto_gamma.CALIBRATION_EXAMPLES == 16
  assert len(auto_gamma.calibration_batches([_batch()] * 20)) == 16
  assert len(auto_gamma.calibration_batches([_batch(rows=8)] * 5)) == 2
  assert len(auto_gamma.calibration_batches([_batch(rows=5)] * 5)) == 4
  assert len(auto_gamma.calibration_batches([_batch()] * 3)) == 3
