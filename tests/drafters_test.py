"""Tests for specdec/drafters.py: every drafter answers the same questions, each kind as the loop needs it. (That
the refactored callers compile the same decode programs as before was checked by hashing their lowered text;
whole decodes through each kind are tested in models_test.py and feature_decoding_test.py.)"""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from specdec import drafters
from specdec import feature_drafter
from specdec import models
from specdec import network
from specdec import ngram
from specdec.bench import oracle
from specdec import partitioning

VOCAB = 32
TARGET = network.t5_1_1_config('tiny', vocab_size=VOCAB, emb_dim=32, num_heads=2, head_dim=16, num_encoder_layers=1,
                               num_decoder_layers=1, mlp_dim=64)
T5 = network.t5_1_1_config('tiny', vocab_size=VOCAB, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                           num_decoder_layers=1, mlp_dim=32)


def _head(width=16):
  return feature_drafter.FeatureHead(feature_drafter.FeatureHeadConfig(
      feature_dim=TARGET.emb_dim, vocab_size=VOCAB, width=width, num_layers=1, num_heads=2, head_dim=8, mlp_dim=32))


def test_each_module_has_its_kind():
  assert drafters.kind_of(network.Transformer(T5)) is drafters.INDEPENDENT
  assert drafters.kind_of(ngram.NgramLM(ngram.NgramConfig(VOCAB, order=2))) is drafters.INDEPENDENT
  assert drafters.kind_of(oracle.OracleDrafter(oracle.OracleConfig(VOCAB))) is drafters.INDEPENDENT
  assert drafters.kind_of(_head()) is drafters.FEATURE_HEAD
  assert drafters.FEATURE_HEAD.reads_features and not drafters.INDEPENDENT.reads_features
  assert drafters.FEATURE_HEAD.scores_itself() is False and drafters.INDEPENDENT.scores_itself() is True


def test_only_neural_drafters_take_a_trimmed_vocabulary():
  assert drafters.INDEPENDENT.takes_vocab_ids(network.Transformer(T5))
  assert not drafters.INDEPENDENT.takes_vocab_ids(ngram.NgramLM(ngram.NgramConfig(VOCAB, order=2)))
  assert drafters.FEATURE_HEAD.takes_vocab_ids(_head())


def test_checks_refuse_another_vocabulary_and_a_head_of_another_width():
  target = network.Transformer(TARGET)
  other = network.Transformer(network.t5_1_1_config('tiny', vocab_size=VOCAB + 1))
  with pytest.raises(ValueError, match='Vocabulary mismatch.*33'):
    drafters.INDEPENDENT.check(other, target)
  drafters.FEATURE_HEAD.check(_head(), target)
  wrong = feature_drafter.FeatureHead(feature_drafter.FeatureHeadConfig(
      feature_dim=TARGET.emb_dim + 8, vocab_size=VOCAB, width=16, num_layers=1, num_heads=2, head_dim=8, mlp_dim=32))
  with pytest.raises(ValueError):
    drafters.FEATURE_HEAD.check(wrong, target)


def test_fresh_params_are_each_kinds_own():
  rng = jax.random.PRNGKey(0)
  t5 = drafters.INDEPENDENT.init_params(network.Transformer(T5), rng, 8, 8)
  assert jax.tree_util.tree_structure(t5) == jax.tree_util.tree_structure(network.init_params(T5, rng))
  head = _head()
  assert (jax.tree_util.tree_structure(drafters.FEATURE_HEAD.init_params(head, rng, 8, 8))
          == jax.tree_util.tree_structure(feature_drafter.init_params(head.config, rng)))


def test_what_is_prepared_once_per_run():
  target, t5, ids = network.Transformer(TARGET), network.Transformer(T5), np.arange(0, VOCAB, 4)
  target_params = network.init_params(TARGET, jax.random.PRNGKey(1))
  t5_params = network.init_params(T5, jax.random.PRNGKey(2))
  assert drafters.INDEPENDENT.prepared_projection(target, t5, None) is None  # nothing to slice
  out = drafters.INDEPENDENT.prepared_projection(target, t5, ids)(target_params, t5_params)
  # The drafter's own projection's columns, not the target's.
  np.testing.assert_allclose(out[drafters.DRAFT_PROJECTION],
                             t5.apply({'params': t5_params}, ids, method=t5.projection_rows))
  narrow, wide = _head(width=16), _head(width=TARGET.emb_dim)
  head_params = feature_drafter.init_params(narrow.config, jax.random.PRNGKey(3))
  assert drafters.FEATURE_HEAD.folds_projection(narrow) and not drafters.FEATURE_HEAD.folds_projection(wide)
  folded = drafters.FEATURE_HEAD.prepared_projection(target, narrow, None)(target_params, head_params)
  assert folded[drafters.DRAFT_LOGITS_KERNEL].shape == (16, VOCAB)  # [W, V]: the whole vocabulary folded
  assert drafters.FEATURE_HEAD.prepared_projection(target, wide, None) is None
  sliced = drafters.FEATURE_HEAD.prepared_projection(target, wide, ids)(
      target_params, feature_drafter.init_params(wide.config, jax.random.PRNGKey(4)))
  np.testing.assert_allclose(sliced[drafters.DRAFT_PROJECTION],  # the target's projection, for a head
                             target.apply({'params': target_params}, ids, method=target.projection_rows))
  assert models.DRAFT_PROJECTION == drafters.DRAFT_PROJECTION


def test_logical_axes_of_each_kind():
  head = _head()
  assert drafters.FEATURE_HEAD.param_logical_axes(head) == feature_drafter.param_logical_axes(head.config)
  assert drafters.INDEPENDENT.param_logical_axes(network.Transformer(T5)) is None
  table = ngram.NgramLM(ngram.NgramConfig(VOCAB, order=2))
  axes = partitioning.param_logical_axes(table, {'log_probs': np.zeros((VOCAB, VOCAB))})
  assert axes == {'log_probs': PartitionSpec()}  # a table is replicated
