"""Builds a distillation corpus: the local corpus with train targets replaced by the target model's decodes.

  python scripts/build_distill_corpus.py --model models/cpu/target --out data/distill_greedy
  python scripts/build_distill_corpus.py --model models/cpu/target --out data/distill_t1 --temperature 1

A drafter only helps speculative decoding as far as it predicts the *target
model*, on the target model's own prefixes (the drafter always continues what
the target has emitted). Training the drafter on the target's greedy outputs
(sequence-level distillation, Kim & Rush 2016), together with the word-level
KL to the target (`train.train(teacher_dir=...)`), trains it on exactly those
prefixes. Greedy decodes (`--temperature 0`) serve greedy speculative decoding;
samples at temperature 1 (`--temperature 1`, one per input, seeded per batch)
cover the target's distribution, which sampled speculative decoding verifies
against. Validation and test splits are copied unchanged (they are scored
against the references). Each train row keeps the reference as `gold_targets`.

`manifest.json` records a fingerprint (model files' sha256, corpus manifest
sha256, lengths, temperature, seed, max_examples): a re-run resumes finished
tasks only when it matches, and refuses otherwise (`--overwrite` rebuilds).

Inputs are decoded sorted by length in length buckets, so the short En→De
inputs are not padded to the summarization length. Writes atomically; a
finished task directory is skipped on re-runs (resumable per task).
"""

import argparse
import json
import os
import shutil
import sys
import time

import jax
import numpy as np

from specdec import decoding
from specdec import evaluation
from specdec import fileio
from specdec import fingerprint as fingerprint_lib
from specdec import loading
from specdec import models
from specdec import tasks

TASK_DIRS = {tasks.ENDE_LOCAL_TASK: 'translate_en_de',
             tasks.SUMMARIZE_LOCAL_TASK: 'summarize_ddtp'}
BUCKETS = (16, 32, 64, 96, 128, 256, 512)


def bucket_length(n: int, max_len: int) -> int:
  for b in BUCKETS:
    if n <= b:
      return min(b, max_len)
  return max_len


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


def distill_task(task_name, corpus_dir, out_dir, predict, params, lengths,
                 batch_size, max_examples=None, temperature=0.0, seed=0):
  task_dir = TASK_DIRS[task_name]
  src = os.path.join(corpus_dir, task_dir, 'train.jsonl')
  with open(src, encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  examples = evaluation.task_examples(task_name, 'train', lengths, max_examples)
  rows = rows[:len(examples)]
  for row, ex in zip(rows, examples):  # same file order: check it
    if row['inputs'] not in ex['inputs_pretokenized'].decode('utf-8'):
      raise RuntimeError(f'{src}: seqio example order differs from the file order.')
  vocab = seqio_vocab(task_name)
  order = np.argsort([len(ex['inputs']) for ex in examples], kind='stable')
  decoded = [None] * len(examples)
  start = time.perf_counter()
  done = 0
  for first in range(0, len(order), batch_size):
    idx = order[first:first + batch_size]
    in_len = bucket_length(max(len(examples[i]['inputs']) for i in idx), lengths['inputs'])
    enc = np.zeros((batch_size, in_len), np.int32)
    for row, i in enumerate(idx):
      tokens = np.asarray(examples[i]['inputs'])[:in_len]
      enc[row, :len(tokens)] = tokens
    batch = {'encoder_input_tokens': enc,
             'decoder_input_tokens': np.zeros((batch_size, lengths['targets']), np.int32)}
    # One key per batch, from its first example's index: the same samples whatever --batch_size.
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), int(first)) if temperature else None
    out, _ = predict(params, batch, rng)
    out = np.asarray(out)
    for row, i in enumerate(idx):
      decoded[i] = vocab.decode(out[row].tolist())
    done += len(idx)
    elapsed = time.perf_counter() - start
    print(f'  {task_name}: {done}/{len(order)} decoded, {done / elapsed:.0f} ex/s, '
          f'ETA {(len(order) - done) * elapsed / done / 60:.1f} min', flush=True)
  lines = []
  for row, text in zip(rows, decoded):
    row = dict(row, gold_targets=row['targets'], targets=text)
    lines.append(json.dumps(row, ensure_ascii=False))
  os.makedirs(os.path.join(out_dir, task_dir), exist_ok=True)
  fileio.atomic_write(os.path.join(out_dir, task_dir, 'train.jsonl'),
                      ('\n'.join(lines) + '\n').encode('utf-8'))
  for split in ('validation', 'test'):
    shutil.copyfile(os.path.join(corpus_dir, task_dir, f'{split}.jsonl'),
                    os.path.join(out_dir, task_dir, f'{split}.jsonl'))


def seqio_vocab(task_name):
  import seqio  # pylint: disable=g-import-not-at-top
  return seqio.get_mixture_or_task(task_name).output_features['targets'].vocabulary


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='models/cpu/target')
  parser.add_argument('--corpus', default='data/corpus')
  parser.add_argument('--out', default='data/distill_corpus')
  parser.add_argument('--batch_size', type=int, default=128)
  parser.add_argument('--inputs_length', type=int, default=96)
  parser.add_argument('--targets_length', type=int, default=48)
  parser.add_argument('--max_examples', type=int, default=None)
  parser.add_argument('--temperature', type=float, default=0.0,
                      help='0: greedy decodes; 1: samples from the target')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--overwrite', action='store_true',
                      help='discard a corpus in --out built with other settings')
  args = parser.parse_args()
  if args.temperature < 0:
    raise SystemExit(f'--temperature must be >= 0, got {args.temperature}.')
  tasks.register_local_tasks(args.corpus)
  lengths = {'inputs': args.inputs_length, 'targets': args.targets_length}
  module, params = loading.load_module_and_params(args.model)
  model = models.SpeculativeEncoderDecoderModel(module, None,
                                                decode_fn=decoding.temperature_sample)
  # topk=0: plain sampling (T5X's temperature_sample defaults to topk=1, i.e. greedy).
  predict = model.compile_predict({'temperature': args.temperature, 'topk': 0})
  want = fingerprint(args.model, args.corpus, lengths, args.temperature, args.seed, args.max_examples)
  check_resumable(args.out, want, args.overwrite)
  os.makedirs(args.out, exist_ok=True)
  manifest = {'model': args.model, 'corpus': args.corpus, 'lengths': lengths,
              'decoding': 'greedy' if args.temperature == 0 else f'sampled, temperature {args.temperature}',
              'fingerprint': want,
              'command': ' '.join(['python scripts/build_distill_corpus.py'] + sys.argv[1:])}
  # Written first, so a killed run's finished tasks are resumable under the same fingerprint.
  fileio.atomic_write(os.path.join(args.out, 'manifest.json'),
                      json.dumps(manifest, indent=2).encode())
  for task_name in TASK_DIRS:
    marker = os.path.join(args.out, TASK_DIRS[task_name], 'train.jsonl')
    if os.path.exists(marker):
      print(f'{marker} exists: skipped (delete it to rebuild).')
      continue
    distill_task(task_name, args.corpus, args.out, predict, {'target': params},
                 lengths, args.batch_size, args.max_examples, args.temperature, args.seed)


if __name__ == '__main__':
  main()
