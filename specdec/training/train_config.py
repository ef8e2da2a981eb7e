"""What a training run is told: t5x-style config dataclasses (gin-configurable).

`TrainConfig` holds the run (model_dir, the network, steps, logging,
checkpointing, export) and one section per concern: `DataConfig` (what is
trained on, in what batches), `InitConfig` (where the params start),
`DistillConfig` (a teacher to distil from), `EvalConfig` (periodic
evaluation), `PartitioningConfig` (the device mesh) and
`FeatureHeadTrainConfig` (a feature head for a frozen target instead). The optimizer and
its learning-rate schedule are gin-configurable functions of specdec/training/train.py
(`make_optimizer`, `learning_rate_schedule`, `constant_learning_rate`).

Gin files bind the classes of this module (`from specdec.training import train_config`):

  train_config.TrainConfig.num_steps = 2400
  train_config.DataConfig.batch_size = 32

A section left unbound in `TrainConfig` is built from its gin bindings, so a
file may bind `train_config.DataConfig.batch_size` without naming
`TrainConfig.data`; the shipped files name every section all the same,
because a command-line binding only reaches a class that a file names.
Field names are those of the flat keyword arguments `train.train` takes
(`batch_size`, `eval_every`, `init_from_dir`, ...; the network config is
`network_config`, `config` in old bindings):
`FIELD_SECTIONS` says which section holds each, `from_flat` builds a config
from them, `upgrade_binding` rewrites an old command-line binding
(`train.train.NAME = VALUE`) to the new one, and `old_bindings` finds such
bindings left in gin files.
"""

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence

import gin

from specdec import feature_drafter
from specdec import gin_utils
from specdec import network


def _section(cls):
  """A dataclass field whose default is `cls` as gin configures it (when it does)."""
  return dataclasses.field(default_factory=lambda: gin_utils.configured(cls)())


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What is trained on, in what batches.

  `batch_size` is global: it must divide over the mesh's 'data' axis.
  `corpus_dir` (re)registers the local tasks on that corpus first (e.g. a
  distillation corpus from scripts/build_distill_corpus.py); None: the tasks
  as registered ($SPECDEC_CORPUS_DIR or data/corpus). `equal_rates`: the
  local mixture draws its tasks equally often, instead of in proportion to
  their train rows (e.g. a distillation corpus with 200,000 En->De rows and
  30,000 summarization rows). `task_rates` (instead): each local task's rate by
  name, e.g. the real corpus's train rows, so that a corpus grown in one task
  (scripts/build_self_training_corpus.py) draws its tasks as the real one did.
  """
  mixture_or_task_name: str = 'specdec_local_mix'
  feature_lengths: Mapping[str, int] = (('inputs', 128), ('targets', 64))
  batch_size: int = 32
  corpus_dir: Optional[str] = None
  equal_rates: bool = False
  task_rates: Optional[Mapping[str, float]] = None


@dataclasses.dataclass(frozen=True)
class InitConfig:
  """Where the params start when model_dir holds no checkpoint (else it resumes).

  `init_from_dir`: a compact model of the same network config, with a fresh
  optimizer state and step counter (to continue a shipped model whose
  checkpoints are gone). With `init_matching_only` the config may differ:
  every parameter whose path and shape exist in both starts from it, the
  rest fresh (e.g. a one-decoder-layer drafter from a two-layer one).
  `init_from_t5x` (instead): a T5X checkpoint (`checkpoint_<step>/`, local
  or gs://), read straight into the params' shards, with a fresh optimizer;
  its vocabulary size must be the network's. None of them: a fresh init.
  """
  init_from_dir: Optional[str] = None
  init_matching_only: bool = False
  init_from_t5x: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class DistillConfig:
  """With `teacher_dir` (a compact model), loss = (1 - w) CE + w D(teacher, student).

  w is `distill_weight`; D is `divergence`, one of specdec/training/distill.py's
  (fkl, rkl, tvd, greedy_ce).
  """
  teacher_dir: Optional[str] = None
  distill_weight: float = 0.5
  divergence: str = 'fkl'


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Every `eval_every` steps and at the end: validation loss, then BLEU / ROUGE.

  The loss is over `eval_batches` validation batches; the scores are of
  greedy decodes of `eval_decode_examples` validation examples of each of
  `eval_decode_tasks` (0: none).
  """
  eval_every: int = 500
  eval_batches: int = 8
  eval_decode_tasks: Sequence[str] = ('specdec_ende_local', 'specdec_summarize_local')
  eval_decode_examples: int = 64


@dataclasses.dataclass(frozen=True)
class PartitioningConfig:
  """The ('data', 'model') mesh: `num_partitions` devices per model-parallel group.

  'data' gets the rest of the devices; `parameter_partitioning_dims=2` also
  shards the params' embed axis over 'data' (T5X's 2-D parameter
  partitioning).
  """
  num_partitions: int = 1
  parameter_partitioning_dims: int = 1


# A feature head's own sizes default to the network's (`feature_drafter.FeatureHeadConfig`).
_HEAD_DEFAULTS = {field.name: field.default for field in dataclasses.fields(feature_drafter.FeatureHeadConfig)}


@dataclasses.dataclass(frozen=True)
class FeatureHeadTrainConfig:
  """Training a feature head (specdec/feature_drafter.py) for a frozen target.

  With `target_dir` (a compact T5 model) the run trains a head that drafts
  from that target's features, instead of a T5 network: `network_config` is
  then the target's (read from target_dir; what gin binds is not used).
  Head sizes: `width`, `num_layers`, `num_heads`, `head_dim`, `mlp_dim`;
  `attention` False for an attention-free head (residual MLP layers).
  Loss per depth: `feature_weight` SmoothL1 + `ce_weight` CE, over
  `unroll_steps` depths weighted `step_decay`**s (1: EAGLE; > 1: EAGLE-3's
  training-time test). `draft_vocab_file`: a JSON list of token ids, the
  head's trimmed vocabulary (scripts/draft_vocab.py), or None (all).
  Evaluation: first-draft agreement with the target on its own greedy decodes
  of `eval_examples` validation inputs of each of EvalConfig's
  `eval_decode_tasks`.
  """
  target_dir: Optional[str] = None
  width: int = _HEAD_DEFAULTS['width']
  num_layers: int = _HEAD_DEFAULTS['num_layers']
  num_heads: int = _HEAD_DEFAULTS['num_heads']
  head_dim: int = _HEAD_DEFAULTS['head_dim']
  mlp_dim: int = _HEAD_DEFAULTS['mlp_dim']
  attention: bool = _HEAD_DEFAULTS['attention']
  ce_weight: float = 0.1
  feature_weight: float = 1.0
  unroll_steps: int = 1
  step_decay: float = 0.8
  draft_vocab_file: Optional[str] = None
  eval_examples: int = 256


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """One training run of `network_config` into `model_dir` (resumed if it holds checkpoints).

  `seed` seeds the init, the dropout and the data order; `z_loss` is T5X's
  auxiliary loss on log Z. A progress line and a train_log.jsonl record
  every `log_every` steps; a checkpoint every `checkpoint_every` steps and
  at the end; `max_minutes` stops earlier (checkpointed; run again to
  resume). `export_dir`: where the final params go in the compact format.
  """
  model_dir: str
  network_config: network.T5Config
  num_steps: int = 2000
  seed: int = 0
  z_loss: float = 1e-4
  log_every: int = 20
  checkpoint_every: int = 200
  max_minutes: Optional[float] = None
  export_dir: Optional[str] = None
  data: DataConfig = _section(DataConfig)
  init: InitConfig = _section(InitConfig)
  distill: DistillConfig = _section(DistillConfig)
  evaluation: EvalConfig = _section(EvalConfig)
  partitioning: PartitioningConfig = _section(PartitioningConfig)
  feature_head: FeatureHeadTrainConfig = _section(FeatureHeadTrainConfig)


# The section (TrainConfig field) of each section class.
SECTIONS: Dict[str, type] = {
    'data': DataConfig, 'init': InitConfig, 'distill': DistillConfig,
    'evaluation': EvalConfig, 'partitioning': PartitioningConfig,
    'feature_head': FeatureHeadTrainConfig}

# Each flat name (a keyword of the old train.train) -> its section, None for TrainConfig's own.
FIELD_SECTIONS: Dict[str, Optional[str]] = dict(
    {f.name: None for f in dataclasses.fields(TrainConfig) if f.name not in SECTIONS},
    **{f.name: section for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)})
# Old flat names that TrainConfig spells otherwise.
_RENAMED = {'config': 'network_config'}


def from_flat(model_dir: str, network_config: network.T5Config, **settings: Any) -> TrainConfig:
  """A TrainConfig from flat settings (`batch_size=8, eval_every=100, ...`).

  Every name is a field of TrainConfig or of one of its sections
  (`FIELD_SECTIONS`); the rest keep their defaults (gin bindings play no
  part). TypeError for an unknown name.
  """
  unknown = sorted(set(settings) - set(FIELD_SECTIONS))
  if unknown:
    raise TypeError(f'Unknown training settings {unknown}; known: {sorted(FIELD_SECTIONS)}.')
  top: Dict[str, Any] = {}
  by_section: Dict[str, Dict[str, Any]] = {}
  for name, value in settings.items():
    section = FIELD_SECTIONS[name]
    if section is None:
      top[name] = value
    else:
      by_section.setdefault(section, {})[name] = value
  sections = {section: cls(**by_section.get(section, {})) for section, cls in SECTIONS.items()}
  return TrainConfig(model_dir=model_dir, network_config=network_config, **top, **sections)


def selector(name: str) -> str:
  """The gin selector of flat setting `name` ('batch_size' -> 'train_config.DataConfig.batch_size')."""
  name = _RENAMED.get(name, name)
  section = FIELD_SECTIONS.get(name)
  cls = TrainConfig if section is None else SECTIONS[section]
  return f'train_config.{cls.__name__}.{name}'


# Where each keyword parameter of the former `train.train(...)` is bound now (a command line using one is told).
FORMER_TRAIN_PARAMETERS: Dict[str, str] = {
    f'train.train.{name}': selector(name) for name in [*FIELD_SECTIONS, *_RENAMED]}


def flat_settings(config: TrainConfig) -> Dict[str, Any]:
  """Every setting of `config` by its flat name (network_config as itself)."""
  flat = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
          if f.name not in SECTIONS}
  for section in SECTIONS:
    flat.update(dataclasses.asdict(getattr(config, section)))
  return flat


def old_bindings() -> List[str]:
  """The NAMEs the parsed gin config binds as `train.train.NAME` (a gin file of old).

  Nothing reads them any more: main refuses them rather than train without them.
  """
  found = []
  for name in [*FIELD_SECTIONS, *_RENAMED]:
    try:
      gin.query_parameter(f'train.train.{name}')
    except ValueError:  # not bound (or train.train never named)
      continue
    found.append(name)
  return found
