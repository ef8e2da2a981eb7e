"""Fits the unigram and bigram drafters on the local training targets.

  python scripts/build_ngram_drafters.py --out models/cpu

Counts come from the `targets` of the train split of every task in the
mixture (through seqio, so tokenization and EOS match the networks').
Writes <out>/unigram and <out>/bigram (config.json + counts.npz).
"""

import argparse
import hashlib
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
  args = parser.parse_args()

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
    config = ngram.NgramConfig(args.vocab_size, order=order, prior=args.prior)
    ngram.save(f'{args.out}/{name}', config, unigram,
               bigram if order == 2 else bigram[:0],
               extra={'data': {'mixture': args.mixture, 'split': 'train',
                               'targets_length': args.targets_length,
                               'sequences': len(sequences),
                               'tokens_sha256': digest.hexdigest()},
                      'command': 'python scripts/build_ngram_drafters.py '
                                 f'--out {args.out} --prior {args.prior}'})
    print(f'wrote {args.out}/{name}')


if __name__ == '__main__':
  main()
