"""Unigram, bigram and trigram drafters (the paper's Table 3 columns) as Flax modules.

They are fitted from token counts of the training targets and ignore the
encoder input. They serve the same interface as `network.Transformer`
(`encode`, `init_cache`, `decode_step`, `__call__`, `config.vocab_size`), so
`models.SpeculativeEncoderDecoderModel` and the decode loops use them like
any drafter: `decode_step` takes k >= 1 tokens at per-row positions and
returns [B, k, V] logits (log-probabilities), where the bigram's row for
token j is log P(next | token j) and the trigram's log P(next | token j-1,
token j).

The trigram keeps the tokens it was fed in its cache (`decoded_tokens`
[B, L], written at their positions like a self-attention cache), so a call
that starts at position t reads its first context token from position t-1.
Its rows interpolate the context's `top_k` most frequent continuations with
the bigram row: P(x | a, b) = (c(a, b, x) + prior * P(x | b)) / (n(a, b) +
prior), n the stored counts' sum; unseen contexts are the bigram row.

Stored as counts (sparse for the bigram and trigram) in the compact model
directory format: config.json (with counts.npz's sha256, checked on load) +
counts.npz; the dense [V, V] table and the trigram's sorted context table
are built on load.
"""

import dataclasses
import io
from typing import Iterable, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from specdec import fileio

CONFIG_FILE = 'config.json'
COUNTS_FILE = 'counts.npz'


@dataclasses.dataclass(frozen=True)
class NgramConfig:
  """order: 1 (unigram), 2 (bigram) or 3 (trigram); prior: Dirichlet prior
  weight of the lower order inside each row (and add-`prior`/V smoothing of
  the unigram); top_k: continuations kept per trigram context; num_contexts:
  trigram contexts stored (set by `save` from the counts; 0 below order 3)."""
  vocab_size: int
  order: int = 2
  prior: float = 1.0
  top_k: int = 8
  num_contexts: int = 0

  def __post_init__(self):
    if self.order not in (1, 2, 3):
      raise ValueError(f'NgramConfig.order must be 1, 2 or 3, got {self.order!r}.')
    if self.top_k < 1:
      raise ValueError(f'NgramConfig.top_k must be >= 1, got {self.top_k!r}.')
    if self.num_contexts < 0 or (self.order == 3) != (self.num_contexts > 0):
      raise ValueError(f'NgramConfig.num_contexts must be > 0 for order 3 and 0 below it, got '
                       f'{self.num_contexts!r} at order {self.order}.')
    if self.vocab_size <= 0:
      raise ValueError(f'NgramConfig.vocab_size must be positive, got {self.vocab_size!r}.')
    if self.order == 3 and self.vocab_size ** 2 >= 2 ** 31:
      raise ValueError(f'NgramConfig.vocab_size {self.vocab_size} is too large for a trigram: its '
                       'contexts are int32 keys prev * V + token.')
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


def count_trigrams(sequences: Iterable[Iterable[int]], vocab_size: int) -> np.ndarray:
  """Trigram counts as (prev, token, next, count) [N, 4], sorted by context.

  The first token's context is (0, 0) and the second's (0, first token), as
  the trigram sees them when decoding from BOS = 0.
  """
  triples = {}
  for seq in sequences:
    a = b = 0
    for tok in seq:
      tok = int(tok)
      if tok == 0:
        break
      key = (a * vocab_size + b) * vocab_size + tok
      triples[key] = triples.get(key, 0) + 1
      a, b = b, tok
  keys = np.sort(np.fromiter(triples.keys(), np.int64, len(triples)))
  values = np.asarray([triples[k] for k in keys.tolist()], np.int64)
  v2 = vocab_size * vocab_size
  return np.stack([keys // v2, keys // vocab_size % vocab_size, keys % vocab_size, values], axis=1)


def trigram_tables(config: NgramConfig, trigram: np.ndarray
                   ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The trigram's lookup tables from counts [N, 4] (`count_trigrams`).

  Returns context keys prev * V + token [C] (int32, ascending), the top_k most
  frequent continuations of each [C, top_k] (int32; unused slots 0) and their
  counts [C, top_k] (float32; unused slots 0).
  """
  v, k = config.vocab_size, config.top_k
  context = trigram[:, 0] * v + trigram[:, 1]
  # Within a context: most frequent first, ties by token id (deterministic).
  order = np.lexsort((trigram[:, 2], -trigram[:, 3], context))
  sorted_context = context[order]
  starts = np.flatnonzero(np.r_[True, sorted_context[1:] != sorted_context[:-1]])
  keys = sorted_context[starts]
  rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
  keep = rank < k
  rows = np.searchsorted(keys, sorted_context[keep])
  ids = np.zeros((len(keys), k), np.int32)
  counts = np.zeros((len(keys), k), np.float32)
  ids[rows, rank[keep]] = trigram[order[keep], 2]
  counts[rows, rank[keep]] = trigram[order[keep], 3]
  return keys.astype(np.int32), ids, counts


def log_prob_table(config: NgramConfig, unigram: np.ndarray,
                   bigram: np.ndarray) -> np.ndarray:
  """[V] unigram or [V, V] bigram log-probabilities (float32); order 3 gets
  the bigram table (its rows' backoff).

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
  """A unigram/bigram/trigram decoder with Transformer's decoding interface."""
  config: NgramConfig

  def setup(self):
    cfg = self.config
    v = cfg.vocab_size
    shape = (v,) if cfg.order == 1 else (v, v)
    self.log_probs = self.param('log_probs', nn.initializers.zeros, shape, jnp.float32)
    if cfg.order == 3:
      c, k = cfg.num_contexts, cfg.top_k
      self.context_keys = self.param('context_keys', nn.initializers.zeros, (c,), jnp.int32)
      self.next_ids = self.param('next_ids', nn.initializers.zeros, (c, k), jnp.int32)
      self.next_counts = self.param('next_counts', nn.initializers.zeros, (c, k), jnp.float32)

  def _logits(self, tokens_bk, prev_bk=None):
    table = self.log_probs
    if self.config.order == 1:
      return jnp.broadcast_to(table, tokens_bk.shape + table.shape)
    if self.config.order == 2:
      return table[tokens_bk]
    return self._trigram_logits(prev_bk, tokens_bk)

  def _trigram_logits(self, prev_bk, tokens_bk):
    """log P(next | prev, token) [B, k, V]: top_k counts over the bigram row."""
    v, prior = self.config.vocab_size, self.config.prior
    context_bk = prev_bk * v + tokens_bk
    keys = self.context_keys
    # An unrolled binary search: a few fused gathers, no loop region per call.
    row_bk = jnp.minimum(jnp.searchsorted(keys, context_bk, method='scan_unrolled'),
                         keys.shape[0] - 1)
    found_bk = keys[row_bk] == context_bk
    counts_bkn = jnp.where(found_bk[..., None], self.next_counts[row_bk], 0.0)
    denom_bk1 = jnp.sum(counts_bkn, axis=-1, keepdims=True) + prior
    probs_bkv = jnp.exp(self.log_probs[tokens_bk]) * (prior / denom_bk1)
    rows, k = tokens_bk.shape
    flat_rv = probs_bkv.reshape(rows * k, v)
    flat_rv = flat_rv.at[jnp.arange(rows * k)[:, None], self.next_ids[row_bk].reshape(rows * k, -1)].add(
        (counts_bkn / denom_bk1).reshape(rows * k, -1))
    return jnp.log(flat_rv).reshape(rows, k, v)

  def encode(self, encoder_input_tokens, encoder_segment_ids=None, *,
             enable_dropout=True):
    del encoder_segment_ids, enable_dropout
    return jnp.zeros(encoder_input_tokens.shape + (1,), jnp.float32)

  def init_cache(self, encoded, encoder_input_tokens, max_decode_length):
    """Unigram and bigram keep no decoding state (an empty cache); the
    trigram keeps the tokens it was fed, [B, max_decode_length]."""
    del encoded
    if self.config.order == 3:
      self.put_variable('cache', 'decoded_tokens',
                        jnp.zeros((encoder_input_tokens.shape[0], max_decode_length), jnp.int32))

  def decode_step(self, decoder_input_tokens, decoder_positions, *,
                  enable_dropout=False):
    """Logits [B, k, V] for tokens [B, k] fed at positions [B] + 0..k-1.

    Like a self-attention cache, writes past the cache's length are dropped
    and positions before the first new one must hold the prefix.
    """
    del enable_dropout
    if self.config.order < 3:
      return self._logits(decoder_input_tokens)
    history_bl = self.get_variable('cache', 'decoded_tokens')
    rows, k = decoder_input_tokens.shape
    pos_bk = decoder_positions[:, None] + jnp.arange(k)
    row_ids = jnp.arange(rows)[:, None]
    # Position 0 (BOS) has no predecessor: context 0, as in `count_trigrams`.
    before_b = jnp.where(decoder_positions > 0,
                         history_bl[row_ids[:, 0], jnp.maximum(decoder_positions - 1, 0)], 0)
    prev_bk = jnp.concatenate([before_b[:, None], decoder_input_tokens[:, :-1]], axis=1)
    self.put_variable('cache', 'decoded_tokens',
                      history_bl.at[row_ids, pos_bk].set(decoder_input_tokens, mode='drop'))
    return self._logits(decoder_input_tokens, prev_bk)

  def __call__(self, encoder_input_tokens, decoder_input_tokens,
               decoder_target_tokens=None, encoder_segment_ids=None,
               decoder_segment_ids=None, *, enable_dropout=True, decode=False,
               **unused):
    del encoder_input_tokens, decoder_target_tokens, encoder_segment_ids
    del enable_dropout, unused
    if decode:
      raise ValueError('NgramLM.__call__ is teacher-forced; use decode_step.')
    # The token before each position, as decoding feeds it; a packed
    # segment's BOS has no predecessor (context 0), like position 0.
    prev_bt = jnp.pad(decoder_input_tokens, ((0, 0), (1, 0)))[:, :-1]
    if decoder_segment_ids is not None:
      prev_segment_bt = jnp.pad(decoder_segment_ids, ((0, 0), (1, 0)))[:, :-1]
      prev_bt = jnp.where(decoder_segment_ids != prev_segment_bt, 0, prev_bt)
    return self._logits(decoder_input_tokens, prev_bt)


def num_contexts(trigram: np.ndarray) -> int:
  """Distinct (prev, token) contexts in trigram counts [N, 4]: NgramConfig.num_contexts."""
  return len(np.unique(trigram[:, :2], axis=0)) if len(trigram) else 0


def save(directory: str, config: NgramConfig, unigram: np.ndarray,
         bigram: np.ndarray, extra: Optional[dict] = None,
         trigram: Optional[np.ndarray] = None) -> None:
  """Writes counts.npz, then config.json (with its sha256), atomically.

  A trigram (order 3) needs its counts [N, 4] (`count_trigrams`), with
  config.num_contexts = `num_contexts(trigram)`.
  """
  arrays = {'unigram': unigram, 'bigram': bigram}
  if config.order == 3:
    if trigram is None or num_contexts(trigram) != config.num_contexts:
      raise ValueError(f'an order-3 drafter needs its trigram counts with num_contexts(trigram) == '
                       f'config.num_contexts ({config.num_contexts}).')
    arrays['trigram'] = trigram
  buffer = io.BytesIO()
  np.savez_compressed(buffer, **arrays)
  data = buffer.getvalue()
  meta = {'ngram_config': dataclasses.asdict(config),
          fileio.FILES_FIELD: {COUNTS_FILE: fileio.sha256_hex(data)}}
  clash = set(extra or {}) & set(meta)
  if clash:
    raise ValueError(f'extra metadata may not replace {sorted(clash)}.')
  meta.update(extra or {})
  fileio.atomic_write(fileio.join(directory, COUNTS_FILE), data)
  fileio.write_json(fileio.join(directory, CONFIG_FILE), meta)


def is_ngram_dir(directory: str) -> bool:
  return fileio.exists(fileio.join(directory, COUNTS_FILE))


def _read_counts(path: str, data: bytes, config: NgramConfig
                 ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
  """(unigram [V], bigram [N, 3], trigram [M, 4] or None) from counts.npz bytes;
  ValueError if damaged or not fitting `config`."""
  vocab_size = config.vocab_size
  try:
    with np.load(io.BytesIO(data)) as counts:
      unigram, bigram = counts['unigram'], counts['bigram']
      trigram = counts['trigram'] if config.order == 3 else None
  except Exception as e:  # pylint: disable=broad-except  (zip / zlib / npy errors, a missing array)
    raise ValueError(f'{path}: damaged or truncated counts file ({e}).') from e
  if unigram.shape != (vocab_size,) or bigram.ndim != 2 or bigram.shape[1] != 3:
    raise ValueError(f'{path}: counts of shapes {unigram.shape} and {bigram.shape} do '
                     f'not fit vocab_size={vocab_size} (expected ({vocab_size},) and (N, 3)).')
  if bigram.size and (bigram[:, :2].min() < 0 or bigram[:, :2].max() >= vocab_size):
    raise ValueError(f'{path}: bigram ids outside [0, {vocab_size}).')
  if trigram is not None:
    if trigram.ndim != 2 or trigram.shape[1] != 4:
      raise ValueError(f'{path}: trigram counts of shape {trigram.shape}, expected (N, 4).')
    if trigram.size and (trigram[:, :3].min() < 0 or trigram[:, :3].max() >= vocab_size):
      raise ValueError(f'{path}: trigram ids outside [0, {vocab_size}).')
    if num_contexts(trigram) != config.num_contexts:
      raise ValueError(f'{path}: {num_contexts(trigram)} trigram contexts, but the config says '
                       f'num_contexts={config.num_contexts}.')
  return unigram, bigram, trigram


def load(directory: str) -> Tuple[NgramLM, dict]:
  """(module, params) for a saved n-gram drafter (counts.npz hash-checked)."""
  for name in (CONFIG_FILE, COUNTS_FILE):
    if not fileio.exists(fileio.join(directory, name)):
      raise FileNotFoundError(f'No {name} in {directory}.')
  config_path = fileio.join(directory, CONFIG_FILE)
  meta = fileio.read_json_object(config_path, kind='config file')
  try:
    config = NgramConfig(**meta['ngram_config'])
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{config_path}: no valid 'ngram_config' ({type(e).__name__}: "
                     f'{e}): not an n-gram drafter config, or a damaged one.') from e
  counts_path = fileio.join(directory, COUNTS_FILE)
  data = fileio.read_verified(counts_path, fileio.recorded_sha256(meta, COUNTS_FILE), CONFIG_FILE)
  unigram, bigram, trigram = _read_counts(counts_path, data, config)
  params = {'log_probs': jnp.asarray(log_prob_table(config, unigram, bigram))}
  if trigram is not None:
    keys, ids, counts = trigram_tables(config, trigram)
    params.update(context_keys=jnp.asarray(keys), next_ids=jnp.asarray(ids),
                  next_counts=jnp.asarray(counts))
  return NgramLM(config), params
