"""Speed benchmark: the baseline and speculative decoding on one task split, measured in the same run.

For every example (batch 1 as in the paper, larger batches optional) both decoders run back to back on the
same input, `repeats` times each, and the median wall time of each is kept; compilation is excluded (every
input shape is compiled and run once before it is timed). Reported (see `reporting.summarize_benchmark`):

- measured speedup = Σ baseline time / Σ speculative time, tokens/s of each;
- α two ways: accepted / judged drafts, and the paper's E[Σ_x min(p, q)]; accepted / drafted; tokens per
  target call; the acceptance rate at each draft position (given that the previous drafts were kept);
- call costs measured in isolation (a jitted `lax.scan` of decode steps on a real input): c = drafter call /
  target call, and the cost of one γ+1-token verify call relative to a one-token call; the speedup predicted
  by Thm 3.8 (with the measured α and c) and by the measured costs (`theory.predicted_speedup_from_costs`);
- greedy: the share of identical outputs, and every mismatch with the target's logit margin where the two
  outputs first differ;
- the task's metrics (BLEU / ROUGE) of both decoders' outputs.

Per-example results are appended to `examples.jsonl` as they finish, so an interrupted run resumes where it
stopped; the summary is written as JSON, CSV (per example), Markdown and a plot. A run resumes only what the same
configuration wrote (`fingerprint_fields`, recorded in fingerprint.json; `specdec.fingerprint`).

`run(models, data, setting, output, measuring)` takes small dataclasses: `ModelPair` (target and drafter),
`TaskSplit` (the examples), `settings.Setting` (decoding), `Output` (where it writes, resuming or overwriting) and
`Measuring` (a mesh, in-loop costs).
"""

import dataclasses
import datetime
import json
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec.bench import auto_gamma
from specdec import batch_shrink
from specdec import decoding
from specdec import drafters
from specdec import evaluation
from specdec import fileio
from specdec import fingerprint
from specdec.bench import machine_load
from specdec import models
from specdec.bench import oracle
from specdec import partitioning
from specdec.bench import plots
from specdec.bench import profiling
from specdec.bench import reporting
from specdec import settings
from specdec import sharded_decoding

# Bump when a code change makes examples.jsonl records written before it incomparable with new ones (a resumed run
# must not mix them). 2: batches shrink as their rows end (`batch_shrink`), so batch > 1 times changed.
RECORDS_VERSION = 2
# What a run writes into its directory (`overwrite` discards exactly these, and the fingerprint).
OUTPUT_FILES = ('examples.jsonl', 'benchmark.json', 'benchmark.csv', 'benchmark.md', 'benchmark.png',
                auto_gamma.FILE_NAME)


@dataclasses.dataclass(frozen=True)
class ModelPair:
  """The target and the drafter a run compares: Flax modules, their params, and the drafter's label in reports.

  `draft_vocab_ids`: the drafter's trimmed vocabulary (sorted token ids), or None (all).
  """
  target_module: Any
  target_params: Any
  drafter_module: Any
  drafter_params: Any
  drafter_name: str = 'drafter'
  draft_vocab_ids: Any = None


@dataclasses.dataclass(frozen=True)
class TaskSplit:
  """The examples a run decodes: the first `max_examples` (None: all) of a seqio task's split.

  lengths: {'inputs': N, 'targets': M}; longer inputs are cut, and M bounds the decode.
  """
  task: str
  split: str
  lengths: Mapping[str, int]
  max_examples: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Output:
  """Where a run writes, and what it records beside the measurements.

  output_dir: the run's directory (`OUTPUT_FILES` and the fingerprint).
  overwrite: discard what an earlier run wrote there and start afresh (without it the run resumes, and only a run
    of the same fingerprint).
  provenance: fields identifying the models for the fingerprint (`fingerprint_fields`).
  remedy: how a refused resume's message ends (`fingerprint.ResumeRefused`).
  write_plot: also write benchmark.png.
  log_every: print the progress after about this many examples.
  extra_info: more fields for the summary.
  """
  output_dir: str
  overwrite: bool = False
  provenance: Optional[Mapping[str, Any]] = None
  remedy: str = fingerprint.MAIN_REMEDY
  write_plot: bool = True
  log_every: int = 8
  extra_info: Optional[Mapping[str, Any]] = None


@dataclasses.dataclass(frozen=True)
class Measuring:
  """How a run places and times its decoders.

  mesh: a ('data', 'model') mesh (`partitioning.make_mesh`): both decoders run sharded by T5X's rules
    (`sharded_decoding.compile_predict_sharded`); None: jit on the default device.
  measure_in_loop: also time one round phase by phase inside a compiled loop (`profiling.in_loop_costs`; not
    with a mesh), so the summary shows c and the round's fixed cost as the loop pays them.
  """
  mesh: Any = None
  measure_in_loop: bool = True


# ----------------------------------------------------------------------------------------------------------
# Greedy mismatches.
# ----------------------------------------------------------------------------------------------------------


def divergence_margin(module, params, encoder_input_tokens_l: np.ndarray, baseline_l: np.ndarray,
                      speculative_l: np.ndarray) -> Dict[str, Any]:
  """Where two greedy decodes first differ, and the target's logit margin there (teacher-forced, fp32).

  margin = logit(baseline token) - logit(speculative token) given the common prefix; a margin near 0 is a
  near-tie that ulp-level differences between a k-token and a 1-token call can flip.
  """
  baseline_l, speculative_l = np.asarray(baseline_l), np.asarray(speculative_l)
  pos = int(np.flatnonzero(baseline_l != speculative_l)[0])
  dec_in = np.concatenate([[0], baseline_l[:-1]])[None].astype(np.int32)
  logits = module.apply({'params': params}, jnp.asarray(encoder_input_tokens_l[None]), jnp.asarray(dec_in),
                        jnp.asarray(baseline_l[None].astype(np.int32)), enable_dropout=False)
  logits_v = np.asarray(logits[0, pos], np.float32)
  a, b = int(baseline_l[pos]), int(speculative_l[pos])
  top2 = np.sort(logits_v)[-2:]
  return {'position': pos, 'baseline_token': a, 'speculative_token': b,
          'margin': float(logits_v[a] - logits_v[b]), 'top2_gap': float(top2[1] - top2[0])}


# ----------------------------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------------------------


def timed(fn, *args):
  """(seconds, fn(*args)) with the result ready: one timed call, the wall clock around it."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - start, out


def devices_label(mesh=None) -> str:
  """The accelerators a benchmark is timed on, e.g. 'cpu: 1 x cpu' (timings from other devices don't mix)."""
  devices = jax.devices()
  label = f'{jax.default_backend()}: {len(devices)} x {devices[0].device_kind}'
  return label + (f', mesh {dict(mesh.shape)}' if mesh is not None else '')


def fingerprint_fields(task_name: str, split: str, lengths: Mapping[str, int], setting: settings.Setting,
                       max_examples: Optional[int], drafter_name: str,
                       provenance: Optional[Mapping[str, Any]] = None, mesh=None) -> Dict[str, Any]:
  """What determines a benchmark run's per-example records (`specdec.fingerprint`).

  `provenance`: fields identifying the models, from the caller that loaded them (checkpoint paths and content,
  `fingerprint.checkpoint_fields`; dtype); a run without them is identified by its settings alone.
  """
  return dict(outputs='benchmark', code_version=RECORDS_VERSION, task=task_name, split=split,
              feature_lengths=dict(lengths), max_examples=max_examples, drafter=drafter_name,
              devices=devices_label(mesh), **dataclasses.asdict(setting), **dict(provenance or {}))


def run(models: ModelPair, data: TaskSplit, setting: settings.Setting, output: Output,
        measuring: Measuring = Measuring()) -> Dict[str, Any]:
  """Benchmarks baseline vs speculative decoding on a task split; writes results into `output.output_dir`.

  An earlier run in that directory is resumed only if its fingerprint matches (`fingerprint_fields` with
  `output.provenance`; max_examples may grow), else `fingerprint.ResumeRefused` ending with `output.remedy`;
  `output.overwrite` discards it first.

  Returns the summary (`reporting.summarize_benchmark` and the run's facts; also written to
  `output_dir/benchmark.json`).
  """
  import seqio  # pylint: disable=g-import-not-at-top

  validate(models, setting, measuring.mesh)
  task = seqio.get_mixture_or_task(data.task)
  vocab = task.output_features['targets'].vocabulary
  recorded = fingerprint.prepare(
      output.output_dir, fingerprint_fields(data.task, data.split, data.lengths, setting, data.max_examples,
                                            models.drafter_name, output.provenance, measuring.mesh),
      OUTPUT_FILES, output.overwrite, output.remedy)
  examples = load_examples(data)
  batches = evaluation.batches(examples, data.lengths, setting.batch_size, setting.length_buckets)
  chosen = None
  others = {}  # other processes' share of the machine while each part was timed (`machine_load`)
  if settings.is_auto(setting.gamma):  # fingerprinted as 'auto'; decoded, costed and reported at the choice
    with machine_load.CpuMeter() as meter:
      chosen = _choose_gamma(models, vocab, setting, batches, output.output_dir)
    others['gamma_auto'] = meter.share
    setting = dataclasses.replace(setting, gamma=chosen['gamma'])
  decoders = compile_decoders(models, vocab, setting, measuring.mesh)
  examples_path = os.path.join(output.output_dir, 'examples.jsonl')
  done = _resume(examples_path, len(examples))

  start = time.perf_counter()
  with open(examples_path, 'a', encoding='utf-8') as log, machine_load.CpuMeter() as meter:
    warmup_s = _time_batches(models, data, setting, decoders, vocab, examples, batches, done, log,
                             output.log_every, start)
  others['timed_decoding'] = meter.share
  records = [done[i] for i in sorted(done)]
  decode_s = time.perf_counter() - start - warmup_s
  cost_start = time.perf_counter()
  with machine_load.CpuMeter() as meter:
    costs, in_loop_by_rows = _costs(models, data, setting, decoders, batches, output.output_dir, measuring)
  others['cost_measurement'] = meter.share
  quality = _quality(task, records, examples)
  wall_seconds = {'compile_and_warmup': warmup_s, 'timed_decoding': decode_s,
                  'cost_measurement': time.perf_counter() - cost_start}
  summary = _summarize(models, data, setting, output, records, costs, in_loop_by_rows, quality, wall_seconds,
                       recorded)
  if chosen is not None:
    summary['gamma_auto'] = chosen
  summary['others_cpu_share'] = others
  busy = machine_load.warning(others, f'{data.task} with {models.drafter_name}')
  if busy:
    print(busy, flush=True)
  write_outputs(output.output_dir, summary, records, output.write_plot)
  return summary


def _choose_gamma(models: ModelPair, vocab, setting: settings.Setting, batches, output_dir: str) -> Dict[str, Any]:
  """`auto_gamma.choose` with this run's models and decoders (kept in output_dir, so a resumed run keeps it)."""
  probe = dataclasses.replace(setting, gamma=auto_gamma.PROBE_GAMMA)
  decoders = compile_decoders(models, vocab, probe)
  return auto_gamma.choose(
      models.target_module, models.target_params, models.drafter_module, models.drafter_params,
      [batch for _, batch in batches], decoders.spec_predict, decoders.base_predict, decoders.params, decoders.base_params, probe.speculative_params(), setting.seed,
      models.draft_vocab_ids, os.path.join(output_dir, auto_gamma.FILE_NAME),
      log=lambda line: print(line, flush=True))


def validate(models: ModelPair, setting: settings.Setting, mesh=None) -> None:
  """Raises ValueError for a setting or a pair of models that cannot be benchmarked (before anything is written)."""
  setting.validate()
  if settings.is_auto(setting.gamma) and mesh is not None:
    raise ValueError("gamma='auto' measures its choice on one device: give γ as an int on a mesh.")
  if isinstance(models.drafter_module, oracle.OracleDrafter):
    raise ValueError('the oracle drafter is a measuring instrument of controlled acceptance, not a drafter: '
                     'its rows belong in specdec/bench/ceiling.py reports (scripts/ceiling.py), never in a '
                     'benchmark table.')
  drafters.kind_of(models.drafter_module).check(models.drafter_module, models.target_module)


def load_examples(data: TaskSplit) -> List[Dict[str, Any]]:
  """The split's examples (`evaluation.task_examples`); ValueError when there are none."""
  examples = evaluation.task_examples(data.task, data.split, data.lengths, data.max_examples)
  if not examples:
    raise ValueError(f'{data.task}:{data.split} gave no examples.')
  return examples


@dataclasses.dataclass(frozen=True)
class Decoders:
  """The compiled baseline and speculative decoders of a run, and the params each is called with."""
  base_predict: Callable[..., Any]
  spec_predict: Callable[..., Any]
  base_params: Any  # {'target': ...}
  params: Any  # {'target': ..., 'drafter': ...}
  eos_id: int


def compile_decoders(models: ModelPair, vocab, setting: settings.Setting, mesh=None) -> Decoders:
  """Both decoders for `setting`: jitted on the default device, or sharded over `mesh` (params sharded too)."""
  baseline, speculative = _models(models.target_module, models.drafter_module, vocab, models.draft_vocab_ids)
  base_params = {'target': models.target_params}
  params = {'target': models.target_params, 'drafter': models.drafter_params}
  spec_decoder_params = setting.speculative_params()
  if mesh is None:
    params = speculative.with_draft_projection(params)
    base_predict = baseline.compile_predict(setting.decoder_params())
    spec_predict = speculative.compile_predict(spec_decoder_params)
  else:
    base_predict, spec_predict = sharded_decoders(models, vocab, setting, mesh)
    params = spec_predict.shard_params(params)
    base_params = {'target': params['target']}
  return Decoders(base_predict, spec_predict, base_params, params, baseline.eos_id)


def sharded_decoders(models: ModelPair, vocab, setting: settings.Setting, mesh
                     ) -> Tuple[sharded_decoding.ShardedPredictor, sharded_decoding.ShardedPredictor]:
  """(baseline, speculative) predictors of `setting` over `mesh`, before any params are placed (the TPU compile
  check lowers them for abstract params: `tpu_programs`). Reads only the modules and draft vocabulary of `models`."""
  baseline, speculative = _models(models.target_module, models.drafter_module, vocab, models.draft_vocab_ids)
  return (sharded_decoding.compile_predict_sharded(baseline, mesh, decoder_params=setting.decoder_params()),
          sharded_decoding.compile_predict_sharded(speculative, mesh, decoder_params=setting.speculative_params()))


def _time_batches(models: ModelPair, data: TaskSplit, setting: settings.Setting, decoders: Decoders, vocab, examples,
                  batches, done: Dict[int, dict], log, log_every: int, start: float) -> float:
  """Times every batch with an example not in `done`; its records go to `log` and `done`. Returns the seconds
  spent compiling and warming up (each input shape once, untimed)."""
  warm = set()
  measured = 0
  warmup_s = 0.0
  for batch_no, (idx, batch) in enumerate(batches):
    if all(i in done for i in idx):
      continue
    rng = jax.random.PRNGKey(setting.seed + batch_no)
    shape = batch['encoder_input_tokens'].shape
    if shape not in warm:  # compile + one untimed run of each decoder for this input shape
      warm_start = time.perf_counter()
      jax.block_until_ready(decoders.base_predict(decoders.base_params, batch, rng))
      jax.block_until_ready(decoders.spec_predict(decoders.params, batch, rng))
      warm.add(shape)
      warmup_s += time.perf_counter() - warm_start
    timing = _time_batch(decoders, batch, rng, setting.repeats)
    for row, i in enumerate(idx):
      rec = _example_record(i, row, batch_no, len(idx), batch, examples[i], timing, vocab, decoders.eos_id)
      if setting.temperature == 0 and not rec['identical']:
        rec['mismatch'] = divergence_margin(models.target_module, models.target_params,
                                            batch['encoder_input_tokens'][row], timing.base_out[row],
                                            timing.spec_out[row])
      log.write(json.dumps(rec) + '\n')
      done[i] = rec
    log.flush()
    measured += len(idx)
    if measured % log_every < len(idx) or len(done) == len(examples):
      label = f'{data.task} {models.drafter_name} γ={setting.gamma} t={setting.temperature:g}'
      _print_progress(label, list(done.values()), len(examples), time.perf_counter() - start, measured)
  return warmup_s


@dataclasses.dataclass(frozen=True)
class _BatchTiming:
  """One batch's median wall times and (host) outputs of both decoders."""
  base_s: float
  spec_s: float
  base_out: np.ndarray
  spec_out: np.ndarray
  stats: Dict[str, np.ndarray]


def _time_batch(decoders: Decoders, batch, rng, repeats: int) -> _BatchTiming:
  base_times, spec_times = [], []
  for _ in range(repeats):  # interleaved, so slow drifts of the machine hit both alike
    t, (base_out, _) = timed(decoders.base_predict, decoders.base_params, batch, rng)
    base_times.append(t)
    t, (spec_out, spec_aux) = timed(decoders.spec_predict, decoders.params, batch, rng)
    spec_times.append(t)
  base_out, spec_out, stats = partitioning.to_host((base_out, spec_out, spec_aux['stats']))
  return _BatchTiming(float(np.median(base_times)), float(np.median(spec_times)), base_out, spec_out, stats)


def _example_record(i: int, row: int, batch_no: int, batch_rows: int, batch, example, timing: _BatchTiming,
                    vocab, eos_id: int) -> Dict[str, Any]:
  """Example i's line of examples.jsonl (row `row` of batch `batch_no`)."""
  stats, base_l, spec_l = timing.stats, timing.base_out[row], timing.spec_out[row]
  return {
      'index': i, 'batch': batch_no, 'input_length': int(len(example['inputs'])),
      'padded_input_length': int(batch['encoder_input_tokens'].shape[1]),
      # Wall time of the whole batch (per example at batch size 1).
      'baseline_s': timing.base_s, 'speculative_s': timing.spec_s, 'batch_rows': batch_rows,
      'baseline_tokens': evaluation.num_tokens(base_l, eos_id),
      'speculative_tokens': evaluation.num_tokens(spec_l, eos_id),
      'identical': bool(np.array_equal(base_l, spec_l)),
      'target_calls': int(stats['target_calls'][row]), 'drafted': int(stats['drafted'][row]),
      'judged': int(stats['judged'][row]), 'accepted': int(stats['accepted'][row]),
      'accepted_at': stats['accepted_at'][row].astype(int).tolist(),
      'overlap_sum': float(stats['overlap_sum'][row]),
      'overlap_count': int(stats['overlap_count'][row]), 'emitted': int(stats['emitted'][row]),
      'baseline_text': vocab.decode(base_l.tolist()),
      'speculative_text': vocab.decode(spec_l.tolist()),
      'reference_text': example['targets_pretokenized'].decode('utf-8'),
  }


def _print_progress(label: str, recs: Sequence[Mapping[str, Any]], total: int, elapsed: float,
                    measured: int) -> None:
  """One progress line: examples done, the speedup and speculative tokens/s so far, and the time left."""
  remaining = total - len(recs)
  toks = sum(r['speculative_tokens'] for r in recs)
  spec_total = sum(r['speculative_s'] for r in reporting.batch_heads(recs))
  base_total = sum(r['baseline_s'] for r in reporting.batch_heads(recs))
  print(f'  [{label}] {len(recs)}/{total} '
        f'examples, speedup so far {base_total / max(spec_total, 1e-9):.2f}x, speculative '
        f'{toks / max(spec_total, 1e-9):.0f} tokens/s, ETA {remaining * elapsed / measured / 60:.1f} min',
        flush=True)


def _resume(examples_path: str, num_examples: int) -> Dict[int, dict]:
  """The records an interrupted run left (`evaluation.resume_records`), saying so when there are any."""
  done = evaluation.resume_records(examples_path)
  if done:
    print(f'Resuming: {len(done)} of {num_examples} examples already measured in {examples_path}.',
          flush=True)
  return done


def _quality(task, records: Sequence[Mapping[str, Any]], examples) -> Dict[str, Dict[str, float]]:
  """The task's metrics of both decoders' outputs."""
  return {
      'baseline': evaluation.score_predictions(task, [r['baseline_text'] for r in records], examples),
      'speculative': evaluation.score_predictions(task, [r['speculative_text'] for r in records], examples),
  }


def _summarize(models: ModelPair, data: TaskSplit, setting: settings.Setting, output: Output, records, costs,
               in_loop_by_rows, quality, wall_seconds: Mapping[str, float], recorded: Mapping[str, Any]
               ) -> Dict[str, Any]:
  """`reporting.summarize_benchmark` and the run's facts: what ran, where, when, and its fingerprint."""
  summary = reporting.summarize_benchmark(records, costs, setting, in_loop_by_rows)
  summary.update(
      wall_seconds=dict(wall_seconds), task=data.task, split=data.split, drafter=models.drafter_name,
      lengths=dict(data.lengths), setting=dataclasses.asdict(setting), quality=quality, costs=costs,
      machine=reporting.machine_info(), date=datetime.datetime.now().isoformat(timespec='seconds'),
      command=reporting.run_command(), fingerprint=recorded, **dict(output.extra_info or {}))
  return summary


def _costs(models: ModelPair, data: TaskSplit, setting: settings.Setting, decoders: Decoders, batches, output_dir: str,
           measuring: Measuring) -> Tuple[Dict[str, float], Optional[Dict[int, Dict[str, float]]]]:
  """(call costs, in-loop costs by batch rows): those a resumed run stored, else measured on the first batch."""
  enc0 = batches[0][1]['encoder_input_tokens']
  ids = models.draft_vocab_ids
  cost_key = (models.target_module, models.drafter_module, id(models.target_params), id(models.drafter_params),
              None if ids is None else np.asarray(ids).tobytes(), enc0.shape, enc0.tobytes(),
              data.lengths['targets'], setting.gamma)
  stored_costs, stored_in_loop = stored_cost_measurements(output_dir, batches[0][0], setting.batch_size)
  if stored_costs is not None:  # a resumed run keeps the costs it measured first, so its columns stay put
    print('  costs (c, call costs, in-loop costs) as measured by the run being resumed (benchmark.json); '
          'a fresh OUTPUT_DIR measures them anew.', flush=True)
    _COST_CACHE.setdefault(cost_key, stored_costs)
  elif cost_key not in _COST_CACHE:  # rows differing only in temperature share the call costs
    _COST_CACHE[cost_key] = profiling.measure_costs(models.target_module, models.target_params,
                                                    models.drafter_module, models.drafter_params, enc0,
                                                    data.lengths['targets'], setting.gamma,
                                                    draft_vocab_ids=models.draft_vocab_ids)
  costs = stored_costs if stored_costs is not None else _COST_CACHE[cost_key]
  in_loop_by_rows = stored_in_loop  # None unless stored
  if measuring.measure_in_loop and measuring.mesh is None and in_loop_by_rows is None:
    in_loop_by_rows = _in_loop_costs(models, setting, decoders, batches[0][1])
  return costs, in_loop_by_rows


def _in_loop_costs(models: ModelPair, setting: settings.Setting, decoders: Decoders, first
                   ) -> Dict[int, Dict[str, float]]:
  """One round, phase by phase, inside a compiled loop (the `first` batch, its baseline output as the prefix), at
  every batch size the shrinking loops run at (B, B/2, ..., 1: the first rows of the batch)."""
  decoded_l = partitioning.to_host(
      decoders.base_predict(decoders.base_params, first, jax.random.PRNGKey(setting.seed))[0])[0]
  return {
      rows: profiling.in_loop_costs(models.target_module, models.target_params, models.drafter_module,
                                    models.drafter_params, {k: v[:rows] for k, v in first.items()}, decoded_l,
                                    setting.gamma, setting.speculative_params(),
                                    draft_vocab_ids=models.draft_vocab_ids)
      for rows in batch_shrink.stage_sizes(setting.batch_size)}


def stored_cost_measurements(output_dir: str, first_batch: Sequence[int], batch_size: int
                             ) -> Tuple[Optional[Dict[str, float]], Optional[Dict[int, Dict[str, float]]]]:
  """(costs, in-loop costs by batch rows) that an earlier run of this `output_dir` stored in benchmark.json.

  Only a run whose fingerprint matched gets here, so the models, γ, lengths and devices are the same; the costs
  were measured on the first batch, so they are reused only when that batch (`first_batch`, its example indices)
  is the one they were measured on. (None, None) when there is nothing to reuse.
  """
  try:
    stored = fileio.read_json_object(os.path.join(output_dir, 'benchmark.json'))
    examples = fileio.read_jsonl(os.path.join(output_dir, 'examples.jsonl'))  # complete by now
    measured_first = sorted(r['index'] for r in examples if r.get('batch') == 0)
  except (OSError, ValueError, KeyError, TypeError):
    return None, None
  if not stored.get('costs') or measured_first != list(first_batch):
    return None, None
  if stored.get('in_loop_by_rows'):
    in_loop = {int(rows): dict(c) for rows, c in stored['in_loop_by_rows'].items()}
  elif stored.get('in_loop'):
    in_loop = {batch_size: dict(stored['in_loop'])}
  else:
    in_loop = None
  return dict(stored['costs']), in_loop


# Models (and with them their compiled decode functions) are reused across runs in one process, so a table of
# rows compiles each (decoder, setting, input shape) once.
_COST_CACHE: Dict[Any, Dict[str, float]] = {}
_MODEL_CACHE: Dict[Any, Tuple[models.SpeculativeEncoderDecoderModel, models.SpeculativeEncoderDecoderModel]] = {}


def _models(target_module, drafter_module, vocab, draft_vocab_ids=None):
  ids_key = None if draft_vocab_ids is None else np.asarray(draft_vocab_ids).tobytes()
  key = (target_module, drafter_module, id(vocab), ids_key)
  if key not in _MODEL_CACHE:
    _MODEL_CACHE[key] = (
        models.SpeculativeEncoderDecoderModel(target_module, None, output_vocabulary=vocab,
                                              decode_fn=decoding.temperature_sample),
        models.SpeculativeEncoderDecoderModel(target_module, drafter_module, output_vocabulary=vocab,
                                              decode_fn=decoding.speculative_sample,
                                              draft_vocab_ids=draft_vocab_ids))
  return _MODEL_CACHE[key]


def write_outputs(output_dir: str, summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                  write_plot: bool = True) -> None:
  """benchmark.json, benchmark.csv (per example, `reporting.benchmark_csv`), benchmark.md
  (`reporting.benchmark_markdown`) and benchmark.png (`plots.plot_benchmark`), each written atomically."""
  fileio.atomic_write(os.path.join(output_dir, 'benchmark.json'),
                      json.dumps(summary, indent=2, allow_nan=False).encode())
  fileio.atomic_write(os.path.join(output_dir, 'benchmark.csv'), reporting.benchmark_csv(records).encode())
  fileio.atomic_write(os.path.join(output_dir, 'benchmark.md'), reporting.benchmark_markdown(summary).encode())
  if write_plot:
    plots.plot_benchmark(os.path.join(output_dir, 'benchmark.png'), summary, records)


