"""Unigram and bigram drafters (the paper's Table 3 columns) as Flax modules.

They are fitted from token counts of the training targets and ignore the
encoder input. They serve the same interface as `network.Transformer`
(`encode`, `init_cache`, `decode_step`, `__call__`, `config.vocab_size`), so
`models.SpeculativeEncoderDecoderModel` and the decode loops use them like
any drafter: `decode_step` takes k >= 1 tokens at per-row positions and
returns [B, k, V] logits (log-probabilities), where the bigram's row for
token j is log P(next | token j).

Stored as counts (sparse for the bigram) in the compact model directory
format: config.json (with counts.npz's sha256, checked on load) + counts.npz;
the dense [V, V] table is built on load.
"""

import dataclasses
import json
import io
from typing import Iterable, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from specdec import checkpoints
from specdec import fileio

CONFIG_FILE = 'config.json'
COUNTS_FILE = 'counts.npz'


@dataclasses.dataclass(frozen=True)
class NgramConfig:
  """order: 1 (unigram) or 2 (bigram); prior: Dirichlet prior weight of the
  unigram inside each bigram row (and add-`prior`/V smoothing of the unigram)."""
  vocab_size: int
  order: int = 2
  prior: float = 1.0

  def __post_init__(self):
    if self.order not in (1, 2):
      raise ValueError(f'NgramConfig.order must be 1 or 2, got {self.order!r}.')
    if self.vocab_size <= 0:
      raise ValueError(f'NgramConfig.vocab_size must be positive, got {self.vocab_size!r}.')
    if self.prior <= 0:
      raise ValueError(f'NgramConfig.prior must be > 0, got {self.prior!r}.')


def count(sequences: Iterable[Iterable[int]], vocab_size: int
          ) -> Tuple[np.ndarray, np.ndarray]:
  """Unigram counts [V] and bigram counts as (prev, next, count) [N, 3].

  Each sequence is a target token list (EOS included, no padding); the first
  token's predecessor is BOS = 0, as in decoding.
  """
  unigram = np.zeros(vocab_size, np.int64)
  pairs = {}
  for seq in sequences:
    prev = 0
    for tok in seq:
      tok = int(tok)
      if tok == 0:
        break
      unigram[tok] += 1
      key = prev * vocab_size + tok
      pairs[key] = pairs.get(key, 0) + 1
      prev = tok
  keys = np.fromiter(pairs.keys(), np.int64, len(pairs))
  order = np.argsort(keys)
  keys = keys[order]
  values = np.fromiter(pairs.values(), np.int64, len(pairs))[order]
  bigram = np.stack([keys // vocab_size, keys % vocab_size, values], axis=1)
  return unigram, bigram


def log_prob_table(config: NgramConfig, unigram: np.ndarray,
                   bigram: np.ndarray) -> np.ndarray:
  """[V] unigram or [V, V] bigram log-probabilities (float32).

  P_uni(x) = (c(x) + prior / V) / (N + prior); P(x | p) = (c(p, x) +
  prior * P_uni(x)) / (c(p, .) + prior). Token 0 (padding) gets no mass.
  """
  v = config.vocab_size
  uni = unigram.astype(np.float64) + config.prior / v
  uni[0] = 0.0
  uni /= uni.sum()
  if config.order == 1:
    with np.errstate(divide='ignore'):
      return np.log(uni).astype(np.float32)
  table = np.zeros((v, v), np.float64)
  np.add.at(table, (bigram[:, 0], bigram[:, 1]), bigram[:, 2])
  row_totals = table.sum(axis=1, keepdims=True)
  table = (table + config.prior * uni[None]) / (row_totals + config.prior)
  with np.errstate(divide='ignore'):
    return np.log(table).astype(np.float32)


class NgramLM(nn.Module):
  """A unigram/bigram decoder with Transformer's decoding interface."""
  config: NgramConfig

  def setup(self):
    shape = ((self.config.vocab_size,) if self.config.order == 1
             else (self.config.vocab_size, self.config.vocab_size))
    self.log_probs = self.param('log_probs', nn.initializers.zeros, shape,
                                jnp.float32)

  def _logits(self, tokens_bk):
    table = self.log_probs
    if self.config.order == 1:
      return jnp.broadcast_to(table, tokens_bk.shape + table.shape)
    return table[tokens_bk]

  def encode(self, encoder_input_tokens, encoder_segment_ids=None, *,
             enable_dropout=True):
    del encoder_segment_ids, enable_dropout
    return jnp.zeros(encoder_input_tokens.shape + (1,), jnp.float32)

  def init_cache(self, encoded, encoder_input_tokens, max_decode_length):
    """An n-gram drafter keeps no decoding state: the cache is empty."""
    del encoded, encoder_input_tokens, max_decode_length

  def decode_step(self, decoder_input_tokens, decoder_positions, *,
                  enable_dropout=False):
    del decoder_positions, enable_dropout
    return self._logits(decoder_input_tokens)

  def __call__(self, encoder_input_tokens, decoder_input_tokens,
               decoder_target_tokens=None, encoder_segment_ids=None,
               decoder_segment_ids=None, *, enable_dropout=True, decode=False,
               **unused):
    del encoder_input_tokens, decoder_target_tokens, encoder_segment_ids
    del decoder_segment_ids, enable_dropout, unused
    if decode:
      raise ValueError('NgramLM.__call__ is teacher-forced; use decode_step.')
    return self._logits(decoder_input_tokens)


def save(directory: str, config: NgramConfig, unigram: np.ndarray,
         bigram: np.ndarray, extra: Optional[dict] = None) -> None:
  """Writes counts.npz, then config.json (with its sha256), atomically."""
  buffer = io.BytesIO()
  np.savez_compressed(buffer, unigram=unigram, bigram=bigram)
  data = buffer.getvalue()
  meta = {'ngram_config': dataclasses.asdict(config),
          checkpoints.FILES_FIELD: {COUNTS_FILE: checkpoints.sha256_hex(data)}}
  clash = set(extra or {}) & set(meta)
  if clash:
    raise ValueError(f'extra metadata may not replace {sorted(clash)}.')
  meta.update(extra or {})
  checkpoints.atomic_write(fileio.join(directory, COUNTS_FILE), data)
  checkpoints.atomic_write(fileio.join(directory, CONFIG_FILE),
                           json.dumps(meta, indent=2, sort_keys=True).encode())


def is_ngram_dir(directory: str) -> bool:
  return fileio.exists(fileio.join(directory, COUNTS_FILE))


def _read_counts(path: str, data: bytes, vocab_size: int
                 ) -> Tuple[np.ndarray, np.ndarray]:
  """(unigram [V], bigram [N, 3]) from counts.npz bytes; ValueError if damaged."""
  try:
    with np.load(io.BytesIO(data)) as counts:
      unigram, bigram = counts['unigram'], counts['bigram']
  except Exception as e:  # pylint: disable=broad-except  (zip / zlib / npy errors)
    raise ValueError(f'{path}: damaged or truncated counts file ({e}).') from e
  if unigram.shape != (vocab_size,) or bigram.ndim != 2 or bigram.shape[1] != 3:
    raise ValueError(f'{path}: counts of shapes {unigram.shape} and {bigram.shape} do '
                     f'not fit vocab_size={vocab_size} (expected ({vocab_size},) and (N, 3)).')
  if bigram.size and (bigram[:, :2].min() < 0 or bigram[:, :2].max() >= vocab_size):
    raise ValueError(f'{path}: bigram ids outside [0, {vocab_size}).')
  return unigram, bigram


def load(directory: str) -> Tuple[NgramLM, dict]:
  """(module, params) for a saved n-gram drafter (counts.npz hash-checked)."""
  for name in (CONFIG_FILE, COUNTS_FILE):
    if not fileio.exists(fileio.join(directory, name)):
      raise FileNotFoundError(f'No {name} in {directory}.')
  config_path = fileio.join(directory, CONFIG_FILE)
  meta = checkpoints.read_json_meta(config_path)
  try:
    config = NgramConfig(**meta['ngram_config'])
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{config_path}: no valid 'ngram_config' ({type(e).__name__}: "
                     f'{e}): not an n-gram drafter config, or a damaged one.') from e
  data = checkpoints.read_verified(directory, COUNTS_FILE, meta)
  unigram, bigram = _read_counts(fileio.join(directory, COUNTS_FILE), data,
                                 config.vocab_size)
  table = log_prob_table(config, unigram, bigram)
  return NgramLM(config), {'log_probs': jnp.asarray(table)}
