"""Trimmed draft vocabularies: which K token ids a drafter's logits cover.

A drafter may compute its logits over only the K tokens the target emits most
often (FR-Spec, Zhao et al. 2025, arXiv 2502.14856): q = 0 elsewhere, and
speculative sampling stays exact because the target verifies over its whole
vocabulary (`models.SpeculativeEncoderDecoderModel(..., draft_vocab_ids=ids)`,
`train_config.FeatureHeadTrainConfig.draft_vocab_file`). The ids are chosen
from the target's own decodes (a distillation corpus,
scripts/build_distill_corpus.py); `scripts/draft_vocab.py` counts them, writes
the id files and measures the coverage of held-out decodes: the share of the
target's tokens a K-token drafter can propose at all, so the ceiling of its
first-draft acceptance.

Pure functions over numpy arrays; a sequence is any 1-D run of token ids and
0 is padding (never counted). The id files are JSON lists of ints, sorted
ascending and unique (what `check_draft_vocab_ids` accepts).
"""

import json
from typing import Iterable, Optional, Sequence

import numpy as np

from specdec import fileio

PAD_ID = 0
EOS_ID = 1


def _flat_ids(sequences) -> np.ndarray:
  """All ids of `sequences` (a 2-D array, or an iterable of 1-D sequences) in one int64 array."""
  if isinstance(sequences, np.ndarray):
    return sequences.reshape(-1).astype(np.int64)
  parts = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
  return np.concatenate(parts) if parts else np.zeros((0,), np.int64)


def token_counts(sequences, vocab_size: int) -> np.ndarray:
  """Counts [vocab_size] (int64) of the token ids in `sequences`; padding (0) is not counted.

  ValueError for an id outside [0, vocab_size).
  """
  if vocab_size < 1:
    raise ValueError(f'vocab_size must be >= 1, got {vocab_size}.')
  ids = _flat_ids(sequences)
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f'token ids outside [0, {vocab_size}): min {ids.min()}, max {ids.max()}.')
  counts = np.bincount(ids, minlength=vocab_size).astype(np.int64)
  counts[PAD_ID] = 0
  return counts


def top_ids(counts, k: int, always: Sequence[int] = (EOS_ID,)) -> np.ndarray:
  """The k most frequent ids (ties: the smaller id first), `always` among them; sorted ascending, int32.

  `always` (default EOS, which ends every decode) is kept whatever its count;
  the other k - len(always) ids are the most frequent of the rest. When fewer
  than k ids were ever seen, the rest are unseen ids, smallest first.
  ValueError for k < 1, k > len(counts), k < len(set(always)), or an
  `always` id outside [0, len(counts)).
  """
  counts = np.asarray(counts)
  if counts.ndim != 1 or not np.issubdtype(counts.dtype, np.number):
    raise ValueError(f'counts must be a 1-D numeric array, got shape {counts.shape}, dtype {counts.dtype}.')
  vocab_size = counts.shape[0]
  always = np.unique(np.asarray(always, dtype=np.int64).reshape(-1))
  k = int(k)
  if k < 1 or k > vocab_size:
    raise ValueError(f'k must be in [1, {vocab_size}] (the vocabulary size), got {k}.')
  if k < always.size:
    raise ValueError(f'k = {k} is smaller than the {always.size} ids always kept ({always.tolist()}).')
  if always.size and (always.min() < 0 or always.max() >= vocab_size):
    raise ValueError(f'always ids {always.tolist()} lie outside [0, {vocab_size}).')
  ids = np.arange(vocab_size)
  rest = np.ones(vocab_size, bool)
  rest[always] = False
  # lexsort: the last key is the primary one: count descending, then id ascending.
  order = np.lexsort((ids[rest], -counts[rest]))
  chosen = np.concatenate([always, ids[rest][order[:k - always.size]]])
  return np.sort(chosen).astype(np.int32)


def coverage(ids, sequences) -> float:
  """The share of the non-padding tokens of `sequences` whose id lies in `ids`.

  ValueError when `sequences` hold no token.
  """
  tokens = _flat_ids(sequences)
  tokens = tokens[tokens != PAD_ID]
  if tokens.size == 0:
    raise ValueError('coverage of no tokens: the sequences are empty or all padding.')
  return float(np.isin(tokens, np.asarray(ids, dtype=np.int64)).mean())


def _check_id_list(ids, where: str) -> np.ndarray:
  """Sorted unique non-negative int ids as int32 (any vocabulary size); ValueError naming `where`."""
  values = list(ids)
  if not values or any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer))
                       for v in values):
    raise ValueError(f'{where}: a draft vocabulary must be a non-empty list of int token ids.')
  arr = np.asarray(values, dtype=np.int64)
  if arr.min() < 0 or arr.max() > np.iinfo(np.int32).max:
    raise ValueError(f'{where}: token ids must be in [0, 2**31), got min {arr.min()}, max {arr.max()}.')
  if np.any(np.diff(arr) <= 0):
    raise ValueError(f'{where}: token ids must be sorted ascending and unique.')
  return arr.astype(np.int32)


def save_ids(path: str, ids: Iterable[int]) -> None:
  """Writes `ids` (sorted unique ints) to `path` as a JSON list, atomically; ValueError otherwise."""
  if isinstance(ids, np.ndarray) and ids.ndim != 1:
    raise ValueError(f'{path}: a draft vocabulary must be 1-D, got shape {ids.shape}.')
  values = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
  arr = _check_id_list(values, str(path))
  fileio.atomic_write(path, (json.dumps([int(i) for i in arr]) + '\n').encode())


def load_ids(path: str, vocab_size: Optional[int] = None) -> np.ndarray:
  """The ids of a file `save_ids` wrote, int32; checked by `check_draft_vocab_ids` given `vocab_size`.

  FileNotFoundError without a file; ValueError naming it for anything but a
  non-empty JSON list of sorted unique int ids (in [0, vocab_size) when given).
  """
  if not fileio.isfile(path):
    raise FileNotFoundError(f'No draft vocabulary file at {path}.')
  with fileio.open(path, 'rb') as f:
    data = f.read()
  try:
    value = json.loads(data.decode('utf-8'))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f'{path}: not a JSON list of token ids ({e}).') from e
  if not isinstance(value, list):
    raise ValueError(f'{path}: not a JSON list of token ids (a JSON {type(value).__name__}).')
  ids = _check_id_list(value, str(path))
  if vocab_size is not None:
    try:
      ids = check_draft_vocab_ids(ids, int(vocab_size))
    except ValueError as e:
      raise ValueError(f'{path}: {e}') from e
  return ids


def check_draft_vocab_ids(vocab_ids, vocab_size: int) -> np.ndarray:
  """A trimmed draft vocabulary (`models.SpeculativeEncoderDecoderModel(draft_vocab_ids=...)`) as sorted
  unique int32 ids in [0, vocab_size); ValueError otherwise."""
  ids = np.asarray(vocab_ids)
  if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f'draft_vocab_ids must be a non-empty 1-D array of token ids, got shape '
                     f'{ids.shape} and dtype {ids.dtype}.')
  if ids.min() < 0 or ids.max() >= vocab_size:
    raise ValueError(f'draft_vocab_ids holds ids outside [0, {vocab_size}) (the target\'s '
                     'vocabulary).')
  if np.any(np.diff(ids) <= 0):
    raise ValueError('draft_vocab_ids must be sorted and unique.')
  return ids.astype(np.int32)
