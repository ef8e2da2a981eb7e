"""Tests for specdec/sampling.py: the adjusted distributions and Algorithm 1."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import sampling

jax.config.update('jax_numpy_rank_promotion', 'allow')

V = 12
SETTINGS = [  # (temperature, topk, topp)
    (1.0, 0, 0.0), (0.5, 0, 0.0), (2.0, 0, 0.0), (1.0, 3, 0.0),
    (0.7, 5, 0.0), (1.0, 0, 0.8), (1.3, 0, 0.5), (0.0, 0, 0.0),
    (1e-5, 4, 0.0), (1.0, 1, 0.0),
]


def _random_logits(seed, shape=(V,), scale=2.0):
  return jnp.asarray(np.random.RandomState(seed).normal(size=shape) * scale,
                     jnp.float32)


def _probs(logp):
  return np.exp(np.asarray(logp, np.float64))


class TestAdjustedLogProbs:

  def test_temperature_is_scaled_softmax(self):
    logits = _random_logits(0)
    for t in (0.3, 1.0, 2.5):
      np.testing.assert_allclose(
          _probs(sampling.adjusted_log_probs(logits, t)),
          np.asarray(jax.nn.softmax(logits / t)), atol=1e-6)

  def test_topk_keeps_k_most_likely(self):
    logits = _random_logits(1)
    p = _probs(sampling.adjusted_log_probs(logits, 1.0, topk=3))
    top3 = set(np.argsort(-np.asarray(logits))[:3])
    assert set(np.flatnonzero(p)) == top3
    np.testing.assert_allclose(p.sum(), 1.0, atol=1e-6)
    expected = np.exp(np.asarray(logits)[list(top3)])
    np.testing.assert_allclose(np.sort(p[list(top3)]),
                               np.sort(expected / expected.sum()), atol=1e-6)

  def test_topp_keeps_smallest_set_reaching_mass(self):
    logits = _random_logits(2)
    full = np.asarray(jax.nn.softmax(logits), np.float64)
    for topp in (0.1, 0.5, 0.8, 0.95):
      p = _probs(sampling.adjusted_log_probs(logits, 1.0, topp=topp))
      order = np.argsort(-full)
      needed = int(np.searchsorted(np.cumsum(full[order]), topp) + 1)
      assert set(np.flatnonzero(p)) == set(order[:needed])
      kept = full[order[:needed]]
      np.testing.assert_allclose(p[order[:needed]], kept / kept.sum(), atol=1e-6)

  def test_argmax_is_one_hot_and_ignores_topk_topp(self):
    logits = _random_logits(3, (4, V))
    for topk, topp in ((0, 0.0), (3, 0.0), (0, 0.5)):
      p = _probs(sampling.adjusted_log_probs(logits, 0.0, topk, topp))
      np.testing.assert_array_equal(p, np.eye(V)[np.argmax(logits, -1)])

  def test_traced_temperature_matches_static(self):
    logits = _random_logits(4, (3, V))
    f = jax.jit(lambda t: sampling.adjusted_log_probs(logits, t, topk=5))
    for t in (0.0, 0.8):
      np.testing.assert_array_equal(
          np.asarray(f(t)), np.asarray(sampling.adjusted_log_probs(logits, t, 5)))

  def test_sample_argmax_is_deterministic(self):
    logits = _random_logits(5, (50, V))
    tokens = sampling.sample(jax.random.PRNGKey(0),
                             sampling.adjusted_log_probs(logits, 0.0))
    np.testing.assert_array_equal(tokens, np.argmax(logits, -1))


class TestValidation:

  @pytest.mark.parametrize('kwargs, name', [
      (dict(temperature=-0.1), 'temperature'),
      (dict(temperature=float('nan')), 'temperature'),
      (dict(topk=-1), 'topk'),
      (dict(topk=2.0), 'topk'),
      (dict(topp=1.5), 'topp'),
      (dict(topk=3, topp=0.9), 'topk'),
      (dict(lenience=0.0), 'lenience'),
      (dict(lenience=1.5), 'lenience'),
  ])
  def test_bad_arguments(self, kwargs, name):
    with pytest.raises(ValueError, match=name):
      sampling.validate_sampling_args(**kwargs)

  def test_good_arguments(self):
    sampling.validate_sampling_args(0.0, 0, 0.9, 0.5)
    sampling.validate_sampling_args(1.0, 40, 0.0, 1.0)


def _one_step_output(logp, logq, lenience=1.0):
  """P(output token = x) of one step with γ = 1, from the module's pieces.

  Σ_d q(d) [a(d) 1{x = d} + (1 - a(d)) r(x)], a = acceptance probability,
  r = the normalised residual.
  """
  p, q = _probs(logp), _probs(logq)
  accept = np.asarray(sampling.acceptance_probability(logp, logq, lenience),
                      np.float64)
  residual = _probs(sampling.residual_log_probs(logp, logq))
  residual /= residual.sum()
  rejected_mass = np.sum(q * (1.0 - accept))
  del p
  return q * accept + rejected_mass * residual


class TestOneStepDistribution:
  """The analytic output distribution of one step equals the adjusted p."""

  @pytest.mark.parametrize('temperature, topk, topp', SETTINGS)
  def test_equals_target(self, temperature, topk, topp):
    for seed in range(20):
      logits_p = _random_logits(100 + seed)
      logits_q = _random_logits(200 + seed) if seed % 4 else logits_p * 0.5
      logp = sampling.adjusted_log_probs(logits_p, temperature, topk, topp)
      logq = sampling.adjusted_log_probs(logits_q, temperature, topk, topp)
      out = _one_step_output(logp, logq)
      np.testing.assert_allclose(out, _probs(logp), atol=1e-6)

  def test_wrong_residual_is_detected(self):
    # Sampling the correction from p instead of the residual is a classic bug;
    # the same comparison must see it.
    logp = sampling.adjusted_log_probs(_random_logits(7), 1.0)
    logq = sampling.adjusted_log_probs(_random_logits(8), 1.0)
    p, q = _probs(logp), _probs(logq)
    accept = np.asarray(sampling.acceptance_probability(logp, logq), np.float64)
    wrong = q * accept + np.sum(q * (1 - accept)) * p
    assert np.max(np.abs(wrong - p)) > 1e-2

  def test_lenience_bounds_probabilities_by_p_over_l(self):
    # Appendix A.5: with l < 1 no token is sampled with probability above p/l.
    for seed in range(10):
      logp = sampling.adjusted_log_probs(_random_logits(300 + seed), 1.0)
      logq = sampling.adjusted_log_probs(_random_logits(400 + seed), 1.0)
      for l in (0.5, 0.1):
        out = _one_step_output(logp, logq, l)
        np.testing.assert_allclose(out.sum(), 1.0, atol=1e-6)
        assert np.all(out <= _probs(logp) / l + 1e-6)
        accept = np.asarray(sampling.acceptance_probability(logp, logq, l))
        np.testing.assert_allclose(
            accept, np.minimum(1, _probs(logp) / (l * _probs(logq))), rtol=1e-5)


class TestNumericalSafety:

  def test_tiny_q_gives_no_nan(self):
    logp = jnp.log(jnp.asarray([0.5, 0.5, 0.0, 0.0]))
    logq = jnp.asarray([-300.0, 0.0, -jnp.inf, -80.0])
    a = np.asarray(sampling.acceptance_probability(logp, logq))
    assert not np.any(np.isnan(a))
    np.testing.assert_array_equal(a, [1.0, 0.5, 0.0, 0.0])

  def test_residual_underflow_falls_back_to_p(self):
    logp = sampling.adjusted_log_probs(_random_logits(9), 1.0)
    r = sampling.residual_log_probs(logp, logp)
    np.testing.assert_array_equal(np.asarray(r), np.asarray(logp))
    assert np.all(np.isfinite(np.asarray(r)) | (np.asarray(logp) == -np.inf))

  def test_truncated_supports_give_no_nan(self):
    # Top-k zeroes tokens in both; disjoint supports are the worst case.
    logits_p = jnp.arange(V, dtype=jnp.float32)
    logp = sampling.adjusted_log_probs(logits_p, 1.0, topk=2)
    logq = sampling.adjusted_log_probs(-logits_p, 1.0, topk=2)
    drafts = jnp.asarray([[0, 1]])
    verdict = sampling.verify(jax.random.PRNGKey(0), drafts,
                              jnp.stack([logq, logq])[None],
                              jnp.stack([logp, logp, logp])[None])
    assert int(verdict.num_accepted_b[0]) == 0
    assert int(verdict.next_token_b[0]) in (V - 1, V - 2)
    np.testing.assert_array_equal(verdict.overlap_bg, [[0.0, 0.0]])


class TestVerify:

  def _setup(self, seed, gamma, rows, temperature=1.0, topk=0, topp=0.0):
    logits_p = _random_logits(seed, (gamma + 1, V))
    logits_q = _random_logits(seed + 1, (gamma, V))
    logp = sampling.adjusted_log_probs(logits_p, temperature, topk, topp)
    logq = sampling.adjusted_log_probs(logits_q, temperature, topk, topp)
    drafts = sampling.sample(jax.random.PRNGKey(seed),
                             jnp.broadcast_to(logq, (rows, gamma, V)))
    return (logits_p, logp, logq, drafts,
            jnp.broadcast_to(logq, (rows, gamma, V)),
            jnp.broadcast_to(logp, (rows, gamma + 1, V)))

  @pytest.mark.parametrize('temperature, topk, topp',
                           [(1.0, 0, 0.0), (0.8, 4, 0.0), (1.0, 0, 0.7)])
  def test_first_token_distribution_monte_carlo(self, temperature, topk, topp):
    # With fixed per-position p_1, q_1, the first emitted token (x_1 if kept,
    # else the residual sample) must be distributed as p_1.
    rows = 200_000
    _, logp, _, drafts, logq_b, logp_b = self._setup(11, 1, rows, temperature,
                                                     topk, topp)
    v = jax.jit(sampling.verify)(jax.random.PRNGKey(1), drafts, logq_b, logp_b)
    first = np.where(np.asarray(v.num_accepted_b) > 0, np.asarray(drafts[:, 0]),
                     np.asarray(v.next_token_b))
    freq = np.bincount(first, minlength=V) / rows
    # TV distance of a correct sampler: ~ sqrt(V / rows) / 2 ≈ 0.004.
    tv = 0.5 * np.abs(freq - _probs(logp[0])).sum()
    assert tv < 0.01, tv

  def test_acceptance_counts_are_leading(self):
    gamma, rows = 5, 4000
    _, _, _, drafts, logq_b, logp_b = self._setup(12, gamma, rows)
    v = sampling.verify(jax.random.PRNGKey(2), drafts, logq_b, logp_b)
    accepted = np.asarray(v.accepted_bg)
    n = np.asarray(v.num_accepted_b)
    np.testing.assert_array_equal(accepted, np.arange(gamma)[None] < n[:, None])
    # E[β] at position 1 is Σ min(p_1, q_1): the acceptance rate matches it.
    beta1 = float(np.asarray(v.overlap_bg)[0, 0])
    expected = np.asarray(sampling.acceptance_probability(
        sampling.token_log_prob(logp_b[:, 0], drafts[:, 0]),
        sampling.token_log_prob(logq_b[:, 0], drafts[:, 0])))
    rate = np.mean(n > 0)
    assert abs(rate - beta1) < 4 * np.sqrt(beta1 * (1 - beta1) / rows) + 1e-3
    assert abs(np.mean(expected) - beta1) < 0.03

  def test_argmax_exact_special_case(self):
    gamma, rows = 4, 64
    logits_p = _random_logits(13, (rows, gamma + 1, V))
    logits_q = _random_logits(14, (rows, gamma, V))
    # Make some drafts agree with the target.
    logits_q = logits_q.at[::2].set(logits_p[::2, :gamma])
    logp = sampling.adjusted_log_probs(logits_p, 0.0)
    logq = sampling.adjusted_log_probs(logits_q, 0.0)
    drafts = jnp.argmax(logits_q, -1).astype(jnp.int32)
    v = sampling.verify(jax.random.PRNGKey(3), drafts, logq, logp)
    target_argmax = np.argmax(logits_p, -1)
    agree = np.asarray(drafts) == target_argmax[:, :gamma]
    n_expected = np.cumprod(agree, axis=1).sum(1)
    np.testing.assert_array_equal(v.num_accepted_b, n_expected)
    np.testing.assert_array_equal(
        v.next_token_b, target_argmax[np.arange(rows), n_expected])

  def test_lenient_argmax(self):
    # At argmax, lenience l keeps x iff p(x) >= l * max p (softmax of logits).
    logits_p = jnp.log(jnp.asarray([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]]))
    logits_q = jnp.log(jnp.asarray([[[0.1, 0.8, 0.1]]]))
    drafts = jnp.asarray([[1]])
    logp = sampling.adjusted_log_probs(logits_p, 0.0)
    logq = sampling.adjusted_log_probs(logits_q, 0.0)
    for l, kept in ((1.0, 0), (0.7, 0), (0.5, 1)):
      v = sampling.verify(jax.random.PRNGKey(0), drafts, logq, logp,
                          lenience=l, greedy=True, target_logits_bgv=logits_p)
      assert int(v.num_accepted_b[0]) == kept
      assert int(v.next_token_b[0]) == (0 if kept == 0 else 2)

  def test_forced_drafts_are_kept(self):
    gamma = 3
    logits_p = _random_logits(15, (1, gamma + 1, V))
    logp = sampling.adjusted_log_probs(logits_p, 0.0)
    wrong = (jnp.argmax(logits_p[:, :gamma], -1) + 1) % V
    logq = sampling.adjusted_log_probs(jax.nn.one_hot(wrong, V) * 10, 0.0)
    v = sampling.verify(jax.random.PRNGKey(0), wrong.astype(jnp.int32), logq,
                        logp, forced_bg=jnp.asarray([[True, True, False]]))
    assert int(v.num_accepted_b[0]) == 2

  def test_identical_models_accept_everything(self):
    gamma, rows = 6, 2000
    logits = _random_logits(16, (gamma + 1, V))
    logp = sampling.adjusted_log_probs(logits, 1.0)
    logq_b = jnp.broadcast_to(logp[:gamma], (rows, gamma, V))
    drafts = sampling.sample(jax.random.PRNGKey(4), logq_b)
    v = sampling.verify(jax.random.PRNGKey(5), drafts, logq_b,
                        jnp.broadcast_to(logp, (rows, gamma + 1, V)))
    np.testing.assert_array_equal(v.num_accepted_b, gamma)
    np.testing.assert_allclose(v.overlap_bg, 1.0, atol=1e-5)

  def test_wrong_shapes_raise(self):
    with pytest.raises(ValueError, match='γ\\+1'):
      sampling.verify(jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32),
                      jnp.zeros((1, 2, V)), jnp.zeros((1, 2, V)))


@pytest.mark.parametrize('seed', range(4))
def test_verify_greedy_equals_general_verify_on_one_hots(seed):
  """The static greedy path gives the general rule's verdict on argmax one-hots."""
  batch, gamma, vocab = 16, 5, 7
  k1, k2, k3, k4, k5 = jax.random.split(jax.random.PRNGKey(seed), 5)
  target_logits = jax.random.normal(k1, (batch, gamma + 1, vocab))
  draft_logits = jax.random.normal(k2, (batch, gamma, vocab))
  # Make the drafter agree with the target on a random subset of positions.
  agree = jax.random.bernoulli(k3, 0.6, (batch, gamma, 1))
  draft_logits = jnp.where(agree, target_logits[:, :gamma], draft_logits)
  logp = sampling.adjusted_log_probs(target_logits, 0.0)
  logq = sampling.adjusted_log_probs(draft_logits, 0.0)
  drafts = jnp.argmax(draft_logits, -1).astype(jnp.int32)
  forced = jax.random.bernoulli(k4, 0.1, (batch, gamma))
  general = sampling.verify(k5, drafts, logq, logp, forced_bg=forced,
                            greedy=sampling.is_greedy(0.0))
  fast = sampling.verify(k5, drafts, None, logp, forced_bg=forced, greedy=True)
  for a, b in zip(general, fast):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert 0 < int(fast.num_accepted_b.sum()) < batch * gamma  # not a trivial case


def test_static_greedy():
  assert sampling.static_greedy(0.0)
  assert not sampling.static_greedy(1.0)
  assert sampling.static_greedy(np.zeros(3))
  assert all(isinstance(sampling.static_greedy(t), bool) for t in (0.0, 1.0, np.zeros(3)))
  seen = []  # a traced temperature is not known to be greedy
  jax.jit(lambda t: seen.append(sampling.static_greedy(t)) or t)(0.0)
  assert seen == [False]


def test_sample_greedy_takes_argmax_without_randomness():
  logp = sampling.adjusted_log_probs(jnp.array([[0.1, 3.0, -1.0], [2.0, 0.0, 1.0]]), 0.0)
  np.testing.assert_array_equal(sampling.sample(None, logp, greedy=True), [1, 0])


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_argmax_equals_jnp_argmax(dtype):
  rng = np.random.default_rng(0)
  cases = [rng.normal(size=(3, 4, 8192)),
           rng.integers(0, 3, size=(6, 50)).astype(np.float64),  # many ties: first index wins
           np.array([[-np.inf] * 5, [1.0, np.inf, 2.0, np.inf, 0.0], [np.inf] * 5]),
           np.array([[1.0, np.nan, 3.0, np.nan], [np.nan] * 4, [2.0, 5.0, 5.0, np.nan]])]
  for x in cases:
    x = jnp.asarray(x, dtype)
    want = np.asarray(jnp.argmax(x, axis=-1))
    got = sampling.argmax(x)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(sampling.argmax)(x)), want)


def test_argmax_and_top_prob():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(5, 2, 300)) * 4, jnp.float32)
  token, top = sampling.argmax_and_top_prob(logits)
  np.testing.assert_array_equal(np.asarray(token), np.asarray(jnp.argmax(logits, -1)))
  want = np.max(np.asarray(jax.nn.softmax(logits, axis=-1)), axis=-1)
  np.testing.assert_allclose(np.asarray(top), want, rtol=1e-6)
  # A one-hot-like row (others at -inf) is certain; a flat row has top 1/V.
  token, top = sampling.argmax_and_top_prob(jnp.array([[0.0, -jnp.inf, -jnp.inf], [2.0, 2.0, 2.0]]))
  np.testing.assert_array_equal(np.asarray(token), [0, 0])
  np.testing.assert_allclose(np.asarray(top), [1.0, 1 / 3], rtol=1e-6)


def test_inverse_cdf_sample_matches_the_distribution():
  # 200k draws from a peaked 64-word distribution with zero-mass words: frequencies within 5 standard errors,
  # no zero-mass word ever drawn, and the same histogram as jax.random.categorical's within the same bound.
  rng = np.random.default_rng(3)
  logits = rng.normal(size=64) * 2.5
  logits[[0, 7, 63]] = -np.inf  # masked, e.g. by top-k: never drawn (63 is the last word)
  logp = jnp.asarray(logits - np.logaddexp.reduce(logits[np.isfinite(logits)]), jnp.float32)
  n = 200_000
  rows = jnp.broadcast_to(logp, (n, 64))
  draws = np.asarray(sampling.inverse_cdf_sample(jax.random.PRNGKey(0), rows + 1.5))  # unnormalised is fine
  assert draws.dtype == np.int32 and draws.min() >= 0 and draws.max() < 64
  freq = np.bincount(draws, minlength=64) / n
  p = np.exp(np.asarray(logp))
  assert freq[[0, 7, 63]].sum() == 0
  se = np.sqrt(p * (1 - p) / n) + 1e-9
  assert np.all(np.abs(freq - p) < 5 * se + 1e-6), np.max(np.abs(freq - p) / se)
  gumbel = np.bincount(np.asarray(jax.random.categorical(jax.random.PRNGKey(1), rows)), minlength=64) / n
  assert np.all(np.abs(freq - gumbel) < 5 * np.sqrt(2) * se + 1e-6)


def test_inverse_cdf_sample_edge_rows():
  # One word with all the mass; mass only on the last word; a uniform row's draws spread over all words.
  one = jnp.full((4, 10), -jnp.inf).at[:, 3].set(0.0)
  last = jnp.full((4, 10), -jnp.inf).at[:, 9].set(-5.0)
  for seed in range(20):
    key = jax.random.PRNGKey(seed)
    np.testing.assert_array_equal(sampling.inverse_cdf_sample(key, one), 3)
    np.testing.assert_array_equal(sampling.inverse_cdf_sample(key, last), 9)
  flat = np.asarray(sampling.inverse_cdf_sample(jax.random.PRNGKey(0), jnp.zeros((5000, 10))))
  assert set(flat.tolist()) == set(range(10))
