"""A drafter of controlled acceptance: a measuring instrument, not a drafter for users.

`OracleDrafter` knows the target's greedy decode of every row (computed once by the baseline and handed in
with the batch's params) and, at each position, proposes the target's greedy token with probability α* and a
wrong token otherwise. Whether a position's proposal is right is drawn from a seeded integer hash of (example
id, position), independently per (row, position): under greedy decoding every position is drafted at most
once, so the accepted drafts follow Section 3.1's model exactly (each draft accepted i.i.d. with probability
α*), and the loop can be measured against α* instead of against whatever a trained drafter happens to reach.

The target still verifies every draft, so the outputs are the baseline's, token for token. Greedy only: at
temperature > 0 the target's prefix is sampled, the stored greedy decode is not its argmax any more, and
the acceptance is no longer controlled.

It has the drafter interface (`encode`, `init_cache`, `decode_step`, `config.vocab_size`) and no saved form:
`checkpoints` cannot load it and `benchmark.run` refuses it, so its rows appear only in reports that say
"controlled acceptance" (`specdec/bench/ceiling.py`). Its call is a lookup, as an n-gram table's is.

Params (`oracle_params`): `greedy_decodes` [B, L] int32 (the target's greedy decode per row, 0 after EOS),
`example_ids` [B] int32 (seeds each row's draws; the same example gets the same draws at any batch size),
`accept_prob` [] float32 (α*) and `seed` [] int32. `init_cache` copies the per-row arrays into the cache, so
they follow their rows when a shrinking batch drops ended rows.
"""

import dataclasses
from typing import Optional

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

# Odd 32-bit constants of the mix below (murmur3's finaliser and golden-ratio multipliers).
_GOLDEN, _MIX_A, _MIX_B = 0x9E3779B1, 0x85EBCA6B, 0xC2B2AE35
_EXAMPLE_MUL, _POSITION_MUL, _WRONG_SALT = 0x27D4EB2F, 0x165667B1, 0x5BD1E995


@dataclasses.dataclass(frozen=True)
class OracleConfig:
  vocab_size: int

  def __post_init__(self):
    if self.vocab_size < 2:
      raise ValueError(f'OracleConfig.vocab_size must be >= 2 (a wrong token must exist), got '
                       f'{self.vocab_size!r}.')


def _mix(h):
  """murmur3's 32-bit finaliser: every input bit flips about half of the output bits."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(_MIX_A)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(_MIX_B)
  return h ^ (h >> 16)


def draw_bits(seed, example_ids, positions):
  """Two independent uint32 hashes of (seed, example id, position), broadcast over the ids and positions."""
  h = (jnp.asarray(seed).astype(jnp.uint32) * jnp.uint32(_GOLDEN)
       + jnp.asarray(example_ids).astype(jnp.uint32) * jnp.uint32(_EXAMPLE_MUL)
       + jnp.asarray(positions).astype(jnp.uint32) * jnp.uint32(_POSITION_MUL))
  first = _mix(_mix(h))
  return first, _mix(first ^ jnp.uint32(_WRONG_SALT))


def proposals(greedy_bk, example_ids_b, positions_bk, accept_prob, seed, vocab_size: int):
  """The oracle's proposal for each (row, decode position): (tokens [B, k], right [B, k] bool).

  `right` is u < α* with u uniform on [0, 1) from 24 hash bits (so α* = 1 is always right, α* = 0 never);
  a wrong proposal is greedy + 1 + (another hash mod V-1), modulo V: never the greedy token.
  """
  bits_u, bits_w = draw_bits(seed, example_ids_b[:, None], positions_bk)
  u = (bits_u >> 8).astype(jnp.float32) / jnp.float32(1 << 24)
  right = u < jnp.asarray(accept_prob, jnp.float32)
  offset = 1 + (bits_w % jnp.uint32(vocab_size - 1)).astype(jnp.int32)
  wrong = (greedy_bk + offset) % vocab_size
  return jnp.where(right, greedy_bk, wrong), right


class OracleDrafter(nn.Module):
  """Proposes the target's greedy token with probability α*: logits 0 there, -1e9 elsewhere."""
  config: OracleConfig

  def _param(self, name):
    # Read, not declared with `self.param`: the shapes are the batch's, set by `oracle_params`.
    if not self.has_variable('params', name):
      raise ValueError(f'the oracle has no {name!r} param: build its params with oracle.oracle_params.')
    return self.get_variable('params', name)

  def encode(self, encoder_input_tokens, encoder_segment_ids=None, *, enable_dropout=True):
    del encoder_segment_ids, enable_dropout
    return jnp.zeros(encoder_input_tokens.shape + (1,), jnp.float32)

  def init_cache(self, encoded, encoder_input_tokens, max_decode_length):
    """The rows' greedy decodes [B, max_decode_length] and example ids [B], as per-row cache entries."""
    del encoded
    rows = encoder_input_tokens.shape[0]
    decodes, example_ids = self._param('greedy_decodes'), self._param('example_ids')
    if decodes.shape != (rows, max_decode_length) or example_ids.shape != (rows,):
      raise ValueError(
          f'the oracle holds greedy decodes of shape {tuple(decodes.shape)} and example ids of shape '
          f'{tuple(example_ids.shape)}, but the batch has {rows} rows of decode length '
          f'{max_decode_length}: build its params from this batch (oracle.oracle_params).')
    self.put_variable('cache', 'greedy_decodes', decodes)
    self.put_variable('cache', 'example_ids', example_ids)

  def decode_step(self, decoder_input_tokens, decoder_positions, *, enable_dropout=False):
    """Logits [B, k, V] for tokens [B, k] fed at positions [B] + 0..k-1: feeding position p proposes decode
    position p (the token after it), as every decoder here does."""
    del enable_dropout
    greedy_bl = self.get_variable('cache', 'greedy_decodes')
    example_ids_b = self.get_variable('cache', 'example_ids')
    k = decoder_input_tokens.shape[1]
    positions_bk = decoder_positions[:, None] + jnp.arange(k)
    greedy_bk = jnp.take_along_axis(greedy_bl, jnp.minimum(positions_bk, greedy_bl.shape[1] - 1), axis=1)
    tokens_bk, _ = proposals(greedy_bk, example_ids_b, positions_bk, self._param('accept_prob'),
                             self._param('seed'), self.config.vocab_size)
    vocab_v = jnp.arange(self.config.vocab_size, dtype=jnp.int32)
    return jnp.where(vocab_v == tokens_bk[..., None], 0.0, -1e9).astype(jnp.float32)

  def __call__(self, *args, **kwargs):
    raise ValueError('the oracle drafter only decodes (decode_step); it has nothing to train or score.')


def oracle_params(greedy_decodes_bl, accept_prob: float, example_ids_b: Optional[np.ndarray] = None,
                  seed: int = 0) -> dict:
  """The oracle's params for one batch: its rows' greedy decodes [B, L] (the baseline's, at temperature 0),
  the acceptance rate α* in [0, 1], each row's example id (default 0..B-1) and the draws' seed."""
  decodes = np.asarray(greedy_decodes_bl)
  if decodes.ndim != 2 or not np.issubdtype(decodes.dtype, np.integer):
    raise ValueError(f'greedy_decodes must be an integer array [B, L], got {decodes.dtype} {decodes.shape}.')
  if not 0.0 <= float(accept_prob) <= 1.0:
    raise ValueError(f'accept_prob (α*) must lie in [0, 1], got {accept_prob!r}.')
  ids = np.arange(decodes.shape[0]) if example_ids_b is None else np.asarray(example_ids_b)
  if ids.shape != (decodes.shape[0],):
    raise ValueError(f'example_ids must have one id per row ({decodes.shape[0]}), got shape {ids.shape}.')
  return {'greedy_decodes': jnp.asarray(decodes, jnp.int32), 'example_ids': jnp.asarray(ids, jnp.int32),
          'accept_prob': jnp.asarray(accept_prob, jnp.float32), 'seed': jnp.asarray(seed, jnp.int32)}
