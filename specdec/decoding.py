"""Decode loops: T5X's `temperature_sample` and exact `speculative_sample`.

Both are one `lax.while_loop`, know nothing of networks, and talk to a model
only through `tokens_to_logits(DecodingState) -> (logits, new_cache)`.

Multi-token contract (used by `speculative_sample` for both models):
`state.cur_token` is [B, k] (k >= 1), `state.cur_index` is [B] and gives the
position of `cur_token[:, 0]` per row; the model writes the k tokens' keys and
values at those positions, drops writes at positions past its cache, and
returns `(logits [B, k, V], new_cache)` where logits[:, j] predicts position
`cur_index + j + 1`. `temperature_sample` calls it with k = 1 and also accepts
T5X's single-token return shape [B, V].

Sequence layout (as T5X): position 0 holds BOS (0); positions 1..L are the
output `decodes[..., :L]`; non-zero entries of `inputs[:, 1:]` are a prompt
that is teacher-forced and excluded from the log-probabilities; after a
generated EOS a row emits 0.

Feature drafting (`speculative_sample(..., draft_reads_features=True)`): the
drafter reads the target's final features instead of re-deriving them from
the text (feature_drafter.py). Then the target's call returns
`(logits [B, k, V], features [B, k, E], new_cache)`, features[:, j] being what
its output projection read for logits[:, j], and the drafter is called as
`draft_tokens_to_logits(state, features [B, k, E])` -> `(logits [B, k, V],
predicted features [B, k, E], new_cache)`: token j at position p enters with
the feature of position p-1 (the one that predicted it) and returns its
prediction of position p's feature.

Each decode function is declared with its kind (`kind_of`): `temperature_sample`
is AUTOREGRESSIVE (T5X's decode_fn contract, returns (decodes, log_probs)),
`speculative_sample` is SPECULATIVE (also takes the drafter's cache and
`draft_tokens_to_logits`, returns a `SpeculativeOutput`).
"""

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple, TypeVar, Union

import flax
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from specdec import batch_shrink
from specdec import sampling

PyTree = Any


@flax.struct.dataclass
class DecodingState:
  """What a decode loop hands to `tokens_to_logits` (T5X's fields).

  Attributes:
    cur_index: [B] position of `cur_token[:, 0]` in each row.
    sequences: [B, length] the sequences decoded so far (read-only context).
    cur_token: [B, k] tokens to feed at positions cur_index .. cur_index+k-1.
    cache: the model's decoding cache.
    layout: None, or where the k tokens sit when they are not consecutive (a
      draft tree's nodes, `draft_tree.SlotLayout`; `tree_decoding`): a model
      that takes it passes it to its `decode_step`.
  """
  cur_index: jax.Array
  sequences: jax.Array
  cur_token: jax.Array
  cache: PyTree
  layout: Optional[Any] = None


TokensToLogits = Callable[[DecodingState], Tuple[jax.Array, PyTree]]
DecodeFn = TypeVar('DecodeFn', bound=Callable[..., Any])

# The kinds of decode function `models.SpeculativeEncoderDecoderModel` calls.
# AUTOREGRESSIVE: T5X's decode_fn arguments, returns (decodes, log_probs).
# SPECULATIVE: also takes `draft_cache` and `draft_tokens_to_logits` and
# returns a `SpeculativeOutput`. A function declared with either kind also
# takes `shrink_batch`.
AUTOREGRESSIVE = 'autoregressive'
SPECULATIVE = 'speculative'
DECODE_KINDS = (AUTOREGRESSIVE, SPECULATIVE)


def declare_kind(kind: str) -> Callable[[DecodeFn], DecodeFn]:
  """A decorator that records a decode function's kind (read by `kind_of`)."""
  if kind not in DECODE_KINDS:
    raise ValueError(f'kind must be one of {DECODE_KINDS}, got {kind!r}.')

  def declare(fn: DecodeFn) -> DecodeFn:
    fn.decode_kind = kind
    return fn

  return declare


def kind_of(decode_fn: Callable[..., Any]) -> Optional[str]:
  """The kind `decode_fn` was declared with (`declare_kind`), None if undeclared.

  Seen through `functools.partial` and wrappers that set `__wrapped__` (gin's
  configurables, `functools.wraps`).
  """
  fn = decode_fn
  while fn is not None:
    kind = getattr(fn, 'decode_kind', None)
    if kind is not None:
      return kind
    fn = fn.func if isinstance(fn, functools.partial) else getattr(fn, '__wrapped__', None)
  return None


def cache_slots(decode_fn: Callable[..., Any], length: int, decoder_params: Mapping[str, Any]) -> int:
  """The cache slots a decode of `length` positions needs: `length`, plus what `decode_fn` declares as its
  `extra_cache_slots(**settings)` (a draft tree's nodes are written past the last position), its settings the
  keywords bound by partials on the way to it, then `decoder_params`. Seen through partials and wrappers as
  `kind_of`."""
  fn, bound = decode_fn, {}
  while fn is not None:
    extra = getattr(fn, 'extra_cache_slots', None)
    if extra is not None:
      return length + int(extra(**{**bound, **dict(decoder_params)}))
    if isinstance(fn, functools.partial):
      bound = {**fn.keywords, **bound}  # an outer partial's keywords win
      fn = fn.func
    else:
      fn = getattr(fn, '__wrapped__', None)
  return length


# ---------------------------------------------------------------------------
# Shared helpers.
# ---------------------------------------------------------------------------


def validate_settings(temperature=1.0, topk: int = 1, topp=0.0, lenience: float = 1.0, *,
                      gamma: Optional[int] = None, draft_confidence: float = 0.0) -> None:
  """Raises ValueError naming the setting when a decode loop cannot run with it (no inputs needed).

  Checks, in this order: `gamma` (drafts per round, an int >= 1; only when
  given, i.e. for speculative decoding), `draft_confidence` (in [0, 1)) and the
  sampling settings (`sampling.validate_sampling_args`: temperature, topk,
  topp, lenience). The one home of these checks: the decode loops, the
  benchmark's and the peers' settings all call it.
  """
  if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer))
                            or gamma < 1):
    raise ValueError(f'gamma must be an int >= 1, got {gamma!r}.')
  if (isinstance(draft_confidence, bool) or not isinstance(draft_confidence, (int, float))
      or not 0.0 <= draft_confidence < 1.0):
    raise ValueError(f'draft_confidence must be a float in [0, 1), got {draft_confidence!r}.')
  sampling.validate_sampling_args(temperature, topk, topp, lenience)


def validate_decode_args(inputs, eos_id, num_decodes: int = 1, temperature=1.0, topk: int = 1,
                         topp=0.0, max_decode_steps=None, lenience: float = 1.0, *,
                         gamma: Optional[int] = None, draft_confidence: float = 0.0) -> None:
  """Raises ValueError naming the argument when a decode loop cannot run with it.

  Checks, in this order: the settings (`validate_settings`: gamma, draft_confidence, temperature, topk, topp,
  lenience), the prompt `inputs` (a non-empty integer [batch, length] array), `eos_id`, `num_decodes` and a
  concrete `max_decode_steps` (in [0, length]). Runs on the Python values, before any tracing; traced values
  are left alone.
  """
  validate_settings(temperature, topk, topp, lenience, gamma=gamma, draft_confidence=draft_confidence)
  if inputs.ndim != 2:
    raise ValueError(f'inputs must be [batch, length], got shape {inputs.shape}.')
  if not jnp.issubdtype(inputs.dtype, jnp.integer):
    raise ValueError(f'inputs must hold integer token ids, got {inputs.dtype}.')
  if 0 in inputs.shape:
    raise ValueError(f'inputs is empty (shape {tuple(inputs.shape)}): decoding needs '
                     '>= 1 row and >= 1 position.')
  if not isinstance(eos_id, (int, np.integer)) or eos_id < 0:
    raise ValueError(f'eos_id must be an int >= 0, got {eos_id!r}.')
  if not isinstance(num_decodes, (int, np.integer)) or num_decodes < 1:
    raise ValueError(f'num_decodes must be an int >= 1, got {num_decodes!r}.')
  if max_decode_steps is not None and not isinstance(max_decode_steps, jax.core.Tracer):
    steps = np.asarray(max_decode_steps)
    if np.any(steps < 0) or np.any(steps > inputs.shape[1]):
      raise ValueError(
          f'max_decode_steps must be in [0, {inputs.shape[1]}] (the decode '
          f'length of `inputs`), got {max_decode_steps}.')


def expand_rows(x: jax.Array, num_decodes: int, axis: int = 0) -> jax.Array:
  """Repeats each batch row in place: [[a],[b]] -> [a,a,...,b,b,...]."""
  return jnp.repeat(x, num_decodes, axis=axis)


def expand_cache(cache: PyTree, num_decodes: int, cache_offset: int = 0):
  """Repeats the batch axis (`cache_offset`) of every cache leaf."""
  if num_decodes == 1:
    return cache
  def expand_leaf(x):
    x = jnp.asarray(x)
    return expand_rows(x, num_decodes, cache_offset) if x.ndim > cache_offset else x
  return jax.tree_util.tree_map(expand_leaf, cache)


def freeze_like(new_cache, old_cache):
  """`new_cache` as a FrozenDict where `old_cache` was one (a model's call may hand back a plain dict)."""
  if isinstance(old_cache, flax.core.FrozenDict):
    return flax.core.freeze(new_cache)
  return new_cache


def max_decode_len(inputs: jax.Array, max_decode_steps) -> jax.Array:
  """[B] the last position each row may fill (as T5X)."""
  length = inputs.shape[1]
  if max_decode_steps is None:
    return jnp.full((inputs.shape[0],), length, jnp.int32)
  prompt_len = jnp.sum(inputs != 0, axis=1).astype(jnp.int32)
  return jnp.minimum(length, prompt_len + jnp.asarray(max_decode_steps, jnp.int32))


def _zero_after_eos(sequences_bl: jax.Array, generated_bl: jax.Array,
                    eos_id: int) -> jax.Array:
  """Zeros every position after a row's first *generated* EOS."""
  is_eos = (sequences_bl == eos_id) & generated_bl
  seen_before = jnp.cumsum(is_eos, axis=1) - is_eos > 0
  return jnp.where(seen_before, 0, sequences_bl)


def _sort_by_log_prob(batch_size, num_decodes, decodes, log_prob, extra=None):
  """[B*nd, ...] -> [B, nd, ...] sorted by log-prob ascending (best last)."""
  unflat = lambda x: x.reshape((batch_size, num_decodes) + x.shape[1:])
  decodes, log_prob = unflat(decodes), unflat(log_prob)
  order = jnp.argsort(log_prob, axis=1)
  def take(x):
    idx = order.reshape(order.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)
  extra = None if extra is None else jax.tree_util.tree_map(
      lambda x: take(unflat(x)), extra)
  return take(decodes), take(log_prob), extra


# ---------------------------------------------------------------------------
# Baseline: T5X's temperature_sample.
# ---------------------------------------------------------------------------


@flax.struct.dataclass
class SamplingLoopState:
  """State of `temperature_sample`'s loop (T5X's fields)."""
  step: jax.Array
  cur_index: jax.Array
  sequences: jax.Array
  cache: PyTree
  cur_token: jax.Array
  ended: jax.Array
  rng: jax.Array
  log_prob: jax.Array


@declare_kind(AUTOREGRESSIVE)
def temperature_sample(
    inputs: jax.Array,
    cache: Mapping[str, jax.Array],
    tokens_to_logits: TokensToLogits,
    eos_id: int,
    decode_rng: Optional[jax.Array] = None,
    num_decodes: int = 1,
    temperature: Union[float, jax.Array] = 1.0,
    topk: int = 1,
    topp: float = 0.0,
    cache_offset: int = 0,
    initial_index: Optional[jax.Array] = None,
    max_decode_steps: Optional[Union[int, jax.Array]] = None,
    max_decode_steps_hard_limit: Optional[int] = None,
    rescale_log_probs: bool = True,
    state_callback_fn: Optional[Callable[[SamplingLoopState],
                                         SamplingLoopState]] = None,
    logit_callback_fn: Optional[Callable[[jax.Array, SamplingLoopState],
                                         jax.Array]] = None,
    shrink_batch: bool = True,
) -> Tuple[jax.Array, jax.Array]:
  """Temperature sampling, one target call per token (T5X's signature).

  Args:
    inputs: [B, L] int decoder prompt (B, L >= 1); inputs[:, 0] is ignored
      (BOS = 0 is fed), non-zero entries are teacher-forced. Ids must lie in
      [0, vocab_size): the loop cannot check them (it does not know the
      vocabulary), and an out-of-range id silently reads no embedding.
      `models.SpeculativeEncoderDecoderModel` checks its batches, also under
      jit.
    cache: the model's decoding cache (batch on axis `cache_offset`).
    tokens_to_logits: see the module docstring; called with k = 1.
    eos_id: end-of-sequence id.
    decode_rng: PRNG key (default PRNGKey(0)).
    num_decodes: samples per row; rows are repeated in place.
    temperature: >= 0; <= 1e-4 means argmax.
    topk: keep the k most likely tokens (0 = off). T5X's default is 1.
    topp: nucleus mass (0 = off); not together with topk.
    cache_offset: the batch axis of cache leaves.
    initial_index: optional [B] start positions for a prefilled cache.
    max_decode_steps: new tokens per row after the prompt.
    max_decode_steps_hard_limit: clips max_decode_steps.
    rescale_log_probs: score under the adjusted distribution (True) or under
      softmax(logits).
    state_callback_fn: applied to the loop state before each step.
    logit_callback_fn: applied to (logits [B, V], state) before sampling.
    shrink_batch: halve the loop's batch (down to B/8) whenever at most half
      its rows are still decoding (`batch_shrink.shrinking_while_loop`), so
      rows that ended stop paying for the others. Same outputs (sampled:
      other random draws); off when a callback is given (callbacks see the
      whole batch).

  Returns:
    (decodes [B, num_decodes, L], log_prob [B, num_decodes]) sorted by log_prob
    ascending, as T5X.
  """
  validate_decode_args(inputs, eos_id, num_decodes, temperature, topk, topp,
                       max_decode_steps)
  if decode_rng is None:
    decode_rng = jax.random.PRNGKey(0)
  if (max_decode_steps_hard_limit and max_decode_steps is not None):
    max_decode_steps = jnp.minimum(max_decode_steps, max_decode_steps_hard_limit)

  batch_size = inputs.shape[0]
  inputs = expand_rows(inputs, num_decodes)
  cache = expand_cache(cache, num_decodes, cache_offset)
  if initial_index is not None:
    initial_index = expand_rows(initial_index, num_decodes)
  rows, length = inputs.shape
  max_len_b = max_decode_len(inputs, max_decode_steps)
  # Known-greedy decoding takes argmax without drawing random numbers.
  known_greedy = sampling.static_greedy(temperature)

  # Two extra slots: the position after L, and a garbage slot that rows
  # which already reached their limit keep overwriting (as T5X).
  sequences0 = jnp.pad(inputs.astype(jnp.int32), ((0, 0), (0, 2)))
  if initial_index is None:
    index0 = jnp.zeros((rows,), jnp.int32)
    sequences0 = sequences0.at[:, 0].set(0)
  else:
    index0 = initial_index.astype(jnp.int32)
  token0 = jnp.take_along_axis(sequences0, index0[:, None], axis=1)
  generated0 = jnp.zeros_like(sequences0, dtype=bool)

  def body_fn(carry):
    state, generated, max_len_b = carry
    if state_callback_fn is not None:
      state = state_callback_fn(state)
    if known_greedy:
      step_rng = next_rng = state.rng
    else:
      step_rng, next_rng = jax.random.split(state.rng)
    logits, new_cache = tokens_to_logits(DecodingState(
        cur_index=state.cur_index, sequences=state.sequences[:, :-2],
        cur_token=state.cur_token, cache=state.cache))
    new_cache = freeze_like(new_cache, state.cache)
    if logits.ndim == 3:  # The multi-token contract, k = 1.
      logits = logits[:, 0]
    if logit_callback_fn is not None:
      logits = logit_callback_fn(logits, state)
    if known_greedy:  # argmax needs no normalisation and no random numbers
      sampled_b = sampling.argmax(logits)
      logp_bv = None
    else:
      logp_bv = sampling.adjusted_log_probs(logits, temperature, topk, topp)
      sampled_b = sampling.sample(step_rng, logp_bv)

    i_b = jnp.minimum(state.cur_index, max_len_b)
    forced_token_b = jnp.take_along_axis(state.sequences, (i_b + 1)[:, None],
                                         axis=1)[:, 0]
    is_forced_b = forced_token_b != 0
    token_b = jnp.where(is_forced_b, forced_token_b, sampled_b)
    token_b = jnp.where(state.ended, 0, token_b)
    counts_b = ~is_forced_b & ~state.ended
    log_prob_b = state.log_prob
    if not (known_greedy and rescale_log_probs):  # an argmax one-hot scores 0
      score_logp_bv = (logp_bv if rescale_log_probs
                       else jax.nn.log_softmax(logits.astype(jnp.float32)))
      log_prob_b = log_prob_b + jnp.where(
          counts_b, sampling.token_log_prob(score_logp_bv, sampled_b), 0.0)
    write_bl = jnp.arange(length + 2) == (i_b + 1)[:, None]
    sequences = jnp.where(write_bl, token_b[:, None], state.sequences)
    generated = generated | (write_bl & counts_b[:, None])
    ended = (state.ended | (counts_b & (token_b == eos_id))
             | (i_b >= max_len_b - 1))
    return SamplingLoopState(
        step=state.step + 1, cur_index=i_b + 1, sequences=sequences,
        cache=new_cache, cur_token=token_b[:, None], ended=ended,
        rng=next_rng, log_prob=log_prob_b), generated, max_len_b

  state0 = SamplingLoopState(
      step=jnp.zeros((), jnp.int32), cur_index=index0, sequences=sequences0,
      cache=cache, cur_token=token0, ended=index0 >= max_len_b,
      rng=decode_rng, log_prob=jnp.zeros((rows,), jnp.float32))
  carry0 = (state0, generated0, max_len_b)
  ended_fn = lambda carry: carry[0].ended
  if shrink_batch and state_callback_fn is None and logit_callback_fn is None:
    axes = (state0.replace(step=batch_shrink.SHARED, cur_index=0, sequences=0,
                           cache=batch_shrink.same_axis(cache, cache_offset),
                           cur_token=0, ended=0, rng=batch_shrink.SHARED, log_prob=0),
            0, 0)
    sequences, generated, log_prob = batch_shrink.shrinking_while_loop(
        body_fn, carry0, axes, ended_fn,
        lambda carry: (carry[0].sequences, carry[1], carry[0].log_prob))
  else:
    final, generated, _ = lax.while_loop(lambda carry: ~jnp.all(ended_fn(carry)), body_fn,
                                         carry0)
    if state_callback_fn is not None:
      final = state_callback_fn(final)
    sequences, log_prob = final.sequences, final.log_prob
  decodes = _zero_after_eos(sequences, generated, eos_id)[:, 1:-1]
  decodes, log_prob, _ = _sort_by_log_prob(batch_size, num_decodes, decodes,
                                           log_prob)
  return decodes, log_prob


# ---------------------------------------------------------------------------
# Speculative sampling (Leviathan et al. 2023, Algorithm 1).
#
# The loop body calls four phases in order, as Algorithm 1 reads:
#   draft   — the drafter proposes up to γ tokens (M_q, γ steps);
#   verify  — ONE target call scores x_i and the γ drafts (M_p on γ+1 tokens);
#   accept  — Algorithm 1's test keeps the leading drafts and picks one more
#             token from the residual or p_{n+1} (pure math, sampling.py);
#   commit  — writes the kept tokens, advances each row, counts statistics.
# Each is a function of (spec, state, ...) with its own test; the profiler
# (specdec/bench/profiling.py) times the same phases.
# ---------------------------------------------------------------------------


@flax.struct.dataclass
class SpeculativeLoopState:
  """State of `speculative_sample`'s loop: every per-row array of a decode.

  Attributes:
    cur_index: [B] position of each row's last committed token; the target has
      consumed every position before it, the drafter every position before
      it-1, and position it-1 too unless `draft_lag`.
    sequences: [B, L+γ+2] committed tokens (position 0 = BOS), then prompt.
    forced_bl: [B, L+γ+2] positions holding given prompt tokens (never
      sampled).
    max_len_b: [B] the last position each row may fill.
    target_cache, draft_cache: the two models' caches.
    draft_lag: [B] the last round kept every real draft, so the drafter has
      not consumed position cur_index-1 (the last kept draft) yet.
    ended: [B] rows that emitted EOS or reached their length limit.
    generated: [B, L+γ+2] positions holding sampled (not forced) tokens.
    rng: PRNG key (unused on the static greedy path).
    log_prob: [B] log-probability of the sampled tokens under adjusted p.
    stats: per-row counters (see `speculative_sample`); {} unless requested.
    draft_features: [B, γ+1, E] feature drafting only (else None): the
      target's features of positions feature_start .. feature_start+γ, from
      its last verify call (zeros before the first).
    feature_start: [B] feature drafting only: where those features start
      (-1 before the first round).
  """
  cur_index: jax.Array
  sequences: jax.Array
  forced_bl: jax.Array
  max_len_b: jax.Array
  target_cache: PyTree
  draft_cache: PyTree
  draft_lag: jax.Array
  ended: jax.Array
  generated: jax.Array
  rng: jax.Array
  log_prob: jax.Array
  stats: Mapping[str, jax.Array]
  draft_features: Optional[jax.Array] = None
  feature_start: Optional[jax.Array] = None


def row_axes(state: SpeculativeLoopState, cache_offset: int = 0,
             draft_cache_offset: int = 0) -> SpeculativeLoopState:
  """The row axis of every leaf of `state` (`batch_shrink`'s `axes`): 0, the
  caches' batch axes, and `batch_shrink.SHARED` for the PRNG key."""
  return state.replace(
      cur_index=0, sequences=0, forced_bl=0, max_len_b=0,
      target_cache=batch_shrink.same_axis(state.target_cache, cache_offset),
      draft_cache=batch_shrink.same_axis(state.draft_cache, draft_cache_offset), draft_lag=0,
      ended=0, generated=0, rng=batch_shrink.SHARED, log_prob=0,
      stats=batch_shrink.same_axis(state.stats, 0),
      draft_features=None if state.draft_features is None else 0,
      feature_start=None if state.feature_start is None else 0)


@dataclasses.dataclass(frozen=True)
class LoopSpec:
  """The static settings of one speculative decode (no per-row arrays).

  Attributes:
    gamma: drafts per round (γ).
    eos_id: end-of-sequence id.
    tokens_to_logits, draft_tokens_to_logits: the two models.
    temperature, topk, topp: the sampling settings of both p and q.
    lenience: 1 is exact; < 1 is Appendix A.5's approximate variant.
    rescale_log_probs: score tokens under adjusted p (True) or softmax.
    draft_confidence: adaptive drafting; a row stops drafting in a round once
      the drafter's probability of its drawn token is below this (0 = off).
    return_stats: count the per-row statistics.
    draft_reads_features: feature drafting (module docstring): the target
      also returns its features, the drafter reads them.
    fast_greedy (derived, not an argument): argmax decoding known at trace
      time (`sampling.static_greedy`) with lenience 1: drafts and verdicts by
      argmax, no normalisation, no random numbers, no q.
  """
  gamma: int
  eos_id: int
  tokens_to_logits: TokensToLogits
  draft_tokens_to_logits: TokensToLogits
  temperature: Any = 1.0
  topk: int = 0
  topp: Any = 0.0
  lenience: float = 1.0
  rescale_log_probs: bool = True
  draft_confidence: float = 0.0
  return_stats: bool = False
  draft_reads_features: bool = False
  fast_greedy: bool = dataclasses.field(init=False)

  def __post_init__(self):
    # Frozen: the derived field is set once, here.
    object.__setattr__(self, 'fast_greedy',
                       sampling.static_greedy(self.temperature) and self.lenience == 1.0)

  def adjust(self, logits_xv: jax.Array) -> jax.Array:
    return sampling.adjusted_log_probs(logits_xv, self.temperature, self.topk,
                                       self.topp)


class Drafts(NamedTuple):
  """What the draft phase hands to verification.

  Attributes:
    tokens_bg: [B, γ] drafts x_1..x_γ (entries at j >= num_drafted_b are
      placeholders, never kept).
    logq_bgv: [B, γ, V] adjusted log q each draft was sampled from; None on
      the static greedy path.
    num_drafted_b: [B] drafts made this round (γ unless adaptive drafting
      stopped the row earlier).
    cache: the drafter's cache after drafting.
  """
  tokens_bg: jax.Array
  logq_bgv: Optional[jax.Array]
  num_drafted_b: jax.Array
  cache: PyTree


class DraftCarry(NamedTuple):
  """The carry of `draft_phase`'s loop over draft positions.

  Attributes:
    j: the draft position to fill next (0-based, < γ); a Python int when
      the steps are unrolled (fixed γ).
    token_b: [B] the last draft, fed to the drafter next.
    cache: the drafter's cache.
    tokens_bg: [B, γ] the drafts so far.
    logq_bgv: [B, γ, V] their adjusted log q; None on the static greedy path.
    drafting_b: [B] rows still drafting (adaptive drafting stops them).
    num_drafted_b: [B] drafts made so far.
    feature_be: [B, E] feature drafting only (else None): the drafter's
      predicted feature of the last draft's position, fed with it next.
  """
  j: jax.Array
  token_b: jax.Array
  cache: PyTree
  tokens_bg: jax.Array
  logq_bgv: Optional[jax.Array]
  drafting_b: jax.Array
  num_drafted_b: jax.Array
  feature_be: Optional[jax.Array] = None


def _rows_at(x_bl: jax.Array, pos_b: jax.Array) -> jax.Array:
  """x[b, pos[b]] for each row."""
  return jnp.take_along_axis(x_bl, pos_b[:, None], axis=1)[:, 0]


def _draft_catch_up(spec: LoopSpec, state: SpeculativeLoopState) -> Tuple[jax.Array, PyTree]:
  """The drafter's first call of a round: logits [B, V] for position i+1.

  It feeds position i (the token the target committed last round), and also
  position i-1 when some row kept every draft last round (`draft_lag`), so
  the drafter never recomputes more of the prefix than it missed. Stale
  entries a rejected round left past i are overwritten before they are read.
  """
  i_b = state.cur_index

  def call(k):
    start_b = jnp.maximum(i_b - (k - 1), 0)
    window_bk = jnp.take_along_axis(state.sequences,
                                    start_b[:, None] + jnp.arange(k), axis=1)
    logits_bkv, cache = spec.draft_tokens_to_logits(DecodingState(
        cur_index=start_b, sequences=state.sequences, cur_token=window_bk,
        cache=state.draft_cache))
    cache = freeze_like(cache, state.draft_cache)
    # Row i-1 = 0 (at the start) reads its first slot: position i itself.
    logits_bv = jnp.take_along_axis(
        logits_bkv, jnp.minimum(i_b - start_b, k - 1)[:, None, None], axis=1)[:, 0]
    return logits_bv, cache

  lagging = jnp.any(state.draft_lag & ~state.ended)
  return lax.cond(lagging, lambda: call(2), lambda: call(1))


def _feature_catch_up(spec: LoopSpec, state: SpeculativeLoopState
                      ) -> Tuple[jax.Array, jax.Array, PyTree]:
  """A feature drafter's first call of a round: (logits [B, V], feature [B, E], cache).

  One fixed-width call on positions s+1 .. s+γ+1 (s = feature_start, the
  last verify's first position), each token with the target's true feature
  of the position before it: it rewrites every entry the last round drafted
  from predicted features. The row's entry at cur_index i (offset i-s-1 <= γ)
  gives the first draft; entries past i are stale and overwritten before
  they are read.
  """
  gamma = spec.gamma
  start_b = state.feature_start + 1
  window_bk = jnp.take_along_axis(state.sequences, start_b[:, None] + jnp.arange(gamma + 1),
                                  axis=1)
  logits_bkv, features_bke, cache = spec.draft_tokens_to_logits(
      DecodingState(cur_index=start_b, sequences=state.sequences, cur_token=window_bk,
                    cache=state.draft_cache), state.draft_features)
  cache = freeze_like(cache, state.draft_cache)
  at_b11 = jnp.clip(state.cur_index - start_b, 0, gamma)[:, None, None]
  logits_bv = jnp.take_along_axis(logits_bkv, at_b11, axis=1)[:, 0]
  feature_be = jnp.take_along_axis(features_bke, at_b11, axis=1)[:, 0]
  return logits_bv, feature_be.astype(state.draft_features.dtype), cache


def _pick_draft(spec: LoopSpec, state: SpeculativeLoopState, j, logits_bv, rng):
  """Draft for position i+1+j: (token [B], log q [B, V] or None, confidence [B]).

  Confidence is q of the drawn token (its top probability when greedy), 1
  for a given prompt token; it is computed only for adaptive drafting.
  """
  pos_b = state.cur_index + 1 + j
  if spec.fast_greedy:
    logq_bv = None
    if spec.draft_confidence > 0:
      token_b, confidence_b = sampling.argmax_and_top_prob(logits_bv)
    else:
      token_b, confidence_b = sampling.argmax(logits_bv), None
  else:
    logq_bv = spec.adjust(logits_bv)
    token_b = sampling.sample(rng, logq_bv)
    confidence_b = (jnp.exp(sampling.token_log_prob(logq_bv, token_b))
                    if spec.draft_confidence > 0 else None)
  forced_b = _rows_at(state.forced_bl, pos_b)
  token_b = jnp.where(forced_b, _rows_at(state.sequences, pos_b), token_b)
  if confidence_b is not None:
    confidence_b = jnp.where(forced_b, 1.0, confidence_b)
  return token_b, logq_bv, confidence_b


def draft_phase(spec: LoopSpec, state: SpeculativeLoopState,
                rng: Optional[jax.Array]) -> Drafts:
  """Up to γ drafter steps: the drafts of positions i+1 .. i+γ.

  With `spec.draft_confidence` > 0 a row stops drafting after a draft whose
  confidence is below it (that draft is still verified), and an ended row
  after its first; the loop stops when no row drafts any more. Stopping on the
  drafter's own draws never changes the output distribution: each kept token
  still passes Algorithm 1's test.
  """
  gamma, rows = spec.gamma, state.cur_index.shape[0]
  rngs_g = None if rng is None else jax.random.split(rng, gamma)
  if spec.draft_reads_features:
    logits_bv, feature_be, cache = _feature_catch_up(spec, state)
  else:
    (logits_bv, cache), feature_be = _draft_catch_up(spec, state), None
  token_b, logq_bv, confidence_b = _pick_draft(spec, state, 0, logits_bv,
                                               None if rngs_g is None else rngs_g[0])
  tokens_bg = jnp.zeros((rows, gamma), jnp.int32).at[:, 0].set(token_b)
  logq_bgv = None if logq_bv is None else jnp.zeros(
      (rows, gamma) + logq_bv.shape[1:], logq_bv.dtype).at[:, 0].set(logq_bv)
  adaptive = spec.draft_confidence > 0
  # An ended row drafts nothing more: its drafts are never verified, and a confident drafter would
  # otherwise keep every round at γ steps for the rows still running.
  drafting_b = ((confidence_b >= spec.draft_confidence) & ~state.ended if adaptive
                else jnp.ones((rows,), bool))
  num_drafted_b = jnp.ones((rows,), jnp.int32)
  if gamma == 1:
    return Drafts(tokens_bg, logq_bgv, num_drafted_b, cache)

  def cond(carry: DraftCarry):
    more = carry.j < gamma
    return more & jnp.any(carry.drafting_b) if adaptive else more

  def body(carry: DraftCarry) -> DraftCarry:
    j = carry.j
    call_state = DecodingState(cur_index=state.cur_index + j, sequences=state.sequences,
                               cur_token=carry.token_b[:, None], cache=carry.cache)
    feature_be = None
    if spec.draft_reads_features:
      logits_b1v, feature_b1e, new_cache = spec.draft_tokens_to_logits(
          call_state, carry.feature_be[:, None])
      feature_be = feature_b1e[:, 0].astype(carry.feature_be.dtype)
    else:
      logits_b1v, new_cache = spec.draft_tokens_to_logits(call_state)
    new_cache = freeze_like(new_cache, carry.cache)
    rng_j = None if rngs_g is None else rngs_g[j]
    token_b, logq_bv, confidence_b = _pick_draft(spec, state, j, logits_b1v[:, 0], rng_j)
    logq_bgv = carry.logq_bgv
    if logq_bgv is not None:
      logq_bgv = lax.dynamic_update_slice(logq_bgv, logq_bv[:, None], (0, j, 0))
    drafting_b = carry.drafting_b
    return DraftCarry(
        j=j + 1, token_b=token_b, cache=new_cache,
        tokens_bg=lax.dynamic_update_slice(carry.tokens_bg, token_b[:, None], (0, j)),
        logq_bgv=logq_bgv,
        drafting_b=(drafting_b & (confidence_b >= spec.draft_confidence)) if adaptive else drafting_b,
        num_drafted_b=carry.num_drafted_b + drafting_b, feature_be=feature_be)

  if not adaptive:
    # A fixed number of steps: unrolled, so each step's writes land in place
    # and nothing is carried through a loop (no per-iteration loop overhead).
    carry = DraftCarry(j=1, token_b=token_b, cache=cache, tokens_bg=tokens_bg,
                       logq_bgv=logq_bgv, drafting_b=drafting_b, num_drafted_b=num_drafted_b,
                       feature_be=feature_be)
    for _ in range(1, gamma):
      carry = body(carry)
    return Drafts(carry.tokens_bg, carry.logq_bgv, carry.num_drafted_b, carry.cache)
  final = lax.while_loop(cond, body, DraftCarry(
      j=jnp.ones((), jnp.int32), token_b=token_b, cache=cache, tokens_bg=tokens_bg,
      logq_bgv=logq_bgv, drafting_b=drafting_b, num_drafted_b=num_drafted_b,
      feature_be=feature_be))
  return Drafts(final.tokens_bg, final.logq_bgv, final.num_drafted_b, final.cache)


class Verified(NamedTuple):
  """What the verify call returns.

  Attributes:
    logits_bkv: [B, γ+1, V] the target's logits at positions i..i+γ.
    cache: the target's cache after the call.
    features_bke: [B, γ+1, E] its features there (feature drafting only,
      else None).
  """
  logits_bkv: jax.Array
  cache: PyTree
  features_bke: Optional[jax.Array] = None


def verify_phase(spec: LoopSpec, state: SpeculativeLoopState, drafts: Drafts) -> Verified:
  """ONE target call on [x_i, x_1..x_γ] at positions i..i+γ: logits [B, γ+1, V].

  With adaptive drafting the call is only as wide as the longest draft of any
  active row (m+1 tokens; one compiled branch per m): a verify call's cost
  grows with its width. Logits (and features) past m+1 are zeros and never
  read (no row has a draft there).
  """
  cur_token_b = _rows_at(state.sequences, state.cur_index)
  tokens_bk = jnp.concatenate([cur_token_b[:, None], drafts.tokens_bg], axis=1)

  def call(width):
    call_state = DecodingState(
        cur_index=state.cur_index, sequences=state.sequences, cur_token=tokens_bk[:, :width],
        cache=state.target_cache)
    if spec.draft_reads_features:
      logits_bwv, features_bwe, cache = spec.tokens_to_logits(call_state)
      features_bwe = features_bwe.astype(state.draft_features.dtype)
    else:
      (logits_bwv, cache), features_bwe = spec.tokens_to_logits(call_state), None
    pad = ((0, 0), (0, spec.gamma + 1 - width), (0, 0))
    if width < spec.gamma + 1:
      logits_bwv = jnp.pad(logits_bwv, pad)
      features_bwe = None if features_bwe is None else jnp.pad(features_bwe, pad)
    return Verified(logits_bwv, freeze_like(cache, state.target_cache), features_bwe)

  if spec.draft_confidence <= 0 or spec.gamma == 1:
    return call(spec.gamma + 1)
  longest = jnp.max(jnp.where(state.ended, 1, drafts.num_drafted_b))
  return lax.switch(longest - 1, [functools.partial(call, m + 1) for m in range(1, spec.gamma + 1)])


def accept_phase(spec: LoopSpec, state: SpeculativeLoopState, drafts: Drafts,
                 logits_bkv: jax.Array, rng: Optional[jax.Array]
                 ) -> Tuple[sampling.Verdict, Optional[jax.Array]]:
  """Algorithm 1's test on the drafts: (Verdict, adjusted log p [B, γ+1, V]).

  log p is None on the static greedy path (argmax needs no normalisation).
  """
  pos_bk = state.cur_index[:, None] + 1 + jnp.arange(spec.gamma + 1)
  forced_bg = jnp.take_along_axis(state.forced_bl, pos_bk[:, :spec.gamma], axis=1)
  if spec.fast_greedy:
    return sampling.verify_greedy(drafts.tokens_bg, logits_bkv, forced_bg,
                                  num_drafted_b=drafts.num_drafted_b), None
  logp_bkv = spec.adjust(logits_bkv)
  verdict = sampling.verify(
      rng, drafts.tokens_bg, drafts.logq_bgv, logp_bkv, lenience=spec.lenience,
      forced_bg=forced_bg, greedy=sampling.is_greedy(spec.temperature),
      target_logits_bgv=logits_bkv, num_drafted_b=drafts.num_drafted_b)
  return verdict, logp_bkv


def commit_phase(spec: LoopSpec, state: SpeculativeLoopState, drafts: Drafts,
                 verdict: sampling.Verdict, logits_bkv: jax.Array,
                 logp_bkv: Optional[jax.Array], target_cache: PyTree,
                 rng: jax.Array, target_features_bke: Optional[jax.Array] = None
                 ) -> SpeculativeLoopState:
  """Writes the n kept drafts and the next token, advances rows, counts stats.

  Rows stop at their length limit and after a generated EOS (written, then
  nothing more); ended rows write nothing. With feature drafting, the verify
  call's features (`target_features_bke`, positions i..i+γ) are kept for the
  drafter's next catch-up.
  """
  gamma = spec.gamma
  i_b, n_b = state.cur_index, verdict.num_accepted_b
  steps_g1 = jnp.arange(gamma + 1)
  pos_bk = i_b[:, None] + 1 + steps_g1  # positions of the γ+1 candidates
  row_ids = jnp.arange(i_b.shape[0])[:, None]
  forced_bk = state.forced_bl[row_ids, pos_bk]
  old_bk = state.sequences[row_ids, pos_bk]
  # Candidates: the n kept drafts, then the residual/bonus token (or the
  # given prompt token there).
  next_b = jnp.where(_rows_at(forced_bk, n_b), _rows_at(old_bk, n_b), verdict.next_token_b)
  cand_bk = jnp.where(steps_g1 < n_b[:, None],
                      jnp.pad(drafts.tokens_bg, ((0, 0), (0, 1))), next_b[:, None])
  active_b = ~state.ended
  sampled_bk = ~forced_bk
  in_limit_bk = pos_bk <= state.max_len_b[:, None]
  in_budget_bk = (steps_g1 <= n_b[:, None]) & in_limit_bk
  is_eos_bk = in_budget_bk & sampled_bk & (cand_bk == spec.eos_id)
  # Keep candidates up to and including the first generated EOS.
  before_eos_bk = (jnp.cumsum(is_eos_bk, axis=1) - is_eos_bk) == 0
  write_bk = in_budget_bk & before_eos_bk & active_b[:, None]

  sequences = state.sequences.at[row_ids, pos_bk].set(jnp.where(write_bk, cand_bk, old_bk))
  generated = state.generated.at[row_ids, pos_bk].set(
      state.generated[row_ids, pos_bk] | (write_bk & sampled_bk))
  log_prob = state.log_prob
  if not (spec.fast_greedy and spec.rescale_log_probs):  # argmax one-hots score 0
    score_logp_bkv = (logp_bkv if spec.rescale_log_probs
                      else jax.nn.log_softmax(logits_bkv.astype(jnp.float32)))
    log_prob = log_prob + jnp.sum(jnp.where(
        write_bk & sampled_bk, sampling.token_log_prob(score_logp_bkv, cand_bk), 0.0), axis=1)

  hit_eos_b = jnp.any(is_eos_bk & write_bk, axis=1)
  new_i_b = jnp.where(active_b, jnp.minimum(i_b + n_b + 1, state.max_len_b), i_b)
  ended = state.ended | hit_eos_b | (new_i_b >= state.max_len_b)
  stats = (_count_stats(spec, state, drafts, verdict, sampled_bk, in_limit_bk,
                        before_eos_bk, write_bk) if spec.return_stats else state.stats)
  features = {}
  if spec.draft_reads_features:
    features = dict(draft_features=target_features_bke, feature_start=i_b)
  return state.replace(
      cur_index=new_i_b, sequences=sequences, target_cache=target_cache,
      draft_cache=drafts.cache, draft_lag=n_b >= drafts.num_drafted_b, ended=ended,
      generated=generated, rng=rng, log_prob=log_prob, stats=stats, **features)


def _count_stats(spec, state, drafts, verdict, sampled_bk, in_limit_bk, before_eos_bk,
                 write_bk):
  """Per-row counters over the sampled (not forced) drafts.

  `drafted`: real drafts within the row's length limit; `judged`: those
  compared, up to and including the first rejection and not after a
  generated EOS; `accepted`: judged and kept.
  """
  gamma, n_b = spec.gamma, verdict.num_accepted_b
  steps_g = jnp.arange(gamma)
  active_b1 = ~state.ended[:, None]
  real_bg = steps_g < drafts.num_drafted_b[:, None]
  drafted_bg = (sampled_bk & in_limit_bk)[:, :gamma] & real_bg & active_b1
  judged_bg = drafted_bg & before_eos_bk[:, :gamma] & (steps_g <= n_b[:, None])
  kept_bg = judged_bg & verdict.accepted_bg
  s = state.stats
  return dict(
      target_calls=s['target_calls'] + active_b1[:, 0],
      drafted=s['drafted'] + jnp.sum(drafted_bg, axis=1),
      judged=s['judged'] + jnp.sum(judged_bg, axis=1),
      accepted=s['accepted'] + jnp.sum(kept_bg, axis=1),
      accepted_at=s['accepted_at'] + kept_bg,
      overlap_sum=s['overlap_sum'] + jnp.sum(
          jnp.where(judged_bg, verdict.overlap_bg, 0.0), axis=1),
      overlap_count=s['overlap_count'] + jnp.sum(judged_bg, axis=1),
      emitted=s['emitted'] + jnp.sum(write_bk & sampled_bk, axis=1),
  )


def speculative_step(spec: LoopSpec, state: SpeculativeLoopState) -> SpeculativeLoopState:
  """One round of Algorithm 1: draft, verify, accept, commit."""
  if spec.fast_greedy:
    rng = draft_rng = accept_rng = None
  else:
    rng, draft_rng, accept_rng = jax.random.split(state.rng, 3)
  # Named scopes put each phase in the ops' metadata: profiles and compiled
  # programs say which phase a kernel belongs to (hlo_facts.loop_kernels_by_origin).
  with jax.named_scope('draft_phase'):
    drafts = draft_phase(spec, state, draft_rng)
  with jax.named_scope('verify_phase'):
    verified = verify_phase(spec, state, drafts)
  with jax.named_scope('accept_phase'):
    verdict, logp_bkv = accept_phase(spec, state, drafts, verified.logits_bkv, accept_rng)
  with jax.named_scope('commit_phase'):
    return commit_phase(spec, state, drafts, verdict, verified.logits_bkv, logp_bkv,
                        verified.cache, state.rng if rng is None else rng, verified.features_bke)


def _check_cache_length(cache, length: int, cache_offset: int, name: str) -> None:
  """Self-attention caches must hold every decode position.

  Leaves named `cached_key` follow the project's layout [B, L, heads, dim]
  (batch on `cache_offset`, length right after it). A shorter cache would
  drop the keys of late positions and silently change their logits.
  """
  for cache_len in position_cache_lengths(cache, cache_offset):
    if cache_len < length:
      raise ValueError(
          f'{name} holds {cache_len} decode positions but inputs has length '
          f'{length}: build the cache with max_decode_length >= {length}.')


def position_cache_lengths(cache, cache_offset: int = 0) -> List[int]:
  """The length (slots) of every self-attention key cache in `cache`: leaves named `cached_key` in the project's
  layout [.., B, L, heads, dim], batch on `cache_offset`; [] for a cache without one (an n-gram table's)."""
  lengths = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]:
    last = path[-1]
    key = getattr(last, 'key', getattr(last, 'name', None))
    if key == 'cached_key' and jnp.ndim(leaf) == 4 + cache_offset:
      lengths.append(int(jnp.shape(leaf)[cache_offset + 1]))
  return lengths


def _call_shapes(tokens_to_logits, cache, sequences_shape, k, name, *,
                 features_in=None, features_out=False):
  """Abstractly evaluates one k-token call, at no cost: (logits shape, features or None).

  `features_in` (a ShapeDtypeStruct [B, k, E]) is passed as the call's second
  argument (a feature drafter); `features_out`: the call returns
  (logits, features, cache), features a ShapeDtypeStruct.
  """
  rows = sequences_shape[0]
  state = DecodingState(
      cur_index=jax.ShapeDtypeStruct((rows,), jnp.int32),
      sequences=jax.ShapeDtypeStruct(sequences_shape, jnp.int32),
      cur_token=jax.ShapeDtypeStruct((rows, k), jnp.int32),
      cache=jax.tree_util.tree_map(
          lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
          cache))
  args = (state,) if features_in is None else (state, features_in)
  returns = '(logits, features, new_cache)' if features_out else '(logits, new_cache)'
  try:
    out = jax.eval_shape(tokens_to_logits, *args)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{name} failed on a [{rows}, {k}] token block; it must '
                     'accept k >= 1 tokens per row (multi-token contract): '
                     f'{e}') from e
  if not isinstance(out, tuple) or len(out) != (3 if features_out else 2):
    raise ValueError(f'{name} must return {returns}.')
  logits = out[0]
  if logits.ndim != 3 or logits.shape[:2] != (rows, k):
    raise ValueError(f'{name} must return logits [batch, k={k}, vocab] for a '
                     f'[{rows}, {k}] token block, got {logits.shape}.')
  features = out[1] if features_out else None
  if features is not None and (features.ndim != 3 or features.shape[:2] != (rows, k)):
    raise ValueError(f'{name} must return features [batch, k={k}, width] for a '
                     f'[{rows}, {k}] token block, got {features.shape}.')
  return logits.shape, features


def check_models(inputs: jax.Array, gamma: int, cache, cache_offset: int, tokens_to_logits,
                 draft_cache, draft_cache_offset: int, draft_tokens_to_logits,
                 draft_reads_features: bool = False) -> Optional[jax.ShapeDtypeStruct]:
  """Raises ValueError when the two models cannot run the loop on `inputs`.

  Both caches must hold every decode position, both models must follow the
  multi-token contract and share one vocabulary, and concrete prompt ids
  must lie in it (traced ones cannot be checked here). With feature
  drafting, the drafter must return features as wide as the target's;
  returns the target's features [B, γ+1, E] (shape and dtype), else None.
  """
  batch_size, length = inputs.shape
  _check_cache_length(cache, length, cache_offset, 'cache')
  _check_cache_length(draft_cache, length, draft_cache_offset, 'draft_cache')
  buffer_len = length + gamma + 2
  target_shape, features = _call_shapes(
      tokens_to_logits, cache, (batch_size, buffer_len), gamma + 1, 'tokens_to_logits',
      features_out=draft_reads_features)
  draft_k = gamma + 1 if draft_reads_features else 2
  draft_shape, draft_features = _call_shapes(
      draft_tokens_to_logits, draft_cache, (batch_size, buffer_len), draft_k,
      'draft_tokens_to_logits', features_in=features, features_out=draft_reads_features)
  if draft_reads_features and draft_features.shape != features.shape:
    raise ValueError(
        f'Feature width mismatch: the target returns features {features.shape}, the '
        f'drafter predicts {draft_features.shape} from them; a feature drafter '
        "predicts the target's own features.")
  if target_shape[-1] != draft_shape[-1]:
    raise ValueError(
        f'Vocabulary mismatch: the target gives {target_shape[-1]} logits per '
        f'token, the drafter (draft_tokens_to_logits) {draft_shape[-1]}. '
        'Speculative decoding needs one shared vocabulary.')
  if not isinstance(inputs, jax.core.Tracer) and getattr(inputs, 'is_fully_addressable', True):
    concrete = np.asarray(inputs)
    if concrete.min() < 0 or concrete.max() >= target_shape[-1]:
      raise ValueError(f'inputs holds ids outside [0, {target_shape[-1]}) (the '
                       "target's vocabulary).")
  return features


def _zero_stats(rows: int, gamma: int) -> Dict[str, jax.Array]:
  zeros_b = jnp.zeros((rows,), jnp.int32)
  return dict(target_calls=zeros_b, drafted=zeros_b, judged=zeros_b, accepted=zeros_b,
              accepted_at=jnp.zeros((rows, gamma), jnp.int32),
              overlap_sum=jnp.zeros((rows,), jnp.float32), overlap_count=zeros_b,
              emitted=zeros_b)


def _initial_state(spec: LoopSpec, inputs: jax.Array, max_decode_steps, target_cache: PyTree,
                   draft_cache: PyTree, rng: jax.Array,
                   features: Optional[jax.ShapeDtypeStruct] = None) -> SpeculativeLoopState:
  """The loop's state before its first round, for int32 prompts `inputs` [B, L].

  With feature drafting (`features`: the target's [., γ+1, E] and dtype),
  the drafter's first call reads zeros: there is no feature before BOS.
  """
  rows = inputs.shape[0]
  feature_state = {}
  if features is not None:
    feature_state = dict(
        draft_features=jnp.zeros((rows,) + features.shape[1:], features.dtype),
        feature_start=jnp.full((rows,), -1, jnp.int32))
  sequences0 = jnp.pad(inputs, ((0, 0), (0, spec.gamma + 2))).at[:, 0].set(0)
  max_len_b = max_decode_len(inputs, max_decode_steps)
  return SpeculativeLoopState(
      cur_index=jnp.zeros((rows,), jnp.int32), sequences=sequences0,
      # Prompt tokens (non-zero inputs past BOS) are given, never sampled.
      forced_bl=(sequences0 != 0).at[:, 0].set(False), max_len_b=max_len_b,
      target_cache=target_cache, draft_cache=draft_cache, draft_lag=jnp.zeros((rows,), bool),
      ended=max_len_b <= 0, generated=jnp.zeros_like(sequences0, dtype=bool),
      rng=rng, log_prob=jnp.zeros((rows,), jnp.float32),
      stats=_zero_stats(rows, spec.gamma) if spec.return_stats else {}, **feature_state)


class SpeculativeOutput(NamedTuple):
  """What `speculative_sample` returns, rows sorted by log_prob ascending (best last).

  Attributes:
    decodes: [B, nd, L] the decodes.
    log_prob: [B, nd] their log-probabilities.
    stats: per-row statistics, {name: [B, nd, ...]} (see `speculative_sample`)
      when `return_stats=True`, else None.
  """
  decodes: jax.Array
  log_prob: jax.Array
  stats: Optional[Dict[str, jax.Array]]


@declare_kind(SPECULATIVE)
def speculative_sample(
    inputs: jax.Array,
    cache: Mapping[str, jax.Array],
    tokens_to_logits: TokensToLogits,
    draft_cache: Mapping[str, jax.Array],
    draft_tokens_to_logits: TokensToLogits,
    eos_id: int,
    gamma: int = 4,
    decode_rng: Optional[jax.Array] = None,
    num_decodes: int = 1,
    temperature: Union[float, jax.Array] = 1.0,
    topk: int = 1,
    topp: float = 0.0,
    cache_offset: int = 0,
    draft_cache_offset: Optional[int] = None,
    max_decode_steps: Optional[Union[int, jax.Array]] = None,
    max_decode_steps_hard_limit: Optional[int] = None,
    rescale_log_probs: bool = True,
    lenience: float = 1.0,
    draft_confidence: float = 0.0,
    return_stats: bool = False,
    shrink_batch: bool = True,
    draft_reads_features: bool = False,
) -> SpeculativeOutput:
  """Speculative sampling: the target's output distribution, fewer target calls.

  Each loop iteration drafts γ tokens with the drafter, scores all γ+1
  positions with ONE multi-token target call, keeps the leading drafts that
  pass Algorithm 1's test (per row), and samples one more token from the
  residual or, when all drafts were kept, from p_{n+1}. Greedy outputs equal
  `temperature_sample`'s token for token; sampled outputs have its
  distribution exactly (lenience = 1).

  Arguments are `temperature_sample`'s (prompt ids in `inputs` are checked
  against the vocabulary when `inputs` is concrete, not under a caller's jit),
  plus:
    draft_cache, draft_tokens_to_logits: the drafter's; both models follow the
      multi-token contract (module docstring) and share one vocabulary.
    gamma: drafts per iteration (γ >= 1), the most with adaptive drafting.
    draft_cache_offset: batch axis of the drafter's cache (default
      `cache_offset`).
    lenience: l in (0, 1]. 1 is exact; l < 1 is the paper's approximate
      variant (Appendix A.5) and no longer preserves the distribution.
    draft_confidence: in [0, 1). Adaptive drafting (beyond the paper): a row
      stops drafting in a round after a draft the drafter gave probability
      below this (its top probability when greedy). Exact for any value;
      0 drafts γ tokens every round.
    return_stats: also return per-row statistics.
    shrink_batch: halve the loop's batch (down to B/8) whenever at most half
      its rows are still decoding (`batch_shrink.shrinking_while_loop`): rows
      that ended stop paying for the others. Same outputs (sampled: other
      random draws).
    draft_reads_features: feature drafting (module docstring): the target's
      call also returns its features and the drafter predicts from them
      (feature_decoding.py builds both functions).

  Returns:
    A `SpeculativeOutput` (decodes [B, nd, L], log_prob [B, nd], stats),
    rows sorted by log_prob ascending. `stats` is None unless
    `return_stats=True`; then a dict of [B, nd] arrays (same order):
    `target_calls` (iterations the row took part in), `drafted` (real drafts
    within the row's length budget), `judged` (drafts actually compared: up
    to and including the first rejection), `accepted`, `accepted_at`
    [B, nd, γ] (how often draft position j was kept), `overlap_sum` /
    `overlap_count` (Σ over verified positions of Σ_x min(p, q), the paper's
    α estimator), `emitted` (tokens produced).
  """
  validate_decode_args(inputs, eos_id, num_decodes, temperature, topk, topp,
                       max_decode_steps, lenience, gamma=gamma,
                       draft_confidence=draft_confidence)
  if draft_cache_offset is None:
    draft_cache_offset = cache_offset
  if decode_rng is None:
    decode_rng = jax.random.PRNGKey(0)
  if (max_decode_steps_hard_limit and max_decode_steps is not None):
    max_decode_steps = jnp.minimum(max_decode_steps, max_decode_steps_hard_limit)
  features = check_models(inputs, gamma, cache, cache_offset, tokens_to_logits, draft_cache,
                           draft_cache_offset, draft_tokens_to_logits, bool(draft_reads_features))

  batch_size, length = inputs.shape
  spec = LoopSpec(
      gamma=int(gamma), eos_id=int(eos_id), tokens_to_logits=tokens_to_logits,
      draft_tokens_to_logits=draft_tokens_to_logits, temperature=temperature, topk=topk,
      topp=topp, lenience=lenience, rescale_log_probs=rescale_log_probs,
      draft_confidence=float(draft_confidence), return_stats=return_stats,
      draft_reads_features=bool(draft_reads_features))
  state0 = _initial_state(
      spec, expand_rows(inputs, num_decodes).astype(jnp.int32), max_decode_steps,
      expand_cache(cache, num_decodes, cache_offset),
      expand_cache(draft_cache, num_decodes, draft_cache_offset), decode_rng, features)
  return run_rounds(functools.partial(speculative_step, spec), state0,
                    row_axes(state0, cache_offset, draft_cache_offset) if shrink_batch else None,
                    eos_id, batch_size, num_decodes, length, return_stats)


def run_rounds(step: Callable[[Any], Any], state0: Any, axes: Optional[Any], eos_id: int, batch_size: int,
               num_decodes: int, length: int, return_stats: bool) -> SpeculativeOutput:
  """A speculative loop run to the end and its output: `step` (one round) until every row has ended, with a
  shrinking batch when `axes` (each state leaf's row axis, `batch_shrink`) is given; the decodes [B, nd, L]
  zeroed after EOS, sorted by log-prob. The state has `sequences`, `generated`, `log_prob`, `stats`, `ended`
  (`SpeculativeLoopState`, `tree_decoding.TreeLoopState`)."""
  outputs_fn = lambda s: (s.sequences, s.generated, s.log_prob, s.stats)
  if axes is not None:
    sequences, generated, log_prob, stats = batch_shrink.shrinking_while_loop(
        step, state0, axes, lambda s: s.ended, outputs_fn)
  else:
    sequences, generated, log_prob, stats = outputs_fn(
        lax.while_loop(lambda s: ~jnp.all(s.ended), step, state0))
  decodes = _zero_after_eos(sequences, generated, eos_id)[:, 1:length + 1]
  return SpeculativeOutput(*_sort_by_log_prob(
      batch_size, num_decodes, decodes, log_prob, stats if return_stats else None))
