"""The gin configs in gin/ parse and build the models they describe."""

import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import decoding
from specdec import models
from specdec import network

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'gin')


def _build(files, bindings=()):
  gin.clear_config()
  gin.parse_config_files_and_bindings(
      [os.path.join(GIN_DIR, f) for f in files], list(bindings))
  return gin.query_parameter('%MODEL').scoped_configurable_fn()


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


@pytest.mark.parametrize('target, drafter', [
    ('xxl', 'small'), ('xxl', 'base'), ('xxl', 'large'), ('base', 'small')])
def test_paper_pairs_build(target, drafter):
  model = _build(['models/speculative.gin', f'models/target_t5_1_1_{target}.gin',
                  f'models/drafter_t5_1_1_{drafter}.gin', 'decoding/greedy.gin'])
  assert isinstance(model, models.SpeculativeEncoderDecoderModel)
  assert model.module.config == network.t5_1_1_config(
      target, dtype='bfloat16', dropout_rate=0.0)
  assert model.drafter_module.config == network.t5_1_1_config(
      drafter, dtype='bfloat16', dropout_rate=0.0)


def test_baseline_builds():
  model = _build(['models/baseline.gin', 'models/target_t5_1_1_small.gin'])
  assert model.drafter_module is None
  assert model.module.config.emb_dim == 512


def _tiny_bindings(role):
  return [f'{role}/network.T5Config.{k} = {v}' for k, v in dict(
      emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=2,
      num_decoder_layers=2, mlp_dim=64).items()]


def test_gin_configured_decoding_is_exact():
  tiny = ['VOCAB_SIZE = 64', "ACTIVATION_DTYPE = 'float32'"]
  spec = _build(['models/speculative.gin', 'decoding/greedy.gin'],
                tiny + _tiny_bindings('target') + _tiny_bindings('drafter')
                + ['GAMMA = 3'])
  params = spec.get_initial_params(jax.random.PRNGKey(0))
  batch = {'encoder_input_tokens': jnp.asarray(
               np.random.RandomState(0).randint(2, 64, (3, 7)), jnp.int32),
           'decoder_input_tokens': jnp.zeros((3, 10), jnp.int32)}
  # decoder_params are empty: temperature and γ come from gin.
  spec_out, aux = spec.compile_predict({'return_stats': True})(params, batch)
  assert aux['stats']['accepted_at'].shape == (3, 3)  # γ = 3 from gin
  base = _build(['models/baseline.gin', 'decoding/greedy.gin'],
                tiny + _tiny_bindings('target'))
  base_out, _ = base.compile_predict()({'target': params['target']}, batch)
  np.testing.assert_array_equal(spec_out, base_out)
