"""A self-training corpus: the real corpus plus a share of the target's own decodes of new inputs.

Self-training (He et al. 2020, "Revisiting Self-Training for Neural Sequence
Generation") trains a model on pseudo-pairs: inputs without references paired
with the model's own decodes. Here the inputs are the distillation pool's
(``specdec/data/distill_pool.py``) and the decodes are a corpus written by
``scripts/build_distill_corpus.py --corpus <pool>``. Only inputs the real train
split does not hold are pseudo-pairs: a pool row of the real train split
(origin ``corpus:train``) would put a second, poorer target beside its
reference.

``mix_train_rows`` adds at most ``max_decodes`` of them (a seeded sample) to
the real rows of one task and shuffles the two together (the trainer reads
files shuffled too; a shuffled file keeps any prefix a fair sample). Every row
says where it came from in ``provenance``: ``real`` or ``decode:<model>``.
Validation and test splits, and every other task, are the real corpus's,
unchanged, so a target trained on the mix is scored on what every other target
is. A pseudo-pair whose input leaks into a held-out split (text, first words,
source or binary package: ``distill_pool.leakage_overlaps``) is refused.

``noised`` is the input noise of noisy self-training (He et al. 2020, after
Lample et al. 2018): each word dropped with probability ``drop`` (one is
always kept), then the words shuffled locally, none moving more than
``shuffle_k`` places. The model learns to give its clean decode of an input
from a perturbed one, which He et al. found is what makes self-training help
rather than reinforce the model's own mistakes. Only pseudo-pairs' inputs are
noised (``clean_inputs`` keeps the original); real pairs are left as they are.
"""

import collections
import random
from typing import Dict, List, Mapping, Sequence, Tuple

from specdec.data import distill_pool

REAL = 'real'
DECODE_PREFIX = 'decode:'
# The pool's rows that come from the real corpus's own train split.
CORPUS_TRAIN_ORIGIN = 'corpus:train'


def _normalised(text: str) -> str:
  # The held-out checks' key (lower-cased, whitespace-normalised): an input that differs from a real one only in
  # case is the same sentence, and must not become a second, poorer pair beside the real one.
  return distill_pool.leak_keys(text)[0]


def pseudo_pairs(decode_rows: Sequence[Mapping[str, object]],
                 real_train_rows: Sequence[Mapping[str, object]],
                 model: str) -> Tuple[List[Dict[str, object]], Dict[str, int]]:
  """The decodes of inputs the real train split lacks, as train rows; and what was left out, counted.

  Left out: rows of the real train split (origin or input text), empty
  decodes, and repeated inputs (the first is kept). Inputs are compared as
  the held-out checks compare them (``distill_pool.leak_keys``: case and
  whitespace ignored).
  """
  real_inputs = {_normalised(str(r['inputs'])) for r in real_train_rows}
  seen = set()
  kept, dropped = [], {'real_train_input': 0, 'empty_decode': 0, 'repeated_input': 0}
  for row in decode_rows:
    key = _normalised(str(row['inputs']))
    if row.get('origin') == CORPUS_TRAIN_ORIGIN or key in real_inputs:
      dropped['real_train_input'] += 1
    elif not str(row.get('targets', '')).strip():
      dropped['empty_decode'] += 1
    elif key in seen:
      dropped['repeated_input'] += 1
    else:
      seen.add(key)
      pair = {k: v for k, v in row.items() if k != 'gold_targets'}
      pair['provenance'] = DECODE_PREFIX + model
      kept.append(pair)
  return kept, dropped


def check_no_leak(pairs: Sequence[Mapping[str, object]],
                  held_out_rows: Sequence[Mapping[str, object]]) -> None:
  """ValueError if a pseudo-pair shares a held-out source, package, text or opening words."""
  held = distill_pool.held_out_from_rows(held_out_rows)
  overlaps = distill_pool.leakage_overlaps({'pairs': pairs}, held)
  if any(overlaps.values()):
    raise ValueError(f'the decodes leak into the validation/test splits ({overlaps}): '
                     'they must be of a pool built from this corpus.')


def mix_train_rows(real_rows: Sequence[Mapping[str, object]],
                   pairs: Sequence[Mapping[str, object]],
                   max_decodes: int, seed: int) -> List[Dict[str, object]]:
  """The real rows (provenance 'real') and a seeded sample of at most `max_decodes` pairs, shuffled together."""
  if max_decodes < 0:
    raise ValueError(f'max_decodes must be >= 0, got {max_decodes}.')
  rng = random.Random(seed)
  sample = list(pairs)
  rng.shuffle(sample)
  rows = [dict(r, provenance=REAL) for r in real_rows] + [dict(p) for p in sample[:max_decodes]]
  rng.shuffle(rows)
  return rows


def noised(text: str, rng: random.Random, drop: float = 0.1, shuffle_k: int = 3) -> str:
  """`text` with each word dropped with probability `drop` (at least one kept), then shuffled locally (no word
  moves more than `shuffle_k` places: Lample et al. 2018's sort of i + U(0, k + 1))."""
  if not 0.0 <= drop < 1.0 or shuffle_k < 0:
    raise ValueError(f'noise needs 0 <= drop < 1 and shuffle_k >= 0, got drop={drop}, shuffle_k={shuffle_k}.')
  words = text.split()
  kept = [w for w in words if rng.random() >= drop] or ([rng.choice(words)] if words else [])
  keys = [i + rng.uniform(0, shuffle_k + 1) if shuffle_k else i for i in range(len(kept))]
  return ' '.join(w for _, w in sorted(zip(keys, kept), key=lambda kw: kw[0]))


def noise_inputs(pairs: Sequence[Mapping[str, object]], seed: int, drop: float = 0.1,
                 shuffle_k: int = 3) -> List[Dict[str, object]]:
  """`pairs` with noised inputs (`noised`, seeded), each keeping its original in `clean_inputs`."""
  rng = random.Random(seed)
  return [dict(p, inputs=noised(str(p['inputs']), rng, drop, shuffle_k), clean_inputs=p['inputs'])
          for p in pairs]


def provenance_counts(rows: Sequence[Mapping[str, object]]) -> Dict[str, int]:
  """Rows per `provenance`, sorted by it."""
  return dict(sorted(collections.Counter(str(row['provenance']) for row in rows).items()))
