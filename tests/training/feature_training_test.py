"""Tests for specdec/training/feature_training.py: a short feature-head run on the fixture corpus.

One tiny target (exported to a compact model dir) and one head run of a few
steps, shared by the tests through module fixtures: it trains, evaluates on
the target's own decodes, resumes, exports a loadable head with its card,
and drafts exactly through the model.
"""

import contextlib
import functools
import io
import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import checkpoints
from specdec import decoding
from specdec import feature_drafter
from specdec import feature_head_checkpoint
from specdec.training import feature_losses
from specdec.training import feature_training
from specdec import models
from specdec import network
from specdec import tasks
from specdec.training import train
from specdec.training import train_config

FIXTURE_CORPUS = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'testdata', 'tasks', 'corpus')
TARGET = network.t5_1_1_config('tiny', vocab_size=8192, dropout_rate=0.0)
LENGTHS = {'inputs': 32, 'targets': 16}
STEPS = 6


@pytest.fixture(scope='module', autouse=True)
def local_tasks():
  tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS)
  yield
  tasks.register_local_tasks()


@pytest.fixture(scope='module')
def target_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('target'))
  params = network.init_params(TARGET, jax.random.PRNGKey(0))
  checkpoints.save_compact(path, TARGET, params, storage_dtype=jnp.float32)
  return path


def _config(model_dir, target_dir, num_steps=STEPS, **section):
  head = dict(dict(target_dir=target_dir, width=16, num_heads=2, head_dim=8, mlp_dim=32,
                   unroll_steps=2, eval_examples=4), **section)
  return train_config.TrainConfig(
      model_dir=str(model_dir), network_config=TARGET, num_steps=num_steps, seed=0,
      log_every=1, checkpoint_every=3, export_dir=os.path.join(str(model_dir), 'export'),
      data=train_config.DataConfig(feature_lengths=LENGTHS,
                                   batch_size=math.lcm(4, jax.device_count())),
      evaluation=train_config.EvalConfig(eval_every=1000),
      feature_head=train_config.FeatureHeadTrainConfig(**head))


def _run(config):
  """A run with a schedule that warms up in one step, so the loss drops within a few."""
  out = io.StringIO()
  with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
    mp.setattr(train, 'learning_rate_schedule',
               functools.partial(train.learning_rate_schedule, peak=0.01, warmup_steps=1))
    record = feature_training.FeatureHeadTrainer(config).run()
  return record, out.getvalue()


@pytest.fixture(scope='module')
def first_run(tmp_path_factory, target_dir):
  model_dir = tmp_path_factory.mktemp('head')
  vocab_file = os.path.join(str(model_dir), 'draft_vocab.json')
  with open(vocab_file, 'w') as f:
    json.dump(list(range(0, 8192, 2)) + [1], f)  # unsorted on purpose: not accepted
  with pytest.raises(ValueError, match=r'draft_vocab.json: token ids must be sorted ascending and unique'):
    feature_training.FeatureHeadTrainer(_config(model_dir, target_dir,
                                                draft_vocab_file=vocab_file))
  with open(vocab_file, 'w') as f:
    json.dump(sorted(set(range(0, 8192, 2)) | {1}), f)
  record, printed = _run(_config(model_dir, target_dir, draft_vocab_file=vocab_file))
  return dict(model_dir=str(model_dir), record=record, printed=printed, vocab_file=vocab_file)


def test_trains_and_evaluates_on_the_targets_decodes(first_run):
  with open(os.path.join(first_run['model_dir'], 'train_log.jsonl')) as f:
    log = [json.loads(line) for line in f]
  losses = [r['loss'] for r in log if r['kind'] == 'train']
  assert len(losses) == STEPS and all(np.isfinite(losses))
  assert losses[-1] < losses[0]
  record = first_run['record']
  for task in ('specdec_ende_local', 'specdec_summarize_local'):
    assert 0.0 <= record[f'{task}/agree'] <= 1.0
    assert f'{task}/agree_s1' in record
  assert 'Feature head' in first_run['printed']


def test_export_is_a_loadable_head_with_its_card(first_run, target_dir):
  export = os.path.join(first_run['model_dir'], 'export')
  config, params, vocab_ids, meta = feature_head_checkpoint.load(export)
  assert feature_head_checkpoint.is_head_dir(export) and not feature_head_checkpoint.is_head_dir(target_dir)
  assert config.width == 16 and config.feature_dim == TARGET.emb_dim
  with open(first_run['vocab_file']) as f:
    np.testing.assert_array_equal(vocab_ids, json.load(f))
  assert meta['train']['step'] == STEPS and meta['train']['loss']['unroll_steps'] == 2
  card = open(os.path.join(export, 'MODEL_CARD.md')).read()
  assert f'{STEPS} steps' in card and '4097 tokens' in card
  assert 'Initialised from: `random`' in card and 'drawn equally often' not in card
  assert meta['train']['equal_rates'] is False and meta['train']['task_rates'] is None
  _, target_params = checkpoints.load_compact(target_dir)
  feature_head_checkpoint.check_made_for(meta, target_params, export)
  other = jax.tree_util.tree_map(lambda x: x + 1.0, target_params)
  with pytest.raises(ValueError, match='trained for another target'):
    feature_head_checkpoint.check_made_for(meta, other, export)


def test_exported_head_drafts_exactly(first_run, target_dir):
  export = os.path.join(first_run['model_dir'], 'export')
  config, head_params, vocab_ids, _ = feature_head_checkpoint.load(export)
  _, target_params = checkpoints.load_compact(target_dir)
  target = network.Transformer(TARGET)
  spec = models.SpeculativeEncoderDecoderModel(target, feature_drafter.FeatureHead(config),
                                               draft_vocab_ids=vocab_ids)
  base = models.SpeculativeEncoderDecoderModel(target, None, decode_fn=decoding.temperature_sample)
  rng = np.random.RandomState(0)
  batch = {'encoder_input_tokens': jnp.asarray(rng.randint(2, 8100, (3, 10)), jnp.int32),
           'decoder_input_tokens': jnp.zeros((3, 12), jnp.int32)}
  params = {'target': target_params, 'drafter': head_params}
  want, _ = base.compile_predict({'temperature': 0.0})(params, batch)
  got, aux = spec.compile_predict({'temperature': 0.0, 'gamma': 3, 'return_stats': True})(
      params, batch)
  np.testing.assert_array_equal(got, want)


def test_resumes_where_it_stopped(first_run, target_dir, tmp_path):
  model_dir = tmp_path / 'resumed'
  shutil.copytree(first_run['model_dir'], model_dir)
  shutil.rmtree(model_dir / 'checkpoints' / str(STEPS))
  record, printed = _run(_config(model_dir, target_dir, draft_vocab_file=first_run['vocab_file']))
  assert 'Resumed from' in printed and 'at step 3' in printed
  with open(model_dir / 'runs.jsonl') as f:
    runs = [json.loads(line) for line in f]
  assert runs[-1]['from_step'] == 3 and runs[-1]['to_step'] == STEPS
  assert runs[-1]['command'].startswith('python -m specdec.training.feature_training')


@pytest.mark.parametrize('section, message', [
    (dict(target_dir=None), 'needs feature_head.target_dir'),
    (dict(target_dir='no/such/dir'), 'does not exist'),
    (dict(unroll_steps=0), 'unroll_steps must be >= 1'),
    (dict(draft_vocab_file='no/such.json'), 'does not exist'),
])
def test_bad_settings_fail_before_any_work(tmp_path, target_dir, section, message):
  config = _config(tmp_path / 'bad', section.pop('target_dir', target_dir), **section)
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    feature_training.FeatureHeadTrainer(config)
  assert not os.path.exists(tmp_path / 'bad')


def test_the_t5_trainer_points_a_head_config_to_its_command(tmp_path, target_dir):
  with pytest.raises(SystemExit, match='specdec.training.feature_training'):
    train.main(['--gin_file=train/feature_head.gin', f"--gin.MODEL_DIR='{tmp_path}'",
                f"--gin.train_config.FeatureHeadTrainConfig.target_dir='{target_dir}'"])


def test_packed_rows_give_the_unpacked_losses():
  """Two examples packed in one row: the same metrics as two rows (segments kept apart)."""
  cfg = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                         num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0)
  target = network.Transformer(cfg)
  tp = network.init_params(cfg, jax.random.PRNGKey(0))
  head_cfg = feature_drafter.FeatureHeadConfig(feature_dim=16, vocab_size=64, width=8, num_heads=2,
                                               head_dim=4, mlp_dim=16)
  head = feature_drafter.FeatureHead(head_cfg)
  hp = feature_drafter.init_params(head_cfg, jax.random.PRNGKey(1))
  a_enc, a_dec = np.array([5, 6, 7]), np.array([9, 10, 11, 1])
  b_enc, b_dec = np.array([8, 9]), np.array([12, 13, 1])

  def row(enc, dec, length_in=6, length_out=8):
    e = np.zeros(length_in, np.int32)
    e[:len(enc)] = enc
    t = np.zeros(length_out, np.int32)
    t[:len(dec)] = dec
    return e, t

  ea, ta = row(a_enc, a_dec)
  eb, tb = row(b_enc, b_dec)
  unpacked = feature_training.teacher_forced_batch(np.stack([ea, eb]), np.stack([ta, tb]))
  enc = np.zeros((1, 6), np.int32)
  enc[0, :5] = np.concatenate([a_enc, b_enc])
  dec = np.zeros((1, 8), np.int32)
  dec[0, :7] = np.concatenate([a_dec, b_dec])
  inputs = np.zeros((1, 8), np.int32)
  inputs[0, 1:4], inputs[0, 5:7] = a_dec[:3], b_dec[:2]
  packed = {'encoder_input_tokens': enc, 'decoder_input_tokens': inputs,
            'decoder_target_tokens': dec, 'decoder_loss_weights': (dec > 0).astype(np.float32),
            'encoder_segment_ids': np.array([[1, 1, 1, 2, 2, 0]]),
            'decoder_segment_ids': np.array([[1, 1, 1, 1, 2, 2, 2, 0]])}
  # The same arithmetic over other padding: float32 sums in another order (rtol ~ 100 ulps).
  for steps in (1, 3):
    want = feature_losses.losses(head, hp, target, tp, unpacked, unroll_steps=steps)
    got = feature_losses.losses(head, hp, target, tp, packed, unroll_steps=steps)
    for k in want[1]:
      np.testing.assert_allclose(float(got[1][k]), float(want[1][k]), rtol=1e-5, err_msg=k)
