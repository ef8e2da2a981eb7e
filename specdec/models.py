"""A target and a drafter network wired to a decode function, T5X-style.

`SpeculativeEncoderDecoderModel` has the shape of T5X's `EncoderDecoderModel`:
`predict_batch_with_aux(params, batch, rng, decoder_params, ...)` over seqio
`EncDecFeatureConverter` batches, with `params = {'target': ..., 'drafter': ...}`.
Each input is encoded once per model, both decoding caches are built (the
cross-attention projections computed once), and the gin-configurable
`decode_fn` is called: `decoding.speculative_sample` (target + drafter) or
`decoding.temperature_sample` (the baseline, target alone). Which arguments
it gets and what it returns follow from its declared kind (`decoding.kind_of`).

The drafter is a T5 network, an n-gram model, or a feature head
(`feature_drafter.FeatureHead`, which reads the target's features: the
target's call then returns them too). A neural drafter may speak a trimmed
vocabulary (`draft_vocab_ids`): q = 0 outside it, the target still verifies
over its whole vocabulary.
"""

import functools
from typing import Any, Callable, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec import decoding
from specdec import draft_vocab
from specdec import drafters
from specdec import feature_decoding
from specdec import network

PyTree = Any
Batch = Mapping[str, jax.Array]

TARGET, DRAFTER = 'target', 'drafter'
# Optional params entry: the target's output projection over the draft
# vocabulary [E, K], sliced once (`with_draft_projection`) instead of in every
# decode, where gathering K strided columns of the [E, V] kernel costs about a
# target call.
DRAFT_PROJECTION = drafters.DRAFT_PROJECTION
# Optional params entry for a feature head narrower than the target: its
# logits kernel [W, K] (or [W, V]), its output map folded into the target's
# projection once (`with_draft_projection`, `feature_decoding.logits_kernel`).
DRAFT_LOGITS_KERNEL = drafters.DRAFT_LOGITS_KERNEL


def _vocab_size(module) -> int:
  return module.config.vocab_size


def _outside_vocab_message(key: str, vocab_size: int) -> str:
  return f'{key} holds ids outside [0, {vocab_size})'


def _raise_if_outside_vocab(any_outside, key: str, vocab_size: int) -> None:
  """Host side of the compiled id check (jax.debug.callback)."""
  if any_outside:
    raise ValueError(_outside_vocab_message(key, vocab_size)
                     + ' (checked inside the compiled function).')


def _host_id_range(x) -> Tuple[int, int]:
  """(min, max) of the ids this process holds: all of `x`, or (a multi-host global array) its addressable shards.

  On multi-host each process loads its own rows of a batch (`partitioning.global_batch`) and can read only
  those; each checks what it loaded.
  """
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    parts = [np.asarray(shard.data) for shard in x.addressable_shards]
  else:
    parts = [np.asarray(x)]
  return min(int(p.min()) for p in parts), max(int(p.max()) for p in parts)


class SpeculativeEncoderDecoderModel:
  """A target network, a drafter network and a decode function.

  Attributes:
    module: the target (a `network.Transformer` or anything with its
      `encode` / `init_cache` / `decode_step` / `__call__` methods).
    drafter_module: the drafter, same interface and vocabulary size.
    input_vocabulary, output_vocabulary: seqio vocabularies (may be None for
      token-level use); `output_vocabulary.eos_id` ends decodes (default 1).
    decode_fn: `decoding.speculative_sample` or `decoding.temperature_sample`
      (or a partial / gin configurable of either), or any function declared
      with `decoding.declare_kind`. An undeclared function is taken as T5X's
      decode_fn: autoregressive, returning (decodes, log_probs), without
      `shrink_batch`.
    max_input_length, max_decode_length: optional limits; longer batches are
      rejected with a ValueError before any compute.
    draft_vocab_ids: optional sorted token ids [K]: the drafter's logits are
      computed over these only (a T5 drafter or a feature head).
  """

  def __init__(self,
               module: network.Transformer,
               drafter_module: Optional[network.Transformer],
               input_vocabulary=None,
               output_vocabulary=None,
               decode_fn: Callable[..., Any] = decoding.speculative_sample,
               max_input_length: Optional[int] = None,
               max_decode_length: Optional[int] = None,
               draft_vocab_ids: Optional[Any] = None):
    self.module = module
    self.drafter_module = drafter_module
    self.input_vocabulary = input_vocabulary
    self.output_vocabulary = output_vocabulary
    self.decode_fn = decode_fn
    self.max_input_length = max_input_length
    self.max_decode_length = max_decode_length
    if decoding.kind_of(decode_fn) == decoding.SPECULATIVE and drafter_module is None:
      raise ValueError('decode_fn is speculative but drafter_module is None.')
    self.drafter_kind = None if drafter_module is None else drafters.kind_of(drafter_module)
    for name, vocab in (('input_vocabulary', input_vocabulary),
                        ('output_vocabulary', output_vocabulary)):
      if vocab is not None and vocab.vocab_size > _vocab_size(module):
        raise ValueError(f'{name} has {vocab.vocab_size} ids but the network '
                         f'only {_vocab_size(module)} embeddings.')
    if drafter_module is not None:
      self.drafter_kind.check(drafter_module, module)
    self.draft_vocab_ids = None
    if draft_vocab_ids is not None:
      self.draft_vocab_ids = draft_vocab.check_draft_vocab_ids(draft_vocab_ids, _vocab_size(module))
      if drafter_module is None or not self.drafter_kind.takes_vocab_ids(drafter_module):
        raise ValueError('draft_vocab_ids needs a neural drafter (a T5 network or a feature '
                         f'head), got {type(drafter_module).__name__}.')
    self._compiled = {}

  @property
  def feature_drafting(self) -> bool:
    """Whether the drafter reads the target's features."""
    return self.drafter_kind is not None and self.drafter_kind.reads_features

  @property
  def eos_id(self) -> int:
    vocab = self.output_vocabulary
    return 1 if vocab is None or vocab.eos_id is None else int(vocab.eos_id)

  # -------------------------------------------------------------------------
  # Parameters.
  # -------------------------------------------------------------------------

  def get_initial_params(self, rng: jax.Array, input_len: int = 8,
                         target_len: int = 8) -> dict:
    """Fresh params {'target': ..., 'drafter': ...} (float32)."""
    target_rng, drafter_rng = jax.random.split(rng)
    params = {TARGET: network.init_params(self.module.config, target_rng,
                                          input_len=input_len,
                                          target_len=target_len)}
    if self.drafter_module is not None:
      params[DRAFTER] = self.drafter_kind.init_params(self.drafter_module, drafter_rng, input_len, target_len)
    return params

  # -------------------------------------------------------------------------
  # Checks (before any expensive work).
  # -------------------------------------------------------------------------

  def validate_batch(self, batch: Batch, check_traced_ids: bool = True) -> None:
    """Raises ValueError naming the feature when a batch cannot be decoded.

    Shapes and lengths are checked at once. Token ids must lie in
    [0, vocab_size): concrete arrays are checked at once; traced ones (under
    the caller's own `jax.jit`) with `check_traced_ids` by a check compiled
    into the function, which fails the call (a `JaxRuntimeError` carrying the
    ValueError's message) instead of decoding garbage (out-of-range ids
    would read no embedding and decode to '').
    """
    for key in ('encoder_input_tokens', 'decoder_input_tokens'):
      if key not in batch:
        raise ValueError(f'batch is missing the feature {key!r} '
                         f'(has {sorted(batch)}).')
      if batch[key].ndim != 2:
        raise ValueError(f'{key} must be [batch, length], got {batch[key].shape}.')
    enc, dec = batch['encoder_input_tokens'], batch['decoder_input_tokens']
    if enc.shape[0] != dec.shape[0]:
      raise ValueError(f'encoder_input_tokens has {enc.shape[0]} rows but '
                       f'decoder_input_tokens {dec.shape[0]}.')
    for key, x in (('encoder_input_tokens', enc), ('decoder_input_tokens', dec)):
      if 0 in x.shape:  # the network cannot attend over nothing
        raise ValueError(f'{key} is empty (shape {tuple(x.shape)}): a batch needs '
                         '>= 1 row and >= 1 position (pad short inputs with 0).')
    if self.max_input_length and enc.shape[1] > self.max_input_length:
      raise ValueError(f'encoder_input_tokens has length {enc.shape[1]}, longer '
                       f'than the configured max_input_length={self.max_input_length}.')
    if self.max_decode_length and dec.shape[1] > self.max_decode_length:
      raise ValueError(f'decoder_input_tokens has length {dec.shape[1]}, longer '
                       f'than the configured max_decode_length={self.max_decode_length}.')
    vocab_size = _vocab_size(self.module)
    for key in ('encoder_input_tokens', 'decoder_input_tokens'):
      x = batch[key]
      if isinstance(x, jax.core.Tracer):
        if check_traced_ids:
          jax.debug.callback(
              functools.partial(_raise_if_outside_vocab, key=key, vocab_size=vocab_size),
              jnp.any((x < 0) | (x >= vocab_size)))
        continue
      lowest, highest = _host_id_range(x)
      if lowest < 0 or highest >= vocab_size:
        raise ValueError(_outside_vocab_message(key, vocab_size) + '.')

  # -------------------------------------------------------------------------
  # Decoding.
  # -------------------------------------------------------------------------

  def decoder_fns(self, module, params, encoder_input_tokens, max_decode_length,
                   constrain_cache: Optional[Callable[[PyTree], PyTree]] = None,
                   vocab_ids: Optional[jax.Array] = None,
                   projection_ek: Optional[jax.Array] = None):
    """Encodes once and returns (cache, tokens_to_logits) for one network.

    `constrain_cache` (e.g. sharding constraints, see sharded_decoding.py) is
    applied to the new cache and to the cache after every decode step, so
    the loop carries it with a fixed layout. With `vocab_ids` [K] (a T5
    network) the logits are computed over those tokens only and are -inf at
    every other token; `projection_ek` is then the network's projection over
    them if already sliced (`with_draft_projection`).
    """
    constrain = constrain_cache or (lambda cache: cache)
    encoded = module.apply({'params': params}, encoder_input_tokens,
                           enable_dropout=False, method=module.encode)
    _, variables = module.apply({'params': params}, encoded,
                                encoder_input_tokens, max_decode_length,
                                method=module.init_cache, mutable=['cache'])

    extra, ids = {}, None
    if vocab_ids is not None:
      # The projection's K columns, sliced once here rather than every step.
      ids = jnp.asarray(vocab_ids, jnp.int32)
      extra['projection_ek'] = projection_ek if projection_ek is not None else module.apply(
          {'params': params}, ids, method=module.projection_rows)

    def tokens_to_logits(state: decoding.DecodingState):
      # A draft tree's layout only where there is one: every network takes the chain's call.
      layout = {} if state.layout is None else {'layout': state.layout}
      logits, new_vars = module.apply(
          {'params': params, 'cache': state.cache}, state.cur_token,
          state.cur_index, method=module.decode_step, mutable=['cache'], **extra, **layout)
      if ids is not None:
        logits = feature_decoding.widen_logits(logits, ids, _vocab_size(module))
      return logits, constrain(new_vars.get('cache', {}))

    # A stateless drafter (e.g. an n-gram model) has an empty cache.
    return constrain(variables.get('cache', {})), tokens_to_logits

  def predict_batch_with_aux(
      self,
      params: PyTree,
      batch: Batch,
      rng: Optional[jax.Array] = None,
      decoder_params: Optional[Mapping[str, Any]] = None,
      return_all_decodes: bool = False,
      num_decodes: int = 1,
      prompt_with_targets: bool = False,
      *,
      constrain_cache: Optional[Callable[[PyTree], PyTree]] = None,
      check_traced_ids: bool = True,
  ) -> Tuple[jax.Array, Mapping[str, Any]]:
    """Decodes a batch: (decodes, aux) as T5X.

    The batch is checked first (`validate_batch`): shapes, lengths, and ids in
    [0, vocab_size). Called eagerly, bad ids raise ValueError at once; under
    your own `jax.jit` (traced ids) the check is compiled in and a bad batch
    fails the call with a JaxRuntimeError whose message has the ValueError's
    text. `check_traced_ids=False` drops that in-graph check (for callers that
    validated the concrete batch themselves, as `compile_predict` does).

    Args:
      params: {'target': ..., 'drafter': ...} ('drafter' unused by the
        baseline decode function), optionally with the draft vocabulary's
        projection (`with_draft_projection`).
      batch: seqio EncDecFeatureConverter features; `encoder_input_tokens`
        and `decoder_input_tokens` are used.
      rng: decode PRNG key.
      decoder_params: extra keyword arguments for `decode_fn` (temperature,
        topk, topp, gamma, max_decode_steps, lenience, return_stats, ...).
      return_all_decodes: return [B, num_decodes, L] instead of the best.
      num_decodes: samples per input.
      prompt_with_targets: teacher-force the non-zero decoder_input_tokens.
      constrain_cache: optional `cache -> cache` applied to both models'
        caches when built and after each decode step; the sharded predictor
        (sharded_decoding.py) passes sharding constraints here.
      check_traced_ids: see above.

    Returns:
      decodes [B, L] (or [B, nd, L]) and aux {'scores': log-probs, and with
      `return_stats` the speculative statistics}.
    """
    self.validate_batch(batch, check_traced_ids=check_traced_ids)
    decoder_params = dict(decoder_params or {})
    encoder_input_tokens = batch['encoder_input_tokens']
    decoder_input_tokens = batch['decoder_input_tokens']
    max_decode_length = decoder_input_tokens.shape[1]
    # The caches' slots: the decode's positions, and what the decode function writes past them (a draft tree).
    cache_length = decoding.cache_slots(self.decode_fn, max_decode_length, decoder_params)
    inputs = (decoder_input_tokens if prompt_with_targets
              else jnp.zeros_like(decoder_input_tokens))

    kind = decoding.kind_of(self.decode_fn)
    if kind == decoding.SPECULATIVE:
      cache, tokens_to_logits, draft_cache, draft_tokens_to_logits = self.drafter_kind.decoder_fns(
          self.module, params[TARGET], self.drafter_module, params[DRAFTER], encoder_input_tokens,
          cache_length, self.decoder_fns, constrain_cache, self.draft_vocab_ids,
          params.get(DRAFT_PROJECTION) if self.draft_vocab_ids is not None else None,
          params.get(DRAFT_LOGITS_KERNEL))
      if self.drafter_kind.reads_features:
        decoder_params['draft_reads_features'] = True
    else:
      cache, tokens_to_logits = self.decoder_fns(
          self.module, params[TARGET], encoder_input_tokens, cache_length,
          constrain_cache)
      decoder_params.pop('return_stats', None)
    kwargs = dict(inputs=inputs, cache=cache, tokens_to_logits=tokens_to_logits,
                  eos_id=self.eos_id, decode_rng=rng, num_decodes=num_decodes,
                  cache_offset=0)
    if kind == decoding.SPECULATIVE:
      kwargs.update(draft_cache=draft_cache,
                    draft_tokens_to_logits=draft_tokens_to_logits)
    if constrain_cache is not None and kind is not None:  # every declared kind takes shrink_batch
      # A sharded batch keeps its shape: a smaller one may not divide over the mesh's data axis.
      decoder_params.setdefault('shrink_batch', False)
    if kind == decoding.SPECULATIVE:
      decodes, scores, stats = self.decode_fn(**kwargs, **decoder_params)
    else:
      (decodes, scores), stats = self.decode_fn(**kwargs, **decoder_params), None
    aux = {'scores': scores}
    if stats is not None:
      aux['stats'] = stats
    if not return_all_decodes:
      decodes = decodes[:, -1]
      aux = jax.tree_util.tree_map(lambda x: x[:, -1], aux)
    return decodes, aux

  def with_draft_projection(self, params: PyTree) -> PyTree:
    """`params` plus what the drafter's logits read, prepared once for all the decodes they serve.

    A drafter with a trimmed vocabulary reads the K columns of an output
    projection (a T5 drafter's own, a feature head the target's); sliced
    inside every decode, that strided gather (and the copy to the layout the
    loop reads) is a per-example cost of about a target call on CPU. Slice it
    here once (`DRAFT_PROJECTION`, [E, K]). A feature head narrower than the
    target gets instead its output map folded into that projection
    (`DRAFT_LOGITS_KERNEL`, [W, K], or [W, V] without a draft vocabulary;
    `feature_decoding.folds_projection`). Otherwise `params` unchanged.
    """
    prepare = (None if self.drafter_module is None else
               self.drafter_kind.prepared_projection(self.module, self.drafter_module, self.draft_vocab_ids))
    if prepare is None:
      return params
    return dict(params, **jax.jit(prepare)(params[TARGET], params[DRAFTER]))

  def compile_predict(self, decoder_params: Optional[Mapping[str, Any]] = None,
                      num_decodes: int = 1, return_all_decodes: bool = False,
                      prompt_with_targets: bool = False):
    """A jit-compiled `(params, batch, rng) -> (decodes, aux)`, cached per setting.

    Batches are validated eagerly (shapes, lengths, ids) before the jitted
    call, so a bad batch fails before any compile or compute. Called inside
    another jit (a traced batch), the id check is compiled in instead.
    """
    key = (tuple(sorted((decoder_params or {}).items())), num_decodes,
           return_all_decodes, prompt_with_targets)
    if key not in self._compiled:
      jitted = jax.jit(
          functools.partial(
              self.predict_batch_with_aux, decoder_params=decoder_params,
              num_decodes=num_decodes, return_all_decodes=return_all_decodes,
              prompt_with_targets=prompt_with_targets),
          static_argnames=('check_traced_ids',))

      def predict(params, batch, rng=None):
        self.validate_batch(batch)
        batch = {k: batch[k] for k in ('encoder_input_tokens', 'decoder_input_tokens')}
        traced = any(isinstance(x, jax.core.Tracer) for x in batch.values())
        return jitted(params, batch, rng, check_traced_ids=traced)

      self._compiled[key] = predict
    return self._compiled[key]

  # -------------------------------------------------------------------------
  # Scoring.
  # -------------------------------------------------------------------------

  def score_batch(self, params: PyTree, batch: Batch,
                  which: str = TARGET) -> jax.Array:
    """Sum of target-token log-likelihoods under teacher forcing, [B].

    Tokens are weighted by `decoder_loss_weights` when present, else by
    `decoder_target_tokens > 0`. `which` selects 'target' or 'drafter'.
    """
    if which == DRAFTER and not self.drafter_kind.scores_itself():
      raise ValueError("score_batch(which='drafter'): a feature head drafts from the target's "
                       'features and has no teacher-forced score of its own; score the target.')
    module = self.module if which == TARGET else self.drafter_module
    targets = batch['decoder_target_tokens']
    logits = module.apply(
        {'params': params[which]}, batch['encoder_input_tokens'],
        batch['decoder_input_tokens'], targets,
        batch.get('encoder_segment_ids'), batch.get('decoder_segment_ids'),
        enable_dropout=False)
    log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1),
                                    targets[..., None], axis=-1)[..., 0]
    weights = batch.get('decoder_loss_weights')
    if weights is None:
      weights = targets > 0
    return jnp.sum(log_probs * weights, axis=-1)

