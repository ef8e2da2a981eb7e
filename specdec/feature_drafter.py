"""Feature drafters: a small head that drafts from the target's own final features.

EAGLE (Li et al. 2024) for an encoder-decoder target. An independent drafter
re-derives, from the text alone, what the target already computed; a feature
head reads it. Entry p of the head takes (f_{p-1}, x_p): the target's final
feature of the position before (the vector its output projection read to
predict x_p) and the embedding of x_p (the target's own embedding table),
fuses them (a linear map of the concatenation), runs a few T5 decoder layers
of its own (self-attention with a cache, cross-attention to the target's
encoder output, MLP) and maps the result back to a predicted feature f̂_p.
The target's own output projection turns f̂_p into logits for x_{p+1}. Inside
a round the head feeds on its own predictions: (f̂_p, x̂_{p+1}) -> f̂_{p+1}.

What the head adds to a target: its own parameters only. The embedding table
and the output projection are the target's, frozen, read at call time; the
encoder is the target's, run once per example for both.

This module holds the network: the head's sizes (`FeatureHeadConfig`), its
layers (`FeatureHead`: teacher-forced, unrolled over drafting depths, cached),
fresh params and their logical axes, and the features it reads
(`target_features`: the frozen target on a teacher-forced batch). The rest of
a feature drafter sits beside it:
- feature_decoding.py: decoding with a head (`decoder_fns`) in decoding.py's
  feature-drafting contract, over the whole or a trimmed draft vocabulary;
- feature_head_checkpoint.py: a head's directory (`save`, `load`, the target
  it was made for);
- training/feature_losses.py: EAGLE's loss (`losses`), which regresses the
  target's features and matches its next-token distribution, optionally over
  several unrolled steps (EAGLE-3's training-time test).
"""

import dataclasses
from typing import Any, Dict, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec import network

Array = jax.Array
PyTree = Any


@dataclasses.dataclass(frozen=True)
class FeatureHeadConfig:
  """A feature head's sizes.

  Attributes:
    feature_dim: the target's feature width (its emb_dim, E).
    vocab_size: the target's vocabulary size.
    width: the head's own width (its decoder layers' emb_dim).
    num_layers: layers of the head.
    num_heads, head_dim, mlp_dim: of each layer.
    attention: True: T5 decoder layers (self-attention with a cache,
      cross-attention to the target's encoder output, MLP). False: residual
      MLP layers only: the head sees the context through the target's
      feature alone, keeps no cache, and a draft step is a handful of
      kernels (the per-step floor of a small drafter on CPU is its kernel
      count, not its FLOPs).
    relative_attention_num_buckets, relative_attention_max_distance: its
      self-attention's relative position bias.
    dtype: activation dtype.
  """
  feature_dim: int
  vocab_size: int
  width: int = 128
  num_layers: int = 1
  num_heads: int = 2
  head_dim: int = 64
  mlp_dim: int = 512
  attention: bool = True
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  dtype: Any = jnp.float32

  def __post_init__(self):
    for name in ('feature_dim', 'vocab_size', 'width', 'num_layers', 'num_heads', 'head_dim',
                 'mlp_dim'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f'FeatureHeadConfig.{name} must be a positive integer, got {value!r}.')
    if not isinstance(self.attention, (bool, np.bool_)):
      raise ValueError(f'FeatureHeadConfig.attention must be True or False, got '
                       f'{self.attention!r}.')
    self.layer_config()  # checks the rest
    # Normalised so that 'float32' (a config file) and jnp.float32 compare equal.
    object.__setattr__(self, 'dtype', jnp.dtype(self.dtype))

  def layer_config(self) -> network.T5Config:
    """The T5 config of the head's decoder layers (no encoder: the target's is read)."""
    return network.T5Config(
        vocab_size=self.vocab_size, dtype=self.dtype, emb_dim=self.width,
        num_heads=self.num_heads, num_encoder_layers=1, num_decoder_layers=self.num_layers,
        head_dim=self.head_dim, mlp_dim=self.mlp_dim, dropout_rate=0.0,
        relative_attention_num_buckets=self.relative_attention_num_buckets,
        relative_attention_max_distance=self.relative_attention_max_distance)

  def to_dict(self) -> Dict[str, Any]:
    out = dataclasses.asdict(self)
    out['dtype'] = jnp.dtype(self.dtype).name
    return out

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> 'FeatureHeadConfig':
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f'FeatureHeadConfig: unknown fields {unknown}.')
    return cls(**d)


def check_target(config: FeatureHeadConfig, target_config: network.T5Config) -> None:
  """ValueError unless the head was made for this target (feature width, vocabulary)."""
  if config.feature_dim != target_config.emb_dim:
    raise ValueError(f'The feature head reads {config.feature_dim}-wide features, the target '
                     f'has emb_dim {target_config.emb_dim}.')
  if config.vocab_size != target_config.vocab_size:
    raise ValueError(f'Vocabulary mismatch: the feature head was made for {config.vocab_size} '
                     f'tokens, the target has {target_config.vocab_size}.')


def target_features(target_module: network.Transformer, target_params: PyTree,
                    batch: Dict[str, Array]) -> Tuple[Array, Array, Array]:
  """The frozen target on a teacher-forced batch: (encoded [B, S, E], logits [B, T, V], features [B, T, E]).

  Packed batches (with segment ids) attend within their examples.
  """
  params = jax.lax.stop_gradient(target_params)
  encoded = target_module.apply({'params': params}, batch['encoder_input_tokens'],
                                batch.get('encoder_segment_ids'), enable_dropout=False,
                                method=target_module.encode)
  logits, features = target_module.apply(
      {'params': params}, encoded, batch['encoder_input_tokens'], batch['decoder_input_tokens'],
      batch['decoder_target_tokens'], batch.get('encoder_segment_ids'),
      batch.get('decoder_segment_ids'), enable_dropout=False, return_features=True,
      method=target_module.decode)
  return encoded, logits, features


def shift_features_right(features_bte: Array, segment_ids_bt: Optional[Array] = None) -> Array:
  """f_{t-1} for every t: zeros at t = 0 and, in packed rows, at each segment's start
  (no feature precedes BOS)."""
  shifted = jnp.pad(features_bte, ((0, 0), (1, 0), (0, 0)))[:, :-1]
  if segment_ids_bt is None:
    return shifted
  same_bt = jnp.pad(segment_ids_bt[:, 1:] == segment_ids_bt[:, :-1], ((0, 0), (1, 0)))
  return jnp.where(same_bt[..., None], shifted, 0)


def same_round_bt(segment_ids_bt: Optional[Array], length: int, depth: int) -> Array:
  """Positions t whose depth-`depth` draft has a round start t-depth in its own example, [B|1, T]."""
  positions_t = jnp.arange(length)
  ok = (positions_t >= depth)[None]
  if segment_ids_bt is None or depth == 0:
    return ok
  back = jnp.pad(segment_ids_bt, ((0, 0), (depth, 0)))[:, :length]
  return ok & (back == segment_ids_bt)


class MlpLayer(nn.Module):
  """A residual pre-norm T5 MLP block: an attention-free head's layer."""
  config: network.T5Config

  @nn.compact
  def __call__(self, y: Array) -> Array:
    normed = network.RmsNorm(self.config.dtype, name='pre_mlp_layer_norm')(y)
    return y + network.MlpBlock(self.config, name='mlp')(normed, True)


class FeatureHead(nn.Module):
  """(f_{p-1}, embedding of x_p) -> predicted f_p, teacher-forced or cached."""
  config: FeatureHeadConfig

  def setup(self):
    cfg = self.config
    layer_config = cfg.layer_config()
    self.fuse = network.DenseGeneral(features=(cfg.width,), kernel_axes=('embed', 'mlp'),
                                     dtype=cfg.dtype)
    if cfg.attention:
      self.relpos_bias = network.RelativePositionBias(layer_config, bidirectional=False)
      self.layers = [network.DecoderLayer(layer_config) for _ in range(cfg.num_layers)]
    else:
      self.mlp_layers = [MlpLayer(layer_config) for _ in range(cfg.num_layers)]
    self.head_norm = network.RmsNorm(cfg.dtype)
    self.unfuse = network.DenseGeneral(features=(cfg.feature_dim,),
                                       kernel_axes=('mlp', 'embed'), dtype=cfg.dtype)

  def _fused(self, features_bxe: Array, embedded_bxe: Array) -> Array:
    dtype = self.config.dtype
    return self.fuse(jnp.concatenate([features_bxe.astype(dtype), embedded_bxe.astype(dtype)],
                                     axis=-1))

  def _out(self, y: Array) -> Array:
    return self.unfuse(self.head_norm(y))

  def _mlp_normed(self, features_bxe: Array, embedded_bxe: Array) -> Array:
    """An attention-free head, every entry on its own: the normed hidden state [.., W]."""
    y = self._fused(features_bxe, embedded_bxe)
    for layer in self.mlp_layers:
      y = layer(y)
    return self.head_norm(y)

  def _mlp_only(self, features_bxe: Array, embedded_bxe: Array) -> Array:
    return self.unfuse(self._mlp_normed(features_bxe, embedded_bxe))

  def __call__(self, features_bte: Array, embedded_bte: Array, encoded_bse: Array,
               self_mask: Array, cross_mask: Array) -> Array:
    """Teacher-forced: predicted features [B, T, E] from (f_{t-1}, emb x_t) at every t."""
    if not self.config.attention:
      return self._mlp_only(features_bte, embedded_bte)
    y = self._fused(features_bte, embedded_bte)
    positions_1t = jnp.arange(features_bte.shape[1])[None]
    bias = self.relpos_bias(positions_1t, positions_1t)
    for layer in self.layers:
      y = layer(y, encoded_bse, self_mask, cross_mask, bias, True)
    return self._out(y)

  def unrolled(self, features_bte: Array, embedded_bte: Array, encoded_bse: Array,
               valid_bt: Array, cross_mask: Array, steps: int,
               segment_ids_bt: Optional[Array] = None) -> Sequence[Array]:
    """Teacher-forced over `steps` unrolled drafting depths: [predicted features [B, T, E]] per depth.

    Depth 0 reads the true features (as `__call__`). Depth s >= 1 reads the
    features depth s-1 predicted for the position before, as the (s+1)-th
    draft of a round does: its query at position t (a round that began at
    t-s) attends to depth-0 entries at positions <= t-s and to the depth-s'
    entry at position t-s+s' for each 1 <= s' <= s, i.e. exactly the entries
    its cache holds when drafting (the depth-s entry at t is its own).
    Positions t < s have no such round; their outputs carry no loss (`feature_losses.losses`).
    Packed rows (`segment_ids_bt`) attend within their example only.
    An attention-free head reads only the entry before, so depth s is the
    head applied to depth s-1's predictions shifted by one.
    """
    if not self.config.attention:
      outputs, inputs_bte = [], features_bte
      for _ in range(steps):
        outputs.append(self._mlp_only(inputs_bte, embedded_bte))
        inputs_bte = shift_features_right(outputs[-1], segment_ids_bt)
      return outputs
    length = features_bte.shape[1]
    positions_t = jnp.arange(length)
    bias = self.relpos_bias(positions_t[None], positions_t[None])  # [1, H, T, T]
    causal_tt = positions_t[None, :] <= positions_t[:, None]
    valid_pair_btt = valid_bt[:, :, None] & valid_bt[:, None, :]
    if segment_ids_bt is not None:
      valid_pair_btt &= segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
    inputs_bte = features_bte
    outputs = []
    keys = [[] for _ in self.layers]  # per layer: K/V of each earlier depth
    for s in range(steps):
      y = self._fused(inputs_bte, embedded_bte)
      for li, layer in enumerate(self.layers):
        attention = layer.self_attention

        def self_attend(x, s=s, li=li, attention=attention):
          query, key, value = attention.query(x), attention.key(x), attention.value(x)
          keys[li].append((key, value))
          # Depth 0 over depth 0: causal. Depth s over depth s' (1 <= s' <= s): the
          # one entry at t - s + s'; over depth 0: positions <= t - s.
          masks, biases, all_keys, all_values = [], [], [], []
          for sp, (k_, v_) in enumerate(keys[li]):
            if s == 0:
              m_tt = causal_tt
            elif sp == 0:
              m_tt = positions_t[None, :] <= positions_t[:, None] - s
            else:
              m_tt = positions_t[None, :] == positions_t[:, None] - s + sp
            masks.append(m_tt[None] & valid_pair_btt)
            biases.append(bias)
            all_keys.append(k_)
            all_values.append(v_)
          mask = jnp.concatenate(masks, axis=-1)[:, None]
          return attention.attend(query, jnp.concatenate(all_keys, axis=1),
                                  jnp.concatenate(all_values, axis=1), mask,
                                  jnp.concatenate(biases, axis=-1), True)

        y = layer._blocks(  # pylint: disable=protected-access
            y, self_attend,
            lambda x, layer=layer: layer.encoder_decoder_attention(x, encoded_bse, cross_mask,
                                                                   None, True),
            True)
      predicted_bte = self._out(y)
      outputs.append(predicted_bte)
      inputs_bte = shift_features_right(predicted_bte, segment_ids_bt)
    return outputs

  def init_cache(self, encoded_bse: Array, encoder_valid_bs: Array,
                 max_decode_length: int) -> None:
    self.put_variable('cache', 'encoder_mask', encoder_valid_bs)
    if not self.config.attention:
      return  # nothing to cache: the mask alone keeps the cache a non-empty tree
    for layer in self.layers:
      layer.init_cache(encoded_bse, max_decode_length)

  def decode_step(self, features_bke: Array, embedded_bke: Array, positions_b: Array,
                  return_normed: bool = False, layout=None):
    """k entries a row through the cache at positions_b + j: predicted features [B, k, E].

    With `return_normed`: (predicted features, the normed hidden state [B, k, W]
    they are a linear map of), for logits through a folded kernel
    (`feature_decoding.logits_kernel`). With a `layout` (a draft tree's nodes,
    `draft_tree.tree_layout`) the entries sit where it says, as in
    `network.Transformer.decode_step`.
    """
    normed = self._decode_normed(features_bke, embedded_bke, positions_b, layout)
    predicted = self.unfuse(normed)
    return (predicted, normed) if return_normed else predicted

  def _decode_normed(self, features_bke: Array, embedded_bke: Array, positions_b: Array,
                     layout=None) -> Array:
    if not self.config.attention:
      return self._mlp_normed(features_bke, embedded_bke)  # every entry on its own: no layout to keep
    length = self.layers[0].self_attention.cache_length()
    if layout is None:
      offsets_k = jnp.arange(features_bke.shape[1], dtype=jnp.int32)
      positions_bk = positions_b.astype(jnp.int32)[:, None] + offsets_k[None]
      key_positions_bl = jnp.arange(length, dtype=jnp.int32)[None]
    else:
      layout.check(features_bke.shape[:2], length)
      positions_bk, key_positions_bl = layout.positions_bk, layout.key_positions_bl
    bias_bhkl = self.relpos_bias(positions_bk, key_positions_bl)
    cross_mask_b11s = self.get_variable('cache', 'encoder_mask')[:, None, None, :]
    y = self._fused(features_bke, embedded_bke)
    for layer in self.layers:
      y = layer.decode_step(y, positions_bk, bias_bhkl, cross_mask_b11s, True, layout)
    return self.head_norm(y)


def init_params(config: FeatureHeadConfig, rng: Array, batch: int = 1, length: int = 4,
                input_len: int = 4) -> PyTree:
  """Fresh head parameters (unboxed float32)."""
  head = FeatureHead(config)
  e = config.feature_dim
  valid = jnp.ones((batch, length), bool)
  mask = valid[:, None, :, None] & valid[:, None, None, :]
  cross = jnp.ones((batch, 1, length, input_len), bool)
  variables = head.init(rng, jnp.zeros((batch, length, e)), jnp.zeros((batch, length, e)),
                        jnp.zeros((batch, input_len, e)), mask, cross)
  return nn.meta.unbox(variables['params'])


def param_logical_axes(config: FeatureHeadConfig) -> PyTree:
  """Logical axis names of every head parameter (for partitioning rules)."""
  head = FeatureHead(config)
  e = config.feature_dim
  shapes = jax.eval_shape(
      lambda: head.init(jax.random.PRNGKey(0), jnp.zeros((1, 2, e)), jnp.zeros((1, 2, e)),
                        jnp.zeros((1, 2, e)), jnp.ones((1, 1, 2, 2), bool),
                        jnp.ones((1, 1, 2, 2), bool)))
  return nn.get_partition_spec(shapes['params'])
