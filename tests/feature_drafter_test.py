"""Tests for specdec/feature_drafter.py and the loop's feature drafting (decoding.py).

Toy models (tests/toy.py) check the loop's plumbing exactly: a toy feature
drafter that is right only when it reads the target's true feature of the
position before, and its own cache holds the committed prefix, must have every
draft accepted. Tiny random T5 targets with random heads check the network
side: greedy outputs token for token, the cached head against the
teacher-forced one, the unrolled training depths against the cached chain.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import decoding
from specdec import feature_drafter as fd
from specdec import network
from specdec import sampling
from tests import sampling_test
from tests import toy

EOS = 1


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


def _prompted(batch, length, vocab=9, seed=0):
  """Rows with prompts of 0..3 tokens (no EOS), and one row limited to 2 new tokens."""
  rng = np.random.RandomState(seed)
  inputs = np.zeros((batch, length), np.int32)
  for b in range(batch):
    n = b % 4
    inputs[b, 1:1 + n] = rng.randint(2, vocab, size=n)
  return jnp.asarray(inputs)


class TestToyLoop:

  @pytest.mark.parametrize('gamma, temperature, shrink', [
      (1, 0.0, True), (3, 0.0, False), (2, 1.0, False), (5, 1.0, True)])
  def test_exact_drafter_has_every_draft_accepted(self, gamma, temperature, shrink):
    target, drafter = _toy_pair()
    inputs = _prompted(12, 8)
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
    out = _toy_speculative(target, drafter, _prompted(12, 24), 3, target_fn=shifted,
                           temperature=0.0, topk=0, return_stats=True)
    assert out.stats['accepted'].sum() < 0.5 * out.stats['judged'].sum()

  def test_the_draft_after_a_rejection_is_accepted(self):
    """A feature drafter exact except where its draft lands on a position p ≡ 0 (mod 3), where its draft is
    wrong: every rejection happens there, and the draft of p + 1 in the next round reads the target's features
    and a rolled-back cache, so it is accepted. Each row's target calls equal a replay of its rounds in
    Python; one wrong draft more a row (a feature or cache left misaligned by a rejection) changes them."""
    gamma, length = 3, 24
    target, drafter = _toy_pair(length=length)
    inputs = _prompted(12, length)

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
    inputs = _prompted(12, 8)
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
    out = _toy_speculative(target, drafter, _prompted(12, 8), 4, temperature=1.0, topk=0,
                           draft_confidence=0.3, return_stats=True, shrink_batch=False,
                           decode_rng=jax.random.PRNGKey(7))
    np.testing.assert_array_equal(out.stats['accepted'], out.stats['judged'])

  def test_num_decodes(self):
    target, drafter = _toy_pair()
    out = _toy_speculative(target, drafter, _prompted(3, 8), 2, temperature=1.0, topk=0,
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

  def test_head_for_another_target(self):
    target_config = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8,
                                      num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32)
    with pytest.raises(ValueError, match='emb_dim 16'):
      fd.check_target(fd.FeatureHeadConfig(feature_dim=32, vocab_size=64), target_config)
    with pytest.raises(ValueError, match='Vocabulary mismatch'):
      fd.check_target(fd.FeatureHeadConfig(feature_dim=16, vocab_size=65), target_config)

  @pytest.mark.parametrize('field', ['width', 'num_layers', 'feature_dim'])
  def test_bad_config(self, field):
    kwargs = dict(feature_dim=16, vocab_size=64)
    kwargs[field] = 0
    with pytest.raises(ValueError, match=f'FeatureHeadConfig.{field}'):
      fd.FeatureHeadConfig(**kwargs)

  def test_attention_must_be_a_bool(self):
    with pytest.raises(ValueError, match='FeatureHeadConfig.attention'):
      fd.FeatureHeadConfig(feature_dim=16, vocab_size=64, attention='no')


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
      logits_q = fd.widen_logits(jnp.take(sampling_test._random_logits(200 + seed), ids, axis=-1),
                                 jnp.asarray(ids), vocab)
      logp = sampling.adjusted_log_probs(logits_p, temperature, topk, topp)
      logq = sampling.adjusted_log_probs(logits_q, temperature, topk, topp)
      assert np.all(np.isneginf(np.delete(np.asarray(logq), ids, axis=-1)))
      out = sampling_test._one_step_output(logp, logq)
      np.testing.assert_allclose(out, sampling_test._probs(logp), atol=1e-6)

  def test_widen_logits(self):
    out = fd.widen_logits(jnp.asarray([[2.0, 3.0]]), jnp.asarray([4, 1]), 6)
    np.testing.assert_array_equal(out, [[-np.inf, 3.0, -np.inf, -np.inf, 2.0, -np.inf]])


# -----------------------------------------------------------------------------
# The network: a tiny T5 target and a random head.
# -----------------------------------------------------------------------------

TARGET = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8,
                          num_encoder_layers=1, num_decoder_layers=2, mlp_dim=32,
                          dropout_rate=0.0, relative_attention_num_buckets=8,
                          relative_attention_max_distance=16)
HEAD = fd.FeatureHeadConfig(feature_dim=16, vocab_size=64, width=12, num_layers=2, num_heads=2,
                            head_dim=6, mlp_dim=24, relative_attention_num_buckets=8,
                            relative_attention_max_distance=16)
# An attention-free head: the same tests hold for it (no cache to roll back).
MLP_HEAD = fd.FeatureHeadConfig(feature_dim=16, vocab_size=64, width=12, num_layers=2,
                                mlp_dim=24, attention=False)


@pytest.fixture(scope='module', params=[HEAD, MLP_HEAD], ids=['attention', 'mlp'])
def nets(request):
  target = network.Transformer(TARGET)
  target_params = network.init_params(TARGET, jax.random.PRNGKey(0))
  head = fd.FeatureHead(request.param)
  head_params = fd.init_params(request.param, jax.random.PRNGKey(1))
  return target, target_params, head, head_params


def _network_decode(nets, inputs, enc, gamma, vocab_ids=None, **kw):
  target, target_params, head, head_params = nets

  def run(inputs, enc):
    cache, target_fn, head_cache, draft_fn = fd.decoder_fns(
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


def _encoder_inputs(batch, length, seed=5):
  rng = np.random.RandomState(seed)
  enc = rng.randint(2, TARGET.vocab_size, (batch, length)).astype(np.int32)
  for b in range(batch):
    enc[b, length - b % 3:] = 0  # padding of different lengths
  return jnp.asarray(enc)


class TestNetworkDecoding:

  @pytest.mark.parametrize('gamma', [1, 3])
  @pytest.mark.parametrize('trimmed', [False, True])
  def test_greedy_outputs_are_the_targets(self, nets, gamma, trimmed):
    inputs = _prompted(5, 10, vocab=TARGET.vocab_size)
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


def _sum_terms_bound(*counts):
  """Tolerance factor for comparing two orderings of the same float32 sums.

  Reordering a float32 sum of n terms changes it by at most about n ulps of
  its scale; the head's output passes through sums of these lengths (attention
  over self and cross positions, and each projection's inputs), so twice their
  total, in units of float32 epsilon times the output's magnitude, bounds the
  difference between a cached and a teacher-forced evaluation.
  """
  return 2 * sum(counts) * np.finfo(np.float32).eps


class TestFoldedLogits:
  """A head narrower than the target reads its logits through one folded [W, K] kernel."""

  def _draft(self, nets, vocab_ids=None, **kw):
    target, target_params, head, head_params = nets
    enc = _encoder_inputs(2, 6)
    _, _, head_cache, draft_fn = fd.decoder_fns(target, target_params, head, head_params, enc, 8,
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
    assert fd.folds_projection(head.config)  # 12 wide, 16-wide target
    ids = jnp.arange(1, TARGET.vocab_size, 3) if trimmed else None
    projection_ek = target.apply({'params': target_params},
                                 ids if trimmed else jnp.arange(TARGET.vocab_size),
                                 method=target.projection_rows)
    kernel_wk = fd.logits_kernel(head_params, projection_ek)
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
    assert not fd.folds_projection(dataclasses.replace(HEAD, width=16))
    assert fd.folds_projection(dataclasses.replace(HEAD, width=15))


class TestHead:

  def _inputs(self, nets, batch=2, length=7, input_len=6):
    target, target_params = nets[:2]
    enc = _encoder_inputs(batch, input_len)
    rng = np.random.RandomState(2)
    targets = rng.randint(2, TARGET.vocab_size, (batch, length)).astype(np.int32)
    decoder_input = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]
    batch_ = {'encoder_input_tokens': enc, 'decoder_input_tokens': jnp.asarray(decoder_input),
              'decoder_target_tokens': jnp.asarray(targets),
              'decoder_loss_weights': jnp.ones((batch, length), jnp.float32)}
    encoded, _, features = fd.target_features(target, target_params, batch_)
    embedded = target.apply({'params': target_params}, batch_['decoder_input_tokens'],
                            method=target.embed)
    return batch_, encoded, features, embedded

  def _tolerance(self, nets, reference, length, input_len):
    head = nets[2].config
    scale = float(np.abs(np.asarray(reference)).max())
    return _sum_terms_bound(length, input_len, 2 * head.feature_dim, head.width, head.mlp_dim,
                            head.num_heads * head.head_dim) * scale * head.num_layers

  def test_cached_chain_equals_the_unrolled_depths(self, nets):
    """Depth s of `unrolled` at position t is the (s+1)-th draft of a round that began at t-s."""
    _, _, head, head_params = nets
    batch_, encoded, features, embedded = self._inputs(nets)
    enc = batch_['encoder_input_tokens']
    length = features.shape[1]
    valid = batch_['decoder_target_tokens'] > 0
    cross = network._pairwise_mask(valid, enc > 0)
    depths = head.apply({'params': head_params}, fd.shift_features_right(features), embedded,
                        encoded, valid, cross, 3, method=head.unrolled)
    _, v = head.apply({'params': head_params}, encoded, enc > 0, length, method=head.init_cache,
                      mutable=['cache'])
    step = jax.jit(lambda c, f, e, i: head.apply({'params': head_params, 'cache': c}, f, e, i,
                                                 method=head.decode_step, mutable=['cache']))
    shifted = fd.shift_features_right(features)
    tol = self._tolerance(nets, depths[0], length, enc.shape[1])
    # Depth 0: the teacher-forced head, as one k-entry cached call.
    out0, _ = step(v['cache'], shifted, embedded, jnp.zeros((2,), jnp.int32))
    np.testing.assert_allclose(out0, depths[0], rtol=0, atol=tol)
    for start in range(0, length - 2):
      # Catch-up through `start` with true features, then chain on predictions.
      out, new = step(v['cache'], shifted[:, :start + 1], embedded[:, :start + 1],
                      jnp.zeros((2,), jnp.int32))
      cache, predicted = new['cache'], out[:, start:start + 1]
      for s in range(1, 3):
        t = start + s
        if t >= length:
          break
        out, new = step(cache, predicted, embedded[:, t:t + 1], jnp.full((2,), t, jnp.int32))
        cache, predicted = new['cache'], out
        np.testing.assert_allclose(out[:, 0], depths[s][:, t], rtol=0, atol=tol,
                                   err_msg=f'depth {s}, position {t}')

  def test_teacher_forced_call_is_depth_zero(self, nets):
    _, _, head, head_params = nets
    batch_, encoded, features, embedded = self._inputs(nets)
    valid = batch_['decoder_target_tokens'] > 0
    cross = network._pairwise_mask(valid, batch_['encoder_input_tokens'] > 0)
    causal = jnp.tril(jnp.ones((valid.shape[1],) * 2, bool))[None, None]
    self_mask = causal & network._pairwise_mask(valid, valid)
    shifted = fd.shift_features_right(features)
    full = head.apply({'params': head_params}, shifted, embedded, encoded, self_mask, cross)
    (depth0,) = head.apply({'params': head_params}, shifted, embedded, encoded, valid, cross, 1,
                           method=head.unrolled)
    np.testing.assert_allclose(full, depth0, rtol=0,
                               atol=self._tolerance(nets, full, valid.shape[1], cross.shape[-1]))

  def test_losses_train_the_head_only(self, nets):
    target, target_params, head, head_params = nets
    batch_ = self._inputs(nets)[0]

    def loss(hp, tp):
      return fd.losses(head, hp, target, tp, batch_, unroll_steps=2)

    (value, metrics), (g_head, g_target) = jax.value_and_grad(loss, argnums=(0, 1),
                                                               has_aux=True)(head_params,
                                                                             target_params)
    assert np.isfinite(float(value)) and float(value) > 0
    assert 0.0 <= float(metrics['agree']) <= 1.0 and 'agree_s1' in metrics
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(g_target))
    assert any(float(jnp.abs(g).max()) > 0.0 for g in jax.tree_util.tree_leaves(g_head))

  def test_trimmed_loss_agreement_counts_in_full_ids(self, nets):
    target, target_params, head, head_params = nets
    batch_ = self._inputs(nets)[0]
    all_ids = jnp.arange(TARGET.vocab_size)
    full = fd.losses(head, head_params, target, target_params, batch_)[1]
    same = fd.losses(head, head_params, target, target_params, batch_, vocab_ids=all_ids)[1]
    assert float(full['agree']) == float(same['agree'])
    np.testing.assert_allclose(float(full['ce']), float(same['ce']), rtol=1e-5)

  def test_attention_free_head_reads_one_entry(self):
    """Without attention, entry t depends on (f_{t-1}, x_t) alone: earlier entries change nothing."""
    head = fd.FeatureHead(MLP_HEAD)
    params = fd.init_params(MLP_HEAD, jax.random.PRNGKey(4))
    rng = np.random.RandomState(6)
    features = jnp.asarray(rng.randn(1, 5, 16), jnp.float32)
    embedded = jnp.asarray(rng.randn(1, 5, 16), jnp.float32)
    _, v = head.apply({'params': params}, jnp.zeros((1, 3, 16)), jnp.ones((1, 3), bool), 5,
                      method=head.init_cache, mutable=['cache'])
    step = lambda f, e, i: head.apply({'params': params, 'cache': v['cache']}, f, e,
                                      jnp.full((1,), i, jnp.int32), method=head.decode_step,
                                      mutable=['cache'])[0]
    whole = step(features, embedded, 0)
    changed = step(features.at[:, :4].set(0.0), embedded.at[:, :4].set(1.0), 0)
    # Other call shapes may block the same sums differently: float32 reordering bounds.
    tol = _sum_terms_bound(2 * MLP_HEAD.feature_dim, MLP_HEAD.width, MLP_HEAD.mlp_dim) * float(
        np.abs(np.asarray(whole)).max()) * MLP_HEAD.num_layers
    np.testing.assert_allclose(whole[:, 4], changed[:, 4], rtol=0, atol=tol)
    assert np.abs(np.asarray(whole[:, 3] - changed[:, 3])).max() > 100 * tol
    np.testing.assert_allclose(whole[:, 4:], step(features[:, 4:], embedded[:, 4:], 4), rtol=0,
                               atol=tol)
    assert set(v['cache']) == {'encoder_mask'}  # nothing else to roll back

  def test_param_axes_cover_every_param(self, nets):
    axes = fd.param_logical_axes(nets[2].config)
    params = nets[3]
    assert (jax.tree_util.tree_structure(axes, is_leaf=lambda x: x is None or hasattr(x, 'index'))
            is not None)
    flat_axes = jax.tree_util.tree_leaves(axes, is_leaf=lambda x: x is None or hasattr(x, 'index'))
    assert len(flat_axes) == len(jax.tree_util.tree_leaves(params))
