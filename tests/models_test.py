"""Tests for specdec/models.py: whole decodes with random tiny T5 pairs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import decoding
from specdec import feature_decoding
from specdec import feature_drafter
from specdec import models
from specdec import network

VOCAB = 48
EOS = 1
TARGET_CFG = network.t5_1_1_config('tiny', vocab_size=VOCAB)
DRAFTER_CFG = network.t5_1_1_config('tiny', vocab_size=VOCAB, emb_dim=16,
                                    num_heads=2, num_encoder_layers=1,
                                    num_decoder_layers=1, mlp_dim=32)


class _Vocabulary:
  """What the model reads of a seqio vocabulary (its size and EOS id), so this file runs where seqio is not
  installed (the accelerator check runs it on such machines)."""

  def __init__(self, vocab_size, eos_id):
    self.vocab_size, self.eos_id = vocab_size, eos_id


def _params(seed=0):
  target_rng, drafter_rng = jax.random.split(jax.random.PRNGKey(seed))
  target = network.init_params(TARGET_CFG, target_rng)
  # A mild EOS bias so that rows end at different steps.
  kernel = target['decoder']['logits_dense']['kernel']
  target['decoder']['logits_dense']['kernel'] = kernel.at[:, EOS].add(
      0.15 * jnp.sign(kernel[:, EOS]))
  return {'target': target,
          'drafter': network.init_params(DRAFTER_CFG, drafter_rng)}


def _batch(batch=6, input_len=9, target_len=12, seed=1, prompts=False):
  rng = np.random.RandomState(seed)
  enc = rng.randint(2, VOCAB, size=(batch, input_len))
  for b in range(batch):
    enc[b, input_len - (b % 4):] = 0  # Different input lengths.
  dec = np.zeros((batch, target_len), np.int32)
  if prompts:
    for b in range(batch):
      dec[b, 1:1 + b % 3] = rng.randint(2, VOCAB, size=b % 3)
  return {'encoder_input_tokens': jnp.asarray(enc, jnp.int32),
          'decoder_input_tokens': jnp.asarray(dec)}


@pytest.fixture(scope='module')
def spec_model():
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET_CFG), network.Transformer(DRAFTER_CFG))


@pytest.fixture(scope='module')
def self_model():
  """Drafter = target network (same params passed for both)."""
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET_CFG), network.Transformer(TARGET_CFG))


@pytest.fixture(scope='module')
def base_model():
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET_CFG), None,
      decode_fn=decoding.temperature_sample)


@pytest.fixture(scope='module')
def params():
  return _params()


class TestGreedyIdentity:

  @pytest.mark.parametrize('gamma', [1, 2, 4, 8])
  def test_unrelated_drafter(self, spec_model, base_model, params, gamma):
    batch = _batch(seed=gamma)
    base, base_aux = base_model.compile_predict({'temperature': 0.0})(params, batch)
    spec, aux = spec_model.compile_predict(
        {'temperature': 0.0, 'gamma': gamma, 'return_stats': True})(params, batch)
    np.testing.assert_array_equal(spec, base)
    np.testing.assert_array_equal(aux['scores'], base_aux['scores'])
    lengths = np.sum(np.asarray(base) != 0, axis=-1)
    assert len(set(lengths.tolist())) > 1, 'rows should end at different times'

  @pytest.mark.parametrize('gamma', [3, 7])
  def test_drafter_equals_target(self, self_model, base_model, params, gamma):
    same = {'target': params['target'], 'drafter': params['target']}
    batch = _batch(seed=10 + gamma)
    base, _ = base_model.compile_predict({'temperature': 0.0})(same, batch)
    spec, aux = self_model.compile_predict(
        {'temperature': 0.0, 'gamma': gamma, 'return_stats': True})(same, batch)
    np.testing.assert_array_equal(spec, base)
    stats = jax.tree_util.tree_map(np.asarray, aux['stats'])
    np.testing.assert_array_equal(stats['accepted'], stats['judged'])
    # Tokens per target call is γ+1 except for the last, partial call.
    emitted, calls = stats['emitted'], stats['target_calls']
    np.testing.assert_array_equal(calls, -(-emitted // (gamma + 1)))

  def test_prompts_and_step_limits(self, spec_model, base_model, params):
    batch = _batch(seed=3, prompts=True)
    for decoder_params in ({'temperature': 0.0},
                           {'temperature': 0.0, 'max_decode_steps': 5}):
      base, _ = base_model.compile_predict(
          decoder_params, prompt_with_targets=True)(params, batch)
      spec, _ = spec_model.compile_predict(
          dict(decoder_params, gamma=3),
          prompt_with_targets=True)(params, batch)
      np.testing.assert_array_equal(spec, base)
    # The prompts are kept at the start of each decode.
    dec = np.asarray(batch['decoder_input_tokens'])
    for b in range(dec.shape[0]):
      n = b % 3
      np.testing.assert_array_equal(np.asarray(spec)[b, :n], dec[b, 1:1 + n])

  def test_num_decodes_all_identical_at_argmax(self, spec_model, params):
    batch = _batch(batch=2)
    decodes, aux = spec_model.compile_predict(
        {'temperature': 0.0, 'gamma': 2}, num_decodes=3,
        return_all_decodes=True)(params, batch)
    assert decodes.shape == (2, 3, 12) and aux['scores'].shape == (2, 3)
    np.testing.assert_array_equal(decodes[:, 0], decodes[:, 2])


class TestScores:

  def test_sampled_log_probs_equal_teacher_forced_scores(
      self, spec_model, base_model, params):
    # The log-probability the decode loops accumulate (from cached multi-token
    # calls) equals the network's teacher-forced log-likelihood of the output.
    batch = _batch(seed=4)
    dp = {'temperature': 1.0, 'topk': 0}
    for model, extra in ((base_model, {}), (spec_model, {'gamma': 3})):
      decodes, aux = model.compile_predict(dict(dp, **extra))(
          params, batch, jax.random.PRNGKey(2))
      targets = np.asarray(decodes)
      eos_pos = np.where(np.any(targets == EOS, -1),
                         np.argmax(targets == EOS, -1), targets.shape[1] - 1)
      valid = np.arange(targets.shape[1])[None] <= eos_pos[:, None]
      # A sampled 0 is a real token here; T5's masks read 0 as padding, so the
      # mask tokens are 1 on every generated position instead.
      logits = model.module.apply(
          {'params': params['target']}, batch['encoder_input_tokens'],
          jnp.asarray(np.pad(targets, ((0, 0), (1, 0)))[:, :-1]),
          jnp.asarray(valid, jnp.int32), enable_dropout=False)
      token_logp = np.take_along_axis(
          np.asarray(jax.nn.log_softmax(logits)), targets[..., None], -1)[..., 0]
      np.testing.assert_allclose(np.sum(token_logp * valid, -1), aux['scores'],
                                 rtol=1e-4, atol=1e-4)

  def test_score_batch(self, base_model, params):
    batch = _batch(seed=5)
    targets = jnp.asarray(np.random.RandomState(0).randint(2, VOCAB, (6, 12)))
    targets = targets.at[:, 9:].set(0)
    batch['decoder_target_tokens'] = targets
    batch['decoder_input_tokens'] = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
    logits = base_model.module.apply(
        {'params': params['target']}, batch['encoder_input_tokens'],
        batch['decoder_input_tokens'], targets, enable_dropout=False)
    expected = jnp.sum(jnp.take_along_axis(
        jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
                       * (targets > 0), -1)
    np.testing.assert_allclose(base_model.score_batch(params, batch), expected,
                               rtol=1e-6)
    weights = (targets > 0).at[:, 0].set(False).astype(jnp.float32)
    batch['decoder_loss_weights'] = weights
    assert np.all(base_model.score_batch(params, batch) > expected)


def _recording_decode_fn(calls, speculative):
  """A decode fn that records its keyword arguments and decodes zeros (one per row)."""

  def decode(**kwargs):
    calls.append(kwargs)
    rows, length = kwargs['inputs'].shape
    decodes, scores = jnp.zeros((rows, 1, length), jnp.int32), jnp.zeros((rows, 1))
    if speculative:
      return decoding.SpeculativeOutput(decodes, scores, {'emitted': jnp.ones((rows, 1), jnp.int32)})
    return decodes, scores

  return decoding.declare_kind(decoding.SPECULATIVE)(decode) if speculative else decode


class TestDecodeFnKinds:
  """The model calls its decode_fn by its declared kind (`decoding.kind_of`)."""

  def test_undeclared_is_t5x_autoregressive(self, params):
    calls = []
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(TARGET_CFG), None, decode_fn=_recording_decode_fn(calls, False))
    decodes, aux = model.predict_batch_with_aux(
        params, _batch(), decoder_params={'return_stats': True}, constrain_cache=lambda c: c)
    assert 'draft_tokens_to_logits' not in calls[0] and 'return_stats' not in calls[0]
    assert 'shrink_batch' not in calls[0]  # T5X's decode functions do not take it
    assert decodes.shape == (6, 12) and set(aux) == {'scores'}

  def test_declared_speculative_gets_the_drafter_and_returns_stats(self, params):
    calls = []
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(TARGET_CFG), network.Transformer(DRAFTER_CFG),
        decode_fn=_recording_decode_fn(calls, True))
    _, aux = model.predict_batch_with_aux(params, _batch(), constrain_cache=lambda c: c)
    assert 'draft_tokens_to_logits' in calls[0] and 'draft_cache' in calls[0]
    assert calls[0]['shrink_batch'] is False  # a sharded batch keeps its shape
    np.testing.assert_array_equal(aux['stats']['emitted'], np.ones(6))

  def test_speculative_without_stats_has_no_stats_entry(self, spec_model, params):
    decodes, aux = spec_model.predict_batch_with_aux(params, _batch(), decoder_params={
        'temperature': 0.0, 'gamma': 2})
    assert decodes.shape == (6, 12) and set(aux) == {'scores'}

  def test_a_partial_keeps_its_kind(self):
    with pytest.raises(ValueError, match='drafter_module'):
      models.SpeculativeEncoderDecoderModel(
          network.Transformer(TARGET_CFG), None,
          decode_fn=functools.partial(decoding.speculative_sample, gamma=3))


class TestValidation:

  def test_vocab_mismatch(self):
    with pytest.raises(ValueError, match='Vocabulary mismatch'):
      models.SpeculativeEncoderDecoderModel(
          network.Transformer(TARGET_CFG),
          network.Transformer(network.t5_1_1_config('tiny', vocab_size=VOCAB + 1)))

  def test_speculative_needs_drafter(self):
    with pytest.raises(ValueError, match='drafter_module'):
      models.SpeculativeEncoderDecoderModel(network.Transformer(TARGET_CFG), None)

  def test_output_vocabulary_larger_than_network(self):
    with pytest.raises(ValueError, match='output_vocabulary'):
      models.SpeculativeEncoderDecoderModel(
          network.Transformer(TARGET_CFG), network.Transformer(DRAFTER_CFG),
          output_vocabulary=_Vocabulary(VOCAB + 5, eos_id=1))

  def test_batch_errors(self, params):
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(TARGET_CFG), network.Transformer(DRAFTER_CFG),
        max_input_length=8, max_decode_length=10)
    predict = model.compile_predict({'temperature': 0.0, 'gamma': 2})
    with pytest.raises(ValueError, match='max_input_length'):
      predict(params, _batch(input_len=9, target_len=10))
    with pytest.raises(ValueError, match='max_decode_length'):
      predict(params, _batch(input_len=8, target_len=12))
    with pytest.raises(ValueError, match='decoder_input_tokens'):
      predict(params, {'encoder_input_tokens': jnp.ones((2, 8), jnp.int32)})
    bad = _batch(input_len=8, target_len=10)
    bad['encoder_input_tokens'] = bad['encoder_input_tokens'].at[0, 0].set(VOCAB)
    with pytest.raises(ValueError, match='outside'):
      predict(params, bad)

  @pytest.mark.parametrize('key, shape', [
      ('encoder_input_tokens', (6, 0)), ('encoder_input_tokens', (0, 9)),
      ('decoder_input_tokens', (6, 0))])
  def test_empty_features_are_refused(self, spec_model, params, key, shape):
    batch = dict(_batch(), **{key: jnp.zeros(shape, jnp.int32)})
    if shape[0] == 0:
      batch['decoder_input_tokens'] = jnp.zeros((0, 12), jnp.int32)
    want = rf'{key} is empty \(shape \({shape[0]}, {shape[1]}\)\)'
    with pytest.raises(ValueError, match=want):
      spec_model.compile_predict({'temperature': 0.0, 'gamma': 2})(params, batch)
    with pytest.raises(ValueError, match=want):  # also under the caller's jit
      jax.jit(lambda p, b: spec_model.predict_batch_with_aux(p, b))(params, batch)

  def test_out_of_vocabulary_ids_fail_under_the_callers_jit(self, spec_model, params):
    """Traced ids cannot be checked eagerly: the check is compiled in."""
    decoder_params = {'temperature': 0.0, 'gamma': 2}
    predict = jax.jit(lambda p, b: spec_model.predict_batch_with_aux(
        p, b, decoder_params=decoder_params))
    # compile_predict called inside another jit checks the same way.
    outer = jax.jit(spec_model.compile_predict(decoder_params))
    good = _batch()
    decodes, _ = predict(params, good)
    want, _ = spec_model.compile_predict(decoder_params)(params, good)
    np.testing.assert_array_equal(decodes, want)
    np.testing.assert_array_equal(outer(params, good)[0], want)
    for key in ('encoder_input_tokens', 'decoder_input_tokens'):
      for bad_id in (VOCAB, -1):  # just past the vocabulary, and negative
        bad = dict(good, **{key: good[key].at[1, 2].set(bad_id)})
        for fn in (predict, outer):
          with pytest.raises(Exception, match=rf'{key} holds ids outside \[0, {VOCAB}\) '
                             r'\(checked inside the compiled function\)'):
            jax.block_until_ready(fn(params, bad))

  def test_compile_predict_checks_ids_eagerly_not_in_the_graph(self, spec_model, params):
    batch = _batch()
    lower = lambda **kw: jax.jit(lambda p, b: spec_model.predict_batch_with_aux(
        p, b, **kw)).lower(params, batch).as_text()
    assert 'callback' in lower()
    assert 'callback' not in lower(check_traced_ids=False)

  def test_short_cache_is_refused(self, params):
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(TARGET_CFG), network.Transformer(DRAFTER_CFG))
    batch = _batch(target_len=8)
    cache, fn = model.decoder_fns(model.module, params['target'],
                                   batch['encoder_input_tokens'], 6)
    draft_cache, draft_fn = model.decoder_fns(
        model.drafter_module, params['drafter'], batch['encoder_input_tokens'], 8)
    with pytest.raises(ValueError, match='max_decode_length >= 8'):
      decoding.speculative_sample(jnp.zeros((6, 8), jnp.int32), cache, fn,
                                  draft_cache, draft_fn, eos_id=EOS, gamma=2)

  def test_bad_decoder_params(self, spec_model, params):
    with pytest.raises(ValueError, match='gamma'):
      spec_model.compile_predict({'temperature': 0.0, 'gamma': 0})(params, _batch())
    with pytest.raises(ValueError, match='temperature'):
      spec_model.compile_predict({'temperature': -1.0})(params, _batch())


class TestFeatureHeadAndTrimmedDrafts:
  """A feature head or a trimmed T5 drafter through the model: the target's greedy outputs."""

  HEAD_CFG = feature_drafter.FeatureHeadConfig(
      feature_dim=TARGET_CFG.emb_dim, vocab_size=VOCAB, width=16, num_layers=1, num_heads=2,
      head_dim=8, mlp_dim=32)

  def _feature_model(self, **kwargs):
    return models.SpeculativeEncoderDecoderModel(
        network.Transformer(TARGET_CFG), feature_drafter.FeatureHead(self.HEAD_CFG), **kwargs)

  @pytest.mark.parametrize('trimmed', [False, True])
  def test_feature_head_greedy_identity(self, base_model, params, trimmed):
    ids = np.arange(0, VOCAB, 2) if trimmed else None
    model = self._feature_model(draft_vocab_ids=ids)
    fparams = {'target': params['target'],
               'drafter': model.get_initial_params(jax.random.PRNGKey(4))['drafter']}
    batch = _batch(seed=21, prompts=True)
    base, base_aux = base_model.compile_predict({'temperature': 0.0})(params, batch)
    spec, aux = model.compile_predict(
        {'temperature': 0.0, 'gamma': 3, 'return_stats': True})(fparams, batch)
    np.testing.assert_array_equal(spec, base)
    np.testing.assert_array_equal(aux['scores'], base_aux['scores'])
    sampled, _ = model.compile_predict({'temperature': 1.0, 'topk': 0, 'gamma': 3})(
        fparams, batch, jax.random.PRNGKey(0))
    assert sampled.shape == base.shape

  def test_trimmed_t5_drafter_greedy_identity(self, spec_model, base_model, params):
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(TARGET_CFG), network.Transformer(DRAFTER_CFG),
        draft_vocab_ids=np.arange(1, VOCAB, 3))
    batch = _batch(seed=22)
    base, _ = base_model.compile_predict({'temperature': 0.0})(params, batch)
    spec, aux = model.compile_predict({'temperature': 0.0, 'gamma': 2, 'return_stats': True})(
        params, batch)
    np.testing.assert_array_equal(spec, base)

  @pytest.mark.parametrize('head', [False, True])
  def test_draft_projection_sliced_once(self, params, head):
    """Params carrying the sliced projection decode as slicing in the decode does, and it is what is read."""
    ids = np.arange(1, VOCAB, 3)
    if head:
      model = self._feature_model(draft_vocab_ids=ids)
      params = {'target': params['target'],
                'drafter': model.get_initial_params(jax.random.PRNGKey(4))['drafter']}
    else:
      model = models.SpeculativeEncoderDecoderModel(
          network.Transformer(TARGET_CFG), network.Transformer(DRAFTER_CFG), draft_vocab_ids=ids)
    prepared = model.with_draft_projection(params)
    # A T5 drafter reads its own projection's K columns; the (narrower) head its kernel folded into the
    # target's.
    entry, width = ((models.DRAFT_LOGITS_KERNEL, self.HEAD_CFG.width) if head
                    else (models.DRAFT_PROJECTION, DRAFTER_CFG.emb_dim))
    assert prepared[entry].shape == (width, len(ids))
    assert set(prepared) == set(params) | {entry}
    batch = _batch(seed=23)
    for settings, rng in (({'temperature': 0.0}, None), ({'temperature': 1.0, 'topk': 0}, 5)):
      predict = model.compile_predict(dict(settings, gamma=2, return_stats=True))
      key = None if rng is None else jax.random.PRNGKey(rng)
      want, want_aux = predict(params, batch, key)
      got, got_aux = predict(prepared, batch, key)
      np.testing.assert_array_equal(got, want)
      for name in ('accepted', 'judged'):
        np.testing.assert_array_equal(got_aux['stats'][name], want_aux['stats'][name])
    # A zero projection (every draft logit 0: the first draft-vocabulary token drafted) is read:
    # the drafts change, the greedy output does not.
    zeroed = dict(prepared, **{entry: jnp.zeros_like(prepared[entry])})
    predict = model.compile_predict({'temperature': 0.0, 'gamma': 2, 'return_stats': True})
    want, want_aux = predict(params, batch)
    got, got_aux = predict(zeroed, batch)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got_aux['stats']['accepted'], want_aux['stats']['accepted'])

  def test_no_draft_projection_without_a_draft_vocabulary(self, spec_model, params):
    assert spec_model.with_draft_projection(params) is params

  def test_a_narrow_head_folds_its_whole_vocabulary_once(self, base_model, params):
    """Without a draft vocabulary, a head narrower than the target still gets its [W, V] kernel, and reads it."""
    model = self._feature_model()
    fparams = {'target': params['target'],
               'drafter': model.get_initial_params(jax.random.PRNGKey(4))['drafter']}
    prepared = model.with_draft_projection(fparams)
    assert set(prepared) == set(fparams) | {models.DRAFT_LOGITS_KERNEL}
    assert prepared[models.DRAFT_LOGITS_KERNEL].shape == (self.HEAD_CFG.width, VOCAB)
    batch = _batch(seed=24)
    base, _ = base_model.compile_predict({'temperature': 0.0})(params, batch)
    predict = model.compile_predict({'temperature': 0.0, 'gamma': 2, 'return_stats': True})
    got, got_aux = predict(prepared, batch)
    want, want_aux = predict(fparams, batch)
    np.testing.assert_array_equal(got, base)
    np.testing.assert_array_equal(want, base)
    # The same logits up to float32 reordering: the same drafts kept.
    np.testing.assert_array_equal(got_aux['stats']['accepted'], want_aux['stats']['accepted'])
    zeroed = dict(prepared, **{models.DRAFT_LOGITS_KERNEL: jnp.zeros_like(prepared[models.DRAFT_LOGITS_KERNEL])})
    got, zero_aux = predict(zeroed, batch)
    np.testing.assert_array_equal(got, base)
    assert not np.array_equal(zero_aux['stats']['accepted'], want_aux['stats']['accepted'])

  @pytest.mark.parametrize('trimmed', [False, True])
  def test_the_folded_kernel_samples_as_the_two_maps(self, params, trimmed, monkeypatch):
    """At t = 1 the folded [W, K] kernel gives the draws of the unfolded path (the head's [W, E] map, then the
    target's projection), the same key: equal logits up to float32 rounding draw the same tokens."""
    ids = np.arange(1, VOCAB, 3) if trimmed else None
    model = self._feature_model(draft_vocab_ids=ids)
    fparams = {'target': params['target'],
               'drafter': model.get_initial_params(jax.random.PRNGKey(4))['drafter']}
    batch = _batch(seed=25)
    settings = {'temperature': 1.0, 'topk': 0, 'gamma': 3, 'return_stats': True}
    folded = model.with_draft_projection(fparams)
    assert models.DRAFT_LOGITS_KERNEL in folded
    got, got_aux = model.compile_predict(settings)(folded, batch, jax.random.PRNGKey(6))
    monkeypatch.setattr(feature_decoding, 'folds_projection', lambda config: False)
    unfolded_model = self._feature_model(draft_vocab_ids=ids)
    unfolded = unfolded_model.with_draft_projection(fparams)
    assert models.DRAFT_LOGITS_KERNEL not in unfolded
    want, want_aux = unfolded_model.compile_predict(settings)(unfolded, batch, jax.random.PRNGKey(6))
    np.testing.assert_array_equal(got, want)
    for name in ('accepted', 'judged', 'drafted'):
      np.testing.assert_array_equal(got_aux['stats'][name], want_aux['stats'][name])
    assert 0 < got_aux['stats']['accepted'].sum() < got_aux['stats']['judged'].sum()

  @pytest.mark.parametrize('ids, message', [
      ([3, 2], 'sorted and unique'), ([0, VOCAB], 'outside'), ([], 'non-empty'),
      ([[1, 2]], 'non-empty 1-D')])
  def test_bad_draft_vocab_ids(self, ids, message):
    with pytest.raises(ValueError, match=message):
      models.SpeculativeEncoderDecoderModel(
          network.Transformer(TARGET_CFG), network.Transformer(DRAFTER_CFG),
          draft_vocab_ids=np.asarray(ids, np.int32))

  def test_head_for_another_target_is_refused(self):
    other = feature_drafter.FeatureHeadConfig(feature_dim=TARGET_CFG.emb_dim + 1, vocab_size=VOCAB)
    with pytest.raises(ValueError, match='reads'):
      models.SpeculativeEncoderDecoderModel(network.Transformer(TARGET_CFG),
                                            feature_drafter.FeatureHead(other))

  def test_feature_head_has_no_score_of_its_own(self, params):
    with pytest.raises(ValueError, match='feature head'):
      self._feature_model().score_batch(params, _batch(), which='drafter')
