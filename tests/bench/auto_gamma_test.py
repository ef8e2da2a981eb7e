"""Tests for specdec/bench/auto_gamma.py: the choice follows the machine's verify-cost curve, α and c; `choose` measures
them on the run's batches, keeps its record and returns it unchanged when the run resumes. Speed is not asserted:
the measurements are replaced by fixed values where the choice is checked."""

import json
import types

import numpy as np
import pytest

from specdec.bench import auto_gamma
from specdec.bench import profiling
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


def _batch(rows=1, length=12, real=None):
  """`rows` rows, the first `real` (default all) holding an example, the rest padding (all-zero inputs)."""
  enc = np.zeros((rows, 6), np.int32)
  enc[:rows if real is None else real] = 1
  return {'encoder_input_tokens': enc, 'decoder_input_tokens': np.zeros((rows, length), np.int32)}


MACHINE_A = {'backend': 'cpu', 'device_kind': 'cpu', 'device_count': 1, 'cpu_model': 'AMD EPYC 7B13',
             'cpu_count': 2}


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


def _stats(rows):
  """A decode's statistics ([B, 1] and [B, 1, γ]) from each row's (accepted_at, judged)."""
  accepted_at = np.asarray([a for a, _ in rows], np.int32)[:, None, :]
  return {'accepted_at': accepted_at, 'accepted': accepted_at.sum(-1),
          'judged': np.asarray([[j] for _, j in rows], np.int32)}


def _choose(batches, state_path, outcomes=None, machine=MACHINE_A):
  """`choose` on fake decodes: `outcomes` gives each calibration batch's rows as (accepted_at, judged); by
  default each row kept draft 1 in 2 rounds and draft 2 in 1 of 5 drafts judged (α 0.6)."""
  outcomes = iter(outcomes or [[([2, 1], 5)] * b['decoder_input_tokens'].shape[0] for b in batches])

  def spec_predict(params, batch, rng):
    return None, {'stats': _stats(next(outcomes))}

  def base_predict(params, batch, rng):
    return np.zeros((1, 1, batch['decoder_input_tokens'].shape[1]), np.int32), {}

  return auto_gamma.choose(None, None, None, None, batches, spec_predict, base_predict, {}, {},
                           {'temperature': 0.0}, state_path=state_path, log=lambda _: None, machine=machine)


def test_choose_measures_alpha_c_and_the_curve_then_keeps_its_choice(fake_measures, tmp_path):
  path = str(tmp_path / auto_gamma.FILE_NAME)
  record = _choose([_batch(), _batch()], path)
  assert record['alpha'] == pytest.approx(0.6) and record['judged'] == 10
  # Draft 1 judged in 10 - 4 = 6 rounds and kept in 4; draft 2 judged in those 4, kept in 2.
  assert record['accepted_at'] == [4, 2] and record['acceptance_by_depth'] == pytest.approx([4 / 6, 2 / 4])
  assert record['c_in_loop'] == pytest.approx(0.05)
  assert record['verify_curve']['tokens'] == list(range(1, auto_gamma.MAX_GAMMA + 2))
  assert record['gamma'] == auto_gamma.pick(0.6, 0.05, record['verify_curve'],
                                            acceptance=record['acceptance_by_depth'])['gamma']
  assert record['machine'] == MACHINE_A and record['calibration_examples'] == 2
  assert fake_measures == {'curve': 1, 'phases': 1}
  # Resumed on the same machine: the record as it was, nothing measured.
  assert _choose([_batch(), _batch()], path, outcomes=[[([0, 0], 5)]] * 2) == record
  assert fake_measures == {'curve': 1, 'phases': 1}


@pytest.mark.parametrize('field, value', [('cpu_model', 'Intel Xeon Platinum 8481C'), ('cpu_count', 16),
                                          ('device_kind', 'NVIDIA H100 80GB HBM3')])
def test_a_choice_resumed_on_another_machine_is_measured_again(fake_measures, tmp_path, field, value):
  path = str(tmp_path / auto_gamma.FILE_NAME)
  first = _choose([_batch()], path)
  machine_b = dict(MACHINE_A, **{field: value})
  second = _choose([_batch()], path, outcomes=[[([1, 0], 5)]], machine=machine_b)
  assert fake_measures == {'curve': 2, 'phases': 2}
  assert second['machine'] == machine_b and second['alpha'] == pytest.approx(0.2)
  assert second['replaces'] == {'gamma': first['gamma'], 'machine': MACHINE_A}
  # Kept for machine B now: resuming there measures nothing more.
  assert _choose([_batch()], path, machine=machine_b) == second
  assert fake_measures == {'curve': 2, 'phases': 2}


def test_a_stored_choice_that_names_no_machine_is_measured_again(fake_measures, tmp_path):
  path = tmp_path / auto_gamma.FILE_NAME
  path.write_text(json.dumps({'gamma': 5, 'alpha': 0.9}))  # written before choices named their machine
  record = _choose([_batch()], str(path))
  assert fake_measures == {'curve': 1, 'phases': 1} and record['replaces'] == {'gamma': 5, 'machine': None}


def test_this_machine_names_the_accelerator_and_the_cpu(tmp_path, monkeypatch):
  cpuinfo = tmp_path / 'cpuinfo'
  cpuinfo.write_text('processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n')
  monkeypatch.setattr(auto_gamma, 'CPUINFO', str(cpuinfo))
  machine = auto_gamma.this_machine()
  assert machine['cpu_model'] == auto_gamma.cpu_model(str(cpuinfo)) == 'Intel(R) Xeon(R) CPU @ 2.20GHz'
  assert set(machine) == {'backend', 'device_kind', 'device_count', 'cpu_model', 'cpu_count'}
  assert machine['cpu_count'] >= 1 and machine['device_count'] >= 1
  assert auto_gamma.cpu_model(str(tmp_path / 'absent'))  # no /proc/cpuinfo: what platform says


def test_the_curve_is_no_wider_than_the_decode(fake_measures):
  record = _choose([_batch(length=5)], None, outcomes=[[([1, 0], 4)]])
  assert record['verify_curve']['tokens'] == [1, 2, 3, 4] and record['gamma'] <= 3


@pytest.mark.parametrize('batches, match', [([], 'at least one batch'), ([_batch(length=2)], 'at least 3 tokens')])
def test_bad_input_is_refused_before_measuring(fake_measures, batches, match):
  with pytest.raises(ValueError, match=match):
    _choose(batches, None)
  assert fake_measures == {'curve': 0, 'phases': 0}


def test_a_calibration_that_judged_no_draft_is_refused_before_timing(fake_measures, tmp_path):
  # Every decode ended before a draft was compared: no α, so no γ to prefer (not α = 0 and γ = 1 unsaid).
  path = tmp_path / auto_gamma.FILE_NAME
  with pytest.raises(ValueError, match=r"judged no draft in its calibration decode of 2 examples.*give γ as an int"):
    _choose([_batch(), _batch()], str(path), outcomes=[[([0, 0], 0)]] * 2)
  assert fake_measures == {'curve': 0, 'phases': 0} and not path.exists()


def test_alpha_is_calibrated_on_at_least_sixteen_examples():
  # At batch 1 the first 16 batches; at batch 8 the first 2; at batch 5 the first 4; fewer batches than that: all.
  assert auto_gamma.CALIBRATION_EXAMPLES == 16
  assert len(auto_gamma.calibration_batches([_batch()] * 20)) == 16
  assert len(auto_gamma.calibration_batches([_batch(rows=8)] * 5)) == 2
  assert len(auto_gamma.calibration_batches([_batch(rows=5)] * 5)) == 4
  assert len(auto_gamma.calibration_batches([_batch()] * 3)) == 3


def test_padded_rows_are_neither_counted_nor_read(fake_measures):
  # Batches of 4 rows, 2 of them padding: 8 batches hold 16 examples (counting padding, 4 would).
  assert len(auto_gamma.calibration_batches([_batch(rows=4, real=2)] * 10)) == 8
  assert len(auto_gamma.calibration_batches([_batch(rows=4, real=0), _batch(rows=4, real=4)])) == 1
  np.testing.assert_array_equal(auto_gamma.real_rows(_batch(rows=3, real=2)), [True, True, False])
  # A padded row's decode (all-zero input, its own drafts judged and rejected) does not pull α down.
  real, padded = ([2, 1], 5), ([0, 0], 7)
  record = _choose([_batch(rows=4, real=2)] * 8, None, outcomes=[[real, real, padded, padded]] * 8)
  assert record['calibration_examples'] == 16 and record['judged'] == 80
  assert record['alpha'] == pytest.approx(0.6) and record['accepted_at'] == [32, 16]


def test_acceptance_by_depth_from_counts():
  # 10 judged, draft 1 kept 4 times, draft 2 twice: draft 2 judged in the 4 rounds that kept draft 1, draft 1 in 6.
  assert auto_gamma.acceptance_by_depth([4, 2], 10) == pytest.approx([4 / 6, 2 / 4])
  # With one α at every depth the depths pool back to accepted / judged (their denominators sum to judged).
  rng = np.random.default_rng(0)
  kept = np.cumprod(rng.random((100_000, 3)) < 0.6, axis=1)
  judged = int(np.minimum(kept.sum(1) + 1, 3).sum())
  acceptance = auto_gamma.acceptance_by_depth(kept.sum(0), judged)
  assert acceptance == pytest.approx([0.6] * 3, abs=0.01)
  # A depth no round reached takes the one above it; a decode that compared nothing has no acceptance.
  assert auto_gamma.acceptance_by_depth([0, 0], 5) == [0.0, 0.0]
  with pytest.raises(ValueError, match='needs judged drafts'):
    auto_gamma.acceptance_by_depth([0, 0], 0)
  with pytest.raises(ValueError, match='non-increasing counts'):
    auto_gamma.acceptance_by_depth([1, 2], 5)


def test_acceptance_that_falls_at_depth_picks_fewer_drafts_than_one_alpha():
  # α 0.6 over both probed depths, but 0.8 at depth 1 and 0.3 at depth 2 (and deeper): fewer drafts pay.
  choice = auto_gamma.pick(0.6, 0.05, FLAT, acceptance=[0.8, 0.3])
  assert choice['gamma_one_alpha'] == auto_gamma.pick(0.6, 0.05, FLAT)['gamma'] == 4
  assert choice['gamma'] < choice['gamma_one_alpha']
  assert (choice['gamma'], choice['predicted_speedup']) == pytest.approx(
      theory.best_gamma([0.8] + [0.3] * 7, 0.05, dict(zip(FLAT['tokens'], FLAT['ratio']))))
  # One value at every depth: the same pick as α.
  assert auto_gamma.pick(0.6, 0.05, STEEP, acceptance=[0.6, 0.6])['gamma'] == auto_gamma.pick(0.6, 0.05, STEEP)['gamma']
  assert auto_gamma.extend([0.8, 0.3], 4) == [0.8, 0.3, 0.3, 0.3]


def test_a_report_line_says_whether_one_alpha_would_pick_otherwise():
  assert auto_gamma.depth_note({'gamma': 2, 'alpha': 0.6}) == ''  # a record made before depths were measured
  record = {'gamma': 2, 'gamma_one_alpha': 3, 'acceptance_by_depth': [0.654, 0.55]}
  assert auto_gamma.depth_note(record) == '; acceptance by depth 0.65, 0.55, one α at every depth: γ = 3'
  assert auto_gamma.depth_note(dict(record, gamma_one_alpha=2)).endswith('γ = 2 (the same)')
