"""Tests for specdec/training/train.py's model-parallel training and T5X initialisation.

Sharded runs use 8 CPU devices (XLA_FLAGS
--xla_force_host_platform_device_count=8) in one spawned helper process, as
tests/sharded_decoding_test.py explains (the flag must not reach the other tests
of this pytest process). Every `train.train` run there is 4 steps of a tiny
T5 1.1 network (1 + 1 layers, 8 heads so that every mesh divides them,
dropout 0.1, vocab 8192 for the shipped 8100-id vocabulary) on the fixture
corpus, batch 8, Adafactor with a constant learning rate and factored second
moments (min_dim_size_to_factor lowered to 16 so that this tiny network has
them). The reference is the same run on one device.

Tolerances: float32 sums are reduced in other orders on other meshes, so
losses agree to rtol 1e-5 and parameters to atol 2e-6 after 4 steps (the
differences observed are 3e-7 and 2.4e-7, a few ulps); initial params, and
values restored from a checkpoint written on another mesh, are compared
exactly.
"""

import contextlib
import dataclasses
import functools
import io
import json
import os
import shutil
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from tests import device_pool
from specdec import checkpoints
from specdec import memory
from specdec import network
from specdec import partitioning
from specdec import t5x_checkpoint
from specdec import tasks
from specdec.training import train
from specdec.training import train_config

NUM_DEVICES = 8
DEVICE_FLAG = f'--xla_force_host_platform_device_count={NUM_DEVICES}'
# Unoptimised CPU code generation compiles the 8 runs' programs faster; the
# one-device reference runs in the same process with the same flags.
CHILD_XLA_FLAGS = f'{DEVICE_FLAG} --xla_backend_optimization_level=0'
FIXTURE_CORPUS = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'testdata', 'tasks', 'corpus')

CFG = network.T5Config(vocab_size=8192, emb_dim=32, num_heads=8, head_dim=4,
                       num_encoder_layers=1, num_decoder_layers=1, mlp_dim=64,
                       relative_attention_num_buckets=8,
                       relative_attention_max_distance=16, dropout_rate=0.1)
LENGTHS = {'inputs': 32, 'targets': 16}
BATCH = 8
STEPS = 4
MESH_SHAPES = ((8, 1), (4, 2), (2, 4), (1, 8))
LEARNING_RATE = 0.01
LOSS_RTOL = 1e-5
PARAM_ATOL = 2e-6

RUN_KWARGS = dict(mixture_or_task_name='specdec_local_mix', feature_lengths=LENGTHS,
                  batch_size=BATCH, num_steps=STEPS, seed=0, checkpoint_every=STEPS,
                  log_every=1, eval_every=1000, eval_batches=1, eval_decode_examples=0)

WI = ('encoder', 'layers_0', 'mlp', 'wi_0', 'kernel')            # (embed 32, mlp 64)
QUERY = ('decoder', 'layers_0', 'self_attention', 'query', 'kernel')  # (embed, joined_kv 32)
EMBEDDING = ('token_embedder', 'embedding')                       # (vocab 8192, embed 32)
SCALE = ('encoder', 'encoder_norm', 'scale')                      # (embed,)


# -----------------------------------------------------------------------------
# Helpers shared by both processes.
# -----------------------------------------------------------------------------


@contextlib.contextmanager
def _patched_training(devices=None):
  """T5X's fine-tuning optimizer (constant rate, here 0.01) with small factoring; optionally fewer devices."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(train, 'make_optimizer', functools.partial(
        train.make_optimizer, schedule='constant', min_dim_size_to_factor=16))
    mp.setattr(train, 'constant_learning_rate',
               functools.partial(train.constant_learning_rate, value=LEARNING_RATE))
    if devices is not None:
      real = jax.devices()[:devices]
      mp.setattr(jax, 'devices', lambda *a, **k: list(real))
      mp.setattr(jax, 'device_count', lambda *a, **k: len(real))
    yield mp


def _flat(tree):
  return {jax.tree_util.keystr(p): np.asarray(x)
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _leaf(tree, keys, field=None):
  """The leaf at dict path `keys`; with `field`, the optimizer-state leaf under that attribute."""
  suffix = ''.join(f'[{k!r}]' for k in keys)
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, P))[0]
  found = [x for p, x in leaves
           if jax.tree_util.keystr(p).endswith(suffix) and
           (field is None or f'.{field}[' in jax.tree_util.keystr(p))]
  assert len(found) == 1, (keys, field, len(found))
  return found[0]


def _run(model_dir, devices=None, **kwargs):
  """train.train in this process; returns the run's log, final state (numpy) and placed layout."""
  placed = []
  real_put = jax.device_put

  def spy(x, *args, **kw):
    out = real_put(x, *args, **kw)
    if isinstance(x, dict) and 'opt_state' in x:
      placed.append(_layout(out))  # now: the step donates (deletes) these arrays
    return out

  out = io.StringIO()
  export_dir = os.path.join(model_dir, 'export')
  with _patched_training(devices) as mp, contextlib.redirect_stdout(out):
    mp.setattr(jax, 'device_put', spy)
    record = train.train(str(model_dir), CFG, export_dir=export_dir,
                         **dict(RUN_KWARGS, **kwargs))
  (start,) = placed
  with open(os.path.join(model_dir, 'train_log.jsonl')) as f:
    log = [json.loads(line) for line in f]
  # The final params in float32 as the last checkpoint holds them, and as the run exports
  # them (gathered from the devices, stored in bfloat16: compared apart, since a few-ulp
  # float32 difference can round to neighbouring bfloat16 values).
  final = {k: v for k, v in _restore(model_dir, kwargs.get('num_steps', STEPS)).items()
           if k.startswith("['params']")}
  exported = {"['params']" + k: v
              for k, v in _flat(checkpoints.load_compact(export_dir)[1]).items()}
  return dict(record=record, printed=out.getvalue(), start=start, final=final, exported=exported,
              losses={r['step']: r['loss'] for r in log if r['kind'] == 'train'})


def _layout(state):
  """Values (numpy), PartitionSpecs, first-shard shapes and the mesh of a placed state."""
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  return {
      'values': _flat(state),
      'specs': {jax.tree_util.keystr(p): x.sharding.spec for p, x in leaves},
      'shards': {jax.tree_util.keystr(p): x.addressable_shards[0].data.shape for p, x in leaves},
      'mesh': dict(leaves[0][1].sharding.mesh.shape),
  }


def _restore(model_dir, step):
  """The checkpointed state of `step` as numpy, read onto one device."""
  with _patched_training():
    optimizer = train.make_optimizer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shapes = train.state_shapes(CFG, optimizer)
  abstract = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), shapes)
  manager = checkpoints.training_checkpoint_manager(os.path.join(model_dir, 'checkpoints'))
  try:
    return _flat(manager.restore(step, args=ocp.args.StandardRestore(abstract)))
  finally:
    manager.close()


def _spec_of(run, keys, field=None, key='specs'):
  suffix = ''.join(f'[{k!r}]' for k in keys)
  found = [v for p, v in run['start'][key].items()
           if p.endswith(suffix) and ((field is None and p.startswith("['params']")) or
                                      (field is not None and f'.{field}[' in p))]
  assert len(found) == 1, (keys, field, found)
  return found[0]


# -----------------------------------------------------------------------------
# The 8-device helper process.
# -----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def devices8():
  with device_pool.spawned(CHILD_XLA_FLAGS) as pool:
    yield pool


def _in_child(pool, fn, *args):
  return pool.submit(fn, *args).result()


def _child_setup():
  assert jax.device_count() == NUM_DEVICES, (
      f'expected {NUM_DEVICES} CPU devices ({DEVICE_FLAG}), JAX has {jax.device_count()}')
  tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS)


def _case_runs(root):
  """The one-device reference, the four meshes, 2-D params, and a cross-mesh resume."""
  _child_setup()
  runs = {'ref': _run(os.path.join(root, 'ref'), devices=1)}
  for data, model in MESH_SHAPES:
    # The 2x4 run also checkpoints step 2, which the resumed runs below start from.
    runs[(data, model)] = _run(os.path.join(root, f'{data}x{model}'), num_partitions=model,
                               checkpoint_every=2 if model == 4 else STEPS)
  runs['2d'] = _run(os.path.join(root, '2x4_2d'), num_partitions=4,
                    parameter_partitioning_dims=2)
  # The 2x4 run's step-2 checkpoint, resumed on 4x2 and (the reference) on one device.
  for name, devices, model in (('resume_4x2', None, 2), ('resume_ref', 1, 1)):
    model_dir = os.path.join(root, name)
    shutil.copytree(os.path.join(root, '2x4'), model_dir)
    shutil.rmtree(os.path.join(model_dir, 'checkpoints', str(STEPS)))
    runs[name] = _run(model_dir, devices=devices, num_partitions=model)
  runs['checkpoint_2'] = _restore(os.path.join(root, '2x4'), 2)
  runs['resume_4x2_dir'] = os.path.join(root, 'resume_4x2')
  return runs


def _case_bad_layouts(root):
  """Errors for layouts that cannot be, before anything is written."""
  _child_setup()
  errors = {}
  cases = {
      'not_dividing_devices': dict(num_partitions=3),
      'not_dividing_heads': dict(num_partitions=8, config=network.T5Config(
          vocab_size=8192, emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=1,
          num_decoder_layers=1, mlp_dim=64)),
      'not_dividing_mlp': dict(num_partitions=8, config=network.T5Config(
          vocab_size=8192, emb_dim=32, num_heads=8, head_dim=4, num_encoder_layers=1,
          num_decoder_layers=1, mlp_dim=36)),
      'embed_2d': dict(num_partitions=1, parameter_partitioning_dims=2,
                       config=network.T5Config(vocab_size=8192, emb_dim=36, num_heads=8,
                                               head_dim=4, num_encoder_layers=1,
                                               num_decoder_layers=1, mlp_dim=64)),
      'bad_dims': dict(num_partitions=2, parameter_partitioning_dims=3),
      'batch_over_data': dict(num_partitions=1, batch_size=4),
  }
  for name, kwargs in cases.items():
    model_dir = os.path.join(root, name)
    config = kwargs.pop('config', CFG)
    try:
      with _patched_training():
        train.train(model_dir, config, **dict(RUN_KWARGS, **kwargs))
    except ValueError as e:
      errors[name] = (str(e), os.path.exists(model_dir))
    else:
      errors[name] = (None, os.path.exists(model_dir))
  return errors


def _case_activation_layout():
  """Temporary bytes of the 2-D-param step on a 4 x 2 mesh, with T5X's activation pins and without."""
  _child_setup()
  config = train_config.TrainConfig(
      model_dir='/nonexistent', network_config=CFG,
      data=train_config.DataConfig(feature_lengths=tuple(LENGTHS.items()), batch_size=BATCH),
      partitioning=train_config.PartitioningConfig(num_partitions=2, parameter_partitioning_dims=2))
  layout = train.lay_out(config, Mesh(np.array(jax.devices()).reshape(4, 2), ('data', 'model')))
  batch = {k: jax.ShapeDtypeStruct((BATCH, LENGTHS['inputs' if k.startswith('encoder') else 'targets']),
                                   np.int32) for k in train.BATCH_KEYS}
  rng = jax.ShapeDtypeStruct((2,), np.uint32)

  def temporaries():
    compiled = train.jit_train_step(config, layout).lower(layout.shapes, batch, rng).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  pinned = temporaries()
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(network, 'activation_layout', lambda *a, **k: contextlib.nullcontext())
    unpinned = temporaries()
  return pinned, unpinned


def _case_init_from_t5x(root):
  """A T5X checkpoint read into the 2x4 mesh's shards, then trained from."""
  _child_setup()
  params = jax.tree_util.tree_map(
      lambda s: np.random.RandomState(0).normal(0, 0.05, s.shape).astype(np.float32),
      checkpoints.expected_params(CFG))
  t5x_dir = t5x_checkpoint.save(os.path.join(root, 'pretrained', 'checkpoint_1000'), params,
                                step=1000)
  reads = []
  real_make_array = checkpoints._make_array  # pylint: disable=protected-access

  def spy(name, leaf, sharding, dtype, where):
    reads.append((name, sharding.spec))
    return real_make_array(name, leaf, sharding, dtype, where)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(checkpoints, '_make_array', spy)
    run = _run(os.path.join(root, 'finetune'), num_partitions=4, num_steps=2,
               init_from_t5x=os.path.join(root, 'pretrained'))
  return dict(run=run, params=_flat(params), reads=dict(reads))


# -----------------------------------------------------------------------------
# Sharded training on 8 devices.
# -----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def runs(devices8, tmp_path_factory):
  return _in_child(devices8, _case_runs, str(tmp_path_factory.mktemp('sharded')))


def _assert_params_close(got, want, atol=PARAM_ATOL):
  keys = [k for k in want if k.startswith("['params']")]
  assert keys and set(keys) <= set(got)
  for k in keys:
    np.testing.assert_allclose(got[k], want[k], atol=atol, rtol=0, err_msg=k)


class TestSameAsOneDevice:

  @pytest.mark.parametrize('mesh_shape', MESH_SHAPES)
  def test_loss_curve_and_params(self, runs, mesh_shape):
    ref, got = runs['ref'], runs[mesh_shape]
    assert got['start']['mesh'] == {'data': mesh_shape[0], 'model': mesh_shape[1]}
    assert sorted(got['losses']) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([got['losses'][s] for s in range(1, STEPS + 1)],
                               [ref['losses'][s] for s in range(1, STEPS + 1)], rtol=LOSS_RTOL)
    _assert_params_close(got['final'], ref['final'])
    # Training moved the params (the comparison is not of two initial states).
    moved = max(np.abs(ref['final'][k] - ref['start']['values'][k]).max()
                for k in ref['final'] if k.startswith("['params']"))
    assert moved > 1e-3

  @pytest.mark.parametrize('mesh_shape', MESH_SHAPES)
  def test_export_is_the_final_params_in_bfloat16(self, runs, mesh_shape):
    got = runs[mesh_shape]
    assert set(got['exported']) == set(got['final'])
    for k, v in got['final'].items():
      np.testing.assert_array_equal(
          np.asarray(got['exported'][k], np.float32),
          np.asarray(jnp.asarray(v, jnp.bfloat16), np.float32), err_msg=k)

  def test_same_initial_params_on_every_mesh(self, runs):
    for mesh_shape in MESH_SHAPES + ('2d',):
      for k, v in runs['ref']['start']['values'].items():
        np.testing.assert_array_equal(runs[mesh_shape]['start']['values'][k], v, err_msg=k)

  def test_2d_parameter_partitioning(self, runs):
    ref, got = runs['ref'], runs['2d']
    np.testing.assert_allclose([got['losses'][s] for s in range(1, STEPS + 1)],
                               [ref['losses'][s] for s in range(1, STEPS + 1)], rtol=LOSS_RTOL)
    _assert_params_close(got['final'], ref['final'])

  def test_layout_is_printed(self, runs):
    assert "Mesh {'data': 2, 'model': 4}: params + optimizer state" in runs[(2, 4)]['printed']


class TestLayout:
  """The state each run trains from is laid out as T5X's rules say (2x4 mesh)."""

  def test_params_1d(self, runs):
    run = runs[(2, 4)]
    assert _spec_of(run, WI) == P(None, 'model')
    assert _spec_of(run, WI, key='shards') == (32, 16)
    assert _spec_of(run, QUERY) == P(None, 'model')
    assert _spec_of(run, EMBEDDING) == P('model')
    assert _spec_of(run, EMBEDDING, key='shards') == (2048, 32)
    assert _spec_of(run, SCALE) == P()

  def test_adafactor_factored_moments_1d(self, runs):
    run = runs[(2, 4)]
    # wi_0 (embed 32, mlp 64): v_row keeps embed (replicated), v_col keeps mlp (over 'model').
    assert _spec_of(run, WI, 'v_row') == P()
    assert _spec_of(run, WI, 'v_col') == P('model')
    assert _spec_of(run, WI, 'v_col', key='shards') == (16,)
    # The embedding (vocab 8192, embed 32): v_row keeps embed, v_col keeps vocab.
    assert _spec_of(run, EMBEDDING, 'v_row') == P()
    assert _spec_of(run, EMBEDDING, 'v_col') == P('model')
    # Unfactored leaves have a (1,) placeholder in v_row / v_col and the full moment in v.
    assert _spec_of(run, SCALE, 'v') == P()

  def test_params_and_moments_2d(self, runs):
    run = runs['2d']
    assert _spec_of(run, WI) == P('data', 'model')
    assert _spec_of(run, WI, key='shards') == (16, 16)
    assert _spec_of(run, EMBEDDING) == P('model', 'data')
    assert _spec_of(run, SCALE) == P('data')
    assert _spec_of(run, WI, 'v_row') == P('data')
    assert _spec_of(run, WI, 'v_col') == P('model')

  def test_replicated_on_8x1(self, runs):
    run = runs[(8, 1)]
    for k, shape in run['start']['shards'].items():
      assert shape == run['start']['values'][k].shape, k


class TestCheckpointAcrossMeshes:
  """The 2x4 run's step-2 checkpoint, resumed on a 4x2 mesh."""

  def test_restores_identical_values(self, runs):
    got = runs['resume_4x2']
    assert 'at step 2.' in got['printed']
    assert got['start']['mesh'] == {'data': 4, 'model': 2}
    want = runs['checkpoint_2']
    assert set(got['start']['values']) == set(want)
    for k, v in want.items():
      np.testing.assert_array_equal(got['start']['values'][k], v, err_msg=k)
    assert int(got['start']['values']["['step']"]) == 2

  def test_restored_into_the_new_layout(self, runs):
    got = runs['resume_4x2']
    assert _spec_of(got, WI) == P(None, 'model')
    assert _spec_of(got, WI, key='shards') == (32, 32)
    assert _spec_of(got, WI, 'v_col', key='shards') == (32,)

  def test_continues_training(self, runs):
    got, ref = runs['resume_4x2'], runs['resume_ref']
    assert sorted(got['losses']) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([got['losses'][s] for s in (3, 4)],
                               [ref['losses'][s] for s in (3, 4)], rtol=LOSS_RTOL)
    _assert_params_close(got['final'], ref['final'])
    assert _restore(runs['resume_4x2_dir'], STEPS)["['step']"] == STEPS
    changed = [k for k in runs['checkpoint_2'] if k.startswith("['params']") and
               not np.array_equal(got['final'][k], runs['checkpoint_2'][k])]
    assert changed


def test_bad_layouts_fail_before_anything_is_written(devices8, tmp_path):
  errors = _in_child(devices8, _case_bad_layouts, str(tmp_path))
  patterns = {
      'not_dividing_devices': 'num_partitions=3 does not divide the 8 devices',
      'not_dividing_heads': r"does not divide the params.*'heads', size 4\) over mesh axes model \(8 ways\)",
      'not_dividing_mlp': r"'mlp', size 36\) over mesh axes model",
      'embed_2d': r"'embed', size 36\) over mesh axes data \(8 ways\)",
      'bad_dims': 'parameter_partitioning_dims must be 1 or 2, got 3',
      'batch_over_data': r"batch_size=4 must divide over the 8 devices of the mesh's 'data' axis",
  }
  import re  # pylint: disable=g-import-not-at-top
  for name, pattern in patterns.items():
    message, written = errors[name]
    assert message is not None and re.search(pattern, message), (name, message)
    assert not written, name


def test_activations_are_pinned_to_the_batch_layout(devices8):
  # With 2-D params (embed over 'data'), XLA left alone contracts the matmuls over the weights' sharded embed and
  # keeps every activation of the whole batch on each device; T5X's pins (network.activation_layout) split them
  # by batch over the 4 'data' rows, so the step's temporaries (activations, mostly) must shrink well below.
  pinned, unpinned = _in_child(devices8, _case_activation_layout)
  assert pinned < 0.75 * unpinned, (pinned, unpinned)


class TestInitFromT5X:

  @pytest.fixture(scope='class')
  def finetuned(self, devices8, tmp_path_factory):
    return _in_child(devices8, _case_init_from_t5x, str(tmp_path_factory.mktemp('t5x_init')))

  def test_starts_from_the_checkpoint(self, finetuned):
    start = finetuned['run']['start']['values']
    for k, v in finetuned['params'].items():
      np.testing.assert_array_equal(start["['params']" + k], v, err_msg=k)
    assert int(start["['step']"]) == 0
    counts = [v for k, v in start.items() if k.endswith('.count')]
    assert counts and all(int(c) == 0 for c in counts)  # a fresh optimizer state

  def test_read_into_the_shards(self, finetuned):
    reads = finetuned['reads']
    assert reads['encoder/layers_0/mlp/wi_0/kernel'] == P(None, 'model')
    assert reads['token_embedder/embedding'] == P('model')
    assert _spec_of(finetuned['run'], WI, key='shards') == (32, 16)

  def test_trains_and_reports(self, finetuned):
    run = finetuned['run']
    assert sorted(run['losses']) == [1, 2]
    assert 'Initialising params from the T5X checkpoint' in run['printed']
    assert np.isfinite(run['record']['eval_loss'])


# -----------------------------------------------------------------------------
# In this process (one device): argument checks, T5X errors, gin, pure layout functions.
# -----------------------------------------------------------------------------


@pytest.fixture
def local_tasks():
  tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS)
  yield
  tasks.register_local_tasks()


def _t5x(tmp_path, config, name='pretrained'):
  params = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, np.float32),
                                  checkpoints.expected_params(config))
  return t5x_checkpoint.save(str(tmp_path / name / 'checkpoint_10'), params, step=10)


class TestInitFromT5XErrors:

  def _train(self, tmp_path, **kwargs):
    train.train(str(tmp_path / 'model'), CFG, **dict(RUN_KWARGS, **kwargs))

  def test_vocabulary_mismatch(self, tmp_path, local_tasks):
    other = dataclasses.replace(CFG, vocab_size=32128)
    path = _t5x(tmp_path, other)
    with pytest.raises(ValueError, match=r'Vocabulary size mismatch: .*32128 token .*'
                                         r'config.vocab_size=8192'):
      self._train(tmp_path, init_from_t5x=path)
    assert not (tmp_path / 'model').exists()

  def test_missing_checkpoint(self, tmp_path, local_tasks):
    with pytest.raises(FileNotFoundError, match='nowhere'):
      self._train(tmp_path, init_from_t5x=str(tmp_path / 'nowhere'))
    assert not (tmp_path / 'model').exists()

  def test_missing_array(self, tmp_path, local_tasks):
    path = _t5x(tmp_path, CFG)
    shutil.rmtree(os.path.join(path, 'target.decoder.logits_dense.kernel'))
    with pytest.raises(FileNotFoundError, match='decoder/logits_dense/kernel'):
      self._train(tmp_path, init_from_t5x=path)

  def test_not_a_t5x_checkpoint(self, tmp_path, local_tasks):
    compact = str(tmp_path / 'compact')
    checkpoints.save_compact(compact, CFG, jax.tree_util.tree_map(
        lambda s: np.zeros(s.shape, np.float32), checkpoints.expected_params(CFG)))
    with pytest.raises(ValueError, match='is a compact checkpoint, not a T5X one'):
      self._train(tmp_path, init_from_t5x=compact)

  def test_not_both_inits(self, tmp_path, local_tasks):
    with pytest.raises(ValueError, match='init_from_dir or init_from_t5x, not both'):
      self._train(tmp_path, init_from_t5x='a', init_from_dir='b')

  def test_task_vocabulary_larger_than_the_config(self, tmp_path, local_tasks):
    small = dataclasses.replace(CFG, vocab_size=512)
    with pytest.raises(ValueError, match=r"'inputs' vocabulary has 8100 ids but "
                                         r'config.vocab_size=512'):
      train.train(str(tmp_path / 'model'), small, **RUN_KWARGS)
    assert not (tmp_path / 'model').exists()

  def test_bad_num_partitions(self, tmp_path, local_tasks):
    devices = jax.device_count()  # 1, or 8 under --xla_force_host_platform_device_count=8
    with pytest.raises(ValueError, match=f'num_partitions={devices + 1} does not divide the '
                                         f'{devices} devices'):
      self._train(tmp_path, num_partitions=devices + 1)
    with pytest.raises(ValueError, match='num_partitions must be a positive int'):
      self._train(tmp_path, num_partitions=0)


class TestConstantLearningRate:

  def test_value(self):
    assert float(train.constant_learning_rate(0)) == pytest.approx(1e-3)
    assert float(train.constant_learning_rate(10**6, value=0.5)) == 0.5
    assert float(jax.jit(train.constant_learning_rate)(jnp.int32(7))) == pytest.approx(1e-3)

  def test_warmup_ramps_linearly_to_the_value(self):
    rates = [float(train.constant_learning_rate(jnp.int32(s), value=1e-3, warmup_steps=4)) for s in range(6)]
    assert rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])

  @pytest.mark.parametrize('name', ['adafactor', 'adamw'])
  def test_optimizer_uses_it(self, name):
    opt = train.make_optimizer(name, schedule='constant', clip_norm=None)
    params = {'w': jnp.ones((3,))}
    state = opt.init(params)
    if name == 'adamw':  # Adam's first step moves each weight by the rate.
      updates, _ = opt.update({'w': jnp.ones((3,))}, state, params)
      np.testing.assert_allclose(np.asarray(updates['w']), -1e-3, rtol=1e-3)

  def test_unknown_schedule(self):
    with pytest.raises(ValueError, match="schedule must be one of .*'cosine'"):
      train.make_optimizer(schedule='cosine')

  def test_factoring_threshold(self):
    params = {'w': jnp.zeros((32, 64))}
    factored = jax.eval_shape(train.make_optimizer(min_dim_size_to_factor=16).init, params)
    unfactored = jax.eval_shape(train.make_optimizer().init, params)
    assert _leaf(factored, ('w',), 'v_row').shape == (32,)
    assert _leaf(unfactored, ('w',), 'v').shape == (32, 64)


class _Stop(Exception):
  pass


class TestMainFlags:
  """`python -m specdec.training.train` with the new bindings and --multihost, stopped before any compute."""

  def _main(self, tmp_path, monkeypatch, *flags, gin_file='train/cpu_target.gin'):
    import gin  # pylint: disable=g-import-not-at-top
    seen = {}

    def stop(directory, *args, **kwargs):
      raise _Stop()

    def spy(*args, **kwargs):
      seen['rates'] = [float(kwargs['learning_rate'](s)) for s in (0, 5000)]
      return real(*args, **kwargs)

    real = optax.adafactor
    monkeypatch.setattr(optax, 'adafactor', spy)
    monkeypatch.setattr(checkpoints, 'training_checkpoint_manager', stop)
    monkeypatch.setattr(partitioning, 'initialize_multihost',
                        lambda **kw: seen.setdefault('multihost', kw))
    real_specs = train.state_specs

    def specs_spy(config, optimizer, rules, axis_sizes):
      seen['rules'], seen['axis_sizes'] = rules, axis_sizes
      return real_specs(config, optimizer, rules, axis_sizes)

    monkeypatch.setattr(train, 'state_specs', specs_spy)
    gin.clear_config()
    try:
      with pytest.raises(_Stop):
        train.main([f'--gin_file={gin_file}', f"--gin.MODEL_DIR='{tmp_path / 'model'}'",
                    *flags])
    finally:
      gin.clear_config()
    return seen

  def test_constant_rate_and_mesh_bindings(self, tmp_path, monkeypatch):
    # As a fine-tuning gin file binds them (gin registers train.constant_learning_rate
    # once a file names it; the command line alone may only rebind it).
    gin_file = tmp_path / 'finetune.gin'
    gin_file.write_text('\n'.join([
        "include 'train/cpu_target.gin'",
        'from __gin__ import dynamic_registration',
        'from specdec.training import train',
        'from specdec.training import train_config',
        "train.make_optimizer.schedule = 'constant'",
        'train.constant_learning_rate.value = 0.001',
        'train_config.PartitioningConfig.num_partitions = 1',
        'train_config.PartitioningConfig.parameter_partitioning_dims = 2', '']))
    seen = self._main(tmp_path, monkeypatch, '--gin.train.constant_learning_rate.value=0.002',
                      gin_file=str(gin_file))
    assert seen['rates'] == pytest.approx([0.002, 0.002])
    assert ('embed', 'data') in seen['rules']
    assert seen['axis_sizes'] == {'data': jax.device_count(), 'model': 1}
    assert 'multihost' not in seen

  def test_multihost_flag(self, tmp_path, monkeypatch):
    seen = self._main(tmp_path, monkeypatch, '--multihost')
    assert seen['multihost'] == {'enabled': True}


def _fake_mesh(process_of_device):
  """A [data, model] array of stand-in devices with the given process indices."""
  grid = np.asarray(process_of_device)
  out = np.empty(grid.shape, dtype=object)
  for idx, p in np.ndenumerate(grid):
    out[idx] = types.SimpleNamespace(process_index=int(p))
  return out


class TestHostBatchShard:

  def test_one_host(self):
    assert partitioning.host_batch_shard(_fake_mesh([[0, 0], [0, 0]]), 8, 0) == (0, 1)

  def test_data_parallel_hosts(self):
    mesh = _fake_mesh([[0, 0], [0, 0], [1, 1], [1, 1]])  # 4x2, two hosts of 4 devices
    assert partitioning.host_batch_shard(mesh, 8, 0) == (0, 2)
    assert partitioning.host_batch_shard(mesh, 8, 1) == (1, 2)

  def test_model_parallel_group_across_hosts_loads_the_same_rows(self):
    mesh = _fake_mesh([[0, 0, 1, 1], [0, 0, 1, 1]])  # 2x4, each model group spans both
    assert partitioning.host_batch_shard(mesh, 8, 0) == (0, 1)
    assert partitioning.host_batch_shard(mesh, 8, 1) == (0, 1)

  def test_four_hosts_two_shards(self):
    mesh = _fake_mesh([[0, 1], [0, 1], [2, 3], [2, 3]])
    assert [partitioning.host_batch_shard(mesh, 16, p) for p in range(4)] == [
        (0, 2), (0, 2), (1, 2), (1, 2)]

  def test_scattered_positions_are_an_error(self):
    mesh = _fake_mesh([[0], [1], [0], [1]])
    with pytest.raises(ValueError, match=r'data positions \[0, 2\], not a contiguous block'):
      partitioning.host_batch_shard(mesh, 8, 0)

  def test_batch_must_divide(self):
    with pytest.raises(ValueError, match='batch_size=6 does not divide over the 4'):
      partitioning.host_batch_shard(_fake_mesh([[0]] * 4), 6, 0)


class TestOptimizerStateSpecs:

  PARAMS = {'k': jax.ShapeDtypeStruct((32, 64), np.float32),      # (embed, mlp)
            'sq': jax.ShapeDtypeStruct((32, 32), np.float32),     # (embed, joined_kv)
            'b': jax.ShapeDtypeStruct((64,), np.float32)}
  # Fitted specs as 1-D rules (k, b) and 2-D rules (sq) give them.
  SPECS = {'k': P(None, 'model'), 'sq': P('data', 'model'), 'b': P('model')}

  def _specs(self, optimizer):
    state = jax.eval_shape(optimizer.init, self.PARAMS)
    return state, partitioning.optimizer_state_specs(state, self.PARAMS, self.SPECS)

  def test_adam_moments_follow_their_params(self):
    state, specs = self._specs(optax.adamw(1e-3))
    for field in ('mu', 'nu'):
      for name, spec in self.SPECS.items():
        assert _leaf(specs, (name,), field) == spec
    counts = [s for p, s in jax.tree_util.tree_flatten_with_path(
        specs, is_leaf=lambda x: isinstance(x, P))[0] if 'count' in jax.tree_util.keystr(p)]
    assert counts and all(c == P() for c in counts)

  def test_adafactor_factored_moments_drop_the_reduced_dimension(self):
    state, specs = self._specs(optax.adafactor(1e-3, min_dim_size_to_factor=16))
    # k (32, 64): v_row keeps dim 0 (embed), v_col keeps dim 1 (mlp).
    assert _leaf(state, ('k',), 'v_row').shape == (32,)
    assert _leaf(specs, ('k',), 'v_row') == P()
    assert _leaf(specs, ('k',), 'v_col') == P('model')
    # sq (32, 32): equal dimensions; optax's v_row keeps dim 0, v_col dim 1.
    assert _leaf(specs, ('sq',), 'v_row') == P('data')
    assert _leaf(specs, ('sq',), 'v_col') == P('model')
    # b is not factored: the full moment in v, (1,) placeholders elsewhere.
    assert _leaf(specs, ('b',), 'v') == P('model')
    assert _leaf(specs, ('b',), 'v_row') == P()

  def test_specs_fit_the_state(self):
    """Every spec names mesh axes a (2, 4) mesh divides in its leaf's shape."""
    for optimizer in (optax.adafactor(1e-3, min_dim_size_to_factor=16), optax.adamw(1e-3)):
      state, specs = self._specs(optimizer)
      leaves = jax.tree_util.tree_leaves(state)
      spec_leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, P))
      assert len(leaves) == len(spec_leaves)
      memory.leaf_bytes_per_device(state, specs, {'data': 2, 'model': 4})


def test_undivisible_dims():
  logical = {'k': P('embed', 'mlp'), 'h': P('heads', 'relpos_buckets')}
  shapes = {'k': jax.ShapeDtypeStruct((32, 34), np.float32),
            'h': jax.ShapeDtypeStruct((6, 32), np.float32)}
  rules = partitioning.standard_logical_axis_rules()
  problems = partitioning.undivisible_dims(logical, shapes, rules, {'data': 2, 'model': 4})
  assert problems == ["['h'] dimension 0 ('heads', size 6) over mesh axes model (4 ways)",
                      "['k'] dimension 1 ('mlp', size 34) over mesh axes model (4 ways)"]
  assert partitioning.undivisible_dims(logical, shapes, rules, {'data': 2, 'model': 2}) == []
  with pytest.raises(ValueError, match=r'does not divide the params'):
    partitioning.check_divisible(logical, shapes, rules, {'data': 1, 'model': 4})
