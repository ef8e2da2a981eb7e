"""The launcher: gin-configured inference, evaluation, benchmarks and paper tables.

  python -m specdec.main --gin_file=experiments/cpu/table2/ende_d1_t0.gin --gin.OUTPUT_DIR="'runs/x'"
  specdec --gin_file=... --gin.NAME=VALUE ...          (the same, as a console script)
  python -m specdec.main                               (the main job: gin/experiments/cpu/main_job.gin)
  python -m specdec.main --help                        (modes, gin folders, the main job's macros)

Flags follow T5X: `--gin_file=PATH` (repeatable; looked up as given, then under the repo's gin/), and
`--gin.NAME=VALUE` bindings. `--multihost` initialises multi-host JAX first (`partitioning.initialize_multihost`,
Cloud TPU pod slices). `--debug` shows an error's traceback. Everything the run writes goes under OUTPUT_DIR.

`run` takes one `run_config.RunConfig`, built in gin (`main.run.config = @run_config.RunConfig()`): its mode,
output directory, data (`run_config.DataConfig`: task, split, lengths, max_examples), models
(`run_config.ModelsConfig`: checkpoints), decoding (`settings.Setting`: γ, temperature, batch size, ...) and,
for tables, rows. `run_config.RunConfig.num_partitions` shards params, caches and decoding over a (data, model)
mesh.

Modes (`run_config.RunConfig.mode`):
- 'infer': decode a task split (`evaluation.decode_split`), write predictions.jsonl (resumable) and decode statistics;
- 'eval': 'infer' plus the task's seqio metrics (metrics.json);
- 'benchmark': `specdec.bench.benchmark.run` (baseline vs speculative in one run, see that module);
- 'table': several benchmark rows (`rows`), one subdirectory each, then a table beside the paper's numbers.

A rerun into the same OUTPUT_DIR resumes, but only what the same configuration wrote: each output directory records
a fingerprint (task, split, checkpoints and their contents, decoding settings, lengths, seed, batch size, kind of
output; `specdec.fingerprint`) and a rerun that differs is refused with the differing fields named. max_examples
may grow (the run is extended), not shrink. A resumed benchmark keeps the cost measurements its first run stored.
`--gin.run_config.RunConfig.overwrite=True` discards the old outputs instead.

Every check that needs no model (gin bindings, gin files, settings, rows, that checkpoints, corpus and vocabulary
exist, tasks, fingerprints) runs before anything is written. An error ends the command with one line on stderr and
exit status 2 for what the user gave, 1 for anything else; `--debug` shows the traceback instead.
"""

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence

import gin
import jax

from specdec import import_order  # pylint: disable=g-bad-import-order

import_order.import_tensorflow_quietly()  # before specdec's modules import seqio, and with it TF

from specdec.bench import benchmark  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.bench import ceiling
from specdec.bench import ceiling_report
from specdec import decoding
from specdec import evaluation
from specdec import fileio
from specdec import fingerprint
from specdec import gin_utils
from specdec import loading
from specdec import models
from specdec import partitioning
from specdec.bench import reporting
from specdec import run_config
from specdec import settings
from specdec.bench import tables
from specdec import tasks

DEFAULT_GIN_FILE = 'experiments/cpu/main_job.gin'
MODES = run_config.MODES
Row = run_config.Row  # a table row; gin files give rows as dicts of its fields
# Bump when a code change makes predictions.jsonl records written before it incomparable with new ones.
PREDICTIONS_VERSION = 1
# What each kind of run writes into OUTPUT_DIR (overwrite=True discards exactly these, and the fingerprint).
PREDICTION_FILES = ('predictions.jsonl', 'statistics.json', 'metrics.json')
# A table's controlled-acceptance row (run_config.RunConfig.ceiling_alpha): its result, and its state folder.
CONTROLLED_FILE, CONTROLLED_DIR = 'controlled.json', 'controlled'
# Its verify-cost curve's widest call: γ up to 11 (the best γ at α* 0.9 was 8 on 2 cores).
CONTROLLED_MAX_VERIFY_TOKENS = 12
TABLE_FILES = ('table.md', 'table.json', CONTROLLED_FILE, CONTROLLED_DIR)


def _copy_tree(src: str, dst: str) -> None:
  """Recursive copy through tf.io.gfile (local paths and gs://)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (seqio's dependency; gfile reads gs://)
  for root, _, files in tf.io.gfile.walk(src):
    rel = os.path.relpath(root, src) if not fileio.is_url(src) else root[len(src):].lstrip('/')
    target = dst.rstrip('/') + ('/' + rel if rel not in ('', '.') else '')
    tf.io.gfile.makedirs(target)
    for name in files:
      tf.io.gfile.copy(root.rstrip('/') + '/' + name, target + '/' + name, overwrite=True)


@contextlib.contextmanager
def local_output_dir(output_dir: str):
  """A local directory standing in for `output_dir`.

  Local paths are used as they are. For a remote one (gs://, e.g. on Cloud TPU) results are written to a local
  directory that starts from the remote one's contents (so a rerun resumes) and is copied back at the end,
  also when the run fails part-way. On a multi-host run only process 0 writes the results: every other process
  works in a private copy of the directory, taken before process 0 writes anything (so that every process
  resumes the same way and decodes the same batches in step), and discarded at the end.
  """
  if fileio.is_url(output_dir):
    with _remote_output_dir(output_dir) as local:
      yield local
    return
  if jax.process_count() == 1:
    os.makedirs(output_dir, exist_ok=True)
    yield output_dir
    return
  with contextlib.ExitStack() as stack:
    local = output_dir
    if jax.process_index() == 0:
      os.makedirs(output_dir, exist_ok=True)
    else:
      local = stack.enter_context(tempfile.TemporaryDirectory(prefix='specdec_output_'))
      if os.path.isdir(output_dir):  # else process 0 has not made it yet: it starts empty for every process
        shutil.copytree(output_dir, local, dirs_exist_ok=True)
    _all_processes_reach('specdec.main.local_output_dir')
    yield local


def _all_processes_reach(name: str) -> None:
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def _remote_output_dir(output_dir: str):
  """`local_output_dir` of a gs:// directory: only process 0 copies the results back."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # One local directory per process: processes that share a machine must not write into each other's.
  local = os.path.join(tempfile.gettempdir(), 'specdec_output',
                       hashlib.sha256(output_dir.encode()).hexdigest()[:16] + f'-{jax.process_index()}')
  os.makedirs(local, exist_ok=True)
  if tf.io.gfile.exists(output_dir):
    _copy_tree(output_dir, local)
  try:
    yield local
  finally:
    if jax.process_index() == 0:
      _copy_tree(local, output_dir)


def run(config: run_config.RunConfig = gin.REQUIRED) -> Dict[str, Any]:
  """Runs one experiment (see the module docstring for the modes); returns its summary.

  `config` is built in gin (`main.run.config = @run_config.RunConfig()`, see `specdec.run_config`). Before
  anything is written: the whole config is checked (`run_config.check`: settings, rows, and that checkpoints,
  corpus and vocabulary exist, raising `run_config.ConfigError`), the tasks are registered and looked up, and
  every output directory's fingerprint is compared (`fingerprint.ResumeRefused`).
  """
  config = run_config.normalized(config)
  run_config.check(config)
  tasks.register_tasks(config.data.corpus_dir, config.data.vocab_path)
  _check_tasks(config)
  # Model-parallel over `num_partitions` devices, data-parallel over the rest (T5X's rules); None: one device.
  mesh = partitioning.make_mesh(config.num_partitions) if config.num_partitions else None
  plans = output_plans(config, mesh)
  if not fileio.is_url(config.output_dir):
    _refuse_mismatched_outputs(config.output_dir, plans, config.overwrite)
  print(f'{run_config.describe(config)}, output {config.output_dir}'
        + (f', mesh {dict(mesh.shape)}' if mesh is not None else ''), flush=True)
  with local_output_dir(config.output_dir) as local_dir:
    return _execute(config, local_dir, plans, mesh)


def _check_tasks(config: run_config.RunConfig) -> None:
  """Every task the run decodes is registered (a misspelt name fails here, before anything is written)."""
  import seqio  # pylint: disable=g-import-not-at-top
  names = ([r.task for r in config.rows] if config.mode == 'table' else [config.data.task])
  known = seqio.TaskRegistry.names()
  for name in names:
    if name not in known and name not in seqio.MixtureRegistry.names():
      raise run_config.ConfigError(f'unknown task {name!r} (registered: {", ".join(sorted(known))}).')


def predictions_fingerprint(task: str, split: str, lengths: Mapping[str, int], setting: settings.Setting,
                            max_examples: Optional[int], drafter_name: str,
                            models_fields: Mapping[str, Any]) -> Dict[str, Any]:
  """What determines predictions.jsonl ('infer' and 'eval' share it: 'eval' may score an 'infer' run)."""
  speculative = models_fields.get('drafter_checkpoint') is not None
  return dict(outputs='predictions', code_version=PREDICTIONS_VERSION, task=task, split=split,
              feature_lengths=dict(lengths), max_examples=max_examples, drafter=drafter_name,
              temperature=setting.temperature, topk=setting.topk, topp=setting.topp,
              # γ and adaptive drafting leave a baseline decode (no drafter) unchanged.
              gamma=setting.gamma if speculative else None,
              draft_confidence=setting.draft_confidence if speculative else None,
              batch_size=setting.batch_size, seed=setting.seed, length_buckets=setting.length_buckets,
              **models_fields)


def _refuse_if_mismatched(output_dir: str, expected: Mapping[str, Any], owned: Sequence[str],
                          overwrite: bool) -> None:
  """Fails before any model loads when output_dir holds another configuration's outputs (overwrite: later)."""
  reason = None if overwrite else fingerprint.problem(output_dir, expected, owned)
  if reason:
    raise fingerprint.ResumeRefused(reason)


def _table_row_name(row: Row) -> str:
  return (f'{row.task}_{row.drafter}_t{row.temperature:g}_g{row.gamma}'
          + (f'_conf{row.draft_confidence:g}' if row.draft_confidence else ''))


@dataclasses.dataclass(frozen=True)
class OutputPlan:
  """One output directory of a run (a table has one per row) and the fingerprint its outputs must carry."""
  subdir: str  # under output_dir ('' for output_dir itself)
  expected: Mapping[str, Any]
  owned: Sequence[str]
  drafter_checkpoint: Optional[str]
  drafter_name: str
  setting: settings.Setting
  provenance: Mapping[str, Any]
  row: Optional[Row] = None


def output_plans(config: run_config.RunConfig, mesh=None) -> List[OutputPlan]:
  """What each output directory of `config` will hold (a table's rows, or the run's one directory)."""
  data, models_config = config.data, config.models
  if config.mode == 'table':
    plans = []
    for row in config.rows:
      drafter_dir = run_config.row_drafter_checkpoint(row, models_config.target_checkpoint)
      setting = run_config.row_setting(row, config.decoding)
      fields = fingerprint.models_fields(models_config.target_checkpoint, drafter_dir,
                                         models_config.target_config, models_config.drafter_config,
                                         models_config.dtype)
      expected = benchmark.fingerprint_fields(row.task, data.split, data.lengths, setting, data.max_examples,
                                              row.drafter, fields, mesh)
      plans.append(OutputPlan(_table_row_name(row), expected, benchmark.OUTPUT_FILES, drafter_dir, row.drafter,
                              setting, fields, row))
    return plans
  drafter_checkpoint = models_config.drafter_checkpoint
  drafter_name = ((models_config.drafter_name or fileio.basename(fileio.normpath(drafter_checkpoint)))
                  if drafter_checkpoint else 'none')
  fields = fingerprint.models_fields(models_config.target_checkpoint, drafter_checkpoint,
                                     models_config.target_config, models_config.drafter_config, models_config.dtype)
  if config.mode == 'benchmark':
    expected = benchmark.fingerprint_fields(data.task, data.split, data.lengths, config.decoding,
                                            data.max_examples, drafter_name, fields, mesh)
    owned = benchmark.OUTPUT_FILES
  else:
    expected = predictions_fingerprint(data.task, data.split, data.lengths, config.decoding, data.max_examples,
                                       drafter_name, fields)
    owned = PREDICTION_FILES
  return [OutputPlan('', expected, owned, drafter_checkpoint, drafter_name, config.decoding, fields)]


def _refuse_mismatched_outputs(output_dir: str, plans: Sequence[OutputPlan], overwrite: bool) -> None:
  """Fails, before anything is written or loaded, when a directory holds another configuration's outputs."""
  for plan in plans:
    _refuse_if_mismatched(os.path.join(output_dir, plan.subdir) if plan.subdir else output_dir,
                          plan.expected, plan.owned, overwrite)
  if plans and plans[0].row is not None and not overwrite:  # the table's own files
    reason = fingerprint.problem(output_dir, {'outputs': 'table'}, TABLE_FILES)
    if reason:
      raise fingerprint.ResumeRefused(reason)


def _controlled_row(config: run_config.RunConfig, output_dir: str, target_module, target_params) -> Dict[str, Any]:
  """The table's controlled-acceptance row (`ceiling.controlled_row`) on the first row's task and examples; its
  verify curve and state kept under `output_dir`/controlled/, so a rerun resumes it."""
  data, task = config.data, config.rows[0].task
  examples = benchmark.load_examples(benchmark.TaskSplit(task, data.split, data.lengths, data.max_examples))
  print(f'Controlled acceptance: the oracle drafter at α* {config.ceiling_alpha:g} on {task}', flush=True)
  return ceiling.controlled_row(target_module, target_params, examples, data.lengths, config.ceiling_alpha,
                                max_verify_tokens=min(CONTROLLED_MAX_VERIFY_TOKENS, data.lengths['targets'] - 1),
                                state_dir=os.path.join(output_dir, CONTROLLED_DIR),
                                log=lambda line: print(f'  {line}', flush=True))


def _execute(config: run_config.RunConfig, output_dir: str, plans: Sequence[OutputPlan], mesh=None):
  """`run` after its checks, writing into the local directory `output_dir` what `plans` describe."""
  data, models_config = config.data, config.models
  _refuse_mismatched_outputs(output_dir, plans, config.overwrite)  # a remote directory's copy is read only now
  load = lambda checkpoint, network_config, target_params=None: loading.restore(
      checkpoint, network_config, models_config.dtype, mesh, target_params)

  if config.mode == 'table':
    # The table itself is rewritten from its rows on every run; its fingerprint keeps other modes out.
    fingerprint.prepare(output_dir, {'outputs': 'table'}, TABLE_FILES, config.overwrite)
    target = load(models_config.target_checkpoint, models_config.target_config)
    target_module, target_params = target.module, target.params
    summaries = []
    for i, plan in enumerate(plans):
      print(f'Row {i + 1}/{len(plans)}: {run_config.row_label(plan.row)}', flush=True)
      drafter = load(plan.drafter_checkpoint, models_config.drafter_config, target_params)
      summaries.append(benchmark.run(
          benchmark.ModelPair(target_module, target_params, drafter.module, drafter.params, plan.drafter_name,
                              drafter.draft_vocab_ids),
          benchmark.TaskSplit(plan.row.task, data.split, data.lengths, data.max_examples), plan.setting,
          benchmark.Output(os.path.join(output_dir, plan.subdir), overwrite=config.overwrite,
                           provenance=plan.provenance), benchmark.Measuring(mesh=mesh)))
    text = tables.table2_markdown(summaries, title=config.table_name)
    out = {'rows': summaries}
    if config.ceiling_alpha:
      out['controlled'] = _controlled_row(config, output_dir, target_module, target_params)
      text += '\n' + ceiling_report.controlled_row_markdown(
          out['controlled'], tables.TASK_LABEL.get(config.rows[0].task, config.rows[0].task))
      fileio.atomic_write(os.path.join(output_dir, CONTROLLED_FILE),
                          json.dumps(out['controlled'], indent=2).encode())
    fileio.atomic_write(os.path.join(output_dir, 'table.md'), text.encode())
    fileio.atomic_write(os.path.join(output_dir, 'table.json'), json.dumps(summaries, indent=2).encode())
    print(text, flush=True)
    return out

  (plan,) = plans
  setting = config.decoding
  target = load(models_config.target_checkpoint, models_config.target_config)
  target_module, target_params = target.module, target.params
  drafter_module = drafter_params = draft_vocab_ids = None
  if plan.drafter_checkpoint:
    drafter = load(plan.drafter_checkpoint, models_config.drafter_config, target_params)
    drafter_module, drafter_params, draft_vocab_ids = drafter.module, drafter.params, drafter.draft_vocab_ids
  if config.mode == 'benchmark':
    summary = benchmark.run(
        benchmark.ModelPair(target_module, target_params, drafter_module, drafter_params, plan.drafter_name,
                            draft_vocab_ids),
        benchmark.TaskSplit(data.task, data.split, data.lengths, data.max_examples), setting,
        benchmark.Output(output_dir, overwrite=config.overwrite, provenance=plan.provenance),
        benchmark.Measuring(mesh=mesh))
    print(reporting.benchmark_markdown(summary), flush=True)
    return summary
  fingerprint.prepare(output_dir, plan.expected, plan.owned, config.overwrite)

  model = models.SpeculativeEncoderDecoderModel(
      target_module, drafter_module,
      decode_fn=decoding.speculative_sample if drafter_module is not None else decoding.temperature_sample,
      draft_vocab_ids=draft_vocab_ids)
  params = {'target': target_params}
  if drafter_module is not None:
    params['drafter'] = drafter_params
  task_obj, examples, records = evaluation.decode_split(model, params, data.task, data.split, data.lengths,
                                                       setting, output_dir, data.max_examples, mesh=mesh)
  summary = {'task': data.task, 'split': data.split, 'drafter': plan.drafter_name,
             'setting': dataclasses.asdict(setting), 'statistics': evaluation.decode_statistics(records)}
  if config.mode == 'eval':
    summary['metrics'] = evaluation.score_predictions(
        task_obj, [r['prediction'] for r in records], examples)
    fileio.atomic_write(os.path.join(output_dir, 'metrics.json'), json.dumps(summary, indent=2).encode())
  else:
    fileio.atomic_write(os.path.join(output_dir, 'statistics.json'), json.dumps(summary, indent=2).encode())
  print(json.dumps(summary, indent=2), flush=True)
  return summary


class UsageError(ValueError):
  """A command line that cannot be run as given (unknown flag, missing gin file, malformed binding)."""


# Exit status of a command line that cannot run as given (argparse's convention), and of a run that failed.
USAGE_EXIT, FAILURE_EXIT = 2, 1
# Errors in what the user gave: each ends the command with its one line and USAGE_EXIT.
USAGE_ERRORS = (UsageError, gin_utils.GinConfigError, run_config.ConfigError, fingerprint.ResumeRefused)
GIN_FOLDERS = (('models', 'target/drafter networks and checkpoints'), ('tasks', 'seqio tasks and their lengths'),
               ('experiments', 'runs of this launcher (main_job.gin is the default)'),
               ('train', 'training runs (specdec.training.train, not this launcher)'))
USAGE = ('usage: python -m specdec.main [--gin_file=PATH ...] [--gin.NAME=VALUE ...] [--multihost] [--debug] '
         '[-h | --help]')


def _gin_folder_listing(folder: str) -> str:
  root = os.path.join(gin_utils.REPO_GIN_DIR, folder)
  names = sorted(os.path.relpath(os.path.join(d, f), root)
                 for d, _, files in os.walk(root) for f in files if f.endswith('.gin'))
  return ', '.join(names)


def help_text(files: Sequence[str] = (DEFAULT_GIN_FILE,)) -> str:
  """--help: usage, the modes, the gin folders, and the macros `files` set with their current values."""
  import textwrap  # pylint: disable=g-import-not-at-top
  wrap = lambda text, indent: textwrap.fill(text, 110, initial_indent=indent, subsequent_indent=indent + '  ')
  lines = [USAGE, '',
           'Runs a gin-configured experiment: inference, evaluation, a baseline-vs-speculative benchmark, or a',
           f'table of benchmark rows. Without --gin_file: gin/{DEFAULT_GIN_FILE} (the main job).', '',
           'modes (--gin.run_config.RunConfig.mode=\'NAME\'):',
           '  infer      decode a task split -> predictions.jsonl (resumable), statistics.json',
           '  eval       infer, plus the task\'s seqio metrics -> metrics.json',
           '  benchmark  baseline vs speculative decoding in one run -> benchmark.{json,md,csv,png}',
           '  table      several benchmark rows, one subdirectory each, then table.md beside the paper\'s numbers',
           '', 'flags:',
           '  --gin_file=PATH     a gin file (repeatable), looked up as given, then under gin/',
           '  --gin.NAME=VALUE    a gin binding: a macro (--gin.GAMMA=3) or a parameter, e.g.',
           '                      --gin.run_config.DataConfig.max_examples=8 (the first 8 examples)',
           '                      --gin.run_config.RunConfig.overwrite=True (discard earlier outputs)',
           '                      --gin.settings.Setting.batch_size=8',
           '  --multihost         initialise multi-host JAX first (Cloud TPU pod slices)',
           '  --debug             show the traceback of an error instead of its one line',
           '', 'gin folders (under gin/):']
  for folder, what in GIN_FOLDERS:
    lines.append(f'  gin/{folder}: {what}')
    lines.append(wrap(_gin_folder_listing(folder), '    '))
  lines += ['', f'macros of {", ".join(files)} (bind with --gin.NAME=VALUE; strings need inner quotes: '
            '--gin.OUTPUT_DIR="\'runs/x\'"):']
  try:
    macros = gin_utils.macro_values(files)
  except (gin_utils.GinConfigError, FileNotFoundError, ValueError) as e:
    lines.append(f'  (cannot read them: {str(e).splitlines()[0]})')
  else:
    lines += [f'  {name} = {value!r}' for name, value in sorted(macros.items())]
  return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
  """The command line. An error ends it with one line on stderr (no traceback unless --debug) and exit status
  USAGE_EXIT for what the user gave (flags, gin, config, a refused resume), FAILURE_EXIT for anything else."""
  argv = list(sys.argv[1:] if argv is None else argv)
  debug = '--debug' in argv
  try:
    _main([a for a in argv if a != '--debug'])
  except USAGE_ERRORS as e:
    if debug:
      raise
    _exit_with_one_line(str(e), USAGE_EXIT)
  except Exception as e:  # pylint: disable=broad-except
    if debug:
      raise
    _exit_with_one_line(f'{type(e).__name__}: {e}', FAILURE_EXIT, ' (rerun with --debug for the traceback)')


def _exit_with_one_line(message: str, status: int, hint: str = '') -> None:
  # gin appends where an error came from ("In call to configurable 'run'"); the first line says it all.
  first = message.strip().splitlines()[0] if message.strip() else 'failed'
  sys.stdout.flush()
  print(f'specdec: {first}{hint}', file=sys.stderr, flush=True)
  raise SystemExit(status)


def parse_command_line(argv: Sequence[str]) -> bool:
  """Parses a launch's gin files and bindings (--gin_file, --gin.NAME=VALUE) into gin; returns --multihost.

  UsageError (one line) for an unknown argument, a missing gin file or a malformed binding.
  """
  try:
    files, bindings, multihost = gin_utils.launch_args(argv, other_flags=('--debug',))
  except ValueError as e:
    raise UsageError(f'{e} --help lists them.') from None
  try:
    gin_utils.parse(files or [DEFAULT_GIN_FILE], bindings, renamed=run_config.FORMER_RUN_PARAMETERS)
  except FileNotFoundError as e:
    raise UsageError(str(e)) from None
  return multihost


def configured_run_config() -> run_config.RunConfig:
  """The `RunConfig` the parsed gin files hand `run`, built but not run (normalized; the TPU compile check
  compiles what it describes)."""
  return run_config.normalized(gin.query_parameter('specdec.main.run.config').scoped_configurable_fn())


def _main(argv: Sequence[str]) -> None:
  if '-h' in argv or '--help' in argv:
    files, _, _ = gin_utils.split_gin_args([a for a in argv if a not in ('-h', '--help')])
    try:
      print(help_text(files or [DEFAULT_GIN_FILE]), flush=True)
    except BrokenPipeError:  # `--help | head`: the reader has what it wanted
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return
  multihost = parse_command_line(argv)
  if multihost:
    partitioning.initialize_multihost(enabled=True)
  # The gin files register this module's `run` (dynamic registration); its configurable carries the bindings.
  gin.get_configurable(run)()


if __name__ == '__main__':
  from specdec import main as _configured  # pylint: disable=g-import-not-at-top
  _configured.main()
