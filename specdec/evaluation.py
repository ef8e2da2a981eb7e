"""Decoding a seqio task split and scoring it with the task's own metrics.

The one place a split is cut into model batches (`batches`) and decoded batch by batch: `decode_split` is the
launcher's resumable decode of a split into predictions.jsonl, `decode_and_score` a quick decode and score for
trainers and scripts. seqio is imported where a task is read, not at the top: the benchmark and the accelerator
check batch with this module on machines without TensorFlow or seqio.
"""

import json
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec import decoding
from specdec import drafters
from specdec import feature_decoding
from specdec import feature_drafter
from specdec import fileio
from specdec import models
from specdec import network
from specdec import partitioning
from specdec import sharded_decoding
from specdec import theory

PredictFn = Callable[..., Tuple[Any, Mapping[str, Any]]]
# Input lengths are padded up to one of these (capped at the configured length), so short inputs do not pay
# for the longest one; each bucket is compiled once.
LENGTH_BUCKETS = (8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096)


def task_examples(task_name: str, split: str, feature_lengths: Mapping[str, int],
                  max_examples: Optional[int] = None) -> List[Dict[str, Any]]:
  """Up to `max_examples` tokenized examples (in file order) with their texts."""
  import seqio  # pylint: disable=g-import-not-at-top
  task = seqio.get_mixture_or_task(task_name)
  # No in-memory cache: the list is read once, and seqio's size check for it
  # needs prepared TFDS metadata (which tfds.testing.mock_data lacks).
  ds = task.get_dataset(dict(feature_lengths), split=split, shuffle=False,
                        num_epochs=1, use_cached=False, try_in_mem_cache=False)
  if max_examples is not None:
    ds = ds.take(max_examples)
  return list(ds.as_numpy_iterator())


def bucket_length(length: int, max_length: int, use_buckets: bool = True,
                  buckets: Sequence[int] = LENGTH_BUCKETS) -> int:
  """The padded input length for an input of `length` tokens: the first of `buckets` that holds it, at most
  `max_length`."""
  if not use_buckets:
    return max_length
  for b in buckets:
    if length <= b:
      return min(b, max_length)
  return max_length


def batches(examples: Sequence[Mapping[str, Any]], feature_lengths: Mapping[str, int], batch_size: int,
            use_buckets: bool) -> List[Tuple[List[int], Dict[str, np.ndarray]]]:
  """Fixed-size model batches in file order: (example indices, batch of encoder_input_tokens and zero decoder
  prompts).

  The last batch is padded with empty rows (all-zero inputs), so every batch has batch_size rows. Inputs are cut
  at feature_lengths['inputs'] and padded to it, or with `use_buckets` to the bucket of the batch's longest input
  (`bucket_length`): one compilation per bucket instead of one for the whole split.
  """
  out = []
  for start in range(0, len(examples), batch_size):
    idx = list(range(start, min(start + batch_size, len(examples))))
    longest = max(min(len(examples[i]['inputs']), feature_lengths['inputs']) for i in idx)
    in_len = bucket_length(longest, feature_lengths['inputs'], use_buckets)
    enc = np.zeros((batch_size, in_len), np.int32)
    for row, i in enumerate(idx):
      tokens = np.asarray(examples[i]['inputs'])[:in_len]
      enc[row, :len(tokens)] = tokens
    out.append((idx, {'encoder_input_tokens': enc,
                      'decoder_input_tokens': np.zeros((batch_size, feature_lengths['targets']), np.int32)}))
  return out


def num_tokens(decode_l: np.ndarray, eos_id: int) -> int:
  """Generated tokens up to and including the first EOS (the decode loops stop there)."""
  decode_l = np.asarray(decode_l)
  eos = np.flatnonzero(decode_l == eos_id)
  return int(eos[0] + 1) if eos.size else int(np.count_nonzero(decode_l))


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
  fileio.write_jsonl(path, done.values())
  return done


def decode_split(model, params, task_name: str, split: str, feature_lengths: Mapping[str, int], setting,
                 output_dir: str, max_examples: Optional[int], log_every: int = 8, mesh=None):
  """Decodes a split with `model` (a `models.SpeculativeEncoderDecoderModel`) at `setting` (a
  `settings.Setting`), appending output_dir/predictions.jsonl as batches finish; a rerun resumes from the records
  there (`resume_records`). With a mesh, decodes sharded (`sharded_decoding.compile_predict_sharded`).

  Batch b is decoded with the key PRNGKey(setting.seed + b), so a resumed run draws what an uninterrupted one
  would. Returns (the seqio task, its examples, the records in example order).
  """
  import seqio  # pylint: disable=g-import-not-at-top
  task = seqio.get_mixture_or_task(task_name)
  vocab = task.output_features['targets'].vocabulary
  examples = task_examples(task_name, split, feature_lengths, max_examples)
  speculative = model.drafter_module is not None
  decoder_params = setting.decoder_params()
  if speculative:
    decoder_params = setting.speculative_params()
  if mesh is None:
    predict = model.compile_predict(decoder_params)
  else:
    predict = sharded_decoding.compile_predict_sharded(model, mesh, decoder_params=decoder_params)
    params = predict.shard_params(params)
  path = os.path.join(output_dir, 'predictions.jsonl')
  done = resume_records(path)
  if done:
    print(f'Resuming: {len(done)} of {len(examples)} examples already decoded in {path}.', flush=True)
  start, decoded, tokens = time.perf_counter(), 0, 0
  with open(path, 'a', encoding='utf-8') as out:
    for batch_no, (idx, batch) in enumerate(batches(examples, feature_lengths, setting.batch_size,
                                                    setting.length_buckets)):
      if all(i in done for i in idx):
        continue
      decodes, aux = predict(params, batch, jax.random.PRNGKey(setting.seed + batch_no))
      decodes, stats = partitioning.to_host((decodes, aux.get('stats', {})))
      for row, i in enumerate(idx):
        rec = {'index': i, 'inputs': examples[i]['inputs_pretokenized'].decode('utf-8'),
               'reference': examples[i]['targets_pretokenized'].decode('utf-8'),
               'prediction': vocab.decode(decodes[row].tolist()),
               'tokens': num_tokens(decodes[row], model.eos_id)}
        rec.update({k: np.asarray(v[row]).tolist() for k, v in stats.items()})
        out.write(json.dumps(rec, ensure_ascii=False) + '\n')
        done[i] = rec
        tokens += rec['tokens']
      out.flush()
      decoded += len(idx)
      if decoded % log_every < len(idx) or len(done) == len(examples):
        elapsed = time.perf_counter() - start
        print(f'  [{task_name}] {len(done)}/{len(examples)} examples, {tokens / elapsed:.0f} tokens/s, '
              f'ETA {(len(examples) - len(done)) * elapsed / decoded / 60:.1f} min', flush=True)
  records = [done[i] for i in sorted(done)]
  return task, examples, records


def decode_statistics(records: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
  """`decode_split`'s records summed: examples, tokens and, for a speculative decode, α (accepted / judged and
  the overlap form) and tokens per target call."""
  if not records or 'target_calls' not in records[0]:
    return {'examples': len(records), 'tokens': int(sum(r['tokens'] for r in records))}
  tot = lambda k: float(sum(r[k] for r in records))
  return {'examples': len(records), 'tokens': int(tot('tokens')),
          'alpha_accept': theory.acceptance_rate(tot('accepted'), tot('judged')),
          'alpha_overlap': tot('overlap_sum') / max(tot('overlap_count'), 1),
          'tokens_per_target_call': tot('emitted') / max(tot('target_calls'), 1)}


def score_predictions(task, predictions: List[str], examples: List[Mapping[str, Any]]) -> Dict[str, float]:
  """The task's metrics of decoded texts against the examples' references (both postprocessed)."""
  preds = [task.postprocess_fn(p, example=ex, is_target=False) for p, ex in zip(predictions, examples)]
  refs = [task.postprocess_fn(ex['targets_pretokenized'].decode('utf-8'), example=ex, is_target=True)
          for ex in examples[:len(preds)]]
  metrics = {}
  for metric_fn in task.predict_metric_fns:
    metrics.update(metric_fn(refs, preds))
  return {k: float(v) for k, v in metrics.items()}


def decode_and_score(predict: PredictFn, params: Any, task_name: str, split: str,
                     feature_lengths: Mapping[str, int], batch_size: int = 32,
                     max_examples: Optional[int] = None,
                     rng: Optional[jax.Array] = None) -> Dict[str, Any]:
  """Decodes a split with `predict(params, batch, rng)` and applies the task's metrics.

  Returns {'metrics': {...}, 'predictions': [...], 'targets': [...],
  'seconds': decode wall time}.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  task = seqio.get_mixture_or_task(task_name)
  vocab = task.output_features['targets'].vocabulary
  examples = task_examples(task_name, split, feature_lengths, max_examples)
  texts = []
  start = time.perf_counter()
  # Unbucketed: one shape, one compilation for the whole split.
  for idx, batch in batches(examples, feature_lengths, batch_size, use_buckets=False):
    decodes, _ = predict(params, batch, rng)
    decodes = np.asarray(decodes)
    texts.extend(vocab.decode(decodes[row].tolist()) for row in range(len(idx)))
  seconds = time.perf_counter() - start
  predictions = [task.postprocess_fn(p, example=ex, is_target=False) for p, ex in zip(texts, examples)]
  targets = [task.postprocess_fn(ex['targets_pretokenized'].decode('utf-8'), example=ex, is_target=True)
             for ex in examples]
  return {'metrics': score_predictions(task, texts, examples),
          'predictions': predictions, 'targets': targets, 'seconds': seconds}


def _greedy_decodes(module, params, examples: List[Mapping[str, Any]], feature_lengths: Mapping[str, int],
                    batch_size: int, eos_id: int) -> Iterator[Tuple[Dict[str, np.ndarray], List[Mapping], np.ndarray,
                                                                    np.ndarray, np.ndarray]]:
  """The target's greedy decodes of `examples`, batch by batch: (batch, its examples, decodes [B, L], each
  row's generated length up to and including EOS [B], the generated span as a 0/1 mask [B, L]). The mask, not
  the token ids, marks what a teacher-forced pass scores: a generated id 0 is a real token."""
  baseline = models.SpeculativeEncoderDecoderModel(module, None, decode_fn=decoding.temperature_sample)
  predict = baseline.compile_predict({'temperature': 0.0})
  for idx, batch in batches(examples, feature_lengths, batch_size, use_buckets=False):
    decodes_bl = np.asarray(predict({'target': params}, batch)[0])
    lengths_b = np.asarray([int(np.flatnonzero(row == eos_id)[0]) + 1 if np.any(row == eos_id) else len(row)
                            for row in decodes_bl])
    valid_bl = (np.arange(decodes_bl.shape[1])[None] < lengths_b[:, None]).astype(np.int32)
    yield batch, [examples[i] for i in idx], decodes_bl, lengths_b, valid_bl


def target_confidence(module, params, examples: List[Mapping[str, Any]], feature_lengths: Mapping[str, int],
                      batch_size: int = 32, eos_id: int = 1) -> Dict[str, float]:
  """How sure a target is of its own greedy decodes: the ceiling of any drafter's greedy acceptance.

  Each input is decoded greedily, then the decode is teacher-forced through the target; at every generated
  position (up to and including EOS) this reads the target's top-1 probability and its entropy. A target
  whose top-1 is often far below 1 spreads its mass, and a drafter that imitates it must guess among
  near-ties. Returns the median and mean top-1 probability, the shares of positions with top-1 >= 0.5 and
  >= 0.9, the mean entropy (nats), the counts, and `argmax_agreement` (teacher-forced argmax == the greedy
  token; 1 up to float ties, a check of the measurement).
  """
  @jax.jit
  def top1_and_entropy(params, encoder_input_tokens, decodes_bl, valid_bl):
    decoder_input_tokens = jnp.pad(decodes_bl, ((0, 0), (1, 0)))[:, :-1]
    # The network masks target positions whose `decoder_target_tokens` are 0 (padding); a generated id 0 is
    # a real token here, so the mask is the generated span, not the token ids.
    logits = module.apply({'params': params}, encoder_input_tokens, decoder_input_tokens, valid_bl,
                          enable_dropout=False)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return jnp.exp(jnp.max(logp, axis=-1)), entropy, jnp.argmax(logp, axis=-1) == decodes_bl

  top1, entropy, agree = [], [], []
  for batch, chunk, decodes_bl, lengths_b, valid_bl in _greedy_decodes(module, params, examples, feature_lengths,
                                                                       batch_size, eos_id):
    p_bl, h_bl, same_bl = map(np.asarray, top1_and_entropy(params, batch['encoder_input_tokens'], decodes_bl,
                                                           valid_bl))
    for row in range(len(chunk)):
      n = lengths_b[row]
      top1.append(p_bl[row, :n])
      entropy.append(h_bl[row, :n])
      agree.append(same_bl[row, :n])
  if not top1 or not sum(len(x) for x in top1):
    raise ValueError('target_confidence needs at least one example with a generated token.')
  top1, entropy, agree = (np.concatenate(x) for x in (top1, entropy, agree))
  return {'examples': len(examples), 'positions': int(top1.size),
          'top1_median': float(np.median(top1)), 'top1_mean': float(np.mean(top1)),
          'share_top1_at_least_0.5': float(np.mean(top1 >= 0.5)),
          'share_top1_at_least_0.9': float(np.mean(top1 >= 0.9)),
          'entropy_mean_nats': float(np.mean(entropy)), 'argmax_agreement': float(np.mean(agree))}


def draft_rank_probabilities(target_module, target_params, drafter_module, drafter_params,
                             examples: List[Mapping[str, Any]], feature_lengths: Mapping[str, int],
                             max_rank: int = 4, batch_size: int = 32, eos_id: int = 1,
                             draft_vocab_ids: Optional[np.ndarray] = None) -> Dict[str, Any]:
  """How often the target's greedy token is a drafter's r-th choice: what a draft tree's siblings can catch.

  Each input is decoded greedily by the target; the decode is teacher-forced through the drafter (a T5
  network; or a feature head reading the target's true features, its first draft's view: deeper drafts read
  its own predictions and do worse), and at every generated position (up to and including EOS) the rank of
  the target's token among the drafter's logits (over `draft_vocab_ids` when given; a token outside them is
  never ranked) is counted. Returns {'rank_probs': [P(rank 1), .., P(rank max_rank)], 'positions': n};
  rank_probs[0] is the drafter's greedy acceptance rate α (`draft_tree.expected_tree_tokens` reads the list).
  """
  if max_rank < 1:
    raise ValueError(f'max_rank must be >= 1, got {max_rank!r}.')
  ids = None if draft_vocab_ids is None else jnp.asarray(draft_vocab_ids, jnp.int32)
  vocab_size = target_module.config.vocab_size

  def drafter_logits(params, encoder_input_tokens, decoder_input_tokens, valid_bl):
    if not drafters.kind_of(drafter_module).reads_features:
      logits = drafter_module.apply({'params': params}, encoder_input_tokens, decoder_input_tokens, valid_bl,
                                    enable_dropout=False)
      return logits if ids is None else feature_decoding.widen_logits(logits[..., ids], ids, vocab_size)
    batch = {'encoder_input_tokens': encoder_input_tokens, 'decoder_input_tokens': decoder_input_tokens,
             'decoder_target_tokens': valid_bl}
    encoded, _, features = feature_drafter.target_features(target_module, target_params, batch)
    embedded = target_module.apply({'params': target_params}, decoder_input_tokens, method=target_module.embed)
    cross_mask = network.pairwise_mask(valid_bl > 0, encoder_input_tokens > 0)
    predicted = drafter_module.apply({'params': params}, feature_drafter.shift_features_right(features), embedded,
                                     encoded, valid_bl > 0, cross_mask, 1, method=drafter_module.unrolled)[0]
    logits = target_module.apply({'params': target_params}, predicted, ids, method=target_module.project)
    return logits if ids is None else feature_decoding.widen_logits(logits, ids, vocab_size)

  @jax.jit
  def ranks(params, encoder_input_tokens, decodes_bl, valid_bl):
    decoder_input_tokens = jnp.pad(decodes_bl, ((0, 0), (1, 0)))[:, :-1]
    logits = drafter_logits(params, encoder_input_tokens, decoder_input_tokens, valid_bl).astype(jnp.float32)
    token_logit_bl = jnp.take_along_axis(logits, decodes_bl[..., None], axis=-1)
    # Rank 0 when no token scores higher (ties go to the token: the drafter's top-k takes the lower id first
    # only among equals, which float logits of different tokens almost never are).
    return jnp.sum(logits > token_logit_bl, axis=-1)

  counts = np.zeros(max_rank, np.int64)
  positions = 0
  for batch, chunk, decodes_bl, lengths_b, valid_bl in _greedy_decodes(target_module, target_params, examples,
                                                                       feature_lengths, batch_size, eos_id):
    rank_bl = np.asarray(ranks(drafter_params, batch['encoder_input_tokens'], decodes_bl, valid_bl))
    for row in range(len(chunk)):
      row_ranks = rank_bl[row, :lengths_b[row]]
      positions += row_ranks.size
      counts += np.bincount(np.minimum(row_ranks, max_rank), minlength=max_rank + 1)[:max_rank]
  if not positions:
    raise ValueError('draft_rank_probabilities needs at least one example with a generated token.')
  return {'rank_probs': (counts / positions).tolist(), 'positions': int(positions), 'examples': len(examples)}


def token_loss(module, params, examples: List[Mapping[str, Any]], feature_lengths: Mapping[str, int],
               batch_size: int = 32) -> Dict[str, float]:
  """Teacher-forced cross-entropy of `examples`' targets (their tokens up to `feature_lengths['targets']`, EOS
  included): {'loss': mean nats per target token, 'tokens': how many}. The same examples give every model the
  same tokens, so two targets' losses compare directly (unlike a packed training batch's)."""
  out_len = feature_lengths['targets']

  @jax.jit
  def summed(params, encoder_input_tokens, targets_bl):
    decoder_input_tokens = jnp.pad(targets_bl, ((0, 0), (1, 0)))[:, :-1]
    logits = module.apply({'params': params}, encoder_input_tokens, decoder_input_tokens, targets_bl,
                          enable_dropout=False)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll_bl = -jnp.take_along_axis(logp, targets_bl[..., None], axis=-1)[..., 0]
    mask_bl = targets_bl > 0
    return jnp.sum(jnp.where(mask_bl, nll_bl, 0.0)), jnp.sum(mask_bl)

  total, count = 0.0, 0
  for idx, batch in batches(examples, feature_lengths, batch_size, use_buckets=False):
    targets_bl = np.zeros((batch_size, out_len), np.int32)
    for row, i in enumerate(idx):
      tokens = np.asarray(examples[i]['targets'])[:out_len]
      targets_bl[row, :len(tokens)] = tokens
    s, c = summed(params, batch['encoder_input_tokens'], targets_bl)
    total, count = total + float(s), count + int(c)
  if not count:
    raise ValueError('token_loss: the examples hold no target tokens.')
  return {'loss': total / count, 'tokens': count}
