"""Bytes per device of arrays laid out on a ('data', 'model') mesh.

Everything here is abstract: shapes and PartitionSpecs in, byte counts out.
No device is touched, so a mesh can be simulated by its axis sizes alone
(e.g. {'data': 16, 'model': 4} for a 64-chip slice on a 2-CPU machine).

  shard_shape            the block one device holds of an array
  leaf_bytes_per_device  {leaf path: bytes one device holds} of a tree
  bytes_per_device       their sum
  total_bytes            one whole copy of a tree
  abstract_params        a network's params as ShapeDtypeStructs
  abstract_cache         a network's decode cache as ShapeDtypeStructs
  network_memory         one network's params and decode caches, per device
                         and in total, laid out by partitioning's rules

A replicated dimension (including one `partitioning.fit_spec` replicated
because it does not divide) counts in full on every device.
"""

import functools
import math
from typing import Any, Mapping, Optional, Sequence, Tuple

import flax
import jax
from jax.sharding import PartitionSpec
import numpy as np

from specdec import network
from specdec import partitioning

PyTree = Any


def shard_shape(shape: Sequence[int], spec: PartitionSpec,
                axis_sizes: Mapping[str, int]) -> Tuple[int, ...]:
  """The per-device block of an array of `shape` laid out by a fitted spec."""
  entries = tuple(spec) + (None,) * (len(shape) - len(spec))
  out = []
  for size, axes in zip(shape, entries):
    ways = math.prod(axis_sizes[a] for a in partitioning.rule_mesh_axes(axes))
    if size % ways:
      raise ValueError(f'dimension {size} does not divide {ways} ways ({axes}); '
                       'fit the spec first (fit_spec).')
    out.append(size // ways)
  return tuple(out)


def leaf_bytes_per_device(shapes_tree: PyTree, spec_tree: PyTree,
                          axis_sizes: Mapping[str, int],
                          dtype: Optional[Any] = None) -> dict:
  """{leaf path: bytes one device holds of it} for a tree laid out by specs.

  With even sharding every device holds the same; a replicated leaf counts
  in full on each device. `dtype` overrides the leaves' dtypes (e.g. to
  account params stored in bfloat16); bool leaves keep 1 byte.
  """
  shapes = jax.tree_util.tree_flatten_with_path(
      flax.core.unfreeze(shapes_tree))[0]
  specs = jax.tree_util.tree_leaves(
      flax.core.unfreeze(spec_tree),
      is_leaf=lambda x: isinstance(x, PartitionSpec))
  if len(shapes) != len(specs):
    raise ValueError(f'{len(shapes)} arrays but {len(specs)} specs.')
  out = {}
  for (path, leaf), spec in zip(shapes, specs):
    leaf_dtype = np.dtype(leaf.dtype)
    if dtype is not None and leaf_dtype != np.bool_:
      leaf_dtype = np.dtype(dtype)
    out[jax.tree_util.keystr(path)] = math.prod(
        shard_shape(np.shape(leaf), spec, axis_sizes)) * leaf_dtype.itemsize
  return out


def bytes_per_device(shapes_tree: PyTree, spec_tree: PyTree,
                     axis_sizes: Mapping[str, int],
                     dtype: Optional[Any] = None) -> int:
  """Bytes one device holds of a tree (see `leaf_bytes_per_device`)."""
  return sum(leaf_bytes_per_device(shapes_tree, spec_tree, axis_sizes,
                                   dtype).values())


def total_bytes(shapes_tree: PyTree, dtype: Optional[Any] = None) -> int:
  """Bytes of a whole tree (one copy), with `bytes_per_device`'s dtype rule."""
  specs = jax.tree_util.tree_map(lambda _: PartitionSpec(),
                                 flax.core.unfreeze(shapes_tree))
  return bytes_per_device(shapes_tree, specs, {}, dtype)


@functools.lru_cache(maxsize=None)
def abstract_params(config: network.T5Config) -> PyTree:
  """The params tree as ShapeDtypeStructs (float32); allocates nothing."""
  return jax.eval_shape(functools.partial(network.init_params, config),
                        jax.random.PRNGKey(0))


@functools.lru_cache(maxsize=None)
def abstract_cache(config: network.T5Config, batch_size: int, input_len: int,
                   cache_len: int) -> PyTree:
  """The decode cache for [batch_size, input_len] inputs and `cache_len`
  decode positions, as ShapeDtypeStructs (leaves in config.dtype)."""
  module = network.Transformer(config)

  def build(params, tokens):
    encoded = module.apply({'params': params}, tokens, enable_dropout=False,
                           method=module.encode)
    _, variables = module.apply({'params': params}, encoded, tokens,
                                cache_len, method=module.init_cache,
                                mutable=['cache'])
    return variables['cache']

  return jax.eval_shape(build, abstract_params(config),
                        jax.ShapeDtypeStruct((batch_size, input_len), np.int32))


def network_memory(config: network.T5Config, axis_sizes: Mapping[str, int],
                   rules: Optional[partitioning.LogicalAxisRules] = None, *,
                   batch_size: int, input_len: int, cache_len: int,
                   param_dtype: Any = np.float32) -> dict:
  """Bytes per device and in total of one network's params and caches.

  Keys: params, self_cache (decoder self-attention K/V, `cache_len`
  positions), cross_cache (encoder K/V projections and mask, `input_len`),
  each per device, and the same with a `_total` suffix (one copy). Params
  are counted in `param_dtype`, caches in their own dtype (config.dtype).
  `rules` default to `partitioning.standard_logical_axis_rules()`.
  """
  rules = partitioning.standard_logical_axis_rules() if rules is None else rules
  params = abstract_params(config)
  param_mesh_specs = partitioning.param_specs(network.Transformer(config), params,
                                              rules, axis_sizes)
  cache = abstract_cache(config, batch_size, input_len, cache_len)
  per_leaf = leaf_bytes_per_device(
      cache, partitioning.cache_specs(cache, rules, axis_sizes), axis_sizes)
  whole = leaf_bytes_per_device(
      cache, jax.tree_util.tree_map(lambda _: PartitionSpec(), cache), {})
  is_self = lambda path: 'cached_' in path
  return dict(
      params=bytes_per_device(params, param_mesh_specs, axis_sizes,
                              param_dtype),
      params_total=total_bytes(params, param_dtype),
      self_cache=sum(b for p, b in per_leaf.items() if is_self(p)),
      self_cache_total=sum(b for p, b in whole.items() if is_self(p)),
      cross_cache=sum(b for p, b in per_leaf.items() if not is_self(p)),
      cross_cache_total=sum(b for p, b in whole.items() if not is_self(p)),
  )
