"""Tests for specdec/checkpoints.py: the compact format, Orbax, and restore_params.

CPU, float32, the 'tiny' preset with a small vocabulary (the format does not
depend on the size). T5X and Hugging Face specifics: t5x_checkpoint_test.py,
hf_checkpoint_test.py.
"""

import hashlib
import json
import os
import subprocess
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from specdec import checkpoints
from specdec import network

CFG = network.t5_1_1_config('tiny', vocab_size=64)


@pytest.fixture(scope='module')
def params():
  return network.init_params(CFG, jax.random.PRNGKey(0))


def _flat(tree):
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(tree), sep='/')


def _bf16_rounded(x):
  return np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))


def _write_params(directory, tree):
  """Overwrites params.msgpack with `tree` (float32), keeping config.json
  (with the new file's hash: a consistently saved but wrong tree)."""
  stored = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), tree)
  with open(os.path.join(directory, checkpoints.PARAMS_FILE), 'wb') as f:
    f.write(flax.serialization.msgpack_serialize(stored))
  checkpoints.record_file_hashes(directory, [checkpoints.PARAMS_FILE])


# -----------------------------------------------------------------------------
# Round trips.
# -----------------------------------------------------------------------------


class TestCompactRoundTrip:

  def test_bfloat16_storage_rounds_to_bfloat16(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    config, loaded = checkpoints.load_compact(str(tmp_path))
    assert config == CFG
    want, got = _flat(params), _flat(loaded)
    assert set(got) == set(want)
    some_inexact = False
    for k in want:
      assert got[k].dtype == jnp.float32, k
      assert got[k].shape == want[k].shape, k
      np.testing.assert_array_equal(np.asarray(got[k]), _bf16_rounded(want[k]),
                                    err_msg=k)
      some_inexact |= not np.array_equal(np.asarray(got[k]), np.asarray(want[k]))
    # Random float32 params are not all exactly representable in bfloat16:
    # the stored copy really is bfloat16.
    assert some_inexact
    meta = json.loads((tmp_path / checkpoints.CONFIG_FILE).read_text())
    assert meta['storage_dtype'] == 'bfloat16'
    stored = flax.serialization.msgpack_restore(
        (tmp_path / checkpoints.PARAMS_FILE).read_bytes())
    assert {np.asarray(v).dtype.name for v in _flat(stored).values()} == {'bfloat16'}

  def test_bfloat16_file_is_half_the_float32_file(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path / 'bf16'), CFG, params)
    checkpoints.save_compact(str(tmp_path / 'f32'), CFG, params,
                             storage_dtype=jnp.float32)
    bf16 = os.path.getsize(tmp_path / 'bf16' / checkpoints.PARAMS_FILE)
    f32 = os.path.getsize(tmp_path / 'f32' / checkpoints.PARAMS_FILE)
    assert 0.45 < bf16 / f32 < 0.55

  @pytest.mark.parametrize('storage_dtype', [jnp.float32, 'float32', np.float32])
  def test_float32_storage_is_exact(self, params, tmp_path, storage_dtype):
    checkpoints.save_compact(str(tmp_path), CFG, params,
                             storage_dtype=storage_dtype)
    config, loaded = checkpoints.load_compact(str(tmp_path))
    assert config == CFG
    want, got = _flat(params), _flat(loaded)
    assert set(got) == set(want)
    for k in want:
      assert got[k].dtype == jnp.float32
      np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]),
                                    err_msg=k)
    meta = json.loads((tmp_path / checkpoints.CONFIG_FILE).read_text())
    assert meta['storage_dtype'] == 'float32'

  def test_extra_metadata_is_kept(self, params, tmp_path):
    extra = {'train': {'step': 7, 'final_eval': {'eval_loss': 1.5}}}
    checkpoints.save_compact(str(tmp_path), CFG, params, extra=extra)
    meta = json.loads((tmp_path / checkpoints.CONFIG_FILE).read_text())
    assert meta['train'] == extra['train']
    assert meta['config'] == checkpoints.config_to_dict(CFG)
    assert checkpoints.load_config(str(tmp_path)) == CFG

  def test_replace_with_continuation_keeps_the_replaced_models_record(self, params, tmp_path):
    start, nxt = str(tmp_path / 'start'), str(tmp_path / 'next')
    checkpoints.save_compact(start, CFG, params, extra={'train': {
        'step': 5, 'init_from_dir': None, 'runs': [{'command': 'a', 'from_step': 0, 'to_step': 5, 'minutes': 2.0}]}})
    checkpoints.save_compact(nxt, CFG, params, extra={'train': {
        'step': 3, 'init_from_dir': start, 'runs': [{'command': 'b', 'from_step': 0, 'to_step': 2, 'minutes': 1.0},
                                                    {'command': 'c', 'from_step': 2, 'to_step': 3, 'minutes': 0.5}]}})
    checkpoints.replace_with_continuation(nxt, start)
    assert not os.path.exists(nxt) and not os.path.exists(start + '.replaced')
    runs = checkpoints.training_runs(checkpoints.training_record(start))
    assert [(r['command'], r['from_step'], r['to_step'], r['init_from_dir']) for r in runs] == [
        ('a', 0, 5, None), ('b', 5, 7, start), ('c', 7, 8, start)]
    checkpoints.load_compact(start)  # still a whole model: its params match the recorded hash
    # A third run continues the swapped-in model: its steps count on from the second run's end (8), not from the
    # step its own start's trainer reached (3).
    third = str(tmp_path / 'third')
    checkpoints.save_compact(third, CFG, params, extra={'train': {
        'step': 4, 'init_from_dir': start, 'runs': [{'command': 'd', 'from_step': 0, 'to_step': 4, 'minutes': 1.0}]}})
    checkpoints.replace_with_continuation(third, start)
    runs = checkpoints.training_runs(checkpoints.training_record(start))
    assert [(r['command'], r['from_step'], r['to_step']) for r in runs] == [
        ('a', 0, 5), ('b', 5, 7), ('c', 7, 8), ('d', 8, 12)]

  def test_replace_with_continuation_refuses_what_is_not_one(self, params, tmp_path):
    start, other = str(tmp_path / 'start'), str(tmp_path / 'other')
    checkpoints.save_compact(start, CFG, params, extra={'train': {'step': 5, 'runs': []}})
    checkpoints.save_compact(other, CFG, params, extra={'train': {'step': 1, 'init_from_dir': 'elsewhere',
                                                                  'runs': []}})
    with pytest.raises(ValueError, match='not a continuation'):
      checkpoints.replace_with_continuation(other, start)
    checkpoints.save_compact(other, CFG, params)
    with pytest.raises(ValueError, match='no training record'):
      checkpoints.replace_with_continuation(other, start)
    assert os.path.isdir(start) and os.path.isdir(other)

  def test_creates_missing_directories(self, params, tmp_path):
    directory = tmp_path / 'a' / 'b' / 'model'
    checkpoints.save_compact(str(directory), CFG, params)
    assert sorted(os.listdir(directory)) == sorted(
        [checkpoints.CONFIG_FILE, checkpoints.PARAMS_FILE])


class TestConfig:

  @pytest.mark.parametrize('config', [
      CFG,
      network.t5_1_1_config('tiny', vocab_size=8192, dtype='bfloat16',
                            dropout_rate=0.0),
      network.t5_1_1_config('tiny', vocab_size=100, dtype=jnp.float16,
                            mlp_activations=('relu',),
                            logits_via_embedding=True,
                            relative_attention_num_buckets=8,
                            relative_attention_max_distance=16),
  ])
  def test_round_trip(self, config):
    fields = checkpoints.config_to_dict(config)
    # JSON-serializable, with the dtype by name.
    fields = json.loads(json.dumps(fields))
    assert fields['dtype'] == jnp.dtype(config.dtype).name
    assert fields['mlp_activations'] == list(config.mlp_activations)
    restored = checkpoints.config_from_dict(fields)
    assert restored == config
    assert restored.dtype == jnp.dtype(config.dtype)
    assert isinstance(restored.mlp_activations, tuple)

  def test_bfloat16_dtype_is_stored_by_name(self, params, tmp_path):
    config = network.t5_1_1_config('tiny', vocab_size=64, dtype=jnp.bfloat16)
    checkpoints.save_compact(str(tmp_path), config, params)
    meta = json.loads((tmp_path / checkpoints.CONFIG_FILE).read_text())
    assert meta['config']['dtype'] == 'bfloat16'
    loaded, _ = checkpoints.load_compact(str(tmp_path))
    assert loaded == config
    assert loaded.dtype == jnp.bfloat16

  def test_unknown_fields_raise(self):
    fields = dict(checkpoints.config_to_dict(CFG), num_experts=8, foo=1)
    with pytest.raises(ValueError, match=r"\['foo', 'num_experts'\]"):
      checkpoints.config_from_dict(fields)

  def test_unknown_field_in_file_raises(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    path = tmp_path / checkpoints.CONFIG_FILE
    meta = json.loads(path.read_text())
    meta['config']['bogus_field'] = 3
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match='bogus_field'):
      checkpoints.load_compact(str(tmp_path))

  def test_invalid_values_raise(self):
    fields = dict(checkpoints.config_to_dict(CFG), vocab_size=0)
    with pytest.raises(ValueError, match='vocab_size'):
      checkpoints.config_from_dict(fields)


# -----------------------------------------------------------------------------
# Atomic writes.
# -----------------------------------------------------------------------------


class TestAtomicWrites:

  def test_no_temp_files_left(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    checkpoints.save_compact(str(tmp_path), CFG, params)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [checkpoints.CONFIG_FILE, checkpoints.PARAMS_FILE])

  def test_existing_model_is_replaced(self, params, tmp_path):
    other_cfg = network.t5_1_1_config('tiny', vocab_size=64, dtype='bfloat16')
    other = jax.tree_util.tree_map(lambda x: x + 1.0, params)
    checkpoints.save_compact(str(tmp_path), CFG, params,
                             storage_dtype=jnp.float32)
    checkpoints.save_compact(str(tmp_path), other_cfg, other,
                             storage_dtype=jnp.float32)
    config, loaded = checkpoints.load_compact(str(tmp_path))
    assert config == other_cfg
    for k, v in _flat(other).items():
      np.testing.assert_array_equal(np.asarray(_flat(loaded)[k]), np.asarray(v))
    assert sorted(os.listdir(tmp_path)) == sorted(
        [checkpoints.CONFIG_FILE, checkpoints.PARAMS_FILE])


# -----------------------------------------------------------------------------
# Loading errors.
# -----------------------------------------------------------------------------


class TestLoadErrors:

  def test_missing_directory(self, tmp_path):
    missing = str(tmp_path / 'no_model')
    with pytest.raises(FileNotFoundError) as e:
      checkpoints.load_compact(missing)
    assert os.path.join(missing, checkpoints.CONFIG_FILE) in str(e.value)

  def test_missing_config(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    os.remove(tmp_path / checkpoints.CONFIG_FILE)
    with pytest.raises(FileNotFoundError) as e:
      checkpoints.load_compact(str(tmp_path))
    assert str(tmp_path / checkpoints.CONFIG_FILE) in str(e.value)
    with pytest.raises(FileNotFoundError):
      checkpoints.load_config(str(tmp_path))

  def test_missing_params(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    os.remove(tmp_path / checkpoints.PARAMS_FILE)
    with pytest.raises(FileNotFoundError) as e:
      checkpoints.load_compact(str(tmp_path))
    assert str(tmp_path / checkpoints.PARAMS_FILE) in str(e.value)
    # The config alone still loads.
    assert checkpoints.load_config(str(tmp_path)) == CFG

  def test_missing_leaf(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    tree = flax.core.unfreeze(params)
    del tree['decoder']['logits_dense']
    _write_params(str(tmp_path), tree)
    with pytest.raises(ValueError, match='missing decoder/logits_dense/kernel') as e:
      checkpoints.load_compact(str(tmp_path))
    assert str(tmp_path / checkpoints.PARAMS_FILE) in str(e.value)

  def test_extra_leaf(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    tree = flax.core.unfreeze(params)
    tree['encoder']['surprise'] = {'kernel': np.zeros((2, 2), np.float32)}
    _write_params(str(tmp_path), tree)
    with pytest.raises(ValueError, match='unexpected encoder/surprise/kernel'):
      checkpoints.load_compact(str(tmp_path))

  def test_wrong_shape(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    tree = flax.core.unfreeze(params)
    tree['token_embedder']['embedding'] = np.zeros((65, 32), np.float32)
    _write_params(str(tmp_path), tree)
    with pytest.raises(ValueError, match=r'token_embedder/embedding: shape '
                       r'\(65, 32\), expected \(64, 32\)'):
      checkpoints.load_compact(str(tmp_path))

  def test_params_of_another_config(self, params, tmp_path):
    """A config.json that does not describe the params is caught on load."""
    checkpoints.save_compact(str(tmp_path), CFG, params)
    bigger = network.t5_1_1_config('tiny', vocab_size=64, num_decoder_layers=3)
    meta = json.loads((tmp_path / checkpoints.CONFIG_FILE).read_text())
    meta['config'] = checkpoints.config_to_dict(bigger)
    (tmp_path / checkpoints.CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match='missing decoder/layers_2/'):
      checkpoints.load_compact(str(tmp_path))

  def test_many_problems_are_summarised(self, params):
    expected = jax.eval_shape(lambda: params)
    with pytest.raises(ValueError, match=r'\(and \d+ more\)') as e:
      checkpoints.check_param_shapes({}, expected, where='somewhere')
    assert 'somewhere' in str(e.value)
    assert str(e.value).count('missing ') == 10

  def test_matching_tree_passes(self, params):
    checkpoints.check_param_shapes(
        params, jax.eval_shape(lambda: params), where='x')


# -----------------------------------------------------------------------------
# Damaged files: content hashes, truncation, broken config.json.
# -----------------------------------------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _overwrite_middle(path, data=b'\xff' * 8):
  """Overwrites bytes in the middle of a file in place (size unchanged)."""
  raw = bytearray(open(path, 'rb').read())
  middle = len(raw) // 2
  raw[middle:middle + len(data)] = data
  open(path, 'wb').write(bytes(raw))


def _truncate(path, keep=0.5):
  raw = open(path, 'rb').read()
  open(path, 'wb').write(raw[:int(len(raw) * keep)])


def _drop_hashes(directory):
  """config.json as a model saved before hashes were recorded has it."""
  path = os.path.join(directory, checkpoints.CONFIG_FILE)
  meta = json.loads(open(path).read())
  del meta[checkpoints.FILES_FIELD]
  open(path, 'w').write(json.dumps(meta))


class TestDamagedFiles:

  def test_save_records_the_params_hash(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    meta = json.loads((tmp_path / checkpoints.CONFIG_FILE).read_text())
    data = (tmp_path / checkpoints.PARAMS_FILE).read_bytes()
    assert meta[checkpoints.FILES_FIELD] == {
        checkpoints.PARAMS_FILE: hashlib.sha256(data).hexdigest()}

  def test_files_is_reserved(self, params, tmp_path):
    with pytest.raises(ValueError, match='files'):
      checkpoints.save_compact(str(tmp_path), CFG, params, extra={'files': {}})

  def test_overwritten_bytes_are_caught(self, params, tmp_path):
    """A same-size corruption still unpacks (a leaf becomes ~3.4e38): the hash catches it."""
    checkpoints.save_compact(str(tmp_path), CFG, params)
    path = tmp_path / checkpoints.PARAMS_FILE
    _overwrite_middle(path)
    flax.serialization.msgpack_restore(path.read_bytes())  # unpacks fine
    with pytest.raises(ValueError, match='damaged, truncated or modified') as e:
      checkpoints.load_compact(str(tmp_path))
    assert str(e.value).startswith(f'{path}: ')
    with pytest.raises(ValueError, match='damaged, truncated or modified'):
      checkpoints.restore_params(str(tmp_path), CFG)

  def test_truncated_params(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    path = tmp_path / checkpoints.PARAMS_FILE
    _truncate(path)
    with pytest.raises(ValueError, match=f'^{path}: damaged, truncated'):
      checkpoints.load_compact(str(tmp_path))

  def test_old_format_without_hashes_loads(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    _drop_hashes(str(tmp_path))
    config, loaded = checkpoints.load_compact(str(tmp_path))
    assert config == CFG
    for k, v in _flat(params).items():
      np.testing.assert_array_equal(np.asarray(_flat(loaded)[k]), _bf16_rounded(v))

  def test_old_format_truncated_params(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    _drop_hashes(str(tmp_path))
    path = tmp_path / checkpoints.PARAMS_FILE
    _truncate(path)
    with pytest.raises(ValueError, match=f'^{path}: damaged or truncated params '
                       r'file \(Unpack failed: incomplete input\)'):
      checkpoints.load_compact(str(tmp_path))
    with pytest.raises(ValueError, match='damaged or truncated params file'):
      checkpoints.restore_params(str(tmp_path), CFG)

  def test_record_file_hashes_upgrades_an_old_model(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    before = (tmp_path / checkpoints.CONFIG_FILE).read_text()
    _drop_hashes(str(tmp_path))
    checkpoints.record_file_hashes(str(tmp_path), [checkpoints.PARAMS_FILE])
    assert json.loads((tmp_path / checkpoints.CONFIG_FILE).read_text()) == json.loads(before)
    _overwrite_middle(tmp_path / checkpoints.PARAMS_FILE)
    with pytest.raises(ValueError, match='damaged'):
      checkpoints.load_compact(str(tmp_path))

  @pytest.mark.parametrize('content, match', [
      (None, 'damaged or incomplete config file'),  # truncated
      (b'\xff\xfe{', 'damaged or incomplete config file'),  # not UTF-8
      (b'[1, 2]', 'a JSON list, expected an object'),
      (b'{}', "no 'config' object"),
      (b'{"config": null}', "no 'config' object"),
      (b'{"config": {"vocab_size": 64, "bogus": 1}}', r"Unknown T5Config fields.*\['bogus'\]"),
  ])
  def test_bad_config_json(self, params, tmp_path, content, match):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    path = tmp_path / checkpoints.CONFIG_FILE
    if content is None:
      _truncate(path)
    else:
      path.write_bytes(content)
    for load in (checkpoints.load_compact, checkpoints.load_config):
      with pytest.raises(ValueError, match=match) as e:
        load(str(tmp_path))
      assert str(e.value).startswith(f'{path}: ')

  @pytest.mark.parametrize('name', ['bigram', 'd1', 'd1kd', 'd2', 'd3', 'target', 'unigram'])
  def test_shipped_models_record_verified_hashes(self, name):
    directory = os.path.join(REPO, 'models', 'cpu', name)
    meta = json.loads(open(os.path.join(directory, checkpoints.CONFIG_FILE)).read())
    files = meta[checkpoints.FILES_FIELD]
    assert set(files) == {f for f in (checkpoints.PARAMS_FILE, 'counts.npz')
                          if os.path.exists(os.path.join(directory, f))}
    for file_name, digest in files.items():
      with open(os.path.join(directory, file_name), 'rb') as f:
        assert hashlib.sha256(f.read()).hexdigest() == digest, file_name


# -----------------------------------------------------------------------------
# Orbax training state.
# -----------------------------------------------------------------------------


def _state(step):
  return {'step': jnp.asarray(step, jnp.int32),
          'params': {'w': jnp.arange(6, dtype=jnp.float32).reshape(2, 3) * step,
                     'b': jnp.full((3,), -step, jnp.float32)},
          'opt_state': (jnp.asarray(step, jnp.int32),
                        {'mu': jnp.ones((2, 3), jnp.float32) / (step + 1)})}


class TestTrainingCheckpointManager:

  def test_save_restore(self, tmp_path):
    manager = checkpoints.training_checkpoint_manager(str(tmp_path / 'ckpt'))
    assert manager.latest_step() is None
    for step in (1, 2):
      manager.save(step, args=ocp.args.StandardSave(_state(step)))
    manager.wait_until_finished()
    assert manager.latest_step() == 2
    abstract = jax.eval_shape(lambda: _state(0))
    restored = manager.restore(2, args=ocp.args.StandardRestore(abstract))
    want = _state(2)
    assert (jax.tree_util.tree_structure(restored)
            == jax.tree_util.tree_structure(want))
    for got, exp in zip(jax.tree_util.tree_leaves(restored),
                        jax.tree_util.tree_leaves(want)):
      assert got.dtype == exp.dtype and got.shape == exp.shape
      np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))
    manager.close()

  def test_relative_path_and_reopen(self, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    manager = checkpoints.training_checkpoint_manager('rel/ckpt')
    assert os.path.isabs(str(manager.directory))
    manager.save(3, args=ocp.args.StandardSave(_state(3)))
    manager.wait_until_finished()
    manager.close()
    reopened = checkpoints.training_checkpoint_manager(
        str(tmp_path / 'rel' / 'ckpt'))
    assert reopened.latest_step() == 3
    restored = reopened.restore(3, args=ocp.args.StandardRestore(
        jax.eval_shape(lambda: _state(0))))
    np.testing.assert_array_equal(np.asarray(restored['params']['w']),
                                  np.asarray(_state(3)['params']['w']))
    reopened.close()

  def test_keeps_the_latest_two(self, tmp_path):
    manager = checkpoints.training_checkpoint_manager(str(tmp_path / 'ckpt'))
    for step in (1, 2, 3, 4):
      manager.save(step, args=ocp.args.StandardSave(_state(step)))
    manager.wait_until_finished()
    assert list(manager.all_steps()) == [3, 4]
    manager.close()
    keep3 = checkpoints.training_checkpoint_manager(str(tmp_path / 'k3'),
                                                    max_to_keep=3)
    for step in (1, 2, 3, 4):
      keep3.save(step, args=ocp.args.StandardSave(_state(step)))
    keep3.wait_until_finished()
    assert list(keep3.all_steps()) == [2, 3, 4]
    keep3.close()


# -----------------------------------------------------------------------------
# Any format: detect_format and restore_params.
# -----------------------------------------------------------------------------


def _assert_params_equal(got, want, dtype=jnp.float32):
  got, want = _flat(got), _flat(want)
  assert set(got) == set(want)
  for k in want:
    assert got[k].dtype == dtype, k
    np.testing.assert_array_equal(np.asarray(got[k], np.float32),
                                  np.asarray(want[k], np.float32), err_msg=k)


@pytest.fixture(scope='module')
def saved_formats(params, tmp_path_factory):
  root = tmp_path_factory.mktemp('formats')
  paths = {'compact': str(root / 'compact'), 'orbax': str(root / 'orbax'),
           't5x': str(root / 'checkpoint_3')}
  checkpoints.save_compact(paths['compact'], CFG, params, storage_dtype=jnp.float32)
  checkpoints.save_params_orbax(paths['orbax'], params)
  checkpoints.save_t5x(paths['t5x'], params, step=3)
  return paths


class TestDetectFormat:

  @pytest.mark.parametrize('fmt', ['compact', 'orbax', 't5x'])
  def test_formats(self, saved_formats, fmt):
    assert checkpoints.detect_format(saved_formats[fmt]) == fmt

  def test_training_manager_dirs_are_orbax(self, params, tmp_path):
    manager = checkpoints.training_checkpoint_manager(str(tmp_path / 'ckpt'))
    manager.save(5, args=ocp.args.StandardSave(
        {'step': jnp.asarray(5), 'params': params, 'opt_state': ()}))
    manager.wait_until_finished()
    manager.close()
    for path in (tmp_path / 'ckpt', tmp_path / 'ckpt' / '5',
                 tmp_path / 'ckpt' / '5' / 'default'):
      assert checkpoints.detect_format(str(path)) == 'orbax', path

  def test_missing_path(self, tmp_path):
    with pytest.raises(FileNotFoundError, match='No checkpoint at'):
      checkpoints.detect_format(str(tmp_path / 'nothing'))

  def test_unknown_directory(self, tmp_path):
    (tmp_path / 'notes.txt').write_text('hi')
    with pytest.raises(ValueError, match='not a checkpoint this project reads'):
      checkpoints.detect_format(str(tmp_path))

  def test_config_alone_is_not_a_model(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    os.remove(tmp_path / checkpoints.PARAMS_FILE)
    with pytest.raises(ValueError, match='not a checkpoint'):
      checkpoints.detect_format(str(tmp_path))


class TestRestoreParams:

  @pytest.mark.parametrize('fmt', ['compact', 'orbax', 't5x'])
  @pytest.mark.parametrize('dtype', [None, 'bfloat16'])
  def test_every_format(self, saved_formats, params, fmt, dtype):
    restored = checkpoints.restore_params(saved_formats[fmt], CFG, dtype=dtype)
    want = params if dtype is None else jax.tree_util.tree_map(
        lambda x: jnp.asarray(x, jnp.bfloat16), params)
    _assert_params_equal(restored, want,
                         jnp.float32 if dtype is None else jnp.bfloat16)
    device = jax.local_devices()[0]
    for x in jax.tree_util.tree_leaves(restored):
      assert isinstance(x, jax.Array) and x.devices() == {device}

  def test_compact_bfloat16_storage(self, params, tmp_path):
    checkpoints.save_compact(str(tmp_path), CFG, params)
    _, want = checkpoints.load_compact(str(tmp_path))
    _assert_params_equal(checkpoints.restore_params(str(tmp_path), CFG), want)

  def test_training_state_params(self, params, tmp_path):
    """The 'params' of a training checkpoint, without the optimizer state."""
    manager = checkpoints.training_checkpoint_manager(str(tmp_path / 'ckpt'))
    for step in (1, 2):
      manager.save(step, args=ocp.args.StandardSave(
          {'step': jnp.asarray(step),
           'params': jax.tree_util.tree_map(lambda x: x * step, params),
           'opt_state': ({'mu': jnp.ones(3)},)}))
    manager.wait_until_finished()
    manager.close()
    restored = checkpoints.restore_params(str(tmp_path / 'ckpt'), CFG)  # Latest.
    _assert_params_equal(restored, jax.tree_util.tree_map(lambda x: x * 2, params))
    restored = checkpoints.restore_params(str(tmp_path / 'ckpt' / '1'), CFG)
    _assert_params_equal(restored, params)

  def test_one_sharding_for_all(self, saved_formats, params):
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[-1])
    restored = checkpoints.restore_params(saved_formats['t5x'], CFG,
                                          shardings=sharding)
    assert all(x.sharding == sharding for x in jax.tree_util.tree_leaves(restored))
    _assert_params_equal(restored, params)

  def test_shardings_tree_must_cover_params(self, saved_formats):
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    tree = jax.tree_util.tree_map(lambda _: sharding,
                                  checkpoints.expected_params(CFG))
    del tree['decoder']['decoder_norm']
    for fmt in ('t5x', 'orbax'):
      with pytest.raises(ValueError, match=r"shardings has no entry for "
                         r"\['decoder/decoder_norm/scale'\]"):
        checkpoints.restore_params(saved_formats[fmt], CFG, shardings=tree)

  def test_dtype_must_be_floating(self, saved_formats):
    with pytest.raises(ValueError, match='floating dtype, got int32'):
      checkpoints.restore_params(saved_formats['t5x'], CFG, dtype=jnp.int32)

  @pytest.mark.parametrize('fmt', ['compact', 'orbax', 't5x'])
  def test_vocab_mismatch(self, saved_formats, fmt):
    other = network.t5_1_1_config('tiny', vocab_size=128)
    with pytest.raises(ValueError, match=r'Vocabulary size mismatch: .* 64 '
                       r'token embeddings .* config.vocab_size=128'):
      checkpoints.restore_params(saved_formats[fmt], other)

  def test_orbax_wrong_shape_and_missing_leaf(self, params, tmp_path):
    tree = flax.core.unfreeze(jax.tree_util.tree_map(np.asarray, params))
    tree['encoder']['layers_1']['mlp']['wo']['kernel'] = np.zeros((64, 31), np.float32)
    del tree['decoder']['relpos_bias']
    checkpoints.save_params_orbax(str(tmp_path / 'o'), tree)
    with pytest.raises(ValueError) as e:
      checkpoints.restore_params(str(tmp_path / 'o'), CFG)
    assert 'missing decoder/relpos_bias/rel_embedding' in str(e.value)
    assert ('encoder/layers_1/mlp/wo/kernel: shape (64, 31), expected (64, 32)'
            in str(e.value))

  def test_orbax_wrong_dtype(self, params, tmp_path):
    tree = flax.core.unfreeze(jax.tree_util.tree_map(np.asarray, params))
    tree['encoder']['encoder_norm']['scale'] = np.ones((32,), np.int32)
    checkpoints.save_params_orbax(str(tmp_path / 'o'), tree)
    with pytest.raises(ValueError, match='encoder/encoder_norm/scale .* int32'):
      checkpoints.restore_params(str(tmp_path / 'o'), CFG)

  def test_compact_config_mismatch(self, saved_formats):
    relu = network.t5_1_1_config('tiny', vocab_size=64,
                                 mlp_activations=('relu', 'linear'))
    with pytest.raises(ValueError, match='mlp_activations'):
      checkpoints.restore_params(saved_formats['compact'], relu)

  def test_save_params_orbax_refuses_existing(self, saved_formats, params):
    with pytest.raises(Exception, match='exists'):
      checkpoints.save_params_orbax(saved_formats['orbax'], params)
    checkpoints.save_params_orbax(saved_formats['orbax'], params, force=True)
    assert checkpoints.detect_format(saved_formats['orbax']) == 'orbax'

  def test_load_config_for(self, saved_formats):
    assert checkpoints.load_config_for(saved_formats['compact']) == CFG
    assert checkpoints.load_config_for(saved_formats['t5x']) is None


# Runs with 4 fake CPU devices (XLA_FLAGS only in this subprocess).
_SHARDED_SCRIPT = r'''
import os, sys
import jax
import numpy as np
import safetensors.numpy
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from specdec import checkpoints, hf_checkpoint, network, t5x_checkpoint

assert jax.device_count() == 4, jax.devices()
root = sys.argv[1]
cfg = network.t5_1_1_config('tiny', vocab_size=64)
rng = np.random.RandomState(0)
params = jax.tree_util.tree_map(
    lambda s: rng.normal(0, 0.5, s.shape).astype(np.float32),
    checkpoints.expected_params(cfg))
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ('data', 'model'))
# T5X's 1-D parameter partitioning rules.
rules = {'vocab': 'model', 'mlp': 'model', 'joined_kv': 'model', 'heads': 'model'}
shardings = jax.tree_util.tree_map(
    lambda spec: NamedSharding(mesh, P(*[rules.get(a) for a in spec])),
    network.param_logical_axes(cfg), is_leaf=lambda x: isinstance(x, P))
placed = jax.device_put(params, shardings)

# Written shard by shard from the devices.
t5x_dir = t5x_checkpoint.save(os.path.join(root, 'checkpoint_1'), placed)
checkpoints.save_params_orbax(os.path.join(root, 'orbax'), placed)
hf_dir = os.path.join(root, 'hf')
os.makedirs(hf_dir)
flat = checkpoints._flat(params)
safetensors.numpy.save_file(
    {theirs: np.ascontiguousarray(flat[ours].T if t else flat[ours])
     for ours, (theirs, t) in hf_checkpoint.name_map(cfg).items()},
    os.path.join(hf_dir, 'model.safetensors'))
import json
json.dump(dict(model_type='t5', vocab_size=64, d_model=32, d_kv=8, d_ff=64,
               num_layers=2, num_heads=4, feed_forward_proj='gated-gelu',
               tie_word_embeddings=False), open(os.path.join(hf_dir, 'config.json'), 'w'))

reads = []
for cls in (t5x_checkpoint.TensorStoreLeaf, hf_checkpoint.SafetensorsLeaf):
  def spy(self, index, _get=cls.__getitem__):
    out = _get(self, index)
    reads.append((self.where, self.shape, out.shape))
    return out
  cls.__getitem__ = spy

def check(restored, want_shardings):
  got, want = checkpoints._flat(restored), checkpoints._flat(params)
  wanted = checkpoints._flat(want_shardings)
  for k in want:
    assert got[k].sharding.is_equivalent_to(wanted[k], got[k].ndim), k
    np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=k)
  emb = got['token_embedder/embedding']
  assert {s.data.shape for s in emb.addressable_shards} == {(32, 32)}

for path in (t5x_dir, hf_dir, os.path.join(root, 'orbax')):
  reads.clear()
  check(checkpoints.restore_params(path, cfg, shardings), shardings)
  if path != os.path.join(root, 'orbax'):
    # Model-sharded leaves are read by halves, once per replica set.
    emb_reads = [r for r in reads if r[0].endswith(('embedding', 'shared.weight'))]
    assert sorted(r[2] for r in emb_reads) == [(32, 32), (32, 32)], emb_reads
    assert all(r[2] != r[1] for r in reads if 'logits_dense' in r[0] or 'lm_head' in r[0]), reads

# Another layout than the one written: replicated.
replicated = jax.tree_util.tree_map(lambda _: NamedSharding(mesh, P()), shardings)
for path in (t5x_dir, os.path.join(root, 'orbax')):
  restored = checkpoints.restore_params(path, cfg, replicated)
  for k, v in checkpoints._flat(restored).items():
    assert v.sharding.is_fully_replicated, k
    np.testing.assert_array_equal(np.asarray(v), checkpoints._flat(params)[k])
print('SHARDED OK')
'''


def test_sharded_restore_on_a_mesh(tmp_path):
  """A 2x2 mesh of CPU devices: each device holds (and reads) its shard only."""
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
             JAX_PLATFORMS='cpu')
  result = subprocess.run([sys.executable, '-c', _SHARDED_SCRIPT, str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'SHARDED OK' in result.stdout


def test_training_manager_saves_synchronously_when_asked(tmp_path):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  state = {'step': np.asarray(1), 'params': {'w': np.ones((2,), np.float32)}, 'opt_state': {}}
  for enable_async in (True, False):
    manager = checkpoints.training_checkpoint_manager(str(tmp_path / str(enable_async)),
                                                      enable_async=enable_async)
    manager.save(1, args=ocp.args.StandardSave(state))
    if not enable_async:
      # Nothing left in the background: the step is final as save returns.
      assert os.path.isdir(tmp_path / 'False' / '1')
      assert not any(p.name.endswith('-tmp') for p in (tmp_path / 'False').iterdir())
    manager.wait_until_finished()
    assert manager.all_steps() == [1]
    manager.close()
