"""Decoding with a feature head: the target and the head in decoding.py's feature-drafting contract.

`decoder_fns` encodes once and returns the target's and the head's caches and
decode functions for `decoding.speculative_sample(...,
draft_reads_features=True)`; the loop keeps the verify call's features and
rewrites the head's entries with true features at the start of each round.
The head is feature_drafter.py's.

Optionally the head speaks a trimmed vocabulary (`vocab_ids`, [K] token ids):
its logits are computed over those K tokens only (K/V of the projection's
cost) and every other token gets probability 0 (`widen_logits`). Speculative
sampling stays exact for any q, since the target verifies over its whole
vocabulary. A head narrower than the target reads its logits through one
folded kernel (`folds_projection`, `logits_kernel`).
"""

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from specdec import decoding
from specdec import feature_drafter
from specdec import network

Array = jax.Array
PyTree = Any


def widen_logits(logits_bxk: Array, vocab_ids: Array, vocab_size: int) -> Array:
  """Logits over `vocab_ids` [K] -> [.., V] with -inf (q = 0) at every other token."""
  full = jnp.full(logits_bxk.shape[:-1] + (vocab_size,), -jnp.inf, logits_bxk.dtype)
  return full.at[..., vocab_ids].set(logits_bxk)


def folds_projection(config: feature_drafter.FeatureHeadConfig) -> bool:
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
                head: feature_drafter.FeatureHead, head_params: PyTree, encoder_input_tokens: Array,
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
  feature_drafter.check_target(head.config, target_module.config)
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
