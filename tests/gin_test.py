"""The gin configs in gin/ parse and build the models they describe."""

import dataclasses
import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import decoding
from specdec import gin_utils
from specdec import main
from specdec import models
from specdec import network
from specdec import run_config
from specdec import settings
from specdec.bench import tables
from specdec import tasks
from specdec.training import train
from specdec.training import train_config

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'gin')


def _build(files, bindings=()):
  gin.clear_config()
  gin.parse_config_files_and_bindings(
      [os.path.join(GIN_DIR, f) for f in files], list(bindings))
  return gin.query_parameter('%MODEL').scoped_configurable_fn()


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


@pytest.mark.parametrize('target, drafter', [
    ('xxl', 'small'), ('xxl', 'base'), ('xxl', 'large'), ('base', 'small')])
def test_paper_pairs_build(target, drafter):
  model = _build(['models/speculative.gin', f'models/target_t5_1_1_{target}.gin',
                  f'models/drafter_t5_1_1_{drafter}.gin'])
  assert isinstance(model, models.SpeculativeEncoderDecoderModel)
  assert model.module.config == network.t5_1_1_config(
      target, dtype='bfloat16', dropout_rate=0.0)
  assert model.drafter_module.config == network.t5_1_1_config(
      drafter, dtype='bfloat16', dropout_rate=0.0)


def test_baseline_builds():
  model = _build(['models/baseline.gin', 'models/target_t5_1_1_small.gin'])
  assert model.drafter_module is None
  assert model.module.config.emb_dim == 512


def _tiny_bindings(role):
  return [f'{role}/network.T5Config.{k} = {v}' for k, v in dict(
      emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=2,
      num_decoder_layers=2, mlp_dim=64).items()]


def test_gin_configured_decoding_is_exact():
  tiny = ['VOCAB_SIZE = 64', "ACTIVATION_DTYPE = 'float32'"]
  spec = _build(['models/speculative.gin'], tiny + _tiny_bindings('target') + _tiny_bindings('drafter'))
  params = spec.get_initial_params(jax.random.PRNGKey(0))
  batch = {'encoder_input_tokens': jnp.asarray(
               np.random.RandomState(0).randint(2, 64, (3, 7)), jnp.int32),
           'decoder_input_tokens': jnp.zeros((3, 10), jnp.int32)}
  # γ and temperature come from the settings object, as the launcher passes them (gin builds the networks).
  setting = settings.Setting(gamma=3, temperature=0.0)
  spec_out, aux = spec.compile_predict(setting.speculative_params())(params, batch)
  assert aux['stats']['accepted_at'].shape == (3, 3)  # γ = 3
  base = _build(['models/baseline.gin'], tiny + _tiny_bindings('target'))
  base_out, _ = base.compile_predict(setting.decoder_params())({'target': params['target']}, batch)
  np.testing.assert_array_equal(spec_out, base_out)


# -----------------------------------------------------------------------------
# gin/experiments: the launcher's experiment files
# -----------------------------------------------------------------------------

EXPERIMENTS_DIR = os.path.join(GIN_DIR, 'experiments')
EXPERIMENT_FILES = sorted(
    os.path.relpath(os.path.join(d, f), GIN_DIR)
    for d, _, files in os.walk(EXPERIMENTS_DIR) for f in files if f.endswith('.gin'))
KNOWN_TASKS = tasks.LOCAL_TASKS + tasks.PAPER_TASKS


def _resolve(value):
  """Evaluates gin references (%MACRO, @scope/fn()) inside a queried value."""
  if isinstance(value, gin.config.ConfigurableReference):
    return _resolve(value.scoped_configurable_fn())
  if isinstance(value, dict):
    return {k: _resolve(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(_resolve(v) for v in value)
  return value


def _fields(config):
  return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _run_params(path, bindings=()):
  """The fields of the RunConfig the experiment file (plus `bindings`) builds for main.run, and of its parts."""
  gin.clear_config()
  gin_utils.parse([path], ["OUTPUT_DIR = 'runs/specdec_gin_test'"] + list(bindings))
  config = _resolve(gin.query_parameter('main.run.config'))
  assert isinstance(config, run_config.RunConfig)
  return {**_fields(config), **_fields(config.data), **_fields(config.models), **_fields(config.decoding)}


def test_experiment_files_are_found():
  assert len(EXPERIMENT_FILES) >= 26  # 2 CPU bases + 12 CPU rows + the XXL base + 12 XXL rows


@pytest.mark.parametrize('path', EXPERIMENT_FILES)
def test_experiment_file_parses_and_binds_a_valid_run(path):
  # The XXL base is an include: its rows bind DRAFTER_CHECKPOINT.
  bindings = ["DRAFTER_CHECKPOINT = 'x'"] if path.endswith('table2/xxl_base.gin') else []
  p = _run_params(path, bindings)
  assert p['output_dir'] == 'runs/specdec_gin_test'  # everything goes under OUTPUT_DIR
  assert p['mode'] in main.MODES
  assert p['task'] in KNOWN_TASKS
  assert p['split'] in tasks.SPLITS
  assert set(dict(p['feature_lengths'])) == {'inputs', 'targets'}
  assert all(isinstance(n, int) and n > 0 for n in dict(p['feature_lengths']).values())
  assert settings.is_auto(p['gamma']) or (
      isinstance(p['gamma'], int) and not isinstance(p['gamma'], bool) and p['gamma'] >= 1)
  assert p['temperature'] >= 0
  assert not (p['topk'] and p['topp'])
  assert p['target_checkpoint'] is not gin.REQUIRED and p['target_checkpoint']
  if p['mode'] == 'benchmark' and not path.endswith('base.gin'):
    assert p['drafter_checkpoint']
  if p['mode'] == 'table':
    assert p['rows']
    for row in p['rows']:
      row = row if isinstance(row, main.Row) else main.Row(**row)
      assert row.task in KNOWN_TASKS and row.temperature >= 0
      assert settings.is_auto(row.gamma) or (isinstance(row.gamma, int) and row.gamma >= 1)
  # The launcher's own validation accepts the setting.
  settings.Setting(gamma=p['gamma'], temperature=p['temperature'], topk=p['topk'], topp=p['topp'],
                   batch_size=p['batch_size'], repeats=p['repeats']).validate()


# The paper's Table 2 (T5-XXL target): (task, drafter, temperature) -> γ.
PAPER_TABLE2_GAMMA = {
    ('ende', 'small', 0): 7, ('ende', 'base', 0): 7, ('ende', 'large', 0): 7,
    ('ende', 'small', 1): 7, ('ende', 'base', 1): 5, ('ende', 'large', 1): 3,
    ('cnndm', 'small', 0): 5, ('cnndm', 'base', 0): 5, ('cnndm', 'large', 0): 3,
    ('cnndm', 'small', 1): 5, ('cnndm', 'base', 1): 3, ('cnndm', 'large', 1): 3,
}
PAPER_TASK = {'ende': tasks.WMT_ENDE_TASK, 'cnndm': tasks.CNN_DAILYMAIL_TASK}


def test_xxl_table2_rows_are_the_papers_twelve():
  files = sorted(f for f in os.listdir(os.path.join(EXPERIMENTS_DIR, 'table2')) if f != 'xxl_base.gin')
  assert files == sorted(f'xxl_{t}_{d}_t{temp}.gin' for t, d, temp in PAPER_TABLE2_GAMMA)


@pytest.mark.parametrize('task, drafter, temp', sorted(PAPER_TABLE2_GAMMA))
def test_xxl_table2_row(task, drafter, temp):
  p = _run_params(f'experiments/table2/xxl_{task}_{drafter}_t{temp}.gin')
  assert p['mode'] == 'benchmark'
  assert p['task'] == PAPER_TASK[task]
  assert p['drafter_name'] == drafter
  assert p['temperature'] == float(temp)
  assert p['gamma'] == PAPER_TABLE2_GAMMA[(task, drafter, temp)]
  assert p['batch_size'] == 1  # the paper's setting
  assert (task, drafter, float(temp)) in tables.PAPER_TABLE2
  assert tables.paper_row(p['task'], p['drafter_name'], p['temperature'])[0] == p['gamma']
  # T5 1.1 XXL target and the named drafter size, with T5's vocabulary; configs only (nothing materialised).
  assert p['target_config'] == network.t5_1_1_config('xxl', dtype='bfloat16', dropout_rate=0.0)
  assert p['drafter_config'] == network.t5_1_1_config(drafter, dtype='bfloat16', dropout_rate=0.0)
  assert p['target_config'].vocab_size == p['drafter_config'].vocab_size == 32128
  assert p['target_config'].emb_dim == 4096 and p['target_config'].num_encoder_layers == 24
  assert f't5_1_1_{drafter}' in p['drafter_checkpoint']
  assert 't5_1_1_xxl' in p['target_checkpoint']
  assert p['vocab_path'] == tasks.T5_DEFAULT_VOCAB_PATH
  assert p['dtype'] == 'bfloat16'


CPU_ROWS = [(t, d, temp) for t in ('ende', 'summ') for d in (1, 2, 3) for temp in (0, 1)]
CPU_TASK = {'ende': tasks.ENDE_LOCAL_TASK, 'summ': tasks.SUMMARIZE_LOCAL_TASK}


def test_cpu_table2_rows_cover_tasks_drafters_and_temperatures():
  files = sorted(os.listdir(os.path.join(EXPERIMENTS_DIR, 'cpu', 'table2')))
  assert files == sorted(f'{t}_d{d}_t{temp}.gin' for t, d, temp in CPU_ROWS)


@pytest.mark.parametrize('task, drafter, temp', CPU_ROWS)
def test_cpu_table2_row(task, drafter, temp):
  p = _run_params(f'experiments/cpu/table2/{task}_d{drafter}_t{temp}.gin')
  assert p['mode'] == 'benchmark'
  assert p['task'] == CPU_TASK[task]
  assert p['drafter_name'] == f'd{drafter}'
  assert p['drafter_checkpoint'] == f'models/cpu/d{drafter}'
  assert p['target_checkpoint'] == 'models/cpu/target'
  repo = os.path.dirname(GIN_DIR)  # the paths are relative to the repository root, where they are shipped
  for path in (p['target_checkpoint'], p['drafter_checkpoint']):
    assert os.path.isfile(os.path.join(repo, path, 'config.json')), path
  assert p['temperature'] == float(temp)
  assert p['gamma'] >= 1
  assert p['batch_size'] == 1
  # The shipped family's compact checkpoints carry their configs: none is given in gin.
  assert p['target_config'] is None and p['drafter_config'] is None
  assert tables.paper_row(p['task'], p['drafter_name'], p['temperature']) is not None


# -----------------------------------------------------------------------------
# Command-line bindings that would change nothing are refused (gin_utils.parse)
# -----------------------------------------------------------------------------


@pytest.mark.parametrize('path', EXPERIMENT_FILES)
def test_experiment_file_refuses_a_misspelt_macro(path):
  gin.clear_config()
  with pytest.raises(gin_utils.GinConfigError,
                     match=r"^binding 'OUTPUT_DIRR = 'x'': no gin file uses macro OUTPUT_DIRR, .*"
                           r'\(did you mean OUTPUT_DIR\?\)\.$'):
    gin_utils.parse([path], ["OUTPUT_DIR = 'runs/specdec_gin_test'", "OUTPUT_DIRR = 'x'"])


def test_the_issue_reproduction_gamma_typo_is_refused():
  gin.clear_config()
  _, bindings, _ = gin_utils.split_gin_args(
      ['--gin.run_config.RunConfig.mode=\'infer\'', '--gin.run_config.DataConfig.max_examples=2',
       "--gin.OUTPUT_DIR='probe_out'",
       '--gin.GAMA=3'])
  with pytest.raises(gin_utils.GinConfigError, match=r'macro GAMA, .*\(did you mean GAMMA\?\)'):
    gin_utils.parse(['experiments/cpu/table2/ende_d1_t0.gin'], bindings)


@pytest.mark.parametrize('path, bindings', [
    # The README's and the scripts' command lines.
    ('experiments/cpu/table2/ende_d1_t0.gin', ["OUTPUT_DIR = 'runs/x'", 'GAMMA = 6']),
    ('experiments/cpu/main_job.gin', ['GAMMA = 3', 'DRAFT_CONFIDENCE = 0.0', "ENDE_DRAFTER = 'd1'", "SUMMARIZE_DRAFTER = 'd1'",
                                      'run_config.DataConfig.max_examples = 2']),
    ('experiments/cpu/table2/ende_d1_t0.gin', ["OUTPUT_DIR = 'x'", "DRAFTER_CHECKPOINT = 'models/cpu/d3'",
                                               "TARGET_CHECKPOINT = 'models/cpu/target'",
                                               'run_config.RunConfig.overwrite = True']),
    ('train/cpu_target.gin', ["MODEL_DIR = 'runs/target'", "EXPORT_DIR = 'runs/target.partial'",
                              'train_config.TrainConfig.num_steps = 10']),
    # docs/cloud_tpu.md and scripts/tpu/*.sh.
    ('train/table2/xxl_ende.gin', ["MODEL_DIR = 'gs://bucket/finetune/xxl_ende'"]),
    ('experiments/table2/xxl_ende_small_t0.gin', [
        "OUTPUT_DIR = 'gs://bucket/table2/xxl_ende_small_t0'",
        "TARGET_CHECKPOINT = 'gs://bucket/finetune/xxl_ende/checkpoints'",
        "DRAFTER_CHECKPOINT = 'gs://bucket/finetune/small_ende/checkpoints'"]),
])
def test_bindings_in_use_are_accepted(path, bindings):
  gin.clear_config()
  gin_utils.parse([path], bindings)


def test_unset_output_dir_is_one_line():
  gin.clear_config()
  with pytest.raises(gin_utils.GinConfigError) as e:
    gin_utils.parse(['experiments/cpu/table2/ende_d1_t0.gin'], [])
  assert str(e.value) == 'macro OUTPUT_DIR is used but never set: bind it, e.g. --gin.OUTPUT_DIR=VALUE.'


# -----------------------------------------------------------------------------
# gin/train/table2: fine-tuning the Table-2 models (scripts/tpu/finetune_table2.sh)
# -----------------------------------------------------------------------------

FINETUNE_DIR = os.path.join(GIN_DIR, 'train', 'table2')
FINETUNE_RUNS = [(size, task) for size in ('small', 'base', 'large', 'xxl') for task in ('ende', 'cnndm')]


def _train_params(path, bindings=()):
  """The TrainConfig the file builds, by flat name (train_config.flat_settings), plus the optimizer's settings."""
  gin.clear_config()
  gin_utils.parse([path], ["MODEL_DIR = 'gs://bucket/finetune/run'"] + list(bindings))
  params = train_config.flat_settings(gin.get_configurable(train_config.TrainConfig)())
  for name in ('name', 'schedule', 'clip_norm'):
    params[f'optimizer_{name}'] = gin.query_parameter(f'train.make_optimizer.{name}')
  params['learning_rate'] = _resolve(gin.query_parameter('train.constant_learning_rate.value'))
  return params


def test_finetune_files_are_the_eight_runs_and_their_shared_base():
  assert sorted(os.listdir(FINETUNE_DIR)) == sorted(
      ['finetune.gin'] + [f'{size}_{task}.gin' for size, task in FINETUNE_RUNS])


@pytest.mark.parametrize('size, task', FINETUNE_RUNS)
def test_finetune_run(size, task):
  p = _train_params(f'train/table2/{size}_{task}.gin')
  assert p['model_dir'] == 'gs://bucket/finetune/run'
  # T5 1.1 of that size, as T5X fine-tunes it: bf16 activations, dropout 0.1, T5's padded vocabulary.
  assert p['network_config'] == network.t5_1_1_config(size, dtype='bfloat16', dropout_rate=0.1)
  assert p['init_from_t5x'] == f'gs://t5-data/pretrained_models/t5x/t5_1_1_{size}/checkpoint_1000000'
  assert p['mixture_or_task_name'] == PAPER_TASK[task]
  assert list(p['eval_decode_tasks']) == [PAPER_TASK[task]]
  assert p['eval_decode_examples'] > 0 and p['eval_every'] <= p['num_steps']
  # T5X's fine-tuning defaults (t5x/configs/runs/finetune.gin, t5_1_1/base.gin).
  assert p['batch_size'] == 128
  assert (p['optimizer_name'], p['optimizer_schedule'], p['optimizer_clip_norm']) == (
      'adafactor', 'constant', None)
  assert p['learning_rate'] == 1e-3
  assert p['z_loss'] == 1e-4
  assert p['parameter_partitioning_dims'] in (1, 2)
  assert p['network_config'].num_heads % p['num_partitions'] == 0


@pytest.mark.parametrize('size, task', FINETUNE_RUNS)
def test_finetune_starts_from_the_checkpoint_table2_decodes_by_default(size, task):
  # The Table-2 rows read the public checkpoints unless pointed at the fine-tunes: the same models.
  temperature, drafter = 0, 'small' if size == 'xxl' else size
  decode = _run_params(f'experiments/table2/xxl_{task}_{drafter}_t{temperature}.gin')
  checkpoint = decode['target_checkpoint' if size == 'xxl' else 'drafter_checkpoint']
  assert _train_params(f'train/table2/{size}_{task}.gin')['init_from_t5x'] == checkpoint


@pytest.mark.parametrize('task', ['ende', 'cnndm'])
def test_table2_decodes_the_inputs_the_models_were_fine_tuned_on(task):
  trained = {size: dict(_train_params(f'train/table2/{size}_{task}.gin')['feature_lengths'])
             for size in ('small', 'base', 'large', 'xxl')}
  assert len({tuple(sorted(t.items())) for t in trained.values()}) == 1  # target and drafters alike
  decoded = dict(_run_params(f'experiments/table2/xxl_{task}_small_t0.gin')['feature_lengths'])
  assert decoded['inputs'] == trained['xxl']['inputs']
  assert decoded['targets'] >= trained['xxl']['targets']  # a decoding limit, not a cut


@pytest.mark.parametrize('size, task', FINETUNE_RUNS)
def test_finetune_file_refuses_a_misspelt_macro(size, task):
  gin.clear_config()
  with pytest.raises(gin_utils.GinConfigError, match=r'macro MODEL_DIRR, .*\(did you mean MODEL_DIR\?\)'):
    gin_utils.parse([f'train/table2/{size}_{task}.gin'], ["MODEL_DIR = 'x'", "MODEL_DIRR = 'x'"])


def test_finetune_without_model_dir_is_one_line():
  gin.clear_config()
  with pytest.raises(gin_utils.GinConfigError, match='^macro MODEL_DIR is used but never set'):
    gin_utils.parse(['train/table2/small_ende.gin'], [])
