"""The ('data', 'model') device mesh and T5X's logical axis rules.

T5X's scheme (t5x/partitioning.py), for `jax.jit` with NamedShardings:

  mesh  = make_mesh(num_partitions=4)               # [devices/4, 4] devices
  rules = standard_logical_axis_rules()             # logical name -> mesh axis
  specs = logical_to_mesh_specs(logical, arrays, rules, mesh_axis_sizes(mesh))

Every array has logical axis names: params from their
`nn.with_logical_partitioning` boxes (`network.param_logical_axes`), decode
caches by leaf name (`network.CACHE_LOGICAL_AXES`: batch, length, heads, kv),
batch features ('batch', 'length'), outputs 'batch' first. The rules map
names to mesh axes (batch -> data; vocab, mlp, heads, joined_kv -> model).
Sharded decoding (specdec/sharded_decoding.py) and training
(specdec/training/train.py) lay their arrays out with these; specdec/memory.py
counts the bytes a layout puts on each device.

Non-divisible dimensions: a dimension whose size is not a multiple of the
mesh axes it maps to (batch 1 on data=8; 6 heads on model=4; a tiny vocab)
is replicated instead (`fit_spec`), logged at INFO. Sharding it would either
fail (device_put) or pad unevenly; replication is always correct, only
costlier in memory, which `memory.bytes_per_device` and the XXL plan
account for.

Multi-host: call `initialize_multihost()` first thing; every process then
passes the same global params and batch (`put_tree`), and `to_host`
gathers outputs.

Training lays its state out with the same rules, but strictly:
`check_divisible` refuses a parameter dimension its mesh axes do not divide
(replicating it would silently multiply the memory of the largest weights),
`optimizer_state_specs` gives each optimizer-state leaf the layout of its
parameter, and `host_batch_shard` says which slice of the global batch each
host loads.
"""

import functools
import logging
import math
import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import flax
import flax.linen as nn
import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

from specdec import drafters
from specdec import network

PyTree = Any
MeshAxes = Union[None, str, Tuple[str, ...]]
LogicalAxisRules = Sequence[Tuple[str, MeshAxes]]

MESH_AXES = ('data', 'model')

_log = logging.getLogger(__name__)


# -----------------------------------------------------------------------------
# Mesh and rules.
# -----------------------------------------------------------------------------


def make_mesh(num_partitions: int = 1,
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A [len(devices) // num_partitions, num_partitions] ('data', 'model') mesh.

  `devices` defaults to all devices (every process's, on multi-host). On TPU
  `mesh_utils.create_device_mesh` puts each model-parallel group on nearby
  chips; where it cannot (e.g. an arbitrary device subset) devices are laid
  out in the given order.
  """
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError('make_mesh: no devices given.')
  if (isinstance(num_partitions, bool) or
      not isinstance(num_partitions, (int, np.integer)) or num_partitions < 1):
    raise ValueError(f'num_partitions must be a positive int, got '
                     f'{num_partitions!r}.')
  if len(devices) % num_partitions:
    raise ValueError(f'num_partitions={num_partitions} does not divide the '
                     f'{len(devices)} devices.')
  shape = (len(devices) // num_partitions, int(num_partitions))
  try:
    grid = mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError) as e:
    _log.info('create_device_mesh(%s) failed (%s); devices in given order.',
              shape, e)
    grid = np.asarray(devices, dtype=object).reshape(shape)
  return Mesh(grid, MESH_AXES)


def mesh_axis_sizes(mesh: Union[Mesh, Mapping[str, int]]) -> dict:
  """{axis name: size} of a Mesh, an AbstractMesh or a plain mapping."""
  sizes = dict(mesh.shape) if hasattr(mesh, 'axis_names') else dict(mesh)
  for name, size in sizes.items():
    if not isinstance(size, (int, np.integer)) or size < 1:
      raise ValueError(f'mesh axis {name!r} has size {size!r}.')
  return sizes


def standard_logical_axis_rules(
    activation_partitioning_dims: int = 1,
    parameter_partitioning_dims: int = 1,
    additional_rules: Optional[LogicalAxisRules] = None,
) -> Tuple[Tuple[str, MeshAxes], ...]:
  """T5X's default rules (same names, order and variants).

  1-D: batch -> data; vocab, mlp, heads, joined_kv -> model; embed, kv and
  the length-like names replicated. 2-D parameters shard embed along data
  (weights over all devices, e.g. ('data', 'model') for an (embed, mlp)
  kernel); 2-D activations shard embed along model where that axis is still
  free. Earlier rules win (flax assigns a mesh axis once per array).
  """
  dims = (activation_partitioning_dims, parameter_partitioning_dims)
  common = [('batch', 'data'), ('vocab', 'model'), ('mlp', 'model'),
            ('heads', 'model'), ('kv', None), ('joined_kv', 'model')]
  if dims == (1, 1):
    rules = [('batch', 'data'), ('vocab', 'model'), ('embed', None),
             ('mlp', 'model'), ('heads', 'model'), ('kv', None),
             ('joined_kv', 'model')]
  elif dims == (2, 1):
    rules = common + [('embed', 'model')]
  elif dims == (1, 2):
    rules = common + [('embed', 'data')]
  elif dims == (2, 2):
    rules = common + [('embed', 'model'), ('embed', 'data')]
  else:
    raise ValueError(
        f'activation_partitioning_dims={activation_partitioning_dims}, '
        f'parameter_partitioning_dims={parameter_partitioning_dims}: only 1 '
        'or 2 each are supported.')
  rules += [('relpos_buckets', None), ('abspos_buckets', None),
            ('length', None), ('layers', None), ('stack', None),
            ('mlp_activations', None)]
  rules += list(additional_rules or ())
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
               for name, axes in rules)


def rule_mesh_axes(axes: MeshAxes) -> Tuple[str, ...]:
  """The mesh axis names of a rule's (or a PartitionSpec entry's) axes."""
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def check_rules(rules: LogicalAxisRules, axis_sizes: Mapping[str, int]) -> None:
  """Raises ValueError for malformed rules or a mesh axis the mesh lacks."""
  for rule in rules:
    if (not isinstance(rule, (tuple, list)) or len(rule) != 2 or
        not isinstance(rule[0], str)):
      raise ValueError(f'A logical axis rule must be (name, mesh axes), got '
                       f'{rule!r}.')
    for axis in rule_mesh_axes(rule[1]):
      if axis not in axis_sizes:
        raise ValueError(f'Rule {tuple(rule)!r} names mesh axis {axis!r}; the '
                         f'mesh has {tuple(axis_sizes)}.')


# -----------------------------------------------------------------------------
# Logical axes -> mesh PartitionSpecs, with the divisibility fallback.
# -----------------------------------------------------------------------------


def fit_spec(spec: PartitionSpec, shape: Sequence[int],
             axis_sizes: Mapping[str, int], where: str = '') -> PartitionSpec:
  """`spec` with every dimension that does not divide evenly replicated.

  A dimension of size n mapped to mesh axes of total size m stays sharded
  iff n % m == 0; otherwise it becomes None (replicated), logged at INFO.
  """
  entries = tuple(spec) + (None,) * (len(shape) - len(spec))
  if len(entries) > len(shape):
    raise ValueError(f'{where or "array"}: spec {spec} has more entries than '
                     f'shape {tuple(shape)} has dimensions.')
  fitted = []
  for dim, (size, axes) in enumerate(zip(shape, entries)):
    ways = math.prod(axis_sizes[a] for a in rule_mesh_axes(axes))
    if axes is not None and size % ways:
      _log.info('%s: dimension %d (size %d) does not divide over mesh axes %s '
                '(%d ways): replicated.', where or 'array', dim, size, axes,
                ways)
      axes = None
    fitted.append(axes)
  while fitted and fitted[-1] is None:  # Canonical: P('data') not P('data', None).
    fitted.pop()
  return PartitionSpec(*fitted)


def _is_spec(x) -> bool:
  return isinstance(x, PartitionSpec)


def logical_to_mesh_specs(logical_tree: PyTree, shapes_tree: PyTree,
                          rules: LogicalAxisRules,
                          axis_sizes: Mapping[str, int]) -> PyTree:
  """Logical PartitionSpecs -> mesh PartitionSpecs fitted to the shapes.

  `shapes_tree` holds arrays or ShapeDtypeStructs with the structure of
  `logical_tree`. Every logical name must have a rule (use (name, None) to
  replicate): an unknown name raises rather than being replicated unseen.
  """
  check_rules(rules, axis_sizes)
  known = {name for name, _ in rules}
  logical_leaves, treedef = jax.tree_util.tree_flatten(
      flax.core.unfreeze(logical_tree), is_leaf=_is_spec)
  shapes_with_paths, shapes_def = jax.tree_util.tree_flatten_with_path(
      flax.core.unfreeze(shapes_tree))
  if shapes_def != treedef:
    raise ValueError(f'Logical axes and arrays differ in structure:\n'
                     f'{treedef}\nvs\n{shapes_def}')
  specs = []
  for logical, (path, leaf) in zip(logical_leaves, shapes_with_paths):
    where = jax.tree_util.keystr(path)
    logical = PartitionSpec() if logical is None else logical
    for name in logical:
      if name is not None and name not in known:
        raise ValueError(f'{where}: logical axis {name!r} has no rule; add '
                         f'({name!r}, None) to replicate it or map it to a '
                         'mesh axis.')
    mesh_spec = nn.logical_to_mesh_axes(tuple(logical), rules)
    specs.append(fit_spec(mesh_spec, np.shape(leaf), axis_sizes, where))
  return jax.tree_util.tree_unflatten(treedef, specs)


def named_shardings(mesh: Mesh, spec_tree: PyTree) -> PyTree:
  return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), spec_tree,
                                is_leaf=_is_spec)


@functools.lru_cache(maxsize=None)
def _transformer_logical_axes(config: network.T5Config) -> PyTree:
  return flax.core.unfreeze(network.param_logical_axes(config))


def param_logical_axes(module: Any, params: PyTree) -> PyTree:
  """Logical axes of one network's params.

  A `network.Transformer` has T5X's names, a feature head
  (`feature_drafter.FeatureHead`) the same names for the same kinds of
  weights. Any other module (e.g. an n-gram drafter) gets all-replicated
  params: it has no logical names.
  """
  if isinstance(module, network.Transformer):
    return _transformer_logical_axes(module.config)
  axes = drafters.kind_of(module).param_logical_axes(module)
  if axes is not None:
    return axes
  return jax.tree_util.tree_map(lambda _: PartitionSpec(),
                                flax.core.unfreeze(params))


def param_specs(module: Any, params: PyTree, rules: LogicalAxisRules,
                axis_sizes: Mapping[str, int]) -> PyTree:
  """Mesh PartitionSpecs of one network's params (arrays or ShapeDtypeStructs), from their logical axes."""
  return logical_to_mesh_specs(param_logical_axes(module, params), params, rules, axis_sizes)


def param_shardings(module: Any, params: PyTree, mesh: Mesh,
                    rules: Optional[LogicalAxisRules] = None) -> PyTree:
  """One network's params laid out on `mesh` by `rules` (T5X's standard ones by default): the layout a sharded
  predictor gives them, without building a model or a predictor."""
  rules = tuple(standard_logical_axis_rules() if rules is None else rules)
  axis_sizes = mesh_axis_sizes(mesh)
  check_rules(rules, axis_sizes)
  return named_shardings(mesh, param_specs(module, params, rules, axis_sizes))


def cache_specs(cache: PyTree, rules: LogicalAxisRules,
                axis_sizes: Mapping[str, int]) -> PyTree:
  """Mesh PartitionSpecs for a decode cache (see network.CACHE_LOGICAL_AXES)."""
  return logical_to_mesh_specs(network.cache_logical_axes(cache), cache,
                               rules, axis_sizes)


def batch_specs(batch: Mapping[str, Any], rules: LogicalAxisRules,
                axis_sizes: Mapping[str, int]) -> dict:
  """('batch', 'length') for every [B, L] feature."""
  logical = {k: PartitionSpec('batch', 'length') for k in batch}
  return logical_to_mesh_specs(logical, dict(batch), rules, axis_sizes)


# -----------------------------------------------------------------------------
# Training layouts: strict divisibility, optimizer state, per-host batches.
# -----------------------------------------------------------------------------


def undivisible_dims(logical_tree: PyTree, shapes_tree: PyTree,
                     rules: LogicalAxisRules,
                     axis_sizes: Mapping[str, int]) -> List[str]:
  """One line per dimension that `rules` shard but its mesh axes do not divide.

  `logical_to_mesh_specs` replicates such dimensions (right for decoding,
  where a batch of 1 or a tiny vocabulary is normal); a trainer wants to
  know instead. Same arguments as `logical_to_mesh_specs`.
  """
  check_rules(rules, axis_sizes)
  logical_leaves = jax.tree_util.tree_leaves(flax.core.unfreeze(logical_tree),
                                             is_leaf=_is_spec)
  shapes = jax.tree_util.tree_flatten_with_path(
      flax.core.unfreeze(shapes_tree))[0]
  if len(logical_leaves) != len(shapes):
    raise ValueError(f'{len(shapes)} arrays but {len(logical_leaves)} logical '
                     'axes.')
  problems = []
  for logical, (path, leaf) in zip(logical_leaves, shapes):
    logical = PartitionSpec() if logical is None else logical
    mesh_spec = nn.logical_to_mesh_axes(tuple(logical), rules)
    for dim, (size, axes) in enumerate(zip(np.shape(leaf), tuple(mesh_spec))):
      ways = math.prod(axis_sizes[a] for a in rule_mesh_axes(axes))
      if size % ways:
        problems.append(
            f'{jax.tree_util.keystr(path)} dimension {dim} '
            f'({logical[dim]!r}, size {size}) over mesh axes {axes} '
            f'({ways} ways)')
  return problems


def check_divisible(logical_tree: PyTree, shapes_tree: PyTree,
                    rules: LogicalAxisRules, axis_sizes: Mapping[str, int],
                    what: str = 'params') -> None:
  """Raises ValueError naming every dimension the mesh does not divide."""
  problems = undivisible_dims(logical_tree, shapes_tree, rules, axis_sizes)
  if problems:
    raise ValueError(
        f'The mesh {dict(axis_sizes)} does not divide the {what}: '
        + '; '.join(problems[:8])
        + (f' (and {len(problems) - 8} more)' if len(problems) > 8 else '')
        + '. Choose a num_partitions that divides num_heads, '
        'num_heads * head_dim, mlp_dim and vocab_size (and, with 2-D '
        'parameter partitioning, a data axis that divides emb_dim).')


def _trailing_dict_keys(path) -> Tuple[Tuple[str, ...], Optional[str]]:
  """(the dict keys that end `path`, the attribute name just before them)."""
  keys = []
  for entry in reversed(path):
    if isinstance(entry, jax.tree_util.DictKey):
      keys.append(entry.key)
      continue
    return tuple(reversed(keys)), getattr(entry, 'name', None)
  return tuple(reversed(keys)), None


def _dropped_dim(param_shape: Sequence[int], moment_shape: Sequence[int],
                 field: Optional[str]) -> Optional[int]:
  """The dimension a factored moment reduced away, or None if unknown.

  Adafactor (optax, T5X) factors the two largest dimensions d1 <= d0 of a
  parameter: `v_row` keeps all but d0, `v_col` all but d1. Dimensions of
  equal size are told apart by that rule; otherwise by shape alone.
  """
  candidates = [d for d in range(len(param_shape))
                if tuple(np.delete(param_shape, d)) == tuple(moment_shape)]
  if len(candidates) <= 1:
    return candidates[0] if candidates else None
  order = np.argsort(param_shape, kind='stable')
  by_rule = {'v_row': int(order[-1]), 'v_col': int(order[-2])}.get(field)
  return by_rule if by_rule in candidates else candidates[0]


def optimizer_state_specs(opt_state: PyTree, params: PyTree,
                          param_spec_tree: PyTree) -> PyTree:
  """A mesh PartitionSpec for every optimizer-state leaf, following its parameter.

  optax keeps per-parameter state in subtrees shaped like the params (Adam's
  mu and nu; Adafactor's v, v_row, v_col), so a leaf belongs to the
  parameter whose path ends its own path. It takes
  * the parameter's spec, if it has the parameter's shape (mu, nu, an
    unfactored v);
  * that spec less the reduced dimension, if it has one dimension fewer
    (Adafactor's factored moments: v_row [rows], v_col [cols] of an
    (rows, cols) kernel; `_dropped_dim`);
  * replicated otherwise (step counts, Adafactor's (1,) placeholders).
  Any layout is correct (XLA moves data as needed); following the parameter
  keeps each update on the devices that hold the parameter.

  Args:
    opt_state: the state (arrays or ShapeDtypeStructs, e.g. from
      `jax.eval_shape(optimizer.init, params)`).
    params: the params tree (arrays or ShapeDtypeStructs).
    param_spec_tree: the params' fitted mesh PartitionSpecs.
  """
  params = flax.core.unfreeze(params)
  shapes = {tuple(k.key for k in path): np.shape(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  specs = {tuple(k.key for k in path): spec
           for path, spec in jax.tree_util.tree_flatten_with_path(
               flax.core.unfreeze(param_spec_tree), is_leaf=_is_spec)[0]}

  def spec_of(path, leaf):
    keys, field = _trailing_dict_keys(path)
    shape = tuple(np.shape(leaf))
    if keys not in specs:
      return PartitionSpec()
    param_shape, spec = shapes[keys], specs[keys]
    entries = tuple(spec) + (None,) * (len(param_shape) - len(spec))
    if shape == tuple(param_shape):
      return spec
    if len(shape) == len(param_shape) - 1:
      dropped = _dropped_dim(param_shape, shape, field)
      if dropped is not None:
        kept = entries[:dropped] + entries[dropped + 1:]
        while kept and kept[-1] is None:
          kept = kept[:-1]
        return PartitionSpec(*kept)
    return PartitionSpec()

  return jax.tree_util.tree_map_with_path(spec_of, opt_state)


def host_batch_shard(mesh_devices: np.ndarray, batch_size: int,
                     process_index: int) -> Tuple[int, int]:
  """(shard index, number of shards) of the batch rows `process_index` loads.

  With the batch sharded over 'data' (mesh axis 0 of `mesh_devices`, a
  [data, model] array of devices with `.process_index`), data position i
  holds rows [i * B / data, (i + 1) * B / data). A host loads the rows its
  devices hold: hosts whose devices share data positions (a model-parallel
  group across hosts) load the same shard. On one host: (0, 1).
  """
  devices = np.asarray(mesh_devices, dtype=object)
  data = devices.shape[0]
  if batch_size % data:
    raise ValueError(f'batch_size={batch_size} does not divide over the '
                     f'{data} data-parallel positions.')
  positions = {}
  for i in range(data):
    for device in devices[i].ravel():
      positions.setdefault(device.process_index, set()).add(i)
  ranges = {}
  for process, held in positions.items():
    first, last = min(held), max(held)
    if len(held) != last - first + 1:
      raise ValueError(f'Process {process} holds data positions {sorted(held)}, '
                       'not a contiguous block: its batch rows cannot be one slice.')
    ranges[process] = (first, last + 1)
  distinct = sorted(set(ranges.values()))
  sizes = {stop - start for start, stop in distinct}
  overlapping = any(a[1] > b[0] for a, b in zip(distinct, distinct[1:]))
  if len(sizes) != 1 or overlapping:
    raise ValueError(f'Hosts hold uneven or overlapping blocks of data '
                     f'positions {distinct}: the batch cannot be loaded per host.')
  if process_index not in ranges:
    raise ValueError(f'Process {process_index} has no device in the mesh.')
  return distinct.index(ranges[process_index]), len(distinct)


def global_batch(local_batch: Mapping[str, np.ndarray],
                 sharding: NamedSharding, batch_size: int) -> dict:
  """Global [batch_size, ...] arrays from this host's rows (`host_batch_shard`).

  On one process the local batch is the whole batch (`jax.device_put`).
  """
  if jax.process_count() == 1:
    return jax.device_put(dict(local_batch), sharding)
  return {k: jax.make_array_from_process_local_data(
      sharding, np.asarray(v), (batch_size,) + np.shape(v)[1:])
          for k, v in local_batch.items()}


# -----------------------------------------------------------------------------
# Placing data, and getting it back.
# -----------------------------------------------------------------------------


def put_array(x: Any, sharding: NamedSharding) -> jax.Array:
  """x laid out by `sharding`; on multi-host every process passes the same x."""
  if jax.process_count() == 1 or (isinstance(x, jax.Array) and
                                  not x.is_fully_addressable):
    return jax.device_put(x, sharding)
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding,
                                      lambda index: host[index])


def put_tree(tree: PyTree, shardings: PyTree) -> PyTree:
  """Every leaf of `tree` laid out by its sharding in `shardings` (`put_array`)."""
  return jax.tree_util.tree_map(put_array, tree, shardings)


def to_host(tree: PyTree) -> PyTree:
  """numpy copies of (possibly multi-host) global arrays, on every process."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_get(tree)


# -----------------------------------------------------------------------------
# Multi-host.
# -----------------------------------------------------------------------------

MULTIHOST_ENV = 'SPECDEC_MULTIHOST'
# jax.distributed reads JAX_COORDINATOR_ADDRESS itself; these two complete it where no cluster
# environment (Slurm, MPI, Cloud TPU metadata) tells JAX the process count and this process's id,
# e.g. several processes started by hand on one machine or across plain VMs.
NUM_PROCESSES_ENV = 'JAX_NUM_PROCESSES'
PROCESS_ID_ENV = 'JAX_PROCESS_ID'
# Process counts set by launchers (Slurm, Open MPI, MPICH/PMI).
_PROCESS_COUNT_ENVS = ('SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE', 'PMI_SIZE')


def _int_env(name: str) -> Optional[int]:
  """The non-negative int in environment variable `name`, or None if unset; ValueError otherwise."""
  value = os.environ.get(name)
  if value is None or value == '':
    return None
  if not value.strip().isdigit():
    raise ValueError(f'{name}={value!r}: expected a non-negative integer.')
  return int(value)


def _env_says_multihost(coordinator_address: Optional[str],
                        num_processes: Optional[int]) -> bool:
  env = os.environ
  flag = env.get(MULTIHOST_ENV)
  if flag is not None:
    if flag.lower() in ('1', 'true', 'yes'):
      return True
    if flag.lower() in ('0', 'false', 'no', ''):
      return False
    raise ValueError(f'{MULTIHOST_ENV}={flag!r}: use 1 or 0.')
  if num_processes is not None:
    return num_processes > 1
  if _int_env(NUM_PROCESSES_ENV) is not None:
    return _int_env(NUM_PROCESSES_ENV) > 1
  if coordinator_address or env.get('JAX_COORDINATOR_ADDRESS'):
    return True
  for name in _PROCESS_COUNT_ENVS:
    value = env.get(name, '')
    if value.isdigit() and int(value) > 1:
      return True
  # Cloud TPU pod slices on GKE list every worker here.
  hosts = [h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]
  return len(hosts) > 1


def initialize_multihost(coordinator_address: Optional[str] = None,
                         num_processes: Optional[int] = None,
                         process_id: Optional[int] = None,
                         local_device_ids: Optional[Sequence[int]] = None,
                         *, enabled: Optional[bool] = None) -> bool:
  """`jax.distributed.initialize(...)` on multi-host runs; True if it called it.

  Call it before any other JAX work. `enabled=None` decides from the
  environment: SPECDEC_MULTIHOST=1/0 forces it; else multi-host means
  num_processes > 1, a coordinator address (argument or
  JAX_COORDINATOR_ADDRESS), JAX_NUM_PROCESSES > 1, a launcher's process
  count > 1 (SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PMI_SIZE) or several
  TPU_WORKER_HOSTNAMES. Cloud TPU VM pod slices that set none of these: pass
  enabled=True (or set SPECDEC_MULTIHOST=1) and JAX finds the workers from
  TPU metadata. Elsewhere (processes started by hand) give every process
  JAX_COORDINATOR_ADDRESS=host:port of process 0, JAX_NUM_PROCESSES and its
  own JAX_PROCESS_ID (0 ... N-1), used where the arguments are None. A
  single process is a no-op (JAX sees its local devices without it), as is
  a second call.
  """
  if enabled is None:
    enabled = _env_says_multihost(coordinator_address, num_processes)
  if not enabled:
    _log.info('Single host: jax.distributed.initialize not called.')
    return False
  is_initialized = getattr(jax.distributed, 'is_initialized', None)
  if is_initialized is not None and is_initialized():
    return False
  if num_processes is None:
    num_processes = _int_env(NUM_PROCESSES_ENV)
  if process_id is None:
    process_id = _int_env(PROCESS_ID_ENV)
  kwargs = dict(coordinator_address=coordinator_address,
                num_processes=num_processes, process_id=process_id,
                local_device_ids=local_device_ids)
  jax.distributed.initialize(**{k: v for k, v in kwargs.items()
                                if v is not None})
  _log.info('jax.distributed initialised: process %d of %d.',
            jax.process_index(), jax.process_count())
  return True
