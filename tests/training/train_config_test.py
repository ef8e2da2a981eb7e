"""Tests for specdec/training/train_config.py: the config dataclasses, flat settings and gin bindings."""

import dataclasses
import glob
import os

import gin
import pytest

from specdec import gin_utils
from specdec import network
from specdec.training import train_config

CFG = network.t5_1_1_config('tiny', vocab_size=8192)


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_defaults():
  config = train_config.TrainConfig('runs/m', CFG)
  assert (config.num_steps, config.seed, config.z_loss, config.log_every,
          config.checkpoint_every, config.max_minutes, config.export_dir) == (
              2000, 0, 1e-4, 20, 200, None, None)
  assert config.data == train_config.DataConfig()
  assert dict(config.data.feature_lengths) == {'inputs': 128, 'targets': 64}
  assert (config.data.batch_size, config.data.mixture_or_task_name) == (32, 'specdec_local_mix')
  assert config.init == train_config.InitConfig(None, False, None)
  assert config.distill == train_config.DistillConfig(None, 0.5, 'fkl')
  assert config.evaluation.eval_decode_tasks == ('specdec_ende_local', 'specdec_summarize_local')
  assert config.partitioning == train_config.PartitioningConfig(1, 1)


def test_from_flat_puts_each_setting_in_its_section():
  config = train_config.from_flat('runs/m', CFG, batch_size=8, num_steps=5, eval_every=3,
                                  teacher_dir='t', num_partitions=2, init_from_dir='i')
  assert (config.model_dir, config.network_config, config.num_steps) == ('runs/m', CFG, 5)
  assert config.data.batch_size == 8
  assert config.evaluation.eval_every == 3
  assert config.distill.teacher_dir == 't'
  assert config.partitioning.num_partitions == 2
  assert config.init.init_from_dir == 'i'
  # The rest keep their defaults.
  assert config.evaluation.eval_batches == 8 and config.log_every == 20


def test_from_flat_refuses_an_unknown_setting():
  with pytest.raises(TypeError, match=r"Unknown training settings \['num_stepz'\]"):
    train_config.from_flat('m', CFG, num_stepz=3)
  with pytest.raises(TypeError, match=r"\['config'\]"):
    train_config.from_flat('m', CFG, config=CFG)


def test_flat_settings_round_trip():
  config = train_config.from_flat('m', CFG, batch_size=8, divergence='tvd')
  flat = train_config.flat_settings(config)
  assert flat['batch_size'] == 8 and flat['divergence'] == 'tvd'
  assert set(flat) == set(train_config.FIELD_SECTIONS)
  rest = {k: v for k, v in flat.items() if k not in ('model_dir', 'network_config')}
  assert train_config.from_flat('m', CFG, **rest) == config


def test_field_names_are_unique_across_sections():
  names = [f.name for f in dataclasses.fields(train_config.TrainConfig)
           if f.name not in train_config.SECTIONS]
  for cls in train_config.SECTIONS.values():
    names += [f.name for f in dataclasses.fields(cls)]
  assert len(names) == len(set(names)) == len(train_config.FIELD_SECTIONS)


@pytest.mark.parametrize('name, selector', [
    ('num_steps', 'train_config.TrainConfig.num_steps'),
    ('config', 'train_config.TrainConfig.network_config'),
    ('batch_size', 'train_config.DataConfig.batch_size'),
    ('corpus_dir', 'train_config.DataConfig.corpus_dir'),
    ('init_matching_only', 'train_config.InitConfig.init_matching_only'),
    ('divergence', 'train_config.DistillConfig.divergence'),
    ('eval_every', 'train_config.EvalConfig.eval_every'),
    ('parameter_partitioning_dims', 'train_config.PartitioningConfig.parameter_partitioning_dims'),
])
def test_selector(name, selector):
  assert train_config.selector(name) == selector


def test_former_train_parameters_name_their_bindings_now():
  former = train_config.FORMER_TRAIN_PARAMETERS
  assert former['train.train.num_steps'] == 'train_config.TrainConfig.num_steps'
  assert former['train.train.teacher_dir'] == 'train_config.DistillConfig.teacher_dir'
  assert former['train.train.config'] == 'train_config.TrainConfig.network_config'
  assert len(former) == len(train_config.FIELD_SECTIONS) + 1


def test_a_former_parameter_on_the_command_line_is_refused_naming_its_binding():
  with pytest.raises(gin_utils.GinConfigError,
                     match=r'train.train.batch_size is now train_config.DataConfig.batch_size'):
    gin_utils.parse(['train/cpu_target.gin'], ["MODEL_DIR = 'm'", 'train.train.batch_size = 8'],
                    renamed=train_config.FORMER_TRAIN_PARAMETERS)


def test_gin_binds_the_sections_without_naming_them():
  gin_utils.parse(['train/cpu_target.gin'], ["MODEL_DIR = 'runs/m'",
                                             'train_config.TrainConfig.num_steps = 7',
                                             'train_config.DataConfig.batch_size = 8'])
  config = gin.get_configurable(train_config.TrainConfig)()
  assert (config.model_dir, config.num_steps, config.max_minutes) == ('runs/m', 7, 75)
  assert config.data.batch_size == 8
  assert dict(config.data.feature_lengths) == {'inputs': 96, 'targets': 48}
  assert config.evaluation.eval_every == 500
  assert config.network_config.emb_dim == 256


def test_a_misspelt_field_is_refused_by_gin():
  with pytest.raises(gin_utils.GinConfigError, match=r'did you mean num_steps\?'):
    gin_utils.parse(['train/cpu_target.gin'], ["MODEL_DIR = 'm'",
                                               'train_config.TrainConfig.num_stepz = 3'])


def test_old_bindings():
  assert train_config.old_bindings() == []
  gin.parse_config('\n'.join(['from __gin__ import dynamic_registration',
                              'from specdec.training import train',
                              'train.train.batch_size = 8']))
  assert train_config.old_bindings() == ['batch_size']


GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), 'gin')
TRAIN_FILES = sorted(os.path.relpath(p, GIN_DIR) for p in glob.glob(os.path.join(GIN_DIR, 'train', '**', '*.gin'),
                                                                    recursive=True)
                     if not p.endswith('finetune.gin'))  # the table2 runs' shared base


@pytest.mark.parametrize('path', TRAIN_FILES)
def test_every_section_binds_on_the_command_line(path):
  settings = dict(num_steps=7, batch_size=8, init_matching_only=True, distill_weight=1.0,
                  eval_every=3, parameter_partitioning_dims=2)
  gin_utils.parse([path], ["MODEL_DIR = 'm'"] + [
      f'{train_config.selector(k)} = {v!r}' for k, v in settings.items()])
  flat = train_config.flat_settings(gin.get_configurable(train_config.TrainConfig)())
  assert {k: flat[k] for k in settings} == settings
  assert flat['model_dir'] == 'm'
