"""The T5 1.1 encoder-decoder Transformer in Flax linen, with a k-token cache.

The parameter tree, initialisers and numerics follow T5X's
`t5x/examples/t5/network.py`, so T5X checkpoints load unchanged. Decoding
differs: T5X's cached attention takes one token per call with one cache index
for the whole batch, while speculative decoding verifies k >= 1 tokens per
call at per-row positions. So the decoder has its own cache API:

    _, variables = model.apply(
        {'params': params}, encoded, encoder_input_tokens, max_decode_length,
        method=Transformer.init_cache, mutable=['cache'])
    logits_bkv, variables = model.apply(
        {'params': params, 'cache': variables['cache']}, tokens_bk,
        positions_b, method=Transformer.decode_step, mutable=['cache'])

Cache layout (every leaf has the batch as axis 0):

    decoder/encoder_mask                                [B, S]        bool
    decoder/layers_{i}/self_attention/cached_key        [B, L, H, D]  dtype
    decoder/layers_{i}/self_attention/cached_value      [B, L, H, D]  dtype
    decoder/layers_{i}/encoder_decoder_attention/encoded_key    [B, S, H, D]
    decoder/layers_{i}/encoder_decoder_attention/encoded_value  [B, S, H, D]

L = max_decode_length, S = encoder length, H = num_heads, D = head_dim, dtype
= config.dtype; encoder_mask is `encoder_input_tokens > 0`. Their logical
axis names (for sharding, see partitioning.py): CACHE_LOGICAL_AXES.

Shape suffixes: b batch, s encoder length, t decoder length, k tokens in a
decode step, l cache length, h heads, d head_dim, e emb_dim, v vocab.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec.draft_tree import SlotLayout

Array = jax.Array
Initializer = Callable[..., Array]

# Masked attention logits are replaced by this (T5X adds it: same softmax).
# Finite, so a fully masked row (a padding query) gives no NaN.
_MASKED_LOGIT = -1e10

# -----------------------------------------------------------------------------
# Activation layout
# -----------------------------------------------------------------------------

# T5X pins activations to logical axes (batch, length, embed / mlp / heads)
# with sharding constraints. Without them, XLA's sharding propagation follows
# 2-D (embed-sharded) weights and contracts matmuls over the weights' sharded
# embed axis, holding the whole batch's activations on every chip and summing
# them by all-reduces. The constraints apply only inside `activation_layout`
# (the trainer's step); elsewhere `constrain` is the identity, so decoding
# and single-device programs are unchanged.
_ACTIVATION_LAYOUT: contextvars.ContextVar = contextvars.ContextVar(
    'activation_layout', default=None)

BATCH_LENGTH_EMBED = ('batch', 'length', 'embed')
BATCH_LENGTH_MLP = ('batch', 'length', 'mlp')
BATCH_LENGTH_HEADS_KV = ('batch', 'length', 'heads', 'kv')
BATCH_LENGTH_VOCAB = ('batch', 'length', 'vocab')


@contextlib.contextmanager
def activation_layout(mesh: Any, rules: Sequence[tuple]):
  """Within it (at trace time), activations are constrained to T5X's logical axes on `mesh` by `rules`."""
  token = _ACTIVATION_LAYOUT.set((mesh, tuple(rules)))
  try:
    yield
  finally:
    _ACTIVATION_LAYOUT.reset(token)


def constrain(x: Array, logical_axes: tuple) -> Array:
  """`x` constrained to `logical_axes` inside `activation_layout`; else `x` itself."""
  layout = _ACTIVATION_LAYOUT.get()
  if layout is None:
    return x
  mesh, rules = layout
  return nn.with_logical_constraint(x, logical_axes, rules=rules, mesh=mesh)


# -----------------------------------------------------------------------------
# Config
# -----------------------------------------------------------------------------

_POSITIVE_INT_FIELDS = (
    'vocab_size', 'emb_dim', 'num_heads', 'num_encoder_layers',
    'num_decoder_layers', 'head_dim', 'mlp_dim',
    'relative_attention_num_buckets', 'relative_attention_max_distance')


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of a T5 1.1 network; names follow T5X's T5Config.

  `dtype` is the activation dtype (a dtype or its name, e.g. 'bfloat16' as
  in T5X gin files). Parameters are always float32; layer norms, attention
  logits/softmax and the output logits are computed in float32.
  """
  vocab_size: int
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ('gelu', 'linear')
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128

  def __post_init__(self):
    for name in _POSITIVE_INT_FIELDS:
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
          or value <= 0):
        raise ValueError(
            f'T5Config.{name} must be a positive integer, got {value!r}.')
    # Bidirectional tables have two halves, each with exact and log buckets.
    num_buckets = self.relative_attention_num_buckets
    if num_buckets < 4 or num_buckets % 2:
      raise ValueError('T5Config.relative_attention_num_buckets must be an '
                       f'even integer >= 4, got {num_buckets!r}.')
    if self.relative_attention_max_distance <= num_buckets // 2:
      raise ValueError(
          'T5Config.relative_attention_max_distance must exceed '
          'relative_attention_num_buckets // 2 (the exactly bucketed '
          f'distances), got {self.relative_attention_max_distance!r}.')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError('T5Config.dropout_rate must be in [0, 1), got '
                       f'{self.dropout_rate!r}.')
    if isinstance(self.mlp_activations, str) or not self.mlp_activations:
      raise ValueError('T5Config.mlp_activations must be a non-empty sequence '
                       f'of names, got {self.mlp_activations!r}.')
    for act in self.mlp_activations:
      if act != 'linear' and not callable(getattr(nn, str(act), None)):
        raise ValueError(
            f'T5Config.mlp_activations: unknown activation {act!r} (use '
            "'linear' or a flax.linen function name such as 'gelu').")
    try:
      dtype = jnp.dtype(self.dtype)
    except TypeError as e:
      raise ValueError(f'T5Config.dtype: not a dtype: {self.dtype!r}.') from e
    if not jnp.issubdtype(dtype, jnp.floating):
      raise ValueError(
          f'T5Config.dtype must be a floating dtype, got {self.dtype!r}.')
    # Normalised so that 'bfloat16' (gin) and jnp.bfloat16 compare equal.
    object.__setattr__(self, 'dtype', dtype)
    object.__setattr__(self, 'mlp_activations', tuple(self.mlp_activations))


_VOCAB = 32128  # 32000 pieces + 100 extra ids, padded to a multiple of 128.


def _sizes(emb_dim, num_heads, num_layers, mlp_dim, head_dim=64,
           vocab_size=_VOCAB):
  return T5Config(vocab_size=vocab_size, emb_dim=emb_dim, num_heads=num_heads,
                  head_dim=head_dim, num_encoder_layers=num_layers,
                  num_decoder_layers=num_layers, mlp_dim=mlp_dim)


# T5X's t5_1_1/*.gin sizes (PAPER.md, "T5 1.1 sizes"). Those gin files also set
# dtype='bfloat16'; here dtype stays float32 unless overridden.
PRESETS: Mapping[str, T5Config] = {
    'small': _sizes(emb_dim=512, num_heads=6, num_layers=8, mlp_dim=1024),
    'base': _sizes(emb_dim=768, num_heads=12, num_layers=12, mlp_dim=2048),
    'large': _sizes(emb_dim=1024, num_heads=16, num_layers=24, mlp_dim=2816),
    'xl': _sizes(emb_dim=2048, num_heads=32, num_layers=24, mlp_dim=5120),
    'xxl': _sizes(emb_dim=4096, num_heads=64, num_layers=24, mlp_dim=10240),
    # For tests and CPU experiments.
    'tiny': _sizes(emb_dim=32, num_heads=4, num_layers=2, mlp_dim=64,
                   head_dim=8, vocab_size=128),
}


def t5_1_1_config(name: str, **overrides) -> T5Config:
  """Preset `name` (tiny, small, base, large, xl, xxl) with `overrides`."""
  if name not in PRESETS:
    raise ValueError(f'Unknown T5 1.1 preset {name!r}; valid names: '
                     f'{sorted(PRESETS)}.')
  return dataclasses.replace(PRESETS[name], **overrides)


# -----------------------------------------------------------------------------
# Helpers
# -----------------------------------------------------------------------------


def _dropout(module: nn.Module, x: Array, rate: float, deterministic: bool,
             broadcast_dims: Sequence[int] = ()) -> Array:
  """Inverted dropout with the 'dropout' rng; one mask along broadcast_dims.

  T5X broadcasts its masks along the length axis (-2).
  """
  if deterministic or rate == 0.0:
    return x
  mask_shape = list(x.shape)
  for dim in broadcast_dims:
    mask_shape[dim] = 1
  keep = jax.random.bernoulli(module.make_rng('dropout'), 1.0 - rate,
                              mask_shape)
  return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def pairwise_mask(query_valid_bq: Array, key_valid_bk: Array) -> Array:
  """[B, 1, q, k] mask: query and key both valid."""
  return query_valid_bq[:, None, :, None] & key_valid_bk[:, None, None, :]


def same_segment_mask(query_segments_bq: Array,
                      key_segments_bk: Array) -> Array:
  """[B, 1, q, k] mask: query and key in the same packed segment."""
  return (query_segments_bq[:, None, :, None] ==
          key_segments_bk[:, None, None, :])


def _relative_position_bucket_table(bidirectional: bool, num_buckets: int,
                                    max_distance: int) -> np.ndarray:
  """T5's bucket of each relative position r = key - query, at r + max_distance.

  Covers r in [-max_distance, max_distance]. Small distances (below half the
  buckets of a direction) get one bucket each, larger ones log-spaced buckets,
  and all |r| >= max_distance share the last bucket, so clipping r to
  +-max_distance before the lookup is exact. Unidirectional: every key in the
  future (r > 0) is in bucket 0. Computed once, in numpy float32 as T5X, so
  the teacher-forced and the cached paths use the very same buckets.
  """
  relative_position = np.arange(-max_distance, max_distance + 1, dtype=np.int32)
  distance = -relative_position  # > 0: the key is in the query's past.
  bucket = np.zeros_like(distance)
  if bidirectional:
    num_buckets //= 2
    bucket += (distance < 0).astype(np.int32) * num_buckets  # Future keys.
    distance = np.abs(distance)
  else:
    distance = np.maximum(distance, 0)
  max_exact = num_buckets // 2
  eps = np.finfo(np.float32).eps
  log_ratio = (np.log(distance.astype(np.float32) / np.float32(max_exact) + eps)
               / np.float32(np.log(max_distance / max_exact)))
  log_bucket = max_exact + (
      log_ratio * np.float32(num_buckets - max_exact)).astype(np.int32)
  log_bucket = np.minimum(log_bucket, num_buckets - 1)
  return bucket + np.where(distance < max_exact, distance, log_bucket)


# -----------------------------------------------------------------------------
# Layers
# -----------------------------------------------------------------------------


# Up to ROWWISE_MAX_ROWS rows, `x @ kernel` with a large kernel can run as one
# matrix-vector product per row, which also makes a k-token call's projections
# bitwise equal to k one-token calls'. Whether it is faster depends on the CPU's
# gemm for a handful of rows: on one 2-core EPYC VM a 5-token verify call fell
# from 2.5x to 1.9x a 1-token call with it; on another it rose from 1.76x to
# 2.27x (scripts/target_sizes.py, results/target_sizes/). So it is off by
# default (XLA's own dot) and switched on per machine, after measuring, with
# SPECDEC_ROWWISE_MAX_ROWS=8 (read when a model is traced). Small kernels keep
# one dot: there the extra kernels only cost compile time.
ROWWISE_MAX_ROWS = int(os.environ.get('SPECDEC_ROWWISE_MAX_ROWS', '0'))
ROWWISE_MIN_KERNEL_SIZE = 1 << 16


def _project(x_xe: Array, kernel_en: Array) -> Array:
  """x [..., E] @ kernel [E, N] -> [..., N]."""
  rows = math.prod(x_xe.shape[:-1])
  if rows <= 1 or rows > ROWWISE_MAX_ROWS or kernel_en.size < ROWWISE_MIN_KERNEL_SIZE:
    return jnp.dot(x_xe, kernel_en)
  x_re = x_xe.reshape(rows, x_xe.shape[-1])
  y_rn = jnp.concatenate([x_re[r:r + 1] @ kernel_en for r in range(rows)], axis=0)
  return y_rn.reshape(x_xe.shape[:-1] + (kernel_en.shape[-1],))


def project_rows(features_xe: Array, kernel_ek: Array) -> Array:
  """Logits [..., K] float32 of features [..., E] through a sliced projection kernel [E, K]."""
  return _project(features_xe.astype(jnp.float32), kernel_ek)


class DenseGeneral(nn.Module):
  """Bias-free linear map of the last `num_input_axes` axes to `features`.

  The kernel is stored 2-D, (prod(input dims), prod(features)), as T5X stores
  it, so checkpoints and fan-in initialisers match.
  """
  features: tuple[int, ...]
  kernel_axes: tuple[str, str]
  num_input_axes: int = 1
  dtype: Any = jnp.float32
  kernel_init: Initializer = nn.initializers.variance_scaling(
      1.0, 'fan_in', 'truncated_normal')

  @nn.compact
  def __call__(self, x: Array) -> Array:
    batch_shape = x.shape[:-self.num_input_axes]
    input_shape = x.shape[-self.num_input_axes:]
    kernel = self.param(
        'kernel',
        nn.with_logical_partitioning(self.kernel_init, self.kernel_axes),
        (math.prod(input_shape), math.prod(self.features)), jnp.float32)
    x = jnp.reshape(x.astype(self.dtype), batch_shape + (-1,))
    y = _project(x, kernel.astype(self.dtype))
    return jnp.reshape(y, batch_shape + tuple(self.features))


class RmsNorm(nn.Module):
  """T5 layer norm: divide by the root-mean-square (float32, eps 1e-6), scale.

  No mean subtraction and no bias.
  """
  dtype: Any = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = x.astype(jnp.float32)
    mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = (x * jax.lax.rsqrt(mean_square + self.epsilon)).astype(self.dtype)
    scale = self.param(
        'scale', nn.with_logical_partitioning(nn.initializers.ones, ('embed',)),
        (x.shape[-1],), jnp.float32)
    return y * scale.astype(self.dtype)


class Embed(nn.Module):
  """Token embedding shared by encoder and decoder; `attend` for tied logits."""
  config: T5Config

  def setup(self):
    cfg = self.config
    init = nn.initializers.normal(stddev=1.0)
    self.embedding = self.param(
        'embedding', nn.with_logical_partitioning(init, ('vocab', 'embed')),
        (cfg.vocab_size, cfg.emb_dim), jnp.float32)

  def __call__(self, tokens: Array) -> Array:
    """[...] int -> [..., E] in config.dtype."""
    embedded = jnp.take(self.embedding, tokens.astype(jnp.int32), axis=0)
    return embedded.astype(self.config.dtype)

  def attend(self, x: Array) -> Array:
    """[..., E] -> [..., V] float32: dot products with every embedding."""
    return _project(x.astype(jnp.float32), self.embedding.T)


class RelativePositionBias(nn.Module):
  """Bucketed relative position bias; one (heads, buckets) table a stack."""
  config: T5Config
  bidirectional: bool

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array) -> Array:
    """Bias [..., H, q, k] f32 for absolute positions [..., q], [..., k]."""
    cfg = self.config
    max_distance = cfg.relative_attention_max_distance
    table = _relative_position_bucket_table(
        self.bidirectional, cfg.relative_attention_num_buckets, max_distance)
    relative_position = (key_positions[..., None, :] -
                         query_positions[..., :, None])
    bucket = jnp.asarray(table)[
        jnp.clip(relative_position, -max_distance, max_distance) +
        max_distance]
    init = nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform')
    rel_embedding = self.param(
        'rel_embedding',
        nn.with_logical_partitioning(init, ('heads', 'relpos_buckets')),
        (cfg.num_heads, cfg.relative_attention_num_buckets), jnp.float32)
    # A gather rather than T5X's one-hot matmul: the same values, and not
    # rounded by reduced-precision matmuls.
    bias = jnp.take(rel_embedding.T, bucket, axis=0)  # [..., q, k, H]
    return jnp.moveaxis(bias, -1, -3)


class MlpBlock(nn.Module):
  """Gated MLP wo(act_0(wi_0 x) * act_1(wi_1 x)); T5 1.1: ('gelu', 'linear')."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    dense = functools.partial(DenseGeneral, dtype=cfg.dtype)
    hidden = None
    for i, act in enumerate(cfg.mlp_activations):
      name = 'wi' if len(cfg.mlp_activations) == 1 else f'wi_{i}'
      h = dense((cfg.mlp_dim,), ('embed', 'mlp'), name=name)(x)
      # nn.gelu is the tanh approximation, as T5X uses it.
      h = h if act == 'linear' else getattr(nn, act)(h)
      hidden = h if hidden is None else hidden * h
    hidden = _dropout(self, hidden, cfg.dropout_rate, deterministic,
                      broadcast_dims=(-2,))
    hidden = constrain(hidden, BATCH_LENGTH_MLP)
    return dense((x.shape[-1],), ('mlp', 'embed'), name='wo')(hidden)


class MultiHeadAttention(nn.Module):
  """Multi-head dot-product attention with T5's conventions.

  No 1/sqrt(head_dim) on the logits: T5 folds it into the query initialiser
  (stddev (emb_dim * head_dim)**-0.5). Logits and softmax in float32. Masks
  are boolean, broadcastable to [B, H, q, k].
  """
  config: T5Config

  def setup(self):
    cfg = self.config
    kernel_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'normal')
    query_init = lambda *a: kernel_init(*a) / math.sqrt(cfg.head_dim)
    project = functools.partial(
        DenseGeneral, features=(cfg.num_heads, cfg.head_dim),
        kernel_axes=('embed', 'joined_kv'), dtype=cfg.dtype)
    self.query = project(kernel_init=query_init)
    self.key = project(kernel_init=kernel_init)
    self.value = project(kernel_init=kernel_init)
    self.out = DenseGeneral(
        features=(cfg.emb_dim,), kernel_axes=('joined_kv', 'embed'),
        num_input_axes=2, dtype=cfg.dtype, kernel_init=kernel_init)

  def attend(self, query_bqhd: Array, key_bkhd: Array, value_bkhd: Array,
             mask: Optional[Array], bias: Optional[Array],
             deterministic: bool) -> Array:
    """Projected queries over projected keys/values, then `out`: [B, q, E]."""
    dtype = self.config.dtype
    logits_bhqk = jnp.einsum('bqhd,bkhd->bhqk', query_bqhd.astype(jnp.float32),
                             key_bkhd.astype(jnp.float32))
    if bias is not None:
      logits_bhqk = logits_bhqk + bias.astype(jnp.float32)
    if mask is not None:
      logits_bhqk = jnp.where(mask, logits_bhqk, _MASKED_LOGIT)
    weights_bhqk = jax.nn.softmax(logits_bhqk).astype(dtype)
    # As T5X: one dropout mask for all queries.
    weights_bhqk = _dropout(self, weights_bhqk, self.config.dropout_rate,
                            deterministic, broadcast_dims=(-2,))
    x_bqhd = jnp.einsum('bhqk,bkhd->bqhd', weights_bhqk,
                        value_bkhd.astype(dtype))
    x_bqhd = constrain(x_bqhd, BATCH_LENGTH_HEADS_KV)
    return constrain(self.out(x_bqhd), BATCH_LENGTH_EMBED)

  def __call__(self, inputs_q: Array, inputs_kv: Array, mask: Optional[Array],
               bias: Optional[Array], deterministic: bool) -> Array:
    """Queries [B, q, E] attend to keys/values [B, k, E] -> [B, q, E]."""
    project = lambda dense, x: constrain(dense(x), BATCH_LENGTH_HEADS_KV)
    return self.attend(project(self.query, inputs_q),
                       project(self.key, inputs_kv),
                       project(self.value, inputs_kv), mask, bias,
                       deterministic)


class CachedSelfAttention(MultiHeadAttention):
  """Decoder self-attention that can also decode k tokens a row from a cache."""

  def init_cache(self, batch: int, length: int):
    cfg = self.config
    shape = (batch, length, cfg.num_heads, cfg.head_dim)
    self.put_variable('cache', 'cached_key', jnp.zeros(shape, cfg.dtype))
    self.put_variable('cache', 'cached_value', jnp.zeros(shape, cfg.dtype))

  def cache_length(self) -> int:
    return self.get_variable('cache', 'cached_key').shape[1]

  def decode_step(self, x_bke: Array, positions_bk: Array, bias_bhkl: Array,
                  deterministic: bool, layout: Optional[SlotLayout] = None) -> Array:
    """Writes k keys/values at positions_bk, attends causally by position.

    Writes outside [0, L) are dropped, never clamped or wrapped. A query at
    position t sees cache positions <= t only, so what earlier calls left
    beyond t (rejected drafts) is ignored; positions below the first new one
    must hold the prefix (the caller's job). With a `layout` (draft trees)
    the keys/values go to its slots and each query attends where it says.
    """
    cached_key = self.get_variable('cache', 'cached_key')
    cached_value = self.get_variable('cache', 'cached_value')
    batch, length = cached_key.shape[:2]
    slots_bk = positions_bk if layout is None else layout.slots_bk
    # Negative indices wrap even with mode='drop': move them past the end.
    write_bk = jnp.where(slots_bk < 0, length, slots_bk)
    rows_b1 = jnp.arange(batch)[:, None]
    cached_key = cached_key.at[rows_b1, write_bk].set(
        self.key(x_bke).astype(cached_key.dtype), mode='drop')
    cached_value = cached_value.at[rows_b1, write_bk].set(
        self.value(x_bke).astype(cached_value.dtype), mode='drop')
    self.put_variable('cache', 'cached_key', cached_key)
    self.put_variable('cache', 'cached_value', cached_value)
    if layout is None:
      attend_bkl = jnp.arange(length)[None, None, :] <= positions_bk[:, :, None]
    else:
      attend_bkl = layout.attend_bkl
    return self.attend(self.query(x_bke), cached_key, cached_value,
                       attend_bkl[:, None], bias_bhkl, deterministic)


class CachedCrossAttention(MultiHeadAttention):
  """Encoder-decoder attention; encoder key/value projections made once."""

  def init_cache(self, encoded_bse: Array):
    self.put_variable('cache', 'encoded_key', self.key(encoded_bse))
    self.put_variable('cache', 'encoded_value', self.value(encoded_bse))

  def decode_step(self, x_bke: Array, mask: Array,
                  deterministic: bool) -> Array:
    """Attends to the cached projections; needs no `encoded`."""
    return self.attend(self.query(x_bke),
                       self.get_variable('cache', 'encoded_key'),
                       self.get_variable('cache', 'encoded_value'), mask, None,
                       deterministic)


class EncoderLayer(nn.Module):
  """Pre-norm self-attention and MLP blocks, each with dropout, residual."""
  config: T5Config

  @nn.compact
  def __call__(self, x_bse: Array, mask: Array, bias: Array,
               deterministic: bool) -> Array:
    cfg = self.config
    dropout = functools.partial(_dropout, self, rate=cfg.dropout_rate,
                                deterministic=deterministic,
                                broadcast_dims=(-2,))
    x_bse = constrain(x_bse, BATCH_LENGTH_EMBED)
    h = constrain(RmsNorm(cfg.dtype, name='pre_attention_layer_norm')(x_bse),
                  BATCH_LENGTH_EMBED)
    h = MultiHeadAttention(cfg, name='attention')(h, h, mask, bias,
                                                  deterministic)
    x_bse = constrain(x_bse + dropout(h), BATCH_LENGTH_EMBED)
    h = constrain(RmsNorm(cfg.dtype, name='pre_mlp_layer_norm')(x_bse),
                  BATCH_LENGTH_EMBED)
    return constrain(x_bse + dropout(MlpBlock(cfg, name='mlp')(h, deterministic)),
                     BATCH_LENGTH_EMBED)


class DecoderLayer(nn.Module):
  """Self-attention, encoder-decoder attention and MLP blocks.

  Teacher-forced (`__call__`) or cached (`decode_step`), with one body.
  """
  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = RmsNorm(cfg.dtype)
    self.self_attention = CachedSelfAttention(cfg)
    self.pre_cross_attention_layer_norm = RmsNorm(cfg.dtype)
    self.encoder_decoder_attention = CachedCrossAttention(cfg)
    self.pre_mlp_layer_norm = RmsNorm(cfg.dtype)
    self.mlp = MlpBlock(cfg)

  def _blocks(self, y: Array, self_attend: Callable[[Array], Array],
              cross_attend: Callable[[Array], Array],
              deterministic: bool) -> Array:
    # Shared by both modes, so they do exactly the same arithmetic.
    dropout = functools.partial(_dropout, self, rate=self.config.dropout_rate,
                                deterministic=deterministic,
                                broadcast_dims=(-2,))
    norm = lambda layer_norm, x: constrain(layer_norm(x), BATCH_LENGTH_EMBED)
    y = constrain(y, BATCH_LENGTH_EMBED)
    y = y + dropout(self_attend(norm(self.pre_self_attention_layer_norm, y)))
    y = constrain(y, BATCH_LENGTH_EMBED)
    y = y + dropout(cross_attend(norm(self.pre_cross_attention_layer_norm, y)))
    y = constrain(y, BATCH_LENGTH_EMBED)
    h = self.mlp(norm(self.pre_mlp_layer_norm, y), deterministic)
    return constrain(y + dropout(h), BATCH_LENGTH_EMBED)

  def __call__(self, y_bte: Array, encoded_bse: Array, self_mask: Array,
               cross_mask: Array, bias_1htt: Array,
               deterministic: bool) -> Array:
    return self._blocks(
        y_bte,
        lambda x: self.self_attention(x, x, self_mask, bias_1htt,
                                      deterministic),
        lambda x: self.encoder_decoder_attention(x, encoded_bse, cross_mask,
                                                 None, deterministic),
        deterministic)

  def init_cache(self, encoded_bse: Array, max_decode_length: int):
    self.self_attention.init_cache(encoded_bse.shape[0], max_decode_length)
    self.encoder_decoder_attention.init_cache(encoded_bse)

  def decode_step(self, y_bke: Array, positions_bk: Array, bias_bhkl: Array,
                  cross_mask_b11s: Array, deterministic: bool,
                  layout: Optional[SlotLayout] = None) -> Array:
    return self._blocks(
        y_bke,
        lambda x: self.self_attention.decode_step(x, positions_bk, bias_bhkl,
                                                  deterministic, layout),
        lambda x: self.encoder_decoder_attention.decode_step(
            x, cross_mask_b11s, deterministic),
        deterministic)


class Encoder(nn.Module):
  """Token embedding -> encoder layers -> final RMS norm."""
  config: T5Config
  shared_embedding: Embed

  @nn.compact
  def __call__(self, tokens_bs: Array, mask_b1ss: Array,
               deterministic: bool) -> Array:
    cfg = self.config
    x = self.shared_embedding(tokens_bs)
    x = _dropout(self, x, cfg.dropout_rate, deterministic, broadcast_dims=(-2,))
    x = constrain(x, BATCH_LENGTH_EMBED)
    # As T5X, relative positions are row indices even in packed rows: segments
    # only shift them, and the bias depends on differences alone.
    positions_1s = jnp.arange(tokens_bs.shape[1])[None]
    bias = RelativePositionBias(cfg, bidirectional=True, name='relpos_bias')(
        positions_1s, positions_1s)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, name=f'layers_{i}')(x, mask_b1ss, bias,
                                               deterministic)
    x = RmsNorm(cfg.dtype, name='encoder_norm')(x)
    x = _dropout(self, x, cfg.dropout_rate, deterministic)
    return constrain(x, BATCH_LENGTH_EMBED)


class Decoder(nn.Module):
  """Embed -> decoder layers -> RMS norm -> logits (teacher-forced/cached)."""
  config: T5Config
  shared_embedding: Embed

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBias(cfg, bidirectional=False)
    # A list attribute: flax names them layers_0, layers_1, ...
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = RmsNorm(cfg.dtype)
    if not cfg.logits_via_embedding:
      self.logits_dense = DenseGeneral(
          features=(cfg.vocab_size,), kernel_axes=('embed', 'vocab'),
          dtype=jnp.float32)  # float32 logits, as T5X.

  def _embed(self, tokens: Array, deterministic: bool) -> Array:
    y = self.shared_embedding(tokens)
    y = _dropout(self, y, self.config.dropout_rate, deterministic,
                 broadcast_dims=(-2,))
    return constrain(y, BATCH_LENGTH_EMBED)

  def _features(self, y: Array, deterministic: bool) -> Array:
    """The final features: what the output projection reads, [..., E]."""
    y = self.decoder_norm(y)
    return _dropout(self, y, self.config.dropout_rate, deterministic,
                    broadcast_dims=(-2,))

  def project(self, features: Array, vocab_ids: Optional[Array] = None) -> Array:
    """Logits [..., V] float32 of final features; over `vocab_ids` [K] only, [..., K], when given.

    A subset costs K/V of the full projection: the rows of the other tokens
    are never read.
    """
    if vocab_ids is None or self.is_initializing():
      if self.config.logits_via_embedding:
        scale = np.sqrt(features.shape[-1]).astype(np.float32)
        return self.shared_embedding.attend(features) / scale
      return self.logits_dense(features)
    return project_rows(features, self.projection_rows(vocab_ids))

  def projection_rows(self, vocab_ids: Array) -> Array:
    """The output projection's kernel [E, K] float32 over `vocab_ids` [K] (tied: rescaled).

    A decode loop slices it once and reads it every step (`project_rows`),
    rather than gathering K columns per call.
    """
    if self.config.logits_via_embedding:
      # Embedding rows are ~normal(1.0): T5X rescales tied logits by
      # 1/sqrt(emb_dim).
      rows_ke = jnp.take(self.shared_embedding.embedding, vocab_ids, axis=0)
      scale = np.sqrt(rows_ke.shape[-1]).astype(np.float32)
      return rows_ke.T.astype(jnp.float32) / scale
    kernel_ev = self.logits_dense.variables['params']['kernel']
    # float32, as the full projection (logits_dense's dtype).
    return jnp.take(kernel_ev, vocab_ids, axis=1).astype(jnp.float32)

  def _logits(self, y: Array, deterministic: bool) -> Array:
    return self.project(self._features(y, deterministic))

  def _outputs(self, y: Array, deterministic: bool, return_features: bool,
               vocab_ids: Optional[Array], projection_ek: Optional[Array] = None):
    features = self._features(y, deterministic)
    if projection_ek is not None:
      logits = project_rows(features, projection_ek)
    else:
      logits = self.project(features, vocab_ids)
    if vocab_ids is None and projection_ek is None:
      logits = constrain(logits, BATCH_LENGTH_VOCAB)
    return (logits, features) if return_features else logits

  def __call__(self, encoded_bse: Array, tokens_bt: Array, self_mask: Array,
               cross_mask: Array, deterministic: bool,
               return_features: bool = False) -> Array:
    y = self._embed(tokens_bt, deterministic)
    positions_1t = jnp.arange(tokens_bt.shape[1])[None]
    bias = self.relpos_bias(positions_1t, positions_1t)
    for layer in self.layers:
      y = layer(y, encoded_bse, self_mask, cross_mask, bias, deterministic)
    return self._outputs(y, deterministic, return_features, None)

  def init_cache(self, encoded_bse: Array, encoder_valid_bs: Array,
                 max_decode_length: int):
    self.put_variable('cache', 'encoder_mask', encoder_valid_bs)
    for layer in self.layers:
      layer.init_cache(encoded_bse, max_decode_length)

  def decode_step(self, tokens_bk: Array, positions_b: Array,
                  deterministic: bool, return_features: bool = False,
                  vocab_ids: Optional[Array] = None,
                  projection_ek: Optional[Array] = None,
                  layout: Optional[SlotLayout] = None) -> Array:
    length = self.layers[0].self_attention.cache_length()
    if layout is None:
      offsets_k = jnp.arange(tokens_bk.shape[1], dtype=positions_b.dtype)
      positions_bk = positions_b[:, None] + offsets_k[None]
      key_positions_bl = jnp.arange(length, dtype=positions_bk.dtype)[None]
    else:
      layout.check(tokens_bk.shape, length)
      positions_bk, key_positions_bl = layout.positions_bk, layout.key_positions_bl
    bias_bhkl = self.relpos_bias(positions_bk, key_positions_bl)
    encoder_mask_bs = self.get_variable('cache', 'encoder_mask')
    cross_mask_b11s = encoder_mask_bs[:, None, None, :]
    y = self._embed(tokens_bk, deterministic)
    for layer in self.layers:
      y = layer.decode_step(y, positions_bk, bias_bhkl, cross_mask_b11s,
                            deterministic, layout)
    return self._outputs(y, deterministic, return_features, vocab_ids, projection_ek)


# -----------------------------------------------------------------------------
# The model
# -----------------------------------------------------------------------------


class Transformer(nn.Module):
  """T5 1.1 encoder-decoder with T5X's feature names; every method jit-able.

  Keyword flags (enable_dropout, decode, max_decode_length) must be static.
  """
  config: T5Config

  def setup(self):
    self.token_embedder = Embed(self.config)
    self.encoder = Encoder(self.config, shared_embedding=self.token_embedder)
    self.decoder = Decoder(self.config, shared_embedding=self.token_embedder)

  def encode(self, encoder_input_tokens: Array,
             encoder_segment_ids: Optional[Array] = None, *,
             enable_dropout: bool = True) -> Array:
    """Encoder output [B, S, E] in config.dtype.

    Token 0 is padding; packed rows attend within their segment only.
    """
    valid_bs = encoder_input_tokens > 0
    mask = pairwise_mask(valid_bs, valid_bs)
    if encoder_segment_ids is not None:
      mask &= same_segment_mask(encoder_segment_ids, encoder_segment_ids)
    return self.encoder(encoder_input_tokens, mask,
                        deterministic=not enable_dropout)

  def decode(self, encoded: Array, encoder_input_tokens: Array,
             decoder_input_tokens: Array, decoder_target_tokens: Array,
             encoder_segment_ids: Optional[Array] = None,
             decoder_segment_ids: Optional[Array] = None,
             decoder_positions: Optional[Array] = None, *,
             enable_dropout: bool = True, return_features: bool = False) -> Array:
    """Teacher-forced decoder: logits [B, T, V] float32.

    With `return_features`: (logits, features [B, T, E]), the final features
    being what the output projection reads (see `project`).

    Masks as T5X. Self-attention: causal, and query and key both non-padding
    by `decoder_target_tokens > 0` (input tokens start with BOS = 0, so they
    cannot tell padding). Cross-attention: a non-padding target and encoder
    token. Packed rows: within their segment. `decoder_positions` is unused,
    as in T5X: relative biases depend on differences of row indices only.
    """
    del decoder_positions
    target_valid_bt = decoder_target_tokens > 0
    length = decoder_target_tokens.shape[1]
    causal_11tt = jnp.tril(jnp.ones((length, length), bool))[None, None]
    self_mask = causal_11tt & pairwise_mask(target_valid_bt, target_valid_bt)
    if decoder_segment_ids is not None:
      self_mask &= same_segment_mask(decoder_segment_ids, decoder_segment_ids)
    cross_mask = pairwise_mask(target_valid_bt, encoder_input_tokens > 0)
    if encoder_segment_ids is not None:
      if decoder_segment_ids is None:
        raise ValueError('Packed inputs: encoder_segment_ids was given without '
                         'decoder_segment_ids; pass both or neither.')
      cross_mask &= same_segment_mask(decoder_segment_ids,
                                       encoder_segment_ids)
    return self.decoder(encoded, decoder_input_tokens, self_mask, cross_mask,
                        deterministic=not enable_dropout,
                        return_features=return_features)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Array,
               encoder_segment_ids: Optional[Array] = None,
               decoder_segment_ids: Optional[Array] = None,
               encoder_positions: Optional[Array] = None,
               decoder_positions: Optional[Array] = None, *,
               enable_dropout: bool = True, decode: bool = False,
               max_decode_length: Optional[int] = None) -> Array:
    """Teacher-forced encode + decode: logits [B, T, V] float32.

    Positions are unused, as in T5X (see `decode`). For decoding use
    `init_cache` and `decode_step`; `decode=True` raises.
    """
    del encoder_positions, max_decode_length
    if decode:
      raise ValueError(
          'Transformer.__call__ is the teacher-forced pass only: to decode, '
          'call Transformer.init_cache (mutable=["cache"]) once, then '
          'Transformer.decode_step.')
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids,
                          enable_dropout=enable_dropout)
    return self.decode(encoded, encoder_input_tokens, decoder_input_tokens,
                       decoder_target_tokens, encoder_segment_ids,
                       decoder_segment_ids, decoder_positions,
                       enable_dropout=enable_dropout)

  def init_cache(self, encoded: Array, encoder_input_tokens: Array,
                 max_decode_length: int) -> None:
    """Creates the 'cache' collection; apply with mutable=['cache'].

    Self-attention keys/values start as zeros [B, max_decode_length, H, D];
    the cross-attention projections of `encoded` [B, S, E] and the encoder
    padding mask [B, S] are computed here, once. Layout: module docstring.
    """
    if (isinstance(max_decode_length, bool) or
        not isinstance(max_decode_length, (int, np.integer)) or
        max_decode_length <= 0):
      raise ValueError('max_decode_length must be a positive int, got '
                       f'{max_decode_length!r}.')
    if encoded.shape[:2] != encoder_input_tokens.shape:
      raise ValueError(f'encoded {encoded.shape} does not match '
                       f'encoder_input_tokens {encoder_input_tokens.shape}.')
    self.decoder.init_cache(encoded, encoder_input_tokens > 0,
                            int(max_decode_length))

  def decode_step(self, decoder_input_tokens: Array, decoder_positions: Array,
                  *, enable_dropout: bool = False, return_features: bool = False,
                  vocab_ids: Optional[Array] = None,
                  projection_ek: Optional[Array] = None,
                  layout: Optional[SlotLayout] = None) -> Array:
    """k >= 1 tokens a row through the cache: logits [B, k, V] float32.

    With `return_features`: (logits, features [B, k, E]). With `vocab_ids`
    [K]: logits over those tokens only, [B, k, K] (see `project`); with
    `projection_ek` (`projection_rows(vocab_ids)`, sliced once by a decode
    loop) the same logits without slicing the kernel again.

    Apply with {'params': ..., 'cache': ...} and mutable=['cache']. Token j
    of row b sits at position decoder_positions[b] + j: its key/value is
    written there and its query attends to cache positions <= its own, so
    whatever lies beyond (e.g. rejected drafts) is masked. The caller
    guarantees that positions below decoder_positions[b] hold the row's
    prefix and that positions are >= 0. Writes at positions >=
    max_decode_length are dropped, leaving earlier entries intact (the logits
    of such tokens are meaningless); negative positions are dropped too
    rather than wrapped.

    With a `layout` (a draft tree's, `draft_tree.tree_layout`) token j sits at
    layout.positions_bk[b, j] instead, its key/value goes to cache slot
    layout.slots_bk[b, j], it attends to the slots layout.attend_bkl[b, j]
    marks, and slot l holds position layout.key_positions_bl[b, l] (for the
    relative position bias); decoder_positions is then not read.
    """
    if not self.has_variable('cache', 'decoder'):
      raise ValueError(
          'Transformer.decode_step needs the cache made by '
          "Transformer.init_cache: apply with {'params': ..., 'cache': ...} "
          "and mutable=['cache'].")
    if (decoder_input_tokens.ndim != 2 or
        decoder_positions.shape != decoder_input_tokens.shape[:1]):
      raise ValueError(
          'decode_step expects tokens [B, k] and positions [B], got '
          f'{decoder_input_tokens.shape} and {decoder_positions.shape}.')
    if vocab_ids is not None and projection_ek is not None:
      raise ValueError('decode_step takes vocab_ids or projection_ek, not both.')
    return self.decoder.decode_step(decoder_input_tokens,
                                    decoder_positions.astype(jnp.int32),
                                    deterministic=not enable_dropout,
                                    return_features=return_features,
                                    vocab_ids=vocab_ids, projection_ek=projection_ek,
                                    layout=layout)

  def project(self, features: Array, vocab_ids: Optional[Array] = None) -> Array:
    """The output projection of final features [..., E]: logits [..., V] float32.

    Over `vocab_ids` [K] only ([..., K]) when given. A feature drafter
    (feature_drafter.py) predicts features and reads them out here, through
    the target's own projection.
    """
    return self.decoder.project(features, vocab_ids)

  def projection_rows(self, vocab_ids: Array) -> Array:
    """The output projection's kernel [E, K] over `vocab_ids` (see Decoder.projection_rows)."""
    return self.decoder.projection_rows(vocab_ids)

  def embed(self, tokens: Array) -> Array:
    """The shared token embedding [..., E] (config.dtype)."""
    return self.token_embedder(tokens)


# -----------------------------------------------------------------------------
# Parameters
# -----------------------------------------------------------------------------


def _boxed_params(config: T5Config, rng: Array, batch: int, input_len: int,
                  target_len: int):
  """Params with their logical-axis boxes (nn.LogicallyPartitioned)."""
  ones = lambda length: jnp.ones((batch, length), jnp.int32)
  variables = Transformer(config).init(
      {'params': rng}, ones(input_len), ones(target_len), ones(target_len),
      enable_dropout=False)
  return variables['params']


def init_params(config: T5Config, rng: Array, batch: int = 1,
                input_len: int = 8, target_len: int = 8) -> dict:
  """Fresh float32 params {'token_embedder', 'encoder', 'decoder'}, unboxed."""
  init = jax.jit(_boxed_params, static_argnums=(0, 2, 3, 4))
  boxed = init(config, rng, batch, input_len, target_len)
  return flax.core.unfreeze(nn.unbox(boxed))


def decoder_macs_per_token(config: T5Config, encoder_length: int) -> int:
  """Multiply-adds to decode one token with a warm cache (cross K/V precomputed).

  Per decoder layer: self-attention q/k/v/out projections, cross-attention
  q/out projections, attention over up to `encoder_length` positions, the
  gated MLP; plus the logits layer. Self-attention scores over the decoded
  prefix are left out (they grow with position and are small here).
  """
  joined = config.num_heads * config.head_dim
  emb = config.emb_dim
  mlp = config.mlp_dim * len(config.mlp_activations) + config.mlp_dim
  per_layer = (4 * emb * joined + 2 * emb * joined + 2 * encoder_length * joined
               + emb * mlp)
  return config.num_decoder_layers * per_layer + emb * config.vocab_size


def param_logical_axes(config: T5Config) -> dict:
  """The params tree of PartitionSpecs of logical axis names (no memory)."""
  boxed = jax.eval_shape(
      functools.partial(_boxed_params, config, batch=1, input_len=8,
                        target_len=8), jax.random.key(0))
  return nn.get_partition_spec(boxed)


# Logical axis names of the cache leaves (layout: module docstring), named as
# T5X names activations, so that T5X's logical axis rules shard them too:
# batch -> data, heads -> model, length and kv (head_dim) replicated.
CACHE_LOGICAL_AXES: Mapping[str, tuple[str, ...]] = {
    'encoder_mask': ('batch', 'length'),
    'cached_key': ('batch', 'length', 'heads', 'kv'),
    'cached_value': ('batch', 'length', 'heads', 'kv'),
    'encoded_key': ('batch', 'length', 'heads', 'kv'),
    'encoded_value': ('batch', 'length', 'heads', 'kv'),
    'decoded_tokens': ('batch', 'length'),  # the trigram drafter's history (ngram.py)
}


def cache_logical_axes(cache: Any) -> Any:
  """The cache tree of PartitionSpecs of logical axis names, by leaf name.

  Works on arrays or `jax.ShapeDtypeStruct`s (e.g. from `jax.eval_shape` of
  `init_cache`). A leaf whose name or rank is not in CACHE_LOGICAL_AXES raises
  a ValueError naming it, so a new cache variable cannot go unsharded unseen.
  """
  def axes(path, leaf):
    name = getattr(path[-1], 'key', getattr(path[-1], 'name', None))
    names = CACHE_LOGICAL_AXES.get(name)
    if names is None or len(names) != jnp.ndim(leaf):
      raise ValueError(
          f'cache leaf {jax.tree_util.keystr(path)} of shape '
          f'{jnp.shape(leaf)}: no logical axes for it in '
          f'network.CACHE_LOGICAL_AXES ({sorted(CACHE_LOGICAL_AXES)}).')
    return jax.sharding.PartitionSpec(*names)
  return jax.tree_util.tree_map_with_path(axes, cache)
