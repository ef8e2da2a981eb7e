"""The programs the Cloud TPU launches run, built for abstract params on any mesh (nothing allocated).

docs/cloud_tpu.md launches two kinds of run; each is read here through the code that launch runs:

* a Table-2 row (`python -m specdec.main --gin_file=experiments/table2/<row>.gin`): the gin files parsed by
  `main.parse_command_line`, the config `main.run` would get (`main.configured_run_config`), checked by
  `run_config.check` and planned by `main.output_plans`; its baseline and speculative predictors are
  `benchmark.sharded_decoders`, lowered by `ShardedPredictor.lower_shapes` for ShapeDtypeStructs of the
  params in the run's dtype and the largest batch the run makes (`evaluation.batches`: batch_size rows,
  the longest input bucket, all target positions);
* a fine-tune (`python -m specdec.training.train --gin_file=train/table2/<run>.gin`): `train.parse_config`, the state
  laid out by `train.lay_out` (Adafactor's factored moments included) and the step `train.jit_train_step`
  compiles, lowered for a batch of `batch_size` packed rows.

Beside the whole decode (a `while_loop`, whose body XLA's cost analysis counts once), two straight-line programs
per row give per-call FLOPs and bytes: one verify call of the target (γ + 1 tokens into its cache,
`models.decoder_fns`' `tokens_to_logits`) and one draft step of the drafter (1 token), each with its cache laid
out as the sharded decode lays it out.

A `Program` names the program and lowers it on demand (`lower()`), so a caller compiles one at a time.
"""

import dataclasses
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
ABSTRACT_DIR = '/nonexistent/tpu-compile-check'  # OUTPUT_DIR / MODEL_DIR: nothing is ever written there


@dataclasses.dataclass(frozen=True)
class Program:
  """One program to compile: `name` (unique in a sweep), what it is, and how to lower it.

  kind: 'decode' (speculative decode of a row), 'baseline' (the row's target-only decode), 'verify' (one verify
  call), 'draft_step' (one drafter step) or 'train_step'. straight_line: no loop, so the compiler's FLOPs and
  bytes are per call. settings: what the program was built from (gin file, mesh, batch, lengths, γ, ...).
  """
  name: str
  kind: str
  straight_line: bool
  settings: Mapping[str, Any]
  lower: Callable[[], Any] = dataclasses.field(compare=False, repr=False)


def _abstract(tree: PyTree, dtype=None) -> PyTree:
  """ShapeDtypeStructs of `tree`'s leaves, floating ones cast to `dtype` (a checkpoint read in that dtype)."""
  def cast(x):
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    return jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype) if dtype and floating else x.dtype)
  return jax.tree_util.tree_map(cast, tree)


def abstract_params(config, dtype: Optional[str]) -> PyTree:
  """A T5 network's params as ShapeDtypeStructs in `dtype` (float32 when None), as `checkpoints.restore_params`
  reads them."""
  from specdec import checkpoints  # pylint: disable=g-import-not-at-top
  return _abstract(checkpoints.expected_params(config), dtype or 'float32')


def _rng_shape() -> jax.ShapeDtypeStruct:
  return jax.eval_shape(lambda: jax.random.PRNGKey(0))


def decode_batch_shapes(batch_size: int, lengths: Mapping[str, int]) -> Dict[str, jax.ShapeDtypeStruct]:
  """The largest batch `evaluation.batches` makes: [batch_size, inputs] and [batch_size, targets] int32."""
  return {'encoder_input_tokens': jax.ShapeDtypeStruct((batch_size, lengths['inputs']), np.int32),
          'decoder_input_tokens': jax.ShapeDtypeStruct((batch_size, lengths['targets']), np.int32)}


def train_batch_shapes(batch_size: int, lengths: Mapping[str, int]) -> Dict[str, jax.ShapeDtypeStruct]:
  """A packed seqio EncDecFeatureConverter batch of `train.BATCH_KEYS`, int32, [batch_size, length]."""
  from specdec.training import train  # pylint: disable=g-import-not-at-top
  shapes = {}
  for key in train.BATCH_KEYS:
    length = lengths['inputs'] if key.startswith('encoder') else lengths['targets']
    shapes[key] = jax.ShapeDtypeStruct((batch_size, length), np.int32)
  return shapes


def _gin_name(gin_file: str) -> str:
  return os.path.splitext(os.path.basename(gin_file))[0]


# ------------------------------------------------------------------------------------------------------------
# Table-2 rows (specdec.main).
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DecodeRun:
  """What one launcher run decodes: its modules, abstract params, setting, lengths and mesh."""
  gin_file: str
  target_module: Any
  drafter_module: Any
  target_params: PyTree
  drafter_params: PyTree
  setting: Any  # settings.Setting
  lengths: Mapping[str, int]
  mesh: Any
  task: str
  dtype: Optional[str]
  drafter_name: str


def read_decode_run(gin_file: str, mesh_of: Callable[[int], Any],
                    bindings: Sequence[str] = ()) -> DecodeRun:
  """A Table-2 row's gin file read as `python -m specdec.main --gin_file=...` reads it.

  `mesh_of(num_partitions)` lays the launcher's mesh on the devices compiled for (`tpu_slices.slice_mesh`).
  Raises the launcher's one-line errors (gin, config) for a file that would not launch.
  """
  from specdec.bench import benchmark  # pylint: disable=g-import-not-at-top
  from specdec import main  # pylint: disable=g-import-not-at-top
  from specdec import network  # pylint: disable=g-import-not-at-top
  from specdec import run_config  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  main.parse_command_line([f'--gin_file={gin_file}', f"--gin.OUTPUT_DIR='{ABSTRACT_DIR}'", *bindings])
  config = main.configured_run_config()
  run_config.check(config)
  if config.mode != 'benchmark':
    raise ValueError(f'{gin_file}: mode {config.mode!r}; the compile check reads benchmark runs (Table 2).')
  if not config.num_partitions:
    raise ValueError(f'{gin_file}: no num_partitions, so the launch would run on one device, not a mesh.')
  mesh = mesh_of(config.num_partitions)
  (plan,) = main.output_plans(config, mesh)
  models_config = config.models
  target_module = network.Transformer(models_config.target_config)
  drafter_module = network.Transformer(models_config.drafter_config)
  benchmark.validate(benchmark.ModelPair(target_module, None, drafter_module, None, plan.drafter_name),
                     plan.setting, mesh)
  return DecodeRun(gin_file, target_module, drafter_module,
                   abstract_params(models_config.target_config, models_config.dtype),
                   abstract_params(models_config.drafter_config, models_config.dtype),
                   plan.setting, dict(config.data.lengths), mesh, config.data.task, models_config.dtype,
                   plan.drafter_name)


def _mesh_label(mesh) -> str:
  sizes = dict(mesh.shape)
  return f'{sizes["data"]} x {sizes["model"]}'


def _decode_settings(run: DecodeRun, **extra) -> Dict[str, Any]:
  setting = run.setting
  fields = dict(gin_file=run.gin_file, task=run.task, drafter=run.drafter_name, mesh=_mesh_label(run.mesh),
              batch=setting.batch_size,
              inputs=run.lengths['inputs'], targets=run.lengths['targets'], temperature=setting.temperature,
              dtype=run.dtype or 'float32')
  fields.update(extra)  # a program of the target alone names no drafter
  return fields


def decode_programs(run: DecodeRun, name: str) -> List[Program]:
  """The row's speculative decode, its baseline, one verify call and one draft step."""
  from specdec.bench import benchmark  # pylint: disable=g-import-not-at-top
  models_pair = benchmark.ModelPair(run.target_module, run.target_params, run.drafter_module, run.drafter_params)
  baseline, speculative = benchmark.sharded_decoders(models_pair, None, run.setting, run.mesh)
  batch = decode_batch_shapes(run.setting.batch_size, run.lengths)
  rng = _rng_shape()
  params = {'target': run.target_params, 'drafter': run.drafter_params}
  gamma = run.setting.gamma
  task, temperature = run.task, run.setting.temperature
  return [
      Program(name, 'decode', False, _decode_settings(run, gamma=gamma),
              lambda: speculative.lower_shapes(params, batch, rng)),
      # The baseline depends on the task's lengths, the temperature and the mesh only: rows share it.
      Program(f'baseline_{task}_t{temperature:g}', 'baseline', False, _decode_settings(run, drafter=None),
              lambda: baseline.lower_shapes({'target': run.target_params}, batch, rng)),
      Program(f'verify_{task}_g{gamma}', 'verify', True,
              _decode_settings(run, drafter=None, gamma=gamma, tokens=gamma + 1),
              lambda: lower_decode_step(speculative, 'target', params, batch, gamma + 1)),
      Program(f'draft_step_{task}_{run.drafter_name}_g{gamma}', 'draft_step', True,
              _decode_settings(run, gamma=gamma, tokens=1),
              lambda: lower_decode_step(speculative, 'drafter', params, batch, 1, gamma)),
  ]


def lower_decode_step(predictor, role: str, params: PyTree, batch: Mapping[str, Any], tokens: int,
                      gamma: Optional[int] = None):
  """One `tokens_to_logits` call of one network of a sharded speculative predictor: `tokens` new tokens per row
  into its cache (laid out as the decode lays it out), for abstract params. `role`: 'target' or 'drafter'.

  The cache has the decode's slots (`decoding.cache_slots`); the call writes at position 0 (its cost does not
  depend on where: attention always reads the whole cache).
  """
  from specdec import decoding  # pylint: disable=g-import-not-at-top
  model = predictor.model
  module = model.module if role == 'target' else model.drafter_module
  decoder_params = dict(predictor.decoder_params)
  if gamma is not None:
    decoder_params['gamma'] = gamma
  length = batch['decoder_input_tokens'].shape[1]
  cache_length = decoding.cache_slots(model.decode_fn, length, decoder_params)
  batch_size = batch['encoder_input_tokens'].shape[0]

  def fresh_cache(net_params, encoder_input_tokens):
    return model.decoder_fns(module, net_params, encoder_input_tokens, cache_length)[0]

  net_params = params[role]
  cache = jax.eval_shape(fresh_cache, net_params, batch['encoder_input_tokens'])
  cache_sharding = predictor.cache_shardings(cache)
  param_sharding = predictor.param_shardings(params)[role]
  rows = predictor.output_sharding(batch_size)

  def step(net_params, cache, tokens_bk, index_b, encoder_input_tokens):
    # decoder_fns' own tokens_to_logits; the encoding it also builds is unused here, and XLA drops it.
    _, tokens_to_logits = model.decoder_fns(module, net_params, encoder_input_tokens, cache_length,
                                            predictor.constrain_cache)
    sequences = jnp.zeros((batch_size, length), jnp.int32)
    return tokens_to_logits(decoding.DecodingState(index_b, sequences, tokens_bk, cache))

  jitted = jax.jit(step, in_shardings=(param_sharding, cache_sharding, rows, rows, rows),
                   out_shardings=(rows, cache_sharding), donate_argnums=(1,))
  return jitted.lower(net_params, cache, jax.ShapeDtypeStruct((batch_size, tokens), np.int32),
                      jax.ShapeDtypeStruct((batch_size,), np.int32), batch['encoder_input_tokens'])


# ------------------------------------------------------------------------------------------------------------
# Fine-tunes (specdec.training.train).
# ------------------------------------------------------------------------------------------------------------


def read_train_config(gin_file: str, bindings: Sequence[str] = ()):
  """A fine-tune's `TrainConfig`, read as `python -m specdec.training.train --gin_file=...` reads it."""
  from specdec.training import train  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  return train.parse_config([f'--gin_file={gin_file}', f"--gin.MODEL_DIR='{ABSTRACT_DIR}'", *bindings])


def train_program(gin_file: str, mesh_of: Callable[[int], Any], name: Optional[str] = None,
                  bindings: Sequence[str] = ()) -> Program:
  """The fine-tune's train step (params, gradients, Adafactor state on its mesh), lowered on demand."""
  from specdec.training import train  # pylint: disable=g-import-not-at-top
  config = read_train_config(gin_file, bindings)
  partition, data = config.partitioning, config.data
  mesh = mesh_of(partition.num_partitions)
  train.check_mesh_args(data.batch_size, partition.num_partitions, partition.parameter_partitioning_dims,
                        mesh.devices.size)
  layout = train.lay_out(config, mesh)
  lengths = dict(data.feature_lengths)
  network_config = config.network_config
  settings = dict(gin_file=gin_file, mesh=_mesh_label(mesh),
                  parameter_partitioning_dims=partition.parameter_partitioning_dims, batch=data.batch_size,
                  inputs=lengths['inputs'], targets=lengths['targets'],
                  params=int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(layout.shapes['params']))),
                  emb_dim=network_config.emb_dim)

  def lower():
    step = train.jit_train_step(config, layout)
    return step.lower(layout.shapes, train_batch_shapes(data.batch_size, lengths), _rng_shape())

  return Program(name or _gin_name(gin_file), 'train_step', True, settings, lower)


# ------------------------------------------------------------------------------------------------------------
# The programs docs/cloud_tpu.md launches.
# ------------------------------------------------------------------------------------------------------------

TABLE2_DIR = 'experiments/table2'
FINETUNE_DIR = 'train/table2'
KINDS = ('decode', 'baseline', 'verify', 'draft_step', 'train_step')


def _gin_files(folder: str, skip: Sequence[str]) -> List[str]:
  from specdec import gin_utils  # pylint: disable=g-import-not-at-top
  root = os.path.join(gin_utils.REPO_GIN_DIR, folder)
  return [f'{folder}/{name}' for name in sorted(os.listdir(root))
          if name.endswith('.gin') and name not in skip]


def table2_gin_files() -> List[str]:
  """The twelve Table-2 rows (gin/experiments/table2/xxl_*.gin but their shared xxl_base.gin)."""
  return _gin_files(TABLE2_DIR, ('xxl_base.gin',))


def finetune_gin_files() -> List[str]:
  """The eight fine-tunes (gin/train/table2/<size>_<task>.gin but their shared finetune.gin)."""
  return _gin_files(FINETUNE_DIR, ('finetune.gin',))


def launched_programs(mesh_of: Callable[[int], Any], kinds: Sequence[str] = KINDS,
                      decode_files: Optional[Sequence[str]] = None,
                      train_files: Optional[Sequence[str]] = None, bindings: Sequence[str] = ()):
  """Yields the launched programs of `kinds` in that order of kinds (big ones first: decodes, baselines, then
  the straight-line ones), each name once; a gin file that cannot be read yields (its name, the error) instead.

  Programs are built (gin read, shapes laid out) before they are yielded and lowered only when a caller
  compiles them; a fine-tune's is built just before it is yielded (gin holds one run's config at a time).
  """
  decode_files = table2_gin_files() if decode_files is None else decode_files
  train_files = finetune_gin_files() if train_files is None else train_files
  decode_kinds = [kind for kind in kinds if kind != 'train_step']
  built = []
  if decode_kinds:
    for gin_file in decode_files:
      try:
        built += decode_programs(read_decode_run(gin_file, mesh_of, bindings), _gin_name(gin_file))
      except Exception as e:  # pylint: disable=broad-except  (recorded; the rest go on)
        yield _gin_name(gin_file), e
  seen = set()
  for kind in kinds:
    if kind != 'train_step':
      for program in built:
        if program.kind == kind and program.name not in seen:
          seen.add(program.name)
          yield program
      continue
    for gin_file in train_files:
      name = _gin_name(gin_file)
      if name in seen:
        continue
      seen.add(name)
      try:
        yield train_program(gin_file, mesh_of, name, bindings)
      except Exception as e:  # pylint: disable=broad-except
        yield name, e
