"""Builds a distillation corpus: the local corpus with train targets replaced by the target model's decodes.

  python scripts/build_distill_corpus.py --model models/cpu/target --out data/distill_greedy
  python scripts/build_distill_corpus.py --model models/cpu/target --out data/distill_t1 --temperature 1
  python scripts/build_distill_corpus.py --model models/cpu_v2/target --corpus data/pool --out data/pool_greedy_v2

A drafter only helps speculative decoding as far as it predicts the *target
model*, on the target model's own prefixes (the drafter always continues what
the target has emitted). Training the drafter on the target's greedy outputs
(sequence-level distillation, Kim & Rush 2016), together with the word-level
KL to the target (`train.train(teacher_dir=...)`), trains it on exactly those
prefixes. Greedy decodes (`--temperature 0`) serve greedy speculative decoding;
samples at temperature 1 (`--temperature 1`, one per input, seeded per batch)
cover the target's distribution, which sampled speculative decoding verifies
against. Validation and test splits are copied unchanged (they are scored
against the references). Each train row keeps its reference as `gold_targets`
where it has one: every row of `data/corpus`; in the distillation pool
(`--corpus data/pool`, scripts/build_distill_pool.py) only the rows of the
corpus's train split (the others have `targets` "").

`manifest.json` records a fingerprint (model files' sha256, corpus manifest
sha256, lengths, temperature, seed, max_examples): a re-run resumes only when
it matches, and refuses otherwise (`--overwrite` rebuilds).

Inputs are decoded sorted by length in length buckets, so the short En→De
inputs are not padded to the summarization length. The sorted batches are
dealt into shards of about `--shard_size` inputs (batch b to shard b mod the
number of shards, so every shard holds inputs of every length and the ETA
holds); each shard is written atomically as it finishes
(`<task>/shards/00000.jsonl`), a re-run skips the finished ones, and when all
are done they are joined into `<task>/train.jsonl` (written atomically; the
shards are then removed). A finished task (its train.jsonl) is skipped.
Batches, their PRNG keys and so the decodes are those of an unsharded run
with the same `--batch_size`.

`--extend DIR` grows a finished corpus without decoding its inputs again: DIR
must have been built by this script from the same model, pool, lengths,
temperature and seed, with a smaller `--max_examples` (its train rows are then
the first rows of this one, which is checked); its decodes are copied and only
the remaining inputs are decoded (their batches' PRNG keys start past DIR's).
`--tasks` limits the run to some tasks (e.g. the pool's En→De inputs only).

  python scripts/build_distill_corpus.py --model models/cpu_v2/target --corpus data/pool \
      --out data/pool_greedy_v2_200k --max_examples 200000 --tasks translate_en_de \
      --extend data/pool_greedy_v2
"""

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))

from specdec import fileio  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import fingerprint as fingerprint_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import task_names  # pylint: disable=g-import-not-at-top,wrong-import-position

TASK_DIRS = {task_names.ENDE_LOCAL_TASK: 'translate_en_de',
             task_names.SUMMARIZE_LOCAL_TASK: 'summarize_ddtp'}
# The input lengths this corpus's batches are padded to (`evaluation.bucket_length`), kept as the shipped corpora
# were decoded: other paddings decode the same text in other programs.
BUCKETS = (16, 32, 64, 96, 128, 256, 512)
DEFAULT_SHARD_SIZE = 4096
SHARDS_DIR = 'shards'
LAYOUT_NAME = 'layout.json'


def model_batch(examples, idx, batch_size, lengths):
  """The model batch of `examples[i] for i in idx`: inputs padded to their bucket (`BUCKETS`), `batch_size` rows
  (the rows past `idx` all padding), all target positions free."""
  from specdec import evaluation  # pylint: disable=g-import-not-at-top
  in_len = evaluation.bucket_length(max(len(examples[i]['inputs']) for i in idx), lengths['inputs'],
                                    buckets=BUCKETS)
  enc = np.zeros((batch_size, in_len), np.int32)
  for row, i in enumerate(idx):
    tokens = np.asarray(examples[i]['inputs'])[:in_len]
    enc[row, :len(tokens)] = tokens
  return {'encoder_input_tokens': enc,
          'decoder_input_tokens': np.zeros((batch_size, lengths['targets']), np.int32)}


def fingerprint(model_dir, corpus_dir, lengths, temperature, seed, max_examples):
  """What determines the corpus's content."""
  model_files = {name: fingerprint_lib.file_sha256(os.path.join(model_dir, name))
                 for name in sorted(os.listdir(model_dir))
                 if name in ('params.msgpack', 'counts.npz')}
  corpus_manifest = os.path.join(corpus_dir, 'manifest.json')
  return {'model_files': model_files,
          'corpus_manifest': (fingerprint_lib.file_sha256(corpus_manifest)
                              if os.path.exists(corpus_manifest) else None),
          'lengths': dict(lengths), 'temperature': float(temperature), 'seed': int(seed),
          'max_examples': max_examples}


def check_resumable(out_dir, want, overwrite):
  """Raises if `out_dir` holds a corpus built with other settings (unless `overwrite`, which clears it)."""
  path = os.path.join(out_dir, 'manifest.json')
  if not os.path.isdir(out_dir) or not os.listdir(out_dir):
    return
  have = None
  if os.path.exists(path):
    with open(path) as f:
      have = json.load(f).get('fingerprint')
  if have == want:
    return
  if overwrite:
    shutil.rmtree(out_dir)
    return
  if have is None:
    raise SystemExit(f'{out_dir} holds a corpus without a fingerprint: use a new --out or --overwrite.')
  diff = ', '.join(f'{k}: {have.get(k)!r} -> {want[k]!r}' for k in want if have.get(k) != want[k])
  raise SystemExit(f'{out_dir} was built with other settings ({diff}): use a new --out or --overwrite.')


# -----------------------------------------------------------------------------
# Batches and shards (pure).
# -----------------------------------------------------------------------------


def plan_batches(input_lengths, batch_size):
  """Batches of example indices, the examples sorted by input length (stable).

  Batch b holds sorted positions [b * batch_size, (b + 1) * batch_size).
  """
  order = np.argsort(np.asarray(input_lengths), kind='stable')
  return [order[first:first + batch_size] for first in range(0, len(order), batch_size)]


def plan_shards(num_batches, batch_size, shard_size):
  """Batch numbers of each shard: batch b goes to shard b mod K, K = ceil(batches * batch_size / shard_size).

  Dealing the length-sorted batches round-robin gives every shard inputs of
  every length, so shards take about the same time.
  """
  if num_batches == 0:
    return []
  num_shards = max(1, min(num_batches, -(-num_batches * batch_size // shard_size)))
  return [list(range(j, num_batches, num_shards)) for j in range(num_shards)]


def shard_path(task_out, j):
  return os.path.join(task_out, SHARDS_DIR, f'{j:05d}.jsonl')


def _check_layout(task_out, layout):
  """Writes the shards' layout, or raises if finished shards were made with another one."""
  path = os.path.join(task_out, SHARDS_DIR, LAYOUT_NAME)
  if os.path.exists(path):
    have = fileio.read_json_object(path, 'shard layout')
    if have != layout:
      diff = ', '.join(f'{k}: {have.get(k)!r} -> {layout[k]!r}' for k in layout if have.get(k) != layout[k])
      raise SystemExit(f'{os.path.dirname(path)} holds shards of another layout ({diff}): run with the '
                       'same --batch_size and --shard_size, or delete that folder.')
    return
  fileio.write_json(path, layout)


def _read_shard(path, indices):
  """{index: decoded text} of a finished shard, checked against the indices it must hold."""
  rows = fileio.read_jsonl(path)
  got = [row['index'] for row in rows]
  if got != [int(i) for i in indices]:
    raise SystemExit(f'{path} does not hold the inputs its layout says (delete it to decode it again).')
  return {row['index']: row['targets'] for row in rows}


def decode_task(label, rows, input_lengths, task_out, decode_batch, batch_size,
                shard_size=DEFAULT_SHARD_SIZE, log=print, known=None):
  """Decodes `rows` shard by shard (resuming finished shards), then writes `task_out`/train.jsonl.

  Args:
    label: the task's name, for progress lines.
    rows: the corpus's train rows (dicts), in file order.
    input_lengths: each row's input length in tokens (sorts the batches).
    task_out: the task's output folder.
    decode_batch: `(first, indices) -> texts`: decodes the rows `indices`,
      the batch starting at sorted position `first`.
    batch_size, shard_size: see plan_batches and plan_shards.
    log: progress callback.
    known: {row index: decoded text} already decoded (`--extend`): copied, and
      the batches are planned over the other rows, their sorted positions
      (`first`) counted from len(known).
  """
  known = dict(known or {})
  todo = np.asarray([i for i in range(len(rows)) if i not in known], np.int64)
  batches = [todo[b] for b in plan_batches([input_lengths[i] for i in todo], batch_size)]
  shards = plan_shards(len(batches), batch_size, shard_size)
  layout = {'examples': len(rows), 'batch_size': batch_size, 'shard_size': shard_size,
            'shards': len(shards)}
  if known:
    layout['reused'] = len(known)
  _check_layout(task_out, layout)
  decoded = [known.get(i) for i in range(len(rows))]
  total, done, fresh = len(rows), len(known), 0
  if known:
    log(f'  {label}: {len(known)}/{total} decodes reused')
  pending = []
  for j, shard in enumerate(shards):
    path = shard_path(task_out, j)
    indices = [int(i) for b in shard for i in batches[b]]
    if os.path.exists(path):
      for i, text in _read_shard(path, indices).items():
        decoded[i] = text
      done += len(indices)
    else:
      pending.append((j, shard))
  if done > len(known):
    log(f'  {label}: {done}/{total} decoded in {len(shards) - len(pending)} finished shards (resumed)')
  start = time.perf_counter()
  for j, shard in pending:
    texts = {}
    for b in shard:
      idx = batches[b]
      for i, text in zip(idx, decode_batch(len(known) + b * batch_size, idx)):
        texts[int(i)] = text
      done += len(idx)
      fresh += len(idx)
      elapsed = time.perf_counter() - start
      log(f'  {label}: {done}/{total} decoded (shard {j + 1}/{len(shards)}), {fresh / elapsed:.0f} ex/s, '
          f'ETA {(total - done) * elapsed / fresh / 60:.1f} min')
    lines = [{'index': i, 'targets': texts[i]} for b in shard for i in (int(x) for x in batches[b])]
    fileio.write_jsonl(shard_path(task_out, j), lines)
    for i, text in texts.items():
      decoded[i] = text
  lines = []
  for row, text in zip(rows, decoded):
    if row.get('targets'):
      row = dict(row, gold_targets=row['targets'], targets=text)
    else:
      row = dict(row, targets=text)
    lines.append(json.dumps(row, ensure_ascii=False))
  fileio.atomic_write(os.path.join(task_out, 'train.jsonl'), ('\n'.join(lines) + '\n').encode('utf-8'))
  shutil.rmtree(os.path.join(task_out, SHARDS_DIR), ignore_errors=True)


def copy_eval_splits(corpus_dir, out_dir, task_dir):
  for split in ('validation', 'test'):
    dst = os.path.join(out_dir, task_dir, f'{split}.jsonl')
    shutil.copyfile(os.path.join(corpus_dir, task_dir, f'{split}.jsonl'), dst + '.tmp')
    os.replace(dst + '.tmp', dst)


# -----------------------------------------------------------------------------
# Decoding with the target (seqio, JAX).
# -----------------------------------------------------------------------------


def reused_decodes(extend_dir, task_dir, rows):
  """{row index: decode} from the corpus `extend_dir` (`--extend`), whose train rows must begin `rows`."""
  path = os.path.join(extend_dir, task_dir, 'train.jsonl')
  if not os.path.exists(path):
    return {}
  old = fileio.read_jsonl(path)
  if len(old) > len(rows):
    raise SystemExit(f'{path} holds {len(old)} rows, more than the {len(rows)} to build: raise --max_examples.')
  for i, (was, row) in enumerate(zip(old, rows)):
    if was['inputs'] != row['inputs']:
      raise SystemExit(f'{path}: row {i} has other inputs than the corpus\'s train split: it was built from '
                       'another corpus.')
  return {i: was['targets'] for i, was in enumerate(old)}


def check_extendable(extend_dir, want):
  """Raises unless `extend_dir` is a corpus of this script with `want`'s settings but for max_examples."""
  path = os.path.join(extend_dir, 'manifest.json')
  if not os.path.exists(path):
    raise SystemExit(f'--extend {extend_dir}: no manifest.json there (not a corpus of this script).')
  have = fileio.read_json_object(path, 'corpus manifest').get('fingerprint') or {}
  diff = [k for k in want if k != 'max_examples' and have.get(k) != want[k]]
  if diff:
    raise SystemExit(f'--extend {extend_dir} was built with other settings ({", ".join(diff)}).')
  if have.get('max_examples') is None or (want['max_examples'] is not None
                                          and have['max_examples'] >= want['max_examples']):
    raise SystemExit(f'--extend {extend_dir} already holds max_examples={have.get("max_examples")}: '
                     f'--max_examples must be larger.')


def distill_task(task_name, corpus_dir, out_dir, predict, params, lengths,
                 batch_size, max_examples=None, temperature=0.0, seed=0,
                 shard_size=DEFAULT_SHARD_SIZE, extend_dir=None):
  import jax  # pylint: disable=g-import-not-at-top
  from specdec import evaluation  # pylint: disable=g-import-not-at-top

  task_dir = TASK_DIRS[task_name]
  src = os.path.join(corpus_dir, task_dir, 'train.jsonl')
  with open(src, encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  t0 = time.perf_counter()
  examples = evaluation.task_examples(task_name, 'train', lengths, max_examples)
  print(f'  {task_name}: {len(examples)} examples tokenized in {time.perf_counter() - t0:.0f}s', flush=True)
  rows = rows[:len(examples)]
  for row, ex in zip(rows, examples):  # same file order: check it
    if row['inputs'] not in ex['inputs_pretokenized'].decode('utf-8'):
      raise RuntimeError(f'{src}: seqio example order differs from the file order.')
  known = reused_decodes(extend_dir, task_dir, rows) if extend_dir else {}
  vocab = seqio_vocab(task_name)

  def decode_batch(first, idx):
    batch = model_batch(examples, idx, batch_size, lengths)
    # One key per batch, from its first example's sorted position (as before sharding).
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), int(first)) if temperature else None
    out, _ = predict(params, batch, rng)
    out = np.asarray(out)
    return [vocab.decode(out[row].tolist()) for row in range(len(idx))]

  task_out = os.path.join(out_dir, task_dir)
  os.makedirs(task_out, exist_ok=True)
  decode_task(task_name, rows, [len(ex['inputs']) for ex in examples], task_out, decode_batch,
              batch_size, shard_size, log=lambda msg: print(msg, flush=True), known=known)
  copy_eval_splits(corpus_dir, out_dir, task_dir)


def seqio_vocab(task_name):
  import seqio  # pylint: disable=g-import-not-at-top
  return seqio.get_mixture_or_task(task_name).output_features['targets'].vocabulary


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='models/cpu/target')
  parser.add_argument('--corpus', default='data/corpus',
                      help='a corpus directory: data/corpus, or the distillation pool data/pool')
  parser.add_argument('--out', default='data/distill_corpus')
  parser.add_argument('--batch_size', type=int, default=128)
  parser.add_argument('--shard_size', type=int, default=DEFAULT_SHARD_SIZE,
                      help='inputs per shard (each written as it finishes; a re-run skips finished ones)')
  parser.add_argument('--inputs_length', type=int, default=96)
  parser.add_argument('--targets_length', type=int, default=48)
  parser.add_argument('--max_examples', type=int, default=None)
  parser.add_argument('--temperature', type=float, default=0.0,
                      help='0: greedy decodes; 1: samples from the target')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--overwrite', action='store_true',
                      help='discard a corpus in --out built with other settings')
  parser.add_argument('--tasks', nargs='+', choices=sorted(TASK_DIRS.values()), default=None,
                      help='build these tasks only (default: all)')
  parser.add_argument('--extend', default=None,
                      help='a smaller corpus of the same settings: its decodes are copied, not redone')
  args = parser.parse_args()
  if args.temperature < 0:
    raise SystemExit(f'--temperature must be >= 0, got {args.temperature}.')
  if args.batch_size < 1 or args.shard_size < 1:
    raise SystemExit('--batch_size and --shard_size must be >= 1.')
  from specdec import decoding  # pylint: disable=g-import-not-at-top
  from specdec import loading  # pylint: disable=g-import-not-at-top
  from specdec import models  # pylint: disable=g-import-not-at-top
  from specdec import tasks  # pylint: disable=g-import-not-at-top
  lengths = {'inputs': args.inputs_length, 'targets': args.targets_length}
  want = fingerprint(args.model, args.corpus, lengths, args.temperature, args.seed, args.max_examples)
  if args.extend:  # checked before the model loads
    if os.path.abspath(args.extend) == os.path.abspath(args.out):
      raise SystemExit('--extend must name another folder than --out.')
    check_extendable(args.extend, want)
  check_resumable(args.out, want, args.overwrite)
  tasks.register_local_tasks(args.corpus)
  module, params = loading.load_module_and_params(args.model)
  model = models.SpeculativeEncoderDecoderModel(module, None,
                                                decode_fn=decoding.temperature_sample)
  # topk=0: plain sampling (T5X's temperature_sample defaults to topk=1, i.e. greedy).
  predict = model.compile_predict({'temperature': args.temperature, 'topk': 0})
  os.makedirs(args.out, exist_ok=True)
  manifest = {'model': args.model, 'corpus': args.corpus, 'lengths': lengths,
              'decoding': 'greedy' if args.temperature == 0 else f'sampled, temperature {args.temperature}',
              'fingerprint': want, 'extends': args.extend,
              'command': ' '.join(['python scripts/build_distill_corpus.py'] + sys.argv[1:])}
  # Written first, so a killed run's finished tasks and shards are resumable under the same fingerprint.
  fileio.atomic_write(os.path.join(args.out, 'manifest.json'),
                      json.dumps(manifest, indent=2).encode())
  for task_name in TASK_DIRS:
    if args.tasks and TASK_DIRS[task_name] not in args.tasks:
      continue
    marker = os.path.join(args.out, TASK_DIRS[task_name], 'train.jsonl')
    if os.path.exists(marker):
      print(f'{marker} exists: skipped (delete it to rebuild).')
      continue
    distill_task(task_name, args.corpus, args.out, predict, {'target': params},
                 lengths, args.batch_size, args.max_examples, args.temperature, args.seed,
                 args.shard_size, args.extend)


if __name__ == '__main__':
  main()
