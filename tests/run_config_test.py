"""Tests for specdec/run_config.py: the launcher's config dataclasses and the checks made before a run."""

import dataclasses
import json
import os

import pytest

from specdec import run_config
from specdec import settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(REPO, 'models', 'cpu', 'target')


def _config(**overrides):
  fields = dict(output_dir='runs/x',
                models=run_config.ModelsConfig(target_checkpoint=TARGET,
                                               drafter_checkpoint=os.path.join(REPO, 'models', 'cpu', 'd1')))
  fields.update(overrides)
  return run_config.RunConfig(**fields)


def _row(**overrides):
  fields = dict(task='specdec_ende_local', drafter='d1', temperature=0.0, gamma=2)
  fields.update(overrides)
  return fields


def test_the_shipped_row_passes_every_check():
  run_config.check(_config())


@pytest.mark.parametrize('overrides, match', [
    (dict(mode='train'), "mode must be one of .*'train'"),
    (dict(output_dir=''), 'No output directory'),
    (dict(models=run_config.ModelsConfig()), 'No target checkpoint'),
    (dict(data=run_config.DataConfig(feature_lengths={'inputs': 8})), 'feature_lengths'),
    (dict(decoding=settings.Setting(gamma=0)), 'gamma must be an int >= 1, got 0'),
    (dict(decoding=settings.Setting(temperature=-1.0)), 'temperature must be >= 0'),
    (dict(decoding=settings.Setting(topk=5, topp=0.9)), 'top-k or top-p'),
    (dict(mode='table'), 'needs rows'),
    (dict(mode='table', rows=[_row(), _row(gamma=0)]), r'^table row 2 \(specdec_ende_local, d1\): gamma'),
    (dict(models=run_config.ModelsConfig(target_checkpoint=TARGET)), 'needs a drafter'),
])
def test_check_settings(overrides, match):
  with pytest.raises(run_config.ConfigError, match=match):
    run_config.check_settings(_config(**overrides))


def test_check_files_names_what_is_missing(tmp_path):
  missing = str(tmp_path / 'nope')
  with pytest.raises(run_config.ConfigError, match=f'^target checkpoint not found: {missing}$'):
    run_config.check_files(_config(models=run_config.ModelsConfig(target_checkpoint=missing)))
  with pytest.raises(run_config.ConfigError, match='^drafter checkpoint not found'):
    run_config.check_files(_config(models=run_config.ModelsConfig(target_checkpoint=TARGET,
                                                                  drafter_checkpoint=missing)))
  with pytest.raises(run_config.ConfigError, match='^corpus directory not found'):
    run_config.check_files(_config(data=run_config.DataConfig(corpus_dir=missing)))
  with pytest.raises(run_config.ConfigError, match='^vocabulary not found'):
    run_config.check_files(_config(data=run_config.DataConfig(vocab_path=missing)))
  # A table row's drafter is looked up beside the target.
  with pytest.raises(run_config.ConfigError, match=r'^table row 1 drafter d9 not found: .*cpu/d9$'):
    run_config.check_files(_config(mode='table', rows=[_row(drafter='d9')]))


def test_remote_paths_are_left_to_the_run():
  run_config.check_files(_config(models=run_config.ModelsConfig(target_checkpoint='gs://bucket/target',
                                                                drafter_checkpoint='gs://bucket/drafter')))


def test_a_drafter_of_another_vocabulary_is_refused(tmp_path):
  drafter = tmp_path / 'drafter'
  drafter.mkdir()
  (drafter / 'config.json').write_text(json.dumps({'vocab_size': 32128}))  # a Hugging Face directory
  with pytest.raises(run_config.ConfigError, match='^Vocabulary mismatch: target vocab_size=8192, drafter '
                                                   r'checkpoint \(.*\) vocab_size=32128\.$'):
    run_config.check_files(_config(models=run_config.ModelsConfig(target_checkpoint=TARGET,
                                                                  drafter_checkpoint=str(drafter))))


def test_checkpoint_vocab_size():
  assert run_config.checkpoint_vocab_size(TARGET) == 8192  # compact
  assert run_config.checkpoint_vocab_size(os.path.join(REPO, 'models', 'cpu', 'bigram')) == 8192  # n-gram
  assert run_config.checkpoint_vocab_size('gs://bucket/x') is None
  gin_given = dataclasses.make_dataclass('C', ['vocab_size'])(5)
  assert run_config.checkpoint_vocab_size('gs://bucket/x', gin_given) == 5


def test_normalized_rows_and_setting():
  config = run_config.normalized(_config(mode='table', rows=[_row(draft_confidence=0.5)]))
  (row,) = config.rows
  assert row == run_config.Row(task='specdec_ende_local', drafter='d1', temperature=0.0, gamma=2,
                               draft_confidence=0.5)
  assert type(config.decoding) is settings.Setting  # pylint: disable=unidiomatic-typecheck
  setting = run_config.row_setting(row, config.decoding)
  assert (setting.gamma, setting.temperature, setting.draft_confidence) == (2, 0.0, 0.5)
  assert run_config.row_drafter_checkpoint(row, TARGET) == os.path.join(REPO, 'models', 'cpu', 'd1')
  assert run_config.row_label(row) == ('task specdec_ende_local, drafter d1, temperature 0, γ 2, '
                                       'draft confidence 0.5')


def test_describe_names_the_tasks():
  table = _config(mode='table', rows=[_row(), _row(temperature=1.0), _row(task='specdec_summarize_local')])
  assert run_config.describe(table) == (
      f'specdec table: 3 rows on specdec_ende_local, specdec_summarize_local:test, target {TARGET}')
  assert run_config.describe(_config()).startswith('specdec benchmark: task specdec_ende_local:test, drafter ')


def test_former_run_parameters_name_existing_fields():
  owners = {'run_config.RunConfig': run_config.RunConfig, 'run_config.DataConfig': run_config.DataConfig,
            'run_config.ModelsConfig': run_config.ModelsConfig, 'settings.Setting': settings.Setting}
  assert len(run_config.FORMER_RUN_PARAMETERS) == 27
  for old, new in run_config.FORMER_RUN_PARAMETERS.items():
    owner, field = new.rsplit('.', 1)
    assert old == f'main.run.{field}' and field in {f.name for f in dataclasses.fields(owners[owner])}
