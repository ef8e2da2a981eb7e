"""Tests for specdec/sharded_decoding.py: decodes on a mesh equal one device's.

Sharded decoding runs on 8 CPU devices (XLA_FLAGS
--xla_force_host_platform_device_count=8). That flag must be set before JAX
starts its CPU backend, and setting it in this process (or in a conftest)
would give every other test in the same pytest / xdist worker 8 devices too
(train.py's data-parallel mesh, for one, would change). So the device tests
run in one spawned helper process per module, started with the flag in its
environment: `_in_8_devices(fn, ...)` runs a `_case_*` function there and
re-raises its assertion errors here. Each case checks
`jax.device_count() == 8` and fails otherwise. The bytes that
specdec/memory.py counts per device are checked here against the arrays the
predictor really lays out (they need the same helper process).
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests import device_pool
from specdec import checkpoints
from specdec import decoding
from specdec import feature_drafter
from specdec import loading
from specdec import memory
from specdec import models
from specdec import network
from specdec import partitioning
from specdec import sharded_decoding

NUM_DEVICES = 8
DEVICE_FLAG = f'--xla_force_host_platform_device_count={NUM_DEVICES}'
# Unoptimised CPU code generation: compiles 16 sharded programs faster; the
# reference and sharded programs get the same flags.
CHILD_XLA_FLAGS = f'{DEVICE_FLAG} --xla_backend_optimization_level=0'

VOCAB = 64
EOS = 1
_SMALL = dict(num_encoder_layers=1, num_decoder_layers=1, head_dim=4,
              relative_attention_num_buckets=8,
              relative_attention_max_distance=16, dropout_rate=0.0)
TARGET_CFG = network.T5Config(vocab_size=VOCAB, emb_dim=16, num_heads=4,
                              mlp_dim=32, **_SMALL)
DRAFTER_CFG = network.T5Config(vocab_size=VOCAB, emb_dim=8, num_heads=2,
                               mlp_dim=16, **_SMALL)
GAMMA = 3
MESH_SHAPES = ((8, 1), (4, 2), (2, 4), (1, 8))
RULES_1D = partitioning.standard_logical_axis_rules()


# -----------------------------------------------------------------------------
# The 8-device helper process.
# -----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def devices8():
  with device_pool.spawned(CHILD_XLA_FLAGS) as pool:
    yield pool


def _in_8_devices(pool, fn, *args):
  return pool.submit(fn, *args).result()


def _require_8_devices():
  assert jax.device_count() == NUM_DEVICES, (
      f'expected {NUM_DEVICES} CPU devices ({DEVICE_FLAG}), JAX has '
      f'{jax.device_count()}: XLA_FLAGS={os.environ.get("XLA_FLAGS")!r}')


# -----------------------------------------------------------------------------
# Cases run in the helper process.
# -----------------------------------------------------------------------------


def _make_params(target_cfg, drafter_cfg, seed=0):
  target_rng, drafter_rng = jax.random.split(jax.random.PRNGKey(seed))
  target = network.init_params(target_cfg, target_rng)
  # A mild EOS bias so that rows end at different steps.
  kernel = target['decoder']['logits_dense']['kernel']
  target['decoder']['logits_dense']['kernel'] = kernel.at[:, EOS].add(
      0.15 * jnp.sign(kernel[:, EOS]))
  return {'target': target,
          'drafter': network.init_params(drafter_cfg, drafter_rng)}


def _make_batch(batch, vocab, input_len=7, target_len=8, seed=1):
  rng = np.random.RandomState(seed)
  enc = rng.randint(2, vocab, size=(batch, input_len))
  for b in range(batch):
    enc[b, input_len - (b % 3):] = 0  # Different input lengths.
  return {'encoder_input_tokens': jnp.asarray(enc, jnp.int32),
          'decoder_input_tokens': jnp.zeros((batch, target_len), jnp.int32)}


@functools.lru_cache(maxsize=None)
def _model(decode, target_cfg=TARGET_CFG, drafter_cfg=DRAFTER_CFG):
  if decode == 'speculative':
    return models.SpeculativeEncoderDecoderModel(
        network.Transformer(target_cfg), network.Transformer(drafter_cfg))
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(target_cfg), None,
      decode_fn=decoding.temperature_sample)


@functools.lru_cache(maxsize=None)
def _setup():
  return _make_params(TARGET_CFG, DRAFTER_CFG), _make_batch(8, VOCAB)


def _decoder_params(decode, temperature):
  # topk=0: sample from the whole distribution (T5X's default topk=1 would
  # make temperature 1 argmax too).
  params = {'temperature': temperature, 'topk': 0}
  if decode == 'speculative':
    params.update(gamma=GAMMA, return_stats=True)
  return params


@functools.lru_cache(maxsize=None)
def _reference(decode, temperature):
  """The one-device decode (jax.device_get'd), compiled once.

  Greedy speculative decodes and scores are the baseline's token for token
  (models_test checks it), so the one-device greedy baseline is the greedy
  reference of both (saving a compile; no statistics to compare then). A
  sharded batch keeps its shape (`shrink_batch` off), so the reference does
  too: seeded draws depend on the shape of the batch they are drawn for.
  """
  if temperature == 0.0:
    decode = 'temperature'
  params, batch = _setup()
  predict = _model(decode).compile_predict(
      dict(_decoder_params(decode, temperature), shrink_batch=False))
  return jax.device_get(predict(params, batch, jax.random.PRNGKey(7)))


def _assert_same_decode(out, ref):
  decodes, aux = jax.device_get(out)
  ref_decodes, ref_aux = ref
  np.testing.assert_array_equal(decodes, ref_decodes)
  np.testing.assert_allclose(aux['scores'], ref_aux['scores'], rtol=1e-5,
                             atol=1e-5)
  for key, ref_stat in ref_aux.get('stats', {}).items():
    if np.issubdtype(ref_stat.dtype, np.floating):  # Sums of Σ min(p, q).
      np.testing.assert_allclose(aux['stats'][key], ref_stat, rtol=1e-5,
                                 err_msg=key)
    else:  # Calls, drafts, acceptances: exact.
      np.testing.assert_array_equal(aux['stats'][key], ref_stat, err_msg=key)


def _case_device_count():
  _require_8_devices()
  return jax.device_count()


def _case_identity(mesh_shape, decode):
  """Greedy and sampled decodes on a mesh equal the one-device ones.

  One sharded program per mesh serves both temperatures (a per-call, traced
  temperature); the references are the static programs of compile_predict.
  """
  _require_8_devices()
  params, batch = _setup()
  mesh = partitioning.make_mesh(num_partitions=mesh_shape[1])
  assert mesh.devices.shape == mesh_shape
  predict = sharded_decoding.compile_predict_sharded(
      _model(decode), mesh, RULES_1D, _decoder_params(decode, 1.0))
  sharded = predict.shard_params(params)
  for temperature in (0.0, 1.0):
    out = predict(sharded, batch, jax.random.PRNGKey(7), temperature)
    assert out[0].sharding.spec == P('data'), out[0].sharding  # 8 rows divide.
    _assert_same_decode(out, _reference(decode, temperature))
  # Not a vacuous comparison: rows decode tokens, and sampling differs from
  # argmax somewhere.
  greedy, sampled = _reference(decode, 0.0)[0], _reference(decode, 1.0)[0]
  assert np.count_nonzero(greedy) > batch['encoder_input_tokens'].shape[0]
  assert np.any(greedy != sampled)
  assert len(predict._jitted) == 1  # pylint: disable=protected-access


HEAD_CFG = feature_drafter.FeatureHeadConfig(feature_dim=16, vocab_size=VOCAB, width=8, num_heads=2,
                                             head_dim=4, mlp_dim=16)


def _case_feature_head(mesh_shape):
  """A feature head with a trimmed vocabulary on a mesh: the one-device decodes, statistics and layout.

  The head's params follow the target's rules (its kernels are named as a T5
  layer's), and its cache is constrained like any drafter's.
  """
  _require_8_devices()
  params, batch = _setup()
  params = dict(params, drafter=feature_drafter.init_params(HEAD_CFG, jax.random.PRNGKey(3)))
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET_CFG), feature_drafter.FeatureHead(HEAD_CFG),
      draft_vocab_ids=np.arange(1, VOCAB, 2))
  decoder_params = _decoder_params('speculative', 1.0)
  mesh = partitioning.make_mesh(num_partitions=mesh_shape[1])
  predict = sharded_decoding.compile_predict_sharded(model, mesh, RULES_1D, decoder_params)
  sharded = predict.shard_params(params)
  fuse = sharded['drafter']['fuse']['kernel']
  assert fuse.sharding.spec == P(None, 'model'), fuse.sharding.spec
  for temperature in (0.0, 1.0):
    out = predict(sharded, batch, jax.random.PRNGKey(7), temperature)
    ref = jax.device_get(model.compile_predict(
        dict(decoder_params, temperature=temperature, shrink_batch=False))(
            params, batch, jax.random.PRNGKey(7)))
    _assert_same_decode(out, ref)
  # Greedy: the target's own greedy decodes (the one-device baseline's).
  greedy = jax.device_get(predict(sharded, batch, jax.random.PRNGKey(7), 0.0))[0]
  np.testing.assert_array_equal(greedy, _reference('temperature', 0.0)[0])
  caches = predict.init_caches(sharded, batch)
  assert set(caches) == {'target', 'drafter'}


def _case_layouts():
  """Params, caches and outputs sharded as the 1-D rules say, on 2 x 4."""
  _require_8_devices()
  params, batch = _setup()
  mesh = partitioning.make_mesh(num_partitions=4)
  predict = sharded_decoding.compile_predict_sharded(
      _model('speculative'), mesh, RULES_1D, _decoder_params('speculative', 0.0))
  sharded = predict.shard_params(params)
  target, drafter = sharded['target'], sharded['drafter']
  mlp = target['encoder']['layers_0']['mlp']
  assert mlp['wi_0']['kernel'].sharding.spec == P(None, 'model')
  assert mlp['wo']['kernel'].sharding.spec == P('model')  # (mlp, embed)
  # The block a device holds: (embed, mlp / 4).
  assert mlp['wi_0']['kernel'].addressable_shards[0].data.shape == (16, 8)
  attention = target['decoder']['layers_0']['self_attention']
  assert attention['query']['kernel'].sharding.spec == P(None, 'model')
  assert attention['out']['kernel'].sharding.spec == P('model')
  assert target['token_embedder']['embedding'].sharding.spec == P('model')
  assert target['decoder']['logits_dense']['kernel'].sharding.spec == P(
      None, 'model')
  assert target['decoder']['relpos_bias']['rel_embedding'].sharding.spec == P(
      'model')  # 4 heads over 4
  assert target['decoder']['decoder_norm']['scale'].sharding.spec == P()
  # The drafter's 2 heads do not divide over 4: its bias table is replicated.
  assert drafter['encoder']['relpos_bias']['rel_embedding'].sharding.spec == P()

  caches = predict.init_caches(sharded, batch)
  layer = caches['target']['decoder']['layers_0']
  key = layer['self_attention']['cached_key']
  assert key.shape == (8, 8, 4, 4)
  assert key.sharding.spec == P('data', None, 'model')
  assert key.addressable_shards[0].data.shape == (4, 8, 1, 4)
  assert layer['encoder_decoder_attention']['encoded_value'].sharding.spec == P(
      'data', None, 'model')
  assert caches['target']['decoder']['encoder_mask'].sharding.spec == P('data')
  # Drafter: batch over data, 2 heads replicated on model = 4.
  draft_key = caches['drafter']['decoder']['layers_0']['self_attention'][
      'cached_key']
  assert draft_key.sharding.spec == P('data')

  # The predict program itself pins both caches (here the target's
  # [8, 8, 4, 4] K/V: 2 ways on batch, 4 on heads) when built and after
  # every decode step.
  hlo = predict.lower(sharded, batch).as_text()
  pinned = [line for line in hlo.splitlines()
            if ('sharding_constraint' in line or '@Sharding' in line)
            and 'tensor<8x8x4x4xf32>' in line]
  # K and V when built, K and V after the verify step (Shardy or GSPMD text).
  assert len(pinned) >= 4, pinned
  assert all('[{"data"}, {}, {"model"}, {}]' in line or
             'devices=[2,1,4,1]' in line for line in pinned), pinned


def _case_restore_reads_into_the_predictors_layout(directory):
  """`loading.restore` with a mesh reads a T5X checkpoint straight into the layout the sharded predictor uses
  (`partitioning.param_shardings`, no predictor built), the values unchanged."""
  _require_8_devices()
  params, _ = _setup()
  path = checkpoints.save_t5x(os.path.join(directory, 'checkpoint_3'), params['target'], step=3)
  for num_partitions in (1, 4):
    mesh = partitioning.make_mesh(num_partitions=num_partitions)
    restored = loading.restore(path, TARGET_CFG, mesh=mesh)
    assert restored.format == 't5x' and restored.draft_vocab_ids is None
    want = sharded_decoding.compile_predict_sharded(_model('temperature'), mesh).param_shardings(
        {'target': params['target']})['target']
    got = jax.tree_util.tree_map(lambda x: x.sharding, restored.params)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
      assert a.is_equivalent_to(b, 2), (a, b)
    for a, b in zip(jax.tree_util.tree_leaves(restored.params), jax.tree_util.tree_leaves(params['target'])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # 4-way model parallelism splits the MLP's kernels: the restore did shard them.
  mlp = restored.params['encoder']['layers_0']['mlp']['wi_0']['kernel']
  assert mlp.sharding.spec == P(None, 'model') and mlp.addressable_shards[0].data.shape == (16, 8)


def _case_memory_matches_arrays():
  """bytes_per_device == what device 0 really holds, params and caches."""
  _require_8_devices()
  params, batch = _setup()
  mesh = partitioning.make_mesh(num_partitions=2)
  sizes = partitioning.mesh_axis_sizes(mesh)
  predict = sharded_decoding.compile_predict_sharded(_model('speculative'),
                                                     mesh, RULES_1D)
  sharded = predict.shard_params(params)
  caches = predict.init_caches(sharded, batch)
  device = mesh.devices.flat[0]

  def held(tree):
    return sum(shard.data.nbytes for leaf in jax.tree_util.tree_leaves(tree)
               for shard in leaf.addressable_shards if shard.device == device)

  for name in ('target', 'drafter'):
    specs = jax.tree_util.tree_map(lambda x: x.sharding.spec, sharded[name])
    assert memory.bytes_per_device(sharded[name], specs, sizes) == held(
        sharded[name])
    cache = caches[name]
    cache_specs = partitioning.cache_specs(cache, RULES_1D, sizes)
    assert memory.bytes_per_device(cache, cache_specs, sizes) == held(
        cache)
  # And the shapes it assumes are JAX's own shard shapes.
  for spec, shape in ((P('data', None, 'model'), (8, 8, 4, 4)),
                      (P(None, 'model'), (16, 32)), (P(), (5,))):
    sharding = jax.sharding.NamedSharding(mesh, spec)
    assert memory.shard_shape(shape, spec, sizes) == sharding.shard_shape(
        shape)


NONDIV_TARGET = network.T5Config(vocab_size=50, emb_dim=12, num_heads=3,
                                 mlp_dim=20, **_SMALL)
NONDIV_DRAFTER = network.T5Config(vocab_size=50, emb_dim=8, num_heads=1,
                                  mlp_dim=12, **_SMALL)


def _case_non_divisible():
  """Batch 3 on data = 2; vocab 50, 3 heads on model = 4: replicated where
  they do not divide (mlp 20 and joined_kv 12 still shard), and the same
  decodes as one device."""
  _require_8_devices()
  params = _make_params(NONDIV_TARGET, NONDIV_DRAFTER, seed=3)
  batch = _make_batch(3, 50, seed=4)
  mesh = partitioning.make_mesh(num_partitions=4)
  layouts = sharded_decoding.compile_predict_sharded(
      _model('speculative', NONDIV_TARGET, NONDIV_DRAFTER), mesh, RULES_1D)
  sharded = layouts.shard_params(params)
  target = sharded['target']
  assert target['token_embedder']['embedding'].sharding.spec == P()  # 50 % 4
  assert target['decoder']['logits_dense']['kernel'].sharding.spec == P()
  mlp = target['encoder']['layers_0']['mlp']
  assert mlp['wi_0']['kernel'].sharding.spec == P(None, 'model')  # 20 % 4 == 0
  attention = target['encoder']['layers_0']['attention']
  assert attention['query']['kernel'].sharding.spec == P(None, 'model')  # 12
  assert target['encoder']['relpos_bias']['rel_embedding'].sharding.spec == P()
  caches = layouts.init_caches(sharded, batch)
  key = caches['target']['decoder']['layers_0']['self_attention']['cached_key']
  assert key.sharding.spec == P()  # batch 3 % 2, heads 3 % 4
  assert key.addressable_shards[0].data.shape == key.shape

  # Decoding with these layouts (the baseline: a cheaper compile; the
  # speculative decode meets replicated heads on the 1 x 8 mesh above).
  model = _model('temperature', NONDIV_TARGET)
  decoder_params = {'temperature': 0.0}
  ref = jax.device_get(model.compile_predict(decoder_params)(params, batch))
  predict = sharded_decoding.compile_predict_sharded(model, mesh, RULES_1D,
                                                     decoder_params)
  out = predict(predict.shard_params(params), batch)
  assert out[0].sharding.spec == P()
  _assert_same_decode(out, ref)
  assert np.count_nonzero(ref[0]) > 3


# -----------------------------------------------------------------------------
# Device tests (through the helper process).
# -----------------------------------------------------------------------------


def test_helper_process_has_8_devices(devices8):
  assert _in_8_devices(devices8, _case_device_count) == NUM_DEVICES


@pytest.mark.parametrize('decode', ['speculative', 'temperature'])
@pytest.mark.parametrize('mesh_shape', MESH_SHAPES,
                         ids=[f'{d}x{m}' for d, m in MESH_SHAPES])
def test_sharded_decode_equals_one_device(devices8, mesh_shape, decode):
  """Greedy and seeded sampling (t = 1), speculative and baseline decodes."""
  _in_8_devices(devices8, _case_identity, mesh_shape, decode)


@pytest.mark.parametrize('mesh_shape', [(8, 1), (2, 4)], ids=['8x1', '2x4'])
def test_feature_head_decodes_as_on_one_device(devices8, mesh_shape):
  _in_8_devices(devices8, _case_feature_head, mesh_shape)


def test_params_caches_outputs_sharded_by_rules(devices8):
  _in_8_devices(devices8, _case_layouts)


def test_restore_reads_into_the_predictors_layout(devices8, tmp_path):
  _in_8_devices(devices8, _case_restore_reads_into_the_predictors_layout, str(tmp_path))


def test_bytes_per_device_match_real_shards(devices8):
  _in_8_devices(devices8, _case_memory_matches_arrays)


def test_non_divisible_dims_replicated_same_decodes(devices8):
  _in_8_devices(devices8, _case_non_divisible)


@pytest.mark.parametrize('temperature', [-1.0, float('nan'), [0.0, 1.0]])
def test_bad_per_call_temperature(temperature):
  params, batch = _setup()
  predict = sharded_decoding.compile_predict_sharded(
      _model('temperature'), partitioning.make_mesh(1, jax.devices()[:1]))
  with pytest.raises(ValueError, match='temperature must be a finite scalar'):
    predict(params, batch, None, temperature)


def test_param_specs_follow_the_rules_and_replicate_a_missing_network():
  params = jax.eval_shape(lambda: _make_params(TARGET_CFG, DRAFTER_CFG))
  sizes = {'data': 2, 'model': 4}
  specs = sharded_decoding.param_specs(_model('temperature'), params, RULES_1D,
                                       sizes)
  mlp = specs['target']['encoder']['layers_0']['mlp']
  assert mlp['wi_0']['kernel'] == P(None, 'model')
  # The baseline model has no drafter module: the drafter's params replicate.
  assert all(spec == P() for spec in jax.tree_util.tree_leaves(
      specs['drafter'], is_leaf=lambda x: isinstance(x, P)))
  both = sharded_decoding.param_specs(_model('speculative'), params, RULES_1D,
                                      sizes)
  assert both['drafter']['encoder']['layers_0']['mlp']['wi_0']['kernel'] == P(
      None, 'model')
