"""Training a feature head for a frozen target, in the trainer (`train.Trainer`).

`FeatureHeadTrainer` is the trainer with another model: the state holds the
head's params and optimizer state only; the target (TrainConfig's
`feature_head.target_dir`) is loaded once, frozen, and run on every batch to
give the features and next-token distributions the head learns
(`feature_losses.losses`). Everything else is the trainer's: resumable Orbax
checkpoints, train_log.jsonl and runs.jsonl, progress lines, max_minutes.

Evaluation measures what decoding gets: the first draft's greedy agreement
with the target (argmax of the head = the target's greedy token), per
unrolled depth, teacher-forced on the target's OWN greedy decodes of held-out
validation inputs (decoded once, at the start of the run). Agreement at depth
0 is the first draft's greedy acceptance rate.

The export is a head directory (`feature_head_checkpoint.save`): params, config,
the target it reads (its params' sha256), the trimmed vocabulary if any, the
run records, and a model card.
"""

import dataclasses
import functools
import json
import sys
from typing import Any, Dict, Optional

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from specdec import checkpoints
from specdec import decoding
from specdec import draft_vocab
from specdec import evaluation
from specdec import feature_drafter
from specdec import feature_head_checkpoint
from specdec import fileio
from specdec import gin_utils
from specdec import models
from specdec import network
from specdec import partitioning
from specdec.training import feature_losses
from specdec.training import train
from specdec.training import train_config

PyTree = Any


def head_config(config: train_config.TrainConfig,
                target_config: network.T5Config) -> feature_drafter.FeatureHeadConfig:
  """The head's sizes from the run's feature_head section, for this target."""
  section = config.feature_head
  return feature_drafter.FeatureHeadConfig(
      feature_dim=target_config.emb_dim, vocab_size=target_config.vocab_size,
      width=section.width, num_layers=section.num_layers, num_heads=section.num_heads,
      head_dim=section.head_dim, mlp_dim=section.mlp_dim, attention=section.attention,
      relative_attention_num_buckets=target_config.relative_attention_num_buckets,
      relative_attention_max_distance=target_config.relative_attention_max_distance)


def read_draft_vocab(path: Optional[str], vocab_size: int) -> Optional[np.ndarray]:
  """The token ids of a draft vocabulary file (`draft_vocab.load_ids`), checked; None for no file."""
  if path is None:
    return None
  if not fileio.isfile(path):
    raise FileNotFoundError(f'draft_vocab_file={path!r} does not exist.')
  return draft_vocab.load_ids(path, vocab_size)


class FeatureHeadTrainer(train.Trainer):
  """The trainer for a feature head: see the module docstring."""

  COMMAND = 'python -m specdec.training.feature_training'

  def __init__(self, config: train_config.TrainConfig):
    section = config.feature_head
    if not section.target_dir:
      raise ValueError('FeatureHeadTrainer needs feature_head.target_dir (the frozen target).')
    if config.distill.teacher_dir:
      raise ValueError('A feature head learns from its target; distill.teacher_dir must be None.')
    if config.init.init_from_t5x:
      raise ValueError('init_from_t5x initialises T5 networks, not feature heads.')
    if not fileio.isdir(section.target_dir):
      raise FileNotFoundError(f'feature_head.target_dir={section.target_dir!r} does not exist.')
    if section.unroll_steps < 1:
      raise ValueError(f'feature_head.unroll_steps must be >= 1, got {section.unroll_steps}.')
    target_config, self.target_params_host = checkpoints.load_compact(section.target_dir)
    self.target_module = network.Transformer(target_config)
    self.head_config = head_config(config, target_config)
    self.vocab_ids = read_draft_vocab(section.draft_vocab_file, target_config.vocab_size)
    super().__init__(dataclasses.replace(config, network_config=target_config))

  # ---------------------------------------------------------------------------
  # Layout, state and step.
  # ---------------------------------------------------------------------------

  def _lay_out(self) -> None:
    config = self.config
    partition = config.partitioning
    self.mesh = partitioning.make_mesh(partition.num_partitions)
    self.rules = train.train_rules(partition.parameter_partitioning_dims)
    self.module = feature_drafter.FeatureHead(self.head_config)
    self.optimizer = gin_utils.configured(train.make_optimizer)()
    axis_sizes = partitioning.mesh_axis_sizes(self.mesh)
    params = jax.eval_shape(lambda: feature_drafter.init_params(self.head_config,
                                                                jax.random.PRNGKey(0)))
    param_specs = partitioning.param_specs(self.module, params, self.rules, axis_sizes)
    opt_shapes = jax.eval_shape(self.optimizer.init, params)
    self.specs = {'step': PartitionSpec(), 'params': param_specs,
                  'opt_state': partitioning.optimizer_state_specs(opt_shapes, params,
                                                                  param_specs)}
    self.shardings = partitioning.named_shardings(self.mesh, self.specs)
    self.init_from_t5x = None
    self.replicated = NamedSharding(self.mesh, PartitionSpec())
    self.data_sharding = NamedSharding(
        self.mesh, train.batch_spec(self.mesh, self.rules, config.data.batch_size))
    self.shapes = jax.eval_shape(lambda: train.fresh_state(
        self.optimizer, feature_drafter.init_params(self.head_config, jax.random.PRNGKey(0))))
    # The frozen target, laid out by decoding's rules (replicated on one device).
    target_specs = partitioning.param_specs(self.target_module, self.target_params_host, self.rules,
                                            axis_sizes)
    self.target_params = partitioning.put_tree(
        self.target_params_host, partitioning.named_shardings(self.mesh, target_specs))
    n_head = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    print(f'Feature head {self.head_config.to_dict()} ({n_head:,} parameters) for the target in '
          f'{self.config.feature_head.target_dir}'
          + ('' if self.vocab_ids is None else f', draft vocabulary of {len(self.vocab_ids)}')
          + '.', flush=True)

  def _teacher(self):
    return None

  def _initial_params(self):
    init_dir = self.config.init.init_from_dir
    if init_dir:
      config, params, _, _ = feature_head_checkpoint.load(init_dir)
      if config != self.head_config:
        raise ValueError(f'init_from_dir={init_dir} holds a head of another config: {config} vs '
                         f'{self.head_config}.')
      return partitioning.put_tree(params, self.shardings['params'])
    fresh = jax.jit(functools.partial(feature_drafter.init_params, self.head_config),
                    out_shardings=self.shardings['params'])
    return fresh(jax.random.PRNGKey(self.config.seed))

  def _loss(self, head_params, target_params, batch):
    section = self.config.feature_head
    return feature_losses.losses(
        self.module, head_params, self.target_module, target_params, batch,
        ce_weight=section.ce_weight, feature_weight=section.feature_weight,
        unroll_steps=section.unroll_steps, step_decay=section.step_decay,
        vocab_ids=self.vocab_ids)

  def _compiled_train_step(self):
    grad_fn = jax.value_and_grad(self._loss, has_aux=True)
    optimizer = self.optimizer

    def step(state, target_params, batch, rng):
      del rng  # the head has no dropout
      (loss, metrics), grads = grad_fn(state['params'], target_params, batch)
      updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
      params = optax.apply_updates(state['params'], updates)
      metrics = dict(metrics, loss=loss, grad_norm=optax.tree_utils.tree_norm(grads))
      return {'step': state['step'] + 1, 'params': params, 'opt_state': opt_state}, metrics

    target_shardings = jax.tree_util.tree_map(lambda x: x.sharding, self.target_params)
    jitted = jax.jit(step, in_shardings=(self.shardings, target_shardings, self.data_sharding,
                                         self.replicated),
                     out_shardings=(self.shardings, self.replicated), donate_argnums=(0,))
    return lambda state, batch, rng: jitted(state, self.target_params, batch, rng)

  # ---------------------------------------------------------------------------
  # Evaluation on the target's own greedy decodes.
  # ---------------------------------------------------------------------------

  def _prepare_evaluation(self) -> None:
    """Decodes `eval_examples` validation inputs per task with the target (greedy), once."""
    config = self.config
    lengths = self.feature_lengths
    baseline = models.SpeculativeEncoderDecoderModel(self.target_module, None,
                                                     decode_fn=decoding.temperature_sample)
    predict = baseline.compile_predict({'temperature': 0.0})
    batch_size = min(config.data.batch_size, 64)
    self.eval_sets = {}
    for task_name in config.evaluation.eval_decode_tasks:
      examples = evaluation.task_examples(task_name, 'validation', lengths,
                                          config.feature_head.eval_examples)
      batches = []
      for idx, batch in evaluation.batches(examples, lengths, batch_size, use_buckets=False):
        decodes, _ = predict({'target': self.target_params_host}, batch)
        decodes = np.array(decodes)
        decodes[len(idx):] = 0  # padding rows carry no weight
        batches.append(teacher_forced_batch(batch['encoder_input_tokens'], decodes))
      self.eval_sets[task_name] = batches
    self.eval_step = jax.jit(lambda hp, tp, b: self._loss(hp, tp, b))

  def evaluate(self, step: int) -> Dict[str, Any]:
    """Agreement with the target per task and depth (weighted by tokens); logged and returned."""
    params = self.state['params']
    record: Dict[str, Any] = {'step': step}
    for task_name, batches in self.eval_sets.items():
      sums: Dict[str, float] = {}
      tokens = 0.0
      for batch in batches:
        loss, metrics = self.eval_step(params, self.target_params, batch)
        n = float(np.sum(batch['decoder_loss_weights']))
        tokens += n
        for k, v in dict(metrics, loss=loss).items():
          sums[k] = sums.get(k, 0.0) + float(v) * n
      for k, v in sums.items():
        record[f'{task_name}/{k}'] = v / max(tokens, 1.0)
    losses = [v for k, v in record.items() if k.endswith('/loss')]
    record['eval_loss'] = float(np.mean(losses)) if losses else None
    print('eval ' + json.dumps(record), flush=True)
    if self.chief:
      train.append_log(self.log_path, dict(record, kind='eval'))
    return record

  # ---------------------------------------------------------------------------
  # Export.
  # ---------------------------------------------------------------------------

  def export(self, step: int, final_eval: Dict[str, Any]) -> None:
    """Writes the head (`feature_head_checkpoint.save`) and its model card to export_dir, with what made them."""
    config = self.config
    # Every process takes part in gathering the params; one writes them.
    params = partitioning.to_host(self.state['params'])
    if not self.chief:
      return
    section = config.feature_head
    train_record = dict(
        self.export_record(step, final_eval), target_dir=section.target_dir,
        loss={'ce_weight': section.ce_weight, 'feature_weight': section.feature_weight,
              'unroll_steps': section.unroll_steps, 'step_decay': section.step_decay},
        draft_vocab_file=section.draft_vocab_file)
    feature_head_checkpoint.save(
        config.export_dir, self.head_config, params,
        target_sha256=feature_head_checkpoint.params_sha256(self.target_params_host),
        draft_vocab_ids=self.vocab_ids, extra={'train': train_record})
    fileio.atomic_write(fileio.join(config.export_dir, 'MODEL_CARD.md'),
                        model_card(self.head_config, params, train_record,
                                   self.vocab_ids).encode())
    print(f'Exported the feature head to {config.export_dir}.', flush=True)


def teacher_forced_batch(encoder_input_tokens: np.ndarray,
                         decodes: np.ndarray) -> Dict[str, np.ndarray]:
  """A teacher-forcing batch on decodes [B, T] (zeros after EOS): targets, inputs, weights."""
  targets = np.asarray(decodes, np.int32)
  inputs = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  return {'encoder_input_tokens': np.asarray(encoder_input_tokens, np.int32),
          'decoder_input_tokens': inputs, 'decoder_target_tokens': targets,
          'decoder_loss_weights': (targets > 0).astype(np.float32)}


def model_card(config: feature_drafter.FeatureHeadConfig, params: PyTree,
               train_record: Dict[str, Any], vocab_ids: Optional[np.ndarray]) -> str:
  """MODEL_CARD.md of an exported head: what it is, what it read, what made it."""
  n = sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(params))
  final = train_record.get('final_eval') or {}
  agree = {k: round(v, 4) for k, v in final.items() if '/agree' in k}
  lines = [
      '# Model card: feature head', '',
      '- Kind: a feature drafter (specdec/feature_drafter.py): drafts from the target\'s final '
      'features and its own predictions of them, through the target\'s embedding and output '
      'projection.',
      f'- Config: {json.dumps(config.to_dict())}',
      f'- Parameters: {n:,} of its own (the target\'s embedding and projection are read, not '
      'copied).',
      f'- Target: `{train_record["target_dir"]}` (its params\' sha256 is recorded in config.json; '
      'another target is refused).',
      '- Draft vocabulary: ' + ('all tokens' if vocab_ids is None else
                                f'{len(vocab_ids)} tokens (`draft_vocab.json`, from '
                                f'`{train_record["draft_vocab_file"]}`)'),
      f'- Loss: {json.dumps(train_record["loss"])}.',
      f'- Data: `{train_record["mixture_or_task_name"]}` on '
      f'`{train_record["corpus_dir"] or "the registered corpus"}`'
      + (', its tasks drawn equally often.' if train_record.get('equal_rates') else '.'),
      f'- Initialised from: `{train_record.get("init_from_dir") or "random"}`.',
      f'- Training: {train_record["step"]} steps, {train_record["minutes"]:.1f} minutes over '
      f'{len(train_record["runs"])} run(s):']
  lines += [f'  - `{r["command"]}`: steps {r["from_step"]}→{r["to_step"]}, {r["minutes"]:.1f} min'
            for r in train_record['runs']]
  lines += [f'- Final evaluation (first-draft greedy agreement with the target on its own '
            f'decodes of validation inputs): {json.dumps(agree)}.', '']
  return '\n'.join(lines)


def main(argv=None):
  """`python -m specdec.training.feature_training --gin_file=... --gin.NAME=VALUE ...`.

  The gin files are the trainer's (`python -m specdec.training.train`), with
  train_config.FeatureHeadTrainConfig.target_dir bound (gin/train/feature_head.gin).
  """
  config = train.parse_config(sys.argv[1:] if argv is None else argv, 'specdec.training.feature_training')
  if not config.feature_head.target_dir:
    raise SystemExit('specdec.training.feature_training: bind train_config.FeatureHeadTrainConfig.'
                     'target_dir (the frozen target); a T5 network trains with '
                     'python -m specdec.training.train.')
  try:
    trainer = FeatureHeadTrainer(config)
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f'specdec.training.feature_training: {e}') from None
  trainer.run()


if __name__ == '__main__':
  # Gin binds the optimizer functions of `specdec.training.train` and this module's, not `__main__`'s.
  from specdec.training import feature_training as feature_training_module  # pylint: disable=g-import-not-at-top
  feature_training_module.main()
