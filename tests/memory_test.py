"""Tests for specdec/memory.py: bytes per device, by hand and for a network.

That these counts equal what a device really holds of sharded arrays is
checked on 8 devices in sharded_decoding_test.py.
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from specdec import memory
from specdec import network
from specdec import partitioning

_SMALL = dict(num_encoder_layers=1, num_decoder_layers=1, head_dim=4,
              relative_attention_num_buckets=8,
              relative_attention_max_distance=16, dropout_rate=0.0)
TARGET_CFG = network.T5Config(vocab_size=64, emb_dim=16, num_heads=4,
                              mlp_dim=32, **_SMALL)
RULES_1D = partitioning.standard_logical_axis_rules()
SIZES_2x4 = {'data': 2, 'model': 4}


def test_shard_shape():
  assert memory.shard_shape((8, 12, 5), P('data', 'model'), SIZES_2x4) == (
      4, 3, 5)
  assert memory.shard_shape((16,), P(('data', 'model')), SIZES_2x4) == (2,)
  assert memory.shard_shape((6,), P(), SIZES_2x4) == (6,)


def test_shard_shape_refuses_unfitted():
  with pytest.raises(ValueError, match='fit the spec first'):
    memory.shard_shape((6,), P('model'), SIZES_2x4)


def test_bytes_per_device_by_hand():
  tree = {'w': jax.ShapeDtypeStruct((8, 12), jnp.float32),  # sharded 2 x 4
          'b': jax.ShapeDtypeStruct((6,), jnp.float32),      # replicated
          'm': jax.ShapeDtypeStruct((4, 3), jnp.bool_)}      # data only
  specs = {'w': P('data', 'model'), 'b': P(), 'm': P('data')}
  assert memory.bytes_per_device(tree, specs, SIZES_2x4) == (
      4 * 3 * 4 + 6 * 4 + 2 * 3)
  # bf16 storage halves float leaves, bool stays one byte.
  assert memory.bytes_per_device(tree, specs, SIZES_2x4,
                                 jnp.bfloat16) == 4 * 3 * 2 + 6 * 2 + 6
  assert memory.total_bytes(tree) == 8 * 12 * 4 + 6 * 4 + 12


def test_leaf_bytes_per_device_keyed_by_path():
  tree = {'a': {'w': jax.ShapeDtypeStruct((8, 4), jnp.float32)}}
  per = memory.leaf_bytes_per_device(tree, {'a': {'w': P('data')}}, SIZES_2x4)
  assert per == {"['a']['w']": 4 * 4 * 4}
  with pytest.raises(ValueError, match='1 arrays but 2 specs'):
    memory.leaf_bytes_per_device(tree, {'a': {'w': P(), 'v': P()}}, SIZES_2x4)


def test_abstract_params_and_cache_allocate_nothing():
  params = memory.abstract_params(TARGET_CFG)
  leaves = jax.tree_util.tree_leaves(params)
  assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
  cache = memory.abstract_cache(TARGET_CFG, 2, 5, 7)
  key = cache['decoder']['layers_0']['self_attention']['cached_key']
  assert isinstance(key, jax.ShapeDtypeStruct) and key.shape == (2, 7, 4, 4)
  encoded = cache['decoder']['layers_0']['encoder_decoder_attention'][
      'encoded_key']
  assert encoded.shape == (2, 5, 4, 4)


@pytest.mark.parametrize('sizes', [{'data': 2, 'model': 4},
                                   {'data': 8, 'model': 1},
                                   {'data': 1, 'model': 8}])
def test_network_memory_adds_up(sizes):
  """Σ over devices of per-device bytes >= one copy; == when nothing is
  replicated along an axis, k copies when replicated k ways."""
  devices = sizes['data'] * sizes['model']
  mem = memory.network_memory(TARGET_CFG, sizes, RULES_1D,
                              batch_size=8, input_len=6, cache_len=8,
                              param_dtype=jnp.bfloat16)
  for part in ('params', 'self_cache', 'cross_cache'):
    assert mem[part] * devices >= mem[f'{part}_total'] > 0, part
    assert mem[part] <= mem[f'{part}_total'], part
  # Caches [8, L, 4, 4] shard batch over data and the 4 heads over model
  # when 4 divides over it (not on model = 8: replicated, 8 copies then).
  ways = sizes['data'] * (sizes['model'] if 4 % sizes['model'] == 0 else 1)
  assert mem['self_cache'] * ways == mem['self_cache_total']
  # The self-attention part is K and V, [8, 8, 4, 4] float32 each.
  assert mem['self_cache_total'] == 2 * 1 * 8 * 8 * 4 * 4 * 4
  # Params are replicated along data: `data` copies at least.
  assert mem['params'] * devices >= sizes['data'] * mem['params_total']
  params = memory.abstract_params(TARGET_CFG)
  count = sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params))
  assert mem['params_total'] == 2 * count


def test_network_memory_default_rules_are_1d():
  kw = dict(batch_size=2, input_len=6, cache_len=8)
  assert memory.network_memory(TARGET_CFG, SIZES_2x4, **kw) == (
      memory.network_memory(TARGET_CFG, SIZES_2x4, RULES_1D, **kw))
