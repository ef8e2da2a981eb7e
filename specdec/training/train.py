"""Training T5 1.1 networks on seqio tasks (gin-configured, resumable, sharded).

  python -m specdec.training.train --gin_file=train/cpu_target.gin --gin.MODEL_DIR="'runs/target'"
  python -m specdec.training.train --multihost --gin_file=... \
      --gin.train_config.PartitioningConfig.num_partitions=8   (TPU pod slice)

A run is a `train_config.TrainConfig` (gin-configured; `train(model_dir,
network_config, **settings)` builds one from flat settings in Python) that a
`Trainer` runs: the train step, the loop, the run records and the export.
Adafactor (T5X's default) or AdamW through optax, with T5's inverse square root
schedule or a constant rate (T5X's fine-tuning default); seqio
EncDecFeatureConverter with packing; a jit-compiled train step over a
('data', 'model') device mesh laid out by T5X's logical-axis rules, the same
as decoding's (specdec/partitioning.py): `num_partitions` devices hold one
model-parallel copy of the params (heads, mlp, vocab split over 'model'),
the batch is split over 'data', and with `parameter_partitioning_dims=2`
the params' embed axis is split over 'data' too. The optimizer state
follows its params (Adafactor's factored moments included:
`partitioning.optimizer_state_specs`). The default, num_partitions=1, is
plain data parallelism with replicated params. Each host loads only its
slice of the batch (`partitioning.host_batch_shard`). Orbax checkpoints
every `checkpoint_every` steps, written and restored sharded (each host its
own shards; a checkpoint restores onto any mesh), and resume from the latest
one that restores (a damaged newer one is reported and moved to
MODEL_DIR/damaged_checkpoints/); train_log.jsonl drops what a killed run
logged past the resumed step, and runs.jsonl holds one record per run,
rewritten at each checkpoint (status running / finished / stopped, or
interrupted for a killed run); periodic evaluation (validation loss, and
BLEU / ROUGE from greedy decodes); a progress line with step, loss,
tokens/s and ETA.
`init_from_t5x` starts from a T5X checkpoint (e.g. the public T5 1.1 ones),
each device reading only its slices of each array, with a fresh optimizer.
With `teacher_dir` set, the student is distilled from the teacher's
distribution: loss = (1 - w) CE + w D(teacher, student), D one of
specdec/training/distill.py's divergences (`divergence`: fkl, rkl, tvd, greedy_ce).
At the end the params are exported in the compact format (checkpoints.py).
MODEL_DIR, `export_dir`, `init_from_dir` and `teacher_dir` may be gs:// paths
(Cloud TPU): logs, run records and exports go through specdec/fileio.py
(tf.io.gfile), checkpoints through Orbax, which writes there itself.
"""

import dataclasses
import functools
import gc
import itertools
import json
import logging
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # seqio's TensorFlow is chatty.
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import seqio
from jax.sharding import NamedSharding, PartitionSpec

from specdec import checkpoints
from specdec import decoding
from specdec.training import distill
from specdec import evaluation
from specdec import fileio
from specdec import gin_utils
from specdec import memory
from specdec import models
from specdec import network
from specdec import partitioning
from specdec import sharded_decoding
from specdec import tasks  # registers the seqio tasks the gin files train on
from specdec.training import train_config

PyTree = Any
BATCH_KEYS = ('encoder_input_tokens', 'decoder_input_tokens',
              'decoder_target_tokens', 'decoder_loss_weights',
              'encoder_segment_ids', 'decoder_segment_ids')


def learning_rate_schedule(step, peak: float = 0.01, warmup_steps: int = 500):
  """Linear warm-up to `peak`, then T5's inverse square root decay."""
  step = jnp.asarray(step, jnp.float32)
  warm = jnp.minimum(1.0, (step + 1) / warmup_steps)
  decay = jnp.sqrt(warmup_steps / jnp.maximum(step + 1, warmup_steps))
  return peak * warm * decay


def constant_learning_rate(step, value: float = 1e-3, warmup_steps: int = 0):
  """`value` at every step: T5X's fine-tuning schedule (finetune.gin: 'constant', 1e-3).

  With `warmup_steps`, a linear ramp to `value` over the first steps. A run that continues an export starts
  with a fresh optimizer state; at the full rate from step 0, each continuation of the v3 target lost ground
  for its first ~1,000 steps before it gained (results/target_v3/curve.md).
  """
  rate = jnp.full(jnp.shape(step), value, jnp.float32)
  if warmup_steps:
    rate = rate * jnp.minimum(1.0, (jnp.asarray(step, jnp.float32) + 1) / warmup_steps)
  return rate


# make_optimizer(schedule=...) -> the schedule function (each gin-configurable).
SCHEDULES = ('rsqrt', 'constant')


def make_optimizer(name: str = 'adafactor', weight_decay: float = 0.0,
                   clip_norm: Optional[float] = 1.0, schedule: str = 'rsqrt',
                   min_dim_size_to_factor: int = 128) -> optax.GradientTransformation:
  """The optimizer (gin: `train.make_optimizer.NAME`).

  schedule: 'rsqrt' (`learning_rate_schedule`: warm-up, then T5's inverse
    square root decay) or 'constant' (`constant_learning_rate`, T5X's
    fine-tuning default of 1e-3).
  min_dim_size_to_factor: Adafactor factors the second moment of a
    parameter whose two largest dimensions are at least this (T5X: 128).
  """
  if schedule not in SCHEDULES:
    raise ValueError(f'schedule must be one of {SCHEDULES}, got {schedule!r}.')
  rate = gin_utils.configured(learning_rate_schedule if schedule == 'rsqrt'
                     else constant_learning_rate)
  if name == 'adafactor':
    # T5X's default: updates scaled by each parameter's RMS.
    opt = optax.adafactor(learning_rate=rate, multiply_by_parameter_scale=True,
                          weight_decay_rate=weight_decay or None,
                          min_dim_size_to_factor=min_dim_size_to_factor)
  elif name == 'adamw':
    opt = optax.adamw(learning_rate=rate, weight_decay=weight_decay)
  else:
    raise ValueError(f"optimizer name must be 'adafactor' or 'adamw', got {name!r}.")
  if clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(clip_norm), opt)
  return opt


def train_batches(mixture_or_task_name: str, feature_lengths: Mapping[str, int],
                  batch_size: int, seed: int, pack: bool = True,
                  split: str = 'train', num_epochs: Optional[int] = None,
                  shard: Tuple[int, int] = (0, 1)
                  ) -> Iterator[Dict[str, np.ndarray]]:
  """Packed encoder-decoder batches from a seqio task or mixture.

  `shard` = (index, count): this host's share of the examples (seqio
  ShardInfo); `batch_size` is then this host's rows. Datasets are not
  cached in memory by seqio: its size check needs prepared TFDS metadata,
  which `tfds.testing.mock_data` lacks, and the trainer reads each
  example once per epoch anyway.
  """
  converter = seqio.EncDecFeatureConverter(pack=pack)
  index, count = shard
  provider = seqio.get_mixture_or_task(mixture_or_task_name)
  ds = provider.get_dataset(
      dict(feature_lengths), split=split, use_cached=False,
      shuffle=num_epochs is None, num_epochs=num_epochs, seed=seed,
      shard_info=seqio.ShardInfo(index, count) if count > 1 else None,
      trim_output_features=True, try_in_mem_cache=False)
  ds = converter(ds, task_feature_lengths=dict(feature_lengths))
  ds = ds.batch(batch_size, drop_remainder=num_epochs is None)
  for batch in ds.as_numpy_iterator():
    yield {k: v for k, v in batch.items() if k in BATCH_KEYS}


def _token_losses(logits_btv, targets_bt, z_loss):
  """Per-token cross-entropy (+ T5X's z-loss), float32."""
  logits_btv = logits_btv.astype(jnp.float32)
  log_z_bt = jax.nn.logsumexp(logits_btv, axis=-1)
  target_logit_bt = jnp.take_along_axis(logits_btv, targets_bt[..., None], -1)[..., 0]
  return log_z_bt - target_logit_bt + z_loss * jnp.square(log_z_bt)


def _apply(module, params, batch, enable_dropout, rngs=None):
  return module.apply(
      {'params': params}, batch['encoder_input_tokens'],
      batch['decoder_input_tokens'], batch['decoder_target_tokens'],
      batch.get('encoder_segment_ids'), batch.get('decoder_segment_ids'),
      enable_dropout=enable_dropout, rngs=rngs)


def loss_fn(params, batch, dropout_rng, module, z_loss=1e-4, teacher=None,
            distill_weight=0.0, divergence='fkl'):
  """Mean per-token loss; with a teacher, (1 - w) CE + w D(teacher, student).

  D is `distill.token_divergence(divergence, ...)`: 'fkl' KL(teacher || student),
  'rkl', 'tvd' or 'greedy_ce' (see specdec/training/distill.py).
  """
  logits = _apply(module, params, batch, True, {'dropout': dropout_rng})
  weights = batch['decoder_loss_weights'].astype(jnp.float32)
  ce = _token_losses(logits, batch['decoder_target_tokens'], z_loss)
  per_token = ce
  metrics = {}
  if teacher is not None and distill_weight > 0:
    teacher_module, teacher_params = teacher
    teacher_logits = _apply(teacher_module, teacher_params, batch, False)
    div = distill.token_divergence(divergence, teacher_logits, logits)
    per_token = (1 - distill_weight) * ce + distill_weight * div
    metrics[divergence] = jnp.sum(div * weights) / jnp.maximum(weights.sum(), 1)
  denom = jnp.maximum(weights.sum(), 1.0)
  metrics['ce'] = jnp.sum(ce * weights) / denom
  return jnp.sum(per_token * weights) / denom, metrics


def eval_loss(module, params, batch):
  logits = _apply(module, params, batch, False)
  weights = batch['decoder_loss_weights'].astype(jnp.float32)
  ce = _token_losses(logits, batch['decoder_target_tokens'], 0.0)
  return jnp.sum(ce * weights), jnp.sum(weights)


class _Progress:
  """One line per report: step, loss, tokens/s and ETA."""

  def __init__(self, total_steps, start_step):
    self.total, self.start_step = total_steps, start_step
    self.t0 = time.perf_counter()
    self.tokens = 0

  def line(self, step, loss, tokens):
    self.tokens += tokens
    elapsed = time.perf_counter() - self.t0
    done = step - self.start_step
    rate = self.tokens / max(elapsed, 1e-9)
    eta = elapsed / max(done, 1) * (self.total - step)
    return (f'step {step}/{self.total}  loss {loss:.4f}  {rate:,.0f} tokens/s  '
            f'elapsed {elapsed / 60:.1f} min  ETA {eta / 60:.1f} min')


# -----------------------------------------------------------------------------
# Layout of the training state on the ('data', 'model') mesh.
# -----------------------------------------------------------------------------


def mixture_rate(data: train_config.DataConfig) -> tasks.MixtureRate:
  """The local mixture's rate per task: equal, `task_rates` by name, or the task's train rows.

  ValueError (before any work) for both equal_rates and task_rates, or task_rates that do
  not name each local task once with a positive rate.
  """
  if not data.task_rates:
    return 1.0 if data.equal_rates else tasks.rate_num_train_examples
  if data.equal_rates:
    raise ValueError('Give equal_rates or task_rates, not both.')
  rates = dict(data.task_rates)
  if sorted(rates) != sorted(tasks.LOCAL_TASKS):
    raise ValueError(f'task_rates must name the local tasks {list(tasks.LOCAL_TASKS)}, got {sorted(rates)}.')
  bad = {name: rate for name, rate in rates.items() if not float(rate) > 0}
  if bad:
    raise ValueError(f'task_rates must be positive, got {bad}.')
  return lambda task: float(rates[task.name])


def check_mesh_args(batch_size: int, num_partitions: int,
                    parameter_partitioning_dims: int, device_count: int) -> int:
  """The size of the 'data' mesh axis; ValueError for a layout that cannot be."""
  if (isinstance(num_partitions, bool) or
      not isinstance(num_partitions, (int, np.integer)) or num_partitions < 1):
    raise ValueError(f'num_partitions must be a positive int, got {num_partitions!r}.')
  if device_count % num_partitions:
    raise ValueError(f'num_partitions={num_partitions} does not divide the '
                     f'{device_count} devices: the model axis must divide them.')
  if parameter_partitioning_dims not in (1, 2):
    raise ValueError(f'parameter_partitioning_dims must be 1 or 2, got '
                     f'{parameter_partitioning_dims!r}.')
  data = device_count // num_partitions
  if batch_size % data:
    raise ValueError(f'batch_size={batch_size} must divide over the {data} devices of '
                     f"the mesh's 'data' axis ({device_count} devices / "
                     f'num_partitions={num_partitions}).')
  return data


def train_rules(parameter_partitioning_dims: int = 1) -> tuple:
  """T5X's rules (partitioning.py); 2-D parameters also shard embed over 'data'."""
  return partitioning.standard_logical_axis_rules(
      parameter_partitioning_dims=parameter_partitioning_dims)


def state_specs(config: network.T5Config, optimizer: optax.GradientTransformation,
                rules, axis_sizes: Mapping[str, int]) -> Dict[str, Any]:
  """Mesh PartitionSpecs of {'step', 'params', 'opt_state'} (shapes only, no memory).

  Params get decoding's layout (`partitioning.logical_to_mesh_specs`), but a
  dimension the mesh does not divide is an error here, not a silent
  replica; the optimizer state follows its params.
  """
  params = checkpoints.expected_params(config)
  logical = partitioning.param_logical_axes(network.Transformer(config), params)
  partitioning.check_divisible(logical, params, rules, axis_sizes,
                               what=f'params of {config}')
  param_specs = partitioning.logical_to_mesh_specs(logical, params, rules, axis_sizes)
  opt_shapes = jax.eval_shape(optimizer.init, params)
  return {'step': PartitionSpec(), 'params': param_specs,
          'opt_state': partitioning.optimizer_state_specs(opt_shapes, params, param_specs)}


def state_shapes(config: network.T5Config, optimizer: optax.GradientTransformation) -> PyTree:
  """{'step', 'params', 'opt_state'} as ShapeDtypeStructs (nothing allocated)."""
  return jax.eval_shape(lambda: fresh_state(
      optimizer, network.init_params(config, jax.random.PRNGKey(0))))


def abstract_state(shapes: PyTree, shardings: PyTree) -> PyTree:
  """`shapes` carrying `shardings`: what Orbax restores into (each host reads its shards)."""
  return jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)


@dataclasses.dataclass(frozen=True)
class TrainLayout:
  """A run's training state laid out on a mesh: what the train step is compiled for.

  specs / shardings / shapes: {'step', 'params', 'opt_state'} (PartitionSpecs, NamedShardings,
  ShapeDtypeStructs); data_sharding: every [batch_size, L] feature's; replicated: the rng's.
  """
  mesh: Any
  rules: tuple
  module: network.Transformer
  optimizer: optax.GradientTransformation
  specs: Dict[str, Any]
  shardings: Dict[str, Any]
  replicated: NamedSharding
  data_sharding: NamedSharding
  shapes: PyTree


def lay_out(config: train_config.TrainConfig, mesh) -> TrainLayout:
  """The layout of `config`'s state on `mesh` (any devices: the TPU compile check passes a TPU topology's).

  Shapes only, nothing allocated; a parameter dimension the mesh does not divide raises (`state_specs`).
  """
  network_config, partition = config.network_config, config.partitioning
  rules = train_rules(partition.parameter_partitioning_dims)
  optimizer = gin_utils.configured(make_optimizer)()
  specs = state_specs(network_config, optimizer, rules, partitioning.mesh_axis_sizes(mesh))
  return TrainLayout(
      mesh=mesh, rules=rules, module=network.Transformer(network_config), optimizer=optimizer, specs=specs,
      shardings=partitioning.named_shardings(mesh, specs), replicated=NamedSharding(mesh, PartitionSpec()),
      data_sharding=NamedSharding(mesh, batch_spec(mesh, rules, config.data.batch_size)),
      shapes=state_shapes(network_config, optimizer))


def jit_train_step(config: train_config.TrainConfig, layout: TrainLayout, teacher=None):
  """state, batch, rng -> (state, metrics), jit-compiled over `layout`'s mesh (the state donated)."""
  distilling = config.distill
  loss = functools.partial(loss_fn, module=layout.module, z_loss=config.z_loss,
                           teacher=teacher, distill_weight=distilling.distill_weight,
                           divergence=distilling.divergence)
  grad_fn = jax.value_and_grad(loss, has_aux=True)
  optimizer = layout.optimizer

  def train_step(state, batch, rng):
    # Activations pinned to T5X's (batch, length, ...) layout on the mesh, as T5X's network pins them.
    with network.activation_layout(layout.mesh, layout.rules):
      (loss, metrics), grads = grad_fn(state['params'], batch, rng)
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = dict(metrics, loss=loss, grad_norm=optax.tree_utils.tree_norm(grads))
    return {'step': state['step'] + 1, 'params': params, 'opt_state': opt_state}, metrics

  return jax.jit(train_step, in_shardings=(layout.shardings, layout.data_sharding, layout.replicated),
                 out_shardings=(layout.shardings, layout.replicated), donate_argnums=(0,))


def fresh_state(optimizer, params):
  return {'step': jnp.zeros((), jnp.int32), 'params': params,
          'opt_state': optimizer.init(params)}


def _layout_line(mesh, specs, shapes) -> str:
  """'Mesh {...}: params + optimizer state X MiB per device (Y MiB in all).'"""
  axis_sizes = partitioning.mesh_axis_sizes(mesh)
  per_device = memory.bytes_per_device(shapes, specs, axis_sizes)
  return (f'Mesh {axis_sizes}: params + optimizer state {per_device / 2**20:,.1f} MiB per '
          f'device ({memory.total_bytes(shapes) / 2**20:,.1f} MiB in all).')


def _put_replicated(x, sharding):
  """`x` (host or one-device value) on every device; every process passes the same x."""
  if jax.process_count() == 1:
    return x  # jit moves it by its in_shardings, as an uncommitted argument
  return partitioning.put_tree(np.asarray(x), sharding)


def append_log(path, record):
  """Appends one JSON line (on gs://, by rewriting the object: fileio.append_text)."""
  fileio.append_text(path, json.dumps(record) + '\n')


def _rows_or_empty(path) -> list:
  """The rows of JSON Lines file `path`; none when there is no file yet (a first run)."""
  return fileio.read_jsonl(path) if fileio.exists(path) else []


def drop_log_after(log_path, step) -> int:
  """Drops train_log records past `step` (the resumed step); returns how many.

  A killed run logged steps after its last checkpoint; the resumed run logs
  them again, so without this they would appear twice.
  """
  records = _rows_or_empty(log_path)
  kept = [r for r in records if r.get('step', 0) <= step]
  if len(kept) < len(records):
    fileio.write_jsonl(log_path, kept)
  return len(records) - len(kept)


def put_run_record(runs_path, record) -> None:
  """Writes this run's runs.jsonl record (matched by 'run_id'): replaced or appended.

  Earlier records still 'running' belong to runs that were killed (one
  trainer per model_dir): they become 'interrupted', keeping their last
  checkpointed to_step and minutes.
  """
  records = [dict(r, status='interrupted')
             if r.get('status') == 'running' and r.get('run_id') != record['run_id'] else r
             for r in _rows_or_empty(runs_path)]
  ids = [r.get('run_id') for r in records]
  if record['run_id'] in ids:
    records[ids.index(record['run_id'])] = record
  else:
    records.append(record)
  fileio.write_jsonl(runs_path, records)


def _first_line(error: BaseException, limit: int = 300) -> str:
  """`Type: first line` of an error, without TensorStore's spec dump."""
  text = (str(error).strip().splitlines() or [''])[0]
  text = text.split(' See full TensorStore details')[0].rstrip('.')
  return f'{type(error).__name__}: {text[:limit]}'


class _DropAbandonedTaskErrors(logging.Filter):
  """Drops asyncio's 'Task exception was never retrieved' records (one screen each)."""

  def filter(self, record):
    return 'exception was never retrieved' not in record.getMessage()


_QUIET_ABANDONED_TASKS = _DropAbandonedTaskErrors()


def _try_restore(manager, step, abstract):
  """(state, None), or (None, why) when checkpoint `step` does not restore."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  # A failed Orbax restore abandons its other read tasks; each logs its own
  # screen-long traceback when collected, now or at exit. After a failure the
  # filter stays on asyncio's logger for the rest of the process.
  asyncio_log = logging.getLogger('asyncio')
  asyncio_log.addFilter(_QUIET_ABANDONED_TASKS)
  try:
    state = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  except Exception as e:  # pylint: disable=broad-except  (Orbax / TensorStore / JSON errors)
    gc.collect()
    return None, _first_line(e)
  asyncio_log.removeFilter(_QUIET_ABANDONED_TASKS)
  return state, None


def restore_latest_good(manager, abstract, damaged_dir):
  """(step, state) of the newest checkpoint that restores, or (None, None) if there are none.

  A newer checkpoint that fails to restore (a kill mid-write, a damaged
  disk) is reported and moved to `damaged_dir`/<step>-<time> once an older
  one has restored, so that training continues from that one and Orbax does
  not keep picking the damaged step. If none restores, ValueError lists each
  step and why, and nothing is moved.
  """
  failures = []
  for step in sorted(manager.all_steps(), reverse=True):
    state, why = _try_restore(manager, step, abstract)
    if why is not None:
      failures.append((step, why))
      print(f'Checkpoint step {step} in {manager.directory} is damaged or unreadable '
            f'({why}).', flush=True)
      continue
    for bad_step, _ in failures:
      if jax.process_index():
        continue  # one host moves them (the directory is shared)
      fileio.makedirs(damaged_dir)
      dest = fileio.join(damaged_dir, f'{bad_step}-{int(time.time())}')
      # A rename on disk; on gs:// a copy, then a delete (fileio.replace).
      fileio.replace(fileio.join(str(manager.directory), str(bad_step)), dest)
      print(f'Moved damaged checkpoint step {bad_step} to {dest}; falling back to '
            f'step {step}.', flush=True)
    return step, state
  if failures:
    raise ValueError(
        f'{manager.directory}: no checkpoint can be restored: '
        + '; '.join(f'step {s}: {why}' for s, why in failures)
        + '. Move the directory away to start afresh (or restore it from a backup).')
  return None, None


class Trainer:
  """One training run of a TrainConfig: layout, state, step, loop, run records, export.

  Building it checks everything that can be checked before any work (task
  vocabulary, mesh layout, init checkpoint, teacher) and writes nothing but
  model_dir; `run()` restores or initialises the state, trains to
  config.num_steps (or max_minutes), evaluates, and exports.
  """

  COMMAND = 'python -m specdec.training.train'  # what run records say made a run

  def __init__(self, config: train_config.TrainConfig):
    self.config = config
    self.feature_lengths = dict(config.data.feature_lengths)
    self._check_settings()
    self._lay_out()
    fileio.makedirs(config.model_dir)  # local or gs:// (then Orbax writes there too)
    self.chief = jax.process_index() == 0  # writes the logs, run records and export
    self.log_path = fileio.join(config.model_dir, 'train_log.jsonl')
    self.runs_path = fileio.join(config.model_dir, 'runs.jsonl')
    distill.get_divergence(config.distill.divergence)  # a bad name fails before any work
    self.teacher = self._teacher()
    self.state, self.manager, self.run_record = None, None, None

  def _check_settings(self) -> None:
    """Registers corpus_dir's tasks; ValueError for a mesh, init or vocabulary that cannot be."""
    config = self.config
    data, partition, init = config.data, config.partitioning, config.init
    if data.corpus_dir is not None and not os.path.isdir(data.corpus_dir):
      raise FileNotFoundError(f'corpus_dir={data.corpus_dir!r} does not exist.')
    if data.corpus_dir is not None or data.equal_rates or data.task_rates:
      tasks.register_local_tasks(data.corpus_dir, mixture_rate=mixture_rate(data))
    check_mesh_args(data.batch_size, partition.num_partitions,
                    partition.parameter_partitioning_dims, jax.device_count())
    if init.init_from_t5x and init.init_from_dir:
      raise ValueError('Give init_from_dir or init_from_t5x, not both.')
    _check_task_vocabulary(data.mixture_or_task_name, config.network_config)

  def _lay_out(self) -> None:
    """The mesh, the optimizer and the state's shardings; checks the layout and the T5X checkpoint."""
    config = self.config
    self.layout = layout = lay_out(config, partitioning.make_mesh(config.partitioning.num_partitions))
    self.mesh, self.rules, self.module = layout.mesh, layout.rules, layout.module
    self.optimizer, self.specs, self.shardings = layout.optimizer, layout.specs, layout.shardings
    self.replicated, self.data_sharding = layout.replicated, layout.data_sharding
    self.shapes = layout.shapes
    init_from_t5x = config.init.init_from_t5x
    self.init_from_t5x = (checkpoints.check_t5x_checkpoint(init_from_t5x, config.network_config)
                          if init_from_t5x else init_from_t5x)
    print(_layout_line(self.mesh, self.specs, self.shapes), flush=True)

  def _teacher(self):
    """(module, params) of the distillation teacher, or None."""
    teacher_dir = self.config.distill.teacher_dir
    if not teacher_dir:
      return None
    teacher_config, teacher_params = checkpoints.load_compact(teacher_dir)
    vocab_size = self.config.network_config.vocab_size
    if teacher_config.vocab_size != vocab_size:
      raise ValueError(f'Teacher vocab_size {teacher_config.vocab_size} != '
                       f'student vocab_size {vocab_size}.')
    return network.Transformer(teacher_config), teacher_params

  # ---------------------------------------------------------------------------
  # The state: restored from the latest good checkpoint, or initialised.
  # ---------------------------------------------------------------------------

  def _initial_params(self):
    """Params laid out on the mesh: fresh (initialised in their shards) or from a checkpoint."""
    config, init = self.config.network_config, self.config.init
    shardings = self.shardings['params']
    if self.init_from_t5x:
      print(f'Initialising params from the T5X checkpoint {self.init_from_t5x}.', flush=True)
      return checkpoints.restore_params(self.init_from_t5x, config, shardings=shardings)
    if not init.init_from_dir:
      fresh = jax.jit(functools.partial(network.init_params, config), out_shardings=shardings)
      return fresh(jax.random.PRNGKey(self.config.seed))
    init_config, params = checkpoints.load_compact(init.init_from_dir)
    if init.init_matching_only:
      params = _matching_params(network.init_params(config, jax.random.PRNGKey(self.config.seed)),
                                params, init.init_from_dir)
    elif dataclasses.replace(init_config, dropout_rate=config.dropout_rate) != config:
      # Dropout is how a run trains, not a part of the params: a continued run may set its own.
      raise ValueError(f'init_from_dir={init.init_from_dir} holds a different '
                       f'config: {init_config} vs {config}.')
    return partitioning.put_tree(params, shardings)

  def _restore_or_init(self) -> int:
    """Sets self.state (on the mesh) and self.manager; returns the step training starts at."""
    model_dir = self.config.model_dir
    checkpoint_dir = fileio.join(model_dir, 'checkpoints')
    manager = checkpoints.training_checkpoint_manager(checkpoint_dir)
    # Restored straight into this mesh's shardings, whatever mesh wrote it.
    abstract = abstract_state(self.shapes, self.shardings)
    listed = manager.latest_step()
    latest, state = restore_latest_good(manager, abstract,
                                        fileio.join(model_dir, 'damaged_checkpoints'))
    if latest != listed:  # damaged steps were moved away: let Orbax re-read the directory
      manager.close()
      manager = checkpoints.training_checkpoint_manager(checkpoint_dir)
    if latest is not None:
      print(f'Resumed from {model_dir} at step {latest}.', flush=True)
    else:
      # The optimizer state is made in its shards too: no host holds it whole.
      state = jax.jit(functools.partial(fresh_state, self.optimizer),
                      out_shardings=self.shardings, donate_argnums=(0,))(self._initial_params())
    self.state = jax.device_put(state, self.shardings)
    self.manager = manager
    return int(self.state['step'])

  # ---------------------------------------------------------------------------
  # The compiled functions.
  # ---------------------------------------------------------------------------

  def _compiled_train_step(self):
    """state, batch, rng -> (state, metrics), jit-compiled over the mesh (the state donated)."""
    return jit_train_step(self.config, self.layout, self.teacher)

  def _prepare_evaluation(self) -> None:
    """The eval step, the validation batches (on the mesh) and the sharded greedy predict."""
    data, evaluating = self.config.data, self.config.evaluation
    self.eval_step = jax.jit(functools.partial(eval_loss, self.module))
    # Every host reads the whole (small) validation set: the same global batches.
    self.eval_data = [
        partitioning.put_tree(b, _batch_shardings(self.mesh, self.rules, b))
        for b in itertools.islice(train_batches(
            data.mixture_or_task_name, self.feature_lengths, data.batch_size, seed=0, pack=True,
            split='validation', num_epochs=1), evaluating.eval_batches)]
    baseline = models.SpeculativeEncoderDecoderModel(
        self.module, None, decode_fn=decoding.temperature_sample)
    self.sharded_predict = sharded_decoding.compile_predict_sharded(
        baseline, self.mesh, self.rules, {'temperature': 0.0})

  def _predict(self, params, batch, rng):
    return partitioning.to_host(self.sharded_predict(params, batch, rng))

  def evaluate(self, step: int) -> Dict[str, Any]:
    """Validation loss and decode scores of the current params; logged (kind 'eval') and returned."""
    evaluating = self.config.evaluation
    params = self.state['params']
    total, count = 0.0, 0.0
    for batch in self.eval_data:
      s, c = self.eval_step(params, batch)
      total, count = total + float(s), count + float(c)
    record = {'step': step, 'eval_loss': total / max(count, 1)}
    for task_name in evaluating.eval_decode_tasks:
      if not evaluating.eval_decode_examples:
        break
      result = evaluation.decode_and_score(
          self._predict, {'target': params}, task_name, 'validation',
          self.feature_lengths, batch_size=min(self.config.data.batch_size, 32),
          max_examples=evaluating.eval_decode_examples)
      record.update({f'{task_name}/{k}': v for k, v in result['metrics'].items()})
    print('eval ' + json.dumps(record), flush=True)
    if self.chief:
      append_log(self.log_path, dict(record, kind='eval'))
    return record

  # ---------------------------------------------------------------------------
  # Run records: train_log.jsonl and runs.jsonl.
  # ---------------------------------------------------------------------------

  def _start_run_record(self, start_step: int) -> None:
    """Drops log records a killed run left past `start_step`; writes this run's record."""
    # Steps a killed run logged after its last checkpoint are trained again now.
    dropped = drop_log_after(self.log_path, start_step) if self.chief else 0
    if dropped:
      print(f'Dropped {dropped} records past step {start_step} from {self.log_path} '
            '(logged after the last checkpoint; they are trained again).', flush=True)
    self.run_started = time.time()
    self.run_record = {
        'run_id': f'{self.run_started:.6f}-{os.getpid()}',
        'started': time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.run_started)),
        'command': ' '.join([self.COMMAND] + sys.argv[1:]),
        'from_step': start_step}
    self._note_run(start_step)

  def _note_run(self, to_step: int, status: str = 'running') -> None:
    """(Re)writes this run's runs.jsonl record: a killed run keeps its last checkpoint."""
    self.run_record.update(to_step=to_step, status=status,
                           minutes=(time.time() - self.run_started) / 60)
    if self.chief:
      put_run_record(self.runs_path, self.run_record)

  def _log_train(self, step: int, metrics, progress: '_Progress', tokens: int) -> None:
    """The progress line, and the step's train_log record (kind 'train')."""
    metrics = jax.tree_util.tree_map(float, metrics)
    print(progress.line(step, metrics['loss'], tokens), flush=True)
    if self.chief:
      append_log(self.log_path, dict(metrics, step=step, kind='train',
                                      tokens_per_s=progress.tokens / max(
                                          time.perf_counter() - progress.t0, 1e-9)))

  # ---------------------------------------------------------------------------
  # The loop and the export.
  # ---------------------------------------------------------------------------

  def _local_batches(self, start_step: int) -> Iterator[Dict[str, np.ndarray]]:
    """This host's rows of every training batch."""
    data = self.config.data
    # Hosts of one model-parallel group load the same rows.
    shard = partitioning.host_batch_shard(self.mesh.devices, data.batch_size, jax.process_index())
    # A resumed run reshuffles with a seed derived from the step it resumes at.
    return train_batches(data.mixture_or_task_name, self.feature_lengths,
                         data.batch_size // shard[1], seed=self.config.seed + start_step,
                         shard=shard)

  def _save(self, step: int, force: bool = False) -> None:
    self.manager.save(step, args=_standard_save(self.state), force=force)

  def _train_loop(self, start_step: int) -> Tuple[int, Optional[Dict[str, Any]]]:
    """Trains from `start_step`; returns the last step and the last evaluation record (or None)."""
    config = self.config
    train_step = self._compiled_train_step()
    data = self._local_batches(start_step)
    progress = _Progress(config.num_steps, start_step)
    rng = jax.random.fold_in(jax.random.PRNGKey(config.seed), start_step)
    deadline = None if config.max_minutes is None else time.time() + 60 * config.max_minutes
    record, tokens, step = None, 0, start_step
    while step < config.num_steps:
      local_batch = next(data)
      batch = partitioning.global_batch(local_batch, self.data_sharding, config.data.batch_size)
      # This host's tokens (the progress line's rate is per host).
      tokens += int(np.sum(local_batch['decoder_loss_weights'])) + int(
          np.sum(local_batch['encoder_input_tokens'] > 0))
      rng, step_rng = jax.random.split(rng)
      self.state, metrics = train_step(self.state, batch,
                                       _put_replicated(step_rng, self.replicated))
      step += 1
      if step % config.log_every == 0 or step == config.num_steps:
        self._log_train(step, metrics, progress, tokens)
        tokens = 0
      if step % config.checkpoint_every == 0 or step == config.num_steps:
        self._save(step)
        self._note_run(step)
      if step % config.evaluation.eval_every == 0:
        record = self.evaluate(step)
      if deadline and time.time() > deadline:
        print(f'Stopping at step {step}: max_minutes={config.max_minutes} reached; '
              'run again to resume.', flush=True)
        if step not in self.manager.all_steps():
          self._save(step, force=True)
        break
    return step, record

  def export_record(self, step: int, final_eval: Dict[str, Any]) -> Dict[str, Any]:
    """What every export records of the run that made it: the step, the data, the starting point, every run's
    command and minutes, the final evaluation."""
    config = self.config
    runs = fileio.read_jsonl(self.runs_path)
    return {
        'step': step,
        'mixture_or_task_name': config.data.mixture_or_task_name,
        'corpus_dir': config.data.corpus_dir,
        'equal_rates': config.data.equal_rates,
        'task_rates': dict(config.data.task_rates) if config.data.task_rates else None,
        'init_from_dir': config.init.init_from_dir,
        'runs': runs,
        'minutes': sum(r['minutes'] for r in runs),
        'final_eval': final_eval}

  def export(self, step: int, final_eval: Dict[str, Any]) -> None:
    """Writes the params in the compact format to export_dir, with what made them."""
    config = self.config
    # Every process takes part in gathering the params; one writes them.
    params = partitioning.to_host(self.state['params'])
    if not self.chief:
      return
    distilled = bool(config.distill.teacher_dir)
    checkpoints.save_compact(config.export_dir, config.network_config, params, extra={'train': dict(
        self.export_record(step, final_eval),
        teacher_dir=config.distill.teacher_dir,
        distill_weight=config.distill.distill_weight if distilled else None,
        divergence=config.distill.divergence if distilled else None,
        # What made the starting model, so a continuation that later replaces it keeps its history.
        init_train=(checkpoints.training_record(config.init.init_from_dir) if config.init.init_from_dir
                    else None),
        init_from_t5x=self.init_from_t5x,
        mesh=partitioning.mesh_axis_sizes(self.mesh))})
    print(f'Exported params to {config.export_dir}.', flush=True)

  def run(self) -> Dict[str, Any]:
    """Trains to num_steps (resuming from model_dir), evaluates, exports; returns the final evaluation."""
    start_step = self._restore_or_init()
    self._prepare_evaluation()
    self._start_run_record(start_step)
    step, record = self._train_loop(start_step)
    self.manager.wait_until_finished()
    self._note_run(step, 'finished' if step >= self.config.num_steps else 'stopped')
    if record is None or record['step'] != step:
      record = self.evaluate(step)
    if self.config.export_dir:
      self.export(step, record)
    return record


def train(model_dir: str, network_config: network.T5Config, **settings: Any) -> Dict[str, Any]:
  """Trains `network_config` into `model_dir`; returns the final evaluation record.

  `settings` are TrainConfig's fields and its sections' by name
  (`train_config.from_flat`: batch_size=8, eval_every=100, teacher_dir=...).
  """
  return Trainer(train_config.from_flat(model_dir, network_config, **settings)).run()


def _check_task_vocabulary(mixture_or_task_name: str, config: network.T5Config) -> None:
  """ValueError if the task's token ids do not all fit config.vocab_size."""
  provider = seqio.get_mixture_or_task(mixture_or_task_name)
  for name, feature in provider.output_features.items():
    size = feature.vocabulary.vocab_size
    if size > config.vocab_size:
      raise ValueError(
          f'{mixture_or_task_name}: its {name!r} vocabulary has {size} ids but '
          f'config.vocab_size={config.vocab_size}: the embedding would not cover them '
          '(T5 1.1 checkpoints use 32128 for T5\'s 32100-id vocabulary).')


def batch_spec(mesh, rules, batch_size: int) -> PartitionSpec:
  """('batch', 'length') -> mesh axes for [batch_size, L] features (batch over 'data')."""
  return partitioning.logical_to_mesh_specs(
      PartitionSpec('batch', 'length'), jax.ShapeDtypeStruct((batch_size, 1), np.int32),
      rules, partitioning.mesh_axis_sizes(mesh))


def _batch_shardings(mesh, rules, batch: Mapping[str, Any]) -> dict:
  """One sharding per feature; a batch that does not divide over 'data' is replicated."""
  return partitioning.named_shardings(
      mesh, partitioning.batch_specs(batch, rules, partitioning.mesh_axis_sizes(mesh)))


def _matching_params(fresh: PyTree, init: PyTree, init_from_dir: str) -> PyTree:
  """`fresh` with every leaf whose path and shape `init` also has taken from `init`."""
  init_leaves = {jax.tree_util.keystr(path): leaf
                 for path, leaf in jax.tree_util.tree_leaves_with_path(init)}
  taken = []

  def pick(path, leaf):
    other = init_leaves.get(jax.tree_util.keystr(path))
    if other is not None and np.shape(other) == np.shape(leaf):
      taken.append(np.size(leaf))
      return jnp.asarray(other, leaf.dtype)
    return leaf

  params = jax.tree_util.tree_map_with_path(pick, fresh)
  total = sum(np.size(x) for x in jax.tree_util.tree_leaves(fresh))
  if not taken:
    raise ValueError(f'init_from_dir={init_from_dir} shares no parameter (path and shape) '
                     'with this config.')
  print(f'Initialised {len(taken)} arrays ({sum(taken):,} of {total:,} parameters) from '
        f'{init_from_dir}; the rest fresh.', flush=True)
  return params


def _standard_save(state):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  return ocp.args.StandardSave(state)


def parse_config(argv, program: str = 'specdec.training.train') -> train_config.TrainConfig:
  """The TrainConfig of a command line (`--gin_file=... --gin.NAME=VALUE [--multihost]`).

  `--multihost` initialises multi-host JAX first (`partitioning.initialize_multihost`:
  every host of a TPU pod slice runs the same command). Errors end in one line
  naming `program`.
  """
  try:
    files, bindings, multihost = gin_utils.launch_args(argv)
  except ValueError as e:
    raise SystemExit(f'{program}: {e}') from None
  if multihost:
    partitioning.initialize_multihost(enabled=True)
  try:
    # A command line of old binds train.train.NAME: refused, naming its TrainConfig binding.
    gin_utils.parse(files, bindings, renamed=train_config.FORMER_TRAIN_PARAMETERS)
  except gin_utils.GinConfigError as e:  # a typo: one line, not a traceback
    raise SystemExit(f'{program}: {e}') from None
  stale = train_config.old_bindings()
  if stale:
    raise SystemExit(f'{program}: a gin file binds train.train.{stale[0]}; bind '
                     f'{train_config.selector(stale[0])} instead.')
  # The gin files register train_config's classes (dynamic registration);
  # their configurable versions carry the bindings.
  return gin_utils.configured(train_config.TrainConfig)()


def main(argv=None):
  """`python -m specdec.training.train [--multihost] --gin_file=... --gin.NAME=VALUE ...` (see `parse_config`)."""
  config = parse_config(sys.argv[1:] if argv is None else argv)
  if config.feature_head.target_dir:
    raise SystemExit('specdec.training.train: feature_head.target_dir is bound: a feature head trains '
                     'with python -m specdec.training.feature_training.')
  Trainer(config).run()


if __name__ == '__main__':
  # Gin binds the optimizer functions of `specdec.training.train`, not of this `__main__` copy.
  from specdec.training import train as train_module  # pylint: disable=g-import-not-at-top
  train_module.main()
