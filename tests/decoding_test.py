"""Tests for specdec/decoding.py on toy models with exact distributions.

Whole-network tests (random tiny T5 pairs) are in models_test.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import batch_shrink
from specdec import decoding
from specdec import feature_decoding
from specdec import sampling
from tests import toy

EOS = 1


def _baseline(model, inputs, **kw):
  fn = functools.partial(decoding.temperature_sample,
                         tokens_to_logits=model.tokens_to_logits, eos_id=EOS,
                         **kw)
  return jax.jit(fn)(inputs, model.init_cache(inputs.shape[0]))


def _speculative(target, drafter, inputs, gamma, **kw):
  batch = inputs.shape[0]
  fn = functools.partial(
      decoding.speculative_sample, tokens_to_logits=target.tokens_to_logits,
      draft_tokens_to_logits=drafter.tokens_to_logits, eos_id=EOS, gamma=gamma,
      **kw)
  return jax.jit(fn)(inputs, target.init_cache(batch), draft_cache=drafter.init_cache(batch))


def _prompted_inputs(batch, length, seed=0, vocab=9):
  """Rows with prompts of different lengths (0..3 tokens), no EOS inside."""
  rng = np.random.RandomState(seed)
  inputs = np.zeros((batch, length), np.int32)
  for b in range(batch):
    n = b % 4
    inputs[b, 1:1 + n] = rng.randint(2, vocab, size=n)
  return jnp.asarray(inputs)


class TestBaselineSemantics:
  """temperature_sample follows T5X's documented behaviour."""

  def test_single_and_multi_token_contracts_agree(self):
    model = toy.ToyModel(0, vocab=9, cache_len=10)
    inputs = _prompted_inputs(6, 10)
    a = _baseline(model, inputs, temperature=0.0)
    fn = functools.partial(decoding.temperature_sample,
                           tokens_to_logits=model.single_token_fn, eos_id=EOS,
                           temperature=0.0)
    b = jax.jit(fn)(inputs, model.init_cache(6))
    np.testing.assert_array_equal(a[0], b[0])

  def test_greedy_matches_reference_loop(self):
    model = toy.ToyModel(1, vocab=9, cache_len=12, eos_bias=1.0)
    inputs = _prompted_inputs(8, 12, seed=1)
    decodes, log_prob = _baseline(model, inputs, temperature=0.0)
    for b in range(8):
      seq = [0]
      expected = []
      ended = False
      for pos in range(1, 13):
        forced = int(inputs[b, pos]) if pos < 12 else 0
        if ended:
          tok = 0
        elif forced:
          tok = forced
        else:
          tok = int(np.argmax(model.prefix_logits(seq)))
          ended = tok == EOS
        seq.append(tok)
        expected.append(tok)
      np.testing.assert_array_equal(decodes[b, 0], expected[:12])
    np.testing.assert_array_equal(log_prob, 0.0)

  def test_max_decode_steps_limits_new_tokens(self):
    model = toy.ToyModel(2, vocab=9, cache_len=10)
    inputs = _prompted_inputs(4, 10)
    decodes, _ = _baseline(model, inputs, temperature=0.0, max_decode_steps=3)
    prompt_len = np.sum(np.asarray(inputs) != 0, axis=1)
    for b in range(4):
      nonzero = np.flatnonzero(np.asarray(decodes[b, 0]))
      assert nonzero.max() < prompt_len[b] + 3

  def test_num_decodes_shape_and_order(self):
    model = toy.ToyModel(3, vocab=9, cache_len=8)
    inputs = _prompted_inputs(3, 8)
    decodes, log_prob = _baseline(model, inputs, temperature=1.0, topk=0,
                                  num_decodes=5,
                                  decode_rng=jax.random.PRNGKey(7))
    assert decodes.shape == (3, 5, 8) and log_prob.shape == (3, 5)
    assert np.all(np.diff(np.asarray(log_prob), axis=1) >= 0)
    # Every decode keeps its row's prompt.
    for b in range(3):
      n = b % 4
      np.testing.assert_array_equal(
          decodes[b, :, :n], np.broadcast_to(inputs[b, 1:1 + n], (5, n)))


class TestGreedyIdentity:
  """Speculative greedy decoding equals the baseline token for token."""

  @pytest.mark.parametrize('gamma', [1, 2, 3, 5, 8])
  def test_unrelated_drafter(self, gamma):
    target = toy.ToyModel(10, vocab=9, cache_len=14, eos_bias=0.5)
    drafter = toy.ToyModel(11, vocab=9, cache_len=14)
    inputs = _prompted_inputs(8, 14, seed=gamma)
    base, base_lp = _baseline(target, inputs, temperature=0.0)
    spec, spec_lp, stats = _speculative(target, drafter, inputs, gamma,
                                        temperature=0.0, return_stats=True)
    np.testing.assert_array_equal(spec, base)
    np.testing.assert_array_equal(spec_lp, base_lp)
    assert np.all(np.asarray(stats['target_calls']) >= 1)

  @pytest.mark.parametrize('gamma', [1, 4, 7])
  def test_drafter_equals_target_accepts_everything(self, gamma):
    target = toy.ToyModel(12, vocab=9, cache_len=16)
    inputs = jnp.zeros((4, 16), jnp.int32)
    base, _ = _baseline(target, inputs, temperature=0.0)
    spec, _, stats = _speculative(target, target, inputs, gamma,
                                  temperature=0.0, return_stats=True)
    np.testing.assert_array_equal(spec, base)
    s = jax.tree_util.tree_map(np.asarray, stats)
    np.testing.assert_array_equal(s['accepted'], s['judged'])
    np.testing.assert_array_equal(s['accepted'], s['drafted'])
    # Rows that did not stop early take ceil(L / (γ+1)) target calls.
    no_eos = ~np.any(np.asarray(base) == EOS, axis=-1)
    np.testing.assert_array_equal(s['target_calls'][no_eos],
                                  -(-16 // (gamma + 1)))

  def test_rows_end_at_different_times(self):
    target = toy.ToyModel(13, vocab=9, cache_len=12, eos_bias=1.5)
    drafter = toy.ToyModel(14, vocab=9, cache_len=12, eos_bias=1.0)
    inputs = _prompted_inputs(16, 12, seed=3)
    steps = jnp.asarray(np.arange(16) % 7 + 1)
    for kw in (dict(), dict(max_decode_steps=4), dict(max_decode_steps=steps)):
      base, _ = _baseline(target, inputs, temperature=0.0, **kw)
      spec, _, _ = _speculative(target, drafter, inputs, 3, temperature=0.0, **kw)
      np.testing.assert_array_equal(spec, base)
    lengths = np.sum(np.asarray(base) != 0, axis=-1)
    assert len(set(lengths.ravel().tolist())) > 2  # Really different ends.

  def test_prompt_longer_than_gamma(self):
    target = toy.ToyModel(15, vocab=9, cache_len=12)
    drafter = toy.ToyModel(16, vocab=9, cache_len=12)
    inputs = np.zeros((3, 12), np.int32)
    inputs[0, 1:8] = [3, 4, 5, 6, 7, 8, 2]
    inputs[1, 1:3] = [5, 5]
    base, _ = _baseline(target, jnp.asarray(inputs), temperature=0.0)
    spec, _, stats = _speculative(target, drafter, jnp.asarray(inputs), 2,
                                  temperature=0.0, return_stats=True)
    np.testing.assert_array_equal(spec, base)
    np.testing.assert_array_equal(spec[0, 0, :7], inputs[0, 1:8])
    # Forced tokens are neither drafted nor counted.
    s = jax.tree_util.tree_map(np.asarray, stats)
    assert s['emitted'][0, 0] == np.sum(np.asarray(spec[0, 0]) != 0) - 7

  def test_num_decodes(self):
    target = toy.ToyModel(17, vocab=9, cache_len=10)
    drafter = toy.ToyModel(18, vocab=9, cache_len=10)
    inputs = _prompted_inputs(2, 10)
    base, _ = _baseline(target, inputs, temperature=0.0, num_decodes=3)
    spec, lp, _ = _speculative(target, drafter, inputs, 3, temperature=0.0,
                            num_decodes=3)
    assert spec.shape == (2, 3, 10) and lp.shape == (2, 3)
    np.testing.assert_array_equal(spec, base)

  def test_topk1_is_greedy(self):
    # T5X's default topk=1 with temperature 1 is argmax as well.
    target = toy.ToyModel(19, vocab=9, cache_len=10)
    drafter = toy.ToyModel(20, vocab=9, cache_len=10)
    inputs = _prompted_inputs(4, 10)
    base, _ = _baseline(target, inputs, temperature=0.0)
    spec, _, _ = _speculative(target, drafter, inputs, 4, temperature=1.0, topk=1,
                           decode_rng=jax.random.PRNGKey(3))
    np.testing.assert_array_equal(spec, base)


class TestStatistics:

  def test_invariants(self):
    target = toy.ToyModel(21, vocab=9, cache_len=16, eos_bias=-1.0)
    drafter = toy.ToyModel(22, vocab=9, cache_len=16, eos_bias=-1.0)
    drafter.table = 0.6 * target.table + 0.4 * drafter.table
    inputs = jnp.zeros((32, 16), jnp.int32)
    gamma = 4
    decodes, _, stats = _speculative(target, drafter, inputs, gamma,
                                     temperature=1.0, topk=0,
                                     return_stats=True,
                                     decode_rng=jax.random.PRNGKey(1))
    s = jax.tree_util.tree_map(np.asarray, stats)
    assert np.all(s['accepted'] <= s['judged'])
    assert np.all(s['judged'] <= s['drafted'])
    assert np.all(s['drafted'] <= gamma * s['target_calls'])
    np.testing.assert_array_equal(s['accepted_at'].sum(-1), s['accepted'])
    # Acceptance per position is non-increasing (leading counts).
    assert np.all(np.diff(s['accepted_at'], axis=-1) <= 0)
    np.testing.assert_array_equal(s['overlap_count'], s['judged'])
    assert np.all(s['overlap_sum'] <= s['overlap_count'] + 1e-4)
    # Every emitted token is a kept draft or the one extra token per call.
    # (Toy models may sample token 0, so lengths come from the EOS position.)
    d = np.asarray(decodes)
    lengths = np.where(np.any(d == EOS, -1), np.argmax(d == EOS, -1) + 1,
                       d.shape[-1])
    np.testing.assert_array_equal(s['emitted'], lengths)
    assert np.all(s['emitted'] <= s['accepted'] + s['target_calls'])
    assert np.all(s['emitted'] >= s['target_calls'])
    alpha_emp = s['accepted'].sum() / s['judged'].sum()
    alpha_overlap = s['overlap_sum'].sum() / s['overlap_count'].sum()
    assert 0.2 < alpha_emp < 0.95
    assert abs(alpha_emp - alpha_overlap) < 0.1


def _sample_many(fn, target, rows, length, shrink_batch=False, **kw):
  inputs = jnp.zeros((rows, length), jnp.int32)
  return np.asarray(fn(inputs, shrink_batch=shrink_batch, **kw)[0][:, 0])


class _TrimmedDrafter:
  """A toy drafter whose logits cover `ids` only (-inf at every other token): a trimmed draft vocabulary."""

  def __init__(self, drafter, ids, vocab):
    self.drafter, self.ids, self.vocab = drafter, jnp.asarray(ids, jnp.int32), vocab

  def init_cache(self, batch):
    return self.drafter.init_cache(batch)

  def tokens_to_logits(self, state):
    logits_bkv, cache = self.drafter.tokens_to_logits(state)
    return feature_decoding.widen_logits(logits_bkv[..., self.ids], self.ids, self.vocab), cache


class TestSequenceDistribution:
  """Whole decodes: the empirical law of sequences equals the target's.

  In one batch of ROWS rows with the plain loop (`shrink_batch=False`: a shrinking loop of 20,000 rows
  compiles four stages); tests/batch_shrink_test.py checks the shrinking loop's law.
  """

  LENGTH, VOCAB, ROWS = 4, 5, 20_000

  def _models(self):
    target = toy.ToyModel(30, vocab=self.VOCAB, cache_len=self.LENGTH,
                          scale=1.5, eos_bias=0.5)
    drafter = toy.ToyModel(31, vocab=self.VOCAB, cache_len=self.LENGTH,
                           scale=1.5)
    return target, drafter

  @pytest.mark.parametrize('gamma, temperature, topk, topp', [
      (1, 1.0, 0, 0.0), (3, 1.0, 0, 0.0), (2, 0.7, 3, 0.0), (4, 1.3, 0, 0.8),
  ])
  def test_speculative_matches_target(self, gamma, temperature, topk, topp):
    target, drafter = self._models()
    exact = toy.exact_distribution(target, self.LENGTH, EOS, temperature, topk,
                                   topp)
    samples = _sample_many(
        lambda x, **kw: _speculative(target, drafter, x, gamma, **kw), target,
        self.ROWS, self.LENGTH, temperature=temperature, topk=topk, topp=topp,
        decode_rng=jax.random.PRNGKey(gamma))
    assert toy.chi_square_pvalue(samples, exact) > 1e-3

  @pytest.mark.parametrize('gamma, temperature, topk, topp', [(3, 0.7, 3, 0.0), (2, 1.3, 0, 0.9)])
  def test_a_trimmed_draft_vocabulary_keeps_the_targets_law(self, gamma, temperature, topk, topp):
    """A drafter over K of the V ids (q = 0 elsewhere, as `models` builds a trimmed drafter's logits with
    `feature_decoding.widen_logits`), where K misses part of the target's top-k support: the residual
    distribution must supply the ids the drafter never proposes."""
    target, drafter = self._models()
    ids = np.asarray([0, 1, 3])  # EOS (1) and two others of the 5
    top3 = set(np.argsort(target.prefix_logits([0]))[-3:].tolist())
    assert top3 - set(ids.tolist()), 'the test needs K to miss part of the first position\'s top 3'
    trimmed = _TrimmedDrafter(drafter, ids, self.VOCAB)
    exact = toy.exact_distribution(target, self.LENGTH, EOS, temperature, topk, topp)
    samples = _sample_many(
        lambda x, **kw: _speculative(target, trimmed, x, gamma, **kw), target,
        self.ROWS, self.LENGTH, temperature=temperature, topk=topk, topp=topp,
        decode_rng=jax.random.PRNGKey(10 + gamma))
    assert set(np.unique(samples).tolist()) - set(ids.tolist()), 'ids outside K were never sampled'
    assert toy.chi_square_pvalue(samples, exact) > 1e-3

  def test_baseline_matches_target(self):
    target, _ = self._models()
    exact = toy.exact_distribution(target, self.LENGTH, EOS)
    samples = _sample_many(lambda x, **kw: _baseline(target, x, **kw), target,
                           self.ROWS, self.LENGTH, temperature=1.0, topk=0,
                           decode_rng=jax.random.PRNGKey(5))
    assert toy.chi_square_pvalue(samples, exact) > 1e-3

  def test_wrong_acceptance_rule_fails(self, monkeypatch):
    # The test has power: accepting with min(1, q/p) instead of min(1, p/q)
    # must be caught at this sample size.
    target, drafter = self._models()
    exact = toy.exact_distribution(target, self.LENGTH, EOS)
    right = sampling.acceptance_probability
    monkeypatch.setattr(sampling, 'acceptance_probability',
                        lambda lp, lq, l=1.0: right(lq, lp, l))
    samples = _sample_many(
        lambda x, **kw: _speculative(target, drafter, x, 3, **kw), target,
        self.ROWS, self.LENGTH, temperature=1.0, topk=0,
        decode_rng=jax.random.PRNGKey(3))
    assert toy.chi_square_pvalue(samples, exact) < 1e-6

  def test_lenience_changes_the_distribution(self):
    # l < 1 is documented as approximate: it must not pass as exact.
    target, drafter = self._models()
    exact = toy.exact_distribution(target, self.LENGTH, EOS)
    samples = _sample_many(
        lambda x, **kw: _speculative(target, drafter, x, 3, **kw), target,
        self.ROWS, self.LENGTH, temperature=1.0, topk=0, lenience=0.3,
        decode_rng=jax.random.PRNGKey(4))
    assert toy.chi_square_pvalue(samples, exact) < 1e-6


class TestBadInputs:

  def _call(self, target=None, drafter=None, inputs=None, **kw):
    target = target or toy.ToyModel(40, vocab=9, cache_len=8)
    drafter = drafter or toy.ToyModel(41, vocab=9, cache_len=8)
    inputs = jnp.zeros((2, 8), jnp.int32) if inputs is None else inputs
    kw.setdefault('gamma', 3)
    return decoding.speculative_sample(
        inputs, target.init_cache(2), target.tokens_to_logits,
        drafter.init_cache(2), drafter.tokens_to_logits, eos_id=EOS, **kw)

  @pytest.mark.parametrize('kwargs, name', [
      (dict(gamma=0), 'gamma'), (dict(gamma=-2), 'gamma'),
      (dict(gamma=2.5), 'gamma'), (dict(gamma=True), 'gamma'),
      (dict(temperature=-1.0), 'temperature'),
      (dict(topk=5, topp=0.9), 'topk'),
      (dict(topp=2.0), 'topp'),
      (dict(lenience=0.0), 'lenience'), (dict(lenience=2.0), 'lenience'),
      (dict(max_decode_steps=9), 'max_decode_steps'),
      (dict(num_decodes=0), 'num_decodes'),
  ])
  def test_bad_arguments(self, kwargs, name):
    with pytest.raises(ValueError, match=name):
      self._call(**kwargs)

  def test_vocab_mismatch(self):
    with pytest.raises(ValueError, match='Vocabulary mismatch'):
      self._call(drafter=toy.ToyModel(42, vocab=11, cache_len=8))

  def test_single_token_drafter_is_rejected(self):
    drafter = toy.ToyModel(43, vocab=9, cache_len=8)
    drafter.tokens_to_logits = drafter.single_token_fn
    with pytest.raises(ValueError, match='draft_tokens_to_logits'):
      self._call(drafter=drafter)

  def test_bad_inputs_shape_and_dtype(self):
    with pytest.raises(ValueError, match='inputs'):
      self._call(inputs=jnp.zeros((8,), jnp.int32))
    with pytest.raises(ValueError, match='inputs'):
      self._call(inputs=jnp.zeros((2, 8), jnp.float32))

  @pytest.mark.parametrize('shape', [(2, 0), (0, 8)])
  def test_empty_inputs(self, shape):
    with pytest.raises(ValueError, match=rf'inputs is empty \(shape \({shape[0]}, {shape[1]}\)\)'):
      self._call(inputs=jnp.zeros(shape, jnp.int32))
    model = toy.ToyModel(44, vocab=9, cache_len=8)
    with pytest.raises(ValueError, match='inputs is empty'):
      decoding.temperature_sample(jnp.zeros(shape, jnp.int32), model.init_cache(2),
                                  model.tokens_to_logits, EOS)

  @pytest.mark.parametrize('bad_id', [9, -1])
  def test_prompt_ids_outside_the_vocabulary(self, bad_id):
    inputs = jnp.zeros((2, 8), jnp.int32).at[1, 3].set(bad_id)
    with pytest.raises(ValueError, match=r"inputs holds ids outside \[0, 9\) \(the target's"):
      self._call(inputs=inputs)

  def test_baseline_validates_too(self):
    model = toy.ToyModel(44, vocab=9, cache_len=8)
    with pytest.raises(ValueError, match='topk'):
      decoding.temperature_sample(jnp.zeros((2, 8), jnp.int32),
                                  model.init_cache(2), model.tokens_to_logits,
                                  EOS, topk=3, topp=0.5)


class TestValidateDecodeArgs:
  """`validate_decode_args` alone: the checks both loops run before tracing."""

  INPUTS = jnp.zeros((2, 8), jnp.int32)

  def test_good_settings_pass(self):
    decoding.validate_decode_args(self.INPUTS, EOS, 1, 0.0, 0, 0.9, 8, 0.5, gamma=1,
                                  draft_confidence=0.5)
    decoding.validate_decode_args(self.INPUTS, EOS, temperature=1.0, topk=40)

  @pytest.mark.parametrize('kwargs, message', [
      (dict(gamma=0), 'gamma must be an int >= 1, got 0'),
      (dict(gamma=2.0), 'gamma must be an int >= 1, got 2.0'),
      (dict(temperature=-0.5), 'temperature must be >= 0'),
      (dict(topk=5, topp=0.9), 'Use top-k or top-p, not both'),
      (dict(draft_confidence=1.0), r'draft_confidence must be a float in \[0, 1\)')])
  def test_settings_alone_are_checked_by_the_same_helper(self, kwargs, message):
    with pytest.raises(ValueError, match=message):
      decoding.validate_settings(**kwargs)

  def test_gamma_is_checked_only_when_given(self):
    with pytest.raises(ValueError, match='gamma must be an int >= 1, got 0'):
      decoding.validate_decode_args(self.INPUTS, EOS, gamma=0)
    decoding.validate_decode_args(self.INPUTS, EOS, gamma=None)

  @pytest.mark.parametrize('kwargs, message', [
      (dict(gamma=2.5), 'gamma must be an int'),
      (dict(draft_confidence=1.0), r'draft_confidence must be a float in \[0, 1\)'),
      (dict(eos_id=-1), 'eos_id must be an int >= 0'),
      (dict(num_decodes=0), 'num_decodes must be an int >= 1'),
      (dict(temperature=-1.0), 'temperature must be >= 0'),
      (dict(topk=5, topp=0.9), 'Use top-k or top-p, not both'),
      (dict(lenience=0.0), 'lenience must be a float in'),
      (dict(max_decode_steps=9), r'max_decode_steps must be in \[0, 8\]'),
      (dict(inputs=jnp.zeros((2, 8), jnp.float32)), 'inputs must hold integer token ids'),
  ])
  def test_each_bad_setting_is_named(self, kwargs, message):
    kwargs = dict(dict(inputs=self.INPUTS, eos_id=EOS), **kwargs)
    with pytest.raises(ValueError, match=message):
      decoding.validate_decode_args(**kwargs)

  def test_traced_values_are_left_alone(self):
    jax.jit(lambda t, n: decoding.validate_decode_args(self.INPUTS, EOS, temperature=t,
                                                       max_decode_steps=n))(-1.0, 99)


class TestDecodeKinds:

  def test_the_loops_are_declared(self):
    assert decoding.kind_of(decoding.temperature_sample) == decoding.AUTOREGRESSIVE
    assert decoding.kind_of(decoding.speculative_sample) == decoding.SPECULATIVE

  def test_seen_through_partials_and_wrappers(self):
    partial = functools.partial(decoding.speculative_sample, gamma=3)
    assert decoding.kind_of(functools.partial(partial, topk=0)) == decoding.SPECULATIVE

    def wrapper(**kwargs):
      return decoding.temperature_sample(**kwargs)
    assert decoding.kind_of(wrapper) is None
    assert decoding.kind_of(functools.wraps(decoding.temperature_sample)(wrapper)) == (
        decoding.AUTOREGRESSIVE)

  def test_cache_slots_read_what_the_function_declares_through_partials(self):
    def fn(**kwargs):
      return kwargs
    fn.extra_cache_slots = lambda width=1, **_: width
    assert decoding.cache_slots(fn, 10, {}) == 11
    assert decoding.cache_slots(fn, 10, {'width': 4}) == 14
    bound = functools.partial(functools.partial(fn, width=2), width=3)
    assert decoding.cache_slots(bound, 10, {}) == 13  # the outer partial's keyword wins
    assert decoding.cache_slots(bound, 10, {'width': 5}) == 15  # and the call's settings over both
    assert decoding.cache_slots(decoding.speculative_sample, 10, {'gamma': 4}) == 10  # a chain needs none

  def test_declare_kind(self):
    fn = decoding.declare_kind(decoding.SPECULATIVE)(lambda **kw: None)
    assert decoding.kind_of(fn) == decoding.SPECULATIVE
    with pytest.raises(ValueError, match='kind must be one of'):
      decoding.declare_kind('beam')


class TestLoopSpecAndState:

  @staticmethod
  def _spec(**kw):
    return decoding.LoopSpec(gamma=2, eos_id=EOS, tokens_to_logits=None,
                             draft_tokens_to_logits=None, **kw)

  def test_fast_greedy_is_derived(self):
    assert self._spec(temperature=0.0).fast_greedy
    assert not self._spec(temperature=1.0).fast_greedy
    assert not self._spec(temperature=0.0, lenience=0.5).fast_greedy
    with pytest.raises(TypeError):
      self._spec(temperature=0.0, fast_greedy=True)  # pylint: disable=unexpected-keyword-arg
    seen = []  # a traced temperature is not known to be greedy
    jax.jit(lambda t: seen.append(self._spec(temperature=t).fast_greedy) or t)(0.0)
    assert seen == [False]

  def test_row_axes_shrink_every_per_row_array(self):
    rows, width = 4, 7
    state = decoding.SpeculativeLoopState(
        cur_index=jnp.arange(rows), sequences=jnp.arange(rows * width).reshape(rows, width),
        forced_bl=jnp.arange(rows * width).reshape(rows, width) % 2 == 0,
        max_len_b=jnp.arange(rows) + 10, target_cache={'k': jnp.zeros((3, rows))},
        draft_cache={'k': jnp.zeros((rows, 3))}, draft_lag=jnp.zeros((rows,), bool),
        ended=jnp.zeros((rows,), bool), generated=jnp.zeros((rows, width), bool),
        rng=jax.random.PRNGKey(0), log_prob=jnp.zeros((rows,)), stats={})
    axes = decoding.row_axes(state, cache_offset=1, draft_cache_offset=0)
    assert axes.target_cache == {'k': 1} and axes.draft_cache == {'k': 0}
    assert axes.rng == batch_shrink.SHARED and axes.forced_bl == 0 and axes.max_len_b == 0
    kept = batch_shrink.take_rows(state, jnp.asarray([3, 1]), axes)
    np.testing.assert_array_equal(kept.max_len_b, [13, 11])
    np.testing.assert_array_equal(kept.forced_bl, np.asarray(state.forced_bl)[[3, 1]])
    assert kept.target_cache['k'].shape == (3, 2)
    np.testing.assert_array_equal(kept.rng, state.rng)


class TestSpeculativeOutput:

  def test_one_shape_with_and_without_stats(self):
    target = toy.ToyModel(45, vocab=9, cache_len=8)
    drafter = toy.ToyModel(46, vocab=9, cache_len=8)
    inputs = jnp.zeros((2, 8), jnp.int32)
    plain = _speculative(target, drafter, inputs, 2, temperature=0.0)
    counted = _speculative(target, drafter, inputs, 2, temperature=0.0, return_stats=True)
    assert isinstance(plain, decoding.SpeculativeOutput)
    assert plain.stats is None
    assert plain.decodes.shape == (2, 1, 8) and plain.log_prob.shape == (2, 1)
    np.testing.assert_array_equal(plain.decodes, counted.decodes)
    assert set(counted.stats) == {'target_calls', 'drafted', 'judged', 'accepted', 'accepted_at',
                                  'overlap_sum', 'overlap_count', 'emitted'}


# -----------------------------------------------------------------------------
# The phases of a speculative round, one by one.
# -----------------------------------------------------------------------------


class TestPhases:
  """draft / verify / accept / commit on toy models whose logits depend on the whole cached prefix."""

  GAMMA, LENGTH, VOCAB = 3, 12, 9

  def _setup(self, prefix, lag=False, draft_confidence=0.0, temperature=0.0):
    target = toy.ToyModel(60, vocab=self.VOCAB, cache_len=self.LENGTH)
    drafter = toy.ToyModel(61, vocab=self.VOCAB, cache_len=self.LENGTH)
    rows = 1
    seq = np.zeros((rows, self.LENGTH + self.GAMMA + 2), np.int32)
    seq[0, :len(prefix)] = prefix
    i = len(prefix) - 1  # position of the last committed token
    # The target has consumed positions < i; the drafter < i-1, and i-1 too unless it lags.
    t_cache = target.init_cache(rows)
    t_cache['tokens'] = t_cache['tokens'].at[0, :i].set(jnp.asarray(prefix[:i]))
    d_cache = drafter.init_cache(rows)
    d_seen = i - 1 if lag else i
    d_cache['tokens'] = d_cache['tokens'].at[0, :d_seen].set(jnp.asarray(prefix[:d_seen]))
    spec = decoding.LoopSpec(
        gamma=self.GAMMA, eos_id=EOS, tokens_to_logits=target.tokens_to_logits,
        draft_tokens_to_logits=drafter.tokens_to_logits, temperature=temperature, topk=0,
        draft_confidence=draft_confidence, return_stats=True)
    assert spec.fast_greedy == (temperature == 0.0)
    state = decoding.SpeculativeLoopState(
        cur_index=jnp.full((rows,), i, jnp.int32), sequences=jnp.asarray(seq),
        forced_bl=jnp.zeros(seq.shape, bool), max_len_b=jnp.full((rows,), self.LENGTH, jnp.int32),
        target_cache=t_cache,
        draft_cache=d_cache, draft_lag=jnp.full((rows,), lag), ended=jnp.zeros((rows,), bool),
        generated=jnp.zeros(seq.shape, bool), rng=jax.random.PRNGKey(0),
        log_prob=jnp.zeros((rows,), jnp.float32), stats=decoding._zero_stats(rows, self.GAMMA))
    return target, drafter, spec, state

  @staticmethod
  def _greedy_continuation(model, prefix, n):
    out = list(prefix)
    for _ in range(n):
      out.append(int(np.argmax(model.prefix_logits(out))))
    return out[len(prefix):]

  @pytest.mark.parametrize('lag', [False, True])
  def test_draft_phase_continues_the_committed_prefix(self, lag):
    prefix = [0, 4, 7, 2, 5]
    _, drafter, spec, state = self._setup(prefix, lag=lag)
    drafts = decoding.draft_phase(spec, state, None)
    expected = self._greedy_continuation(drafter, prefix, self.GAMMA)
    np.testing.assert_array_equal(np.asarray(drafts.tokens_bg[0]), expected)
    assert int(drafts.num_drafted_b[0]) == self.GAMMA
    assert drafts.logq_bgv is None  # static greedy: q is never needed

  def test_draft_phase_needs_the_catch_up_when_lagging(self):
    # The test has power: a lagging drafter fed only position i drafts from a wrong prefix.
    prefix = [0, 4, 7, 2, 5]
    _, drafter, spec, state = self._setup(prefix, lag=True)
    drafts = decoding.draft_phase(spec, state.replace(draft_lag=jnp.zeros((1,), bool)), None)
    expected = self._greedy_continuation(drafter, prefix, self.GAMMA)
    assert not np.array_equal(np.asarray(drafts.tokens_bg[0]), expected)

  def test_verify_phase_scores_every_position(self):
    prefix = [0, 3, 6, 2]
    target, _, spec, state = self._setup(prefix)
    drafts = decoding.Drafts(jnp.asarray([[5, 4, 8]]), None, jnp.asarray([3]), state.draft_cache)
    logits_bkv, _, _ = decoding.verify_phase(spec, state, drafts)
    assert logits_bkv.shape == (1, self.GAMMA + 1, self.VOCAB)
    for j in range(self.GAMMA + 1):
      np.testing.assert_allclose(np.asarray(logits_bkv[0, j]),
                                 target.prefix_logits(prefix + [5, 4, 8][:j]), rtol=1e-6)

  def test_verify_phase_is_only_as_wide_as_the_longest_draft(self):
    prefix = [0, 3, 6, 2]
    target, _, spec, state = self._setup(prefix, draft_confidence=0.5)
    drafts = decoding.Drafts(jnp.asarray([[5, 4, 8]]), None, jnp.asarray([1]), state.draft_cache)
    logits_bkv, cache, _ = decoding.verify_phase(spec, state, drafts)
    np.testing.assert_allclose(np.asarray(logits_bkv[0, 1]), target.prefix_logits(prefix + [5]), rtol=1e-6)
    assert np.all(np.asarray(logits_bkv[0, 2:]) == 0)
    # Two tokens written (positions 3 and 4), nothing past them.
    np.testing.assert_array_equal(np.asarray(cache['tokens'][0, 3:6]), [2, 5, 0])

  def test_accept_phase_keeps_the_leading_matches(self):
    prefix = [0, 3, 6, 2]
    target, _, spec, state = self._setup(prefix)
    best = self._greedy_continuation(target, prefix, 3)
    drafts = decoding.Drafts(jnp.asarray([[best[0], (best[1] + 1) % self.VOCAB, best[2]]]), None,
                             jnp.asarray([3]), state.draft_cache)
    logits_bkv, _, _ = decoding.verify_phase(spec, state, drafts)
    verdict, logp = decoding.accept_phase(spec, state, drafts, logits_bkv, None)
    assert logp is None
    assert int(verdict.num_accepted_b[0]) == 1
    assert int(verdict.next_token_b[0]) == best[1]

  def test_commit_phase_writes_and_advances(self):
    prefix = [0, 3, 6, 2]
    _, _, spec, state = self._setup(prefix)
    drafts = decoding.Drafts(jnp.asarray([[5, 4, 8]]), None, jnp.asarray([3]), state.draft_cache)
    verdict = sampling.Verdict(jnp.asarray([2]), jnp.asarray([7]), jnp.asarray([[True, True, False]]),
                               jnp.ones((1, 3)))
    logits = jnp.zeros((1, self.GAMMA + 1, self.VOCAB))
    new = decoding.commit_phase(spec, state, drafts, verdict, logits, None, state.target_cache, state.rng)
    np.testing.assert_array_equal(np.asarray(new.sequences[0, :8]), [0, 3, 6, 2, 5, 4, 7, 0])
    assert int(new.cur_index[0]) == 6
    assert not bool(new.draft_lag[0])  # a draft was rejected: the drafter has seen position 5
    np.testing.assert_array_equal(np.asarray(new.generated[0, :8]), [0, 0, 0, 0, 1, 1, 1, 0])
    assert int(new.stats['accepted'][0]) == 2 and int(new.stats['judged'][0]) == 3
    assert int(new.stats['emitted'][0]) == 3

  def test_commit_phase_stops_at_eos_and_lags_after_full_acceptance(self):
    prefix = [0, 3, 6, 2]
    _, _, spec, state = self._setup(prefix)
    drafts = decoding.Drafts(jnp.asarray([[5, EOS, 8]]), None, jnp.asarray([3]), state.draft_cache)
    verdict = sampling.Verdict(jnp.asarray([3]), jnp.asarray([7]), jnp.ones((1, 3), bool), jnp.ones((1, 3)))
    new = decoding.commit_phase(spec, state, drafts, verdict, jnp.zeros((1, 4, self.VOCAB)), None,
                                state.target_cache, state.rng)
    np.testing.assert_array_equal(np.asarray(new.sequences[0, :8]), [0, 3, 6, 2, 5, EOS, 0, 0])
    assert bool(new.ended[0])
    assert bool(new.draft_lag[0])


class TestAdaptiveDrafting:
  """draft_confidence > 0 stops a row's drafts early; outputs stay exact."""

  @pytest.mark.parametrize('confidence', [0.2, 0.5, 0.95])
  def test_greedy_identical(self, confidence):
    target = toy.ToyModel(70, vocab=9, cache_len=14, eos_bias=0.5)
    drafter = toy.ToyModel(71, vocab=9, cache_len=14, eos_bias=0.5)
    drafter.table = 0.7 * target.table + 0.3 * drafter.table
    inputs = _prompted_inputs(8, 14, seed=3)
    base, _ = _baseline(target, inputs, temperature=0.0)
    spec, _, stats = _speculative(target, drafter, inputs, 4, temperature=0.0,
                                  draft_confidence=confidence, return_stats=True)
    np.testing.assert_array_equal(np.asarray(spec), np.asarray(base))
    assert np.all(np.asarray(stats['drafted']) <= 4 * np.asarray(stats['target_calls']))

  def test_high_confidence_threshold_drafts_one_token_a_round(self):
    target = toy.ToyModel(72, vocab=9, cache_len=12)
    drafter = toy.ToyModel(73, vocab=9, cache_len=12, scale=0.1)  # near-uniform: never confident
    inputs = jnp.zeros((4, 12), jnp.int32)
    _, _, stats = _speculative(target, drafter, inputs, 4, temperature=1.0, topk=0,
                               draft_confidence=0.9, return_stats=True,
                               decode_rng=jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(stats['drafted']), np.asarray(stats['target_calls']))

  @pytest.mark.parametrize('temperature', [0.0, 1.0])
  def test_an_ended_row_stops_drafting(self, temperature):
    """At batch 2 with row 0 ended and always confident, row 1 never: the draft loop runs once (its
    catch-up call) and row 0 drafts one token, as if it were not there. Drafting on for an ended row would
    run all γ steps, 4 drafter calls and 4 drafts for it."""
    gamma, vocab, length = 4, 9, 12
    confident_v = jnp.zeros((vocab,)).at[5].set(50.0)  # q(5) ≈ 1 at any temperature

    def drafter(state):
      rows, k = state.cur_token.shape
      logits_bkv = jnp.broadcast_to(jnp.stack([confident_v, jnp.zeros((vocab,))])[:rows, None], (rows, k, vocab))
      return logits_bkv, {'calls': state.cache['calls'] + 1}

    seq = jnp.zeros((2, length + gamma + 2), jnp.int32).at[:, 1].set(3)
    spec = decoding.LoopSpec(gamma=gamma, eos_id=EOS, tokens_to_logits=None, draft_tokens_to_logits=drafter,
                             temperature=temperature, topk=0, draft_confidence=0.5, return_stats=False)
    state = decoding.SpeculativeLoopState(
        cur_index=jnp.ones((2,), jnp.int32), sequences=seq, forced_bl=jnp.zeros(seq.shape, bool),
        max_len_b=jnp.full((2,), length, jnp.int32), target_cache={}, draft_cache={'calls': jnp.zeros((), jnp.int32)},
        draft_lag=jnp.zeros((2,), bool), ended=jnp.asarray([True, False]), generated=jnp.zeros(seq.shape, bool),
        rng=jax.random.PRNGKey(0), log_prob=jnp.zeros((2,), jnp.float32), stats={})
    drafts = jax.jit(functools.partial(decoding.draft_phase, spec))(
        state, None if spec.fast_greedy else jax.random.PRNGKey(1))
    assert int(drafts.cache['calls']) == 1
    np.testing.assert_array_equal(np.asarray(drafts.num_drafted_b), [1, 1])
    # The test has power: with row 0 still running, its confidence keeps the loop going to γ.
    running = jax.jit(functools.partial(decoding.draft_phase, spec))(
        state.replace(ended=jnp.zeros((2,), bool)), None if spec.fast_greedy else jax.random.PRNGKey(1))
    assert int(running.cache['calls']) == gamma
    np.testing.assert_array_equal(np.asarray(running.num_drafted_b), [gamma, 1])

  def test_sequence_distribution_is_the_targets(self):
    t = TestSequenceDistribution()
    target, drafter = t._models()
    exact = toy.exact_distribution(target, t.LENGTH, EOS, 1.0, 0, 0.0)
    samples = _sample_many(
        lambda x, **kw: _speculative(target, drafter, x, 3, **kw), target, t.ROWS, t.LENGTH,
        temperature=1.0, topk=0, draft_confidence=0.35, decode_rng=jax.random.PRNGKey(11))
    assert toy.chi_square_pvalue(samples, exact) > 1e-3

  @pytest.mark.parametrize('value', [-0.1, 1.0, 2, True])
  def test_bad_confidence(self, value):
    t = TestBadInputs()
    with pytest.raises(ValueError, match='draft_confidence'):
      t._call(draft_confidence=value)
