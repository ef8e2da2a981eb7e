"""Tests for specdec/bench/xxl_plan.py: what the XXL plans share."""

from specdec.bench import xxl_plan


def test_mesh_splits_power_of_two_model_widths():
  assert xxl_plan.mesh_splits(4) == [(4, 1), (2, 2), (1, 4)]
  assert xxl_plan.mesh_splits(64)[-1] == (1, 64) and len(xxl_plan.mesh_splits(64)) == 7
  assert xxl_plan.mesh_splits(6) == [(6, 1), (3, 2)]  # 4 does not divide 6
  assert xxl_plan.mesh_splits(1) == [(1, 1)]


def test_format_gib():
  assert xxl_plan.format_gib(xxl_plan.GIB) == '1.00'
  assert xxl_plan.format_gib(2.5 * xxl_plan.GIB) == '2.50'
  assert xxl_plan.format_gib(0) == '0.00'


def test_machine_description_says_no_accelerator():
  text = xxl_plan.machine_description()
  assert 'CPUs, jax ' in text and text.endswith('(abstract: no accelerator used)')
