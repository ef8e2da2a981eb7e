"""Tests for specdec/partitioning.py: mesh, logical axis rules, specs, multi-host.

None of these needs more than one device (the 8-device sharded decodes are
in sharded_decoding_test.py).
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
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


# -----------------------------------------------------------------------------
# Rules, specs and errors (no devices needed).
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
    params = memory.abstract_params(TARGET_CFG)
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



class TestCacheAxes:

  def test_names(self):
    cache = memory.abstract_cache(TARGET_CFG, 2, 5, 7)
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
                 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID',
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

  def test_process_count_and_id_from_env(self, monkeypatch):
    # Processes started by hand: JAX reads the coordinator address itself, not these two.
    monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', '127.0.0.1:1234')
    monkeypatch.setenv('JAX_NUM_PROCESSES', '2')
    monkeypatch.setenv('JAX_PROCESS_ID', '1')
    assert partitioning.initialize_multihost()
    assert self.calls == [dict(num_processes=2, process_id=1)]

  def test_arguments_win_over_env(self, monkeypatch):
    monkeypatch.setenv('JAX_NUM_PROCESSES', '2')
    monkeypatch.setenv('JAX_PROCESS_ID', '1')
    assert partitioning.initialize_multihost('h:1', 4, 3)
    assert self.calls == [dict(coordinator_address='h:1', num_processes=4, process_id=3)]

  def test_one_process_from_env_is_single_host(self, monkeypatch):
    monkeypatch.setenv('JAX_NUM_PROCESSES', '1')
    monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', '127.0.0.1:1234')
    assert not partitioning.initialize_multihost()
    assert self.calls == []

  @pytest.mark.parametrize('name', ['JAX_NUM_PROCESSES', 'JAX_PROCESS_ID'])
  def test_bad_process_env(self, monkeypatch, name):
    monkeypatch.setenv(name, 'two')
    with pytest.raises(ValueError, match=f"{name}='two': expected a non-negative integer"):
      partitioning.initialize_multihost(enabled=True)

  def test_already_initialized(self, monkeypatch):
    monkeypatch.setattr(jax.distributed, 'is_initialized', lambda: True,
                        raising=False)
    assert not partitioning.initialize_multihost(enabled=True)
    assert self.calls == []

  def test_bad_flag(self, monkeypatch):
    monkeypatch.setenv('SPECDEC_MULTIHOST', 'maybe')
    with pytest.raises(ValueError, match='SPECDEC_MULTIHOST'):
      partitioning.initialize_multihost()


class TestHelpers:

  @pytest.mark.parametrize('axes,expected', [
      (None, ()), ('model', ('model',)), (('data', 'model'), ('data', 'model'))])
  def test_rule_mesh_axes(self, axes, expected):
    assert partitioning.rule_mesh_axes(axes) == expected

  def test_put_tree_on_one_device(self):
    mesh = partitioning.make_mesh(1, jax.devices()[:1])
    sharding = jax.sharding.NamedSharding(mesh, P())
    tree = {'a': jnp.arange(4), 'b': jnp.ones((2, 3))}
    placed = partitioning.put_tree(tree, {'a': sharding, 'b': sharding})
    assert placed['a'].sharding == sharding
    assert partitioning.put_array(tree['b'], sharding).sharding == sharding
    host = partitioning.to_host(placed)
    assert host['a'].tolist() == [0, 1, 2, 3] and host['b'].shape == (2, 3)
