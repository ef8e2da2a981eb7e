"""The sampling math of speculative decoding, as pure jit-able functions.

Every decode loop in this project (the baseline and the speculative one) calls
these functions, so that the target's p and the drafter's q are adjusted by the
same rule and a draft is always judged with exactly the q it was sampled from
(PAPER.md, "Setting").

Distributions are carried as log-probabilities `logp_...v` (float32, `-inf`
where a token has zero mass). Argmax decoding (temperature <= MIN_TEMPERATURE)
is represented as a one-hot distribution, which makes it an exact special case
of Algorithm 1: a draft is kept iff it equals argmax p, and on rejection the
residual norm(max(0, p - q)) is the one-hot of argmax p.
"""

from typing import NamedTuple, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

# As T5X: temperatures at or below this are argmax decoding.
MIN_TEMPERATURE = 1e-4

Scalar = Union[float, int, jax.Array]


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def validate_sampling_args(temperature: Scalar = 1.0, topk: int = 0,
                           topp: Scalar = 0.0, lenience: float = 1.0) -> None:
  """Raises ValueError naming the argument when a sampling setting is invalid.

  Traced (jit-time) values cannot be inspected and are left alone; `topk` and
  `lenience` decide shapes and branches, so they must be Python numbers.
  """
  if _is_concrete(temperature):
    t = np.asarray(temperature)
    if t.ndim != 0:
      raise ValueError(f'temperature must be a scalar, got shape {t.shape}.')
    if not np.isfinite(t) or t < 0:
      raise ValueError(f'temperature must be >= 0, got {float(t)}.')
  if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)):
    raise ValueError(f'topk must be a Python int >= 0, got {topk!r}.')
  if topk < 0:
    raise ValueError(f'topk must be >= 0, got {topk}.')
  if _is_concrete(topp):
    if not 0.0 <= float(topp) <= 1.0:
      raise ValueError(f'topp must be in [0, 1], got {float(topp)}.')
    if topk and float(topp):
      raise ValueError(f'Use top-k or top-p, not both (topk={topk}, topp={float(topp)}).')
  if not isinstance(lenience, (float, int)) or not 0.0 < lenience <= 1.0:
    raise ValueError(f'lenience must be a float in (0, 1], got {lenience!r}.')


def argmax(x_xv: jax.Array) -> jax.Array:
  """`jnp.argmax(x, axis=-1)` as int32, in two plain reductions.

  The first index of the maximum, as `jnp.argmax` (and the first NaN if any,
  as `jnp.argmax`). XLA lowers `jnp.argmax` to a variadic (value, index)
  reduction that CPU backends run element by element: over an 8192-word
  vocabulary it costs ~26 µs a row on this project's CPU, against ~5 µs for
  a max followed by a min over the matching indices (both vectorised). The
  decode loops take an argmax per step, so this is the baseline's and the
  speculative loop's greedy token alike (`tests/sampling_test.py` checks it
  equals `jnp.argmax`, ties, infinities and NaNs included).
  """
  return _first_index_of(x_xv, jnp.max(x_xv, axis=-1, keepdims=True))


def _first_index_of(x_xv: jax.Array, max_x1: jax.Array) -> jax.Array:
  """The first index where x equals its row maximum `max_x1` (or is NaN) [..] int32."""
  index_xv = jax.lax.broadcasted_iota(jnp.int32, x_xv.shape, x_xv.ndim - 1)
  # NaN: max is NaN, nothing equals it; the first NaN is what jnp.argmax picks.
  hit_xv = (x_xv == max_x1) | jnp.isnan(x_xv)
  return jnp.min(jnp.where(hit_xv, index_xv, x_xv.shape[-1]), axis=-1)


def argmax_and_top_prob(logits_xv: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """(argmax [..] int32, softmax(logits)[argmax] [..] float32) sharing one max.

  The top probability is 1 / Σ exp(logits - max): no normalised [.., V]
  array is built (adaptive greedy drafting needs only this number).
  """
  logits_xv = logits_xv.astype(jnp.float32)
  max_x1 = jnp.max(logits_xv, axis=-1, keepdims=True)
  top_prob_x = 1.0 / jnp.sum(jnp.exp(logits_xv - max_x1), axis=-1)
  return _first_index_of(logits_xv, max_x1), top_prob_x


def _topk_mask(logits_xv: jax.Array, topk: int) -> jax.Array:
  """Keeps the `topk` largest logits (and any tied with the k-th), -inf elsewhere."""
  topk = min(topk, logits_xv.shape[-1])
  kth_largest_x1 = jax.lax.top_k(logits_xv, topk)[0][..., -1:]
  return jnp.where(logits_xv < kth_largest_x1, -jnp.inf, logits_xv)


def _topp_mask(logits_xv: jax.Array, topp: Scalar) -> jax.Array:
  """Nucleus: keeps the smallest set of most likely tokens whose mass is >= topp."""
  sorted_xv = jnp.flip(jnp.sort(logits_xv, axis=-1), axis=-1)
  probs_xv = jax.nn.softmax(sorted_xv, axis=-1)
  mass_before_xv = jnp.cumsum(probs_xv, axis=-1) - probs_xv
  # The most likely token is always kept, whatever topp is.
  keep_xv = (mass_before_xv < topp).at[..., 0].set(True)
  threshold_x1 = jnp.min(jnp.where(keep_xv, sorted_xv, jnp.inf), axis=-1,
                         keepdims=True)
  return jnp.where(logits_xv < threshold_x1, -jnp.inf, logits_xv)


def is_greedy(temperature: Scalar) -> jax.Array:
  """Whether the temperature means argmax decoding, as a (possibly traced) bool array."""
  return jnp.asarray(temperature) <= MIN_TEMPERATURE


def static_greedy(temperature: Scalar) -> bool:
  """Whether argmax decoding is known at trace time.

  True when the temperature is a concrete number (or array) <= MIN_TEMPERATURE
  (p is then the one-hot of argmax(logits)); False when it is larger or traced
  (a traced temperature decides at run time, see `is_greedy`). (topk=1 is not
  taken as greedy: exact ties keep several tokens.)
  """
  if isinstance(temperature, jax.core.Tracer):
    return False
  return bool(np.all(np.asarray(temperature) <= MIN_TEMPERATURE))


def adjusted_log_probs(logits_xv: jax.Array, temperature: Scalar = 1.0,
                       topk: int = 0, topp: Scalar = 0.0) -> jax.Array:
  """Log-probabilities of the distribution actually sampled from.

  Temperature scaling, then top-k or top-p truncation; at temperature <=
  MIN_TEMPERATURE the one-hot of argmax(logits) (as T5X, argmax ignores topk
  and topp). Used for both the target's p and the drafter's q.

  Args:
    logits_xv: [..., V] logits of any float dtype.
    temperature: scalar >= 0 (may be traced).
    topk: static int; 0 disables.
    topp: scalar in [0, 1]; 0 disables.

  Returns:
    [..., V] float32 log-probabilities, -inf on tokens with no mass.
  """
  logits_xv = logits_xv.astype(jnp.float32)
  temperature = jnp.asarray(temperature, jnp.float32)
  scaled_xv = logits_xv / jnp.maximum(temperature, MIN_TEMPERATURE)
  if topk:
    scaled_xv = _topk_mask(scaled_xv, topk)
  if not _is_concrete(topp) or float(topp) > 0.0:
    scaled_xv = jnp.where(topp > 0.0, _topp_mask(scaled_xv, topp), scaled_xv)
  sampled_logp_xv = jax.nn.log_softmax(scaled_xv, axis=-1)
  argmax_x = argmax(logits_xv)
  vocab = logits_xv.shape[-1]
  greedy_logp_xv = jnp.where(
      jnp.arange(vocab) == argmax_x[..., None], 0.0, -jnp.inf)
  return jnp.where(is_greedy(temperature), greedy_logp_xv, sampled_logp_xv)


def sample(rng: jax.Array, logp_xv: jax.Array, greedy: bool = False) -> jax.Array:
  """Draws one token per row from (possibly unnormalised) log-probabilities.

  With `greedy=True` (a static promise that `logp_xv` is an argmax one-hot,
  see `static_greedy`) it takes the argmax without drawing random numbers:
  the same token, as T5X's zero-temperature branch.
  """
  if greedy:
    return argmax(logp_xv)
  return inverse_cdf_sample(rng, logp_xv)


def inverse_cdf_sample(rng: jax.Array, logp_xv: jax.Array) -> jax.Array:
  """One draw per row from (possibly unnormalised) log-probabilities, by
  inverting the cumulative distribution with ONE uniform number per row.

  The same distribution as `jax.random.categorical` (Gumbel-max, which draws
  one random number per vocabulary entry): on CPU, generating 8192 random
  numbers a row costs ~270 µs, a cumulative sum and a count ~40 µs, and the
  decode loops draw one token per step (the baseline) or per draft and per
  verification (speculative). Token i is drawn iff cdf[i-1] <= u·total <
  cdf[i], i.e. with probability p_i; a token with no mass (p_i = 0) has
  cdf[i] = cdf[i-1] and is never drawn, and u·total is kept below the total,
  so float rounding cannot step past the last token with mass.
  """
  logp_xv = logp_xv.astype(jnp.float32)
  p_xv = jnp.exp(logp_xv - jnp.max(logp_xv, axis=-1, keepdims=True))
  cdf_xv = jnp.cumsum(p_xv, axis=-1)
  total_x1 = cdf_xv[..., -1:]
  u_x1 = jax.random.uniform(rng, total_x1.shape, jnp.float32)
  threshold_x1 = jnp.minimum(u_x1 * total_x1, jnp.nextafter(total_x1, 0.0))
  return jnp.sum(cdf_xv <= threshold_x1, axis=-1).astype(jnp.int32)


def token_log_prob(logp_xv: jax.Array, tokens_x: jax.Array) -> jax.Array:
  """logp[..., token] for each leading index."""
  return jnp.take_along_axis(logp_xv, tokens_x[..., None], axis=-1)[..., 0]


def acceptance_probability(logp_x: jax.Array, logq_x: jax.Array,
                           lenience: float = 1.0) -> jax.Array:
  """min(1, p(x) / (l * q(x))), computed in log space so it never NaNs.

  A token the drafter gave no mass (q(x) = 0, never drafted by sampling) is
  accepted iff p(x) > 0.
  """
  log_ratio = logp_x - logq_x - np.log(lenience)
  prob = jnp.exp(jnp.minimum(log_ratio, 0.0))
  q_zero = logq_x == -jnp.inf
  return jnp.where(q_zero, (logp_x > -jnp.inf).astype(prob.dtype), prob)


def residual_log_probs(logp_xv: jax.Array, logq_xv: jax.Array) -> jax.Array:
  """log norm(max(0, p - q)), unnormalised (as `sample` accepts).

  When the residual has no mass in float32 (p == q up to rounding, where a
  rejection has probability ~0 anyway) it falls back to p, so that the result
  is always a valid distribution with support inside p's.
  """
  residual_xv = jnp.maximum(jnp.exp(logp_xv) - jnp.exp(logq_xv), 0.0)
  has_mass_x1 = jnp.sum(residual_xv, axis=-1, keepdims=True) > 0.0
  safe_residual_xv = jnp.where(has_mass_x1, residual_xv, 1.0)
  return jnp.where(has_mass_x1, jnp.log(safe_residual_xv), logp_xv)


def overlap(logp_xv: jax.Array, logq_xv: jax.Array) -> jax.Array:
  """Σ_x min(p(x), q(x)) = 1 - D_LK(p, q): the acceptance probability β."""
  return jnp.sum(jnp.exp(jnp.minimum(logp_xv, logq_xv)), axis=-1)


class Verdict(NamedTuple):
  """The outcome of verifying γ drafts (Algorithm 1, steps 3-5), per row.

  Attributes:
    num_accepted_b: n, the number of leading drafts kept, in [0, γ].
    next_token_b: the token sampled after them: from the residual at position
      n+1 when n < γ, else the bonus token from p_{γ+1}.
    accepted_bg: [B, γ] the leading-kept mask (position j kept iff j < n).
    overlap_bg: [B, γ] Σ_x min(p_j, q_j), for the paper's α estimator.
  """
  num_accepted_b: jax.Array
  next_token_b: jax.Array
  accepted_bg: jax.Array
  overlap_bg: jax.Array


def _leading_kept(keep_bg: jax.Array, forced_bg: jax.Array | None,
                  num_drafted_b: jax.Array | None) -> Tuple[jax.Array, jax.Array]:
  """(accepted_bg, n_b): the leading run of kept drafts, given drafts always
  kept, and nothing past the `num_drafted_b` real drafts of a row."""
  if forced_bg is not None:
    keep_bg = keep_bg | forced_bg
  if num_drafted_b is not None:
    keep_bg = keep_bg & (jnp.arange(keep_bg.shape[1]) < num_drafted_b[:, None])
  accepted_bg = jnp.cumprod(keep_bg.astype(jnp.int32), axis=1).astype(bool)
  return accepted_bg, jnp.sum(accepted_bg, axis=1).astype(jnp.int32)


def verify_greedy(drafts_bg: jax.Array, target_logits_bgv: jax.Array,
                  forced_bg: jax.Array | None = None,
                  num_drafted_b: jax.Array | None = None) -> Verdict:
  """`verify` when p and q are argmax one-hots (temperature 0), lenience 1.

  The general rule reduces to: keep x_j iff x_j = argmax p_j; the residual
  norm(max(0, p - q)) at a rejection and the bonus p_{n+1} are both the
  one-hot of argmax p; Σ min(p, q) is 1 iff the draft (= argmax q, for a
  sampled draft) equals argmax p. Same Verdict as `verify`, from the raw
  target logits (or their adjusted log-probs: the argmax is the same),
  without normalising, drawing random numbers or touching q.

  Args:
    drafts_bg: [B, γ] drafts.
    target_logits_bgv: [B, γ+1, V] target logits of the γ+1 positions.
    forced_bg: [B, γ] given (prompt) tokens, always kept.
    num_drafted_b: [B] real drafts per row (adaptive drafting); default γ.
  """
  gamma = drafts_bg.shape[1]
  target_argmax_bk = argmax(target_logits_bgv)
  keep_bg = drafts_bg == target_argmax_bk[:, :gamma]
  overlap_bg = keep_bg.astype(jnp.float32)
  accepted_bg, num_accepted_b = _leading_kept(keep_bg, forced_bg, num_drafted_b)
  next_token_b = jnp.take_along_axis(target_argmax_bk, num_accepted_b[:, None], axis=1)[:, 0]
  return Verdict(num_accepted_b, next_token_b, accepted_bg, overlap_bg)


def verify(rng: jax.Array,
           drafts_bg: jax.Array,
           draft_logq_bgv: jax.Array | None,
           target_logp_bgv: jax.Array,
           *,
           lenience: float = 1.0,
           forced_bg: jax.Array | None = None,
           greedy: jax.Array | bool = False,
           target_logits_bgv: jax.Array | None = None,
           num_drafted_b: jax.Array | None = None) -> Verdict:
  """Algorithm 1 steps 3-5, vectorised over the batch and γ.

  Args:
    rng: PRNG key for the uniforms r_i and the final sample.
    drafts_bg: [B, γ] drafted tokens x_1..x_γ.
    draft_logq_bgv: [B, γ, V] adjusted log q_i each draft was sampled from
      (may be None on the static greedy path).
    target_logp_bgv: [B, γ+1, V] adjusted log p_1..p_{γ+1} from one target call.
    lenience: l in (0, 1]; 1 is exact. l < 1 is the paper's approximate
      variant (Appendix A.5): keep with min(1, p / (l q)), and at argmax keep x
      iff p(x) >= l * max p, where p is softmax(target_logits_bgv).
    forced_bg: [B, γ] drafts that are given (teacher-forced prompt tokens):
      always kept.
    greedy: whether p and q are argmax one-hots. Python True (static) with
      lenience 1 takes `verify_greedy` (no random numbers, q not needed);
      a traced value is only used with lenience < 1.
    target_logits_bgv: raw target logits, needed for lenient argmax.
    num_drafted_b: [B] real drafts per row (adaptive drafting stops early);
      default γ. Drafts past it are never kept, and a row that keeps all of
      its n real drafts takes its next token from p_{n+1} (no residual).

  Returns:
    A Verdict.
  """
  gamma = drafts_bg.shape[1]
  if target_logp_bgv.shape[1] != gamma + 1:
    raise ValueError(f'target_logp_bgv must hold γ+1 = {gamma + 1} positions, '
                     f'got {target_logp_bgv.shape[1]}.')
  if isinstance(greedy, bool) and greedy and lenience == 1.0:
    return verify_greedy(drafts_bg, target_logp_bgv, forced_bg, num_drafted_b)
  if draft_logq_bgv is None:
    raise ValueError('draft_logq_bgv is needed unless greedy is True and lenience == 1.')
  u_rng, sample_rng = jax.random.split(rng)
  logp_bgv = target_logp_bgv[:, :gamma]
  logp_draft_bg = token_log_prob(logp_bgv, drafts_bg)
  logq_draft_bg = token_log_prob(draft_logq_bgv, drafts_bg)
  uniform_bg = jax.random.uniform(u_rng, drafts_bg.shape)
  keep_bg = uniform_bg < acceptance_probability(logp_draft_bg, logq_draft_bg,
                                                lenience)
  if lenience < 1.0:
    if target_logits_bgv is None:
      raise ValueError('lenience < 1 needs target_logits_bgv for argmax.')
    raw_logp_bgv = jax.nn.log_softmax(
        target_logits_bgv[:, :gamma].astype(jnp.float32), axis=-1)
    lenient_argmax_bg = (token_log_prob(raw_logp_bgv, drafts_bg)
                         >= jnp.max(raw_logp_bgv, axis=-1) + np.log(lenience))
    keep_bg = keep_bg | (jnp.asarray(greedy) & lenient_argmax_bg)
  accepted_bg, num_accepted_b = _leading_kept(keep_bg, forced_bg, num_drafted_b)

  # The distribution of the token after the kept drafts.
  at_n_b11 = num_accepted_b[:, None, None]
  logp_next_bv = jnp.take_along_axis(target_logp_bgv, at_n_b11, axis=1)[:, 0]
  logq_next_bv = jnp.take_along_axis(
      draft_logq_bgv, jnp.minimum(at_n_b11, gamma - 1), axis=1)[:, 0]
  num_drafted_b1 = (jnp.full_like(num_accepted_b, gamma) if num_drafted_b is None
                    else num_drafted_b)[:, None]
  all_kept_b1 = num_accepted_b[:, None] >= num_drafted_b1
  next_logp_bv = jnp.where(all_kept_b1, logp_next_bv,
                           residual_log_probs(logp_next_bv, logq_next_bv))
  next_token_b = sample(sample_rng, next_logp_bv)
  return Verdict(num_accepted_b, next_token_b, accepted_bg,
                 overlap(logp_bgv, draft_logq_bgv))
