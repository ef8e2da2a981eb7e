"""Closed-form analysis of speculative decoding (Leviathan et al., ICML 2023, Section 3).

Pure functions; this module imports no other ``specdec`` module.

Notation (paper Section 3):

* ``alpha`` (α): expected acceptance rate, α = E[β] = E[Σ_x min(p(x), q(x))] (Thm 3.5, Cor 3.6).
* ``gamma`` (γ): number of tokens drafted per iteration (an integer ≥ 1).
* ``c``: cost coefficient, walltime of one M_q call / walltime of one M_p call (Def 3.7).
* ``c_hat`` (ĉ): arithmetic operations per token of M_q / those of M_p (Thm 3.11).

Two kinds of functions live here:

* The analytic formulas (``expected_tokens`` ... ``predicted_speedup_from_costs``) are host-side NumPy code.
  They broadcast over array arguments, return a Python ``float`` when every argument is a scalar and a
  ``numpy.ndarray`` otherwise, and validate their inputs (``ValueError`` naming the argument). They need
  concrete values, so they are not meant to be called inside ``jax.jit``.
* ``alpha`` and ``divergence_lk`` measure α from model distributions. They use ``jax.numpy``, accept NumPy or
  JAX arrays, check only static properties (shapes), and can be traced under ``jax.jit``.
"""

from __future__ import annotations

import numbers

import jax.numpy as jnp
import numpy as np

__all__ = [
    "expected_tokens",
    "expected_tokens_by_depth",
    "expected_speedup",
    "operations_factor",
    "memory_reads_factor",
    "optimal_gamma",
    "best_gamma",
    "speedup_lower_bound",
    "oracle_tokens",
    "alpha",
    "divergence_lk",
    "predicted_speedup_from_costs",
    "DEFAULT_MAX_GAMMA",
]

DEFAULT_MAX_GAMMA = 64


# --------------------------------------------------------------------------------------------------------------
# Validation / output helpers.
# --------------------------------------------------------------------------------------------------------------


def _as_float_array(x, name):
    try:
        arr = np.asarray(x)
    except Exception as e:  # e.g. a traced value or a ragged list
        raise ValueError(f"{name} must be a real number or array of real numbers, got {x!r}") from e
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name} must be a real number or array of real numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return arr


def _check_alpha(x, name="alpha"):
    arr = _as_float_array(x, name)
    if np.any(arr < 0.0) or np.any(arr > 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {x!r}")
    return arr


def _check_nonneg(x, name):
    arr = _as_float_array(x, name)
    if np.any(arr < 0.0):
        raise ValueError(f"{name} must be >= 0, got {x!r}")
    return arr


def _check_positive(x, name):
    arr = _as_float_array(x, name)
    if np.any(arr <= 0.0):
        raise ValueError(f"{name} must be > 0, got {x!r}")
    return arr


def _check_gamma(x, name="gamma"):
    """γ must be integer-valued (an int, an integer array, or integral floats) and >= 1."""
    arr = _as_float_array(x, name)
    if np.any(arr != np.round(arr)):
        raise ValueError(f"{name} must be an integer, got {x!r}")
    if np.any(arr < 1):
        raise ValueError(f"{name} must be >= 1, got {x!r}")
    return arr


def _out(x):
    x = np.asarray(x, dtype=np.float64)
    return float(x) if x.ndim == 0 else x


def _geometric_sum(a, g):
    """Σ_{k=0}^{g} a^k = (1 - a^(g+1)) / (1 - a), accurate near a = 1 and exact at a in {0, 1}."""
    a, g = np.broadcast_arrays(a, g)
    with np.errstate(divide="ignore", invalid="ignore"):
        # 1 - a^(g+1) = -expm1((g+1) log a) avoids cancellation as a -> 1; at a = 0 log gives -inf and
        # expm1(-inf) = -1, so the value is 1 / 1 = 1.
        num = -np.expm1((g + 1.0) * np.log(a))
        val = num / (1.0 - a)
    return np.where(a == 1.0, g + 1.0, val)


# --------------------------------------------------------------------------------------------------------------
# Section 3 formulas.
# --------------------------------------------------------------------------------------------------------------


def expected_tokens(alpha, gamma):
    """Expected number of tokens produced by one speculative iteration (paper Eq. 1).

    E[#tokens] = (1 - α^(γ+1)) / (1 - α), a capped geometric variable: between 1 and γ+1 tokens, each draft
    accepted i.i.d. with probability α (the simplifying assumption of Section 3.1). Limits: α = 1 gives exactly
    γ + 1, α = 0 gives exactly 1.

    Args:
      alpha: acceptance rate(s) α in [0, 1].
      gamma: integer γ >= 1 (broadcasts with ``alpha``).
    """
    a = _check_alpha(alpha)
    g = _check_gamma(gamma)
    return _out(_geometric_sum(a, g))


def expected_tokens_by_depth(acceptance):
    """Expected tokens of one iteration whose k-th draft is kept, given drafts 1..k-1 were, with probability a_k.

    E[#tokens] = 1 + Σ_{k=1..γ} Π_{j≤k} a_j, γ = len(acceptance): the round emits one token of the target's
    plus every draft up to the first rejection, and draft k is kept with probability a_1·...·a_k. With a_k = α
    at every depth this is Eq. 1, (1 - α^(γ+1)) / (1 - α); a drafter that accepts less at depth (a feature head
    that predicts from ever older features) gets fewer.

    Args:
      acceptance: a_1..a_γ, each in [0, 1] (a non-empty 1-D sequence; γ is its length).
    """
    a = _check_alpha(acceptance, "acceptance")
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"acceptance must be a non-empty 1-D sequence a_1..a_γ, got {acceptance!r}")
    return float(1.0 + np.sum(np.cumprod(a)))


def expected_speedup(alpha, gamma, c):
    """Expected walltime improvement factor (paper Thm 3.8).

    (1 - α^(γ+1)) / ((1 - α)(γc + 1)), assuming the γ+1 parallel M_p evaluations of the verify call cost the
    same walltime as a single M_p call. See ``predicted_speedup_from_costs`` for the model without that
    assumption.

    Args:
      alpha: acceptance rate(s) α in [0, 1].
      gamma: integer γ >= 1.
      c: cost coefficient c >= 0 (Def 3.7).
    """
    a = _check_alpha(alpha)
    g = _check_gamma(gamma)
    cc = _check_nonneg(c, "c")
    return _out(_geometric_sum(a, g) / (g * cc + 1.0))


def operations_factor(alpha, gamma, c_hat):
    """Expected factor of increase in the total number of arithmetic operations (paper Thm 3.11).

    (1 - α)(γĉ + γ + 1) / (1 - α^(γ+1)). At α = 1 this is (γĉ + γ + 1) / (γ + 1).

    Args:
      alpha: acceptance rate(s) α in [0, 1].
      gamma: integer γ >= 1.
      c_hat: ĉ >= 0, arithmetic operations per token of M_q relative to M_p.
    """
    a = _check_alpha(alpha)
    g = _check_gamma(gamma)
    ch = _check_nonneg(c_hat, "c_hat")
    return _out((g * ch + g + 1.0) / _geometric_sum(a, g))


def memory_reads_factor(alpha, gamma):
    """Factor by which reads of the target's weights and KV cache shrink (paper Section 3.4, after Thm 3.11).

    M_p is called once per iteration and each iteration yields (1 - α^(γ+1)) / (1 - α) tokens on average, so the
    number of M_p memory passes per generated token shrinks by that factor (returned here; >= 1, equal to
    ``expected_tokens``).
    """
    a = _check_alpha(alpha)
    g = _check_gamma(gamma)
    return _out(_geometric_sum(a, g))


def optimal_gamma(alpha, c, max_gamma=DEFAULT_MAX_GAMMA):
    """Integer γ in 1..max_gamma maximising the Thm 3.8 walltime improvement (Section 3.3, found numerically).

    Ties are broken towards the smaller γ. γ = 0 (no speculation, improvement 1) is not considered, so the
    returned improvement can be below 1 when α is small relative to c (Cor 3.9 guarantees > 1 when α > c).
    With α = 1 and c = 0 the improvement grows without bound and ``max_gamma`` is returned.

    Args:
      alpha: acceptance rate(s) α in [0, 1].
      c: cost coefficient(s) c >= 0 (broadcasts with ``alpha``).
      max_gamma: largest γ searched (integer >= 1).

    Returns:
      ``(gamma, speedup)``: Python ``(int, float)`` for scalar inputs, else ``(int64 array, float array)``.
    """
    a = _check_alpha(alpha)
    cc = _check_nonneg(c, "c")
    if isinstance(max_gamma, bool) or not isinstance(max_gamma, numbers.Integral):
        raise ValueError(f"max_gamma must be an integer, got {max_gamma!r}")
    if max_gamma < 1:
        raise ValueError(f"max_gamma must be >= 1, got {max_gamma!r}")
    a, cc = np.broadcast_arrays(a, cc)
    gammas = np.arange(1, int(max_gamma) + 1, dtype=np.float64)
    shape = (-1,) + (1,) * a.ndim
    g = gammas.reshape(shape)
    s = _geometric_sum(a[None], g) / (g * cc[None] + 1.0)  # [max_gamma, ...]
    idx = np.argmax(s, axis=0)  # first maximum -> smallest γ on ties
    best_s = np.take_along_axis(s, idx[None], axis=0)[0]
    best_g = (idx + 1).astype(np.int64)
    if best_g.ndim == 0:
        return int(best_g), float(best_s)
    return best_g, best_s


def best_gamma(alpha, c, verify_cost_ratios, max_gamma=None):
    """The γ that maximises the speedup predicted from measured costs, with the verify call's real cost.

    Thm 3.8 (``optimal_gamma``) assumes a (γ+1)-token target call costs one 1-token call. On hardware where it
    does not (a CPU: 1.0-1.9 one-token calls for 2-16 tokens), the best γ is smaller. Here one round costs
    γ·c + r(γ+1) one-token target calls, r(k) the measured cost of a k-token call over a 1-token call, and
    yields E[#tokens] = (1 - α^(γ+1)) / (1 - α) (Eq. 1), so

        speedup(γ) = E[#tokens] / (γ·c + r(γ+1)),

    maximised over the γ whose γ+1 the curve holds (ties to the smaller γ). With r ≡ 1 this is
    ``optimal_gamma``.

    With per-depth acceptance (``alpha`` a sequence a_1..a_m) E[#tokens] is ``expected_tokens_by_depth`` of
    its first γ values instead: one α at every depth overstates deep rounds for a drafter that accepts less
    at depth.

    Args:
      alpha: acceptance rate α in [0, 1] (a scalar), or a_1..a_m, a_k = P(draft k kept | drafts < k kept),
        with m at least the largest γ considered.
      c: a draft step's cost over a 1-token target call (>= 0; the in-loop c where measured).
      verify_cost_ratios: {k: r(k)} for k >= 2 tokens per call (a k = 1 entry, if given, must be 1), e.g.
        ``profiling.verify_cost_curve``'s ratios; each r(k) > 0.
      max_gamma: optional upper limit on γ.

    Returns:
      ``(gamma, speedup)`` as Python ``(int, float)``.
    """
    a = _check_alpha(alpha)
    if a.ndim > 1 or a.size == 0:
        raise ValueError(f"alpha must be a scalar or a 1-D sequence a_1..a_m, got {alpha!r}")
    cc = float(_check_nonneg(c, "c"))
    try:
        curve = {int(k): float(v) for k, v in dict(verify_cost_ratios).items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"verify_cost_ratios must map tokens per call to cost ratios, got {verify_cost_ratios!r}") from e
    for k, r in curve.items():
        if k < 1 or not np.isfinite(r) or r <= 0:
            raise ValueError(f"verify_cost_ratios needs k >= 1 and finite r(k) > 0, got r({k}) = {r!r}")
    if 1 in curve and not np.isclose(curve[1], 1.0):
        raise ValueError(f"verify_cost_ratios[1] is a 1-token call over itself and must be 1, got {curve[1]!r}")
    if max_gamma is not None:
        if isinstance(max_gamma, bool) or not isinstance(max_gamma, numbers.Integral) or max_gamma < 1:
            raise ValueError(f"max_gamma must be an integer >= 1, got {max_gamma!r}")
    gammas = sorted(k - 1 for k in curve if k >= 2 and (max_gamma is None or k - 1 <= max_gamma))
    if not gammas:
        raise ValueError("verify_cost_ratios holds no k >= 2 (within max_gamma + 1): no γ to choose from, "
                         f"got keys {sorted(curve)}")
    if a.ndim == 1 and gammas[-1] > a.size:
        raise ValueError(f"alpha holds acceptance for depths 1..{a.size}, but γ up to {gammas[-1]} is "
                         "considered: give a_k for every depth (or a smaller max_gamma)")
    # In one-token-call units: a draft step costs c, the verify call r(γ+1), a baseline token 1.
    if a.ndim == 0:
        speedups = [predicted_speedup_from_costs(float(a), g, cc, 1.0, curve[g + 1]) for g in gammas]
    else:
        speedups = [expected_tokens_by_depth(a[:g]) / (g * cc + curve[g + 1]) for g in gammas]
    best = int(np.argmax(speedups))  # first maximum: the smaller γ on ties
    return gammas[best], speedups[best]


def speedup_lower_bound(alpha, c):
    """Cor 3.9 lower bound on the best walltime improvement: (1 + α) / (1 + c).

    This is Thm 3.8 at γ = 1, so the optimal γ always achieves at least this much; it is an *improvement*
    (> 1) exactly when α > c, which is the regime where the corollary applies. The value is returned for any
    valid α, c; callers should only read it as a speedup guarantee where α > c.
    """
    a = _check_alpha(alpha)
    cc = _check_nonneg(c, "c")
    return _out((1.0 + a) / (1.0 + cc))


def oracle_tokens(alpha):
    """Expected tokens per M_p call for an oracle that picks γ per step: 1 / (1 - α) (Section 3.3).

    Also the limit of Eq. 1 as γ -> ∞, i.e. the bound on the improvement with a zero-cost drafter (c = 0).
    Returns ``inf`` at α = 1.
    """
    a = _check_alpha(alpha)
    with np.errstate(divide="ignore"):
        return _out(1.0 / (1.0 - a))


def acceptance_rate(accepted, judged):
    """α measured: accepted / judged drafts (the MLE of α under Thm 3.8's i.i.d. model), from the decode loop's
    statistics; 0.0 when nothing was judged (every row ended at once: no evidence)."""
    return accepted / judged if judged else 0.0


def acceptance_stderr(accepted, judged):
    """The binomial standard error of `acceptance_rate`, sqrt(α(1 - α) / judged); None when nothing was judged."""
    if not judged:
        return None
    a = acceptance_rate(accepted, judged)
    return float(np.sqrt(a * (1 - a) / judged))


def predicted_speedup_from_costs(alpha, gamma, draft_call_time, target_call_time, verify_call_time=None):
    """Walltime improvement from measured call costs, without Thm 3.8's "verify costs one call" assumption.

    One speculative iteration costs γ·t_q + t_verify and yields E[#tokens] = (1 - α^(γ+1)) / (1 - α) tokens
    (Eq. 1); the baseline needs E[#tokens]·t_p for the same tokens. Hence

        speedup = E[#tokens] · t_p / (γ · t_q + t_verify).

    With ``verify_call_time=None`` (t_verify = t_p) this equals Thm 3.8 with c = t_q / t_p. Any fixed per-call
    overhead should be folded into the times passed in.

    Args:
      alpha: acceptance rate(s) α in [0, 1].
      gamma: integer γ >= 1.
      draft_call_time: t_q >= 0, walltime of one M_q (draft) call producing one token.
      target_call_time: t_p > 0, walltime of one M_p call producing one token (the baseline's per-token cost).
      verify_call_time: t_verify > 0, walltime of one M_p call scoring γ+1 positions; default t_p.
    """
    a = _check_alpha(alpha)
    g = _check_gamma(gamma)
    tq = _check_nonneg(draft_call_time, "draft_call_time")
    tp = _check_positive(target_call_time, "target_call_time")
    tv = tp if verify_call_time is None else _check_positive(verify_call_time, "verify_call_time")
    return _out(_geometric_sum(a, g) * tp / (g * tq + tv))


def required_alpha(speedup, gamma, c, verify_cost_ratio=1.0):
    """The smallest α at which γ drafts reach a given walltime improvement, from relative call costs.

    Solves (1 - α^(γ+1)) / (1 - α) = speedup · (γc + r) for α (the left side grows with α from 1 to γ+1), with
    c = t_q / t_p and r = t_verify / t_p (r = 1 is Thm 3.8). Returns ``nan`` where even α = 1 cannot reach it,
    i.e. speedup · (γc + r) > γ + 1.

    Args:
      speedup: the walltime improvement wanted (> 0).
      gamma: integer γ >= 1.
      c: drafter call time / target call time (>= 0).
      verify_cost_ratio: r, a γ+1-token target call's time / a 1-token call's (> 0).
    """
    g = _check_gamma(gamma)
    cc = float(_check_nonneg(c, "c"))
    r = float(_check_positive(verify_cost_ratio, "verify_cost_ratio"))
    want = float(_check_positive(speedup, "speedup")) * (g * cc + r)
    if want > g + 1:
        return float("nan")
    if want <= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: the geometric sum is increasing in α
        mid = 0.5 * (lo + hi)
        if float(_geometric_sum(np.float64(mid), g)) < want:
            lo = mid
        else:
            hi = mid
    return hi


# --------------------------------------------------------------------------------------------------------------
# Measuring α from distributions (Thm 3.5, Cor 3.6). JAX-traceable.
# --------------------------------------------------------------------------------------------------------------


def _check_pq(p, q):
    p = jnp.asarray(p)
    q = jnp.asarray(q)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got p {p.shape} and q {q.shape}")
    if p.ndim < 1:
        raise ValueError("p and q must have a vocabulary axis (shape [..., V])")
    return p, q


def divergence_lk(p, q):
    """D_LK(p, q) = Σ_x |p(x) - M(x)|, M = (p + q)/2, = 1 - Σ_x min(p(x), q(x)) (paper Def 3.3 / Lemma 3.4).

    Computed as 1 - Σ min(p, q) along the last axis, one value per distribution: p, q of shape [..., V]
    give shape [...]. p and q are probability vectors over the same vocabulary, already adjusted by the
    sampling method (temperature, top-k, argmax, ...); they are not re-normalised here.
    """
    p, q = _check_pq(p, q)
    return 1.0 - jnp.sum(jnp.minimum(p, q), axis=-1)


def alpha(p, q, *, lenience=1.0, mask=None):
    """Acceptance rate α = E[β] = E[Σ_x min(p(x), q(x))] (paper Thm 3.5, Cor 3.6: α = 1 - E[D_LK(p, q)]).

    β = Σ_x min(p(x), q(x)) is computed along the last (vocabulary) axis and averaged over all leading axes
    (e.g. batch and position), giving a scalar.

    Args:
      p: target distributions, shape [..., V].
      q: draft distributions, same shape.
      lenience: l in (0, 1] of Appendix A.5; β becomes Σ_x min(p(x)/l, q(x)). l = 1 is the exact algorithm
        (and the only case where α = 1 - E[D_LK]).
      mask: optional weights/boolean mask broadcastable to the leading shape ``p.shape[:-1]``; the mean is then
        Σ mask·β / Σ mask (e.g. to skip padding positions).
    """
    p, q = _check_pq(p, q)
    if not isinstance(lenience, numbers.Real) or isinstance(lenience, bool) or not (0.0 < lenience <= 1.0):
        raise ValueError(f"lenience must be a number in (0, 1], got {lenience!r}")
    pl = p if lenience == 1.0 else p / lenience
    beta = jnp.sum(jnp.minimum(pl, q), axis=-1)
    if mask is None:
        return jnp.mean(beta)
    w = jnp.broadcast_to(jnp.asarray(mask, dtype=beta.dtype), beta.shape)
    return jnp.sum(w * beta) / jnp.sum(w)
