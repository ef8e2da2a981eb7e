"""Tests for specdec/hf_export.py: our networks written as transformers T5 directories.

Round trips on tiny random networks: transformers' `T5ForConditionalGeneration.from_pretrained` of the export
computes our logits (float32, atol 1e-4) and our baseline's greedy decodes, and hf_checkpoint's reader gives
back the very arrays that were exported.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import torch
import transformers

from specdec import checkpoints
from specdec import decoding
from specdec import hf_checkpoint
from specdec import hf_export
from specdec import models
from specdec import network
from specdec import ngram

VOCAB = 64
ATOL = 1e-4
# Equal encoder and decoder depths: transformers 5's generate sizes its cache by the encoder's.
T5_1_1 = network.T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=2,
                          num_decoder_layers=2, mlp_dim=48, dropout_rate=0.0,
                          relative_attention_num_buckets=8, relative_attention_max_distance=20)
# Original T5: relu MLP, output through the (scaled) embedding.
ORIGINAL_T5 = network.T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=2,
                               num_decoder_layers=3, mlp_dim=48, dropout_rate=0.0, mlp_activations=('relu',),
                               logits_via_embedding=True)


def _random_params(config, seed):
  """Random params (numpy, std 0.5: logits far from ties, so greedy decodes are robust to rounding)."""
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map(lambda s: rng.normal(0, 0.5, s.shape).astype(np.float32),
                                checkpoints.expected_params(config))


def _flat(tree):
  return checkpoints._flat(tree)  # pylint: disable=protected-access


@pytest.fixture(scope='module')
def t5_1_1(tmp_path_factory):
  params = _random_params(T5_1_1, 0)
  directory = hf_export.save_hf(str(tmp_path_factory.mktemp('t5_1_1')), T5_1_1, params)
  model = transformers.T5ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
  return params, directory, model


def _batch(seed=0):
  rng = np.random.RandomState(seed)
  enc = rng.randint(2, VOCAB, size=(3, 9))
  enc[0, 6:] = 0  # padding
  enc[2, 3:] = 0
  dec = rng.randint(2, VOCAB, size=(3, 7))
  dec[:, 0] = 0  # BOS = HF's decoder_start_token_id
  return enc, dec


def _hf_logits(model, enc, dec):
  with torch.no_grad():
    return model(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0).long(),
                 decoder_input_ids=torch.tensor(dec)).logits.numpy()


def _our_logits(config, params, enc, dec):
  return np.asarray(network.Transformer(config).apply(
      {'params': params}, jnp.asarray(enc), jnp.asarray(dec), jnp.ones_like(jnp.asarray(dec)),
      enable_dropout=False))


class TestTransformersReadsTheExport:

  def test_config(self, t5_1_1):
    _, _, model = t5_1_1
    c = model.config
    assert (c.d_model, c.d_kv, c.d_ff, c.num_layers, c.num_decoder_layers, c.num_heads) == (32, 8, 48, 2, 2, 4)
    assert (c.relative_attention_num_buckets, c.relative_attention_max_distance) == (8, 20)
    assert c.feed_forward_proj == 'gated-gelu' and c.dense_act_fn == 'gelu_new'
    assert (c.decoder_start_token_id, c.pad_token_id, c.eos_token_id) == (0, 0, 1)
    assert model.generation_config.decoder_start_token_id == 0
    assert not c.scale_decoder_outputs  # T5 1.1: unscaled, own lm_head ...
    assert model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr()  # ... kept untied

  def test_logits(self, t5_1_1):
    params, _, model = t5_1_1
    enc, dec = _batch()
    want = _our_logits(T5_1_1, params, enc, dec)
    got = _hf_logits(model, enc, dec)
    assert got.shape == (3, 7, VOCAB)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)

  def test_greedy_decodes_match_our_baseline(self, t5_1_1):
    params, _, model = t5_1_1
    length = 10
    enc, _ = _batch(2)
    baseline = models.SpeculativeEncoderDecoderModel(network.Transformer(T5_1_1), None,
                                                     decode_fn=decoding.temperature_sample)
    ours, _ = baseline.compile_predict({'temperature': 0.0})(
        {'target': params}, {'encoder_input_tokens': enc.astype(np.int32),
                             'decoder_input_tokens': np.zeros((3, length), np.int32)})
    for row in range(3):  # batch 1, unpadded: as a user would call generate
      ids = torch.tensor(enc[row][enc[row] > 0][None])
      with torch.no_grad():
        hf = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=length).numpy()[0]
      assert hf[0] == 0  # decoder start = our BOS
      want = np.zeros(length, np.int64)
      want[:len(hf) - 1] = hf[1:]
      np.testing.assert_array_equal(np.asarray(ours[row]), want, err_msg=f'row {row}')

  def test_original_t5_scaled_tied(self, tmp_path):
    params = _random_params(ORIGINAL_T5, 1)
    directory = hf_export.save_hf(str(tmp_path), ORIGINAL_T5, params)
    with safetensors.safe_open(os.path.join(directory, 'model.safetensors'), 'numpy') as f:
      assert 'lm_head.weight' not in f.keys()  # tied to shared.weight
    model = transformers.T5ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    assert model.config.scale_decoder_outputs and model.config.feed_forward_proj == 'relu'
    enc, dec = _batch(1)
    np.testing.assert_allclose(_hf_logits(model, enc, dec), _our_logits(ORIGINAL_T5, params, enc, dec),
                               atol=ATOL, rtol=0)


class TestRoundTrip:

  @pytest.mark.parametrize('config, seed', [(T5_1_1, 0), (ORIGINAL_T5, 1)])
  def test_importer_gives_back_the_arrays(self, tmp_path, config, seed):
    params = _random_params(config, seed)
    directory = hf_export.save_hf(str(tmp_path), config, params)
    assert checkpoints.detect_format(directory) == 'hf'
    read_config = hf_checkpoint.config_from_hf(directory)
    assert read_config == config
    restored = _flat(checkpoints.restore_params(directory, read_config))
    assert set(restored) == set(_flat(params))
    for name, value in _flat(params).items():
      np.testing.assert_array_equal(np.asarray(restored[name]), value, err_msg=name)

  def test_bfloat16_storage(self, tmp_path):
    params = _random_params(T5_1_1, 2)
    directory = hf_export.save_hf(str(tmp_path), T5_1_1, params, dtype='bfloat16')
    with safetensors.safe_open(os.path.join(directory, 'model.safetensors'), 'numpy') as f:
      assert f.get_slice('shared.weight').get_dtype() == 'BF16'
    restored = _flat(checkpoints.restore_params(directory, T5_1_1))
    for name, value in _flat(params).items():
      np.testing.assert_array_equal(np.asarray(restored[name]),
                                    np.asarray(jnp.asarray(value, jnp.bfloat16), np.float32), err_msg=name)

  def test_compact_dir_through_the_command_line(self, tmp_path, capsys):
    params = _random_params(T5_1_1, 3)
    checkpoints.save_compact(str(tmp_path / 'model'), T5_1_1, params, storage_dtype=jnp.float32)
    out = str(tmp_path / 'hf')
    assert hf_export.main(['--model', str(tmp_path / 'model'), '--out', out]) == 0
    assert 'from_pretrained' in capsys.readouterr().out
    with open(os.path.join(out, 'config.json')) as f:
      assert json.load(f)['d_model'] == 32
    restored = _flat(checkpoints.restore_params(out, T5_1_1))
    for name, value in _flat(params).items():
      np.testing.assert_array_equal(np.asarray(restored[name]), value, err_msg=name)


class TestErrors:

  def test_ngram_drafter(self, tmp_path, capsys):
    ngram.save(str(tmp_path), ngram.NgramConfig(VOCAB, order=2), np.ones(VOCAB), np.ones((VOCAB, VOCAB)))
    with pytest.raises(ValueError, match='n-gram drafter'):
      hf_export.export(str(tmp_path), str(tmp_path / 'out'))
    assert hf_export.main(['--model', str(tmp_path), '--out', str(tmp_path / 'out')]) == 1
    assert 'n-gram drafter' in capsys.readouterr().err
    assert not os.path.exists(tmp_path / 'out')

  def test_missing_dir(self, tmp_path):
    with pytest.raises(FileNotFoundError, match='No model directory'):
      hf_export.export(str(tmp_path / 'nothing'), str(tmp_path / 'out'))

  @pytest.mark.parametrize('activations', [('gelu',), ('silu', 'linear'), ('relu', 'linear')])
  def test_activations_transformers_cannot_express(self, tmp_path, activations):
    config = dataclasses.replace(T5_1_1, mlp_activations=activations)
    with pytest.raises(ValueError, match='no Hugging Face T5 equivalent'):
      hf_export.save_hf(str(tmp_path / 'out'), config, _random_params(config, 0))
    assert not os.path.exists(tmp_path / 'out')

  def test_params_not_matching_the_config(self, tmp_path):
    params = _random_params(T5_1_1, 0)
    del params['decoder']['logits_dense']
    with pytest.raises(ValueError, match='missing decoder/logits_dense/kernel'):
      hf_export.save_hf(str(tmp_path / 'out'), T5_1_1, params)

  def test_unknown_dtype(self, tmp_path):
    with pytest.raises(ValueError, match='dtype must be one of'):
      hf_export.save_hf(str(tmp_path), T5_1_1, _random_params(T5_1_1, 0), dtype='int8')
