"""Tests for specdec/t5x_checkpoint.py: T5X checkpoint layout, paths, errors.

Round trips use the project's writer (T5X's own layout: msgpack + zarr via
TensorStore); GCS cannot be reached here, so gs:// is tested as path mapping.
"""

import os
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

from specdec import checkpoints
from specdec import network
from specdec import t5x_checkpoint

CFG = network.t5_1_1_config('tiny', vocab_size=64)
KERNEL = 'encoder/layers_0/attention/query/kernel'


@pytest.fixture(scope='module')
def params():
  rng = np.random.RandomState(0)
  return jax.tree_util.tree_map(
      lambda s: rng.normal(0, 0.5, s.shape).astype(np.float32),
      checkpoints.expected_params(CFG))


@pytest.fixture(scope='module')
def saved(params, tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('t5x') / 'checkpoint_7')
  t5x_checkpoint.save(directory, params, step=7)
  return directory


def _flat(tree):
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(tree), sep='/')


def _assert_equal(got, want):
  got, want = _flat(got), _flat(want)
  assert set(got) == set(want)
  for k in want:
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]),
                                  err_msg=k)


def _contents(directory):
  with open(os.path.join(directory, 'checkpoint'), 'rb') as f:
    return flax.serialization.msgpack_restore(f.read())


# -----------------------------------------------------------------------------
# Layout and round trips.
# -----------------------------------------------------------------------------


class TestLayout:

  def test_msgpack_and_zarr_layout(self, saved, params):
    contents = _contents(saved)
    assert contents['version'] == 3
    assert int(contents['optimizer']['state']['step']) == 7
    target = contents['optimizer']['target']
    spec = target['encoder']['layers_0']['attention']['query']['kernel']
    assert spec['driver'] == 'zarr' and spec['dtype'] == 'float32'
    # Relative to the checkpoint directory, '/' -> '.', as T5X writes it.
    assert spec['kvstore']['driver'] == 'file'
    assert spec['kvstore']['path'].rstrip('/') == (
        'target.encoder.layers_0.attention.query.kernel')
    assert list(spec['metadata']['shape']) == [32, 32]
    assert os.path.isfile(os.path.join(
        saved, 'target.encoder.layers_0.attention.query.kernel', '.zarray'))
    # Small leaves (layer norm scales, 32 floats) are inline arrays.
    scale = target['encoder']['encoder_norm']['scale']
    assert isinstance(scale, np.ndarray)
    np.testing.assert_array_equal(scale, params['encoder']['encoder_norm']['scale'])

  def test_round_trip(self, saved, params):
    _assert_equal(checkpoints.restore_params(saved, CFG), params)

  @pytest.mark.parametrize('which', ['dir', 'file', 'model_dir'])
  def test_path_forms(self, saved, params, which):
    path = {'dir': saved, 'file': os.path.join(saved, 'checkpoint'),
            'model_dir': os.path.dirname(saved)}[which]
    assert checkpoints.detect_format(path) == 't5x'
    leaves = t5x_checkpoint.open_leaves(path)
    np.testing.assert_array_equal(leaves[KERNEL][(slice(None), slice(None))],
                                  _flat(params)[KERNEL])

  def test_latest_step_of_a_model_dir(self, params, tmp_path):
    other = jax.tree_util.tree_map(lambda x: x + 1, params)
    t5x_checkpoint.save(str(tmp_path / 'checkpoint_100'), other, step=100)
    t5x_checkpoint.save(str(tmp_path / 'checkpoint_20'), params, step=20)
    (tmp_path / 'checkpoint_300').mkdir()  # Unfinished: no checkpoint file.
    assert t5x_checkpoint.checkpoint_dir_of(str(tmp_path)) == str(
        tmp_path / 'checkpoint_100')
    _assert_equal(checkpoints.restore_params(str(tmp_path), CFG), other)

  def test_moved_checkpoint_still_reads(self, saved, params, tmp_path):
    moved = str(tmp_path / 'elsewhere' / 'checkpoint_7')
    shutil.copytree(saved, moved)
    _assert_equal(checkpoints.restore_params(moved, CFG), params)

  def test_bfloat16_storage(self, params, tmp_path):
    directory = str(tmp_path / 'checkpoint_1')
    checkpoints.save_t5x(directory, params, step=1, dtype='bfloat16')
    spec = _contents(directory)['optimizer']['target']['decoder'][
        'logits_dense']['kernel']
    assert spec['dtype'] == 'bfloat16'
    restored = checkpoints.restore_params(directory, CFG)
    rounded = jax.tree_util.tree_map(
        lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32), params)
    _assert_equal(restored, rounded)
    assert {x.dtype for x in jax.tree_util.tree_leaves(restored)} == {
        jnp.dtype(jnp.float32)}
    as_bf16 = checkpoints.restore_params(directory, CFG, dtype=jnp.bfloat16)
    assert {x.dtype for x in jax.tree_util.tree_leaves(as_bf16)} == {
        jnp.dtype(jnp.bfloat16)}

  def test_inline_threshold(self, params, tmp_path):
    directory = str(tmp_path / 'checkpoint_0')
    t5x_checkpoint.save(directory, params, inline_max_bytes=0)
    target = _contents(directory)['optimizer']['target']
    assert isinstance(target['encoder']['encoder_norm']['scale'], dict)
    _assert_equal(checkpoints.restore_params(directory, CFG), params)

  def test_slices_are_read_alone(self, saved, params):
    leaf = t5x_checkpoint.open_leaves(saved)['token_embedder/embedding']
    assert isinstance(leaf, t5x_checkpoint.TensorStoreLeaf)
    assert leaf.shape == (64, 32) and leaf.dtype == np.float32
    index = (slice(16, 32), slice(8, 24))
    np.testing.assert_array_equal(
        leaf[index], params['token_embedder']['embedding'][index])

  def test_reads_checkpoints_with_other_chunks(self, params, tmp_path):
    """T5X chooses chunks by partitioning; reading ignores the stored ones."""
    directory = str(tmp_path / 'checkpoint_3')
    t5x_checkpoint.save(directory, params)
    path = os.path.join(directory, 'target.decoder.logits_dense.kernel')
    shutil.rmtree(path)
    kernel = params['decoder']['logits_dense']['kernel']
    store = ts.open({'driver': 'zarr', 'kvstore': {'driver': 'file', 'path': path},
                     'metadata': {'shape': [32, 64], 'chunks': [5, 7],
                                  'dtype': '<f4', 'compressor': None}},
                    create=True).result()
    store.write(kernel).result()
    restored = checkpoints.restore_params(directory, CFG)
    np.testing.assert_array_equal(
        np.asarray(restored['decoder']['logits_dense']['kernel']), kernel)

  def test_chunk_shape(self):
    assert t5x_checkpoint.chunk_shape((32128, 4096), 4) == [4016, 4096]
    assert t5x_checkpoint.chunk_shape((64, 32), 4) == [64, 32]
    chunks = t5x_checkpoint.chunk_shape((10240, 4096), 2, target_bytes=1 << 20)
    assert 10240 % chunks[0] == 0 and 4096 % chunks[1] == 0
    assert chunks[0] * chunks[1] * 2 <= 1 << 20


# -----------------------------------------------------------------------------
# Paths: local and gs://.
# -----------------------------------------------------------------------------


class TestPaths:

  def test_kvstore_spec(self):
    assert t5x_checkpoint.kvstore_spec('gs://t5-data/pretrained_models/x') == {
        'driver': 'gcs', 'bucket': 't5-data', 'path': 'pretrained_models/x'}
    assert t5x_checkpoint.kvstore_spec('/a/b') == {'driver': 'file',
                                                   'path': '/a/b'}
    assert t5x_checkpoint.kvstore_spec('rel')['path'] == os.path.abspath('rel')
    with pytest.raises(ValueError, match="'s3://bucket/x'"):
      t5x_checkpoint.kvstore_spec('s3://bucket/x')

  def test_relative_file_spec_on_gcs(self):
    """A checkpoint written locally, then copied to GCS: read with 'gcs'."""
    ckpt = 'gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000'
    stored = {'driver': 'zarr', 'dtype': 'float32',
              'kvstore': {'driver': 'file',
                          'path': 'target.encoder.layers_0.mlp.wo.kernel'},
              'metadata': {'chunks': [1024, 512], 'compressor': {'id': 'gzip'},
                           'shape': [1024, 512]}}
    assert t5x_checkpoint.array_spec(ckpt, stored) == {
        'driver': 'zarr', 'dtype': 'float32',
        'kvstore': {'driver': 'gcs', 'bucket': 't5-data',
                    'path': 'pretrained_models/t5x/t5_1_1_small/checkpoint_1000000/'
                            'target.encoder.layers_0.mlp.wo.kernel'}}

  def test_old_gcs_spec_read_locally(self, tmp_path):
    """tensorstore < 0.1.14 specs: top-level path, T5X's dummy bucket."""
    stored = {'driver': 'zarr', 'kvstore': {'bucket': 't5x-dummy-bucket',
                                            'driver': 'gcs'},
              'path': 'target.token_embedder.embedding',
              'metadata': {'shape': [32128, 512]}}
    spec = t5x_checkpoint.array_spec(str(tmp_path), stored)
    assert spec == {'driver': 'zarr', 'kvstore': {
        'driver': 'file',
        'path': str(tmp_path / 'target.token_embedder.embedding')}}
    gcs = t5x_checkpoint.array_spec('gs://my-bucket/run/checkpoint_5', stored)
    assert gcs['kvstore'] == {'driver': 'gcs', 'bucket': 'my-bucket',
                              'path': 'run/checkpoint_5/target.token_embedder.embedding'}

  def test_checkpoint_dir_of_gcs(self):
    ckpt = 'gs://b/m/checkpoint_1000000'
    assert t5x_checkpoint.checkpoint_dir_of(ckpt) == ckpt
    assert t5x_checkpoint.checkpoint_dir_of(ckpt + '/') == ckpt
    assert t5x_checkpoint.checkpoint_dir_of(ckpt + '/checkpoint') == ckpt
    assert checkpoints.detect_format(ckpt) == 't5x'
    assert checkpoints.detect_format(ckpt + '/checkpoint') == 't5x'
    # Other URLs are inspected through tf.io.gfile (ram:// standing in for gs://):
    # Hugging Face files are read from local disk only.
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    remote = 'ram://t5x_checkpoint_test/hf/model.safetensors'
    with tf.io.gfile.GFile(remote, 'wb') as f:
      f.write(b'')
    with pytest.raises(ValueError, match='remote storage'):
      checkpoints.detect_format(remote)

  @pytest.mark.parametrize('stored, match', [
      ({'driver': 'zarr', 'dtype': 'uint16', 'kvstore': {'driver': 'file', 'path': 'x'}},
       'uint16'),
      ({'driver': 'zarr', 'kvstore': {'driver': 's3', 'path': 'x'}}, "'s3'"),
      ({'driver': 'zarr', 'kvstore': {'driver': 'file'}}, 'no path'),
  ])
  def test_bad_specs(self, stored, match):
    with pytest.raises(ValueError, match=match):
      t5x_checkpoint.array_spec('/ckpt', stored)


# -----------------------------------------------------------------------------
# Errors.
# -----------------------------------------------------------------------------


def _rewrite(directory, edit):
  contents = _contents(directory)
  edit(contents['optimizer']['target'])
  with open(os.path.join(directory, 'checkpoint'), 'wb') as f:
    f.write(flax.serialization.msgpack_serialize(contents))


class TestErrors:

  def _copy(self, saved, tmp_path):
    directory = str(tmp_path / 'checkpoint_7')
    shutil.copytree(saved, directory)
    return directory

  def test_missing_array(self, saved, tmp_path):
    directory = self._copy(saved, tmp_path)
    shutil.rmtree(os.path.join(directory, 'target.decoder.layers_1.mlp.wo.kernel'))
    with pytest.raises(FileNotFoundError,
                       match='decoder/layers_1/mlp/wo/kernel .*missing'):
      checkpoints.restore_params(directory, CFG)

  def test_missing_chunk_names_the_leaf(self, saved, tmp_path):
    directory = self._copy(saved, tmp_path)
    path = os.path.join(directory, 'target.encoder.layers_0.mlp.wi_0.kernel')
    os.remove(os.path.join(path, '0.0'))
    # A zarr chunk that is gone reads as the fill value: T5X has the same
    # behaviour, so a corrupt chunk file is what raises.
    with open(os.path.join(path, '0.0'), 'wb') as f:
      f.write(b'not gzip')
    with pytest.raises(OSError, match='encoder/layers_0/mlp/wi_0/kernel'):
      checkpoints.restore_params(directory, CFG)

  def test_missing_checkpoint_file(self, saved, tmp_path):
    directory = self._copy(saved, tmp_path)
    os.remove(os.path.join(directory, 'checkpoint'))
    with pytest.raises(FileNotFoundError, match='No T5X checkpoint'):
      t5x_checkpoint.open_leaves(directory)
    with pytest.raises(ValueError, match='not a checkpoint this project reads'):
      checkpoints.restore_params(directory, CFG)

  def test_tensorflow_checkpoint_file(self, tmp_path):
    (tmp_path / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-1"\n')
    with pytest.raises(ValueError, match='TensorFlow'):
      t5x_checkpoint.read_contents(str(tmp_path))
    assert not t5x_checkpoint.looks_like_t5x(str(tmp_path / 'checkpoint'))

  def test_unsupported_version(self, saved, tmp_path):
    directory = self._copy(saved, tmp_path)
    with open(os.path.join(directory, 'checkpoint'), 'wb') as f:
      f.write(flax.serialization.msgpack_serialize({'version': 1, 'optimizer': {}}))
    with pytest.raises(ValueError, match='version 1'):
      checkpoints.restore_params(directory, CFG)

  def test_wrong_shape(self, saved, tmp_path):
    directory = self._copy(saved, tmp_path)
    _rewrite(directory, lambda t: t['encoder']['encoder_norm'].update(
        scale=np.ones((31,), np.float32)))
    with pytest.raises(ValueError, match=r'encoder/encoder_norm/scale: shape '
                       r'\(31,\), expected \(32,\)'):
      checkpoints.restore_params(directory, CFG)

  def test_wrong_dtype(self, saved, tmp_path):
    directory = self._copy(saved, tmp_path)
    _rewrite(directory, lambda t: t['decoder']['decoder_norm'].update(
        scale=np.ones((32,), np.int32)))
    with pytest.raises(ValueError, match='decoder/decoder_norm/scale .* int32'):
      checkpoints.restore_params(directory, CFG)

  def test_missing_leaf(self, saved, tmp_path):
    directory = self._copy(saved, tmp_path)
    _rewrite(directory, lambda t: t['encoder'].pop('relpos_bias'))
    with pytest.raises(ValueError, match='missing encoder/relpos_bias/rel_embedding'):
      checkpoints.restore_params(directory, CFG)

  def test_vocab_mismatch(self, saved):
    with pytest.raises(ValueError, match=r'Vocabulary size mismatch: .* 64 token'
                       r' embeddings .* config.vocab_size=32128'):
      checkpoints.restore_params(saved, network.t5_1_1_config(
          'tiny', vocab_size=32128))

  def test_save_refuses_existing_dir(self, saved, params):
    with pytest.raises(FileExistsError, match='checkpoint_7'):
      t5x_checkpoint.save(saved, params)

  def test_save_refuses_remote(self, params):
    with pytest.raises(ValueError, match='write locally'):
      t5x_checkpoint.save('gs://bucket/checkpoint_1', params)

  def test_interrupted_save_leaves_no_checkpoint(self, params, tmp_path,
                                                 monkeypatch):
    directory = str(tmp_path / 'checkpoint_9')

    def fail(*args, **kwargs):
      raise OSError('disk full')

    monkeypatch.setattr(flax.serialization, 'msgpack_serialize', fail)
    with pytest.raises(OSError, match='disk full'):
      t5x_checkpoint.save(directory, params)
    assert not os.path.exists(directory)
    assert not t5x_checkpoint.looks_like_t5x(str(tmp_path))
    monkeypatch.undo()
    t5x_checkpoint.save(directory, params)  # Replaces the leftover temp dir.
    _assert_equal(checkpoints.restore_params(directory, CFG), params)
