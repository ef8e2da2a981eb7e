"""Fits the unigram, bigram and trigram drafters on the local training targets.

  python scripts/build_ngram_drafters.py --out models/cpu --only unigram bigram
  python scripts/build_ngram_drafters.py --out models/cpu_v2 --corpus_dir data/distill_greedy_v2 --only bigram trigram

With --corpus_dir a distillation corpus (scripts/build_distill_corpus.py: the train targets replaced by a
target model's greedy decodes), the counts are the target's own bigrams: a drafter aligned to that target.

Counts come from the `targets` of the train split of every task in the
mixture (through seqio, so tokenization and EOS match the networks').
Writes <out>/unigram, <out>/bigram and <out>/trigram (config.json + counts.npz), or those named by --only.
"""

import argparse
import hashlib
import json
import os
import sys
import time

import seqio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, installed or not
from specdec import ngram
from specdec import tasks  # pylint: disable=unused-import  (registers tasks)

NAMES = ('unigram', 'bigram', 'trigram')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='models/cpu')
  parser.add_argument('--mixture', default='specdec_local_mix')
  parser.add_argument('--vocab_size', type=int, default=8192)
  parser.add_argument('--prior', type=float, default=1.0)
  parser.add_argument('--targets_length', type=int, default=48)
  parser.add_argument('--corpus_dir', default=None,
                      help='local corpus to count (default: the built corpus, data/corpus)')
  parser.add_argument('--only', nargs='+', choices=NAMES, default=list(NAMES),
                      help='write just these drafters')
  parser.add_argument('--top_k', type=int, default=8, help="continuations kept per trigram context")
  args = parser.parse_args()
  if args.corpus_dir is not None:
    if not os.path.isdir(args.corpus_dir):
      parser.error(f'--corpus_dir {args.corpus_dir} does not exist')
    tasks.register_local_tasks(args.corpus_dir)

  decodes = {}
  if args.corpus_dir is not None and os.path.exists(os.path.join(args.corpus_dir, 'manifest.json')):
    with open(os.path.join(args.corpus_dir, 'manifest.json')) as f:
      manifest = json.load(f)
    if 'model' in manifest:  # a distillation corpus: the targets are a model's decodes
      decodes = {'decodes_of': manifest['model'], 'decoding': manifest.get('decoding'),
                 'corpus_command': manifest.get('command')}

  start = time.time()
  sequences, digest = [], hashlib.sha256()
  for task in seqio.get_mixture_or_task(args.mixture).tasks:
    ds = task.get_dataset({'inputs': 8, 'targets': args.targets_length},
                          split='train', shuffle=False, num_epochs=1,
                          use_cached=False)
    n = 0
    for ex in ds.as_numpy_iterator():
      tokens = ex['targets'].tolist()
      sequences.append(tokens)
      digest.update(str(tokens).encode())
      n += 1
    print(f'{task.name}: {n} training targets ({time.time() - start:.0f} s)')
  unigram, bigram = ngram.count(sequences, args.vocab_size)
  print(f'{int(unigram.sum())} tokens, {len(bigram)} distinct bigrams')
  trigram, contexts = None, 0
  if 'trigram' in args.only:  # counted only when written
    trigram = ngram.count_trigrams(sequences, args.vocab_size)
    contexts = ngram.num_contexts(trigram)
    print(f'{len(trigram)} distinct trigrams in {contexts} contexts')
  command = ('python scripts/build_ngram_drafters.py '
             f'--out {args.out} --prior {args.prior}'
             + (f' --corpus_dir {args.corpus_dir}' if args.corpus_dir else '')
             + (f' --top_k {args.top_k}' if 'trigram' in args.only else '')
             + ' --only ' + ' '.join(args.only))
  for order, name in enumerate(NAMES, start=1):
    if name not in args.only:
      continue
    config = ngram.NgramConfig(args.vocab_size, order=order, prior=args.prior, top_k=args.top_k,
                               num_contexts=contexts if order == 3 else 0)
    ngram.save(f'{args.out}/{name}', config, unigram,
               bigram if order >= 2 else bigram[:0],
               trigram=trigram if order == 3 else None,
               extra={'data': {'mixture': args.mixture, 'split': 'train',
                               # As given (None: the built corpus): never this machine's absolute path.
                               'corpus_dir': args.corpus_dir,
                               'targets_length': args.targets_length,
                               'sequences': len(sequences),
                               'tokens_sha256': digest.hexdigest(), **decodes},
                      'command': command})
    print(f'wrote {args.out}/{name}')


if __name__ == '__main__':
  main()
