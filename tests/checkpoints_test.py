"""Tests for specdec/checkpoints.py: the compact format and Orbax training state.

CPU, float32, the 'tiny' preset with a small vocabulary (the format does not
depend on the size).
"""

import json
import os

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
  """Overwrites params.msgpack with `tree` (float32), keeping config.json."""
  stored = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), tree)
  with open(os.path.join(directory, checkpoints.PARAMS_FILE), 'wb') as f:
    f.write(flax.serialization.msgpack_serialize(stored))


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

  def test_atomic_write_replaces_file(self, tmp_path):
    path = tmp_path / 'sub' / 'file.bin'
    checkpoints.atomic_write(str(path), b'first, longer contents')
    checkpoints.atomic_write(str(path), b'second')
    assert path.read_bytes() == b'second'
    assert os.listdir(tmp_path / 'sub') == ['file.bin']

  def test_writes_go_through_a_rename(self, tmp_path, monkeypatch):
    """The destination only ever appears complete (os.replace of a temp file)."""
    renames = []
    real_replace = os.replace

    def spy(src, dst):
      renames.append((src, dst, open(src, 'rb').read()))
      real_replace(src, dst)

    monkeypatch.setattr(os, 'replace', spy)
    path = tmp_path / 'file.bin'
    checkpoints.atomic_write(str(path), b'payload')
    assert len(renames) == 1
    src, dst, data = renames[0]
    assert os.path.abspath(dst) == str(path)
    assert os.path.dirname(src) == str(tmp_path)  # Same filesystem.
    assert src != dst and data == b'payload'


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
