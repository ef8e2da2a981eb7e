"""Tests for specdec/cloud_tpu/tpu_slices.py: Cloud's slice names, the topologies libtpu builds from them, meshes on them."""

import importlib.util

import pytest

from specdec.cloud_tpu import tpu_slices


@pytest.mark.parametrize('name, topology, chip_config, chips, hosts, hbm', [
    ('v4-8', 'v4:2x2x1', 'megacore', 4, 1, 32.0),
    ('v4-16', 'v4:2x2x2', 'megacore', 8, 2, 32.0),
    ('v4-128', 'v4:4x4x4', 'megacore', 64, 16, 32.0),
    ('v5p-8', 'v5p:2x2x1', 'megacore', 4, 1, 95.0),
    ('v5e-8', 'v5e:2x4', 'default', 8, 1, 16.0),
    ('v5litepod-16', 'v5e:4x4', 'default', 16, 4, 16.0),
    ('v6e-4', 'v6e:2x2', 'default', 4, 1, 32.0),
    ('v6e-256', 'v6e:16x16', 'default', 256, 64, 32.0),
])
def test_cloud_names_map_to_topologies(name, topology, chip_config, chips, hosts, hbm):
  tpu = tpu_slices.slice_named(name)
  assert (tpu.topology, tpu.chip_config, tpu.chips, tpu.hosts, tpu.hbm_gib) == (
      topology, chip_config, chips, hosts, hbm)


def test_v5litepod_is_v5e():
  assert tpu_slices.slice_named('v5litepod-32') == tpu_slices.slice_named('v5e-32')


@pytest.mark.parametrize('name', ['v4-6', 'v3-8', 'tpu', 'v4_8', ''])
def test_unknown_slice_is_one_line_listing_the_known_names(name):
  with pytest.raises(ValueError) as e:
    tpu_slices.slice_named(name)
  message = str(e.value)
  assert '\n' not in message and repr(name) in message
  for known in ('v4-8', 'v4-128', 'v5litepod-16', 'v5e-16', 'v5p-8', 'v6e-8'):
    assert known in message


def test_missing_libtpu_is_one_line_with_the_pip_command(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'libtpu' else real(name, *a))
  with pytest.raises(RuntimeError) as e:
    tpu_slices.topology_devices(tpu_slices.slice_named('v4-8'))
  import jax  # pylint: disable=g-import-not-at-top
  assert str(e.value).endswith(f"pip install 'jax[tpu]=={jax.__version__}'")
  assert '\n' not in str(e.value)


def test_libtpu_is_installed():
  tpu_slices.check_libtpu()  # the [test] extra brings it
  assert tpu_slices.libtpu_version()


@pytest.mark.parametrize('name, chips, hosts', [('v4-8', 4, 1), ('v4-16', 8, 2), ('v5e-8', 8, 1),
                                                ('v5e-16', 16, 4)])
def test_topology_devices_have_the_slice_s_chips_and_hosts(name, chips, hosts):
  tpu = tpu_slices.slice_named(name)
  devices = tpu_slices.topology_devices(tpu)
  assert len(devices) == chips
  assert sorted({d.process_index for d in devices}) == list(range(hosts))
  assert all(d.platform == 'tpu' for d in devices)


def test_slice_mesh_is_the_launcher_s_mesh():
  tpu = tpu_slices.slice_named('v4-16')
  mesh = tpu_slices.slice_mesh(tpu, 4, tpu_slices.topology_devices(tpu))
  assert dict(mesh.shape) == {'data': 2, 'model': 4}
  assert {d.process_index for d in mesh.devices.ravel()} == {0, 1}


@pytest.mark.parametrize('num_partitions', [3, 8, 0])
def test_a_mesh_that_does_not_factor_is_one_line_naming_mesh_and_slice(num_partitions):
  tpu = tpu_slices.slice_named('v4-8')
  devices = tpu_slices.topology_devices(tpu)
  with pytest.raises(ValueError) as e:
    tpu_slices.slice_mesh(tpu, num_partitions, devices)
  message = str(e.value)
  assert '\n' not in message and str(num_partitions) in message
  if num_partitions:
    assert 'v4-8' in message
