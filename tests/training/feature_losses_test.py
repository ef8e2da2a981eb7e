"""Tests for specdec/training/feature_losses.py: EAGLE's loss on a tiny random T5 target and random heads.

The target, the heads and their teacher-forced inputs are tests/feature_drafter_test.py's.
"""

import jax
import jax.numpy as jnp
import numpy as np

from specdec.training import feature_losses
from tests import feature_drafter_test

# The tiny target and random heads of the network's tests.
TARGET = feature_drafter_test.TARGET
nets = feature_drafter_test.nets
_teacher_forced = feature_drafter_test._teacher_forced  # pylint: disable=protected-access


def test_smooth_l1_is_quadratic_near_zero_and_linear_beyond_beta():
  x = jnp.asarray([-3.0, -0.5, 0.0, 0.5, 3.0])
  np.testing.assert_allclose(feature_losses.smooth_l1(x), [2.5, 0.125, 0.0, 0.125, 2.5])
  np.testing.assert_allclose(feature_losses.smooth_l1(x, beta=2.0), [2.0, 0.0625, 0.0, 0.0625, 2.0])


class TestLosses:

  def test_losses_train_the_head_only(self, nets):
    target, target_params, head, head_params = nets
    batch_ = _teacher_forced(nets)[0]

    def loss(hp, tp):
      return feature_losses.losses(head, hp, target, tp, batch_, unroll_steps=2)

    (value, metrics), (g_head, g_target) = jax.value_and_grad(loss, argnums=(0, 1),
                                                               has_aux=True)(head_params,
                                                                             target_params)
    assert np.isfinite(float(value)) and float(value) > 0
    assert 0.0 <= float(metrics['agree']) <= 1.0 and 'agree_s1' in metrics
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(g_target))
    assert any(float(jnp.abs(g).max()) > 0.0 for g in jax.tree_util.tree_leaves(g_head))

  def test_trimmed_loss_agreement_counts_in_full_ids(self, nets):
    target, target_params, head, head_params = nets
    batch_ = _teacher_forced(nets)[0]
    all_ids = jnp.arange(TARGET.vocab_size)
    full = feature_losses.losses(head, head_params, target, target_params, batch_)[1]
    same = feature_losses.losses(head, head_params, target, target_params, batch_, vocab_ids=all_ids)[1]
    assert float(full['agree']) == float(same['agree'])
    np.testing.assert_allclose(float(full['ce']), float(same['ce']), rtol=1e-5)
