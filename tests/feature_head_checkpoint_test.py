"""Tests for specdec/feature_head_checkpoint.py: a feature head's directory, written and read back.

A tiny random head for a tiny T5 target: saved and loaded (params, config,
draft vocabulary, the target it was made for), and each refusal: another
target, a damaged file, a directory that holds no head. The trainer's export
and the launcher's loading of a head are tested in
tests/training/feature_training_test.py and tests/loading_test.py.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import checkpoints
from specdec import feature_drafter
from specdec import feature_head_checkpoint
from specdec import network

TARGET = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                          num_decoder_layers=1, mlp_dim=32)
HEAD = feature_drafter.FeatureHeadConfig(feature_dim=16, vocab_size=64, width=8, num_heads=2, head_dim=4,
                                         mlp_dim=16)


@pytest.fixture(scope='module')
def target_params():
  return network.init_params(TARGET, jax.random.PRNGKey(0))


@pytest.fixture(scope='module')
def head_params():
  return feature_drafter.init_params(HEAD, jax.random.PRNGKey(1))


def _save(directory, head_params, target_params, **kwargs):
  feature_head_checkpoint.save(str(directory), HEAD, head_params,
                               target_sha256=feature_head_checkpoint.params_sha256(target_params), **kwargs)
  return str(directory)


def test_round_trip(tmp_path, head_params, target_params):
  directory = _save(tmp_path, head_params, target_params, draft_vocab_ids=[1, 5, 9],
                    storage_dtype=jnp.float32, extra={'train': {'steps': 3}})
  assert feature_head_checkpoint.is_head_dir(directory)
  config, params, vocab_ids, meta = feature_head_checkpoint.load(directory)
  assert config == HEAD
  for got, want in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(head_params)):
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(vocab_ids, [1, 5, 9])
  assert meta['kind'] == feature_head_checkpoint.KIND and meta['train'] == {'steps': 3}
  assert meta['target_params_sha256'] == feature_head_checkpoint.params_sha256(target_params)
  ids, vocab_meta = feature_head_checkpoint.load_vocab_ids(directory)
  np.testing.assert_array_equal(ids, [1, 5, 9])
  assert vocab_meta == meta


def test_a_head_without_a_draft_vocabulary(tmp_path, head_params, target_params):
  directory = _save(tmp_path, head_params, target_params)
  assert not os.path.exists(os.path.join(directory, feature_head_checkpoint.DRAFT_VOCAB_FILE))
  assert feature_head_checkpoint.load(directory)[2] is None
  assert feature_head_checkpoint.load_vocab_ids(directory)[0] is None


def test_another_target_is_refused(tmp_path, head_params, target_params):
  directory = _save(tmp_path, head_params, target_params)
  meta = feature_head_checkpoint.load(directory)[3]
  feature_head_checkpoint.check_made_for(meta, target_params, directory)
  other = jax.tree_util.tree_map(lambda x: x + 1.0, target_params)
  with pytest.raises(ValueError, match='trained for another target'):
    feature_head_checkpoint.check_made_for(meta, other, directory)


def test_params_sha256_reads_values_not_dtypes(target_params):
  as_bf16 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.bfloat16), target_params)
  rounded = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), as_bf16)
  assert feature_head_checkpoint.params_sha256(as_bf16) == feature_head_checkpoint.params_sha256(rounded)
  assert feature_head_checkpoint.params_sha256(rounded) != feature_head_checkpoint.params_sha256(target_params)


def test_a_damaged_file_is_refused(tmp_path, head_params, target_params):
  directory = _save(tmp_path, head_params, target_params, draft_vocab_ids=[1, 5])
  with open(os.path.join(directory, feature_head_checkpoint.DRAFT_VOCAB_FILE), 'w') as f:
    json.dump([1, 6], f)
  with pytest.raises(ValueError, match='damaged, truncated or modified'):
    feature_head_checkpoint.load(directory)
  with open(os.path.join(directory, feature_head_checkpoint.PARAMS_FILE), 'ab') as f:
    f.write(b'\0')
  with pytest.raises(ValueError, match='damaged, truncated or modified'):
    feature_head_checkpoint.load(directory)


def test_extra_metadata_may_not_replace_a_field(tmp_path, head_params, target_params):
  with pytest.raises(ValueError, match='may not replace'):
    _save(tmp_path, head_params, target_params, extra={'kind': 'something else'})


def test_a_directory_without_a_head(tmp_path, target_params):
  assert not feature_head_checkpoint.is_head_dir(str(tmp_path))
  with pytest.raises(FileNotFoundError, match='No feature head'):
    feature_head_checkpoint.load(str(tmp_path))
  checkpoints.save_compact(str(tmp_path), TARGET, target_params)
  assert not feature_head_checkpoint.is_head_dir(str(tmp_path))
  with pytest.raises(ValueError, match='not a feature head'):
    feature_head_checkpoint.load(str(tmp_path))
