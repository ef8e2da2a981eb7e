"""Tests for specdec/bench/profiling.py: call timing, phase timing inside a loop, fixed costs, real-loop steps.

Timings are only checked to be positive and finite (speed is measured by scripts/profile_decode.py, never
asserted here).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import decoding
from specdec import feature_decoding
from specdec import feature_drafter
from specdec import models
from specdec import network
from specdec.bench import profiling


def _tiny(seed, **overrides):
  fields = dict(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0, dtype=jnp.float32)
  fields.update(overrides)
  config = network.T5Config(**fields)
  return network.Transformer(config), network.init_params(config, jax.random.PRNGKey(seed))


@pytest.fixture(scope='module')
def pair():
  return _tiny(0), _tiny(1, num_decoder_layers=1, emb_dim=8, head_dim=4, mlp_dim=16)


def _batch(rows=1, in_len=8, out_len=10):
  enc = np.random.RandomState(0).randint(2, 64, (rows, in_len)).astype(np.int32)
  return {'encoder_input_tokens': enc, 'decoder_input_tokens': np.zeros((rows, out_len), np.int32)}


def test_time_decode_calls_is_positive_and_finite(pair):
  (module, params), _ = pair
  enc = _batch()['encoder_input_tokens']
  for k in (1, 3):
    t = profiling.time_decode_calls(module, params, enc, max_decode_length=8, num_new_tokens=k,
                                    num_calls=3, repeats=2)
    assert isinstance(t, float) and math.isfinite(t) and t > 0


def test_verify_cost_curve_is_one_entry_per_width(pair):
  (module, params), _ = pair
  curve = profiling.verify_cost_curve(module, params, _batch()['encoder_input_tokens'], max_decode_length=8,
                                      max_tokens=3, num_calls=2, repeats=1)
  assert curve['tokens'] == [1, 2, 3] and len(curve['call_s']) == 3
  assert all(math.isfinite(t) and t > 0 for t in curve['call_s'])
  assert curve['ratio'][0] == 1.0
  np.testing.assert_allclose(curve['ratio'], np.asarray(curve['call_s']) / curve['call_s'][0])
  with pytest.raises(ValueError, match='below the decode length'):
    profiling.verify_cost_curve(module, params, _batch()['encoder_input_tokens'], max_decode_length=4,
                                max_tokens=4)


def test_measure_costs_ratios(monkeypatch):
  calls = []
  fake_times = {('target', 1): 0.010, ('target', 5): 0.013, ('drafter', 1): 0.002}

  def fake_time(module, params, enc, max_decode_length, num_new_tokens, **kwargs):
    del params, enc, kwargs
    calls.append((module, num_new_tokens, max_decode_length))
    return fake_times[(module, num_new_tokens)]

  monkeypatch.setattr(profiling, 'time_decode_calls', fake_time)
  costs = profiling.measure_costs('target', 'tp', 'drafter', 'dp', np.zeros((1, 8), np.int32), 12, gamma=4)
  assert sorted(calls) == sorted([('target', 1, 12), ('target', 5, 12), ('drafter', 1, 12)])
  assert costs['target_call_s'] == 0.010
  assert costs['verify_call_s'] == 0.013
  assert costs['draft_call_s'] == 0.002
  assert costs['c'] == pytest.approx(0.2)
  assert costs['verify_cost_ratio'] == pytest.approx(1.3)


@pytest.mark.parametrize('temperature, confidence', [(1.0, 0.3)])
def test_in_loop_costs_are_positive_and_consistent(pair, temperature, confidence):
  (tm, tp), (dm, dp) = pair
  batch = _batch()
  decoded = np.asarray([5, 9, 12, 7, 1, 0, 0, 0, 0, 0], np.int32)
  params = {'temperature': temperature, 'topk': 0, 'topp': 0.0, 'gamma': 3, 'return_stats': True}
  if confidence:
    params['draft_confidence'] = confidence
  c = profiling.in_loop_costs(tm, tp, dm, dp, batch, decoded, 3, params, iters=4, repeats=2,
                              parts=profiling.ALL_PARTS)
  for key in ('draft_s', 'verify_s', 'accept_s', 'commit_s', 'round_s', 'baseline_round_s',
              'baseline_fixed_s', 'speculative_fixed_s'):
    assert math.isfinite(c[key]) and c[key] > 0, key
  assert c['c_in_loop'] == pytest.approx(c['draft_s'] / 3 / c['baseline_round_s'])
  assert c['round_over_baseline'] == pytest.approx(c['round_s'] / c['baseline_round_s'])
  assert c['round_fixed_in_loop'] == pytest.approx((c['round_s'] - c['draft_s']) / c['baseline_round_s'])


def test_in_loop_costs_subset_of_parts(pair):
  (tm, tp), (dm, dp) = pair
  params = {'temperature': 0.0, 'topk': 0, 'topp': 0.0, 'gamma': 2}
  c = profiling.in_loop_costs(tm, tp, dm, dp, _batch(), np.asarray([5, 9, 1, 0, 0, 0, 0, 0, 0, 0], np.int32),
                              2, params, iters=2, repeats=1, parts=('draft', 'round', 'baseline_round'))
  assert c['verify_s'] is None and c['accept_s'] is None and c['commit_s'] is None
  assert c['round_s'] > 0 and c['c_in_loop'] > 0


def test_unknown_part_is_refused(pair):
  (tm, tp), (dm, dp) = pair
  with pytest.raises(ValueError, match='parts'):
    profiling.time_phases(tm, tp, dm, dp, _batch()['encoder_input_tokens'], np.asarray([5, 1]), 10, 2,
                          parts=('draft', 'nonsense'))


@pytest.mark.parametrize('which', ['head', 't5'])
def test_drafter_call_kernels_names_the_products_and_their_weights(pair, which):
  (tm, tp), (dm, dp) = pair
  if which == 'head':
    dm, dp = _tiny_head(tm)
  vocab_ids = np.arange(0, 64, 2)
  report = profiling.drafter_call_kernels(tm, tp, dm, dp, _batch()['encoder_input_tokens'], 10, num_calls=4,
                                          draft_vocab_ids=vocab_ids, top=100)
  assert report['busy_us'] > 0 and 0 < report['dot_share'] <= 1
  assert report['kernels'] <= 100 and sum(k['us'] for k in report['top']) == pytest.approx(report['busy_us'])
  dots = [k for k in report['top'] if k['dot']]
  assert dots and all(k['largest_operand'] for k in dots)
  # The trimmed projection [E, K] (a T5 drafter's own; a narrower head's kernel folded into the target's,
  # [W, K]) is one of the arrays the products read.
  width = dm.config.width if which == 'head' else dm.config.emb_dim
  assert f'f32[{width},{len(vocab_ids)}]' in {k['largest_operand'] for k in dots}


def test_widened_baseline_gives_the_same_outputs(pair):
  (module, params), _ = pair
  batch = _batch(rows=2)
  base = models.SpeculativeEncoderDecoderModel(module, None, decode_fn=decoding.temperature_sample)
  for width in (2, 3):
    wide = models.SpeculativeEncoderDecoderModel(module, None, decode_fn=profiling.widened_decode_fn(width))
    for temperature in (0.0, 1.0):
      settings = {'temperature': temperature, 'topk': 0, 'topp': 0.0}
      want = base.compile_predict(settings)({'target': params}, batch, jax.random.PRNGKey(0))[0]
      got = wide.compile_predict(settings)({'target': params}, batch, jax.random.PRNGKey(0))[0]
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  with pytest.raises(ValueError, match='width'):
    profiling.widened_decode_fn(0)


def test_time_chained_calls_is_positive_and_finite(pair):
  (target, target_params), (drafter, drafter_params) = pair
  enc = _batch()['encoder_input_tokens']
  for steps in (0, 2):
    t = profiling.time_chained_calls(target, target_params, drafter, drafter_params, enc,
                                     max_decode_length=10, num_new_tokens=3, draft_steps=steps,
                                     num_calls=3, repeats=2)
    assert isinstance(t, float) and math.isfinite(t) and t > 0


def test_time_side_by_side_interleaves_and_keeps_the_fastest_repeat():
  calls = []

  def decoder(name):
    def fn(batch, rng):
      calls.append((name, batch))
      return jnp.asarray(batch) * 2
    return fn

  out = profiling.time_side_by_side({'a': decoder('a'), 'b': decoder('b')}, [1, 2], repeats=2)
  # Per batch: one untimed call each, then the repeats alternate a, b.
  assert calls == [('a', 1), ('b', 1), ('a', 1), ('b', 1), ('a', 1), ('b', 1),
                   ('a', 2), ('b', 2), ('a', 2), ('b', 2), ('a', 2), ('b', 2)]
  assert [int(x) for x in out['a']['outputs']] == [2, 4]
  assert len(out['b']['seconds']) == 2 and all(s > 0 for s in out['b']['seconds'])


def _tiny_head(target_module):
  """A random 8-wide feature head for `target_module`: (module, params)."""
  config = feature_drafter.FeatureHeadConfig(feature_dim=target_module.config.emb_dim,
                                             vocab_size=target_module.config.vocab_size,
                                             width=8, num_heads=2, head_dim=4, mlp_dim=16)
  return feature_drafter.FeatureHead(config), feature_drafter.init_params(config, jax.random.PRNGKey(2))


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_in_loop_costs_of_a_feature_head(pair, temperature):
  """The phases of a feature-drafting round time too (the head's state as the loop leaves it)."""
  (tm, tp), _ = pair
  head, hp = _tiny_head(tm)
  decoded = np.asarray([5, 9, 12, 7, 1, 0, 0, 0, 0, 0], np.int32)
  params = {'temperature': temperature, 'topk': 0, 'topp': 0.0, 'gamma': 2, 'return_stats': True}
  c = profiling.in_loop_costs(tm, tp, head, hp, _batch(), decoded, 2, params, iters=4, repeats=2,
                              parts=profiling.ALL_PARTS)
  for key in ('draft_s', 'verify_s', 'accept_s', 'commit_s', 'round_s', 'baseline_round_s',
              'baseline_fixed_s', 'speculative_fixed_s'):
    assert math.isfinite(c[key]) and c[key] > 0, key


def test_chained_and_isolated_head_calls(pair):
  (tm, tp), _ = pair
  head, hp = _tiny_head(tm)
  enc = _batch()['encoder_input_tokens']
  for draft_steps in (0, 2):
    t = profiling.time_chained_calls(tm, tp, head, hp, enc, 10, 3, draft_steps, num_calls=4, repeats=1)
    assert math.isfinite(t) and t > 0
  costs = profiling.measure_costs(tm, tp, head, hp, enc, 10, 2)
  assert costs['draft_call_s'] > 0 and costs['c'] > 0


def test_prefilled_feature_pair_is_the_loops_state(pair):
  """The prefilled head and kept features give the first draft the loop itself would give at that point."""
  (tm, tp), _ = pair
  head, hp = _tiny_head(tm)
  enc = jnp.asarray(_batch()['encoder_input_tokens'])
  prefix = jnp.asarray([[0, 5, 9, 12]], jnp.int32)
  _, _, head_cache, draft_fn, kept, start = profiling._prefilled_feature_pair(  # pylint: disable=protected-access
      tm, tp, head, hp, enc, 10, prefix, 2)
  # Teacher-forced head over the whole prefix: its prediction at the last position (i = 3).
  _, target_fn, head_cache0, draft_fn0 = feature_decoding.decoder_fns(tm, tp, head, hp, enc, 10)[:4]
  target_cache0 = feature_decoding.decoder_fns(tm, tp, head, hp, enc, 10)[0]
  _, feats, _ = target_fn(decoding.DecodingState(cur_index=jnp.zeros((1,), jnp.int32), sequences=prefix,
                                                 cur_token=prefix, cache=target_cache0))
  want, _, _ = draft_fn0(decoding.DecodingState(cur_index=jnp.zeros((1,), jnp.int32), sequences=prefix,
                                                cur_token=prefix, cache=head_cache0),
                         feature_drafter.shift_features_right(feats))
  # The catch-up window from feature_start + 1 = 3: entries 3..5 reading the kept features; the entry at
  # cur_index 3 (offset 0) gives the first draft.
  window = jnp.pad(prefix, ((0, 0), (0, 4)))[:, 3:6]
  got, _, _ = draft_fn(decoding.DecodingState(cur_index=start + 1, sequences=prefix, cur_token=window,
                                              cache=head_cache), kept)
  assert int(start[0]) == 2
  # The same entries in another order of float32 sums (one k-token call vs two): a few ulps of the logits.
  np.testing.assert_allclose(got[:, 0], want[:, 3], rtol=0,
                             atol=64 * np.finfo(np.float32).eps * float(np.abs(want).max()))


def test_trimmed_calls_read_the_drafters_vocabulary(pair):
  """With draft vocabulary ids, a timed call's argmax is the best of those tokens, as the loop's would be."""
  (module, params), _ = pair
  ids = np.arange(0, 64, 3)
  enc = jnp.asarray(_batch()['encoder_input_tokens'])
  cache = profiling._fresh_cache(module, params, enc, 8)  # pylint: disable=protected-access
  tokens = jnp.asarray([[7, 11]], jnp.int32)
  full, _ = module.apply({'params': params, 'cache': cache}, tokens, jnp.zeros((1,), jnp.int32),
                         method=module.decode_step, mutable=['cache'])
  _, token = profiling._call(module, params, cache, tokens, 0,  # pylint: disable=protected-access
                             *profiling._projection(module, params, ids))  # pylint: disable=protected-access
  token = int(token[0])
  last = np.asarray(full[0, -1])
  assert token in ids
  # The sliced projection sums the same products in possibly another order: a few ulps of the logits.
  assert last[token] >= last[ids].max() - 64 * np.finfo(np.float32).eps * np.abs(last).max()
  _, untrimmed = profiling._call(module, params, cache, tokens, 0)  # pylint: disable=protected-access
  assert int(untrimmed[0]) == int(np.argmax(last))


@pytest.mark.parametrize('head', [False, True])
def test_costs_with_a_draft_vocabulary(pair, head):
  (tm, tp), (dm, dp) = pair
  if head:
    dm, dp = _tiny_head(tm)
  ids = np.arange(0, 64, 2)
  enc = _batch()['encoder_input_tokens']
  costs = profiling.measure_costs(tm, tp, dm, dp, enc, 10, 2, draft_vocab_ids=ids)
  assert costs['draft_call_s'] > 0 and math.isfinite(costs['c'])
  t = profiling.time_chained_calls(tm, tp, dm, dp, enc, 10, 3, 2, num_calls=4, repeats=1, draft_vocab_ids=ids)
  assert math.isfinite(t) and t > 0
  params = {'temperature': 0.0, 'topk': 0, 'topp': 0.0, 'gamma': 2, 'return_stats': True}
  c = profiling.in_loop_costs(tm, tp, dm, dp, _batch(), np.asarray([5, 9, 12, 7, 1, 0, 0, 0, 0, 0], np.int32),
                              2, params, iters=4, repeats=2, draft_vocab_ids=ids)
  assert c['draft_s'] > 0 and c['c_in_loop'] > 0


def test_prefilled_feature_pair_speaks_the_draft_vocabulary(pair):
  (tm, tp), _ = pair
  head, hp = _tiny_head(tm)
  ids = np.arange(1, 64, 4)
  prefix = jnp.asarray([[0, 5, 9, 12]], jnp.int32)
  _, _, head_cache, draft_fn, kept, start = profiling._prefilled_feature_pair(  # pylint: disable=protected-access
      tm, tp, head, hp, jnp.asarray(_batch()['encoder_input_tokens']), 10, prefix, 2, draft_vocab_ids=ids)
  window = jnp.pad(prefix, ((0, 0), (0, 4)))[:, 3:6]
  logits, _, _ = draft_fn(decoding.DecodingState(cur_index=start + 1, sequences=prefix, cur_token=window,
                                                 cache=head_cache), kept)
  outside = np.setdiff1d(np.arange(64), ids)
  assert np.all(np.isneginf(np.asarray(logits)[..., outside]))
  assert np.all(np.isfinite(np.asarray(logits)[..., ids]))


def test_budgeted_predict_stops_each_decode_at_its_budget(pair):
  (target, target_params), (drafter, drafter_params) = pair
  batch = _batch(rows=2)
  base = models.SpeculativeEncoderDecoderModel(target, None, decode_fn=decoding.temperature_sample)
  spec = models.SpeculativeEncoderDecoderModel(target, drafter, decode_fn=decoding.speculative_sample)
  greedy = {'temperature': 0.0, 'topk': 0, 'topp': 0.0}
  for model, params, settings in ((base, {'target': target_params}, greedy),
                                  (spec, {'target': target_params, 'drafter': drafter_params},
                                   dict(greedy, gamma=3, return_stats=True))):
    full = np.asarray(model.compile_predict(settings)(params, batch, jax.random.PRNGKey(0))[0])
    assert full[:, 7:].any()  # the whole decode runs past every budget, so each budget cuts it
    predict = profiling.budgeted_predict(model, settings)
    for budget in (1, 4, 7):
      out = np.asarray(predict(params, batch, jax.random.PRNGKey(0), jnp.asarray(budget, jnp.int32))[0])
      # The budget's first tokens are the whole decode's (greedy), and nothing is written past them.
      np.testing.assert_array_equal(out[:, :budget], full[:, :budget])
      assert not out[:, budget:].any()


def test_real_step_cost_divides_the_seconds_between_budgets_by_the_steps(monkeypatch):
  steps = {3: 2, 9: 5}
  predict = lambda params, batch, rng, budget: int(budget)
  monkeypatch.setattr(profiling, 'fastest_interleaved', lambda calls, repeats: {'3': 0.5, '9': 1.1})
  got = profiling.real_step_cost(predict, None, None, (3, 9), steps_of=lambda out: steps[out])
  assert got['steps'] == [2, 5] and got['seconds'] == [0.5, 1.1]
  assert got['per_step_s'] == pytest.approx(0.6 / 3)
  ended = profiling.real_step_cost(predict, None, None, (3, 9), steps_of=lambda out: 2)
  assert ended['per_step_s'] is None  # the example ended before the lower budget
  for bad in ((0, 4), (5, 5), (6, 2)):
    with pytest.raises(ValueError, match='budgets must be two token counts'):
      profiling.real_step_cost(predict, None, None, bad, steps_of=lambda out: 0)
