"""Training T5 1.1 networks on seqio tasks (gin-configured, resumable).

  python -m specdec.train --gin_file=train/cpu_target.gin --gin.MODEL_DIR="'runs/target'"

Adafactor (T5X's default) or AdamW through optax; seqio EncDecFeatureConverter
with packing; a jit-compiled train step over a ('data',) device mesh (batch
sharded, params replicated); Orbax checkpoints every `checkpoint_every` steps
and resume from the latest; periodic evaluation (validation loss, and BLEU /
ROUGE from greedy decodes); a progress line with step, loss, tokens/s and ETA.
With `teacher_dir` set, the student is distilled from the teacher's
distribution: loss = (1 - w) CE + w KL(teacher || student).
At the end the params are exported in the compact format (checkpoints.py).
"""

import functools
import itertools
import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # seqio's TensorFlow is chatty.
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import seqio

from specdec import checkpoints
from specdec import decoding
from specdec import evaluation
from specdec import gin_utils
from specdec import models
from specdec import network

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


def _configured(fn):
  """The gin-configured version of `fn` when gin knows it, else `fn` itself.

  The gin files register this module's functions dynamically, which binds
  their configurable versions, not the module attributes called here.
  """
  try:
    return gin.get_configurable(fn)
  except ValueError:
    return fn


def make_optimizer(name: str = 'adafactor', weight_decay: float = 0.0,
                   clip_norm: Optional[float] = 1.0) -> optax.GradientTransformation:
  schedule = _configured(learning_rate_schedule)
  if name == 'adafactor':
    # T5X's default: updates scaled by each parameter's RMS.
    opt = optax.adafactor(learning_rate=schedule, multiply_by_parameter_scale=True,
                          weight_decay_rate=weight_decay or None)
  elif name == 'adamw':
    opt = optax.adamw(learning_rate=schedule, weight_decay=weight_decay)
  else:
    raise ValueError(f"optimizer name must be 'adafactor' or 'adamw', got {name!r}.")
  if clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(clip_norm), opt)
  return opt


def train_batches(mixture_or_task_name: str, feature_lengths: Mapping[str, int],
                  batch_size: int, seed: int, pack: bool = True,
                  split: str = 'train', num_epochs: Optional[int] = None
                  ) -> Iterator[Dict[str, np.ndarray]]:
  """Packed encoder-decoder batches from a seqio task or mixture."""
  converter = seqio.EncDecFeatureConverter(pack=pack)
  ds = seqio.get_dataset(
      mixture_or_task_name, task_feature_lengths=dict(feature_lengths),
      dataset_split=split, shuffle=num_epochs is None, num_epochs=num_epochs,
      feature_converter=converter, seed=seed, use_cached=False)
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
            distill_weight=0.0):
  """Mean per-token loss; with a teacher, mixes in KL(teacher || student)."""
  logits = _apply(module, params, batch, True, {'dropout': dropout_rng})
  weights = batch['decoder_loss_weights'].astype(jnp.float32)
  ce = _token_losses(logits, batch['decoder_target_tokens'], z_loss)
  per_token = ce
  metrics = {}
  if teacher is not None and distill_weight > 0:
    teacher_module, teacher_params = teacher
    teacher_logp = jax.nn.log_softmax(jax.lax.stop_gradient(
        _apply(teacher_module, teacher_params, batch, False)).astype(jnp.float32))
    student_logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    kl = jnp.sum(jnp.exp(teacher_logp) * (teacher_logp - student_logp), -1)
    per_token = (1 - distill_weight) * ce + distill_weight * kl
    metrics['kl'] = jnp.sum(kl * weights) / jnp.maximum(weights.sum(), 1)
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


def _mesh():
  return jax.sharding.Mesh(np.asarray(jax.devices()), ('data',))


def _append_log(path, record):
  with open(path, 'a') as f:
    f.write(json.dumps(record) + '\n')


def train(model_dir: str,
          config: network.T5Config,
          mixture_or_task_name: str = 'specdec_local_mix',
          feature_lengths: Mapping[str, int] = (('inputs', 128), ('targets', 64)),
          batch_size: int = 32,
          num_steps: int = 2000,
          seed: int = 0,
          z_loss: float = 1e-4,
          checkpoint_every: int = 200,
          log_every: int = 20,
          eval_every: int = 500,
          eval_batches: int = 8,
          eval_decode_tasks: Sequence[str] = ('specdec_ende_local', 'specdec_summarize_local'),
          eval_decode_examples: int = 64,
          teacher_dir: Optional[str] = None,
          distill_weight: float = 0.5,
          max_minutes: Optional[float] = None,
          export_dir: Optional[str] = None,
          init_from_dir: Optional[str] = None) -> Dict[str, Any]:
  """Trains `config` on a seqio mixture; resumes from `model_dir` if it holds checkpoints.

  Without checkpoints, `init_from_dir` (a compact model of the same config)
  starts training from those params with a fresh optimizer state and step
  counter (to continue a shipped model when its checkpoints are gone).

  Returns the final evaluation record.
  """
  from specdec import tasks  # pylint: disable=g-import-not-at-top,unused-import
  feature_lengths = dict(feature_lengths)
  if batch_size % jax.device_count():
    raise ValueError(f'batch_size={batch_size} must divide over '
                     f'{jax.device_count()} devices.')
  os.makedirs(model_dir, exist_ok=True)
  log_path = os.path.join(model_dir, 'train_log.jsonl')
  module = network.Transformer(config)
  optimizer = _configured(make_optimizer)()
  teacher = None
  if teacher_dir:
    teacher_config, teacher_params = checkpoints.load_compact(teacher_dir)
    if teacher_config.vocab_size != config.vocab_size:
      raise ValueError(f'Teacher vocab_size {teacher_config.vocab_size} != '
                       f'student vocab_size {config.vocab_size}.')
    teacher = (network.Transformer(teacher_config), teacher_params)

  mesh = _mesh()
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  data_sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))

  def fresh_state(params):
    return {'step': jnp.zeros((), jnp.int32), 'params': params,
            'opt_state': optimizer.init(params)}

  def initial_params():
    if not init_from_dir:
      return network.init_params(config, jax.random.PRNGKey(seed))
    init_config, params = checkpoints.load_compact(init_from_dir)
    if init_config != config:
      raise ValueError(f'init_from_dir={init_from_dir} holds a different '
                       f'config: {init_config} vs {config}.')
    return params

  manager = checkpoints.training_checkpoint_manager(os.path.join(model_dir, 'checkpoints'))
  abstract = jax.eval_shape(
      lambda: fresh_state(network.init_params(config, jax.random.PRNGKey(seed))))
  latest = manager.latest_step()
  if latest is not None:
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    state = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
    print(f'Resumed from {model_dir} at step {latest}.', flush=True)
  else:
    state = fresh_state(initial_params())
  state = jax.device_put(state, replicated)
  start_step = int(state['step'])

  grad_fn = jax.value_and_grad(functools.partial(
      loss_fn, module=module, z_loss=z_loss, teacher=teacher,
      distill_weight=distill_weight), has_aux=True)

  @functools.partial(jax.jit, donate_argnums=(0,))
  def train_step(state, batch, rng):
    (loss, metrics), grads = grad_fn(state['params'], batch, rng)
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = dict(metrics, loss=loss,
                   grad_norm=optax.tree_utils.tree_norm(grads))
    return {'step': state['step'] + 1, 'params': params, 'opt_state': opt_state}, metrics

  eval_step = jax.jit(functools.partial(eval_loss, module))
  eval_data = list(itertools.islice(train_batches(
      mixture_or_task_name, feature_lengths, batch_size, seed=0, pack=True,
      split='validation', num_epochs=1), eval_batches))
  baseline = models.SpeculativeEncoderDecoderModel(
      module, None, decode_fn=decoding.temperature_sample)
  predict = baseline.compile_predict({'temperature': 0.0})

  def evaluate(step):
    total, count = 0.0, 0.0
    for batch in eval_data:
      s, c = eval_step(state['params'], batch)
      total, count = total + float(s), count + float(c)
    record = {'step': step, 'eval_loss': total / max(count, 1)}
    for task_name in eval_decode_tasks:
      if not eval_decode_examples:
        break
      result = evaluation.decode_and_score(
          predict, {'target': state['params']}, task_name, 'validation',
          feature_lengths, batch_size=min(batch_size, 32),
          max_examples=eval_decode_examples)
      record.update({f'{task_name}/{k}': v for k, v in result['metrics'].items()})
    print('eval ' + json.dumps(record), flush=True)
    _append_log(log_path, dict(record, kind='eval'))
    return record

  # A resumed run reshuffles with a seed derived from the step it resumes at.
  data = train_batches(mixture_or_task_name, feature_lengths, batch_size,
                       seed=seed + start_step)
  progress = _Progress(num_steps, start_step)
  rng = jax.random.fold_in(jax.random.PRNGKey(seed), start_step)
  deadline = None if max_minutes is None else time.time() + 60 * max_minutes
  record, tokens = None, 0
  step = start_step
  run_started = time.time()
  while step < num_steps:
    batch = jax.device_put(next(data), data_sharded)
    tokens += int(np.sum(batch['decoder_loss_weights'])) + int(
        np.sum(batch['encoder_input_tokens'] > 0))
    rng, step_rng = jax.random.split(rng)
    state, metrics = train_step(state, batch, step_rng)
    step += 1
    if step % log_every == 0 or step == num_steps:
      metrics = jax.tree_util.tree_map(float, metrics)
      print(progress.line(step, metrics['loss'], tokens), flush=True)
      _append_log(log_path, dict(metrics, step=step, kind='train',
                                 tokens_per_s=progress.tokens / max(
                                     time.perf_counter() - progress.t0, 1e-9)))
      tokens = 0
    if step % checkpoint_every == 0 or step == num_steps:
      manager.save(step, args=_standard_save(state))
    if step % eval_every == 0:
      record = evaluate(step)
    if deadline and time.time() > deadline:
      print(f'Stopping at step {step}: max_minutes={max_minutes} reached; '
            'run again to resume.', flush=True)
      if step not in manager.all_steps():
        manager.save(step, args=_standard_save(state), force=True)
      break
  manager.wait_until_finished()
  _append_log(os.path.join(model_dir, 'runs.jsonl'), {
      'started': time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(run_started)),
      'minutes': (time.time() - run_started) / 60, 'from_step': start_step,
      'to_step': step,
      'command': ' '.join(['python -m specdec.train'] + sys.argv[1:])})
  if record is None or record['step'] != step:
    record = evaluate(step)
  if export_dir:
    with open(os.path.join(model_dir, 'runs.jsonl')) as f:
      runs = [json.loads(line) for line in f]
    checkpoints.save_compact(export_dir, config, jax.device_get(state['params']),
                             extra={'train': {'step': step,
                                              'mixture_or_task_name': mixture_or_task_name,
                                              'teacher_dir': teacher_dir,
                                              'runs': runs,
                                              'minutes': sum(r['minutes'] for r in runs),
                                              'final_eval': record}})
    print(f'Exported params to {export_dir}.', flush=True)
  return record


def _standard_save(state):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  return ocp.args.StandardSave(state)


def main(argv=None):
  files, bindings, rest = gin_utils.split_gin_args(sys.argv[1:] if argv is None else argv)
  if rest:
    raise SystemExit(f'Unknown arguments: {rest}')
  gin_utils.parse(files, bindings)
  # The gin files register this module's functions (dynamic registration);
  # their configurable versions carry the bindings.
  gin.get_configurable(train)()


if __name__ == '__main__':
  # Gin configures the functions of `specdec.train` (imported by the gin
  # files), not this `__main__` copy: run that module's main.
  from specdec import train as _configured  # pylint: disable=g-import-not-at-top
  _configured.main()
