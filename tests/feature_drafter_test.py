"""Tests for specdec/feature_drafter.py: the head's config and network.

Tiny random T5 targets with random heads check the network: the cached head
against the teacher-forced one, the unrolled training depths against the
cached chain, an attention-free head reading one entry. The tiny target, the
heads and their inputs (`nets`, `_encoder_inputs`, `_teacher_forced`) are
shared with tests/feature_decoding_test.py and tests/training/feature_losses_test.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import feature_drafter as fd
from specdec import network


class TestConfigErrors:

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


def _encoder_inputs(batch, length, seed=5):
  rng = np.random.RandomState(seed)
  enc = rng.randint(2, TARGET.vocab_size, (batch, length)).astype(np.int32)
  for b in range(batch):
    enc[b, length - b % 3:] = 0  # padding of different lengths
  return jnp.asarray(enc)


def _sum_terms_bound(*counts):
  """Tolerance factor for comparing two orderings of the same float32 sums.

  Reordering a float32 sum of n terms changes it by at most about n ulps of
  its scale; the head's output passes through sums of these lengths (attention
  over self and cross positions, and each projection's inputs), so twice their
  total, in units of float32 epsilon times the output's magnitude, bounds the
  difference between a cached and a teacher-forced evaluation.
  """
  return 2 * sum(counts) * np.finfo(np.float32).eps


def _teacher_forced(nets, batch=2, length=7, input_len=6):
  """A teacher-forced batch on random targets: (batch, encoded, the target's features, embedded inputs)."""
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


class TestHead:

  def _tolerance(self, nets, reference, length, input_len):
    head = nets[2].config
    scale = float(np.abs(np.asarray(reference)).max())
    return _sum_terms_bound(length, input_len, 2 * head.feature_dim, head.width, head.mlp_dim,
                            head.num_heads * head.head_dim) * scale * head.num_layers

  def test_cached_chain_equals_the_unrolled_depths(self, nets):
    """Depth s of `unrolled` at position t is the (s+1)-th draft of a round that began at t-s."""
    _, _, head, head_params = nets
    batch_, encoded, features, embedded = _teacher_forced(nets)
    enc = batch_['encoder_input_tokens']
    length = features.shape[1]
    valid = batch_['decoder_target_tokens'] > 0
    cross = network.pairwise_mask(valid, enc > 0)
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
    batch_, encoded, features, embedded = _teacher_forced(nets)
    valid = batch_['decoder_target_tokens'] > 0
    cross = network.pairwise_mask(valid, batch_['encoder_input_tokens'] > 0)
    causal = jnp.tril(jnp.ones((valid.shape[1],) * 2, bool))[None, None]
    self_mask = causal & network.pairwise_mask(valid, valid)
    shifted = fd.shift_features_right(features)
    full = head.apply({'params': head_params}, shifted, embedded, encoded, self_mask, cross)
    (depth0,) = head.apply({'params': head_params}, shifted, embedded, encoded, valid, cross, 1,
                           method=head.unrolled)
    np.testing.assert_allclose(full, depth0, rtol=0,
                               atol=self._tolerance(nets, full, valid.shape[1], cross.shape[-1]))

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
