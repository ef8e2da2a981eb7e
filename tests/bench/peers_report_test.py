"""Tests for specdec/bench/peers_report.py: the peer benchmark's rows, per-call cost arithmetic and prose, on hand-made
numbers worked out by hand (the report of a real run: peers_test.py)."""

import types

import pytest

from specdec.bench import peers_report


def _record(i, tokens, calls, seconds, drafted=0, accepted=0):
  return {'index': i, 'tokens': tokens, 'target_calls': calls, 'seconds': seconds, 'drafted': drafted,
          'accepted': accepted, 'drafter_calls': drafted, 'decode': []}


def test_summaries_speedups_and_ratios():
  system = lambda framework, name: types.SimpleNamespace(framework=framework, name=name, settings={'temperature': 0.0})
  records = {
      ('hf', 'baseline'): [_record(0, 10, 10, 1.0), _record(1, 6, 6, 0.5)],
      ('hf', 'assisted:constant'): [_record(0, 10, 4, 0.5, 12, 6), _record(1, 6, 3, 0.25, 9, 3)],
      ('ours', 'baseline'): [_record(0, 10, 10, 0.25), _record(1, 6, 6, 0.25)],
      ('ours', 'speculative'): [_record(0, 10, 4, 0.2, 12, 6), _record(1, 6, 3, 0.2, 9, 3)],
      ('hf', 'assisted:hf_default'): [_record(0, 10, 5, 0.5), _record(1, 6, 3, 0.5)],
      ('ours', 'speculative_adaptive'): [_record(0, 10, 5, 0.125), _record(1, 6, 3, 0.125)],
  }
  rows = [peers_report.summarize_system(recs, system(*key), 0.0) for key, recs in records.items()]
  peers_report.add_speedups(rows)
  hf_base, hf_spec, ours_base, ours_spec, _, _ = rows
  assert hf_base['tokens_per_s'] == pytest.approx(16 / 1.5)
  assert hf_base['target_calls_per_example'] == 8 and 'drafted' not in hf_base
  assert hf_spec['speedup_vs_own_baseline'] == pytest.approx(1.5 / 0.75)
  assert hf_spec['accepted_per_drafted'] == pytest.approx(9 / 21)
  assert hf_spec['tokens_per_target_call'] == pytest.approx(16 / 7)
  assert hf_spec['drafted_per_target_call'] == pytest.approx(3)
  assert ours_spec['speedup_vs_own_baseline'] == pytest.approx(0.5 / 0.4)
  assert ours_base['ms_per_example_median'] == pytest.approx(250)
  ratios = {(r['ours'], r['hf']): r['ratio'] for r in peers_report.ratios(rows)}
  assert ratios == {('baseline', 'baseline'): pytest.approx((16 / 0.5) / (16 / 1.5)),
                    ('speculative', 'assisted:constant'): pytest.approx((16 / 0.4) / (16 / 0.75)),
                    # adaptive against HF's adaptive default
                    ('speculative_adaptive', 'assisted:hf_default'): pytest.approx((16 / 0.25) / (16 / 1.0))}


MS = {'hf': {'target_encoder': 2.0, 'target_step': 4.0, 'target_verify': 6.0, 'drafter_encoder': 1.0,
             'drafter_step': 2.0},
      'ours': {'target_encoder': 0.5, 'target_step': 1.0, 'target_verify': 2.0, 'drafter_encoder': 0.25,
               'drafter_step': 0.25}}


def test_call_cost_ratios_on_hand_made_numbers():
  r = peers_report.call_cost_ratios(MS)
  assert r['hf_over_ours'] == {'target_encoder': 4.0, 'target_step': 4.0, 'target_verify': 3.0,
                               'drafter_encoder': 4.0, 'drafter_step': 8.0}
  assert r['verify_over_step'] == {'hf': 1.5, 'ours': 2.0}
  assert r['c'] == {'hf': 0.5, 'ours': 0.25}
  zero = {f: dict(v, target_step=0.0) for f, v in MS.items()}
  assert peers_report.call_cost_ratios(zero)['c'] == {'hf': None, 'ours': None}


def test_model_time_per_token_on_hand_made_numbers():
  # HF baseline: 2 examples, 20 tokens, 20 target calls, 0.2 s: 10 ms/token measured;
  # model calls: 2 encoders × 2 ms + 20 steps × 4 ms = 84 ms = 4.2 ms/token; the rest 5.8 ms/token.
  base = {'framework': 'hf', 'system': 'baseline', 'temperature': 0.0, 'examples': 2, 'tokens': 20,
          'target_calls': 20, 'seconds': 0.2}
  t = peers_report.model_time_per_token(base, MS['hf'])
  assert t['measured_ms_per_token'] == pytest.approx(10.0)
  assert t['encoders_ms_per_token'] == pytest.approx(0.2) and t['target_ms_per_token'] == pytest.approx(4.0)
  assert t['drafter_ms_per_token'] == 0 and t['model_ms_per_token'] == pytest.approx(4.2)
  assert t['overhead_ms_per_token'] == pytest.approx(5.8) and t['overhead_share'] == pytest.approx(0.58)
  assert t['target_call_tokens'] == 1.0 and t['drafter_calls_per_example'] == 0
  # HF assisted: 8 verify calls × 6 ms, 15 drafter calls per example × 2 examples × 2 ms, encoders 2 × (2 + 1).
  hf_spec = dict(base, system='assisted:constant', target_calls=8, drafted=24, drafted_per_target_call=3.0,
                 drafter_calls_per_example=15.0, seconds=0.25)
  t = peers_report.model_time_per_token(hf_spec, MS['hf'])
  assert t['model_ms_per_token'] == pytest.approx((6 + 48 + 60) / 20)
  assert t['drafter_ms_per_token'] == pytest.approx(3.0) and t['target_call_tokens'] == 4.0
  assert t['overhead_ms_per_token'] == pytest.approx(12.5 - 5.7)
  # Ours speculative: no drafter call count, one drafter call per draft (24 in all).
  ours_spec = dict(hf_spec, framework='ours', system='speculative', seconds=0.05)
  del ours_spec['drafter_calls_per_example']
  t = peers_report.model_time_per_token(ours_spec, MS['ours'])
  assert t['drafter_calls_per_example'] == 12.0
  assert t['model_ms_per_token'] == pytest.approx((2 * 0.75 + 8 * 2.0 + 24 * 0.25) / 20)
  assert t['overhead_ms_per_token'] == pytest.approx(2.5 - 23.5 / 20)


def test_constant_pair_breakdown_and_sentences():
  per_token = [
      {'framework': 'hf', 'system': 'assisted:constant', 'temperature': 0.0, 'model_ms_per_token': 6.0,
       'overhead_ms_per_token': 6.0, 'overhead_share': 0.5},
      {'framework': 'ours', 'system': 'speculative', 'temperature': 0.0, 'model_ms_per_token': 1.5,
       'overhead_ms_per_token': 0.5, 'overhead_share': 0.25},
  ]
  pairs = [{'temperature': 0.0, 'ours': 'baseline', 'hf': 'baseline', 'ratio': 3.0},
           {'temperature': 0.0, 'ours': 'speculative', 'hf': 'assisted:constant', 'ratio': 6.0},
           {'temperature': 1.0, 'ours': 'speculative', 'hf': 'assisted:constant', 'ratio': 5.0}]  # no costs
  breakdown = peers_report.constant_pair_breakdown(per_token, pairs)
  assert len(breakdown) == 1 and breakdown[0]['ratio'] == 6.0 and breakdown[0]['model_ratio'] == 4.0
  costs = {'ms': MS, 'ratios': peers_report.call_cost_ratios(MS), 'per_token': per_token}
  first, second = peers_report.call_cost_sentences(costs, pairs, gamma=3)
  assert first.startswith("HF's 1-token target step costs 4.0× ours (4.00 vs 1.00 ms), its 4-token verify "
                          "call 3.0× and its drafter step 8.0× ours; c (drafter step / target step) is 0.50 in HF "
                          "and 0.25 in ours")
  assert 'a verify call costs 1.50× a 1-token step in HF and 2.00× in ours.' in first
  assert second == ("At t = 0, ours speculative makes 6.00× HF assisted:constant's tokens/s; their model calls "
                    "alone take 6.00 vs 1.50 ms per token (4.00×), and the time outside the calls is 6.00 ms per "
                    "token for HF (50% of its time) vs 0.50 ms for ours (25%).")
  assert len(peers_report.call_cost_sentences(dict(costs, per_token=[]), pairs, gamma=3)) == 1


def test_ours_alpha_is_accepted_in_loop_over_judged():
  system = types.SimpleNamespace(framework='ours', name='speculative', settings={'temperature': 0.0})
  recs = [dict(_record(0, 10, 4, 0.2, 12, 6), judged=10, accepted_in_loop=7),
          dict(_record(1, 6, 3, 0.2, 9, 3), judged=6, accepted_in_loop=2)]
  row = peers_report.summarize_system(recs, system, 0.0)
  assert row['judged'] == 16 and row['alpha_accept'] == pytest.approx(9 / 16)
