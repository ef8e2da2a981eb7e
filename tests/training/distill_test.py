"""Tests for specdec/training/distill.py: each divergence against a float64 reference, TVD = 1 − α, gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.training import distill
from specdec import theory


def _logits(seed, shape=(3, 5, 11)):
  return np.random.RandomState(seed).normal(scale=2.0, size=shape).astype(np.float32)


def _logp64(logits):
  x = np.asarray(logits, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


REFERENCE = {
    'fkl': lambda p, q: np.sum(np.exp(p) * (p - q), -1),
    'rkl': lambda p, q: np.sum(np.exp(q) * (q - p), -1),
    'tvd': lambda p, q: 0.5 * np.sum(np.abs(np.exp(p) - np.exp(q)), -1),
    'greedy_ce': lambda p, q: -np.take_along_axis(q, np.argmax(p, -1)[..., None], -1)[..., 0],
}


@pytest.mark.parametrize('name', sorted(distill.DIVERGENCES))
def test_matches_reference(name):
  teacher, student = _logits(0), _logits(1)
  got = np.asarray(distill.token_divergence(name, jnp.asarray(teacher), jnp.asarray(student)))
  want = REFERENCE[name](_logp64(teacher), _logp64(student))
  assert got.shape == teacher.shape[:-1]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert np.all(want > 0)


@pytest.mark.parametrize('name', ['fkl', 'rkl', 'tvd'])
def test_zero_at_equal_distributions(name):
  logits = jnp.asarray(_logits(2))
  np.testing.assert_allclose(np.asarray(distill.token_divergence(name, logits, logits)), 0.0, atol=1e-6)


def test_tvd_is_one_minus_acceptance_rate():
  # Speculative sampling accepts with probability sum(min(p, q)) = 1 - TVD(p, q).
  teacher, student = _logits(3, (4, 9)), _logits(4, (4, 9))
  tvd = np.asarray(distill.token_divergence('tvd', jnp.asarray(teacher), jnp.asarray(student)))
  p, q = np.exp(_logp64(teacher)), np.exp(_logp64(student))
  for row in range(4):
    assert 1.0 - tvd[row] == pytest.approx(float(theory.alpha(p[row], q[row])), abs=1e-5)


@pytest.mark.parametrize('name', sorted(distill.DIVERGENCES))
def test_gradient_flows_to_the_student_only(name):
  teacher, student = jnp.asarray(_logits(5)), jnp.asarray(_logits(6))
  g_teacher, g_student = jax.grad(
      lambda t, s: jnp.sum(distill.token_divergence(name, t, s)), argnums=(0, 1))(teacher, student)
  assert float(jnp.abs(g_teacher).max()) == 0.0
  assert float(jnp.abs(g_student).max()) > 1e-4


@pytest.mark.parametrize('name', sorted(distill.DIVERGENCES))
def test_a_gradient_step_reduces_the_divergence(name):
  teacher = jnp.asarray(_logits(7))
  student = jnp.asarray(_logits(8))
  loss = lambda s: jnp.mean(distill.token_divergence(name, teacher, s))
  before = float(loss(student))
  after = float(loss(student - 0.5 * jax.grad(loss)(student)))
  assert after < before


def test_unknown_divergence_is_a_clear_error():
  with pytest.raises(ValueError, match="divergence must be one of .*'kl'"):
    distill.get_divergence('kl')
