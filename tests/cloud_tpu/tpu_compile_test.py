"""Tests for specdec/cloud_tpu/tpu_compile.py: figures from XLA's TPU compiler, and the resumable sweep that records them."""

import dataclasses
import json
import os

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from specdec.cloud_tpu import tpu_compile
from specdec.cloud_tpu import tpu_programs
from specdec.cloud_tpu import tpu_slices

HLO = """
  %all-reduce-start.1 = bf16[8]{0} all-reduce-start(bf16[8]{0} %p), replica_groups={{0,1}}, to_apply=%add
  %all-reduce-done.1 = bf16[8]{0} all-reduce-done(bf16[8]{0} %all-reduce-start.1)
  %all-reduce.2 = f32[] all-reduce(f32[] %q), replica_groups={{0,1}}, to_apply=%add
  %all-gather-start = (f32[4]{0}, f32[8]{0}) all-gather-start(f32[4]{0} %r), dimensions={0}
  %all-gather-done = f32[8]{0} all-gather-done((f32[4]{0}, f32[8]{0}) %all-gather-start)
  %reduce-scatter.3 = f32[2]{0} reduce-scatter(f32[8]{0} %s), dimensions={0}, to_apply=%add
  %collective-permute-start.4 = (f32[2]{0}, f32[2]{0}) collective-permute-start(f32[2]{0} %t), source_target_pairs={{0,1}}
  %collective-permute-done.4 = f32[2]{0} collective-permute-done((f32[2]{0}, f32[2]{0}) %collective-permute-start.4)
  %fusion.all-reduce = f32[] fusion(f32[] %u), kind=kLoop, calls=%fused
"""


def test_count_collectives_counts_each_instruction_once_by_kind():
  assert tpu_compile.count_collectives(HLO) == {'all-reduce': 2, 'all-gather': 1, 'reduce-scatter': 1,
                                                'all-to-all': 0, 'collective-permute': 1}


def test_needed_bytes_and_verdict():
  memory = {'arguments': 10 * 2 ** 30, 'outputs': 4 * 2 ** 30, 'aliases': 4 * 2 ** 30,
            'temporaries': 2 ** 30, 'code': 2 ** 29}
  assert tpu_compile.needed_bytes(memory) == 11.5 * 2 ** 30
  assert tpu_compile.fit_verdict(11.5 * 2 ** 30, 32.0) == 'fits: 11.50 GiB of 32 per chip, 20.50 GiB free'
  assert tpu_compile.fit_verdict(40 * 2 ** 30, 32.0) == 'does not fit: needs 40.00 GiB of 32 per chip'


@pytest.fixture(scope='module')
def v4_8():
  tpu = tpu_slices.slice_named('v4-8')
  return tpu, tpu_slices.slice_mesh(tpu, 2, tpu_slices.topology_devices(tpu))


def _sum_program(mesh, name, rows=1024):
  """A tiny sharded program: [rows, 256] f32 over 'data', summed over columns (an all-reduce-free map) and rows."""
  sharding = NamedSharding(mesh, P('data', 'model'))
  fn = jax.jit(lambda x: (x * 2.0).sum(), in_shardings=sharding, out_shardings=NamedSharding(mesh, P()))
  lower = lambda: fn.lower(jax.ShapeDtypeStruct((rows, 256), np.float32))
  return tpu_programs.Program(name, 'verify', True, {'mesh': '2 x 2', 'batch': rows}, lower)


def test_compile_figures_are_per_chip(v4_8):
  _, mesh = v4_8
  figures = tpu_compile.compile_figures(_sum_program(mesh, 'sum').lower, hbm_gib=32.0)
  # [1024, 256] f32 = 1 MiB in all, over 2 x 2 chips: a quarter per chip.
  assert figures['memory']['arguments'] == 1024 * 256 * 4 // 4
  assert figures['fits'] and figures['verdict'].startswith('fits: ')
  assert figures['collectives']['all-reduce'] >= 1  # the partial sums meet
  assert figures['flops'] >= 1024 * 256 / 4
  assert figures['compile_s'] >= 0 and figures['lower_s'] >= 0


def test_sweep_records_failures_and_misfits_goes_on_and_resumes(v4_8, tmp_path):
  tpu, mesh = v4_8
  # 2e-4 GiB = 204.8 KiB per chip: the 1024-row program's argument alone is 256 KiB a chip, so it cannot fit; the
  # 8-row one needs 2 KiB of argument plus code and scratch (87-117 KiB from libtpu 0.0.42 and 0.0.50).
  small = dataclasses.replace(tpu, hbm_gib=2e-4)

  def broken():
    raise ValueError('the layout does not divide\nsecond line')

  programs = [_sum_program(mesh, 'fits', rows=8),
              tpu_programs.Program('broken', 'decode', False, {}, broken),
              ('unreadable', ValueError('bad gin binding')),
              _sum_program(mesh, 'too_big', rows=1024)]
  path = str(tmp_path / 'v4-8.json')
  lines = []
  results = tpu_compile.sweep(programs, small, path, {'command': 'python scripts/tpu_compile.py --slice=v4-8',
                                                      'jax': jax.__version__}, log=lines.append)
  recorded = results['programs']
  assert list(recorded) == ['fits', 'broken', 'unreadable', 'too_big']
  assert recorded['fits']['fits']
  assert recorded['broken']['error'] == 'ValueError: the layout does not divide'
  assert recorded['unreadable']['error'] == 'ValueError: bad gin binding'
  assert not recorded['too_big']['fits']
  assert recorded['too_big']['verdict'].startswith('does not fit: needs 0.00') and 'of 0.0002 per chip' in (
      recorded['too_big']['verdict'])
  with open(path, encoding='utf-8') as f:
    assert json.load(f) == results
  with open(os.path.splitext(path)[0] + '.md', encoding='utf-8') as f:
    md = f.read()
  assert '`python scripts/tpu_compile.py --slice=v4-8`' in md
  assert '| too_big | verify |  |  |  | 2 x 2 | 1024 |' in md and '**no** (does not fit' in md
  assert 'failed: ValueError: the layout does not divide' in md

  # A rerun compiles nothing already there; with retry_failed, the failed ones again.
  lines.clear()
  never = dataclasses.replace(_sum_program(mesh, 'fits', rows=8), lower=lambda: pytest.fail('compiled again'))
  tpu_compile.sweep([never], small, path, {'command': 'again'}, log=lines.append)
  assert any('already compiled' in line for line in lines)
  fixed = tpu_programs.Program('broken', 'decode', True, {}, _sum_program(mesh, 'x', rows=8).lower)
  results = tpu_compile.sweep([fixed], small, path, {'command': 'retry'}, log=lines.append, retry_failed=True)
  assert 'error' not in results['programs']['broken'] and results['programs']['broken']['fits']
  # Each piece that wrote something is named at the top (the one that only skipped wrote nothing).
  assert results['commands'] == ['python scripts/tpu_compile.py --slice=v4-8', 'retry']


def _script():
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'scripts', 'tpu_compile.py')
  spec = importlib.util.spec_from_file_location('tpu_compile_script', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize('argv, message', [
    (['--slice=v9-8'], "tpu_compile: unknown TPU slice 'v9-8'; known: v4-8, v4-16"),
    (['--slice=v4-8', '--num_partitions=3'], 'tpu_compile: a mesh with model axis 3 does not factor onto v4-8'),
    (['--slice=v4-8', '--kinds=decode,prefill'], "tpu_compile: unknown kinds ['prefill']"),
])
def test_script_bad_input_is_one_line_before_any_compile(argv, message, tmp_path):
  with pytest.raises(SystemExit) as e:
    _script().main(argv + [f'--out={tmp_path}'])
  assert str(e.value).startswith(message) and '\n' not in str(e.value)
  assert not os.listdir(tmp_path)


def test_script_without_libtpu_says_the_pip_command(monkeypatch, tmp_path):
  import importlib.util  # pylint: disable=g-import-not-at-top
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'libtpu' else real(name, *a))
  with pytest.raises(SystemExit) as e:
    _script().main(['--slice=v4-8', f'--out={tmp_path}'])
  assert str(e.value).endswith(f"pip install 'jax[tpu]=={jax.__version__}'")
