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

Optionally the head speaks a trimmed vocabulary (`vocab_ids`, [K] token ids):
its logits are computed over those K tokens only (K/V of the projection's
cost) and every other token gets probability 0. Speculative sampling stays
exact for any q, since the target verifies over its whole vocabulary.

Decoding (`decoder_fns`) follows decoding.py's feature-drafting contract; the
loop keeps the verify call's features and rewrites the head's entries with
true features at the start of each round. Training (`losses`) regresses the
target's features and matches its next-token distribution (EAGLE's loss),
optionally over several unrolled steps in which the head reads its own
predicted features, as it does when drafting (EAGLE-3's training-time test).
"""

import dataclasses
import functools
import json
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec import checkpoints
from specdec import decoding
from specdec import fileio
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
    Positions t < s have no such round; their outputs carry no loss (`losses`).
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
    (`logits_kernel`). With a `layout` (a draft tree's nodes,
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


# -----------------------------------------------------------------------------
# Storage: a head's directory.
# -----------------------------------------------------------------------------

CONFIG_FILE = checkpoints.CONFIG_FILE  # the compact format's file names
PARAMS_FILE = checkpoints.PARAMS_FILE
DRAFT_VOCAB_FILE = 'draft_vocab.json'
KIND = 'feature_head'


def is_head_dir(directory: str) -> bool:
  """Whether `directory` holds a feature head (its config.json says so)."""
  path = fileio.join(directory, CONFIG_FILE)
  if not fileio.isfile(path):
    return False
  return fileio.read_json_object(path, kind='config file').get('kind') == KIND


def params_sha256(params: PyTree) -> str:
  """A fingerprint of a param tree's float32 values (which target a head was made for)."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep='/')
  digest = ''.join(f'{k}:{fileio.sha256_hex(np.asarray(flat[k], np.float32).tobytes())};'
                   for k in sorted(flat))
  return fileio.sha256_hex(digest.encode())


def save(directory: str, config: FeatureHeadConfig, params: PyTree, *, target_sha256: str,
         draft_vocab_ids: Optional[Sequence[int]] = None, storage_dtype=jnp.bfloat16,
         extra: Optional[Dict[str, Any]] = None) -> None:
  """Writes params.msgpack (+ draft_vocab.json), then config.json with their sha256.

  `target_sha256` (`params_sha256` of the target's params) names the target
  the head reads; loading it with another target is refused.
  """
  data = checkpoints.params_bytes(params, storage_dtype)
  files = {PARAMS_FILE: fileio.sha256_hex(data)}
  meta = {'kind': KIND, 'head_config': config.to_dict(),
          'storage_dtype': jnp.dtype(storage_dtype).name, 'target_params_sha256': target_sha256}
  vocab_bytes = None
  if draft_vocab_ids is not None:
    vocab_bytes = json.dumps([int(i) for i in draft_vocab_ids]).encode()
    files[DRAFT_VOCAB_FILE] = fileio.sha256_hex(vocab_bytes)
  meta[fileio.FILES_FIELD] = files
  clash = set(extra or {}) & set(meta)
  if clash:
    raise ValueError(f'extra metadata may not replace {sorted(clash)}.')
  meta.update(extra or {})
  fileio.makedirs(directory)
  fileio.atomic_write(fileio.join(directory, PARAMS_FILE), data)
  if vocab_bytes is not None:
    fileio.atomic_write(fileio.join(directory, DRAFT_VOCAB_FILE), vocab_bytes)
  fileio.write_json(fileio.join(directory, CONFIG_FILE), meta)


def load(directory: str) -> Tuple[FeatureHeadConfig, PyTree, Optional[np.ndarray], Dict[str, Any]]:
  """(config, float32 params, draft vocab ids or None, config.json) of a head, hash-checked."""
  config_path = fileio.join(directory, CONFIG_FILE)
  if not fileio.isfile(config_path):
    raise FileNotFoundError(f'No feature head at {directory} (no {CONFIG_FILE}).')
  meta = fileio.read_json_object(config_path, kind='config file')
  if meta.get('kind') != KIND:
    raise ValueError(f'{config_path}: not a feature head (kind {meta.get("kind")!r}).')
  try:
    config = FeatureHeadConfig.from_dict(meta['head_config'])
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f'{config_path}: bad head_config ({e}).') from e
  path = fileio.join(directory, PARAMS_FILE)
  stored = checkpoints.read_params_file(directory, meta)
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), stored)
  expected = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
  checkpoints.check_param_shapes(params, expected, where=path)
  vocab_ids, _ = load_vocab_ids(directory)
  return config, params, vocab_ids, meta


def load_vocab_ids(directory: str) -> Tuple[Optional[np.ndarray], Dict[str, Any]]:
  """(draft vocabulary ids or None, config.json) of a head directory, without reading its params."""
  meta = fileio.read_json_object(fileio.join(directory, CONFIG_FILE), kind='config file')
  if DRAFT_VOCAB_FILE not in meta.get(fileio.FILES_FIELD, {}):
    return None, meta
  data = fileio.read_verified(fileio.join(directory, DRAFT_VOCAB_FILE),
                              fileio.recorded_sha256(meta, DRAFT_VOCAB_FILE), CONFIG_FILE)
  return np.asarray(json.loads(data), np.int32), meta


def check_made_for(meta: Dict[str, Any], target_params: PyTree, where: str) -> None:
  """ValueError unless the head in `where` was trained on these target params."""
  want = meta.get('target_params_sha256')
  if want is not None and want != params_sha256(target_params):
    raise ValueError(f'The feature head in {where} was trained for another target (params '
                     f'sha256 {want[:12]}..., this target {params_sha256(target_params)[:12]}...): '
                     "a head reads its own target's features.")


# -----------------------------------------------------------------------------
# Decoding: the target and the head, in decoding.py's feature-drafting contract.
# -----------------------------------------------------------------------------


def widen_logits(logits_bxk: Array, vocab_ids: Array, vocab_size: int) -> Array:
  """Logits over `vocab_ids` [K] -> [.., V] with -inf (q = 0) at every other token."""
  full = jnp.full(logits_bxk.shape[:-1] + (vocab_size,), -jnp.inf, logits_bxk.dtype)
  return full.at[..., vocab_ids].set(logits_bxk)


def folds_projection(config: FeatureHeadConfig) -> bool:
  """Whether the head's logits go through one folded kernel (`logits_kernel`): if it is narrower than the target.

  From the head's normed hidden state [W], logits are two linear maps: its
  own output map [W, E] to a feature, then the target's projection [E, K].
  On CPU a draft step costs about the bytes of weights it reads, and one
  [W, K] kernel reads W*K instead of W*E + E*K (a 128-wide head over 1024
  ids: 0.5 MB instead of 1.8 MB). The predicted feature that the next draft
  step reads still takes the [W, E] map, so folding saves bytes only if W < E.
  """
  return config.width < config.feature_dim


def logits_kernel(head_params: PyTree, projection_ek: Array) -> Array:
  """The head's folded logits kernel [W, K] float32: its output map [W, E] times the target's projection
  [E, K] (over a draft vocabulary, or all V columns)."""
  unfuse_we = jnp.asarray(head_params['unfuse']['kernel'], jnp.float32)
  return jnp.matmul(unfuse_we, jnp.asarray(projection_ek, jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


def decoder_fns(target_module: network.Transformer, target_params: PyTree,
                head: FeatureHead, head_params: PyTree, encoder_input_tokens: Array,
                max_decode_length: int, vocab_ids: Optional[Array] = None,
                constrain_cache: Optional[Callable[[PyTree], PyTree]] = None,
                projection_ek: Optional[Array] = None,
                logits_kernel_wk: Optional[Array] = None):
  """Encodes once; returns (target_cache, target_fn, head_cache, draft_fn).

  target_fn(state) -> (logits [B, k, V], features [B, k, E], cache);
  draft_fn(state, features [B, k, E]) -> (logits [B, k, V], predicted
  features [B, k, E], cache): decoding.speculative_sample's feature-drafting
  contract (`draft_reads_features=True`). With `vocab_ids` [K] the head's
  logits cover those tokens only (-inf elsewhere); `projection_ek` [E, K] is
  the target's projection over them if already sliced. With
  `logits_kernel_wk` [W, K] (or [W, V] without `vocab_ids`; `logits_kernel`)
  the head's logits read that folded kernel from its normed hidden state.
  A head that `folds_projection` over a draft vocabulary folds it here if it
  is not given; over the whole vocabulary only if given (folding [E, V] in
  every decode would cost more than it saves). Both come precomputed from
  `models.SpeculativeEncoderDecoderModel.with_draft_projection`.
  """
  check_target(head.config, target_module.config)
  constrain = constrain_cache or (lambda cache: cache)
  encoded = target_module.apply({'params': target_params}, encoder_input_tokens,
                                enable_dropout=False, method=target_module.encode)
  _, target_vars = target_module.apply({'params': target_params}, encoded,
                                       encoder_input_tokens, max_decode_length,
                                       method=target_module.init_cache, mutable=['cache'])
  _, head_vars = head.apply({'params': head_params}, encoded, encoder_input_tokens > 0,
                            max_decode_length, method=head.init_cache, mutable=['cache'])
  vocab_size = target_module.config.vocab_size
  ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)
  # Sliced once per decode, outside the loop: a per-step gather of K columns
  # would cost more than the head's own layers.
  kernel_ek = None
  if ids is not None and logits_kernel_wk is None:
    kernel_ek = projection_ek if projection_ek is not None else target_module.apply(
        {'params': target_params}, ids, method=target_module.projection_rows)
    if folds_projection(head.config):
      logits_kernel_wk = logits_kernel(head_params, kernel_ek)
  if logits_kernel_wk is not None:
    want = (head.config.width, vocab_size if ids is None else ids.shape[0])
    if tuple(logits_kernel_wk.shape) != want:
      raise ValueError(f'The folded logits kernel has shape {tuple(logits_kernel_wk.shape)}; this head '
                       f'and draft vocabulary need {want} (head width, draft vocabulary size).')

  def target_fn(state: decoding.DecodingState):
    layout = {} if state.layout is None else {'layout': state.layout}  # a draft tree's nodes
    (logits, features), new_vars = target_module.apply(
        {'params': target_params, 'cache': state.cache}, state.cur_token, state.cur_index,
        return_features=True, method=target_module.decode_step, mutable=['cache'], **layout)
    return logits, features, constrain(new_vars['cache'])

  def draft_fn(state: decoding.DecodingState, features_bke: Array):
    embedded = target_module.apply({'params': target_params}, state.cur_token,
                                   method=target_module.embed)
    (predicted, normed), new_vars = head.apply(
        {'params': head_params, 'cache': state.cache}, features_bke, embedded,
        state.cur_index, True, state.layout, method=head.decode_step, mutable=['cache'])
    if logits_kernel_wk is not None:
      logits = network.project_rows(normed, logits_kernel_wk)
    elif ids is None:
      logits = target_module.apply({'params': target_params}, predicted,
                                   method=target_module.project)
    else:
      logits = network.project_rows(predicted, kernel_ek)
    if ids is not None:
      logits = widen_logits(logits, ids, vocab_size)
    return logits, predicted, constrain(new_vars['cache'])

  return constrain(target_vars['cache']), target_fn, constrain(head_vars['cache']), draft_fn


# -----------------------------------------------------------------------------
# Training: EAGLE's loss, over one or several unrolled depths.
# -----------------------------------------------------------------------------


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


def smooth_l1(x: Array, beta: float = 1.0) -> Array:
  """Huber-like elementwise loss (EAGLE's feature regression)."""
  a = jnp.abs(x)
  return jnp.where(a < beta, 0.5 * a * a / beta, a - 0.5 * beta)


def losses(head: FeatureHead, head_params: PyTree, target_module: network.Transformer,
           target_params: PyTree, batch: Dict[str, Array], *, ce_weight: float = 0.1,
           feature_weight: float = 1.0, unroll_steps: int = 1, step_decay: float = 0.8,
           vocab_ids: Optional[Array] = None) -> Tuple[Array, Dict[str, Array]]:
  """Mean loss over target tokens and its parts, for one batch.

  Per position and unrolled depth s: feature_weight * SmoothL1(f̂ - f) (mean
  over the feature) + ce_weight * CE(p, q) (p the target's next-token
  distribution, q the head's through the target's projection, over
  `vocab_ids` when given), weighted by step_decay**s. Depth s counts
  positions t >= s only (a round's (s+1)-th draft), in packed rows only
  where t-s is in t's example. Metrics: `agree` (argmax
  q = argmax p at depth 0, the first draft's greedy acceptance under teacher
  forcing), `agree_s<k>` per depth, `feature_l1`, `ce`.
  """
  encoded, target_logits, features = target_features(target_module, target_params, batch)
  features = jax.lax.stop_gradient(features)
  target_logp = jax.nn.log_softmax(jax.lax.stop_gradient(target_logits).astype(jnp.float32))
  weights_bt = batch['decoder_loss_weights'].astype(jnp.float32)
  valid_bt = batch['decoder_target_tokens'] > 0
  segments_bt = batch.get('decoder_segment_ids')
  cross_mask = network._pairwise_mask(valid_bt, batch['encoder_input_tokens'] > 0)  # pylint: disable=protected-access
  if segments_bt is not None:
    cross_mask &= network._same_segment_mask(segments_bt, batch['encoder_segment_ids'])  # pylint: disable=protected-access
  embedded = target_module.apply({'params': jax.lax.stop_gradient(target_params)},
                                 batch['decoder_input_tokens'], method=target_module.embed)
  predicted = head.apply({'params': head_params}, shift_features_right(features, segments_bt),
                         embedded, encoded, valid_bt, cross_mask, unroll_steps, segments_bt,
                         method=head.unrolled)
  ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)
  target_top_bt = jnp.argmax(target_logp, axis=-1)
  if ids is not None:
    p_bt = target_logp  # CE over the kept tokens: p restricted to K, renormalised
    p_bt = jax.nn.log_softmax(jnp.take(p_bt, ids, axis=-1), axis=-1)
  total, metrics = 0.0, {}
  for s, predicted_bte in enumerate(predicted):
    w_bt = weights_bt * same_round_bt(segments_bt, features.shape[1], s)
    denom = jnp.maximum(jnp.sum(w_bt), 1.0)
    logits = target_module.apply({'params': jax.lax.stop_gradient(target_params)},
                                 predicted_bte, ids, method=target_module.project)
    logq = jax.nn.log_softmax(logits.astype(jnp.float32))
    if ids is None:
      ce_bt = -jnp.sum(jnp.exp(target_logp) * logq, axis=-1)
      top_bt = jnp.argmax(logq, axis=-1)
    else:
      ce_bt = -jnp.sum(jnp.exp(p_bt) * logq, axis=-1)
      top_bt = ids[jnp.argmax(logq, axis=-1)]
    l1_bt = jnp.mean(smooth_l1(predicted_bte.astype(jnp.float32) - features), axis=-1)
    part = jnp.sum((feature_weight * l1_bt + ce_weight * ce_bt) * w_bt) / denom
    total = total + step_decay ** s * part
    agree = jnp.sum((top_bt == target_top_bt) * w_bt) / denom
    metrics[f'agree_s{s}'] = agree
    if s == 0:
      metrics.update(agree=agree, feature_l1=jnp.sum(l1_bt * w_bt) / denom,
                     ce=jnp.sum(ce_bt * w_bt) / denom)
  return total, metrics
