"""Fits the unigram and bigram drafters on the local training targets.

  python scripts/build_ngram_drafters.py --out models/cpu
  python scripts/build_ngram_drafters.py --out models/cpu_v2 --corpus_dir data/distill_greedy_v2 --only bigram

With --corpus_dir a distillation corpus (scripts/build_distill_corpus.py: the train targets replaced by a
target model's greedy decodes), the counts are the target's own bigrams: a drafter aligned to that target.

Counts come from the `targets` of the train split of every task in the
mixture (through seqio, so tokenization and EOS match the networks').
Writes <out>/unigram and <out>/bigram (config.json + counts.npz).
"""

import argparse
import hashlib
import os
import time

import seqio

from specdec import ngram
from specdec import tasks  # pylint: disable=unused-import  (registers tasks)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='models/cpu')
  parser.add_argument('--mixture', default='specdec_local_mix')
  parser.add_argument('--vocab_size', type=int, default=8192)
  parser.add_argument('--prior', type=float, default=1.0)
  parser.add_argument('--targets_length', type=int, default=48)
  parser.add_argument('--corpus_dir', default=None,
                      help='local corpus to count (default: the built corpus, data/corpus)')
  parser.add_argument('--only', choices=('unigram', 'bigram'), default=None, help='write just this drafter')
  args = parser.parse_args()
  if args.corpus_dir is not None:
    if not os.path.isdir(args.corpus_dir):
      parser.error(f'--corpus_dir {args.corpus_dir} does not exist')
    tasks.register_local_tasks(args.corpus_dir)

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
  for order, name in ((1, 'unigram'), (2, 'bigram')):
    if args.only and name != args.only:
      continue
    config = ngram.NgramConfig(args.vocab_size, order=order, prior=args.prior)
    ngram.save(f'{args.out}/{name}', config, unigram,
               bigram if order == 2 else bigram[:0],
               extra={'data': {'mixture': args.mixture, 'split': 'train',
                               # As given (None: the built corpus): never this machine's absolute path.
                               'corpus_dir': args.corpus_dir,
                               'targets_length': args.targets_length,
                               'sequences': len(sequences),
                               'tokens_sha256': digest.hexdigest()},
                      'command': 'python scripts/build_ngram_drafters.py '
                                 f'--out {args.out} --prior {args.prior}'
                                 + (f' --corpus_dir {args.corpus_dir}' if args.corpus_dir else '')
                                 + (f' --only {args.only}' if args.only else '')})
    print(f'wrote {args.out}/{name}')


if __name__ == '__main__':
  main()
