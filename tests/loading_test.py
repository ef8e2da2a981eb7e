"""Tests for specdec/loading.py: a model directory or checkpoint of any kind as (module, params)."""

import os

import jax
import numpy as np
import pytest

from specdec import checkpoints
from specdec import feature_drafter
from specdec import feature_head_checkpoint
from specdec import loading
from specdec import network
from specdec import ngram

CFG = network.t5_1_1_config('tiny', vocab_size=64)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def params():
  return network.init_params(CFG, jax.random.PRNGKey(0))


def _assert_same_params(got, want):
  got_flat = jax.tree_util.tree_leaves_with_path(got)
  want_flat = jax.tree_util.tree_leaves_with_path(want)
  assert [k for k, _ in got_flat] == [k for k, _ in want_flat]
  for (_, a), (_, b) in zip(got_flat, want_flat):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_compact_model_is_a_transformer(params, tmp_path):
  checkpoints.save_compact(str(tmp_path), CFG, params)
  module, loaded = loading.load_module_and_params(str(tmp_path))
  assert isinstance(module, network.Transformer) and module.config == CFG
  _, expected = checkpoints.load_compact(str(tmp_path))
  for got, want in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_ngram_drafter_is_an_ngram_lm(tmp_path):
  config = ngram.NgramConfig(vocab_size=CFG.vocab_size)
  ngram.save(str(tmp_path), config, np.ones(CFG.vocab_size, np.float32), np.zeros((0, 3), np.int64))
  module, loaded = loading.load_module_and_params(str(tmp_path))
  assert isinstance(module, ngram.NgramLM) and module.config == config
  np.testing.assert_array_equal(np.asarray(loaded['log_probs']),
                                np.asarray(ngram.load(str(tmp_path))[1]['log_probs']))


def test_missing_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match='No model directory at'):
    loading.load_module_and_params(str(tmp_path / 'no_model'))


@pytest.mark.parametrize('content, match', [
    (b'{"config": {"vocab', 'damaged or incomplete config file'),
    (b'[1, 2]', 'a JSON list, expected an object'),
    (b'{}', "no 'config' object"),
])
def test_damaged_config_names_the_file(params, tmp_path, content, match):
  checkpoints.save_compact(str(tmp_path), CFG, params)
  path = tmp_path / checkpoints.CONFIG_FILE
  path.write_bytes(content)
  with pytest.raises(ValueError, match=match) as e:
    loading.load_module_and_params(str(tmp_path))
  assert str(e.value).startswith(f'{path}: ')


@pytest.mark.parametrize('name, kind', [('target', network.Transformer), ('bigram', ngram.NgramLM)])
def test_shipped_models(name, kind):
  module, _ = loading.load_module_and_params(os.path.join(REPO, 'models', 'cpu', name))
  assert isinstance(module, kind)


def test_feature_head_with_its_vocabulary_and_target(params, tmp_path):
  head_config = feature_drafter.FeatureHeadConfig(feature_dim=CFG.emb_dim, vocab_size=CFG.vocab_size,
                                                  width=8, num_heads=2, head_dim=4, mlp_dim=16)
  head_params = feature_drafter.init_params(head_config, jax.random.PRNGKey(1))
  feature_head_checkpoint.save(str(tmp_path), head_config, head_params,
                               target_sha256=feature_head_checkpoint.params_sha256(params),
                               draft_vocab_ids=[1, 5, 9])
  module, loaded, vocab_ids = loading.load_drafter(str(tmp_path), params)
  assert isinstance(module, feature_drafter.FeatureHead) and module.config == head_config
  np.testing.assert_array_equal(vocab_ids, [1, 5, 9])
  module2, _ = loading.load_module_and_params(str(tmp_path))
  assert module2.config == head_config
  other = jax.tree_util.tree_map(lambda x: x * 2.0, params)
  with pytest.raises(ValueError, match='trained for another target'):
    loading.load_drafter(str(tmp_path), other)
  # A damaged vocabulary file is named.
  with open(tmp_path / 'draft_vocab.json', 'w') as f:
    f.write('[1, 5, 10]')
  with pytest.raises(ValueError, match='draft_vocab.json'):
    loading.load_drafter(str(tmp_path))


def test_restore_gives_a_heads_draft_vocabulary_and_refuses_another_targets_head(params, tmp_path):
  head_config = feature_drafter.FeatureHeadConfig(feature_dim=CFG.emb_dim, vocab_size=CFG.vocab_size,
                                                  width=8, num_heads=2, head_dim=4, mlp_dim=16)
  feature_head_checkpoint.save(str(tmp_path / 'head'), head_config,
                               feature_drafter.init_params(head_config, jax.random.PRNGKey(1)),
                               target_sha256=feature_head_checkpoint.params_sha256(params), draft_vocab_ids=[1, 7])
  restored = loading.restore(str(tmp_path / 'head'), target_params=params)
  assert restored.format == 'feature_head' and isinstance(restored.module, feature_drafter.FeatureHead)
  np.testing.assert_array_equal(restored.draft_vocab_ids, [1, 7])
  checkpoints.save_compact(str(tmp_path / 't5'), CFG, params)
  assert loading.restore(str(tmp_path / 't5')).draft_vocab_ids is None
  with pytest.raises(ValueError, match='another target'):
    loading.restore(str(tmp_path / 'head'), target_params=jax.tree_util.tree_map(lambda x: x + 1.0, params))


def test_model_path_takes_a_directory_or_a_name_in_the_models_dir(tmp_path):
  (tmp_path / 'models' / 'bigram').mkdir(parents=True)
  (tmp_path / 'elsewhere').mkdir()
  models = str(tmp_path / 'models')
  assert loading.model_path('bigram', models) == os.path.join(models, 'bigram')
  assert loading.model_path(str(tmp_path / 'elsewhere'), models) == str(tmp_path / 'elsewhere')
  with pytest.raises(FileNotFoundError, match=r"'trigram' is neither a model directory nor a model in .*models"):
    loading.model_path('trigram', models)


# -----------------------------------------------------------------------------
# restore: any checkpoint the launcher takes
# -----------------------------------------------------------------------------


def test_restore_compact(params, tmp_path):
  checkpoints.save_compact(str(tmp_path), CFG, params, storage_dtype=np.float32)
  restored = loading.restore(str(tmp_path))
  assert restored.format == 'compact' and loading.checkpoint_format(str(tmp_path)) == 'compact'
  assert isinstance(restored.module, network.Transformer) and restored.module.config == CFG
  _assert_same_params(restored.params, params)


def test_restore_ngram(tmp_path):
  config = ngram.NgramConfig(CFG.vocab_size, order=2)
  unigram, bigram = ngram.count([[5, 6, 7, 1], [5, 7, 1]], CFG.vocab_size)
  ngram.save(str(tmp_path), config, unigram, bigram)
  restored = loading.restore(str(tmp_path))
  assert restored.format == 'ngram' and restored.draft_vocab_ids is None
  assert isinstance(restored.module, ngram.NgramLM) and restored.module.config == config
  assert restored.params['log_probs'].shape == (CFG.vocab_size, CFG.vocab_size)


def test_restore_missing_and_empty(tmp_path):
  with pytest.raises(FileNotFoundError, match='nothing_here'):
    loading.restore(str(tmp_path / 'nothing_here'))
  with pytest.raises(ValueError, match='No checkpoint given'):
    loading.restore('')
  with pytest.raises(ValueError, match='is not a checkpoint this project reads'):
    loading.restore(str(tmp_path))


def test_restore_t5x_needs_a_config(params, tmp_path):
  path = checkpoints.save_t5x(str(tmp_path / 'checkpoint_7'), params, step=7)
  restored = loading.restore(path, CFG)
  assert restored.format == 't5x'
  assert isinstance(restored.module, network.Transformer) and restored.module.config == CFG
  _assert_same_params(restored.params, params)
  with pytest.raises(ValueError, match=r'\(t5x format\) carries no network config'):
    loading.restore(path)


def test_the_format_is_detected_once(params, tmp_path, monkeypatch):
  path = checkpoints.save_t5x(str(tmp_path / 'checkpoint_7'), params, step=7)
  calls = []
  detect = checkpoints.detect_format
  monkeypatch.setattr(checkpoints, 'detect_format', lambda p: calls.append(p) or detect(p))
  loading.restore(path, CFG)
  assert len(calls) == 1
