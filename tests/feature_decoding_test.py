"""Tests for specdec/feature_decoding.py and the loop's feature drafting (decoding.py).

Toy models (tests/toy.py) check the loop's plumbing exactly: a toy feature
drafter that is right only when it reads the target's true feature of the
position before, and its own cache holds the committed prefix, must have every
draft accepted. Tiny random T5 targets with random heads (those of
tests/feature_drafter_test.py) check the decode functions: greedy outputs
token for token, trimmed vocabularies, the folded logits kernel.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import decoding
from specdec import feature_decoding
from specdec import sampling
from tests import decoding_test
from tests import feature_drafter_test
from tests import sampling_test
from tests import toy

EOS = 1
# The tiny target and random heads of the network's tests.
TARGET = feature_drafter_test.TARGET
HEAD = feature_drafter_test.HEAD
nets = feature_drafter_test.nets
_encoder_inputs = feature_drafter_test._encoder_inputs  # pylint: disable=protected-access
_sum_terms_bound = feature_drafter_test._sum_terms_bound  # pylint: disable=protected-access


# -----------------------------------------------------------------------------
# The loop, on toy models.
# -----------------------------------------------------------------------------


def _toy_pair(exact=True, length=8, vocab=9, seed=3):
  target = toy.ToyModel(seed, vocab=vocab, cache_len=length, scale=2.0, eos_bias=-1.0)
  target.table[:, 0] -= 10.0  # no padding id in the outputs: every hash keeps changing
  return target, toy.ToyFeatureDrafter(target, seed=seed + 1, exact=exact)


def _toy_speculative(target, drafter, inputs, gamma, target_fn=None, **kw):
  batch = inputs.shape[0]
  fn = functools.partial(
      decoding.speculative_sample,
      tokens_to_logits=target_fn or target.tokens_to_logits_and_features,
      draft_tokens_to_logits=drafter.tokens_to_logits, eos_id=EOS, gamma=gamma,
      draft_reads_features=True, **kw)
  return jax.jit(fn)(inputs, target.init_cache(batch), draft_cache=drafter.init_cache(batch))


def _toy_baseline(target, inputs):
  fn = functools.partial(decoding.temperature_sample, tokens_to_logits=target.tokens_to_logits,
                         eos_id=EOS, temperature=0.0, topk=0)
  return jax.jit(fn)(inputs, target.init_cache(inputs.shape[0]))[0]


class TestToyLoop:

  @pytest.mark.parametrize('gamma, temperature, shrink', [
      (1, 0.0, True), (3, 0.0, False), (2, 1.0, False), (5, 1.0, True)])
  def test_exact_drafter_has_every_draft_accepted(self, gamma, temperature, shrink):
    target, drafter = _toy_pair()
    inputs = decoding_test._prompted_inputs(12, 8)
    out = _toy_speculative(target, drafter, inputs, gamma, temperature=temperature, topk=0,
                           return_stats=True, shrink_batch=shrink,
                           decode_rng=jax.random.PRNGKey(gamma))
    stats = jax.tree_util.tree_map(np.asarray, out.stats)
    assert stats['judged'].sum() > 20
    np.testing.assert_array_equal(stats['accepted'], stats['judged'])
    if temperature == 0.0:
      np.testing.assert_array_equal(out.decodes[:, -1], _toy_baseline(target, inputs)[:, -1])

  def test_misaligned_features_lose_drafts(self):
    """The test above can fail: features shifted by one position are caught."""
    target, drafter = _toy_pair(length=24)

    def shifted(state):
      logits, features, cache = target.tokens_to_logits_and_features(state)
      return logits, jnp.roll(features, 1, axis=1), cache

    # Only the first round (which reads no verify features) is right; later
    # drafts match by chance (1 in 9).
    out = _toy_speculative(target, drafter, decoding_test._prompted_inputs(12, 24), 3, target_fn=shifted,
                           temperature=0.0, topk=0, return_stats=True)
    assert out.stats['accepted'].sum() < 0.5 * out.stats['judged'].sum()

  def test_the_draft_after_a_rejection_is_accepted(self):
    """A feature drafter exact except where its draft lands on a position p ≡ 0 (mod 3), where its draft is
    wrong: every rejection happens there, and the draft of p + 1 in the next round reads the target's features
    and a rolled-back cache, so it is accepted. Each row's target calls equal a replay of its rounds in
    Python; one wrong draft more a row (a feature or cache left misaligned by a rejection) changes them."""
    gamma, length = 3, 24
    target, drafter = _toy_pair(length=length)
    inputs = decoding_test._prompted_inputs(12, length)

    class WrongAtMultiplesOfThree:
      def init_cache(self, batch):
        return drafter.init_cache(batch)

      def tokens_to_logits(self, state, features_bke):
        logits_bkv, predicted_bke, cache = drafter.tokens_to_logits(state, features_bke)
        # Entry p predicts position p + 1; rolled logits move the argmax to another token.
        next_pos_bk = state.cur_index[:, None] + jnp.arange(state.cur_token.shape[1]) + 1
        logits_bkv = jnp.where((next_pos_bk % 3 == 0)[..., None], jnp.roll(logits_bkv, 1, axis=-1), logits_bkv)
        return logits_bkv, predicted_bke, cache

    def replayed_calls(row, wrong):
      """Rounds of the loop in Python: drafts of positions cur+1..cur+γ kept while right (a given prompt
      token always is), then the target's own token; the row ends at its EOS or its last position."""
      decoded = np.asarray(base[row])
      end = int(np.argmax(decoded == EOS)) + 1 if np.any(decoded == EOS) else length
      forced = {p for p in range(1, length) if int(inputs[row, p]) != 0}
      cur, calls = 0, 0
      while cur < end:
        calls += 1
        kept = 0
        while kept < gamma and cur + kept + 1 <= end and (cur + kept + 1 in forced or not wrong(cur + kept + 1)):
          kept += 1
        cur += kept + 1
      return calls

    base = np.asarray(_toy_baseline(target, inputs)[:, -1])
    for wrong, fn in ((lambda p: False, drafter), (lambda p: p % 3 == 0, WrongAtMultiplesOfThree())):
      out = _toy_speculative(target, fn, inputs, gamma, temperature=0.0, topk=0, return_stats=True)
      np.testing.assert_array_equal(out.decodes[:, -1], base)
      np.testing.assert_array_equal(out.stats['target_calls'][:, 0],
                                    [replayed_calls(row, wrong) for row in range(inputs.shape[0])])
    assert out.stats['accepted'].sum() < out.stats['judged'].sum()  # the wrong drafts were judged and rejected

  def test_greedy_identical_with_a_poor_drafter(self):
    target, drafter = _toy_pair(exact=False)
    inputs = decoding_test._prompted_inputs(12, 8)
    out = _toy_speculative(target, drafter, inputs, 3, temperature=0.0, topk=0,
                           return_stats=True)
    np.testing.assert_array_equal(out.decodes[:, -1], _toy_baseline(target, inputs)[:, -1])
    assert 0 < out.stats['accepted'].sum() < out.stats['judged'].sum()

  @pytest.mark.parametrize('gamma, temperature, topk, topp, confidence, shrink', [
      (1, 1.0, 0, 0.0, 0.0, False), (3, 0.7, 3, 0.0, 0.0, False), (4, 1.3, 0, 0.8, 0.0, False),
      # Adaptive drafting (rows stop drafting at different steps) and a shrinking batch (rows that ended
      # leave it): both move features and caches between rows and rounds.
      (3, 1.0, 0, 0.0, 0.35, False), (3, 1.0, 0, 0.0, 0.0, True)])
  def test_sequence_distribution_is_the_targets(self, gamma, temperature, topk, topp, confidence, shrink):
    length, vocab, rows = 4, 5, 20_000
    target = toy.ToyModel(30, vocab=vocab, cache_len=length, scale=1.5, eos_bias=0.5)
    drafter = toy.ToyFeatureDrafter(target, seed=31, exact=False)
    exact = toy.exact_distribution(target, length, EOS, temperature, topk, topp)
    out = _toy_speculative(target, drafter, jnp.zeros((rows, length), jnp.int32), gamma,
                           temperature=temperature, topk=topk, topp=topp, shrink_batch=shrink,
                           draft_confidence=confidence, return_stats=True,
                           decode_rng=jax.random.PRNGKey(gamma))
    samples = np.asarray(out.decodes[:, 0])
    if confidence:  # some rounds stopped drafting early
      assert out.stats['drafted'].sum() < gamma * out.stats['target_calls'].sum()
    if shrink:  # most rows ended before the last position, so the batch shrank
      ends = np.where(np.any(samples == EOS, -1), np.argmax(samples == EOS, -1) + 1, length)
      assert np.mean(ends < length) > 0.5
    assert toy.chi_square_pvalue(samples, exact) > 1e-3

  def test_adaptive_drafting_keeps_features_aligned(self):
    target, drafter = _toy_pair()
    out = _toy_speculative(target, drafter, decoding_test._prompted_inputs(12, 8), 4, temperature=1.0, topk=0,
                           draft_confidence=0.3, return_stats=True, shrink_batch=False,
                           decode_rng=jax.random.PRNGKey(7))
    np.testing.assert_array_equal(out.stats['accepted'], out.stats['judged'])

  def test_num_decodes(self):
    target, drafter = _toy_pair()
    out = _toy_speculative(target, drafter, decoding_test._prompted_inputs(3, 8), 2, temperature=1.0, topk=0,
                           num_decodes=4, return_stats=True, decode_rng=jax.random.PRNGKey(2))
    assert out.decodes.shape == (3, 4, 8)
    np.testing.assert_array_equal(out.stats['accepted'], out.stats['judged'])


class TestContractErrors:

  def test_target_without_features(self):
    target, drafter = _toy_pair()
    with pytest.raises(ValueError, match=r'tokens_to_logits must return \(logits, features'):
      decoding.speculative_sample(
          jnp.zeros((2, 8), jnp.int32), target.init_cache(2), target.tokens_to_logits,
          drafter.init_cache(2), drafter.tokens_to_logits, eos_id=EOS,
          draft_reads_features=True)

  def test_drafter_predicting_another_width(self):
    target, drafter = _toy_pair()

    def narrow(state, features):
      logits, predicted, cache = drafter.tokens_to_logits(state, features)
      return logits, predicted[..., :5], cache

    with pytest.raises(ValueError, match='Feature width mismatch'):
      decoding.speculative_sample(
          jnp.zeros((2, 8), jnp.int32), target.init_cache(2),
          target.tokens_to_logits_and_features, drafter.init_cache(2), narrow, eos_id=EOS,
          draft_reads_features=True)


# -----------------------------------------------------------------------------
# Trimmed vocabularies: q = 0 outside K, still exact.
# -----------------------------------------------------------------------------


class TestTrimmedVocabulary:

  @pytest.mark.parametrize('temperature, topk, topp', sampling_test.SETTINGS)
  def test_one_step_output_is_the_target_distribution(self, temperature, topk, topp):
    vocab = sampling_test._random_logits(0).shape[-1]
    for seed in range(10):
      ids = np.sort(np.random.RandomState(seed).choice(vocab, size=vocab // 2, replace=False))
      logits_p = sampling_test._random_logits(100 + seed)
      logits_q = feature_decoding.widen_logits(jnp.take(sampling_test._random_logits(200 + seed), ids, axis=-1),
                                               jnp.asarray(ids), vocab)
      logp = sampling.adjusted_log_probs(logits_p, temperature, topk, topp)
      logq = sampling.adjusted_log_probs(logits_q, temperature, topk, topp)
      assert np.all(np.isneginf(np.delete(np.asarray(logq), ids, axis=-1)))
      out = sampling_test._one_step_output(logp, logq)
      np.testing.assert_allclose(out, sampling_test._probs(logp), atol=1e-6)

  def test_widen_logits(self):
    out = feature_decoding.widen_logits(jnp.asarray([[2.0, 3.0]]), jnp.asarray([4, 1]), 6)
    np.testing.assert_array_equal(out, [[-np.inf, 3.0, -np.inf, -np.inf, 2.0, -np.inf]])


# -----------------------------------------------------------------------------
# Decoding through a tiny T5 target and a random head.
# -----------------------------------------------------------------------------


def _network_decode(nets, inputs, enc, gamma, vocab_ids=None, **kw):
  target, target_params, head, head_params = nets

  def run(inputs, enc):
    cache, target_fn, head_cache, draft_fn = feature_decoding.decoder_fns(
        target, target_params, head, head_params, enc, inputs.shape[1], vocab_ids)
    return decoding.speculative_sample(inputs, cache, target_fn, head_cache, draft_fn, eos_id=EOS,
                                       gamma=gamma, draft_reads_features=True, **kw)

  return jax.jit(run)(inputs, enc)


def _network_baseline(nets, inputs, enc):
  target, target_params = nets[:2]

  def run(inputs, enc):
    encoded = target.apply({'params': target_params}, enc, enable_dropout=False,
                           method=target.encode)
    _, v = target.apply({'params': target_params}, encoded, enc, inputs.shape[1],
                        method=target.init_cache, mutable=['cache'])

    def fn(state):
      logits, new = target.apply({'params': target_params, 'cache': state.cache},
                                 state.cur_token, state.cur_index, method=target.decode_step,
                                 mutable=['cache'])
      return logits, new['cache']

    return decoding.temperature_sample(inputs, v['cache'], fn, eos_id=EOS, temperature=0.0,
                                       topk=0)[0]

  return jax.jit(run)(inputs, enc)


class TestNetworkDecoding:

  @pytest.mark.parametrize('gamma', [1, 3])
  @pytest.mark.parametrize('trimmed', [False, True])
  def test_greedy_outputs_are_the_targets(self, nets, gamma, trimmed):
    inputs = decoding_test._prompted_inputs(5, 10, vocab=TARGET.vocab_size)
    enc = _encoder_inputs(5, 7)
    ids = jnp.arange(0, TARGET.vocab_size, 3) if trimmed else None
    out = _network_decode(nets, inputs, enc, gamma, ids, temperature=0.0, topk=0,
                          return_stats=True)
    np.testing.assert_array_equal(out.decodes[:, -1], _network_baseline(nets, inputs, enc)[:, -1])
    assert out.stats['judged'].sum() > 0

  def test_sampled_decodes_run_with_trimmed_drafts(self, nets):
    inputs = jnp.zeros((4, 10), jnp.int32)
    ids = jnp.arange(0, TARGET.vocab_size, 2)
    out = _network_decode(nets, inputs, _encoder_inputs(4, 7), 3, ids, temperature=1.0, topk=0,
                          return_stats=True, decode_rng=jax.random.PRNGKey(3))
    assert out.decodes.shape == (4, 1, 10)
    assert np.all(np.asarray(out.stats['accepted']) <= np.asarray(out.stats['judged']))


class TestFoldedLogits:
  """A head narrower than the target reads its logits through one folded [W, K] kernel."""

  def _draft(self, nets, vocab_ids=None, **kw):
    target, target_params, head, head_params = nets
    enc = _encoder_inputs(2, 6)
    _, _, head_cache, draft_fn = feature_decoding.decoder_fns(target, target_params, head, head_params, enc, 8,
                                                              vocab_ids, **kw)
    rng = np.random.RandomState(7)
    features = jnp.asarray(rng.randn(2, 3, TARGET.emb_dim), jnp.float32)
    state = decoding.DecodingState(cur_index=jnp.zeros((2,), jnp.int32), sequences=jnp.zeros((2, 8), jnp.int32),
                                   cur_token=jnp.asarray(rng.randint(2, TARGET.vocab_size, (2, 3)), jnp.int32),
                                   cache=head_cache)
    logits, predicted, _ = jax.jit(draft_fn)(state, features)
    embedded = target.apply({'params': target_params}, state.cur_token, method=target.embed)
    predicted_again, normed = head.apply({'params': head_params, 'cache': head_cache}, features, embedded,
                                         state.cur_index, True, method=head.decode_step,
                                         mutable=['cache'])[0]
    return logits, predicted, predicted_again, normed

  @pytest.mark.parametrize('trimmed', [False, True])
  def test_folded_logits_are_the_two_maps(self, nets, trimmed):
    target, target_params, head, head_params = nets
    assert feature_decoding.folds_projection(head.config)  # 12 wide, 16-wide target
    ids = jnp.arange(1, TARGET.vocab_size, 3) if trimmed else None
    projection_ek = target.apply({'params': target_params},
                                 ids if trimmed else jnp.arange(TARGET.vocab_size),
                                 method=target.projection_rows)
    kernel_wk = feature_decoding.logits_kernel(head_params, projection_ek)
    assert kernel_wk.shape == (head.config.width, projection_ek.shape[1])
    # Trimmed, the decode folds the kernel itself; over the whole vocabulary only when it is given.
    logits, predicted, predicted_again, normed = self._draft(
        nets, ids, **({} if trimmed else {'logits_kernel_wk': kernel_wk}))
    unfuse_we = head_params['unfuse']['kernel']
    want = np.asarray(predicted) @ np.asarray(projection_ek)
    # The same sum of W * E products, grouped differently: float32 reordering over W + E terms.
    magnitude = np.abs(np.asarray(normed)) @ np.abs(np.asarray(unfuse_we)) @ np.abs(np.asarray(projection_ek))
    tol = _sum_terms_bound(head.config.width, head.config.feature_dim) * magnitude
    got = np.asarray(logits)
    if trimmed:
      assert np.all(np.isneginf(np.delete(got, np.asarray(ids), axis=-1)))
      got = got[..., np.asarray(ids)]
    assert np.all(np.abs(got - want) <= tol)
    assert np.abs(want).max() > 100 * tol.max()  # the bound is tight enough to catch a wrong kernel
    # The feature the next draft step reads: the head's, as unfolded (compiled apart, so up to reordering).
    cfg = head.config
    feature_tol = _sum_terms_bound(8, 6, 2 * cfg.feature_dim, cfg.width, cfg.mlp_dim,
                                   cfg.num_heads * cfg.head_dim) * cfg.num_layers * float(
                                       np.abs(np.asarray(predicted)).max())
    np.testing.assert_allclose(predicted, predicted_again, rtol=0, atol=feature_tol)

  def test_the_folded_kernel_is_what_the_logits_read(self, nets):
    ids = jnp.arange(1, TARGET.vocab_size, 3)
    logits = self._draft(nets, ids, logits_kernel_wk=jnp.zeros((nets[2].config.width, ids.shape[0])))[0]
    np.testing.assert_array_equal(np.asarray(logits)[..., np.asarray(ids)], 0.0)

  def test_a_kernel_of_the_wrong_shape_is_refused(self, nets):
    with pytest.raises(ValueError, match='folded logits kernel has shape'):
      self._draft(nets, jnp.arange(1, TARGET.vocab_size, 3),
                  logits_kernel_wk=jnp.zeros((nets[2].config.width, TARGET.vocab_size)))

  def test_a_head_as_wide_as_the_target_does_not_fold(self):
    assert not feature_decoding.folds_projection(dataclasses.replace(HEAD, width=16))
    assert feature_decoding.folds_projection(dataclasses.replace(HEAD, width=15))
