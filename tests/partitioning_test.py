"""Tests for specdec/partitioning.py and scripts/xxl_memory_plan.py.

Sharded decoding runs on 8 CPU devices (XLA_FLAGS
--xla_force_host_platform_device_count=8). That flag must be set before JAX
starts its CPU backend, and setting it in this process (or in a conftest)
would give every other test in the same pytest / xdist worker 8 devices too
(train.py's data-parallel mesh, for one, would change). So the device tests
run in one spawned helper process per module, started with the flag in its
environment: `_in_8_devices(fn, ...)` runs a `_case_*` function there and
re-raises its assertion errors here. Each case checks
`jax.device_count() == 8` and fails otherwise.
"""

import functools
import importlib.util
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests import device_pool
from specdec import decoding
from specdec import models
from specdec import network
from specdec import partitioning

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
  predict = partitioning.compile_predict_sharded(
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


def _case_layouts():
  """Params, caches and outputs sharded as the 1-D rules say, on 2 x 4."""
  _require_8_devices()
  params, batch = _setup()
  mesh = partitioning.make_mesh(num_partitions=4)
  predict = partitioning.compile_predict_sharded(
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


def _case_memory_matches_arrays():
  """bytes_per_device == what device 0 really holds, params and caches."""
  _require_8_devices()
  params, batch = _setup()
  mesh = partitioning.make_mesh(num_partitions=2)
  sizes = partitioning.mesh_axis_sizes(mesh)
  predict = partitioning.compile_predict_sharded(_model('speculative'), mesh,
                                                 RULES_1D)
  sharded = predict.shard_params(params)
  caches = predict.init_caches(sharded, batch)
  device = mesh.devices.flat[0]

  def held(tree):
    return sum(shard.data.nbytes for leaf in jax.tree_util.tree_leaves(tree)
               for shard in leaf.addressable_shards if shard.device == device)

  for name in ('target', 'drafter'):
    specs = jax.tree_util.tree_map(lambda x: x.sharding.spec, sharded[name])
    assert partitioning.bytes_per_device(sharded[name], specs, sizes) == held(
        sharded[name])
    cache = caches[name]
    cache_specs = partitioning.cache_specs(cache, RULES_1D, sizes)
    assert partitioning.bytes_per_device(cache, cache_specs, sizes) == held(
        cache)
  # And the shapes it assumes are JAX's own shard shapes.
  for spec, shape in ((P('data', None, 'model'), (8, 8, 4, 4)),
                      (P(None, 'model'), (16, 32)), (P(), (5,))):
    sharding = jax.sharding.NamedSharding(mesh, spec)
    assert partitioning.shard_shape(shape, spec, sizes) == sharding.shard_shape(
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
  layouts = partitioning.compile_predict_sharded(
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
  predict = partitioning.compile_predict_sharded(model, mesh, RULES_1D,
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


def test_params_caches_outputs_sharded_by_rules(devices8):
  _in_8_devices(devices8, _case_layouts)


def test_bytes_per_device_match_real_shards(devices8):
  _in_8_devices(devices8, _case_memory_matches_arrays)


def test_non_divisible_dims_replicated_same_decodes(devices8):
  _in_8_devices(devices8, _case_non_divisible)


# -----------------------------------------------------------------------------
# Rules, specs and errors (this process; no devices needed).
# -----------------------------------------------------------------------------

SIZES_2x4 = {'data': 2, 'model': 4}


def _mesh_spec(logical, shape, rules, sizes=SIZES_2x4):
  return partitioning.logical_to_mesh_specs(
      P(*logical), jax.ShapeDtypeStruct(shape, jnp.float32), rules, sizes)


class TestRules:

  def test_1d_rules_are_t5x(self):
    assert RULES_1D == (
        ('batch', 'data'), ('vocab', 'model'), ('embed', None),
        ('mlp', 'model'), ('heads', 'model'), ('kv', None),
        ('joined_kv', 'model'), ('relpos_buckets', None),
        ('abspos_buckets', None), ('length', None), ('layers', None),
        ('stack', None), ('mlp_activations', None))

  @pytest.mark.parametrize('dims,embed_rules', [
      ((2, 1), [('embed', 'model')]), ((1, 2), [('embed', 'data')]),
      ((2, 2), [('embed', 'model'), ('embed', 'data')])])
  def test_2d_variants(self, dims, embed_rules):
    rules = partitioning.standard_logical_axis_rules(*dims)
    assert [r for r in rules if r[0] == 'embed'] == embed_rules
    assert ('batch', 'data') in rules and ('mlp', 'model') in rules
    assert rules[-6:] == RULES_1D[-6:]

  def test_additional_rules_appended(self):
    rules = partitioning.standard_logical_axis_rules(
        additional_rules=[('expert', 'data')])
    assert rules[-1] == ('expert', 'data')

  @pytest.mark.parametrize('dims', [(3, 1), (1, 0)])
  def test_unsupported_dims(self, dims):
    with pytest.raises(ValueError, match='only 1 or 2'):
      partitioning.standard_logical_axis_rules(*dims)

  @pytest.mark.parametrize('dims,logical,expected', [
      ((1, 1), ('embed', 'mlp'), P(None, 'model')),
      ((1, 1), ('mlp', 'embed'), P('model')),
      ((1, 1), ('vocab', 'embed'), P('model')),
      ((1, 1), ('embed',), P()),
      ((1, 2), ('embed', 'mlp'), P('data', 'model')),
      ((1, 2), ('embed', 'joined_kv'), P('data', 'model')),
      ((2, 2), ('embed', 'mlp'), P('data', 'model')),
      ((2, 2), ('embed',), P('model')),
      ((2, 1), ('batch', 'length', 'embed'), P('data', None, 'model')),
      ((1, 1), ('batch', 'length', 'heads', 'kv'), P('data', None, 'model')),
  ])
  def test_logical_to_mesh(self, dims, logical, expected):
    rules = partitioning.standard_logical_axis_rules(*dims)
    shape = (8,) * len(logical)
    assert _mesh_spec(logical, shape, rules) == expected

  def test_network_params_get_t5x_layout(self):
    logical = network.param_logical_axes(TARGET_CFG)
    params = partitioning.abstract_params(TARGET_CFG)
    specs = partitioning.logical_to_mesh_specs(logical, params, RULES_1D,
                                               SIZES_2x4)
    layer = specs['decoder']['layers_0']
    assert layer['mlp']['wi_0']['kernel'] == P(None, 'model')
    assert layer['mlp']['wo']['kernel'] == P('model')
    assert layer['encoder_decoder_attention']['key']['kernel'] == P(None,
                                                                    'model')
    assert specs['token_embedder']['embedding'] == P('model')
    assert specs['encoder']['encoder_norm']['scale'] == P()


class TestFitSpec:

  def test_divisible_kept(self):
    assert partitioning.fit_spec(P('data', 'model'), (4, 8),
                                 SIZES_2x4) == P('data', 'model')

  def test_non_divisible_replicated(self):
    assert partitioning.fit_spec(P('data', 'model'), (3, 6),
                                 SIZES_2x4) == P()
    assert partitioning.fit_spec(P('data', 'model'), (4, 6),
                                 SIZES_2x4) == P('data')
    assert partitioning.fit_spec(P(('data', 'model')), (12,),
                                 SIZES_2x4) == P()  # 12 % 8
    assert partitioning.fit_spec(P(('data', 'model')), (16,),
                                 SIZES_2x4) == P(('data', 'model'))

  def test_batch_one_on_data_eight(self):
    spec = _mesh_spec(('batch', 'length'), (1, 16), RULES_1D,
                      {'data': 8, 'model': 1})
    assert spec == P()

  def test_too_long_spec(self):
    with pytest.raises(ValueError, match='more entries'):
      partitioning.fit_spec(P('data', None, 'model'), (4, 4), SIZES_2x4)


class TestErrors:

  def test_unknown_logical_name(self):
    with pytest.raises(ValueError, match="'experts' has no rule"):
      _mesh_spec(('batch', 'experts'), (4, 4), RULES_1D)

  def test_rule_names_missing_mesh_axis(self):
    with pytest.raises(ValueError, match="mesh axis 'expert'"):
      _mesh_spec(('batch',), (4,), RULES_1D + (('experts', 'expert'),))

  def test_malformed_rule(self):
    with pytest.raises(ValueError, match='must be \\(name, mesh axes\\)'):
      partitioning.check_rules([('batch',)], SIZES_2x4)

  def test_structure_mismatch(self):
    with pytest.raises(ValueError, match='differ in structure'):
      partitioning.logical_to_mesh_specs(
          {'a': P('batch')}, {'b': jnp.zeros(4)}, RULES_1D, SIZES_2x4)

  @pytest.mark.parametrize('num_partitions', [2, 0, -1, 1.5, True])
  def test_make_mesh_bad_num_partitions(self, num_partitions):
    devices = jax.devices()[:1]
    with pytest.raises(ValueError, match='num_partitions'):
      partitioning.make_mesh(num_partitions, devices)

  def test_make_mesh_one_device(self):
    mesh = partitioning.make_mesh(1, jax.devices()[:1])
    assert mesh.axis_names == ('data', 'model')
    assert mesh.devices.shape == (1, 1)

  @pytest.mark.parametrize('temperature', [-1.0, float('nan'), [0.0, 1.0]])
  def test_bad_per_call_temperature(self, temperature):
    params, batch = _setup()
    predict = partitioning.compile_predict_sharded(
        _model('temperature'), partitioning.make_mesh(1, jax.devices()[:1]))
    with pytest.raises(ValueError, match='temperature must be a finite scalar'):
      predict(params, batch, None, temperature)

  def test_shard_shape_refuses_unfitted(self):
    with pytest.raises(ValueError, match='fit the spec first'):
      partitioning.shard_shape((6,), P('model'), SIZES_2x4)


class TestCacheAxes:

  def test_names(self):
    cache = partitioning.abstract_cache(TARGET_CFG, 2, 5, 7)
    axes = network.cache_logical_axes(cache)
    decoder = axes['decoder']
    assert decoder['encoder_mask'] == P('batch', 'length')
    for leaf in ('cached_key', 'cached_value'):
      assert decoder['layers_0']['self_attention'][leaf] == P(
          'batch', 'length', 'heads', 'kv')
    for leaf in ('encoded_key', 'encoded_value'):
      assert decoder['layers_0']['encoder_decoder_attention'][leaf] == P(
          'batch', 'length', 'heads', 'kv')
    specs = partitioning.cache_specs(cache, RULES_1D, SIZES_2x4)
    assert specs['decoder']['layers_0']['self_attention']['cached_key'] == P(
        'data', None, 'model')

  def test_unknown_leaf(self):
    with pytest.raises(ValueError, match="'cached_state'"):
      network.cache_logical_axes({'decoder': {'cached_state': jnp.zeros(3)}})

  def test_wrong_rank(self):
    with pytest.raises(ValueError, match='cached_key'):
      network.cache_logical_axes({'cached_key': jnp.zeros((2, 3))})


class TestMultihost:

  @pytest.fixture(autouse=True)
  def clean_env(self, monkeypatch):
    for name in ('SPECDEC_MULTIHOST', 'JAX_COORDINATOR_ADDRESS',
                 'SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE', 'PMI_SIZE',
                 'TPU_WORKER_HOSTNAMES'):
      monkeypatch.delenv(name, raising=False)
    self.calls = []
    monkeypatch.setattr(jax.distributed, 'initialize',
                        lambda **kw: self.calls.append(kw))
    monkeypatch.setattr(jax.distributed, 'is_initialized', lambda: False,
                        raising=False)

  def test_single_host_is_noop(self):
    assert not partitioning.initialize_multihost()
    assert not partitioning.initialize_multihost(num_processes=1)
    assert self.calls == []

  @pytest.mark.parametrize('name,value', [
      ('SLURM_NTASKS', '4'), ('OMPI_COMM_WORLD_SIZE', '2'),
      ('TPU_WORKER_HOSTNAMES', 'w0,w1'),
      ('JAX_COORDINATOR_ADDRESS', '10.0.0.1:1234'),
      ('SPECDEC_MULTIHOST', '1')])
  def test_env_says_multihost(self, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert partitioning.initialize_multihost()
    assert self.calls == [{}]  # JAX finds the cluster itself.

  @pytest.mark.parametrize('name,value', [
      ('SLURM_NTASKS', '1'), ('TPU_WORKER_HOSTNAMES', 'w0')])
  def test_env_says_single_host(self, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert not partitioning.initialize_multihost()
    assert self.calls == []

  def test_flag_overrides_env(self, monkeypatch):
    monkeypatch.setenv('SLURM_NTASKS', '4')
    monkeypatch.setenv('SPECDEC_MULTIHOST', '0')
    assert not partitioning.initialize_multihost()
    assert self.calls == []

  def test_explicit_arguments_passed(self):
    assert partitioning.initialize_multihost('h:1234', 2, 1)
    assert self.calls == [dict(coordinator_address='h:1234', num_processes=2,
                               process_id=1)]

  def test_already_initialized(self, monkeypatch):
    monkeypatch.setattr(jax.distributed, 'is_initialized', lambda: True,
                        raising=False)
    assert not partitioning.initialize_multihost(enabled=True)
    assert self.calls == []

  def test_bad_flag(self, monkeypatch):
    monkeypatch.setenv('SPECDEC_MULTIHOST', 'maybe')
    with pytest.raises(ValueError, match='SPECDEC_MULTIHOST'):
      partitioning.initialize_multihost()


# -----------------------------------------------------------------------------
# Memory accounting and the XXL plan script.
# -----------------------------------------------------------------------------


def _load_plan_script():
  spec = importlib.util.spec_from_file_location(
      'xxl_memory_plan', os.path.join(REPO, 'scripts', 'xxl_memory_plan.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


class TestMemory:

  def test_bytes_per_device_by_hand(self):
    tree = {'w': jax.ShapeDtypeStruct((8, 12), jnp.float32),  # sharded 2 x 4
            'b': jax.ShapeDtypeStruct((6,), jnp.float32),      # replicated
            'm': jax.ShapeDtypeStruct((4, 3), jnp.bool_)}      # data only
    specs = {'w': P('data', 'model'), 'b': P(), 'm': P('data')}
    assert partitioning.bytes_per_device(tree, specs, SIZES_2x4) == (
        4 * 3 * 4 + 6 * 4 + 2 * 3)
    # bf16 storage halves float leaves, bool stays one byte.
    assert partitioning.bytes_per_device(tree, specs, SIZES_2x4,
                                         jnp.bfloat16) == 4 * 3 * 2 + 6 * 2 + 6
    assert partitioning.total_bytes(tree) == 8 * 12 * 4 + 6 * 4 + 12

  @pytest.mark.parametrize('sizes', [{'data': 2, 'model': 4},
                                     {'data': 8, 'model': 1},
                                     {'data': 1, 'model': 8}])
  def test_network_memory_adds_up(self, sizes):
    """Σ over devices of per-device bytes >= one copy; == when nothing is
    replicated along an axis, k copies when replicated k ways."""
    devices = sizes['data'] * sizes['model']
    mem = partitioning.network_memory(TARGET_CFG, sizes, RULES_1D,
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
    params = partitioning.abstract_params(TARGET_CFG)
    count = sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params))
    assert mem['params_total'] == 2 * count

  def test_plan_script_small(self, tmp_path):
    plan = _load_plan_script()
    rules = RULES_1D
    plan_small = functools.partial(
        plan.plan_rows, TARGET_CFG, DRAFTER_CFG, {'tiny-8': 8}, {'t': (6, 5)},
        (1, 8), 2, rules, 'bfloat16', headroom=1.2)
    totals = [r['total'] for r in plan_small(hbm_gib=1.0)]
    # An HBM size between the smallest and largest layout's needs.
    hbm_gib = 1.2 * (min(totals) + max(totals)) / 2 / 2 ** 30
    rows = plan_small(hbm_gib=hbm_gib)
    assert [(r['data'], r['model'], r['batch']) for r in rows] == [
        (8, 1, 1), (8, 1, 8), (4, 2, 1), (4, 2, 8), (2, 4, 1), (2, 4, 8),
        (1, 8, 1), (1, 8, 8)]
    for r in rows:
      parts = [r['target'][k] + r['drafter'][k]
               for k in ('params', 'self_cache', 'cross_cache')]
      assert r['total'] == sum(parts) + r['activations']
      for net in ('target', 'drafter'):
        for k in ('params', 'self_cache', 'cross_cache'):
          assert r[net][k] * 8 >= r[net][f'{k}_total']
      assert r['fits'] == (r['total'] * 1.2 <= hbm_gib * 2 ** 30)
    # Batch 1 on data = 8: the cache is replicated, every chip holds it all.
    one = rows[0]
    assert one['target']['self_cache'] == one['target']['self_cache_total']
    # More model parallelism, fewer param bytes per chip.
    by_model = {r['model']: r['target']['params'] for r in rows}
    assert by_model[8] < by_model[4] < by_model[2] < by_model[1]
    assert not all(r['fits'] for r in rows) and any(r['fits'] for r in rows)

  def test_plan_script_writes_reports(self, tmp_path, monkeypatch):
    plan = _load_plan_script()
    monkeypatch.setattr(plan, 'SLICES', {'v4-8': 4})
    monkeypatch.setattr(plan, 'TASKS', {'ende': (16, 8)})
    monkeypatch.setattr(plan, 'BATCHES', (1,))
    monkeypatch.setattr(network, 't5_1_1_config',
                        lambda name, **kw: TARGET_CFG if name == 'xxl'
                        else DRAFTER_CFG)
    report = plan.main(['--out_dir', str(tmp_path)])
    text = (tmp_path / 'xxl_memory_plan.md').read_text()
    assert 'python scripts/xxl_memory_plan.py --out_dir' in text
    assert report['date'] in text and 'jax ' in text
    assert '| v4-8 | 1 x 4 |' in text
    saved = (tmp_path / 'xxl_memory_plan.json').read_text()
    assert '"rows"' in saved and len(report['rows']) == 3
