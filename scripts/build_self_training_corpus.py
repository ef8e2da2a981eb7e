"""Builds a self-training corpus: the real corpus with a share of the target's own decodes of pool inputs added.

  python scripts/build_self_training_corpus.py --real data/corpus_v3 --decodes data/pool_greedy_v3 \
      --out data/self_v3 --max_decodes 30000
  python scripts/build_self_training_corpus.py --real data/corpus_v3 --decodes data/pool_greedy_v3 \
      --out data/self_v3_noisy --max_decodes 30000 --noise_drop 0.1 --noise_shuffle_k 3

`--decodes` is a corpus written by scripts/build_distill_corpus.py from a pool
of this corpus (`--corpus data/pool_v3`); its manifest names the model that
decoded it. Only the task(s) the decodes hold get pseudo-pairs (`--task`,
default translate_en_de): the decodes of inputs the real train split lacks, a
seeded sample of at most `--max_decodes`, shuffled in among the real train
rows (specdec/data/self_training.py). Every other split and task is copied from the
real corpus unchanged. `--noise_drop` / `--noise_shuffle_k` noise the pseudo-pairs' inputs (noisy
self-training: `self_training.noised`; their clean input stays in `clean_inputs`). Each train row carries `provenance` (`real` or
`decode:<model>`); manifest.json records the sources' manifests (sha256), the
counts and each file's sha256. The directory is written in a temporary folder
and renamed into place when complete; an existing `--out` is refused unless
`--overwrite`.
"""

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))

from specdec import fileio  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.data import self_training  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import tasks  # pylint: disable=g-import-not-at-top,wrong-import-position

SPLITS = ('train', 'validation', 'test')
MANIFEST = 'manifest.json'


def _corpus_names(corpus_dir):
  return sorted(n for n in os.listdir(corpus_dir) if os.path.isdir(os.path.join(corpus_dir, n)))


def build(real_dir, decodes_dir, out_dir, task, max_decodes, seed, command, noise_drop=0.0, noise_shuffle_k=0,
          log=print):
  """Writes the corpus to out_dir (which must not exist); returns its manifest."""
  for path in (os.path.join(real_dir, MANIFEST), os.path.join(decodes_dir, MANIFEST),
               tasks.corpus_split_path(real_dir, task, 'train'),
               tasks.corpus_split_path(decodes_dir, task, 'train')):
    if not os.path.isfile(path):
      raise FileNotFoundError(f'{path} does not exist.')
  decodes_manifest = fileio.read_json_object(os.path.join(decodes_dir, MANIFEST), 'decode manifest')
  model = decodes_manifest.get('model')
  if not model:
    raise ValueError(f'{decodes_dir}/{MANIFEST} names no model: build it with scripts/build_distill_corpus.py.')
  if max_decodes < 0:
    raise ValueError(f'--max_decodes must be >= 0, got {max_decodes}.')

  real_train = fileio.read_jsonl(tasks.corpus_split_path(real_dir, task, 'train'))
  pairs, dropped = self_training.pseudo_pairs(
      fileio.read_jsonl(tasks.corpus_split_path(decodes_dir, task, 'train')), real_train, model)
  held_out = [row for name in _corpus_names(real_dir) for split in ('validation', 'test')
              for row in fileio.read_jsonl(tasks.corpus_split_path(real_dir, name, split))]
  self_training.check_no_leak(pairs, held_out)
  if noise_drop or noise_shuffle_k:
    pairs = self_training.noise_inputs(pairs, seed, noise_drop, noise_shuffle_k)
  rows = self_training.mix_train_rows(real_train, pairs, max_decodes, seed)
  log(f'{task}: {len(real_train)} real train rows + {len(rows) - len(real_train)} of {len(pairs)} '
      f'pseudo-pairs by {model} (left out: {dropped}).')

  tmp = out_dir.rstrip('/') + '.partial'
  if os.path.exists(tmp):
    shutil.rmtree(tmp)
  files = {}
  for name in _corpus_names(real_dir):
    os.makedirs(os.path.join(tmp, name))
    for split in SPLITS:
      rel = f'{name}/{split}.jsonl'
      if name == task and split == 'train':
        fileio.write_jsonl(os.path.join(tmp, rel), rows)
      else:
        shutil.copyfile(os.path.join(real_dir, rel), os.path.join(tmp, rel))
      files[rel] = fileio.file_sha256(os.path.join(tmp, rel))
  manifest = {
      'real': {'dir': real_dir, 'manifest_sha256': fileio.file_sha256(os.path.join(real_dir, MANIFEST))},
      'decodes': {'dir': decodes_dir, 'model': model,
                  'manifest_sha256': fileio.file_sha256(os.path.join(decodes_dir, MANIFEST))},
      'task': task, 'max_decodes': max_decodes, 'seed': seed,
      'input_noise': {'drop': noise_drop, 'shuffle_k': noise_shuffle_k},
      'pseudo_pairs_available': len(pairs), 'left_out': dropped,
      'train_rows': self_training.provenance_counts(rows),
      'files': files, 'command': command}
  fileio.write_json(os.path.join(tmp, MANIFEST), manifest)
  os.rename(tmp, out_dir)
  return manifest


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--real', required=True, help='the real corpus (scripts/build_corpus.py)')
  parser.add_argument('--decodes', required=True, help='the target\'s decodes of a pool of it')
  parser.add_argument('--out', required=True)
  parser.add_argument('--task', default='translate_en_de', help='the corpus folder that gets pseudo-pairs')
  parser.add_argument('--max_decodes', type=int, required=True)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--noise_drop', type=float, default=0.0,
                      help="drop each word of a pseudo-pair's input with this probability")
  parser.add_argument('--noise_shuffle_k', type=int, default=0,
                      help="then shuffle its words, none moving more than this many places")
  parser.add_argument('--overwrite', action='store_true')
  args = parser.parse_args(argv)
  if not 0.0 <= args.noise_drop < 1.0 or args.noise_shuffle_k < 0:
    parser.error(f'--noise_drop must be in [0, 1) and --noise_shuffle_k >= 0, got {args.noise_drop}, '
                 f'{args.noise_shuffle_k}.')
  if os.path.exists(args.out):
    if not args.overwrite:
      parser.error(f'--out {args.out} exists; give --overwrite to rebuild it.')
    shutil.rmtree(args.out)
  command = ' '.join(['python scripts/build_self_training_corpus.py'] + (sys.argv[1:] if argv is None else argv))
  build(args.real, args.decodes, args.out, args.task, args.max_decodes, args.seed, command,
        args.noise_drop, args.noise_shuffle_k)


if __name__ == '__main__':
  main()
