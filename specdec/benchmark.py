"""Speed benchmark: the baseline and speculative decoding on one task split, measured in the same run.

For every example (batch 1 as in the paper, larger batches optional) both decoders run back to back on the
same input, `repeats` times each, and the median wall time of each is kept; compilation is excluded (every
input shape is compiled and run once before it is timed). Reported (see `summarize`):

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
"""

import dataclasses
import datetime
import io
import json
import os
import platform
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec import batch_shrink
from specdec import checkpoints
from specdec import decoding
from specdec import evaluation
from specdec import fingerprint
from specdec import models
from specdec import oracle
from specdec import partitioning
from specdec import profiling
from specdec import tables
from specdec import theory

# Input lengths are padded up to one of these (capped at the configured length), so short inputs do not pay
# for the longest one; each bucket is compiled once and warmed up before timing.
LENGTH_BUCKETS = (8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096)
# Bump when a code change makes examples.jsonl records written before it incomparable with new ones (a resumed run
# must not mix them). 2: batches shrink as their rows end (`batch_shrink`), so batch > 1 times changed.
RECORDS_VERSION = 2
# What a run writes into its directory (`overwrite` discards exactly these, and the fingerprint).
OUTPUT_FILES = ('examples.jsonl', 'benchmark.json', 'benchmark.csv', 'benchmark.md', 'benchmark.png')


@dataclasses.dataclass(frozen=True)
class Setting:
  """One benchmark configuration (the decoding side)."""
  gamma: int = 5
  temperature: float = 0.0
  topk: int = 0
  topp: float = 0.0
  batch_size: int = 1
  repeats: int = 3
  seed: int = 0
  length_buckets: bool = True
  # Adaptive drafting (`decoding.speculative_sample`): stop a row's drafts below this drafter confidence.
  draft_confidence: float = 0.0

  def validate(self) -> None:
    if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 1:
      raise ValueError(f'gamma must be an int >= 1, got {self.gamma!r}.')
    if self.temperature < 0:
      raise ValueError(f'temperature must be >= 0, got {self.temperature}.')
    if self.topk and self.topp:
      raise ValueError('Use top-k or top-p, not both '
                       f'(topk={self.topk}, topp={self.topp}).')
    if not 0.0 <= self.draft_confidence < 1.0:
      raise ValueError(f'draft_confidence must be in [0, 1), got {self.draft_confidence}.')
    if self.batch_size < 1 or self.repeats < 1:
      raise ValueError(f'batch_size and repeats must be >= 1, got {self.batch_size}, {self.repeats}.')

  def speculative_params(self) -> Dict[str, Any]:
    """`decoder_params` plus γ, statistics and (when on) adaptive drafting."""
    params = dict(self.decoder_params(), gamma=self.gamma, return_stats=True)
    if self.draft_confidence:
      params['draft_confidence'] = float(self.draft_confidence)
    return params

  def decoder_params(self) -> Dict[str, Any]:
    # T5X's decode functions default to topk=1 (argmax); 0 means "no top-k".
    return {'temperature': float(self.temperature), 'topk': int(self.topk),
            'topp': float(self.topp)}


def bucket_length(length: int, max_length: int, use_buckets: bool = True) -> int:
  """The padded input length for an input of `length` tokens."""
  if not use_buckets:
    return max_length
  for b in LENGTH_BUCKETS:
    if length <= b:
      return min(b, max_length)
  return max_length


def make_batches(examples: Sequence[Mapping[str, Any]], lengths: Mapping[str, int], batch_size: int,
                 use_buckets: bool = True) -> List[Tuple[List[int], Dict[str, np.ndarray]]]:
  """Fixed-size batches in file order: (example indices, model batch); inputs padded to a bucket."""
  out = []
  for start in range(0, len(examples), batch_size):
    idx = list(range(start, min(start + batch_size, len(examples))))
    longest = max(min(len(examples[i]['inputs']), lengths['inputs']) for i in idx)
    in_len = bucket_length(longest, lengths['inputs'], use_buckets)
    enc = np.zeros((batch_size, in_len), np.int32)
    for row, i in enumerate(idx):
      tokens = np.asarray(examples[i]['inputs'])[:in_len]
      enc[row, :len(tokens)] = tokens
    out.append((idx, {'encoder_input_tokens': enc,
                      'decoder_input_tokens': np.zeros((batch_size, lengths['targets']), np.int32)}))
  return out


def num_tokens(decode_l: np.ndarray, eos_id: int) -> int:
  """Generated tokens up to and including the first EOS (the decode loops stop there)."""
  decode_l = np.asarray(decode_l)
  eos = np.flatnonzero(decode_l == eos_id)
  return int(eos[0] + 1) if eos.size else int(np.count_nonzero(decode_l))


# ----------------------------------------------------------------------------------------------------------
# Call costs, measured in isolation.
# ----------------------------------------------------------------------------------------------------------


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


def _timed(fn, *args):
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - start, out


def resume_records(path: str) -> Dict[int, dict]:
  """The intact per-example records of a JSONL log, by index; the file is rewritten with just those.

  A torn last line (an interrupted run) is dropped, so the caller can append the examples still to do.
  """
  done = {}
  if os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      for line in f:
        line = line.strip()
        if line:
          try:
            rec = json.loads(line)
          except json.JSONDecodeError:
            break  # a torn last line from an interrupted run: redo from there
          done[rec['index']] = rec
  checkpoints.atomic_write(path, ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in done.values()).encode())
  return done


def devices_label(mesh=None) -> str:
  """The accelerators a benchmark is timed on, e.g. 'cpu: 1 x cpu' (timings from other devices don't mix)."""
  devices = jax.devices()
  label = f'{jax.default_backend()}: {len(devices)} x {devices[0].device_kind}'
  return label + (f', mesh {dict(mesh.shape)}' if mesh is not None else '')


def fingerprint_fields(task_name: str, split: str, lengths: Mapping[str, int], setting: Setting,
                       max_examples: Optional[int], drafter_name: str,
                       provenance: Optional[Mapping[str, Any]] = None, mesh=None) -> Dict[str, Any]:
  """What determines a benchmark run's per-example records (`specdec.fingerprint`).

  `provenance`: fields identifying the models, from the caller that loaded them (checkpoint paths and content,
  `fingerprint.checkpoint_fields`; dtype); a run without them is identified by its settings alone.
  """
  return dict(outputs='benchmark', code_version=RECORDS_VERSION, task=task_name, split=split,
              feature_lengths=dict(lengths), max_examples=max_examples, drafter=drafter_name,
              devices=devices_label(mesh), **dataclasses.asdict(setting), **dict(provenance or {}))


def run(target_module, target_params, drafter_module, drafter_params, task_name: str, split: str,
        lengths: Mapping[str, int], setting: Setting, output_dir: str, max_examples: Optional[int] = None,
        drafter_name: str = 'drafter', log_every: int = 8, write_plot: bool = True,
        extra_info: Optional[Mapping[str, Any]] = None, mesh=None,
        measure_in_loop: bool = True, provenance: Optional[Mapping[str, Any]] = None,
        overwrite: bool = False, remedy: str = fingerprint.MAIN_REMEDY) -> Dict[str, Any]:
  """Benchmarks baseline vs speculative decoding on a task split; writes results into `output_dir`.

  With a ('data', 'model') `mesh` (`partitioning.make_mesh`) both decoders run sharded by T5X's rules
  (`partitioning.compile_predict_sharded`); otherwise jit on the default device. `measure_in_loop` also times
  one round phase by phase inside a compiled loop (`profiling.in_loop_costs`), so the summary shows c and the
  round's fixed cost as the loop pays them and the speedup they predict.

  An earlier run in `output_dir` is resumed only if its fingerprint matches (`fingerprint_fields` with
  `provenance`; max_examples may grow), else `fingerprint.ResumeRefused` ending with `remedy`; `overwrite`
  discards it first.

  Returns the summary (also written to `output_dir/benchmark.json`).
  """
  import seqio  # pylint: disable=g-import-not-at-top

  setting.validate()
  if isinstance(drafter_module, oracle.OracleDrafter):
    raise ValueError('the oracle drafter is a measuring instrument of controlled acceptance, not a drafter: '
                     'its rows belong in specdec/ceiling.py reports (scripts/ceiling.py), never in a '
                     'benchmark table.')
  if target_module.config.vocab_size != _vocab_size(drafter_module):
    raise ValueError(f'Vocabulary mismatch: target vocab_size={target_module.config.vocab_size}, '
                     f'drafter vocab_size={_vocab_size(drafter_module)}.')
  task = seqio.get_mixture_or_task(task_name)
  vocab = task.output_features['targets'].vocabulary
  recorded = fingerprint.prepare(
      output_dir, fingerprint_fields(task_name, split, lengths, setting, max_examples, drafter_name, provenance,
                                     mesh), OUTPUT_FILES, overwrite, remedy)
  examples = evaluation.task_examples(task_name, split, lengths, max_examples)
  if not examples:
    raise ValueError(f'{task_name}:{split} gave no examples.')

  baseline, speculative = _models(target_module, drafter_module, vocab)
  base_params = {'target': target_params}
  params = {'target': target_params, 'drafter': drafter_params}
  spec_decoder_params = setting.speculative_params()
  if mesh is None:
    base_predict = baseline.compile_predict(setting.decoder_params())
    spec_predict = speculative.compile_predict(spec_decoder_params)
  else:
    base_predict = partitioning.compile_predict_sharded(baseline, mesh, decoder_params=setting.decoder_params())
    spec_predict = partitioning.compile_predict_sharded(speculative, mesh, decoder_params=spec_decoder_params)
    params = spec_predict.shard_params(params)
    base_params = {'target': params['target']}
  eos_id = baseline.eos_id

  batches = make_batches(examples, lengths, setting.batch_size, setting.length_buckets)
  warm = set()
  examples_path = os.path.join(output_dir, 'examples.jsonl')
  done = resume_records(examples_path)
  if done:
    print(f'Resuming: {len(done)} of {len(examples)} examples already measured in {examples_path}.',
          flush=True)

  start = time.perf_counter()
  measured = 0
  warmup_s = 0.0
  with open(examples_path, 'a', encoding='utf-8') as log:
    for batch_no, (idx, batch) in enumerate(batches):
      if all(i in done for i in idx):
        continue
      rng = jax.random.PRNGKey(setting.seed + batch_no)
      shape = batch['encoder_input_tokens'].shape
      if shape not in warm:  # compile + one untimed run of each decoder for this input shape
        warm_start = time.perf_counter()
        jax.block_until_ready(base_predict(base_params, batch, rng))
        jax.block_until_ready(spec_predict(params, batch, rng))
        warm.add(shape)
        warmup_s += time.perf_counter() - warm_start
      base_times, spec_times = [], []
      for _ in range(setting.repeats):  # interleaved, so slow drifts of the machine hit both alike
        t, (base_out, _) = _timed(base_predict, base_params, batch, rng)
        base_times.append(t)
        t, (spec_out, spec_aux) = _timed(spec_predict, params, batch, rng)
        spec_times.append(t)
      base_out, spec_out, stats = partitioning.to_host((base_out, spec_out, spec_aux['stats']))
      base_s, spec_s = float(np.median(base_times)), float(np.median(spec_times))
      for row, i in enumerate(idx):
        ex = examples[i]
        rec = {
            'index': i, 'batch': batch_no, 'input_length': int(len(ex['inputs'])),
            'padded_input_length': int(shape[1]),
            # Wall time of the whole batch (per example at batch size 1).
            'baseline_s': base_s, 'speculative_s': spec_s, 'batch_rows': len(idx),
            'baseline_tokens': num_tokens(base_out[row], eos_id),
            'speculative_tokens': num_tokens(spec_out[row], eos_id),
            'identical': bool(np.array_equal(base_out[row], spec_out[row])),
            'target_calls': int(stats['target_calls'][row]), 'drafted': int(stats['drafted'][row]),
            'judged': int(stats['judged'][row]), 'accepted': int(stats['accepted'][row]),
            'accepted_at': stats['accepted_at'][row].astype(int).tolist(),
            'overlap_sum': float(stats['overlap_sum'][row]),
            'overlap_count': int(stats['overlap_count'][row]), 'emitted': int(stats['emitted'][row]),
            'baseline_text': vocab.decode(base_out[row].tolist()),
            'speculative_text': vocab.decode(spec_out[row].tolist()),
            'reference_text': ex['targets_pretokenized'].decode('utf-8'),
        }
        if setting.temperature == 0 and not rec['identical']:
          rec['mismatch'] = divergence_margin(target_module, target_params,
                                              batch['encoder_input_tokens'][row], base_out[row],
                                              spec_out[row])
        log.write(json.dumps(rec) + '\n')
        done[i] = rec
      log.flush()
      measured += len(idx)
      if measured % log_every < len(idx) or len(done) == len(examples):
        elapsed = time.perf_counter() - start
        recs = list(done.values())
        remaining = len(examples) - len(done)
        toks = sum(r['speculative_tokens'] for r in recs)
        spec_total = sum(r['speculative_s'] for r in _batch_heads(recs))
        base_total = sum(r['baseline_s'] for r in _batch_heads(recs))
        print(f'  [{drafter_name} γ={setting.gamma} t={setting.temperature:g}] {len(done)}/{len(examples)} '
              f'examples, speedup so far {base_total / max(spec_total, 1e-9):.2f}x, speculative '
              f'{toks / max(spec_total, 1e-9):.0f} tokens/s, ETA {remaining * elapsed / measured / 60:.1f} min',
              flush=True)

  records = [done[i] for i in sorted(done)]
  decode_s = time.perf_counter() - start - warmup_s
  cost_start = time.perf_counter()
  enc0 = batches[0][1]['encoder_input_tokens']
  cost_key = (target_module, drafter_module, id(target_params), id(drafter_params), enc0.shape,
              enc0.tobytes(), lengths['targets'], setting.gamma)
  if cost_key not in _COST_CACHE:  # rows differing only in temperature share the call costs
    _COST_CACHE[cost_key] = profiling.measure_costs(target_module, target_params, drafter_module,
                                                    drafter_params, enc0, lengths['targets'], setting.gamma)
  costs = _COST_CACHE[cost_key]
  in_loop_by_rows = None
  if measure_in_loop and mesh is None:
    # One round, phase by phase, inside a compiled loop (first batch, its baseline output as the prefix), at
    # every batch size the shrinking loops run at (B, B/2, ..., 1: the first rows of the batch).
    first = batches[0][1]
    decoded_l = partitioning.to_host(base_predict(base_params, first, jax.random.PRNGKey(setting.seed))[0])[0]
    in_loop_by_rows = {
        rows: profiling.in_loop_costs(target_module, target_params, drafter_module, drafter_params,
                                      {k: v[:rows] for k, v in first.items()}, decoded_l, setting.gamma,
                                      spec_decoder_params)
        for rows in batch_shrink.stage_sizes(setting.batch_size)}
  quality = {
      'baseline': evaluation.score_predictions(task, [r['baseline_text'] for r in records], examples),
      'speculative': evaluation.score_predictions(task, [r['speculative_text'] for r in records], examples),
  }
  cost_s = time.perf_counter() - cost_start
  summary = summarize(records, costs, setting, in_loop_by_rows)
  summary.update(
      wall_seconds={'compile_and_warmup': warmup_s, 'timed_decoding': decode_s, 'cost_measurement': cost_s},
      task=task_name, split=split, drafter=drafter_name, lengths=dict(lengths),
      setting=dataclasses.asdict(setting), quality=quality, costs=costs,
      machine=machine_info(), date=datetime.datetime.now().isoformat(timespec='seconds'),
      command=run_command(), fingerprint=recorded, **dict(extra_info or {}))
  write_outputs(output_dir, summary, records, write_plot)
  return summary


# Models (and with them their compiled decode functions) are reused across runs in one process, so a table of
# rows compiles each (decoder, setting, input shape) once.
_COST_CACHE: Dict[Any, Dict[str, float]] = {}
_MODEL_CACHE: Dict[Any, Tuple[models.SpeculativeEncoderDecoderModel, models.SpeculativeEncoderDecoderModel]] = {}


def _models(target_module, drafter_module, vocab):
  key = (target_module, drafter_module, id(vocab))
  if key not in _MODEL_CACHE:
    _MODEL_CACHE[key] = (
        models.SpeculativeEncoderDecoderModel(target_module, None, output_vocabulary=vocab,
                                              decode_fn=decoding.temperature_sample),
        models.SpeculativeEncoderDecoderModel(target_module, drafter_module, output_vocabulary=vocab,
                                              decode_fn=decoding.speculative_sample))
  return _MODEL_CACHE[key]


def _vocab_size(module) -> int:
  return module.config.vocab_size


def _batch_heads(records: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
  """One record per batch (batch times are stored on every row of the batch)."""
  seen, out = set(), []
  for r in records:
    if r['batch'] not in seen:
      seen.add(r['batch'])
      out.append(r)
  return out


def summarize(records: Sequence[Mapping[str, Any]], costs: Mapping[str, float], setting: Setting,
              in_loop_by_rows: Optional[Mapping[int, Mapping[str, float]]] = None) -> Dict[str, Any]:
  """The benchmark's numbers from per-example records and the measured call costs.

  `in_loop_by_rows`: `profiling.in_loop_costs` at each batch size the loops run at (`batch_shrink.stage_sizes`);
  the summary's `in_loop` is the full batch's.
  """
  heads = _batch_heads(records)
  in_loop = in_loop_by_rows[setting.batch_size] if in_loop_by_rows else None
  base_total = sum(r['baseline_s'] for r in heads)
  spec_total = sum(r['speculative_s'] for r in heads)
  base_tokens = sum(r['baseline_tokens'] for r in records)
  spec_tokens = sum(r['speculative_tokens'] for r in records)
  tot = lambda key: float(sum(r[key] for r in records))
  judged, accepted, drafted = tot('judged'), tot('accepted'), tot('drafted')
  calls = tot('target_calls')
  alpha_accept = accepted / judged if judged else 0.0  # nothing judged (every row ended at once): no evidence
  alpha_overlap = tot('overlap_sum') / tot('overlap_count') if tot('overlap_count') else 0.0
  accepted_at = np.sum([r['accepted_at'] for r in records], axis=0).astype(float)
  # P(draft j kept | drafts < j kept): rounds reaching position j are those that kept j-1 (or all rounds).
  reached = np.concatenate([[calls], accepted_at[:-1]])
  per_position = np.where(reached > 0, accepted_at / np.maximum(reached, 1), np.nan)
  gamma = setting.gamma
  alpha_for_theory = min(max(alpha_accept, 0.0), 1.0)
  thm38 = float(theory.expected_speedup(alpha_for_theory, gamma, costs['c']))
  from_costs = float(theory.predicted_speedup_from_costs(
      alpha_for_theory, gamma, costs['draft_call_s'], costs['target_call_s'], costs['verify_call_s']))
  speedup = base_total / spec_total
  identical = [r['identical'] for r in records]
  mismatches = [dict(index=r['index'], **r['mismatch']) for r in records if 'mismatch' in r]
  return {
      'examples': len(records),
      'baseline_seconds': base_total, 'speculative_seconds': spec_total,
      'baseline_ms_per_example': 1000 * float(np.median([r['baseline_s'] for r in heads])),
      'speculative_ms_per_example': 1000 * float(np.median([r['speculative_s'] for r in heads])),
      'speedup': speedup,
      'median_example_speedup': float(np.median([r['baseline_s'] / r['speculative_s'] for r in heads])),
      'baseline_tokens': base_tokens, 'speculative_tokens': spec_tokens,
      'baseline_tokens_per_s': base_tokens / base_total, 'speculative_tokens_per_s': spec_tokens / spec_total,
      'alpha_accept': alpha_accept, 'alpha_overlap': alpha_overlap,
      'accepted_per_drafted': accepted / drafted if drafted else 0.0,
      'tokens_per_target_call': tot('emitted') / calls if calls else 0.0,
      'target_calls': calls, 'drafted': drafted, 'judged': judged, 'accepted': accepted,
      'acceptance_per_position': [None if np.isnan(x) else float(x) for x in per_position],
      'predicted_speedup_thm38': thm38,
      'predicted_speedup_costs': from_costs,
      'measured_over_predicted': speedup / from_costs,
      'expected_tokens_per_call': float(theory.expected_tokens(alpha_for_theory, gamma)),
      # The α this γ and these measured costs would need for the speed targets (nan: unreachable).
      'alpha_needed': {str(x): _finite_or_none(theory.required_alpha(x, gamma, costs['c'],
                                                                     costs['verify_cost_ratio']))
                       for x in (1.5, 2.0)},
      'identical_rate': float(np.mean(identical)) if setting.temperature == 0 else None,
      'mismatches': mismatches,
      'in_loop': dict(in_loop) if in_loop else None,
      'in_loop_by_rows': ({str(rows): dict(c) for rows, c in in_loop_by_rows.items()}
                          if in_loop_by_rows and setting.batch_size > 1 else None),
      'fitted': _fitted_costs(records),
      'predicted_speedup_in_loop': (profiling.predicted_speedup_in_loop_batched(
          in_loop_by_rows, _steps_per_batch(records, setting.batch_size)) if in_loop else None),
  }


def _steps_per_batch(records: Sequence[Mapping[str, Any]], batch_size: int):
  """(baseline tokens per row, target calls per row) of each batch, padded to `batch_size` rows with rows that
  take no steps (a short last batch still runs at the full batch's size)."""
  by_batch: Dict[int, Tuple[List[int], List[int]]] = {}
  for r in records:
    tokens_r, calls_r = by_batch.setdefault(r['batch'], ([], []))
    tokens_r.append(r['baseline_tokens'])
    calls_r.append(r['target_calls'])
  pad = lambda xs: xs + [0] * (batch_size - len(xs))
  return [(pad(t), pad(c)) for t, c in by_batch.values()]


def _fitted_costs(records: Sequence[Mapping[str, Any]]) -> Optional[Dict[str, float]]:
  """Fixed and per-step costs of both decoders fitted over the examples (`profiling.fitted_costs`): what a
  round costs in the real loop. Batch 1 only (a batch's time is its slowest row's); None when it cannot be fitted."""
  if (not records or any(r.get('batch_rows', 1) != 1 for r in records)
      or len({r.get('batch') for r in records}) != len(records)):
    return None
  rows = [{'tokens': r['baseline_tokens'], 'target_calls': r['target_calls'], 'baseline_s': r['baseline_s'],
           'speculative_s': r['speculative_s']} for r in records]
  try:
    return profiling.fitted_costs(rows)
  except ValueError:  # every example took the same number of steps
    return None


def _finite_or_none(x: float) -> Optional[float]:
  """None for nan/inf, so the JSON written is strict (nan: e.g. a speedup out of reach at any α)."""
  return float(x) if np.isfinite(x) else None


def run_command(argv: Optional[Sequence[str]] = None) -> str:
  """The command line that made a result, relative to the repository: `python -m specdec.main ...` for a
  module run with -m (whose argv[0] is its absolute file path), else argv[0] relative to the working directory."""
  argv = list(sys.argv if argv is None else argv)
  program = os.path.abspath(argv[0]) if argv else ''
  package_dir = os.path.dirname(os.path.abspath(__file__))
  if os.path.dirname(program) == package_dir:
    head = f'python -m specdec.{os.path.splitext(os.path.basename(program))[0]}'
  else:
    head = 'python ' + os.path.relpath(program) if program else 'python'
  return ' '.join([head] + argv[1:])


def machine_info() -> Dict[str, Any]:
  return {'platform': platform.platform(), 'processor': platform.processor() or platform.machine(),
          'cpu_count': os.cpu_count(), 'python': platform.python_version(), 'jax': jax.__version__,
          'backend': jax.default_backend(), 'devices': [str(d) for d in jax.devices()]}


CSV_FIELDS = ('index', 'input_length', 'padded_input_length', 'baseline_s', 'speculative_s', 'baseline_tokens',
              'speculative_tokens', 'identical', 'target_calls', 'drafted', 'judged', 'accepted', 'emitted')


def markdown(summary: Mapping[str, Any]) -> str:
  s = summary
  setting = s['setting']
  lines = [
      f"# Benchmark: {s['task']}:{s['split']}, drafter {s['drafter']}, γ={setting['gamma']}, "
      f"temperature {setting['temperature']:g}, batch {setting['batch_size']}",
      '',
      f"{s['date']} · {s['machine']['processor']}, {s['machine']['cpu_count']} CPUs · "
      f"jax {s['machine']['jax']} ({s['machine']['backend']}) · `{s['command']}`",
      '',
      '| quantity | value |', '|---|---|',
      f"| examples | {s['examples']} |",
      f"| measured speedup (Σ baseline / Σ speculative wall time) | **{s['speedup']:.2f}×** |",
      f"| median per-example speedup | {s['median_example_speedup']:.2f}× |",
      f"| baseline / speculative ms per example (median) | {s['baseline_ms_per_example']:.1f} / "
      f"{s['speculative_ms_per_example']:.1f} |",
      f"| tokens/s baseline / speculative | {s['baseline_tokens_per_s']:.0f} / "
      f"{s['speculative_tokens_per_s']:.0f} |",
      f"| α (accepted / judged) | {s['alpha_accept']:.3f} |",
      f"| α (E[Σ min(p, q)]) | {s['alpha_overlap']:.3f} |",
      f"| accepted / drafted | {s['accepted_per_drafted']:.3f} |",
      f"| tokens per target call (Eq. 1 predicts) | {s['tokens_per_target_call']:.2f} "
      f"({s['expected_tokens_per_call']:.2f}) |",
      f"| acceptance per draft position | {', '.join('-' if x is None else f'{x:.2f}' for x in s['acceptance_per_position'])} |",
      f"| c = drafter call / target call | {s['costs']['c']:.3f} "
      f"({1000 * s['costs']['draft_call_s']:.3f} / {1000 * s['costs']['target_call_s']:.3f} ms) |",
      f"| verify call (γ+1 tokens) / 1-token call | {s['costs']['verify_cost_ratio']:.2f} |",
      f"| predicted speedup, Thm 3.8 (α, c) | {s['predicted_speedup_thm38']:.2f}× |",
      f"| predicted speedup, measured call costs | {s['predicted_speedup_costs']:.2f}× |",
      f"| measured / predicted (costs) | {s['measured_over_predicted']:.2f} |",
      f"| α needed at this γ and these costs for 1.5× / 2× | {tables.fmt(s['alpha_needed']['1.5'], none='unreachable')} / "
      f"{tables.fmt(s['alpha_needed']['2.0'], none='unreachable')} |",
  ]
  if s.get('in_loop'):
    il = s['in_loop']
    lines += [
        f"| inside the loop: c (draft step / baseline round) | {il['c_in_loop']:.3f} "
        f"({1000 * il['draft_s'] / setting['gamma']:.3f} / {1000 * il['baseline_round_s']:.3f} ms) |",
        f"| inside the loop: round less drafting (a) / baseline round | {il['round_fixed_in_loop']:.2f} "
        f"({1000 * (il['round_s'] - il['draft_s']):.3f} / {1000 * il['baseline_round_s']:.3f} ms) |",
        f"| per-example fixed cost, baseline / speculative | {1000 * il['baseline_fixed_s']:.2f} / "
        f"{1000 * il['speculative_fixed_s']:.2f} ms |",
        f"| predicted speedup, in-loop costs | {s['predicted_speedup_in_loop']:.2f}× "
        f"(measured / predicted {s['speedup'] / s['predicted_speedup_in_loop']:.2f}) |",
    ]
  if s.get('in_loop_by_rows'):  # batch > 1: the shrinking loops' stages, each at its own cost
    by_rows = sorted(s['in_loop_by_rows'].items(), key=lambda kv: -int(kv[0]))
    lines.append('| baseline step / speculative round at ' + ', '.join(k for k, _ in by_rows) + ' rows | '
                 + ', '.join(f"{1000 * c['baseline_round_s']:.2f} / {1000 * c['round_s']:.2f}" for _, c in by_rows)
                 + ' ms |')
  if s.get('fitted'):
    fit = s['fitted']
    lines.append(
        f"| the real loop (fitted over the examples): round / baseline token | {fit['round_in_baseline_tokens']:.2f} "
        f"({1000 * fit['round_s']:.3f} / {1000 * fit['baseline_token_s']:.3f} ms), "
        f"{fit['tokens_per_round']:.2f} tokens a round |")
  if s['identical_rate'] is not None:
    lines.append(f"| identical greedy outputs | {100 * s['identical_rate']:.1f}% "
                 f"({s['examples'] - len(s['mismatches'])}/{s['examples']}) |")
  for name in ('baseline', 'speculative'):
    q = ', '.join(f'{k} {v:.2f}' for k, v in sorted(s['quality'][name].items()))
    lines.append(f'| quality, {name} | {q} |')
  if s['mismatches']:
    lines += ['', '## Greedy mismatches', '', '| example | position | baseline token | speculative token | '
              'logit margin | top-2 gap |', '|---|---|---|---|---|---|']
    lines += [f"| {m['index']} | {m['position']} | {m['baseline_token']} | {m['speculative_token']} | "
              f"{m['margin']:.2e} | {m['top2_gap']:.2e} |" for m in s['mismatches']]
  return '\n'.join(lines) + '\n'


def write_outputs(output_dir: str, summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                  write_plot: bool = True) -> None:
  """benchmark.json, benchmark.csv (per example), benchmark.md and benchmark.png, each written atomically."""
  checkpoints.atomic_write(os.path.join(output_dir, 'benchmark.json'),
                           json.dumps(summary, indent=2, allow_nan=False).encode())
  rows = [','.join(CSV_FIELDS)]
  rows += [','.join(str(r[k]) for k in CSV_FIELDS) for r in records]
  checkpoints.atomic_write(os.path.join(output_dir, 'benchmark.csv'), ('\n'.join(rows) + '\n').encode())
  checkpoints.atomic_write(os.path.join(output_dir, 'benchmark.md'), markdown(summary).encode())
  if write_plot:
    plot(os.path.join(output_dir, 'benchmark.png'), summary, records)


def plot(path: str, summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> None:
  """Per-example wall times (baseline vs speculative) and acceptance per draft position."""
  plt = pyplot()
  heads = _batch_heads(records)
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
  base = np.array([1000 * r['baseline_s'] for r in heads])
  spec = np.array([1000 * r['speculative_s'] for r in heads])
  ax1.scatter(base, spec, s=10)
  top = float(max(base.max(), spec.max())) * 1.05
  ax1.plot([0, top], [0, top], 'k--', lw=1, label='equal time')
  ax1.plot([0, top], [0, top / 2], 'g:', lw=1, label='2× faster')
  ax1.set_xlabel('baseline ms per batch')
  ax1.set_ylabel('speculative ms per batch')
  ax1.set_title(f"speedup {summary['speedup']:.2f}× (predicted {summary['predicted_speedup_costs']:.2f}×)")
  ax1.legend()
  pos = summary['acceptance_per_position']
  ax2.bar(np.arange(1, len(pos) + 1), [np.nan if x is None else x for x in pos])
  ax2.axhline(summary['alpha_accept'], color='k', ls='--', lw=1, label=f"α = {summary['alpha_accept']:.2f}")
  ax2.set_xlabel('draft position')
  ax2.set_ylabel('P(kept | earlier drafts kept)')
  ax2.set_ylim(0, 1)
  ax2.legend()
  fig.suptitle(f"{summary['task']}, drafter {summary['drafter']}, γ={summary['setting']['gamma']}, "
               f"t={summary['setting']['temperature']:g}")
  save_png(fig, path)


def pyplot():
  """matplotlib.pyplot on the non-interactive Agg backend (imported on first use: plots are optional)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_png(fig, path: str) -> None:
  """Writes a figure as PNG atomically (`checkpoints.atomic_write`) and closes it."""
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=110)
  pyplot().close(fig)
  checkpoints.atomic_write(path, buf.getvalue())
