"""One interface for every drafter: what the model, the sharded predictor, the benchmark and the profiler ask of it.

A drafter is one of two kinds, `kind_of(module)`:

- `INDEPENDENT`: a model that drafts on its own: a T5 network (`network.Transformer`), an n-gram table
  (`ngram.NgramLM`), the oracle of controlled acceptance (`oracle.OracleDrafter`). It builds its own cache from
  the encoder input (`encode`, `init_cache`), and each draft step is its `decode_step` on the last token.
- `FEATURE_HEAD`: a head that drafts from the target's own features (`feature_drafter.FeatureHead`, EAGLE for
  encoder-decoder targets): the target's calls return their features, and each draft step reads a feature and
  predicts the next one (`decoding.LoopSpec.draft_reads_features`).

Each kind answers the same questions: its checks against the target, whether it takes a trimmed vocabulary,
its fresh params, the decode functions the loop calls (the target's and its own), what its logits read that
can be prepared once per run (`prepared_projection`), and whether it has a teacher-forced score of its own.
Code that treats drafters differently asks the kind, not the module's class.
"""

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec import feature_decoding
from specdec import feature_drafter
from specdec import network

PyTree = Any
# (module, params, encoder_input_tokens, max_decode_length, constrain_cache, vocab_ids, projection_ek)
#   -> (cache, tokens_to_logits): how a network decodes on its own (`models.SpeculativeEncoderDecoderModel.decoder_fns`).
NetworkFns = Callable[..., Tuple[PyTree, Callable[..., Any]]]
# Names of the prepared entries a params dict may carry (`prepared_projection`).
DRAFT_PROJECTION = 'draft_projection'
DRAFT_LOGITS_KERNEL = 'draft_logits_kernel'


def _vocab_size(module) -> int:
  return module.config.vocab_size


class DrafterKind:
  """The questions every drafter answers (see the module docstring); `INDEPENDENT` and `FEATURE_HEAD` answer them."""

  name: str = ''
  # Whether its draft steps read the target's features (the loop's `draft_reads_features`).
  reads_features: bool = False

  def check(self, module, target_module) -> None:
    """Raises ValueError when `module` cannot draft for `target_module`."""
    if _vocab_size(module) != _vocab_size(target_module):
      raise ValueError(
          f'Vocabulary mismatch: the target has vocab_size={_vocab_size(target_module)}, '
          f'the drafter vocab_size={_vocab_size(module)}; speculative '
          'decoding needs one shared vocabulary.')

  def takes_vocab_ids(self, module) -> bool:
    """Whether its logits can be computed over a trimmed vocabulary only."""
    raise NotImplementedError

  def init_params(self, module, rng: jax.Array, input_len: int, target_len: int) -> PyTree:
    raise NotImplementedError

  def decoder_fns(self, target_module, target_params, module, params, encoder_input_tokens, max_decode_length: int,
                  network_fns: NetworkFns, constrain_cache=None, vocab_ids=None, projection_ek=None,
                  logits_kernel_wk=None):
    """(target cache, target fn, draft cache, draft fn) for `decoding.speculative_sample`: encodes once."""
    raise NotImplementedError

  def folds_projection(self, module) -> bool:
    """Whether its logits read one kernel folded once per run (`DRAFT_LOGITS_KERNEL`)."""
    return False

  def prepared_projection(self, target_module, module, vocab_ids: Optional[np.ndarray]):
    """None when its logits read nothing worth preparing once per run; else `prepare(target_params,
    drafter_params) -> {name: array}`, the entries to add to the params (`DRAFT_PROJECTION`, [E, K]: the
    projection's K columns of a trimmed vocabulary; or `DRAFT_LOGITS_KERNEL`, [W, K] or [W, V]: a folded kernel)."""
    raise NotImplementedError

  def scores_itself(self) -> bool:
    """Whether it has a teacher-forced score of its own (`models...score_batch(which='drafter')`)."""
    return True

  def param_logical_axes(self, module) -> Optional[PyTree]:
    """Its params' logical axis names (T5X's names for the same kinds of weights), or None where a network's
    own rule applies (`partitioning.param_logical_axes`: a T5 network's names, a table's replicated)."""
    return None


class _Independent(DrafterKind):
  name = 'independent'
  reads_features = False

  def takes_vocab_ids(self, module) -> bool:
    return isinstance(module, network.Transformer)

  def init_params(self, module, rng, input_len, target_len):
    return network.init_params(module.config, rng, input_len=input_len, target_len=target_len)

  def decoder_fns(self, target_module, target_params, module, params, encoder_input_tokens, max_decode_length,
                  network_fns, constrain_cache=None, vocab_ids=None, projection_ek=None, logits_kernel_wk=None):
    cache, tokens_to_logits = network_fns(target_module, target_params, encoder_input_tokens, max_decode_length,
                                          constrain_cache)
    draft_cache, draft_tokens_to_logits = network_fns(module, params, encoder_input_tokens, max_decode_length,
                                                      constrain_cache, vocab_ids, projection_ek)
    return cache, tokens_to_logits, draft_cache, draft_tokens_to_logits

  def prepared_projection(self, target_module, module, vocab_ids):
    if vocab_ids is None:
      return None
    ids = jnp.asarray(vocab_ids, jnp.int32)

    def prepare(target_params, drafter_params):  # its own projection's K columns
      del target_params
      return {DRAFT_PROJECTION: module.apply({'params': drafter_params}, ids, method=module.projection_rows)}
    return prepare


class _FeatureHead(DrafterKind):
  name = 'feature head'
  reads_features = True

  def check(self, module, target_module) -> None:
    super().check(module, target_module)
    feature_drafter.check_target(module.config, target_module.config)

  def takes_vocab_ids(self, module) -> bool:
    return True

  def init_params(self, module, rng, input_len, target_len):
    return feature_drafter.init_params(module.config, rng)

  def decoder_fns(self, target_module, target_params, module, params, encoder_input_tokens, max_decode_length,
                  network_fns, constrain_cache=None, vocab_ids=None, projection_ek=None, logits_kernel_wk=None):
    return feature_decoding.decoder_fns(target_module, target_params, module, params, encoder_input_tokens,
                                        max_decode_length, vocab_ids, constrain_cache, projection_ek=projection_ek,
                                        logits_kernel_wk=logits_kernel_wk)

  def folds_projection(self, module) -> bool:
    return feature_decoding.folds_projection(module.config)

  def prepared_projection(self, target_module, module, vocab_ids):
    folds = self.folds_projection(module)
    if vocab_ids is None and not folds:
      return None
    ids = jnp.asarray(vocab_ids if vocab_ids is not None else np.arange(_vocab_size(target_module)), jnp.int32)

    def prepare(target_params, head_params):  # the target's projection, folded into the head's map if narrower
      projection_ek = target_module.apply({'params': target_params}, ids, method=target_module.projection_rows)
      if folds:
        return {DRAFT_LOGITS_KERNEL: feature_decoding.logits_kernel(head_params, projection_ek)}
      return {DRAFT_PROJECTION: projection_ek}
    return prepare

  def scores_itself(self) -> bool:
    return False

  def param_logical_axes(self, module) -> PyTree:
    return feature_drafter.param_logical_axes(module.config)


INDEPENDENT = _Independent()
FEATURE_HEAD = _FeatureHead()


def kind_of(module) -> DrafterKind:
  """The kind of drafter `module` is."""
  return FEATURE_HEAD if isinstance(module, feature_drafter.FeatureHead) else INDEPENDENT
