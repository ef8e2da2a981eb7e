"""Cloud TPU slices by the names Cloud gives them, as XLA's TPU compiler sees them (no TPU needed).

  tpu = slice_named('v4-8')            # TpuSlice(topology='v4:2x2x1', chip_config='megacore', chips=4, hosts=1, ...)
  devices = topology_devices(tpu)      # the slice's devices, described by libtpu: compile for them, never run
  mesh = slice_mesh(tpu, 4, devices)   # the launcher's ('data', 'model') mesh on them

Names: `v4-N` and `v5p-N` count TensorCores (two per chip, one megacore device each), `v5litepod-N` (alias
`v5e-N`) and `v6e-N` count chips. Each maps to the topology string libtpu's `get_topology_desc` takes, its
chip configuration, chips, hosts (hosts of four chips, except the single-host v5e/v6e slices of up to 8 chips)
and HBM per chip (GiB, from Cloud TPU's system-architecture pages).

libtpu (`pip install 'jax[tpu]==<jax version>'`) brings the TPU compiler; without a TPU, jax keeps to the CPU
at start-up (JAX_PLATFORMS=cpu) and the topology is built from its name (TPU_SKIP_MDS_QUERY: no metadata server).
"""

import dataclasses
import importlib.util
import os
from typing import Dict, Optional, Sequence, Tuple

import jax


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  """One Cloud TPU slice: `name` as Cloud names it, `topology` as libtpu names it (e.g. 'v4:2x2x1')."""
  name: str
  topology: str
  chip_config: str  # 'megacore' (v4, v5p: one device per chip of two TensorCores) or 'default'
  chips: int
  hosts: int
  hbm_gib: float  # per chip
  chips_per_host_bounds: Tuple[int, int, int]  # the chips one host holds, as a box of the torus


# HBM per chip (GiB) and how each generation's names count: TensorCores (2 per chip) or chips.
_GENERATIONS = {
    'v4': dict(prefix='v4', chip_config='megacore', cores_per_chip=2, hbm_gib=32.0),
    'v5p': dict(prefix='v5p', chip_config='megacore', cores_per_chip=2, hbm_gib=95.0),
    'v5e': dict(prefix='v5e', chip_config='default', cores_per_chip=1, hbm_gib=16.0),
    'v6e': dict(prefix='v6e', chip_config='default', cores_per_chip=1, hbm_gib=32.0),
}
# Chip grids of each slice size (chips -> torus shape), as Cloud lays them out.
_CUBE_GRIDS = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4)}
_PLANE_GRIDS = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16),
                256: (16, 16)}


def _grid_text(grid: Sequence[int]) -> str:
  return 'x'.join(str(n) for n in grid)


def _cube_slices(generation: str) -> Dict[str, TpuSlice]:
  """v4 / v5p: 3-D tori of megacore chips, four chips a host; names count TensorCores."""
  spec = _GENERATIONS[generation]
  out = {}
  for chips, grid in _CUBE_GRIDS.items():
    name = f'{generation}-{chips * spec["cores_per_chip"]}'
    out[name] = TpuSlice(name, f'{spec["prefix"]}:{_grid_text(grid)}', spec['chip_config'], chips,
                         chips // 4, spec['hbm_gib'], (2, 2, 1))
  return out


def _plane_slices(generation: str) -> Dict[str, TpuSlice]:
  """v5e / v6e: 2-D tori; slices of up to 8 chips are one host, larger ones four chips a host."""
  spec = _GENERATIONS[generation]
  out = {}
  for chips, grid in _PLANE_GRIDS.items():
    single_host = chips <= 8
    bounds = (grid[0], grid[1], 1) if single_host else (2, 2, 1)
    name = f'{generation}-{chips}'
    out[name] = TpuSlice(name, f'{spec["prefix"]}:{_grid_text(grid)}', spec['chip_config'], chips,
                         1 if single_host else chips // 4, spec['hbm_gib'], bounds)
  return out


SLICES: Dict[str, TpuSlice] = {**_cube_slices('v4'), **_cube_slices('v5p'), **_plane_slices('v5e'),
                               **_plane_slices('v6e')}
# Cloud's other name for v5e slices (the accelerator type `gcloud` takes).
ALIASES = {name.replace('v5e-', 'v5litepod-'): name for name in SLICES if name.startswith('v5e-')}


def known_names() -> Tuple[str, ...]:
  """Every slice name `slice_named` takes, aliases included."""
  return tuple(SLICES) + tuple(ALIASES)


def slice_named(name: str) -> TpuSlice:
  """The slice Cloud calls `name` ('v4-8', 'v5litepod-16', ...); ValueError listing the known names."""
  key = ALIASES.get(name, name)
  if key not in SLICES:
    raise ValueError(f'unknown TPU slice {name!r}; known: {", ".join(known_names())}.')
  return SLICES[key]


def libtpu_install_command() -> str:
  return f"pip install 'jax[tpu]=={jax.__version__}'"


def check_libtpu() -> None:
  """RuntimeError (one line, with the pip command) when libtpu, XLA's TPU compiler, is not installed."""
  if importlib.util.find_spec('libtpu') is None:
    raise RuntimeError(f'libtpu (the TPU compiler) is not installed: {libtpu_install_command()}')


def libtpu_version() -> Optional[str]:
  try:
    from importlib import metadata  # pylint: disable=g-import-not-at-top
    return metadata.version('libtpu')
  except Exception:  # pylint: disable=broad-except
    return None


def prepare_environment() -> None:
  """Environment libtpu reads when it loads: no TPU metadata server to ask, and several processes may load it
  (pytest-xdist workers). Set before the first topology is built; values already set are kept."""
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')


def topology_devices(tpu: TpuSlice) -> Tuple[jax.Device, ...]:
  """The slice's devices as libtpu describes them (each with its host's process_index): compile for them,
  never run on them."""
  check_libtpu()
  prepare_environment()
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  desc = topologies.get_topology_desc(topology_name=tpu.topology, platform='tpu',
                                      chip_config_name=tpu.chip_config,
                                      chips_per_host_bounds=tpu.chips_per_host_bounds)
  return tuple(desc.devices)


def mesh_problem(tpu: TpuSlice, num_partitions: int, devices: Sequence[jax.Device]) -> Optional[str]:
  """Why a (chips / num_partitions) x num_partitions mesh cannot lie on the slice's torus, or None."""
  if isinstance(num_partitions, bool) or not isinstance(num_partitions, int) or num_partitions < 1:
    return f'num_partitions must be a positive int, got {num_partitions!r}'
  if tpu.chips % num_partitions:
    return (f'a mesh with model axis {num_partitions} does not factor onto {tpu.name}: {num_partitions} does not '
            f'divide its {tpu.chips} chips (torus {tpu.topology})')
  from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
  shape = (tpu.chips // num_partitions, num_partitions)
  try:
    mesh_utils.create_device_mesh(shape, list(devices))
  except (ValueError, NotImplementedError, AssertionError) as e:
    return (f'the mesh data x model = {shape[0]} x {shape[1]} does not factor onto {tpu.name} '
            f'(torus {tpu.topology}): {str(e).splitlines()[0]}')
  return None


def slice_mesh(tpu: TpuSlice, num_partitions: int, devices: Sequence[jax.Device]):
  """The launcher's mesh (`partitioning.make_mesh`) on the slice's devices; ValueError (one line naming the mesh
  and the slice) for a mesh that does not factor onto the slice's torus."""
  from specdec import partitioning  # pylint: disable=g-import-not-at-top
  problem = mesh_problem(tpu, num_partitions, devices)
  if problem:
    raise ValueError(problem + '.')
  return partitioning.make_mesh(num_partitions, devices=list(devices))
