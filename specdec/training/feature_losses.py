"""EAGLE's loss: what a feature head (feature_drafter.py) is trained with, its target frozen.

`losses` regresses the target's features (`smooth_l1`) and matches its
next-token distribution, optionally over several unrolled steps in which the
head reads its own predicted features, as it does when drafting (EAGLE-3's
training-time test). The trainer is feature_training.py.
"""

from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from specdec import feature_drafter
from specdec import network

Array = jax.Array
PyTree = Any


def smooth_l1(x: Array, beta: float = 1.0) -> Array:
  """Huber-like elementwise loss (EAGLE's feature regression)."""
  a = jnp.abs(x)
  return jnp.where(a < beta, 0.5 * a * a / beta, a - 0.5 * beta)


def losses(head: feature_drafter.FeatureHead, head_params: PyTree, target_module: network.Transformer,
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
  encoded, target_logits, features = feature_drafter.target_features(target_module, target_params, batch)
  features = jax.lax.stop_gradient(features)
  target_logp = jax.nn.log_softmax(jax.lax.stop_gradient(target_logits).astype(jnp.float32))
  weights_bt = batch['decoder_loss_weights'].astype(jnp.float32)
  valid_bt = batch['decoder_target_tokens'] > 0
  segments_bt = batch.get('decoder_segment_ids')
  cross_mask = network.pairwise_mask(valid_bt, batch['encoder_input_tokens'] > 0)
  if segments_bt is not None:
    cross_mask &= network.same_segment_mask(segments_bt, batch['encoder_segment_ids'])
  embedded = target_module.apply({'params': jax.lax.stop_gradient(target_params)},
                                 batch['decoder_input_tokens'], method=target_module.embed)
  predicted = head.apply({'params': head_params}, feature_drafter.shift_features_right(features, segments_bt),
                         embedded, encoded, valid_bt, cross_mask, unroll_steps, segments_bt,
                         method=head.unrolled)
  ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)
  target_top_bt = jnp.argmax(target_logp, axis=-1)
  if ids is not None:
    p_bt = target_logp  # CE over the kept tokens: p restricted to K, renormalised
    p_bt = jax.nn.log_softmax(jnp.take(p_bt, ids, axis=-1), axis=-1)
  total, metrics = 0.0, {}
  for s, predicted_bte in enumerate(predicted):
    w_bt = weights_bt * feature_drafter.same_round_bt(segments_bt, features.shape[1], s)
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
