"""Tests for specdec/hf_checkpoint.py: Hugging Face T5 onto the T5X param tree.

Parity with `transformers` (PyTorch, CPU, float32) on random tiny models
written by `save_pretrained`: teacher-forced logits and greedy decodes.
"""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from specdec import checkpoints
from specdec import decoding
from specdec import hf_checkpoint
from specdec import network

VOCAB, EMB, MLP, HEADS, HEAD_DIM = 64, 32, 48, 4, 8
BUCKETS, MAX_DISTANCE = 8, 20
ATOL = 1e-4


def _hf_config(**overrides):
  fields = dict(vocab_size=VOCAB, d_model=EMB, d_kv=HEAD_DIM, d_ff=MLP,
                num_layers=2, num_decoder_layers=3, num_heads=HEADS,
                relative_attention_num_buckets=BUCKETS,
                relative_attention_max_distance=MAX_DISTANCE,
                dropout_rate=0.0, decoder_start_token_id=0,
                eos_token_id=1, pad_token_id=0)
  fields.update(overrides)
  return transformers.T5Config(**fields)


def _save(model, directory, **kwargs):
  model.save_pretrained(str(directory), **kwargs)
  return str(directory)


@pytest.fixture(scope='module')
def t5_1_1(tmp_path_factory):
  """A T5 1.1 model (gated-gelu, own lm_head, unscaled) in sharded safetensors."""
  torch.manual_seed(0)
  model = transformers.T5ForConditionalGeneration(
      _hf_config(feed_forward_proj='gated-gelu', tie_word_embeddings=False))
  # transformers >= 5 ties lm_head to shared even for T5 1.1; untie it, as
  # in the released google/t5-v1_1-* checkpoints.
  model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, EMB))
  model.eval()
  directory = _save(model, tmp_path_factory.mktemp('t5_1_1'),
                    max_shard_size='20KB')
  return model, directory


@pytest.fixture(scope='module')
def t5_1_1_params(t5_1_1):
  _, directory = t5_1_1
  config = hf_checkpoint.config_from_hf(directory)
  return config, checkpoints.restore_params(directory, config)


@pytest.fixture(scope='module')
def original_t5(tmp_path_factory):
  """Original T5: relu MLP, tied embeddings, decoder output scaled."""
  torch.manual_seed(1)
  model = transformers.T5ForConditionalGeneration(
      _hf_config(feed_forward_proj='relu')).eval()
  return model, _save(model, tmp_path_factory.mktemp('t5'))


def _batch(seed=0):
  rng = np.random.RandomState(seed)
  enc = rng.randint(2, VOCAB, size=(3, 9))
  enc[0, 6:] = 0  # Padding.
  enc[2, 3:] = 0
  dec = rng.randint(2, VOCAB, size=(3, 7))
  dec[:, 0] = 0  # BOS, as HF's decoder_start_token_id.
  return enc, dec


def _hf_logits(model, enc, dec):
  with torch.no_grad():
    return model(input_ids=torch.tensor(enc),
                 attention_mask=torch.tensor(enc > 0).long(),
                 decoder_input_ids=torch.tensor(dec)).logits.numpy()


def _our_logits(config, params, enc, dec):
  apply = jax.jit(functools.partial(network.Transformer(config).apply,
                                    enable_dropout=False))
  # Every decoder position is a target (no padding), as HF's default mask.
  return np.asarray(apply({'params': params}, jnp.asarray(enc),
                          jnp.asarray(dec), jnp.ones_like(jnp.asarray(dec))))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy(config, params, encoder_tokens, length):
  """Our greedy decodes [B, length]: encode once, cache, temperature_sample."""
  module = network.Transformer(config)
  encoded = module.apply({'params': params}, encoder_tokens,
                         enable_dropout=False, method=module.encode)
  _, variables = module.apply({'params': params}, encoded, encoder_tokens,
                              length, method=module.init_cache,
                              mutable=['cache'])

  def tokens_to_logits(state):
    logits, new_vars = module.apply(
        {'params': params, 'cache': state.cache}, state.cur_token,
        state.cur_index, method=module.decode_step, mutable=['cache'])
    return logits, new_vars['cache']

  decodes, _ = decoding.temperature_sample(
      jnp.zeros((encoder_tokens.shape[0], length), jnp.int32),
      variables['cache'], tokens_to_logits, eos_id=1, temperature=0.0)
  return decodes[:, -1]  # The best (only) decode of each row.


def _flat(tree):
  return checkpoints._flat(tree)  # pylint: disable=protected-access


def _write_hf_dir(directory, config_dict, tensors):
  """An HF directory by hand: config.json and one model.safetensors."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump(config_dict, f)
  safetensors.numpy.save_file(
      {k: np.ascontiguousarray(v) for k, v in tensors.items()},
      os.path.join(directory, 'model.safetensors'))
  return str(directory)


def _hf_tensors(config, params):
  """Our params -> HF-named numpy tensors (the inverse of name_map)."""
  flat = _flat(params)
  return {theirs: (np.asarray(flat[ours]).T if transposed
                   else np.asarray(flat[ours]))
          for ours, (theirs, transposed)
          in hf_checkpoint.name_map(config).items()}


TINY = network.t5_1_1_config('tiny', vocab_size=VOCAB)


@pytest.fixture(scope='module')
def tiny_params():
  """Random params of TINY (numpy: no init to compile)."""
  rng = np.random.RandomState(3)
  return jax.tree_util.tree_map(
      lambda s: rng.normal(0, 0.5, s.shape).astype(np.float32),
      checkpoints.expected_params(TINY))


def _t5_1_1_config_dict(**overrides):
  fields = dict(model_type='t5', vocab_size=VOCAB, d_model=EMB, d_kv=HEAD_DIM,
                d_ff=MLP, num_layers=2, num_decoder_layers=2, num_heads=HEADS,
                relative_attention_num_buckets=BUCKETS,
                relative_attention_max_distance=MAX_DISTANCE,
                feed_forward_proj='gated-gelu', tie_word_embeddings=False,
                layer_norm_epsilon=1e-6, is_encoder_decoder=True)
  fields.update(overrides)
  return fields


# -----------------------------------------------------------------------------
# Parity with transformers.
# -----------------------------------------------------------------------------


class TestParity:

  def test_t5_1_1_logits(self, t5_1_1, t5_1_1_params):
    model, _ = t5_1_1
    config, params = t5_1_1_params
    enc, dec = _batch()
    want = _hf_logits(model, enc, dec)
    got = _our_logits(config, params, enc, dec)
    assert got.shape == want.shape == (3, 7, VOCAB)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)

  def test_original_t5_tied_scaled_logits(self, original_t5):
    model, directory = original_t5
    config = hf_checkpoint.config_from_hf(directory)
    assert config.mlp_activations == ('relu',)
    assert config.logits_via_embedding
    params = checkpoints.restore_params(directory, config)
    assert 'logits_dense' not in params['decoder']
    enc, dec = _batch(1)
    np.testing.assert_allclose(_our_logits(config, params, enc, dec),
                               _hf_logits(model, enc, dec), atol=ATOL, rtol=0)

  def test_greedy_decodes(self, t5_1_1, t5_1_1_params):
    model, _ = t5_1_1
    config, params = t5_1_1_params
    enc, _ = _batch(2)
    length = 10
    with torch.no_grad():
      # use_cache=False: transformers 5's cache assumes as many decoder
      # layers as encoder layers (IndexError otherwise); greedy is the same.
      hf = model.generate(input_ids=torch.tensor(enc),
                          attention_mask=torch.tensor(enc > 0).long(),
                          do_sample=False, num_beams=1, use_cache=False,
                          max_new_tokens=length).numpy()
    # HF starts decodes with decoder_start_token_id 0: our BOS.
    assert (hf[:, 0] == 0).all()
    want = np.zeros((enc.shape[0], length), np.int64)
    want[:, :hf.shape[1] - 1] = hf[:, 1:]  # HF pads finished rows with 0.

    decodes = _greedy(config, params, jnp.asarray(enc), length)
    np.testing.assert_array_equal(np.asarray(decodes), want)


# -----------------------------------------------------------------------------
# Config.
# -----------------------------------------------------------------------------


class TestConfigFromHf:

  def test_fields(self, t5_1_1):
    _, directory = t5_1_1
    config = hf_checkpoint.config_from_hf(directory)
    assert config == network.T5Config(
        vocab_size=VOCAB, emb_dim=EMB, num_heads=HEADS, head_dim=HEAD_DIM,
        mlp_dim=MLP, num_encoder_layers=2, num_decoder_layers=3,
        mlp_activations=('gelu', 'linear'), dropout_rate=0.0,
        logits_via_embedding=False, relative_attention_num_buckets=BUCKETS,
        relative_attention_max_distance=MAX_DISTANCE)
    assert checkpoints.load_config_for(directory) == config

  def test_overrides_and_defaults(self):
    config = hf_checkpoint.config_from_hf(
        _t5_1_1_config_dict(num_decoder_layers=None), dtype='bfloat16')
    assert config.dtype == jnp.bfloat16
    assert config.num_decoder_layers == 2

  def test_released_t5_1_1_config(self):
    """The fields of google/t5-v1_1-small's config.json (transformers 4)."""
    config = hf_checkpoint.config_from_hf(dict(
        d_ff=1024, d_kv=64, d_model=512, dropout_rate=0.1,
        feed_forward_proj='gated-gelu', initializer_factor=1.0,
        is_encoder_decoder=True, layer_norm_epsilon=1e-06, model_type='t5',
        num_decoder_layers=8, num_heads=6, num_layers=8,
        relative_attention_num_buckets=32, tie_word_embeddings=False,
        vocab_size=32128))
    assert config == network.t5_1_1_config('small')

  @pytest.mark.parametrize('overrides, match', [
      ({'feed_forward_proj': 'gelu'}, "feed_forward_proj 'gelu'"),
      ({'feed_forward_proj': 'gated-silu'}, "feed_forward_proj 'gated-silu'"),
      ({'model_type': 'bart'}, "model_type 'bart'"),
      ({'model_type': 'umt5'}, "model_type 'umt5'"),
      ({'is_encoder_decoder': False}, 'is_encoder_decoder'),
      ({'layer_norm_epsilon': 1e-5}, 'layer_norm_epsilon'),
  ])
  def test_unsupported(self, overrides, match):
    with pytest.raises(ValueError, match=match):
      hf_checkpoint.config_from_hf(_t5_1_1_config_dict(**overrides))

  @pytest.mark.parametrize('fields, scaled', [
      ({}, True),  # transformers 4 default: tied, scaled.
      ({'tie_word_embeddings': False}, False),
      ({'tie_word_embeddings': True, 'scale_decoder_outputs': False}, False),
      ({'tie_word_embeddings': True, 'scale_decoder_outputs': True}, True),
  ])
  def test_output_scaling(self, fields, scaled):
    assert hf_checkpoint.scales_decoder_output(fields) == scaled

  def test_missing_config(self, tmp_path):
    with pytest.raises(FileNotFoundError, match='config.json'):
      hf_checkpoint.config_from_hf(str(tmp_path))


# -----------------------------------------------------------------------------
# Reading: names, slices, dtypes.
# -----------------------------------------------------------------------------


class TestReading:

  def test_name_map_covers_every_param(self):
    for logits_via_embedding in (False, True):
      config = network.t5_1_1_config('tiny', vocab_size=VOCAB,
                                      logits_via_embedding=logits_via_embedding)
      names = hf_checkpoint.name_map(config)
      assert set(names) == set(_flat(checkpoints.expected_params(config)))
      assert len({theirs for theirs, _ in names.values()}) == len(names)
    assert names['encoder/layers_1/attention/query/kernel'] == (
        'encoder.block.1.layer.0.SelfAttention.q.weight', True)
    assert names['decoder/layers_0/encoder_decoder_attention/out/kernel'] == (
        'decoder.block.0.layer.1.EncDecAttention.o.weight', True)
    assert names['decoder/layers_1/mlp/wi_1/kernel'] == (
        'decoder.block.1.layer.2.DenseReluDense.wi_1.weight', True)
    assert names['decoder/relpos_bias/rel_embedding'] == (
        'decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
        True)

  def test_transposed_slices(self, t5_1_1):
    _, directory = t5_1_1
    leaves = hf_checkpoint.open_leaves(directory)
    leaf = leaves['decoder/logits_dense/kernel']
    assert leaf.shape == (EMB, VOCAB)
    full = leaf[(slice(None), slice(None))]
    files = hf_checkpoint.weight_files(directory)
    with safetensors.safe_open(files['lm_head.weight'], 'numpy') as f:
      np.testing.assert_array_equal(full, f.get_tensor('lm_head.weight').T)
    index = (slice(8, 16), slice(32, 64))
    np.testing.assert_array_equal(leaf[index], full[index])
    scale = leaves['encoder/encoder_norm/scale']
    np.testing.assert_array_equal(scale[(slice(4, 8),)],
                                  scale[(slice(None),)][4:8])

  def test_round_trip_and_tied_lm_head(self, tmp_path, tiny_params):
    """Without lm_head.weight, logits_dense is shared.weight (transformers 5)."""
    config, params = TINY, tiny_params
    tensors = _hf_tensors(config, params)
    config_dict = _t5_1_1_config_dict(d_ff=config.mlp_dim,
                                      relative_attention_num_buckets=32,
                                      relative_attention_max_distance=128)
    restored = checkpoints.restore_params(
        _write_hf_dir(tmp_path / 'untied', config_dict, tensors), config)
    for k, v in _flat(params).items():
      np.testing.assert_array_equal(np.asarray(_flat(restored)[k]),
                                    np.asarray(v), err_msg=k)
    del tensors['lm_head.weight']
    tied = checkpoints.restore_params(
        _write_hf_dir(tmp_path / 'tied', dict(
            config_dict, tie_word_embeddings=True,
            scale_decoder_outputs=False), tensors), config)
    np.testing.assert_array_equal(
        np.asarray(tied['decoder']['logits_dense']['kernel']),
        np.asarray(params['token_embedder']['embedding']).T)

  def test_bfloat16_file_and_dtype_cast(self, tmp_path, tiny_params):
    config, params = TINY, tiny_params
    tensors = {k: v.astype(jnp.bfloat16)
               for k, v in _hf_tensors(config, params).items()}
    directory = _write_hf_dir(tmp_path, _t5_1_1_config_dict(
        d_ff=config.mlp_dim, relative_attention_num_buckets=32,
        relative_attention_max_distance=128), tensors)
    for dtype, want_dtype in ((None, jnp.float32), ('bfloat16', jnp.bfloat16)):
      restored = checkpoints.restore_params(directory, config, dtype=dtype)
      for k, v in _flat(params).items():
        got = _flat(restored)[k]
        assert got.dtype == want_dtype, k
        np.testing.assert_array_equal(
            np.asarray(got, np.float32),
            np.asarray(jnp.asarray(v, jnp.bfloat16), np.float32), err_msg=k)


# -----------------------------------------------------------------------------
# Errors.
# -----------------------------------------------------------------------------


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


class TestErrors:

  def test_missing_shard(self, t5_1_1, tmp_path):
    directory = _copy(t5_1_1[1], tmp_path / 'm')
    files = hf_checkpoint.weight_files(directory)
    victim = files['decoder.block.2.layer.2.DenseReluDense.wo.weight']
    os.remove(victim)
    with pytest.raises(FileNotFoundError, match=os.path.basename(victim)):
      checkpoints.restore_params(directory, hf_checkpoint.config_from_hf(directory))

  def test_no_weights(self, t5_1_1, tmp_path):
    directory = _copy(t5_1_1[1], tmp_path / 'm')
    for name in os.listdir(directory):
      if name.endswith('.safetensors') or name.endswith('.json') and 'index' in name:
        os.remove(os.path.join(directory, name))
    (tmp_path / 'm' / 'pytorch_model.bin').write_bytes(b'')
    with pytest.raises(FileNotFoundError, match='pytorch_model.bin'):
      hf_checkpoint.open_leaves(directory)

  def test_missing_tensor(self, tmp_path, tiny_params):
    config = TINY
    tensors = _hf_tensors(config, tiny_params)
    del tensors['encoder.block.1.layer.1.DenseReluDense.wi_0.weight']
    directory = _write_hf_dir(tmp_path, _t5_1_1_config_dict(
        d_ff=config.mlp_dim, relative_attention_num_buckets=32,
        relative_attention_max_distance=128), tensors)
    with pytest.raises(ValueError, match=r'encoder.block.1.layer.1.DenseReluDense.'
                       r'wi_0.weight \(for encoder/layers_1/mlp/wi_0/kernel\)'):
      checkpoints.restore_params(directory, config)

  @pytest.fixture(autouse=True)
  def _params(self, tiny_params):
    self.params = tiny_params

  def _write(self, tmp_path, edit, **config_overrides):
    config = TINY
    tensors = _hf_tensors(config, self.params)
    edit(tensors)
    fields = dict(d_ff=config.mlp_dim, relative_attention_num_buckets=32,
                  relative_attention_max_distance=128)
    fields.update(config_overrides)
    return config, _write_hf_dir(tmp_path, _t5_1_1_config_dict(**fields), tensors)

  def test_unexpected_tensor(self, tmp_path):
    config, directory = self._write(
        tmp_path, lambda t: t.update({'encoder.block.0.layer.2.extra.weight':
                                      np.zeros((2, 2), np.float32)}))
    with pytest.raises(ValueError, match='encoder.block.0.layer.2.extra.weight'):
      checkpoints.restore_params(directory, config)

  def test_wrong_shape(self, tmp_path):
    name = 'decoder.block.0.layer.0.SelfAttention.k.weight'
    config, directory = self._write(
        tmp_path, lambda t: t.update({name: np.zeros((EMB, EMB + 1), np.float32)}))
    with pytest.raises(ValueError, match=r'decoder/layers_0/self_attention/key/'
                       r'kernel: shape \(33, 32\), expected \(32, 32\)'):
      checkpoints.restore_params(directory, config)

  def test_wrong_dtype(self, tmp_path):
    name = 'encoder.final_layer_norm.weight'
    config, directory = self._write(
        tmp_path, lambda t: t.update({name: np.ones((EMB,), np.int32)}))
    with pytest.raises(ValueError, match='encoder/encoder_norm/scale .* int32'):
      checkpoints.restore_params(directory, config)

  def test_vocab_mismatch(self, tmp_path):
    config, directory = self._write(tmp_path, lambda t: None)
    bigger = network.t5_1_1_config('tiny', vocab_size=VOCAB * 2)
    with pytest.raises(ValueError, match=r'Vocabulary size mismatch: .* 64 token '
                       r'embeddings .* config.vocab_size=128'):
      checkpoints.restore_params(directory, bigger)

  def test_relative_attention_mismatch(self, tmp_path):
    config, directory = self._write(tmp_path, lambda t: None,
                                    relative_attention_max_distance=64)
    with pytest.raises(ValueError, match='relative_attention_max_distance=128 '
                       'but the checkpoint has 64'):
      checkpoints.restore_params(directory, config)

  def test_scaled_untied_head_is_refused(self, tmp_path):
    config, directory = self._write(
        tmp_path, lambda t: t.update({'lm_head.weight': t['shared.weight'] + 1}),
        tie_word_embeddings=True)
    config = network.t5_1_1_config('tiny', vocab_size=VOCAB,
                                   logits_via_embedding=True)
    with pytest.raises(ValueError, match='lm_head.weight differs from '
                       'shared.weight'):
      checkpoints.restore_params(directory, config)

  @pytest.mark.parametrize('keep', [0.5, 0.999, 0.00001])
  def test_truncated_safetensors_names_the_file(self, tmp_path, keep):
    config, directory = self._write(tmp_path, lambda t: None)
    path = os.path.join(directory, hf_checkpoint.WEIGHTS_FILE)
    raw = open(path, 'rb').read()
    open(path, 'wb').write(raw[:max(4, int(len(raw) * keep))])
    with pytest.raises(ValueError, match=f'^{path}: damaged or truncated safetensors file'):
      checkpoints.restore_params(directory, config)

  def test_truncated_shard_names_the_shard(self, t5_1_1, tmp_path):
    directory = _copy(t5_1_1[1], tmp_path / 'm')
    victim = hf_checkpoint.weight_files(directory)['shared.weight']
    raw = open(victim, 'rb').read()
    open(victim, 'wb').write(raw[:len(raw) // 2])
    with pytest.raises(ValueError, match=f'^{victim}: damaged or truncated safetensors'):
      checkpoints.restore_params(directory, hf_checkpoint.config_from_hf(directory))

  @pytest.mark.parametrize('name', [hf_checkpoint.CONFIG_FILE, hf_checkpoint.INDEX_FILE])
  def test_damaged_json_names_the_file(self, t5_1_1, tmp_path, name):
    directory = _copy(t5_1_1[1], tmp_path / 'm')
    path = os.path.join(directory, name)
    raw = open(path, 'rb').read()
    open(path, 'wb').write(raw[:len(raw) // 2])
    with pytest.raises(ValueError, match=f'^{path}: damaged or incomplete JSON file'):
      hf_checkpoint.open_leaves(directory)  # what restore_params reads first
