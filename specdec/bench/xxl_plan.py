"""What the XXL decoding and training plans share: TPU v4 facts and mesh splits.

The plans (specdec/bench/xxl_memory_plan.py for decoding, specdec/bench/xxl_training_plan.py
for fine-tuning) are analytic: networks are built with `jax.eval_shape` and
laid out on simulated meshes, so they run on any machine without a TPU.
"""

import os
import platform

import jax

GIB = 2 ** 30
HBM_PER_CHIP_GIB = 32  # TPU v4
# A layout fits when HEADROOM x its bytes <= HBM: room for XLA temporaries
# and fragmentation.
HEADROOM = 1.2
# Generated code per chip, which no shape predicts: XLA's TPU compiler made 0.1-0.3 GiB for every decode and
# fine-tune step of these plans (results/tpu_compile/), so the plans allow the top of that range.
CODE_GIB = 0.3


def mesh_splits(chips: int) -> list:
  """Every (data, model) with a power-of-two model width dividing `chips`."""
  return [(chips // m, m) for m in (2 ** i for i in range(chips.bit_length()))
          if chips % m == 0]


def format_gib(x: float) -> str:
  """Bytes as GiB with two decimals, e.g. '20.69'."""
  return f'{x / GIB:.2f}'


def machine_description() -> str:
  """The machine a plan was computed on, for its report."""
  return (f'{platform.machine()}, {os.cpu_count()} CPUs, jax '
          f'{jax.__version__} (abstract: no accelerator used)')
