"""Model- and data-parallel decoding over a ('data', 'model') device mesh.

T5X's scheme (t5x/partitioning.py), on `jax.jit` with NamedShardings:

  mesh   = partitioning.make_mesh(num_partitions=4)   # [devices/4, 4] devices
  rules  = partitioning.standard_logical_axis_rules() # logical name -> mesh axis
  predict = compile_predict_sharded(model, mesh, rules, {'temperature': 0.0,
                                                         'gamma': 7})
  params = predict.shard_params(params)               # once: lay params out
  decodes, aux = predict(params, batch, rng)          # jit(in/out_shardings)

Params, both decode caches, the batch and the outputs are laid out by
partitioning's rules (see its docstring for the logical names), so the
weights, the target's verify call and the drafter's steps run
model-parallel and the batch data-parallel. Both models' caches are pinned
to their layout when built and after every decode step (`constrain_cache`
in models.py); activations follow by XLA's sharding propagation.
`partitioning.to_host` brings outputs back (from every host, on
multi-host).
"""

from typing import Any, Mapping, Optional, Tuple

import flax
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

from specdec import models
from specdec import partitioning

PyTree = Any

# The batch features a predict call reads ([B, length] int each).
DATA_FEATURES = ('encoder_input_tokens', 'decoder_input_tokens')


def param_specs(model: models.SpeculativeEncoderDecoderModel, params: PyTree,
                rules: partitioning.LogicalAxisRules,
                axis_sizes: Mapping[str, int]) -> PyTree:
  """Mesh PartitionSpecs for {'target': ..., 'drafter': ...} params.

  Params of a network the model lacks (a drafter passed to a baseline
  model) are replicated.
  """
  params = flax.core.unfreeze(params)
  modules = {models.TARGET: model.module, models.DRAFTER: model.drafter_module}
  specs = {}
  for name, tree in params.items():
    specs[name] = partitioning.param_specs(modules.get(name), tree, rules,
                                           axis_sizes)
  return specs


def _signature(tree: PyTree) -> Tuple:
  """Tree structure, shapes and dtypes: what a jitted program depends on."""
  leaves, treedef = jax.tree_util.tree_flatten(flax.core.unfreeze(tree))
  return (treedef,) + tuple((np.shape(x), str(x.dtype)) for x in leaves)


class ShardedPredictor:
  """`model.predict_batch_with_aux` jit-compiled over a ('data', 'model') mesh.

  `predictor(params, batch, rng) -> (decodes, aux)` as `model.compile_predict`
  gives, computed with params, both decode caches, the batch and the outputs
  laid out by `rules` on `mesh`. One jit per batch shape; params are placed
  on the mesh (no-op once `shard_params` did it).

  `decoder_params` are static, as in `compile_predict`. A per-call
  `temperature=` instead makes the temperature a traced scalar: one program
  for every temperature (a sweep, t = 0 and t = 1 of the paper's tables),
  at the price of computing both the argmax and the sampling branch.
  """

  def __init__(self, model: models.SpeculativeEncoderDecoderModel, mesh: Mesh,
               rules: Optional[partitioning.LogicalAxisRules] = None,
               decoder_params: Optional[Mapping[str, Any]] = None,
               num_decodes: int = 1, return_all_decodes: bool = False,
               prompt_with_targets: bool = False):
    self.model = model
    self.mesh = mesh
    self.rules = tuple(partitioning.standard_logical_axis_rules()
                       if rules is None else rules)
    self.axis_sizes = partitioning.mesh_axis_sizes(mesh)
    partitioning.check_rules(self.rules, self.axis_sizes)
    self.decoder_params = dict(decoder_params or {})
    self._predict_kwargs = dict(
        num_decodes=num_decodes, return_all_decodes=return_all_decodes,
        prompt_with_targets=prompt_with_targets,
        constrain_cache=self.constrain_cache,
        # `_inputs` validates every batch before the jitted call (in-graph too when
        # the caller traces it): no second, compiled-in id check per call.
        check_traced_ids=False)
    self._jitted = {}
    self._param_shardings = {}

  # Layouts. ---------------------------------------------------------------

  def param_shardings(self, params: PyTree) -> PyTree:
    key = _signature(params)
    if key not in self._param_shardings:
      self._param_shardings[key] = partitioning.named_shardings(
          self.mesh, param_specs(self.model, params, self.rules,
                                 self.axis_sizes))
    return self._param_shardings[key]

  def cache_shardings(self, cache: PyTree) -> PyTree:
    return partitioning.named_shardings(
        self.mesh, partitioning.cache_specs(cache, self.rules, self.axis_sizes))

  def batch_shardings(self, batch: Mapping[str, Any]) -> dict:
    return partitioning.named_shardings(
        self.mesh, partitioning.batch_specs(batch, self.rules, self.axis_sizes))

  def output_sharding(self, batch_size: int) -> NamedSharding:
    """Every output has the batch first: one sharding for all of them."""
    spec = partitioning.logical_to_mesh_specs(
        PartitionSpec('batch'), jax.ShapeDtypeStruct((batch_size,), np.int32),
        self.rules, self.axis_sizes)
    return NamedSharding(self.mesh, spec)

  def constrain_cache(self, cache: PyTree) -> PyTree:
    """Pins a cache (inside jit) to its layout; {} (n-gram) passes through."""
    if not jax.tree_util.tree_leaves(cache):
      return cache
    return jax.lax.with_sharding_constraint(cache, self.cache_shardings(cache))

  def shard_params(self, params: PyTree) -> PyTree:
    """Params laid out on the mesh (do this once, not per call)."""
    return partitioning.put_tree(flax.core.unfreeze(params),
                                 self.param_shardings(params))

  # Calls. -----------------------------------------------------------------

  def _inputs(self, params, batch, rng):
    self.model.validate_batch(batch)
    batch = {k: batch[k] for k in DATA_FEATURES}
    params = flax.core.unfreeze(params)
    return params, batch, rng

  def init_caches(self, params: PyTree, batch: Mapping[str, Any]) -> dict:
    """Both networks' fresh caches {'target': ..., 'drafter': ...}, sharded.

    What the predict call builds internally, returned for inspection
    (layouts, memory); compiled anew on each call.
    """
    params, batch, _ = self._inputs(params, batch, None)
    model = self.model

    def build(params, batch):
      length = batch['decoder_input_tokens'].shape[1]
      if model.drafter_module is not None and models.DRAFTER in params:
        target_cache, _, draft_cache, _ = model.drafter_kind.decoder_fns(
            model.module, params[models.TARGET], model.drafter_module, params[models.DRAFTER],
            batch['encoder_input_tokens'], length, model.decoder_fns, self.constrain_cache)
        return {models.TARGET: target_cache, models.DRAFTER: draft_cache}
      return {models.TARGET: model.decoder_fns(model.module, params[models.TARGET], batch['encoder_input_tokens'],
                                               length, self.constrain_cache)[0]}

    caches = jax.eval_shape(build, params, batch)
    out = {name: self.cache_shardings(cache) for name, cache in caches.items()}
    jitted = jax.jit(build, in_shardings=(self.param_shardings(params),
                                          self.batch_shardings(batch)),
                     out_shardings=out)
    return jitted(partitioning.put_tree(params, self.param_shardings(params)),
                  partitioning.put_tree(batch, self.batch_shardings(batch)))

  def _predict(self, params, batch, rng, temperature):
    decoder_params = self.decoder_params
    if temperature is not None:
      decoder_params = dict(decoder_params, temperature=temperature)
    return self.model.predict_batch_with_aux(
        params, batch, rng, decoder_params=decoder_params,
        **self._predict_kwargs)

  def _jit_for(self, params, batch, rng, traced_temperature: bool):
    """The jitted predict for these shapes (arrays or ShapeDtypeStructs)."""
    key = (_signature(params), _signature(batch),
           None if rng is None else _signature(rng), not traced_temperature)
    if key not in self._jitted:
      replicated = NamedSharding(self.mesh, PartitionSpec())
      batch_size = batch['encoder_input_tokens'].shape[0]
      self._jitted[key] = jax.jit(
          self._predict,
          in_shardings=(self.param_shardings(params),
                        self.batch_shardings(batch),
                        None if rng is None else replicated,
                        replicated if traced_temperature else None),
          out_shardings=self.output_sharding(batch_size))
    return self._jitted[key]

  def _compiled_and_args(self, params, batch, rng, temperature):
    """The jitted predict for these shapes, and the arguments laid out."""
    params, batch, rng = self._inputs(params, batch, rng)
    if temperature is not None:
      temperature = np.asarray(temperature, np.float32)
      if temperature.ndim or not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f'temperature must be a finite scalar >= 0, got '
                         f'{temperature}.')
    replicated = NamedSharding(self.mesh, PartitionSpec())
    place = lambda x: None if x is None else partitioning.put_array(
        x, replicated)
    args = (partitioning.put_tree(params, self.param_shardings(params)),
            partitioning.put_tree(batch, self.batch_shardings(batch)),
            place(rng), place(temperature))
    return self._jit_for(params, batch, rng, temperature is not None), args

  def lower(self, params: PyTree, batch: Mapping[str, Any],
            rng: Optional[jax.Array] = None, temperature=None):
    """`jax.stages.Lowered` of the call (HLO, `.compile().memory_analysis()`)."""
    jitted, args = self._compiled_and_args(params, batch, rng, temperature)
    return jitted.lower(*args)

  def lower_shapes(self, params: PyTree, batch: Mapping[str, Any],
                   rng: Optional[Any] = None, traced_temperature: bool = False):
    """`jax.stages.Lowered` of the call for ShapeDtypeStructs: nothing placed or allocated.

    The same jitted program as a call with arrays of these shapes (its mesh
    may be a TPU topology's devices that this machine cannot run:
    `tpu_programs`); `traced_temperature` as a per-call `temperature=`.
    """
    params = flax.core.unfreeze(params)
    batch = {k: batch[k] for k in DATA_FEATURES}
    temperature = (jax.ShapeDtypeStruct((), np.float32) if traced_temperature
                   else None)
    return self._jit_for(params, batch, rng, traced_temperature).lower(
        params, batch, rng, temperature)

  def __call__(self, params: PyTree, batch: Mapping[str, Any],
               rng: Optional[jax.Array] = None, temperature=None):
    """(decodes, aux); `temperature` (optional) overrides decoder_params'."""
    jitted, args = self._compiled_and_args(params, batch, rng, temperature)
    return jitted(*args)


def compile_predict_sharded(
    model: models.SpeculativeEncoderDecoderModel, mesh: Mesh,
    rules: Optional[partitioning.LogicalAxisRules] = None,
    decoder_params: Optional[Mapping[str, Any]] = None, num_decodes: int = 1,
    return_all_decodes: bool = False,
    prompt_with_targets: bool = False) -> ShardedPredictor:
  """The sharded counterpart of `model.compile_predict(decoder_params, ...)`."""
  return ShardedPredictor(model, mesh, rules, decoder_params, num_decodes,
                          return_all_decodes, prompt_with_targets)
