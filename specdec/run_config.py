"""The launcher's configuration (`specdec.main.run`): T5X-style dataclasses, bound in gin, and their checks.

A gin experiment file builds one `RunConfig` for `main.run`:

  main.run.config = @run_config.RunConfig()
  run_config.RunConfig:
    output_dir = %OUTPUT_DIR
    mode = 'benchmark'
    data = @run_config.DataConfig()         # task, split, lengths, how many examples
    models = @run_config.ModelsConfig()     # target and drafter checkpoints
    decoding = @settings.Setting()          # γ, temperature, top-k/top-p, batch size, repeats, seed

`check` makes every check that needs no model: settings, modes, rows, that the checkpoints, corpus and vocabulary
exist, and that the drafter's vocabulary is the target's where both checkpoints record theirs. It raises
`ConfigError` (one line) before anything is written.
"""

import dataclasses
import json
from typing import Any, Optional, Sequence, Tuple

from specdec import fileio
from specdec import ngram
from specdec import settings
from specdec import tasks

MODES = ('infer', 'eval', 'benchmark', 'table')


# Where each keyword parameter of the former `main.run(...)` is bound now (a command line using one is told).
FORMER_RUN_PARAMETERS = {
    f'main.run.{name}': f'{configurable}.{name}'
    for configurable, names in (
        ('run_config.RunConfig', ('output_dir', 'mode', 'rows', 'table_name', 'num_partitions', 'overwrite')),
        ('run_config.DataConfig', ('task', 'split', 'feature_lengths', 'max_examples', 'corpus_dir', 'vocab_path')),
        ('run_config.ModelsConfig', ('target_checkpoint', 'drafter_checkpoint', 'target_config', 'drafter_config',
                                     'drafter_name', 'dtype')),
        ('settings.Setting', ('gamma', 'temperature', 'topk', 'topp', 'draft_confidence', 'batch_size', 'repeats',
                              'seed', 'length_buckets')))
    for name in names}


class ConfigError(ValueError):
  """A configuration that cannot run, said in one line."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The seqio task split a run decodes, and where its data lives.

  feature_lengths: {'inputs': N, 'targets': M} (longer inputs are cut; M bounds the decode).
  max_examples: the first N examples of the split (None: all).
  corpus_dir, vocab_path: the local corpus / the paper's tasks' vocabulary (None: the defaults).
  """
  task: str = tasks.ENDE_LOCAL_TASK
  split: str = 'test'
  feature_lengths: Any = (('inputs', 96), ('targets', 48))
  max_examples: Optional[int] = None
  corpus_dir: Optional[str] = None
  vocab_path: Optional[str] = None

  @property
  def lengths(self) -> dict:
    return dict(self.feature_lengths)


@dataclasses.dataclass(frozen=True)
class ModelsConfig:
  """The target and drafter checkpoints (compact, n-gram, T5X, Hugging Face, Orbax).

  target_config, drafter_config: network configs for formats that carry none (T5X, Orbax).
  drafter_name: the drafter's label in tables (None: its directory name).
  dtype: parameter dtype for T5X / Hugging Face / Orbax checkpoints (e.g. 'bfloat16').
  """
  target_checkpoint: str = ''
  drafter_checkpoint: Optional[str] = None
  target_config: Any = None
  drafter_config: Any = None
  drafter_name: Optional[str] = None
  dtype: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Row:
  """One benchmark row of a table: task, drafter checkpoint, temperature, γ (and adaptive drafting).

  Without `drafter_checkpoint`, the drafter is the directory `drafter` beside the target.
  """
  task: str
  drafter: str
  temperature: float
  gamma: int
  drafter_checkpoint: str = ''
  draft_confidence: float = 0.0


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One launcher run.

  output_dir: where everything is written; local or gs:// (then written locally and copied there).
  mode: 'infer' | 'eval' | 'benchmark' | 'table' (`specdec.main`).
  rows, table_name: mode 'table' (rows: `Row`s or dicts of its fields; each row's temperature and γ replace
    `decoding`'s).
  num_partitions: model-parallel size of a ('data', 'model') mesh over all devices; None: one device.
  overwrite: discard what an earlier run wrote into output_dir and start afresh (without it a rerun resumes,
    and only a run of the same configuration).
  ceiling_alpha: mode 'table': also measure, and print under the table, one row of the oracle drafter of
    controlled acceptance at this α* on the first row's task (batch 1, greedy, γ the best of this machine's
    verify-cost curve; `ceiling.controlled_row`): what the loop gives when drafts are good. 0: none.
  """
  output_dir: str = ''
  mode: str = 'benchmark'
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  models: ModelsConfig = dataclasses.field(default_factory=ModelsConfig)
  decoding: settings.Setting = dataclasses.field(default_factory=settings.Setting)
  rows: Sequence[Any] = ()
  table_name: str = 'Table 2 analogue'
  num_partitions: Optional[int] = None
  overwrite: bool = False
  ceiling_alpha: float = 0.0


def table_rows(config: RunConfig) -> Tuple[Row, ...]:
  """The table's rows as `Row`s (gin files give them as dicts)."""
  return tuple(r if isinstance(r, Row) else Row(**r) for r in config.rows)


def row_drafter_checkpoint(row: Row, target_checkpoint: str) -> str:
  """A row's drafter directory: its own checkpoint, else a sibling of the target (the shipped family's layout)."""
  return row.drafter_checkpoint or fileio.join(fileio.dirname(fileio.normpath(target_checkpoint)), row.drafter)


def row_setting(row: Row, setting: settings.Setting) -> settings.Setting:
  """`setting` with the row's γ, temperature and adaptive drafting."""
  return dataclasses.replace(setting, gamma=row.gamma, temperature=row.temperature,
                             draft_confidence=row.draft_confidence)


def row_label(row: Row) -> str:
  """What a log line says of a row: task, drafter, temperature, γ."""
  return (f'task {row.task}, drafter {row.drafter}, temperature {row.temperature:g}, γ {row.gamma}'
          + (f', draft confidence {row.draft_confidence:g}' if row.draft_confidence else ''))


def _plain_setting(setting: Any) -> settings.Setting:
  """A `settings.Setting` of the same fields (gin may hand a subclass it made to carry the bindings)."""
  return settings.Setting(**{f.name: getattr(setting, f.name) for f in dataclasses.fields(settings.Setting)})


def normalized(config: RunConfig) -> RunConfig:
  """`config` with its decoding a plain `settings.Setting` and its rows `Row`s."""
  return dataclasses.replace(config, decoding=_plain_setting(config.decoding), rows=table_rows(config))


def _checked_setting(setting: settings.Setting, where: str = '') -> None:
  try:
    setting.validate()
  except ValueError as e:
    raise ConfigError(f'{where}{e}') from None


def check_settings(config: RunConfig) -> None:
  """The checks that read nothing: mode, lengths, decoding setting, rows, drafter present."""
  if config.mode not in MODES:
    raise ConfigError(f'mode must be one of {MODES}, got {config.mode!r}.')
  if not config.output_dir:
    raise ConfigError('No output directory: set OUTPUT_DIR (--gin.OUTPUT_DIR="\'runs/NAME\'").')
  if not config.models.target_checkpoint:
    raise ConfigError('No target checkpoint: set TARGET_CHECKPOINT (run_config.ModelsConfig.target_checkpoint).')
  lengths = config.data.lengths
  if set(lengths) != {'inputs', 'targets'}:
    raise ConfigError(f"feature_lengths needs 'inputs' and 'targets', got {sorted(lengths)}.")
  _checked_setting(config.decoding)
  if config.mode == 'table':
    if not config.rows:
      raise ConfigError("mode='table' needs rows (a list of run_config.Row or of dicts with its fields).")
    for i, row in enumerate(table_rows(config)):
      _checked_setting(row_setting(row, config.decoding), f'table row {i + 1} ({row.task}, {row.drafter}): ')
  alpha = config.ceiling_alpha
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
    raise ConfigError(f'ceiling_alpha must be a number in [0, 1] (0: no controlled-acceptance row), got {alpha!r}.')
  if alpha and config.mode != 'table':
    raise ConfigError(f"ceiling_alpha ({alpha:g}) adds a row to a table: it needs mode='table', not {config.mode!r}.")
  if alpha and config.num_partitions:
    raise ConfigError('ceiling_alpha measures on one device: it cannot run with num_partitions.')
  if config.mode == 'benchmark' and not config.models.drafter_checkpoint:
    raise ConfigError('The benchmark needs a drafter: set DRAFTER_CHECKPOINT.')


def checkpoint_vocab_size(checkpoint: str, config: Any = None) -> Optional[int]:
  """The vocabulary size a checkpoint's own config (or the gin-given `config`) records; None if neither does."""
  if config is not None:
    return config.vocab_size
  if fileio.is_url(checkpoint):  # not read before the run: a remote listing may be slow
    return None
  path = fileio.join(checkpoint, 'config.json')
  if not fileio.exists(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      meta = json.load(f)
  except (OSError, ValueError):
    return None  # loading the checkpoint says what is wrong with it
  if not isinstance(meta, dict):
    return None
  if ngram.is_ngram_dir(checkpoint):
    return (meta.get('ngram_config') or {}).get('vocab_size')
  if isinstance(meta.get('config'), dict):  # the compact format
    return meta['config'].get('vocab_size')
  return meta.get('vocab_size')  # a Hugging Face directory


def _checked_exists(path: Optional[str], what: str) -> None:
  # Remote paths (gs://) are left to the run: checking them may need credentials and network here.
  if path and not fileio.is_url(path) and not fileio.exists(path):
    raise ConfigError(f'{what} not found: {path}')


def drafter_checkpoints(config: RunConfig) -> Tuple[Tuple[str, str], ...]:
  """(label, checkpoint directory) of every drafter the run loads."""
  if config.mode == 'table':
    return tuple((f'table row {i + 1} drafter {row.drafter}',
                  row_drafter_checkpoint(row, config.models.target_checkpoint))
                 for i, row in enumerate(table_rows(config)))
  if config.models.drafter_checkpoint:
    return (('drafter checkpoint', config.models.drafter_checkpoint),)
  return ()


def check_files(config: RunConfig) -> None:
  """The checks that read only small files: checkpoints, corpus and vocabulary exist; vocabularies agree."""
  models = config.models
  _checked_exists(models.target_checkpoint, 'target checkpoint')
  _checked_exists(config.data.corpus_dir, 'corpus directory')
  _checked_exists(config.data.vocab_path, 'vocabulary')
  target_vocab = checkpoint_vocab_size(models.target_checkpoint, models.target_config)
  for label, path in drafter_checkpoints(config):
    _checked_exists(path, label)
    drafter_vocab = checkpoint_vocab_size(path, models.drafter_config)
    if None not in (target_vocab, drafter_vocab) and drafter_vocab != target_vocab:
      raise ConfigError(f'Vocabulary mismatch: target vocab_size={target_vocab}, {label} ({path}) '
                        f'vocab_size={drafter_vocab}.')


def check(config: RunConfig) -> None:
  """Every check that loads no model (`check_settings`, then `check_files`); raises ConfigError."""
  check_settings(config)
  check_files(config)


def describe(config: RunConfig) -> str:
  """The run's header line: mode, task(s), split, models, output."""
  if config.mode == 'table':
    rows = table_rows(config)
    tasks_named = ', '.join(dict.fromkeys(r.task for r in rows))
    what = f'{len(rows)} rows on {tasks_named}:{config.data.split}'
  else:
    drafter = config.models.drafter_checkpoint
    what = (f'task {config.data.task}:{config.data.split}, drafter {drafter or "none"}, '
            f'γ {config.decoding.gamma}, temperature {config.decoding.temperature:g}')
  return f'specdec {config.mode}: {what}, target {config.models.target_checkpoint}'

