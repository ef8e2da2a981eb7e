"""Tests for specdec/cloud_tpu/tpu_programs.py: the launched programs, read from the real gin files, compiled for TPU.

The Table-2 row and the fine-tune are the real gin files (gin/experiments/table2/xxl_ende_small_t0.gin,
gin/train/table2/small_ende.gin) with their networks and lengths bound tiny on the command line, so each compile
takes seconds; the sweep over the real sizes is scripts/tpu_compile.py.
"""

import pytest

from specdec.cloud_tpu import tpu_compile
from specdec.cloud_tpu import tpu_programs
from specdec.cloud_tpu import tpu_slices

ROW = 'experiments/table2/xxl_ende_small_t0.gin'
FINETUNE = 'train/table2/small_ende.gin'


def _tiny_network(scope):
  sizes = dict(emb_dim=16, num_heads=4, head_dim=4, num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
               relative_attention_num_buckets=8)
  return [f'--gin.{scope}/network.T5Config.{name}={value}' for name, value in sizes.items()]


TINY_ROW = (_tiny_network('target') + _tiny_network('drafter') +
            ['--gin.VOCAB_SIZE=128', "--gin.run_config.DataConfig.feature_lengths={'inputs': 16, 'targets': 8}",
             '--gin.settings.Setting.batch_size=2'])
TINY_FINETUNE = (_tiny_network('drafter') +
                 ['--gin.network.T5Config.vocab_size=128', "--gin.FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
                  '--gin.BATCH_SIZE=8'])


def _mesh_of(name):
  tpu = tpu_slices.slice_named(name)
  devices = tpu_slices.topology_devices(tpu)
  return tpu, lambda num_partitions: tpu_slices.slice_mesh(tpu, num_partitions, devices)


def test_table2_and_finetune_files_are_the_launched_ones():
  rows = tpu_programs.table2_gin_files()
  assert len(rows) == 12 and ROW in rows and 'experiments/table2/xxl_base.gin' not in rows
  runs = tpu_programs.finetune_gin_files()
  assert len(runs) == 8 and FINETUNE in runs and 'train/table2/finetune.gin' not in runs


def test_a_row_is_read_as_the_launcher_reads_it():
  _, mesh_of = _mesh_of('v4-8')
  run = tpu_programs.read_decode_run(ROW, mesh_of, TINY_ROW)
  assert (run.setting.gamma, run.setting.temperature, run.setting.batch_size) == (7, 0.0, 2)
  assert dict(run.mesh.shape) == {'data': 1, 'model': 4}  # xxl_base.gin's NUM_PARTITIONS = 4
  assert run.task == 'specdec_wmt_ende' and run.lengths == {'inputs': 16, 'targets': 8}
  assert str(run.target_params['encoder']['encoder_norm']['scale'].dtype) == 'bfloat16'
  names = [p.name for p in tpu_programs.decode_programs(run, 'xxl_ende_small_t0')]
  assert names == ['xxl_ende_small_t0', 'baseline_specdec_wmt_ende_t0', 'verify_specdec_wmt_ende_g7',
                   'draft_step_specdec_wmt_ende_small_g7']


def test_a_wrong_binding_fails_as_the_launch_would():
  _, mesh_of = _mesh_of('v4-8')
  with pytest.raises(ValueError, match='GAMA'):
    tpu_programs.read_decode_run(ROW, mesh_of, TINY_ROW + ['--gin.GAMA=3'])


def test_a_mesh_that_does_not_factor_names_mesh_and_slice():
  _, mesh_of = _mesh_of('v4-8')
  with pytest.raises(ValueError, match=r'model axis 3 does not factor onto v4-8'):
    tpu_programs.read_decode_run(ROW, mesh_of, TINY_ROW + ['--gin.NUM_PARTITIONS=3'])


@pytest.mark.parametrize('slice_name, mesh, hosts', [('v4-8', '1 x 4', 1), ('v4-16', '2 x 4', 2)])
def test_tiny_row_compiles_for_tpu(slice_name, mesh, hosts):
  tpu, mesh_of = _mesh_of(slice_name)
  run = tpu_programs.read_decode_run(ROW, mesh_of, TINY_ROW)
  assert {d.process_index for d in run.mesh.devices.ravel()} == set(range(hosts))
  decode = tpu_programs.decode_programs(run, 'row')[0]
  assert decode.kind == 'decode' and decode.settings['mesh'] == mesh
  figures = tpu_compile.compile_figures(decode.lower, tpu.hbm_gib, decode.straight_line)
  assert figures['fits']
  assert 0 < figures['memory']['arguments'] < 2 ** 20  # tiny params, sharded
  # Model-parallel over 4 chips: the partial products meet in all-reduces.
  assert figures['collectives']['all-reduce'] > 0


def test_tiny_verify_call_is_straight_line():
  tpu, mesh_of = _mesh_of('v4-8')
  run = tpu_programs.read_decode_run(ROW, mesh_of, TINY_ROW)
  verify = tpu_programs.decode_programs(run, 'row')[2]
  assert verify.kind == 'verify' and verify.straight_line and verify.settings['tokens'] == 8
  figures = tpu_compile.compile_figures(verify.lower, tpu.hbm_gib)
  assert figures['flops'] > 0 and figures['bytes_accessed'] > 0


def test_tiny_finetune_step_compiles_with_adafactor_state():
  tpu, mesh_of = _mesh_of('v4-8')
  program = tpu_programs.train_program(FINETUNE, mesh_of, bindings=TINY_FINETUNE)
  assert program.name == 'small_ende' and program.kind == 'train_step'
  assert program.settings['mesh'] == '4 x 1' and program.settings['batch'] == 8
  figures = tpu_compile.compile_figures(program.lower, tpu.hbm_gib)
  assert figures['fits']
  # The state is donated: its outputs reuse the arguments' buffers.
  assert figures['memory']['aliases'] > 0
  assert figures['collectives']['all-reduce'] > 0  # data-parallel gradients are summed


def test_launched_programs_come_by_kind_each_once_and_unreadable_files_as_errors():
  _, mesh_of = _mesh_of('v4-8')
  rows = [ROW, 'experiments/table2/xxl_ende_small_t1.gin', 'experiments/table2/no_such_row.gin']
  items = list(tpu_programs.launched_programs(mesh_of, ('decode', 'verify'), rows, [], TINY_ROW))
  errors = [item for item in items if isinstance(item, tuple)]
  assert [name for name, _ in errors] == ['no_such_row']
  names = [item.name for item in items if not isinstance(item, tuple)]
  # Both t0 and t1 rows of WMT with T5-small use γ 7: one verify program serves both.
  assert names == ['xxl_ende_small_t0', 'xxl_ende_small_t1', 'verify_specdec_wmt_ende_g7']
