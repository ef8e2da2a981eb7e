"""The launcher: gin-configured inference, evaluation, benchmarks and paper tables.

  python -m specdec.main --gin_file=experiments/cpu/table2/ende_d1_t0.gin --gin.OUTPUT_DIR="'runs/x'"
  specdec --gin_file=... --gin.NAME=VALUE ...          (the same, as a console script)
  python -m specdec.main                               (the main job: gin/experiments/cpu/main_job.gin)

Flags follow T5X: `--gin_file=PATH` (repeatable; looked up as given, then under the repo's gin/), and
`--gin.NAME=VALUE` bindings. `--multihost` initialises multi-host JAX first (`partitioning.initialize_multihost`,
Cloud TPU pod slices). `main.run.num_partitions` shards params, caches and decoding over a (data, model) mesh.
Everything the run writes goes under OUTPUT_DIR.

Modes of `run` (`main.run.mode`):
- 'infer': decode a task split, write predictions.jsonl (resumable) and decode statistics;
- 'eval': 'infer' plus the task's seqio metrics (metrics.json);
- 'benchmark': `specdec.benchmark.run` (baseline vs speculative in one run, see that module);
- 'table': several benchmark rows (`rows`), one subdirectory each, then a table beside the paper's numbers.

A rerun into the same OUTPUT_DIR resumes, but only what the same configuration wrote: each output directory records
a fingerprint (task, split, checkpoints and their contents, decoding settings, lengths, seed, batch size, kind of
output; `specdec.fingerprint`) and a rerun that differs is refused with the differing fields named. max_examples
may grow (the run is extended), not shrink. `--gin.main.run.overwrite=True` discards the old outputs instead.
Errors in the command line's gin bindings and refused resumes end the command with one line.
"""

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, Mapping, Optional, Sequence

import gin
import jax
import numpy as np


@contextlib.contextmanager
def _stderr_to_devnull():
  """Points file descriptor 2 at /dev/null (C++ libraries write there directly, past sys.stderr)."""
  sys.stderr.flush()
  saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  try:
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def _import_tensorflow_quietly() -> None:
  """Imports TensorFlow (seqio's input pipeline, the project's only use of it) kept off accelerators and quiet.

  TF prints start-up noise (oneDNN banners, "failed call to cuInit", cache_dataset_ops warnings) that says nothing
  about this project. Its C++ log level is read once, so it is raised only while TF loads and lists its devices,
  then put back for JAX (which reads the same variable, TF_CPP_MIN_LOG_LEVEL). TF is kept off GPUs so it never
  takes accelerator memory from JAX. SPECDEC_TF_LOGS=1 shows everything.
  """
  if 'tensorflow' in sys.modules or os.environ.get('SPECDEC_TF_LOGS') == '1':
    return
  level = os.environ.get('TF_CPP_MIN_LOG_LEVEL')
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
  try:
    with _stderr_to_devnull():  # the banners printed while TF's libraries load ignore the log level
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      # seqio loads more of TF's libraries (text ops), and each reads the level as it loads.
      import seqio  # pylint: disable=g-import-not-at-top,unused-import
      try:
        tf.config.set_visible_devices([], 'GPU')
      except RuntimeError:  # TF's devices are already initialised (TF was used before): leave them
        pass
  finally:
    if level is None:
      os.environ.pop('TF_CPP_MIN_LOG_LEVEL', None)
    else:
      os.environ['TF_CPP_MIN_LOG_LEVEL'] = level
  tf.get_logger().setLevel('ERROR')  # TF's Python-side deprecation warnings


_import_tensorflow_quietly()  # before specdec's modules import seqio, and with it TF

from specdec import benchmark  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import checkpoints
from specdec import decoding
from specdec import evaluation
from specdec import fileio
from specdec import fingerprint
from specdec import gin_utils
from specdec import models
from specdec import network
from specdec import ngram
from specdec import partitioning
from specdec import tables
from specdec import tasks

DEFAULT_GIN_FILE = 'experiments/cpu/main_job.gin'
MODES = ('infer', 'eval', 'benchmark', 'table')
# Bump when a code change makes predictions.jsonl records written before it incomparable with new ones.
PREDICTIONS_VERSION = 1
# What each kind of run writes into OUTPUT_DIR (overwrite=True discards exactly these, and the fingerprint).
PREDICTION_FILES = ('predictions.jsonl', 'statistics.json', 'metrics.json')
TABLE_FILES = ('table.md', 'table.json')


def load_network(checkpoint: str, config: Optional[network.T5Config] = None, dtype: Optional[str] = None,
                 mesh=None):
  """(module, params) from a checkpoint directory.

  The project's compact format and n-gram drafters carry their own config. T5X, Hugging Face and Orbax
  checkpoints are read into `config` (from gin: e.g. gin/models/target_t5_1_1_xxl.gin), or into the
  config a Hugging Face directory describes; with a `mesh`, each array is read straight into its shards
  (T5X's rules), so a large model is never materialised whole on one host.
  """
  if not checkpoint:
    raise ValueError('No checkpoint given (set TARGET_CHECKPOINT / DRAFTER_CHECKPOINT in gin).')
  if not fileio.exists(checkpoint):  # local or gs:// (tf.io.gfile)
    raise FileNotFoundError(f'Checkpoint not found: {checkpoint}')
  if ngram.is_ngram_dir(checkpoint) or (fileio.isdir(checkpoint) and
                                        fileio.exists(fileio.join(checkpoint, 'params.msgpack'))):
    return checkpoints.load_module_and_params(checkpoint)
  if config is None:
    config = checkpoints.load_config_for(checkpoint)
  if config is None:
    raise ValueError(f'{checkpoint} ({checkpoints.detect_format(checkpoint)} format) carries no network '
                     'config: give one in gin (include a gin/models/*_t5_1_1_*.gin file).')
  module = network.Transformer(config)
  shardings = None
  if mesh is not None:
    layout = partitioning.compile_predict_sharded(
        models.SpeculativeEncoderDecoderModel(module, None, decode_fn=decoding.temperature_sample), mesh)
    shardings = layout.param_shardings({'target': checkpoints.expected_params(config)})['target']
  params = checkpoints.restore_params(checkpoint, config, shardings=shardings, dtype=dtype)
  return module, params


EMBEDDED_TEST_SLICES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'assets', 'test_slices')


def register_tasks(corpus_dir: Optional[str] = None, vocab_path: Optional[str] = None) -> None:
  """Registers the local tasks (from `corpus_dir`) and the paper's TFDS tasks.

  Without `corpus_dir` and without a built corpus at the default place, the local tasks read the embedded
  test slices (the first 64 test examples per task; specdec/assets/test_slices/README.md).
  """
  if corpus_dir is None and not os.path.exists(tasks.DEFAULT_CORPUS_DIR):
    print(f'No corpus at {tasks.DEFAULT_CORPUS_DIR} (build it: {tasks.BUILD_CORPUS_COMMAND}); using the '
          f'embedded test slices in {EMBEDDED_TEST_SLICES}.', flush=True)
    corpus_dir = EMBEDDED_TEST_SLICES
  tasks.register_local_tasks(corpus_dir)
  tasks.register_paper_tasks(vocab_path) if vocab_path else tasks.register_paper_tasks()


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
  also when the run fails part-way; on a multi-host run only process 0 copies.
  """
  if not fileio.is_url(output_dir):
    os.makedirs(output_dir, exist_ok=True)
    yield output_dir
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  local = os.path.join(tempfile.gettempdir(), 'specdec_output',
                       hashlib.sha256(output_dir.encode()).hexdigest()[:16])
  os.makedirs(local, exist_ok=True)
  if tf.io.gfile.exists(output_dir):
    _copy_tree(output_dir, local)
  try:
    yield local
  finally:
    if jax.process_index() == 0:
      _copy_tree(local, output_dir)


@dataclasses.dataclass(frozen=True)
class Row:
  """One benchmark row of a table: task, drafter checkpoint, temperature, γ (and adaptive drafting)."""
  task: str
  drafter: str
  temperature: float
  gamma: int
  drafter_checkpoint: str = ''
  draft_confidence: float = 0.0


def _decode_split(model, params, task_name, split, lengths, setting, output_dir, max_examples, log_every=8,
                  mesh=None):
  """Decodes a split with `model`, appending predictions.jsonl as batches finish (resumable)."""
  import seqio  # pylint: disable=g-import-not-at-top
  task = seqio.get_mixture_or_task(task_name)
  vocab = task.output_features['targets'].vocabulary
  examples = evaluation.task_examples(task_name, split, lengths, max_examples)
  speculative = model.drafter_module is not None
  decoder_params = setting.decoder_params()
  if speculative:
    decoder_params = setting.speculative_params()
  if mesh is None:
    predict = model.compile_predict(decoder_params)
  else:
    predict = partitioning.compile_predict_sharded(model, mesh, decoder_params=decoder_params)
    params = predict.shard_params(params)
  path = os.path.join(output_dir, 'predictions.jsonl')
  done = benchmark.resume_records(path)
  if done:
    print(f'Resuming: {len(done)} of {len(examples)} examples already decoded in {path}.', flush=True)
  start, decoded, tokens = time.perf_counter(), 0, 0
  batches = benchmark.make_batches(examples, lengths, setting.batch_size, setting.length_buckets)
  with open(path, 'a', encoding='utf-8') as out:
    for batch_no, (idx, batch) in enumerate(batches):
      if all(i in done for i in idx):
        continue
      decodes, aux = predict(params, batch, jax.random.PRNGKey(setting.seed + batch_no))
      decodes, stats = partitioning.to_host((decodes, aux.get('stats', {})))
      for row, i in enumerate(idx):
        rec = {'index': i, 'inputs': examples[i]['inputs_pretokenized'].decode('utf-8'),
               'reference': examples[i]['targets_pretokenized'].decode('utf-8'),
               'prediction': vocab.decode(decodes[row].tolist()),
               'tokens': benchmark.num_tokens(decodes[row], model.eos_id)}
        rec.update({k: np.asarray(v[row]).tolist() for k, v in stats.items()})
        out.write(json.dumps(rec, ensure_ascii=False) + '\n')
        done[i] = rec
        tokens += rec['tokens']
      out.flush()
      decoded += len(idx)
      if decoded % log_every < len(idx) or len(done) == len(examples):
        elapsed = time.perf_counter() - start
        print(f'  {len(done)}/{len(examples)} examples, {tokens / elapsed:.0f} tokens/s, '
              f'ETA {(len(examples) - len(done)) * elapsed / decoded / 60:.1f} min', flush=True)
  records = [done[i] for i in sorted(done)]
  return task, examples, records


def _decode_statistics(records) -> Dict[str, float]:
  if not records or 'target_calls' not in records[0]:
    return {'examples': len(records), 'tokens': int(sum(r['tokens'] for r in records))}
  tot = lambda k: float(sum(r[k] for r in records))
  return {'examples': len(records), 'tokens': int(tot('tokens')),
          'alpha_accept': tot('accepted') / max(tot('judged'), 1),
          'alpha_overlap': tot('overlap_sum') / max(tot('overlap_count'), 1),
          'tokens_per_target_call': tot('emitted') / max(tot('target_calls'), 1)}


def run(output_dir: str = gin.REQUIRED,
        mode: str = 'benchmark',
        task: str = tasks.ENDE_LOCAL_TASK,
        split: str = 'test',
        feature_lengths: Mapping[str, int] = (('inputs', 96), ('targets', 48)),
        target_checkpoint: str = gin.REQUIRED,
        drafter_checkpoint: Optional[str] = None,
        target_config: Optional[network.T5Config] = None,
        drafter_config: Optional[network.T5Config] = None,
        drafter_name: Optional[str] = None,
        gamma: int = 5,
        temperature: float = 0.0,
        topk: int = 0,
        topp: float = 0.0,
        draft_confidence: float = 0.0,
        batch_size: int = 1,
        repeats: int = 3,
        max_examples: Optional[int] = None,
        seed: int = 0,
        length_buckets: bool = True,
        rows: Sequence[Row] = (),
        table_name: str = 'Table 2 analogue',
        corpus_dir: Optional[str] = None,
        vocab_path: Optional[str] = None,
        dtype: Optional[str] = None,
        num_partitions: Optional[int] = None,
        overwrite: bool = False) -> Dict[str, Any]:
  """Runs one experiment (see the module docstring for the modes); returns its summary.

  Args (all gin-bindable as `main.run.NAME`):
    output_dir: where everything is written; local or gs:// (then written locally and copied there).
    mode: 'infer' | 'eval' | 'benchmark' | 'table'.
    task, split, feature_lengths: the seqio task split and its lengths (longer inputs are cut).
    target_checkpoint, drafter_checkpoint: checkpoint directories (compact, n-gram, T5X, Hugging Face, Orbax).
    target_config, drafter_config: network configs for formats that carry none (T5X, Orbax).
    drafter_name: the drafter's label in tables (default: its directory name).
    gamma, temperature, topk, topp: decoding (topk 0 = no top-k; T5X's default 1 would be argmax).
    draft_confidence: adaptive drafting, in [0, 1): a row stops drafting in a round after a draft the drafter
      gave less probability than this (0: γ drafts every round). Exact either way.
    batch_size, repeats, seed, length_buckets: see `benchmark.Setting`.
    max_examples: the first N examples of the split (None: all).
    rows, table_name: mode 'table'.
    corpus_dir, vocab_path: where the local corpus / the paper's tasks' vocabulary live.
    dtype: parameter dtype for T5X / Hugging Face / Orbax checkpoints (e.g. 'bfloat16').
    num_partitions: model-parallel size of a ('data', 'model') mesh over all devices; None: one device.
    overwrite: discard what an earlier run wrote into output_dir and start afresh (without it a rerun resumes,
      and only a run of the same configuration: `fingerprint.ResumeRefused` otherwise).
  """
  if mode not in MODES:
    raise ValueError(f'mode must be one of {MODES}, got {mode!r}.')
  if not target_checkpoint:
    raise ValueError('No target checkpoint: set main.run.target_checkpoint (TARGET_CHECKPOINT in gin).')
  lengths = dict(feature_lengths)
  if set(lengths) != {'inputs', 'targets'}:
    raise ValueError(f"feature_lengths needs 'inputs' and 'targets', got {sorted(lengths)}.")
  setting = benchmark.Setting(gamma=gamma, temperature=temperature, topk=topk, topp=topp,
                              batch_size=batch_size, repeats=repeats, seed=seed,
                              length_buckets=length_buckets, draft_confidence=draft_confidence)
  setting.validate()  # bad γ / temperature / top-k with top-p fail before any loading
  if mode == 'table' and not rows:
    raise ValueError("mode='table' needs rows (a list of main.Row or of dicts with its fields).")
  rows = [r if isinstance(r, Row) else Row(**r) for r in rows]
  for r in rows:
    benchmark.Setting(gamma=r.gamma, temperature=r.temperature, draft_confidence=r.draft_confidence).validate()
  if mode in ('benchmark',) and not drafter_checkpoint:
    raise ValueError('The benchmark needs a drafter: set DRAFTER_CHECKPOINT.')
  # Model-parallel over `num_partitions` devices, data-parallel over the rest (T5X's rules); None: one device.
  mesh = partitioning.make_mesh(num_partitions) if num_partitions else None
  with local_output_dir(output_dir) as local_dir:
    return _execute(local_dir, mode, task, split, lengths, setting, target_checkpoint, drafter_checkpoint,
                    target_config, drafter_config, drafter_name, max_examples, rows, table_name, corpus_dir,
                    vocab_path, dtype, mesh, overwrite)


def provenance(target_checkpoint: str, drafter_checkpoint: Optional[str], target_config=None,
               drafter_config=None, dtype: Optional[str] = None) -> Dict[str, Any]:
  """The fingerprint fields that identify the models: checkpoint paths and contents, gin-given configs, dtype."""
  return {**fingerprint.checkpoint_fields('target', target_checkpoint),
          **fingerprint.checkpoint_fields('drafter', drafter_checkpoint),
          'target_config': fingerprint.short_digest(target_config),
          'drafter_config': fingerprint.short_digest(drafter_config), 'dtype': dtype}


def predictions_fingerprint(task: str, split: str, lengths: Mapping[str, int], setting: benchmark.Setting,
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


def _execute(output_dir, mode, task, split, lengths, setting, target_checkpoint, drafter_checkpoint,
             target_config, drafter_config, drafter_name, max_examples, rows, table_name, corpus_dir, vocab_path,
             dtype, mesh, overwrite=False):
  """`run` after its checks, writing into the local directory `output_dir`."""
  register_tasks(corpus_dir, vocab_path)
  print(f'specdec {mode}: task {task}:{split}, output {output_dir}'
        + (f', mesh {dict(mesh.shape)}' if mesh is not None else ''), flush=True)

  if mode == 'table':
    plans = []  # (row, its directory, drafter checkpoint, setting, model fields); all checked before loading
    for row in rows:
      # Without a checkpoint, a row's drafter is a sibling of the target (the shipped family's layout).
      drafter_dir = row.drafter_checkpoint or fileio.join(fileio.dirname(fileio.normpath(target_checkpoint)),
                                                          row.drafter)
      row_setting = dataclasses.replace(setting, gamma=row.gamma, temperature=row.temperature,
                                        draft_confidence=row.draft_confidence)
      row_provenance = provenance(target_checkpoint, drafter_dir, target_config, drafter_config, dtype)
      row_dir = os.path.join(output_dir, _table_row_name(row))
      _refuse_if_mismatched(row_dir, benchmark.fingerprint_fields(
          row.task, split, lengths, row_setting, max_examples, row.drafter, row_provenance, mesh),
                            benchmark.OUTPUT_FILES, overwrite)
      plans.append((row, row_dir, drafter_dir, row_setting, row_provenance))
    # The table itself is rewritten from its rows on every run; its fingerprint keeps other modes out.
    fingerprint.prepare(output_dir, {'outputs': 'table'}, TABLE_FILES, overwrite)
    target_module, target_params = load_network(target_checkpoint, target_config, dtype, mesh)
    summaries = []
    for row, row_dir, drafter_dir, row_setting, row_provenance in plans:
      drafter_module, drafter_params = load_network(drafter_dir, drafter_config, dtype, mesh)
      summaries.append(benchmark.run(
          target_module, target_params, drafter_module, drafter_params, row.task, split, lengths,
          row_setting, row_dir, max_examples, drafter_name=row.drafter, mesh=mesh, provenance=row_provenance,
          overwrite=overwrite))
    text = tables.table2_markdown(summaries, title=table_name)
    checkpoints.atomic_write(os.path.join(output_dir, 'table.md'), text.encode())
    checkpoints.atomic_write(os.path.join(output_dir, 'table.json'), json.dumps(summaries, indent=2).encode())
    print(text, flush=True)
    return {'rows': summaries}

  drafter_name = ((drafter_name or fileio.basename(fileio.normpath(drafter_checkpoint)))
                  if drafter_checkpoint else 'none')
  models_fields = provenance(target_checkpoint, drafter_checkpoint, target_config, drafter_config, dtype)
  if mode == 'benchmark':
    expected = benchmark.fingerprint_fields(task, split, lengths, setting, max_examples, drafter_name,
                                            models_fields, mesh)
    owned = benchmark.OUTPUT_FILES
  else:
    expected = predictions_fingerprint(task, split, lengths, setting, max_examples, drafter_name, models_fields)
    owned = PREDICTION_FILES
  _refuse_if_mismatched(output_dir, expected, owned, overwrite)
  target_module, target_params = load_network(target_checkpoint, target_config, dtype, mesh)
  drafter_module = drafter_params = None
  if drafter_checkpoint:
    drafter_module, drafter_params = load_network(drafter_checkpoint, drafter_config, dtype, mesh)
  if mode == 'benchmark':
    summary = benchmark.run(target_module, target_params, drafter_module, drafter_params, task, split,
                            lengths, setting, output_dir, max_examples, drafter_name=drafter_name, mesh=mesh,
                            provenance=models_fields, overwrite=overwrite)
    print(benchmark.markdown(summary), flush=True)
    return summary
  fingerprint.prepare(output_dir, expected, owned, overwrite)

  model = models.SpeculativeEncoderDecoderModel(
      target_module, drafter_module,
      decode_fn=decoding.speculative_sample if drafter_module is not None else decoding.temperature_sample)
  params = {'target': target_params}
  if drafter_module is not None:
    params['drafter'] = drafter_params
  task_obj, examples, records = _decode_split(model, params, task, split, lengths, setting, output_dir,
                                              max_examples, mesh=mesh)
  summary = {'task': task, 'split': split, 'drafter': drafter_name, 'setting': dataclasses.asdict(setting),
             'statistics': _decode_statistics(records)}
  if mode == 'eval':
    summary['metrics'] = evaluation.score_predictions(
        task_obj, [r['prediction'] for r in records], examples)
    checkpoints.atomic_write(os.path.join(output_dir, 'metrics.json'), json.dumps(summary, indent=2).encode())
  else:
    checkpoints.atomic_write(os.path.join(output_dir, 'statistics.json'), json.dumps(summary, indent=2).encode())
  print(json.dumps(summary, indent=2), flush=True)
  return summary


def main(argv: Optional[Sequence[str]] = None) -> None:
  """The command line; a bad gin binding or a refused resume ends it with one line (no traceback)."""
  try:
    _main(argv)
  except (gin_utils.GinConfigError, fingerprint.ResumeRefused) as e:
    # gin appends where the error came from ("In call to configurable 'run'"); the first line says it all.
    raise SystemExit(f'specdec: {str(e).splitlines()[0]}') from None


def _main(argv: Optional[Sequence[str]]) -> None:
  argv = list(sys.argv[1:] if argv is None else argv)
  files, bindings, rest = gin_utils.split_gin_args(argv)
  multihost = '--multihost' in rest
  rest = [a for a in rest if a != '--multihost']
  if rest:
    raise SystemExit(f'Unknown arguments: {rest} (use --gin_file=PATH, --gin.NAME=VALUE, --multihost).')
  if multihost:
    partitioning.initialize_multihost(enabled=True)
  gin_utils.parse(files or [DEFAULT_GIN_FILE], bindings)
  # The gin files register this module's `run` (dynamic registration); its configurable carries the bindings.
  gin.get_configurable(run)()


if __name__ == '__main__':
  from specdec import main as _configured  # pylint: disable=g-import-not-at-top
  _configured.main()
