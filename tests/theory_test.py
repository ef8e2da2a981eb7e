"""Tests for specdec.theory (Leviathan et al. 2023, Section 3 closed forms)."""

import numpy as np
import pytest

from specdec import theory

# ------------------------------------------------------------------------------------------------------------
# Paper figures.
# ------------------------------------------------------------------------------------------------------------

# Table 1 (c = ĉ = 0): (α, γ, operations factor, speed factor), as printed.
TABLE_1 = [
    (0.6, 2, "1.53X", "1.96X"),
    (0.7, 3, "1.58X", "2.53X"),
    (0.8, 2, "1.23X", "2.44X"),
    (0.8, 5, "1.63X", "3.69X"),
    (0.9, 2, "1.11X", "2.71X"),
    (0.9, 10, "1.60X", "6.86X"),
]


@pytest.mark.parametrize("a,gamma,ops,speed", TABLE_1)
def test_table_1(a, gamma, ops, speed):
    assert f"{theory.operations_factor(a, gamma, 0.0):.2f}X" == ops
    assert f"{theory.expected_speedup(a, gamma, 0.0):.2f}X" == speed


def test_table_1_vectorised():
    a = np.array([r[0] for r in TABLE_1])
    g = np.array([r[1] for r in TABLE_1])
    ops = theory.operations_factor(a, g, 0.0)
    speed = theory.expected_speedup(a, g, 0.0)
    assert [f"{x:.2f}X" for x in ops] == [r[2] for r in TABLE_1]
    assert [f"{x:.2f}X" for x in speed] == [r[3] for r in TABLE_1]


def test_lenience_argmax_figures_at_gamma_8():
    # Appendix A.5, argmax: α = 0.75/0.75/0.8/0.87 give 3.3X/3.3X/3.9X/4.9X at c = 0.015, γ = 8.
    alphas = [0.75, 0.75, 0.8, 0.87]
    printed = ["3.3X", "3.3X", "3.9X", "4.9X"]
    got = [f"{theory.expected_speedup(a, 8, 0.015):.1f}X" for a in alphas]
    assert got == printed
    # γ = 8 is what the paper used there, not the Thm 3.8 optimum (10 / 12 / 17 for α = 0.75 / 0.8 / 0.87),
    # which would print 3.3X / 4.0X / 5.6X.
    gammas, speeds = theory.optimal_gamma(np.array([0.75, 0.8, 0.87]), 0.015)
    assert gammas.tolist() == [10, 12, 17]
    assert [f"{s:.1f}X" for s in speeds] == ["3.3X", "4.0X", "5.6X"]


def test_lenience_sampling_figures_are_not_reproduced_at_c_0015():
    # Appendix A.5, sampling, T5-small: α = 0.62/0.71/0.76/0.84 are said to give 2.5X/3.1X/3.6X/5X at c = 0.015.
    # Thm 3.8 cannot reproduce these at c = 0.015 for ANY γ: the best achievable (optimal γ) is lower.
    alphas = np.array([0.62, 0.71, 0.76, 0.84])
    printed = np.array([2.5, 3.1, 3.6, 5.0])
    gammas, speeds = theory.optimal_gamma(alphas, 0.015, max_gamma=1000)
    assert gammas.tolist() == [7, 9, 10, 15]
    assert [f"{s:.1f}" for s in speeds] == ["2.3", "2.9", "3.4", "4.8"]
    assert np.all(speeds < printed - 0.05)
    # They are consistent with a smaller c instead, e.g. c = 0.005 at γ = 7 (the γ of Table 2's T5-small EnDe
    # t=1 row): 2.5X / 3.1X / 3.6X / 4.5X ("5X" only at integer precision).
    got = theory.expected_speedup(alphas, 7, 0.005)
    assert [f"{s:.1f}" for s in got[:3]] == ["2.5", "3.1", "3.6"]
    assert f"{got[3]:.0f}" == "5"


def test_bigram_drafter_figure():
    # Section 4: a bigram drafter for T5-XXL EnDe (α ≈ 0.2) gives 1.25X at γ = 3 (negligible-cost drafter, c ≈ 0).
    assert f"{theory.expected_speedup(0.2, 3, 0.0):.2f}X" == "1.25X"


# ------------------------------------------------------------------------------------------------------------
# expected_tokens / Eq. 1.
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a,gamma", [(0.3, 1), (0.6, 4), (0.8, 7), (0.95, 10)])
def test_expected_tokens_monte_carlo(a, gamma):
    # i.i.d. acceptances: tokens per iteration = (number of leading accepted drafts, capped at γ) + 1.
    n_trials = 200_000
    rng = np.random.default_rng(1234)
    accepts = rng.random((n_trials, gamma)) < a
    leading = np.argmin(np.concatenate([accepts, np.zeros((n_trials, 1), bool)], axis=1), axis=1)
    tokens = leading + 1
    assert tokens.min() >= 1 and tokens.max() <= gamma + 1
    se = tokens.std(ddof=1) / np.sqrt(n_trials)
    assert se < 0.01  # the sample is large enough for the check below to be meaningful
    # 5 standard errors: a correct formula fails this with probability ~6e-7 (and the seed is fixed).
    assert abs(tokens.mean() - theory.expected_tokens(a, gamma)) < 5 * se


def test_expected_tokens_limits():
    for g in [1, 2, 5, 64]:
        assert theory.expected_tokens(1.0, g) == g + 1
        assert theory.expected_tokens(0.0, g) == 1.0
        assert theory.memory_reads_factor(1.0, g) == g + 1
        assert theory.operations_factor(1.0, g, 0.0) == 1.0
    # Continuous through α -> 1 (no cancellation blow-up).
    for g in [1, 5, 30]:
        assert theory.expected_tokens(1.0 - 1e-12, g) == pytest.approx(g + 1, rel=1e-9)
    # Closed form equals the geometric sum Σ_{k=0}^{γ} α^k.
    a = np.linspace(0.0, 1.0, 101)
    for g in [1, 3, 8]:
        ref = sum(a**k for k in range(g + 1))
        np.testing.assert_allclose(theory.expected_tokens(a, g), ref, rtol=1e-12)


def test_scalar_and_array_return_types():
    assert isinstance(theory.expected_tokens(0.5, 3), float)
    assert isinstance(theory.expected_speedup(0.5, 3, 0.1), float)
    out = theory.expected_tokens(np.array([0.5, 0.7]), np.array([[1], [2]]))
    assert isinstance(out, np.ndarray) and out.shape == (2, 2)
    g, s = theory.optimal_gamma(0.7, 0.05)
    assert isinstance(g, int) and isinstance(s, float)


def test_memory_reads_equals_expected_tokens():
    a = np.linspace(0.0, 1.0, 11)
    np.testing.assert_allclose(theory.memory_reads_factor(a, 5), theory.expected_tokens(a, 5))


def test_speedup_bounded_by_oracle_with_free_drafter():
    a = np.linspace(0.0, 0.99, 100)
    for g in [1, 4, 16, 64]:
        assert np.all(theory.expected_speedup(a, g, 0.0) <= theory.oracle_tokens(a) + 1e-12)
    assert theory.oracle_tokens(0.0) == 1.0
    assert theory.oracle_tokens(0.75) == 4.0
    assert theory.oracle_tokens(1.0) == np.inf


# ------------------------------------------------------------------------------------------------------------
# optimal_gamma, Cor 3.9.
# ------------------------------------------------------------------------------------------------------------


def test_optimal_gamma_is_argmax():
    for a in [0.3, 0.6, 0.8, 0.9]:
        for c in [0.01, 0.05, 0.2]:
            g, s = theory.optimal_gamma(a, c)
            all_s = [theory.expected_speedup(a, k, c) for k in range(1, theory.DEFAULT_MAX_GAMMA + 1)]
            assert s == pytest.approx(max(all_s), rel=1e-12)
            assert g == int(np.argmax(all_s)) + 1


def test_optimal_gamma_nonincreasing_in_c():
    alphas = np.linspace(0.0, 1.0, 41)
    cs = np.concatenate([[0.0], np.geomspace(1e-3, 2.0, 40)])
    g, _ = theory.optimal_gamma(alphas[:, None], cs[None, :])
    assert g.shape == (41, 41)
    assert np.all(np.diff(g, axis=1) <= 0)
    # For fixed c > 0, a better drafter never wants a shorter draft.
    assert np.all(np.diff(g[:, 1:], axis=0) >= 0)


def test_optimal_gamma_edge_cases():
    assert theory.optimal_gamma(1.0, 0.0, max_gamma=20) == (20, 21.0)
    assert theory.optimal_gamma(0.0, 0.1)[0] == 1
    assert theory.optimal_gamma(0.9, 0.0, max_gamma=1) == (1, pytest.approx(1.9))


def test_cor_3_9_lower_bound():
    alphas = np.linspace(0.0, 1.0, 51)
    cs = np.linspace(0.0, 1.0, 51)
    A, C = np.meshgrid(alphas, cs, indexing="ij")
    valid = A > C
    _, best = theory.optimal_gamma(A, C)
    bound = theory.speedup_lower_bound(A, C)
    assert np.all(best[valid] >= bound[valid] - 1e-12)
    assert np.all(bound[valid] > 1.0)  # "there is a γ that helps"
    assert np.all(best[valid] > 1.0)
    # The bound is Thm 3.8 at γ = 1.
    np.testing.assert_allclose(bound, theory.expected_speedup(A, 1, C), rtol=1e-12)


# ------------------------------------------------------------------------------------------------------------
# α from distributions (Thm 3.5 / Cor 3.6).
# ------------------------------------------------------------------------------------------------------------


def _random_dists(rng, shape):
    x = rng.gamma(0.3, size=shape)
    return x / x.sum(-1, keepdims=True)


def test_alpha_identical_and_disjoint():
    rng = np.random.default_rng(0)
    p = _random_dists(rng, (3, 5, 16))
    assert float(theory.alpha(p, p)) == pytest.approx(1.0, abs=1e-6)
    pd = np.zeros((4, 10))
    qd = np.zeros((4, 10))
    pd[:, :5] = 0.2
    qd[:, 5:] = 0.2
    assert float(theory.alpha(pd, qd)) == 0.0
    np.testing.assert_allclose(np.asarray(theory.divergence_lk(pd, qd)), 1.0)


def test_alpha_equals_one_minus_dlk():
    rng = np.random.default_rng(1)
    p = _random_dists(rng, (4, 7, 32))
    q = _random_dists(rng, (4, 7, 32))
    d = np.asarray(theory.divergence_lk(p, q))
    assert d.shape == (4, 7)
    assert float(theory.alpha(p, q)) == pytest.approx(1.0 - d.mean(), abs=1e-6)
    # Def 3.3 form: D_LK = Σ |p - M|, M = (p + q) / 2.
    np.testing.assert_allclose(d, np.abs(p - (p + q) / 2).sum(-1), atol=1e-6)
    # Symmetric, and a single-distribution input gives a scalar.
    assert float(theory.alpha(q, p)) == pytest.approx(float(theory.alpha(p, q)), abs=1e-6)
    assert np.asarray(theory.divergence_lk(p[0, 0], q[0, 0])).shape == ()


def test_alpha_mask_and_lenience():
    rng = np.random.default_rng(2)
    p = _random_dists(rng, (2, 6, 8))
    q = _random_dists(rng, (2, 6, 8))
    beta = np.minimum(p, q).sum(-1)
    mask = np.zeros((2, 6), bool)
    mask[:, :3] = True
    assert float(theory.alpha(p, q, mask=mask)) == pytest.approx(beta[:, :3].mean(), abs=1e-6)
    # Appendix A.5: α_l = Σ min(p / l, q), non-decreasing as l shrinks, equal to α at l = 1.
    vals = [float(theory.alpha(p, q, lenience=l)) for l in [1.0, 0.5, 0.3, 0.1]]
    assert vals[0] == pytest.approx(float(theory.alpha(p, q)), abs=1e-7)
    assert all(b >= a - 1e-7 for a, b in zip(vals, vals[1:]))
    assert vals[-1] == pytest.approx(np.minimum(p / 0.1, q).sum(-1).mean(), abs=1e-6)


def test_alpha_jittable():
    import jax

    rng = np.random.default_rng(3)
    p = _random_dists(rng, (5, 16)).astype(np.float32)
    q = _random_dists(rng, (5, 16)).astype(np.float32)
    assert float(jax.jit(theory.alpha)(p, q)) == pytest.approx(float(theory.alpha(p, q)), abs=1e-6)


# ------------------------------------------------------------------------------------------------------------
# predicted_speedup_from_costs.
# ------------------------------------------------------------------------------------------------------------


def test_predicted_speedup_from_costs_matches_thm_3_8():
    a = np.linspace(0.0, 1.0, 21)
    for g in [1, 3, 7]:
        for tq, tp in [(0.0, 1.0), (1.5e-3, 0.1), (2.0, 10.0)]:
            ref = theory.expected_speedup(a, g, tq / tp)
            np.testing.assert_allclose(theory.predicted_speedup_from_costs(a, g, tq, tp), ref, rtol=1e-12)
            np.testing.assert_allclose(theory.predicted_speedup_from_costs(a, g, tq, tp, tp), ref, rtol=1e-12)


def test_predicted_speedup_from_costs_slower_verify():
    # A verify call costing 1.5 target calls: E[tokens]·t_p / (γ t_q + 1.5 t_p).
    a, g, tq, tp = 0.8, 4, 0.02, 1.0
    expected = theory.expected_tokens(a, g) * tp / (g * tq + 1.5 * tp)
    assert theory.predicted_speedup_from_costs(a, g, tq, tp, 1.5 * tp) == pytest.approx(expected, rel=1e-12)
    assert expected < theory.expected_speedup(a, g, tq / tp)


# ------------------------------------------------------------------------------------------------------------
# Validation.
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn,args,name",
    [
        (theory.expected_tokens, (1.1, 3), "alpha"),
        (theory.expected_tokens, (-0.1, 3), "alpha"),
        (theory.expected_tokens, (float("nan"), 3), "alpha"),
        (theory.expected_tokens, (np.array([0.5, 1.5]), 3), "alpha"),
        (theory.expected_tokens, (0.5, 0), "gamma"),
        (theory.expected_tokens, (0.5, 2.5), "gamma"),
        (theory.expected_tokens, (0.5, True), "gamma"),
        (theory.expected_tokens, (0.5, np.array([1, 0])), "gamma"),
        (theory.expected_speedup, (0.5, 3, -0.1), "c"),
        (theory.expected_speedup, (0.5, -1, 0.1), "gamma"),
        (theory.operations_factor, (0.5, 3, -1.0), "c_hat"),
        (theory.memory_reads_factor, (2.0, 3), "alpha"),
        (theory.optimal_gamma, (0.5, -0.01), "c"),
        (theory.optimal_gamma, (1.5, 0.01), "alpha"),
        (theory.optimal_gamma, (0.5, 0.01, 0), "max_gamma"),
        (theory.optimal_gamma, (0.5, 0.01, 2.5), "max_gamma"),
        (theory.speedup_lower_bound, (0.5, -1.0), "c"),
        (theory.speedup_lower_bound, (1.01, 0.1), "alpha"),
        (theory.oracle_tokens, (-0.5,), "alpha"),
        (theory.predicted_speedup_from_costs, (0.5, 3, -1.0, 1.0), "draft_call_time"),
        (theory.predicted_speedup_from_costs, (0.5, 3, 0.1, 0.0), "target_call_time"),
        (theory.predicted_speedup_from_costs, (0.5, 3, 0.1, 1.0, 0.0), "verify_call_time"),
        (theory.predicted_speedup_from_costs, (0.5, 1.5, 0.1, 1.0), "gamma"),
        (theory.predicted_speedup_from_costs, (1.5, 2, 0.1, 1.0), "alpha"),
    ],
)
def test_bad_inputs_raise(fn, args, name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        fn(*args)


def test_alpha_bad_inputs_raise():
    with pytest.raises(ValueError, match="shape"):
        theory.alpha(np.ones((2, 3)) / 3, np.ones((2, 4)) / 4)
    with pytest.raises(ValueError, match="lenience"):
        theory.alpha(np.ones(3) / 3, np.ones(3) / 3, lenience=0.0)
    with pytest.raises(ValueError, match="lenience"):
        theory.alpha(np.ones(3) / 3, np.ones(3) / 3, lenience=1.5)


def test_integral_float_gamma_accepted():
    assert theory.expected_tokens(0.5, 3.0) == theory.expected_tokens(0.5, 3)


def test_required_alpha_inverts_the_cost_model():
  for speedup, gamma, c, r in [(2.0, 5, 0.11, 1.4), (1.5, 3, 0.05, 1.0), (2.0, 7, 0.0, 1.2)]:
    a = theory.required_alpha(speedup, gamma, c, r)
    assert 0 < a < 1
    got = theory.predicted_speedup_from_costs(a, gamma, c, 1.0, r)
    assert abs(float(got) - speedup) < 1e-6
    # Slightly less α falls short.
    assert float(theory.predicted_speedup_from_costs(a - 1e-3, gamma, c, 1.0, r)) < speedup


def test_required_alpha_edges():
  assert theory.required_alpha(1.0, 3, 0.0) == 0.0
  assert np.isnan(theory.required_alpha(10.0, 3, 0.5))  # γ+1 = 4 tokens per call cannot pay for 10x
  with pytest.raises(ValueError):
    theory.required_alpha(2.0, 0, 0.1)


# ---------------------------------------------------------------------------
# best_gamma: the optimal γ with the measured verify-cost curve.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('a', [0.3, 0.6, 0.8, 0.9, 0.99])
@pytest.mark.parametrize('c', [0.0, 0.02, 0.2])
def test_best_gamma_with_a_flat_curve_is_thm38s(a, c):
  flat = {k: 1.0 for k in range(1, 33)}
  assert theory.best_gamma(a, c, flat) == pytest.approx(theory.optimal_gamma(a, c, max_gamma=31))


def test_best_gamma_by_hand():
  # α = 0.8, c = 0.1; r(2) = 1.5, r(3) = 1.6, r(5) = 2.5: E[tokens] 1.8, 2.44, 3.3616 over 1.6, 1.8, 2.9.
  gamma, speedup = theory.best_gamma(0.8, 0.1, {2: 1.5, 3: 1.6, 5: 2.5})
  assert gamma == 2 and speedup == pytest.approx(2.44 / 1.8)
  # A costlier verify call moves the best γ down from Thm 3.8's.
  steep = {k: 1.0 + 0.25 * (k - 1) for k in range(1, 17)}
  assert theory.best_gamma(0.9, 0.02, steep)[0] < theory.optimal_gamma(0.9, 0.02, max_gamma=15)[0]
  # Ties go to the smaller γ; max_gamma limits the search.
  assert theory.best_gamma(0.0, 0.0, {2: 1.0, 3: 1.0})[0] == 1
  assert theory.best_gamma(0.99, 0.0, {k: 1.0 for k in range(2, 17)}, max_gamma=4)[0] == 4


@pytest.mark.parametrize('curve, match', [
    ({1: 1.0}, 'no γ to choose from'),
    ({2: 0.0}, r'r\(k\) > 0'),
    ({2: float('nan')}, r'r\(k\) > 0'),
    ({1: 1.2, 2: 1.5}, 'must be 1'),
    ('abc', 'must map tokens per call'),
])
def test_best_gamma_refuses_bad_curves(curve, match):
  with pytest.raises(ValueError, match=match):
    theory.best_gamma(0.5, 0.1, curve)


def test_best_gamma_refuses_bad_alpha_c_and_max_gamma():
  with pytest.raises(ValueError, match='alpha'):
    theory.best_gamma(1.5, 0.1, {2: 1.0})
  with pytest.raises(ValueError, match='c must be >= 0'):
    theory.best_gamma(0.5, -0.1, {2: 1.0})
  with pytest.raises(ValueError, match='max_gamma'):
    theory.best_gamma(0.5, 0.1, {2: 1.0}, max_gamma=0)


# ---------------------------------------------------------------------------
# Per-depth acceptance: draft k kept, given drafts < k were, with probability a_k.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('a', [0.0, 0.3, 0.6, 0.95, 1.0])
@pytest.mark.parametrize('gamma', [1, 2, 5, 8])
def test_expected_tokens_by_depth_with_one_alpha_is_eq_1(a, gamma):
  assert theory.expected_tokens_by_depth([a] * gamma) == pytest.approx(theory.expected_tokens(a, gamma))


def test_expected_tokens_by_depth_by_hand_and_by_simulation():
  # 1 + 0.8 + 0.8·0.5 + 0.8·0.5·0.25 = 2.3: less than one α (0.8 at every depth, 1 + 0.8 + 0.64 + 0.512).
  acceptance = [0.8, 0.5, 0.25]
  assert theory.expected_tokens_by_depth(acceptance) == pytest.approx(2.3)
  # A round: draft k is kept with probability a_k until the first rejection; the target adds one token.
  rng = np.random.default_rng(0)
  kept = np.cumprod(rng.random((200_000, 3)) < np.asarray(acceptance), axis=1)
  assert 1 + kept.sum(1).mean() == pytest.approx(2.3, abs=0.01)


def test_best_gamma_with_per_depth_acceptance():
  flat = {k: 1.0 for k in range(1, 10)}
  # One α at every depth: Thm 3.8's γ, whatever list holds it.
  assert theory.best_gamma([0.7] * 8, 0.05, flat) == pytest.approx(theory.best_gamma(0.7, 0.05, flat))
  # Acceptance that falls at depth picks fewer drafts than one α of the same first depth.
  falling = [0.7, 0.5, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1]
  gamma, speedup = theory.best_gamma(falling, 0.05, flat)
  assert gamma < theory.best_gamma(0.7, 0.05, flat)[0]
  assert speedup == pytest.approx(theory.expected_tokens_by_depth(falling[:gamma]) / (gamma * 0.05 + 1.0))


def test_per_depth_acceptance_refuses_bad_input():
  with pytest.raises(ValueError, match='non-empty 1-D'):
    theory.expected_tokens_by_depth([])
  with pytest.raises(ValueError, match=r'acceptance must lie in \[0, 1\]'):
    theory.expected_tokens_by_depth([0.5, 1.2])
  with pytest.raises(ValueError, match='depths 1..2'):
    theory.best_gamma([0.5, 0.5], 0.1, {k: 1.0 for k in range(1, 5)})
  assert theory.best_gamma([0.5, 0.5], 0.1, {k: 1.0 for k in range(1, 5)}, max_gamma=2)[0] in (1, 2)


# α measured from the loop's statistics, and its standard error.


def test_acceptance_rate_is_accepted_over_judged():
  # 21 of 26 judged drafts kept: α = 21 / 26 = 0.8077, not the mean of the per-example rates (15/18, 6/8).
  assert theory.acceptance_rate(15 + 6, 18 + 8) == pytest.approx(0.8076923)
  assert theory.acceptance_rate(0, 7) == 0.0
  assert theory.acceptance_rate(7, 7) == 1.0


def test_acceptance_rate_without_judged_drafts_is_zero():
  assert theory.acceptance_rate(0, 0) == 0.0
  assert theory.acceptance_stderr(0, 0) is None


def test_acceptance_stderr_is_binomial():
  # α = 0.75 over 48 judged drafts: sqrt(0.75 · 0.25 / 48) = 0.0625.
  assert theory.acceptance_stderr(36, 48) == pytest.approx(0.0625)
  assert theory.acceptance_stderr(10, 10) == 0.0
