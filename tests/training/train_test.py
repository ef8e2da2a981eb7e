"""Tests for specdec/training/train.py: short CPU runs of `train.train` (a Trainer) on the fixture corpus.

The runs use the 'tiny' preset (vocab 8192 for the shipped 8100-id
vocabulary), fp32, no dropout, feature lengths 32/16 and batches of 4, and a
faster learning-rate schedule (warm-up of 1 step) so that the loss visibly
drops within a few steps. Each `train.train` call compiles its own step
functions, so the runs are few and shared through module-scoped fixtures:

* `first_run`: 16 steps from scratch, checkpoints every 4, export, with a
  2-example decode evaluation of both tasks.
* `resumed_run`: a copy of that model dir trained on to step 20.
* a run stopped by `max_minutes`, and a distillation run from the export.
"""

import contextlib
import dataclasses
import functools
import io
import json
import math
import os
import shutil
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from specdec import checkpoints
from specdec import network
from specdec import tasks
from specdec.training import train
from specdec.training import train_config

TESTDATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'testdata', 'tasks')
FIXTURE_CORPUS = os.path.join(TESTDATA, 'corpus')

CFG = network.t5_1_1_config('tiny', vocab_size=8192, dropout_rate=0.0)
LENGTHS = {'inputs': 32, 'targets': 16}
FIRST_STEPS = 16
RESUMED_STEPS = 20
CHECKPOINT_EVERY = 4

# The module's own schedule (the runs below patch a faster one in).
SCHEDULE = train.learning_rate_schedule
FAST_SCHEDULE = functools.partial(SCHEDULE, peak=0.01, warmup_steps=1)

RUN_KWARGS = dict(mixture_or_task_name='specdec_local_mix',
                  feature_lengths=LENGTHS, seed=0,
                  checkpoint_every=CHECKPOINT_EVERY, log_every=1,
                  eval_every=1000, eval_batches=1, eval_decode_examples=0)


# -----------------------------------------------------------------------------
# Helpers and shared runs.
# -----------------------------------------------------------------------------


@pytest.fixture(scope='module', autouse=True)
def local_tasks():
  """Registers the local tasks on the fixture corpus; restores the defaults."""
  tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS)
  yield
  tasks.register_local_tasks()


def _batch_size() -> int:
  """4 examples a step, or the fewest that divide over the devices' data axis (e.g. 8 under an 8-device XLA_FLAGS)."""
  return math.lcm(4, jax.device_count())


def _run(model_dir, **kwargs):
  """train.train(...) with RUN_KWARGS and FAST_SCHEDULE; returns (record, printed output)."""
  out = io.StringIO()
  with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
    mp.setattr(train, 'learning_rate_schedule', FAST_SCHEDULE)
    record = train.train(str(model_dir), CFG, **dict(RUN_KWARGS, batch_size=_batch_size(), **kwargs))
  return record, out.getvalue()


def _log(model_dir, kind=None):
  with open(os.path.join(model_dir, 'train_log.jsonl')) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if kind is None or r['kind'] == kind]


def _runs(model_dir):
  """(from_step, to_step) of each completed run, from runs.jsonl."""
  with open(os.path.join(model_dir, 'runs.jsonl')) as f:
    return [(r['from_step'], r['to_step']) for r in map(json.loads, f)]


def _abstract_state():
  optimizer = train.make_optimizer()

  def init():
    params = network.init_params(CFG, jax.random.PRNGKey(0))
    return {'step': jnp.zeros((), jnp.int32), 'params': params,
            'opt_state': optimizer.init(params)}

  return jax.eval_shape(init)


def _manager(model_dir):
  return checkpoints.training_checkpoint_manager(
      os.path.join(model_dir, 'checkpoints'))


def _restore(model_dir, step):
  manager = _manager(model_dir)
  try:
    return manager.restore(step, args=ocp.args.StandardRestore(_abstract_state()))
  finally:
    manager.close()


def _all_steps(model_dir):
  manager = _manager(model_dir)
  try:
    return sorted(manager.all_steps())
  finally:
    manager.close()


def _optimizer_counts(opt_state):
  counts = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
    last = path[-1]
    if getattr(last, 'name', None) == 'count' or getattr(last, 'key', None) == 'count':
      counts.append(int(leaf))
  return counts


def _assert_trees_equal(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0],
                          jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y),
                                  err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope='module')
def first_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('first_run')
  model_dir, export_dir = root / 'model', root / 'export'
  record, printed = _run(
      model_dir, num_steps=FIRST_STEPS, export_dir=str(export_dir),
      eval_decode_tasks=(tasks.ENDE_LOCAL_TASK, tasks.SUMMARIZE_LOCAL_TASK),
      eval_decode_examples=2)
  # Everything the tests look at, read now (later runs work on copies).
  return dict(root=root, model_dir=str(model_dir), export_dir=str(export_dir),
              record=record, printed=printed, log=_log(model_dir),
              steps=_all_steps(model_dir), runs=_runs(model_dir),
              final_state=_restore(model_dir, FIRST_STEPS))


@pytest.fixture(scope='module')
def resumed_run(first_run):
  """Copies the first run's model dir and trains it on to RESUMED_STEPS."""
  model_dir = os.path.join(first_run['root'], 'resumed')
  shutil.copytree(first_run['model_dir'], model_dir)
  placed = []
  real_device_put = jax.device_put

  def spy(x, *args, **kwargs):
    if isinstance(x, dict) and 'opt_state' in x:
      placed.append(jax.tree_util.tree_map(np.array, x))
    return real_device_put(x, *args, **kwargs)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(jax, 'device_put', spy)
    record, printed = _run(model_dir, num_steps=RESUMED_STEPS)
  return dict(model_dir=model_dir, record=record, printed=printed,
              placed=placed, log=_log(model_dir), runs=_runs(model_dir))


# -----------------------------------------------------------------------------
# Learning-rate schedule and optimizer.
# -----------------------------------------------------------------------------


class TestSchedule:

  def test_linear_warmup(self):
    peak, warmup = 0.01, 500
    for step in (0, 1, 99, 249, 498):
      assert float(SCHEDULE(step)) == pytest.approx(
          peak * (step + 1) / warmup, rel=1e-5)
    assert float(SCHEDULE(0)) == pytest.approx(peak / warmup, rel=1e-5)

  def test_peak_at_end_of_warmup(self):
    assert float(SCHEDULE(499)) == pytest.approx(0.01, rel=1e-6)
    assert float(SCHEDULE(9, peak=0.5, warmup_steps=10)) == pytest.approx(0.5)

  def test_rsqrt_decay(self):
    peak, warmup = 0.01, 500
    for step in (500, 999, 1999, 4499, 49999):
      assert float(SCHEDULE(step)) == pytest.approx(
          peak * math.sqrt(warmup / (step + 1)), rel=1e-5)
    # Quadrupling the step halves the rate.
    assert float(SCHEDULE(1999)) == pytest.approx(0.005, rel=1e-5)
    assert float(SCHEDULE(7999)) == pytest.approx(0.0025, rel=1e-5)

  def test_shape_of_the_curve(self):
    values = np.asarray(jax.vmap(SCHEDULE)(jnp.arange(3000)))
    assert values.argmax() == 499
    assert np.all(np.diff(values[:500]) > 0)
    assert np.all(np.diff(values[500:]) < 0)
    assert np.all(values > 0)

  def test_custom_peak_and_warmup(self):
    assert float(SCHEDULE(0, peak=1.0, warmup_steps=1)) == pytest.approx(1.0)
    assert float(SCHEDULE(3, peak=1.0, warmup_steps=1)) == pytest.approx(0.5)
    assert float(SCHEDULE(4, peak=2.0, warmup_steps=10)) == pytest.approx(1.0)

  def test_jittable(self):
    assert float(jax.jit(SCHEDULE)(jnp.int32(499))) == pytest.approx(0.01)


class TestMakeOptimizer:

  def test_unknown_name_raises(self):
    with pytest.raises(ValueError, match="'nope'"):
      train.make_optimizer('nope')

  @pytest.mark.parametrize('name', ['adafactor', 'adamw'])
  @pytest.mark.parametrize('clip_norm', [1.0, None])
  def test_updates(self, name, clip_norm):
    opt = train.make_optimizer(name, weight_decay=0.01, clip_norm=clip_norm)
    params = {'w': jnp.ones((4, 3)), 'b': jnp.zeros((3,))}
    grads = {'w': jnp.full((4, 3), 0.5), 'b': jnp.ones((3,))}
    state = opt.init(params)
    updates, state = opt.update(grads, state, params)
    for u, g in zip(jax.tree_util.tree_leaves(updates),
                    jax.tree_util.tree_leaves(grads)):
      assert np.all(np.isfinite(np.asarray(u)))
      # A descent direction.
      assert float(jnp.sum(u * g)) < 0

  def test_uses_the_schedule(self, monkeypatch):
    seen = []

    def schedule(step):
      seen.append(step)
      return 0.0

    monkeypatch.setattr(train, 'learning_rate_schedule', schedule)
    opt = train.make_optimizer('adamw')
    params = {'w': jnp.ones((2, 2))}
    updates, _ = opt.update({'w': jnp.ones((2, 2))}, opt.init(params), params)
    assert seen
    np.testing.assert_array_equal(np.asarray(updates['w']), 0.0)

  def test_clipping(self):
    """clip_norm bounds the gradient: huge and moderate gradients match (adamw step 1)."""
    opt = train.make_optimizer('adamw', clip_norm=1.0)
    params = {'w': jnp.zeros((3,))}
    state = opt.init(params)
    big, _ = opt.update({'w': jnp.array([300.0, 400.0, 0.0])}, state, params)
    small, _ = opt.update({'w': jnp.array([0.6, 0.8, 0.0])}, state, params)
    np.testing.assert_allclose(np.asarray(big['w']), np.asarray(small['w']),
                               rtol=1e-5)
    assert isinstance(opt, optax.GradientTransformation)


# -----------------------------------------------------------------------------
# loss_fn and distillation (direct calls, small vocabulary).
# -----------------------------------------------------------------------------

SMALL = network.t5_1_1_config('tiny', vocab_size=64, dropout_rate=0.0)
SMALL_MODULE = network.Transformer(SMALL)


@pytest.fixture(scope='module')
def small_params():
  return (network.init_params(SMALL, jax.random.PRNGKey(1)),
          network.init_params(SMALL, jax.random.PRNGKey(2)))


@pytest.fixture(scope='module')
def small_batch():
  rng = np.random.RandomState(0)
  b, s, t = 3, 7, 6
  enc = rng.randint(2, 64, (b, s)).astype(np.int32)
  enc[1, 5:] = 0
  targets = rng.randint(2, 64, (b, t)).astype(np.int32)
  targets[0, 4:] = 0
  targets[2, 2:] = 0
  dec_in = np.concatenate([np.zeros((b, 1), np.int32), targets[:, :-1]], 1)
  return {'encoder_input_tokens': jnp.asarray(enc),
          'decoder_input_tokens': jnp.asarray(dec_in),
          'decoder_target_tokens': jnp.asarray(targets),
          'decoder_loss_weights': jnp.asarray((targets > 0).astype(np.int32))}


@functools.partial(jax.jit, static_argnames=('distill_weight', 'with_teacher',
                                             'with_grad'))
def _small_loss(params, teacher_params, batch, z_loss=0.0, distill_weight=0.0,
                with_teacher=False, with_grad=False):
  """(loss, metrics), grads (None unless with_grad) of train.loss_fn."""
  teacher = (SMALL_MODULE, teacher_params) if with_teacher else None
  fn = functools.partial(train.loss_fn, batch=batch,
                         dropout_rng=jax.random.PRNGKey(0), module=SMALL_MODULE,
                         z_loss=z_loss, teacher=teacher,
                         distill_weight=distill_weight)
  if with_grad:
    return jax.value_and_grad(fn, has_aux=True)(params)
  return fn(params), None


@jax.jit
def _small_logits(params, batch):
  return SMALL_MODULE.apply(
      {'params': params}, batch['encoder_input_tokens'],
      batch['decoder_input_tokens'], batch['decoder_target_tokens'],
      enable_dropout=False)


def _reference_logp(params, batch):
  logits = np.asarray(_small_logits(params, batch), np.float64)
  logits -= logits.max(-1, keepdims=True)
  return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _norm(tree):
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                           for x in jax.tree_util.tree_leaves(tree))))


class TestLossFn:

  def test_cross_entropy(self, small_params, small_batch):
    params, _ = small_params
    (loss, metrics), _ = _small_loss(params, params, small_batch)
    logp = _reference_logp(params, small_batch)
    targets = np.asarray(small_batch['decoder_target_tokens'])
    weights = np.asarray(small_batch['decoder_loss_weights'], np.float64)
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    want = np.sum(nll * weights) / weights.sum()
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert float(metrics['ce']) == pytest.approx(want, rel=1e-5)
    assert 'fkl' not in metrics
    # eval_loss gives the same (sum, count).
    total, count = jax.jit(functools.partial(train.eval_loss, SMALL_MODULE))(
        params, small_batch)
    assert float(count) == weights.sum()
    assert float(total) / float(count) == pytest.approx(want, rel=1e-5)

  def test_z_loss(self, small_params, small_batch):
    params, _ = small_params
    (plain, _), _ = _small_loss(params, params, small_batch)
    (with_z, _), _ = _small_loss(params, params, small_batch, z_loss=0.1)
    logits = np.asarray(_small_logits(params, small_batch), np.float64)
    log_z = np.log(np.exp(logits).sum(-1))
    weights = np.asarray(small_batch['decoder_loss_weights'], np.float64)
    penalty = 0.1 * np.sum(log_z ** 2 * weights) / weights.sum()
    assert float(with_z) - float(plain) == pytest.approx(penalty, rel=1e-4)

  def test_padding_tokens_do_not_count(self, small_params, small_batch):
    params, _ = small_params
    (loss, _), _ = _small_loss(params, params, small_batch)
    # Change the decoder inputs after the last real target of row 0 (causal
    # attention: the earlier positions see nothing of them).
    batch = dict(small_batch)
    dec = np.array(batch['decoder_input_tokens'])
    dec[0, 5:] = 7
    batch['decoder_input_tokens'] = jnp.asarray(dec)
    (loss2, _), _ = _small_loss(params, params, batch)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6)

  def test_teacher_equal_to_student_gives_zero_kl(self, small_params, small_batch):
    params, _ = small_params
    (loss, metrics), grads = _small_loss(params, params, small_batch,
                                         distill_weight=1.0, with_teacher=True,
                                         with_grad=True)
    assert float(metrics['fkl']) == pytest.approx(0.0, abs=1e-6)
    assert float(loss) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics['ce']) > 1.0
    # KL(p || q) is minimal at q = p: no gradient.
    assert _norm(grads) < 1e-4

  def test_mixed_weight_with_equal_teacher(self, small_params, small_batch):
    params, _ = small_params
    (loss, metrics), _ = _small_loss(params, params, small_batch,
                                     distill_weight=0.5, with_teacher=True)
    assert float(loss) == pytest.approx(0.5 * float(metrics['ce']), rel=1e-5)

  def test_different_teacher(self, small_params, small_batch):
    student, teacher = small_params
    weight = 0.3
    (loss, metrics), grads = _small_loss(student, teacher, small_batch,
                                         distill_weight=weight,
                                         with_teacher=True, with_grad=True)
    p = _reference_logp(teacher, small_batch)
    q = _reference_logp(student, small_batch)
    kl = np.sum(np.exp(p) * (p - q), -1)
    weights = np.asarray(small_batch['decoder_loss_weights'], np.float64)
    want_kl = np.sum(kl * weights) / weights.sum()
    assert want_kl > 1e-3
    assert float(metrics['fkl']) == pytest.approx(want_kl, rel=1e-4)
    assert float(loss) == pytest.approx(
        (1 - weight) * float(metrics['ce']) + weight * want_kl, rel=1e-4)
    assert _norm(grads) > 1e-4

  def test_no_gradient_into_the_teacher(self, small_params, small_batch):
    student, teacher = small_params

    def teacher_loss(t):
      return train.loss_fn(student, small_batch, jax.random.PRNGKey(0),
                           SMALL_MODULE, z_loss=0.0,
                           teacher=(SMALL_MODULE, t), distill_weight=1.0)[0]

    grads = jax.jit(jax.grad(teacher_loss))(teacher)
    assert _norm(grads) == 0.0

  def test_zero_weight_ignores_the_teacher(self, small_params, small_batch):
    student, teacher = small_params
    (loss, metrics), _ = _small_loss(student, teacher, small_batch,
                                     distill_weight=0.0, with_teacher=True)
    (plain, _), _ = _small_loss(student, student, small_batch)
    assert float(loss) == pytest.approx(float(plain), rel=1e-6)
    assert 'fkl' not in metrics


# -----------------------------------------------------------------------------
# Argument checks (before any compute).
# -----------------------------------------------------------------------------


class TestArgumentChecks:

  def test_batch_size_must_divide_over_devices(self, tmp_path, monkeypatch):
    monkeypatch.setattr(jax, 'device_count', lambda *a, **k: 3)
    model_dir = tmp_path / 'model'
    with pytest.raises(ValueError, match=r'batch_size=4 .*3 devices'):
      train.train(str(model_dir), CFG, batch_size=4, num_steps=1)
    assert not model_dir.exists()

  def test_teacher_vocab_must_match(self, tmp_path):
    teacher_dir = tmp_path / 'teacher'
    checkpoints.save_compact(str(teacher_dir), SMALL,
                             network.init_params(SMALL, jax.random.PRNGKey(0)))
    with pytest.raises(ValueError, match='vocab_size 64 .* 8192'):
      train.train(str(tmp_path / 'model'), CFG, teacher_dir=str(teacher_dir),
                  num_steps=1)

  def test_missing_teacher_raises(self, tmp_path):
    with pytest.raises(FileNotFoundError, match='no_teacher'):
      train.train(str(tmp_path / 'model'), CFG,
                  teacher_dir=str(tmp_path / 'no_teacher'), num_steps=1)


# -----------------------------------------------------------------------------
# A run from scratch.
# -----------------------------------------------------------------------------


class TestFirstRun:

  def test_loss_goes_down(self, first_run):
    losses = [r['loss'] for r in first_run['log'] if r['kind'] == 'train']
    assert len(losses) == FIRST_STEPS
    assert all(np.isfinite(losses))
    # Starts near log(vocab) and drops by far more than the batch noise.
    assert abs(losses[0] - math.log(CFG.vocab_size)) < 1.0
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.5
    assert losses[-1] < losses[0]

  def test_train_log(self, first_run):
    train_records = [r for r in first_run['log'] if r['kind'] == 'train']
    assert [r['step'] for r in train_records] == list(range(1, FIRST_STEPS + 1))
    for r in train_records:
      assert {'loss', 'ce', 'grad_norm', 'tokens_per_s'} <= set(r)
      assert r['grad_norm'] > 0 and r['tokens_per_s'] > 0
      # Without a teacher the loss is the logged ce (which includes z-loss).
      assert r['loss'] == pytest.approx(r['ce'], rel=1e-6)
      assert 'fkl' not in r
    evals = [r for r in first_run['log'] if r['kind'] == 'eval']
    assert len(evals) == 1 and evals[0]['step'] == FIRST_STEPS

  def test_progress_lines(self, first_run):
    printed = first_run['printed']
    assert 'Resumed' not in printed
    for step in (1, FIRST_STEPS):
      assert f'step {step}/{FIRST_STEPS}  loss ' in printed
    assert 'tokens/s' in printed and 'ETA' in printed
    assert f"Exported params to {first_run['export_dir']}." in printed

  def test_final_record(self, first_run):
    record = first_run['record']
    assert record['step'] == FIRST_STEPS
    assert np.isfinite(record['eval_loss']) and record['eval_loss'] > 0
    assert 'eval ' + json.dumps(record) in first_run['printed']
    assert set(record) == {
        'step', 'eval_loss', f'{tasks.ENDE_LOCAL_TASK}/bleu',
        f'{tasks.SUMMARIZE_LOCAL_TASK}/rouge1',
        f'{tasks.SUMMARIZE_LOCAL_TASK}/rouge2',
        f'{tasks.SUMMARIZE_LOCAL_TASK}/rougeLsum'}
    for key, value in record.items():
      if '/' in key:
        assert 0.0 <= value <= 100.0
    evals = [r for r in first_run['log'] if r['kind'] == 'eval']
    assert {k: v for k, v in evals[0].items() if k != 'kind'} == record

  def test_checkpoints(self, first_run):
    # Every CHECKPOINT_EVERY steps, the latest two kept.
    assert first_run['steps'] == [FIRST_STEPS - CHECKPOINT_EVERY, FIRST_STEPS]
    state = first_run['final_state']
    assert int(state['step']) == FIRST_STEPS
    counts = _optimizer_counts(state['opt_state'])
    assert counts and set(counts) == {FIRST_STEPS}
    fresh = network.init_params(CFG, jax.random.PRNGKey(0))
    changed = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        jax.tree_util.tree_leaves(state['params']),
        jax.tree_util.tree_leaves(fresh))]
    assert all(changed)

  def test_init_from_exported_model(self, first_run, tmp_path):
    # A new model_dir starts from the exported params (fresh optimizer, step 0).
    _, printed = _run(tmp_path / 'continued', num_steps=1,
                      init_from_dir=first_run['export_dir'])
    assert 'Resumed' not in printed
    state = _manager(str(tmp_path / 'continued')).restore(
        1, args=ocp.args.StandardRestore(_abstract_state()))
    _, exported = checkpoints.load_compact(first_run['export_dir'])
    # One step of training from the exported params stays close to them,
    # much closer than a fresh initialisation is.
    fresh = network.init_params(CFG, jax.random.PRNGKey(0))
    for got, start, far in zip(jax.tree_util.tree_leaves(state['params']),
                               jax.tree_util.tree_leaves(exported),
                               jax.tree_util.tree_leaves(fresh)):
      near = np.abs(np.asarray(got) - np.asarray(start)).max()
      assert near < 0.5 * np.abs(np.asarray(far) - np.asarray(start)).max() + 1e-6

  def test_a_continuation_keeps_what_made_its_start_and_can_replace_it(self, first_run, tmp_path):
    """The export of a run from init_from_dir records that model's training record, so a continuation that is put
    in its place (one path, one model) still says every run behind it."""
    start = tmp_path / 'start'
    shutil.copytree(first_run['export_dir'], start)
    _run(tmp_path / 'continued', num_steps=1, init_from_dir=str(start), export_dir=str(tmp_path / 'next'))
    record = checkpoints.training_record(str(tmp_path / 'next'))
    assert record['init_train'] == checkpoints.training_record(str(start))
    checkpoints.replace_with_continuation(str(tmp_path / 'next'), str(start))
    assert not (tmp_path / 'next').exists()
    runs = checkpoints.training_runs(checkpoints.training_record(str(start)))
    assert [(r['from_step'], r['to_step']) for r in runs] == [(0, FIRST_STEPS), (FIRST_STEPS, FIRST_STEPS + 1)]
    assert runs[-1]['init_from_dir'] == str(start)

  def test_init_with_another_dropout_rate(self, first_run, tmp_path):
    """Dropout is how a run trains, not part of the params: a continued run may set its own."""
    record = train.train(str(tmp_path / 'dropout'), dataclasses.replace(CFG, dropout_rate=0.1), **dict(
        RUN_KWARGS, num_steps=1, init_from_dir=first_run['export_dir']))
    assert record['step'] == 1

  def test_init_from_mismatched_config(self, first_run, tmp_path):
    other = network.t5_1_1_config('tiny', vocab_size=CFG.vocab_size,
                                  dropout_rate=0.0, emb_dim=16)
    with pytest.raises(ValueError, match='different config'):
      train.train(str(tmp_path / 'x'), other, **dict(
          RUN_KWARGS, num_steps=1, init_from_dir=first_run['export_dir']))

  def test_export(self, first_run):
    config, params = checkpoints.load_compact(first_run['export_dir'])
    assert config == CFG
    want = first_run['final_state']['params']
    assert (jax.tree_util.tree_structure(params)
            == jax.tree_util.tree_structure(want))
    for got, exp in zip(jax.tree_util.tree_leaves(params),
                        jax.tree_util.tree_leaves(want)):
      np.testing.assert_array_equal(
          np.asarray(got),
          np.asarray(jnp.asarray(exp, jnp.bfloat16).astype(jnp.float32)))
    with open(os.path.join(first_run['export_dir'], checkpoints.CONFIG_FILE)) as f:
      meta = json.load(f)
    assert meta['storage_dtype'] == 'bfloat16'
    assert meta['train']['step'] == FIRST_STEPS
    assert meta['train']['mixture_or_task_name'] == 'specdec_local_mix'
    assert meta['train']['teacher_dir'] is None
    assert meta['train']['final_eval'] == first_run['record']
    assert [(r['from_step'], r['to_step']) for r in meta['train']['runs']] == [
        (0, FIRST_STEPS)]

  def test_runs_record(self, first_run):
    assert first_run['runs'] == [(0, FIRST_STEPS)]


# -----------------------------------------------------------------------------
# Resuming.
# -----------------------------------------------------------------------------


class TestResume:

  def test_prints_resumed(self, resumed_run):
    assert (f"Resumed from {resumed_run['model_dir']} at step {FIRST_STEPS}."
            in resumed_run['printed'])
    assert f'step {FIRST_STEPS + 1}/{RESUMED_STEPS}  loss' in resumed_run['printed']
    assert f'step 1/{RESUMED_STEPS} ' not in resumed_run['printed']

  def test_starts_from_the_checkpointed_state(self, first_run, resumed_run):
    assert len(resumed_run['placed']) == 1
    start = resumed_run['placed'][0]
    assert int(start['step']) == FIRST_STEPS
    _assert_trees_equal(start['params'], first_run['final_state']['params'])
    _assert_trees_equal(start['opt_state'], first_run['final_state']['opt_state'])

  def test_log_continues(self, first_run, resumed_run):
    steps = [r['step'] for r in resumed_run['log'] if r['kind'] == 'train']
    assert steps == list(range(1, RESUMED_STEPS + 1))
    losses = {r['step']: r['loss'] for r in resumed_run['log']
              if r['kind'] == 'train'}
    # Continues from the trained params, not from a fresh init.
    assert losses[FIRST_STEPS + 1] < losses[1] - 0.5
    evals = [r['step'] for r in resumed_run['log'] if r['kind'] == 'eval']
    assert evals == [FIRST_STEPS, RESUMED_STEPS]

  def test_checkpoints_and_optimizer_continue(self, first_run, resumed_run):
    assert _all_steps(resumed_run['model_dir']) == [FIRST_STEPS, RESUMED_STEPS]
    state = _restore(resumed_run['model_dir'], RESUMED_STEPS)
    assert int(state['step']) == RESUMED_STEPS
    assert set(_optimizer_counts(state['opt_state'])) == {RESUMED_STEPS}
    assert resumed_run['record']['step'] == RESUMED_STEPS
    assert resumed_run['runs'] == [(0, FIRST_STEPS), (FIRST_STEPS, RESUMED_STEPS)]
    changed = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        jax.tree_util.tree_leaves(state['params']),
        jax.tree_util.tree_leaves(first_run['final_state']['params']))]
    assert any(changed)

  def test_nothing_left_to_do(self, first_run, tmp_path):
    """num_steps <= the checkpointed step: no training, same eval loss."""
    model_dir = str(tmp_path / 'done')
    shutil.copytree(first_run['model_dir'], model_dir)
    record, printed = _run(model_dir, num_steps=FIRST_STEPS)
    assert f'Resumed from {model_dir} at step {FIRST_STEPS}.' in printed
    assert 'loss ' not in printed.replace('eval_loss', '')
    assert record['step'] == FIRST_STEPS
    assert record['eval_loss'] == pytest.approx(
        first_run['record']['eval_loss'], rel=1e-6)
    assert _all_steps(model_dir) == first_run['steps']
    assert _runs(model_dir) == [(0, FIRST_STEPS), (FIRST_STEPS, FIRST_STEPS)]


# -----------------------------------------------------------------------------
# A killed run, resumed: the log has no replayed steps, runs.jsonl keeps it.
# -----------------------------------------------------------------------------

KILLED_STEPS = 24  # the killed run's goal; it dies after KILLED_AFTER batches
KILLED_AFTER = 6   # steps 17..22: checkpoint 20 written, 21 and 22 only logged


class _Killed(Exception):
  pass


def _dies_after(n):
  """A train.train_batches whose training batches end in _Killed after `n`."""
  real = train.train_batches

  def batches(*args, **kwargs):
    it = real(*args, **kwargs)
    if kwargs.get('split', 'train') != 'train':
      return it

    def dying():
      for i, batch in enumerate(it):
        if i == n:
          raise _Killed()
        yield batch

    return dying()

  return batches


def _wait_for_step(model_dir, step, timeout_s=60):
  """The killed run's async checkpoint save finishes in this process's background."""
  deadline = time.time() + timeout_s
  while step not in _all_steps(model_dir) and time.time() < deadline:
    time.sleep(0.2)


@pytest.fixture(scope='module')
def killed_run(first_run):
  """first_run's model dir trained on towards KILLED_STEPS, killed, then resumed."""
  model_dir = os.path.join(first_run['root'], 'killed')
  shutil.copytree(first_run['model_dir'], model_dir)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(train, 'train_batches', _dies_after(KILLED_AFTER))
    with pytest.raises(_Killed):
      _run(model_dir, num_steps=KILLED_STEPS)
  _wait_for_step(model_dir, 20)
  killed = dict(log=_log(model_dir), runs=_records(model_dir), steps=_all_steps(model_dir))
  export_dir = os.path.join(first_run['root'], 'killed_export')
  record, printed = _run(model_dir, num_steps=KILLED_STEPS, export_dir=export_dir)
  with open(os.path.join(export_dir, checkpoints.CONFIG_FILE)) as f:
    exported = json.load(f)['train']
  return dict(model_dir=model_dir, killed=killed, printed=printed, record=record,
              log=_log(model_dir), runs=_records(model_dir), exported=exported)


def _records(model_dir):
  with open(os.path.join(model_dir, 'runs.jsonl')) as f:
    return [json.loads(line) for line in f]


class TestKilledAndResumed:

  def test_killed_run_left_its_record(self, killed_run):
    killed = killed_run['killed']
    assert killed['steps'] == [16, 20]
    assert [r['step'] for r in killed['log'] if r['kind'] == 'train'] == list(range(1, 23))
    first, running = killed['runs']
    assert (first['from_step'], first['to_step'], first['status']) == (0, 16, 'finished')
    # Written at start, rewritten at each checkpoint: the last one is step 20.
    assert (running['from_step'], running['to_step'], running['status']) == (16, 20, 'running')
    assert running['minutes'] > 0 and running['command'].startswith('python -m specdec.training.train')

  def test_resumes_at_the_checkpoint(self, killed_run):
    printed = killed_run['printed']
    assert f"Resumed from {killed_run['model_dir']} at step 20." in printed
    assert 'Dropped 2 records past step 20' in printed
    assert f'step 21/{KILLED_STEPS}  loss' in printed
    assert killed_run['record']['step'] == KILLED_STEPS

  def test_log_has_each_step_once(self, killed_run):
    steps = [r['step'] for r in killed_run['log'] if r['kind'] == 'train']
    assert steps == list(range(1, KILLED_STEPS + 1))
    assert [r['step'] for r in killed_run['log'] if r['kind'] == 'eval'] == [
        FIRST_STEPS, KILLED_STEPS]

  def test_runs_record_every_run(self, killed_run):
    runs = killed_run['runs']
    assert [(r['from_step'], r['to_step'], r['status']) for r in runs] == [
        (0, FIRST_STEPS, 'finished'), (FIRST_STEPS, 20, 'interrupted'),
        (20, KILLED_STEPS, 'finished')]
    assert len({r['run_id'] for r in runs}) == 3
    exported = killed_run['exported']
    assert exported['runs'] == runs
    assert exported['minutes'] == pytest.approx(sum(r['minutes'] for r in runs))


def test_drop_log_after(tmp_path):
  path = str(tmp_path / 'train_log.jsonl')
  assert train.drop_log_after(path, 3) == 0 and not os.path.exists(path)
  records = [{'step': s, 'kind': 'train'} for s in range(1, 7)] + [{'step': 4, 'kind': 'eval'}]
  with open(path, 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  assert train.drop_log_after(path, 4) == 2
  assert _log(str(tmp_path)) == [r for r in records if r['step'] <= 4]
  assert train.drop_log_after(path, 4) == 0


def test_put_run_record(tmp_path):
  path = str(tmp_path / 'runs.jsonl')
  old = {'started': 'x', 'minutes': 1.0, 'from_step': 0, 'to_step': 5, 'command': 'c'}
  with open(path, 'w') as f:
    f.write(json.dumps(old) + '\n')  # a record written before run ids existed
  train.put_run_record(path, {'run_id': 'a', 'to_step': 7, 'status': 'running'})
  train.put_run_record(path, {'run_id': 'a', 'to_step': 9, 'status': 'running'})
  assert _records(str(tmp_path)) == [old, {'run_id': 'a', 'to_step': 9, 'status': 'running'}]
  # A new run marks a record left 'running' (its run was killed) as interrupted.
  train.put_run_record(path, {'run_id': 'b', 'to_step': 9, 'status': 'running'})
  assert [(r.get('run_id'), r.get('status')) for r in _records(str(tmp_path))] == [
      (None, None), ('a', 'interrupted'), ('b', 'running')]


# -----------------------------------------------------------------------------
# A damaged latest checkpoint: reported, moved aside, the previous one used.
# -----------------------------------------------------------------------------


def _damage_step(model_dir, step):
  """Truncates every file of checkpoint `step` to half (a disk or copy gone wrong)."""
  for root, _, files in os.walk(os.path.join(model_dir, 'checkpoints', str(step))):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        data = f.read()
      with open(path, 'wb') as f:
        f.write(data[:len(data) // 2])


class TestDamagedCheckpoint:

  def test_falls_back_to_the_previous_checkpoint(self, first_run, tmp_path):
    model_dir = str(tmp_path / 'damaged')
    shutil.copytree(first_run['model_dir'], model_dir)
    _damage_step(model_dir, FIRST_STEPS)
    record, printed = _run(model_dir, num_steps=FIRST_STEPS)
    previous = FIRST_STEPS - CHECKPOINT_EVERY
    checkpoint_dir = os.path.join(model_dir, 'checkpoints')
    assert f'Checkpoint step {FIRST_STEPS} in {checkpoint_dir} is damaged or unreadable (' in printed
    moved = os.listdir(os.path.join(model_dir, 'damaged_checkpoints'))
    assert len(moved) == 1 and moved[0].startswith(f'{FIRST_STEPS}-')
    assert f'falling back to step {previous}.' in printed
    assert f'Resumed from {model_dir} at step {previous}.' in printed
    assert printed.count('Traceback') == 0
    # Trained again from `previous`: a fresh, restorable checkpoint FIRST_STEPS.
    assert record['step'] == FIRST_STEPS
    assert _all_steps(model_dir) == [previous, FIRST_STEPS]
    assert int(_restore(model_dir, FIRST_STEPS)['step']) == FIRST_STEPS
    steps = [r['step'] for r in _log(model_dir, 'train')]
    assert steps == list(range(1, FIRST_STEPS + 1))
    assert _runs(model_dir) == [(0, FIRST_STEPS), (previous, FIRST_STEPS)]

  def test_none_restorable_is_a_clear_error(self, first_run, tmp_path):
    model_dir = str(tmp_path / 'all_damaged')
    shutil.copytree(first_run['model_dir'], model_dir)
    for step in first_run['steps']:
      _damage_step(model_dir, step)
    checkpoint_dir = os.path.join(model_dir, 'checkpoints')
    with pytest.raises(ValueError, match=f'^{checkpoint_dir}: no checkpoint can be restored: '
                       f'step {FIRST_STEPS}: .*; step {FIRST_STEPS - CHECKPOINT_EVERY}: '):
      _run(model_dir, num_steps=FIRST_STEPS + 4)
    # Nothing moved: the user decides.
    assert sorted(os.listdir(checkpoint_dir)) == sorted(str(s) for s in first_run['steps'])
    assert not os.path.exists(os.path.join(model_dir, 'damaged_checkpoints'))


# -----------------------------------------------------------------------------
# max_minutes.
# -----------------------------------------------------------------------------


class TestMaxMinutes:

  def test_stops_early_and_saves(self, tmp_path):
    model_dir, export_dir = tmp_path / 'model', tmp_path / 'export'
    # A 6 ms budget: the first step (with its compile) already exceeds it.
    record, printed = _run(model_dir, num_steps=5, checkpoint_every=5,
                           max_minutes=1e-4, export_dir=str(export_dir))
    assert 'Stopping at step 1: max_minutes=0.0001 reached' in printed
    assert record['step'] == 1
    assert _all_steps(str(model_dir)) == [1]
    assert int(_restore(str(model_dir), 1)['step']) == 1
    assert [r['step'] for r in _log(str(model_dir), 'train')] == [1]
    assert _runs(str(model_dir)) == [(0, 1)]
    with open(os.path.join(export_dir, checkpoints.CONFIG_FILE)) as f:
      assert json.load(f)['train']['step'] == 1

  def test_deadline_on_a_checkpoint_step(self, tmp_path):
    model_dir = tmp_path / 'model'
    record, printed = _run(model_dir, num_steps=3, checkpoint_every=1,
                           max_minutes=1e-4)
    assert 'Stopping at step 1' in printed
    assert record['step'] == 1
    assert _all_steps(str(model_dir)) == [1]


# -----------------------------------------------------------------------------
# Distillation run.
# -----------------------------------------------------------------------------


class TestDistillationRun:

  def test_runs_with_a_teacher(self, first_run, tmp_path):
    model_dir, export_dir = tmp_path / 'student', tmp_path / 'export'
    record, _ = _run(model_dir, num_steps=2, teacher_dir=first_run['export_dir'],
                     distill_weight=0.5, export_dir=str(export_dir))
    assert record['step'] == 2 and np.isfinite(record['eval_loss'])
    logged = _log(str(model_dir), 'train')
    assert [r['step'] for r in logged] == [1, 2]
    for r in logged:
      # A fresh student against the trained teacher: KL > 0.
      assert r['fkl'] > 1e-3
      assert r['loss'] == pytest.approx(0.5 * r['ce'] + 0.5 * r['fkl'], rel=1e-5)
    with open(os.path.join(export_dir, checkpoints.CONFIG_FILE)) as f:
      assert json.load(f)['train']['teacher_dir'] == first_run['export_dir']


# -----------------------------------------------------------------------------
# The command line: gin bindings reach the TrainConfig and what the Trainer calls.
# -----------------------------------------------------------------------------


class _Stop(Exception):
  pass


class TestMainWithGin:
  """`train.main` as `python -m specdec.training.train` runs it, stopped before any compute.

  The Orbax manager is created right after the optimizer: replacing it with
  one that raises ends the run there, cheaply.
  """

  @pytest.fixture
  def stopped_main(self, tmp_path, monkeypatch):
    import gin  # pylint: disable=g-import-not-at-top
    seen = {'optimizers': []}

    def stop(directory, *args, **kwargs):
      seen['checkpoint_dir'] = directory
      raise _Stop()

    for name in ('adafactor', 'adamw'):
      real = getattr(optax, name)

      def spy(*args, _name=name, _real=real, **kwargs):
        # The learning rates at steps 0 and 299, while the gin config is live.
        schedule = kwargs['learning_rate']
        seen['optimizers'].append((_name, [float(schedule(0)),
                                           float(schedule(299))]))
        return _real(*args, **kwargs)

      monkeypatch.setattr(optax, name, spy)
    monkeypatch.setattr(checkpoints, 'training_checkpoint_manager', stop)
    # The module's own schedule, whatever other tests patched.
    monkeypatch.setattr(train, 'learning_rate_schedule', SCHEDULE)

    def run(*flags):
      gin.clear_config()
      try:
        with pytest.raises(_Stop):
          train.main(['--gin_file=train/cpu_target.gin',
                      f"--gin.MODEL_DIR='{tmp_path / 'model'}'", *flags])
      finally:
        gin.clear_config()
      return seen

    return run

  def test_bindings_reach_train(self, stopped_main, tmp_path):
    seen = stopped_main()
    assert seen['checkpoint_dir'] == os.path.join(str(tmp_path / 'model'),
                                                  'checkpoints')
    (name, (rate_0, _)), = seen['optimizers']
    assert name == 'adafactor'
    assert rate_0 > 0

  def test_unknown_flags_exit(self):
    with pytest.raises(SystemExit, match='--bogus'):
      train.main(['--bogus'])

  def test_schedule_bindings_apply(self, stopped_main):
    seen = stopped_main()
    (_, (rate_0, rate_299)), = seen['optimizers']
    # cpu_family.gin: peak = 0.01, warmup_steps = 300.
    assert rate_0 == pytest.approx(0.01 / 300, rel=1e-5)
    assert rate_299 == pytest.approx(0.01, rel=1e-5)

  def test_optimizer_name_binding_applies(self, stopped_main):
    seen = stopped_main("--gin.train.make_optimizer.name='adamw'")
    assert [name for name, _ in seen['optimizers']] == ['adamw']


class TestOldBindings:
  """Bindings of train.train.NAME, as command lines and gin files of old wrote them."""

  def test_on_the_command_line_they_are_refused_naming_the_binding_now(self, tmp_path):
    import gin  # pylint: disable=g-import-not-at-top
    gin.clear_config()
    try:
      with pytest.raises(SystemExit, match=r'train.train.num_partitions is now '
                                           r'train_config.PartitioningConfig.num_partitions'):
        train.main(['--gin_file=train/cpu_drafter_d3.gin', f"--gin.MODEL_DIR='{tmp_path}/m'",
                    '--gin.train.train.num_partitions=2'])
    finally:
      gin.clear_config()
    assert not os.path.exists(tmp_path / 'm')

  def test_in_a_gin_file_they_are_refused(self, tmp_path):
    import gin  # pylint: disable=g-import-not-at-top
    gin_file = tmp_path / 'old.gin'
    gin_file.write_text("include 'train/cpu_drafter_d3.gin'\nfrom __gin__ import dynamic_registration\n"
                        'from specdec.training import train\ntrain.train.batch_size = 8\n')
    gin.clear_config()
    try:
      with pytest.raises(SystemExit, match=r'a gin file binds train.train.batch_size; bind '
                                           r'train_config.DataConfig.batch_size instead'):
        train.main([f'--gin_file={gin_file}', f"--gin.MODEL_DIR='{tmp_path}/m'"])
    finally:
      gin.clear_config()
    assert not os.path.exists(tmp_path / 'm')


def test_trainer_checks_before_writing(tmp_path):
  config = train_config.TrainConfig(
      str(tmp_path / 'm'), CFG, partitioning=train_config.PartitioningConfig(num_partitions=0))
  with pytest.raises(ValueError, match='num_partitions must be a positive int'):
    train.Trainer(config)
  assert not os.path.exists(tmp_path / 'm')


# -----------------------------------------------------------------------------
# init_matching_only: a different shape starts from the parameters it shares.
# -----------------------------------------------------------------------------


def test_matching_params_takes_shared_paths_and_shapes(small_params):
  params, _ = small_params
  one_layer = dataclasses.replace(SMALL, num_decoder_layers=1)
  fresh = network.init_params(one_layer, jax.random.PRNGKey(9))
  got = train._matching_params(fresh, params, 'small')
  flat_got = dict(jax.tree_util.tree_leaves_with_path(got))
  flat_init = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(params)}
  flat_fresh = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(fresh)}
  for path, leaf in flat_got.items():
    key = jax.tree_util.keystr(path)
    same_shape = key in flat_init and flat_init[key].shape == leaf.shape
    np.testing.assert_array_equal(np.asarray(leaf),
                                  np.asarray(flat_init[key] if same_shape else flat_fresh[key]))
  # The encoder and the first decoder layer came from the two-layer model.
  np.testing.assert_array_equal(np.asarray(got['decoder']['layers_0']['mlp']['wi_0']['kernel']),
                                np.asarray(params['decoder']['layers_0']['mlp']['wi_0']['kernel']))


def test_matching_params_with_nothing_shared_is_an_error(small_params):
  params, _ = small_params
  wider = dataclasses.replace(SMALL, emb_dim=SMALL.emb_dim * 2, vocab_size=SMALL.vocab_size * 2,
                              num_encoder_layers=1, num_decoder_layers=1)
  fresh = network.init_params(wider, jax.random.PRNGKey(9))
  with pytest.raises(ValueError, match='shares no parameter'):
    train._matching_params(fresh, {'other': np.zeros(3)}, 'elsewhere')


def test_a_misspelt_binding_is_one_line_and_trains_nothing(tmp_path):
  with pytest.raises(SystemExit, match="specdec.training.train: binding 'GAMA = 3'"):
    train.main(['--gin_file=train/cpu_drafter_d2.gin', f"--gin.MODEL_DIR='{tmp_path}/m'", '--gin.GAMA=3'])
  assert not os.path.exists(tmp_path / 'm')


@pytest.mark.parametrize('equal_rates', [False, True])
def test_the_mixture_rates_follow_equal_rates(tmp_path, equal_rates):
  """equal_rates draws the local tasks equally often; otherwise in proportion to their train rows."""
  import seqio  # pylint: disable=g-import-not-at-top
  corpus = tmp_path / 'corpus'
  shutil.copytree(FIXTURE_CORPUS, corpus)
  train_file = corpus / tasks.TRANSLATION_CORPUS / 'train.jsonl'
  lines = train_file.read_text().splitlines(keepends=True)
  train_file.write_text(''.join(lines[:len(lines) // 2]))  # the tasks now differ in size
  config = train_config.from_flat(str(tmp_path / 'm'), CFG, corpus_dir=str(corpus),
                                  equal_rates=equal_rates, batch_size=_batch_size())
  try:
    train.Trainer(config)
    mixture = seqio.get_mixture_or_task(tasks.LOCAL_MIXTURE)
    rates = [mixture.get_rate(seqio.get_mixture_or_task(name)) for name in tasks.LOCAL_TASKS]
    rows = [tasks.rate_num_train_examples(seqio.get_mixture_or_task(name)) for name in tasks.LOCAL_TASKS]
    assert rows[0] != rows[1]
    assert rates == ([1.0, 1.0] if equal_rates else rows)
  finally:
    tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS)


def test_task_rates_set_each_tasks_rate_by_name(tmp_path):
  """task_rates draws the tasks at the given rates, whatever their train rows."""
  import seqio  # pylint: disable=g-import-not-at-top
  rates_by_name = {tasks.LOCAL_TASKS[0]: 3.0, tasks.LOCAL_TASKS[1]: 1.0}
  config = train_config.from_flat(str(tmp_path / 'm'), CFG, corpus_dir=FIXTURE_CORPUS,
                                  task_rates=rates_by_name, batch_size=_batch_size())
  try:
    train.Trainer(config)
    mixture = seqio.get_mixture_or_task(tasks.LOCAL_MIXTURE)
    assert [mixture.get_rate(seqio.get_mixture_or_task(name)) for name in tasks.LOCAL_TASKS] == [3.0, 1.0]
  finally:
    tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS)


@pytest.mark.parametrize('settings, message', [
    ({'equal_rates': True, 'task_rates': {tasks.LOCAL_TASKS[0]: 1.0, tasks.LOCAL_TASKS[1]: 1.0}},
     'equal_rates or task_rates, not both'),
    ({'task_rates': {tasks.LOCAL_TASKS[0]: 1.0}}, 'must name the local tasks'),
    ({'task_rates': {tasks.LOCAL_TASKS[0]: 1.0, tasks.LOCAL_TASKS[1]: 0.0}}, 'must be positive'),
])
def test_bad_task_rates_are_one_line_errors_before_any_work(tmp_path, settings, message):
  config = train_config.from_flat(str(tmp_path / 'm'), CFG, batch_size=_batch_size(), **settings)
  with pytest.raises(ValueError, match=message):
    train.Trainer(config)
  assert not os.path.exists(tmp_path / 'm')


GIN_TRAIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'gin', 'train')


@pytest.mark.parametrize('gin_file', sorted(f for f in os.listdir(GIN_TRAIN_DIR) if f.endswith('.gin')))
def test_every_training_gin_file_parses_into_a_config(gin_file):
  gin.clear_config()
  try:
    config = train.parse_config([f'--gin_file=train/{gin_file}', "--gin.MODEL_DIR='runs/m'"])
  finally:
    gin.clear_config()
  assert config.model_dir == 'runs/m' and config.num_steps > 0
  if gin_file == 'cpu_target_v3_self.gin':  # self-training draws its tasks at the real corpus's rates ...
    assert config.data.task_rates == {tasks.ENDE_LOCAL_TASK: 99021, tasks.SUMMARIZE_LOCAL_TASK: 40722}
  if gin_file.startswith('cpu_target_v3_self'):  # ... for as many steps, at the same settings, as its control
    assert (config.num_steps, config.network_config.dropout_rate, config.init.init_from_dir) == (
        800, 0.1, 'models/cpu_v3/target')
