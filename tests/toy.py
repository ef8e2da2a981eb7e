"""A toy autoregressive model with an exact, enumerable sequence distribution.

The logits for the token after position t depend on the whole prefix through a
hash of the tokens the model has *in its cache* at positions 0..t. So a decode
loop that leaves a stale cache entry behind, feeds a token at the wrong
position or skips one gets a different distribution, which the statistical
tests see. The model follows the multi-token contract of `specdec.decoding`.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from specdec import decoding
from specdec import sampling

NUM_BUCKETS = 97


class ToyModel:
  """logits(prefix) = table[hash(prefix)], hash = Σ_s tokens[s] * w[s] mod 97."""

  def __init__(self, seed: int, vocab: int, cache_len: int, scale: float = 2.0,
               eos_bias: float = 0.0):
    rng = np.random.RandomState(seed)
    self.vocab = vocab
    self.cache_len = cache_len
    self.table = rng.normal(size=(NUM_BUCKETS, vocab)).astype(np.float32) * scale
    self.table[:, 1] += eos_bias
    # Position weights; weight 0 of position 0 keeps BOS out of the hash.
    self.weights = rng.randint(1, NUM_BUCKETS, size=(cache_len,)).astype(np.int32)

  def init_cache(self, batch: int):
    return {'tokens': jnp.zeros((batch, self.cache_len), jnp.int32),
            'calls': jnp.zeros((batch,), jnp.int32)}

  def tokens_to_logits(self, state: decoding.DecodingState):
    cur_index_b, cur_token_bk = state.cur_index, state.cur_token
    rows, k = cur_token_bk.shape
    pos_bk = cur_index_b[:, None] + jnp.arange(k)
    tokens_bl = state.cache['tokens'].at[jnp.arange(rows)[:, None], pos_bk].set(
        cur_token_bk, mode='drop')
    hash_bl = jnp.cumsum(tokens_bl * jnp.asarray(self.weights), axis=1) % NUM_BUCKETS
    hash_bk = jnp.take_along_axis(hash_bl, jnp.minimum(pos_bk, self.cache_len - 1),
                                  axis=1)
    logits_bkv = jnp.asarray(self.table)[hash_bk]
    new_cache = {'tokens': tokens_bl, 'calls': state.cache['calls'] + 1}
    return logits_bkv, new_cache

  def tokens_to_logits_and_features(self, state: decoding.DecodingState):
    """The feature-drafting target contract: (logits, features, cache).

    The feature of position t is one_hot(hash of the prefix through t): all
    a drafter needs to know the next logits exactly.
    """
    logits_bkv, new_cache = self.tokens_to_logits(state)
    rows, k = state.cur_token.shape
    pos_bk = state.cur_index[:, None] + jnp.arange(k)
    hash_bl = jnp.cumsum(new_cache['tokens'] * jnp.asarray(self.weights), axis=1) % NUM_BUCKETS
    hash_bk = jnp.take_along_axis(hash_bl, jnp.minimum(pos_bk, self.cache_len - 1), axis=1)
    return logits_bkv, jax.nn.one_hot(hash_bk, NUM_BUCKETS), new_cache

  def single_token_fn(self, state):
    """T5X's single-token shape: logits [B, V]."""
    logits, cache = self.tokens_to_logits(state)
    return logits[:, 0], cache

  def prefix_logits(self, prefix):
    """Logits after the token sequence `prefix` (prefix[0] = BOS)."""
    h = int(np.sum(np.asarray(prefix) * self.weights[:len(prefix)]) % NUM_BUCKETS)
    return self.table[h]


def exact_distribution(model: ToyModel, length: int, eos_id: int = 1,
                       temperature=1.0, topk=0, topp=0.0):
  """{output tuple of `length` tokens: probability} of sampling from `model`."""
  dist = {}

  def recurse(prefix, prob):
    if len(prefix) == length + 1 or (len(prefix) > 1 and prefix[-1] == eos_id):
      out = tuple(prefix[1:]) + (0,) * (length + 1 - len(prefix))
      dist[out] = dist.get(out, 0.0) + prob
      return
    logp = np.asarray(sampling.adjusted_log_probs(
        jnp.asarray(model.prefix_logits(prefix)), temperature, topk, topp))
    for tok in range(model.vocab):
      if logp[tok] > -np.inf:
        recurse(prefix + [tok], prob * float(np.exp(logp[tok])))

  recurse([0], 1.0)
  return dist


def chi_square_pvalue(samples, dist, min_expected=5.0):
  """Pearson chi-square p-value of `samples` (rows of tokens) against `dist`.

  Outcomes with small expected counts are pooled into one cell, so the
  asymptotic distribution holds.
  """
  from scipy import stats  # pylint: disable=g-import-not-at-top
  n = len(samples)
  counts = {}
  for row in map(tuple, np.asarray(samples)):
    counts[row] = counts.get(row, 0) + 1
  unknown = sum(c for k, c in counts.items() if k not in dist)
  if unknown:
    return 0.0  # A sequence with zero probability was sampled.
  total = sum(dist.values())  # 1 up to float32 rounding.
  observed, expected, pooled_obs, pooled_exp = [], [], 0, 0.0
  for outcome, prob in dist.items():
    prob /= total
    if prob * n >= min_expected:
      observed.append(counts.get(outcome, 0))
      expected.append(prob * n)
    else:
      pooled_obs += counts.get(outcome, 0)
      pooled_exp += prob * n
  if pooled_exp > 0:
    observed.append(pooled_obs)
    expected.append(pooled_exp)
  return float(stats.chisquare(observed, expected).pvalue)


def all_sequences(vocab, length):
  return itertools.product(range(vocab), repeat=length)


class ToyFeatureDrafter:
  """A drafter in the feature-drafting contract, for a `ToyModel` target.

  Entry p reads (f_{p-1}, x_p) and predicts f_p = one_hot(h_p), h_p =
  (argmax f_{p-1} + x_p * w_p) mod 97: the target's own prefix hash when f_{p-1}
  is the target's feature (or its own exact prediction). It also keeps the
  tokens it was fed in its cache and checks them: where the cached prefix
  does not hash to h_p (a stale entry, a token fed at the wrong position) or
  f_{p-1} is not a true feature, its logits are wrong.

  `exact=True`: logits = the target's at h_p, so q = p and every draft is
  accepted when the loop hands it the right features and rolls its cache
  back. Otherwise the logits are a blend with its own table (q != p, for
  distribution tests).
  """

  def __init__(self, target: ToyModel, seed: int = 0, exact: bool = True, noise: float = 1.0):
    rng = np.random.RandomState(seed)
    self.target = target
    self.exact = exact
    self.table = (0.5 * target.table +
                  noise * rng.normal(size=target.table.shape).astype(np.float32))

  def init_cache(self, batch: int):
    return {'tokens': jnp.zeros((batch, self.target.cache_len), jnp.int32)}

  def tokens_to_logits(self, state: decoding.DecodingState, features_bke):
    target = self.target
    rows, k = state.cur_token.shape
    pos_bk = state.cur_index[:, None] + jnp.arange(k)
    tokens_bl = state.cache['tokens'].at[jnp.arange(rows)[:, None], pos_bk].set(
        state.cur_token, mode='drop')
    weights = jnp.asarray(target.weights)
    clipped_bk = jnp.minimum(pos_bk, target.cache_len - 1)
    # Each entry: the hash from its input feature, chained through the block
    # (entry j+1 of a block reads entry j's prediction only when the caller
    # feeds it; here each entry reads its own given feature).
    h_prev_bk = jnp.argmax(features_bke, axis=-1)
    valid_bk = jnp.max(features_bke, axis=-1) > 0.5
    h_bk = (h_prev_bk + state.cur_token * weights[clipped_bk]) % NUM_BUCKETS
    cached_bl = jnp.cumsum(tokens_bl * weights, axis=1) % NUM_BUCKETS
    cached_bk = jnp.take_along_axis(cached_bl, clipped_bk, axis=1)
    # No feature precedes BOS: position 0 reads zeros.
    ok_bk = (h_bk == cached_bk) & (valid_bk | (pos_bk == 0))
    table = jnp.asarray(target.table if self.exact else self.table)
    logits_bkv = jnp.where(ok_bk[..., None], table[h_bk], table[(h_bk + 1) % NUM_BUCKETS])
    return logits_bkv, jax.nn.one_hot(h_bk, NUM_BUCKETS), {'tokens': tokens_bl}


class ToyTreeModel(ToyModel):
  """A `ToyModel` that also decodes a draft tree's nodes (`DecodingState.layout`).

  It keeps the tokens it was fed in a cache leaf named `cached_key` ([B, L, 1, 1]), one per slot, so a tree
  decode moves them as it moves a network's keys. The logits of a token are the table's row at the hash of what
  the token attends to: Σ token[slot] * w[position held by the slot] over its visible slots (its layout's, or every
  slot up to its position). So a node that saw the wrong ancestors, a slot left stale or not moved back gives
  other logits, and the statistical tests see it.
  """

  def init_cache(self, batch: int):
    return {'cached_key': jnp.zeros((batch, self.cache_len, 1, 1), jnp.int32)}

  def tokens_to_logits(self, state: decoding.DecodingState):
    _, hash_bk, tokens_bl = self._layout_hash(state)
    return jnp.asarray(self.table)[hash_bk], {'cached_key': tokens_bl[..., None, None]}

  def _layout_hash(self, state: decoding.DecodingState):
    """(positions [B, k], the hash of what each token attends to [B, k], the new token cache [B, L])."""
    rows, k = state.cur_token.shape
    length = self.cache_len
    layout = state.layout
    if layout is None:
      positions_bk = state.cur_index[:, None] + jnp.arange(k)
      slots_bk, key_positions_bl = positions_bk, jnp.broadcast_to(jnp.arange(length), (rows, length))
      attend_bkl = jnp.arange(length)[None, None, :] <= positions_bk[:, :, None]
    else:
      positions_bk, slots_bk = layout.positions_bk, layout.slots_bk
      attend_bkl, key_positions_bl = layout.attend_bkl, layout.key_positions_bl
    tokens_bl = state.cache['cached_key'][..., 0, 0].at[jnp.arange(rows)[:, None], slots_bk].set(
        state.cur_token, mode='drop')
    weights_bl = jnp.asarray(self.weights)[jnp.clip(key_positions_bl, 0, length - 1)]
    hash_bk = jnp.sum(jnp.where(attend_bkl, (tokens_bl * weights_bl)[:, None, :], 0), axis=-1) % NUM_BUCKETS
    return positions_bk, hash_bk, tokens_bl

  def tokens_to_logits_and_features(self, state: decoding.DecodingState):
    """The feature-drafting target contract, with or without a layout: features one_hot(hash)."""
    _, hash_bk, tokens_bl = self._layout_hash(state)
    return (jnp.asarray(self.table)[hash_bk], jax.nn.one_hot(hash_bk, NUM_BUCKETS),
            {'cached_key': tokens_bl[..., None, None]})


class ToyTreeFeatureDrafter(ToyFeatureDrafter):
  """`ToyFeatureDrafter` for a `ToyTreeModel` target that also drafts a tree's nodes (`DecodingState.layout`).

  Entry p reads (f_{p-1}, x_p) and predicts h_p = (argmax f_{p-1} + x_p * w[position]) mod 97; it checks h_p
  against the hash of the tokens it attends to in its own cache (its layout's slots). With `exact=True` its
  logits are the target's at h_p where both agree and f_{p-1} is a true feature, so a loop that hands each node
  its parent's feature and keeps the cache right has every draft the target would make accepted.
  """

  def init_cache(self, batch: int):
    return {'cached_key': jnp.zeros((batch, self.target.cache_len, 1, 1), jnp.int32)}

  def tokens_to_logits(self, state: decoding.DecodingState, features_bke):
    target = self.target
    positions_bk, cached_bk, tokens_bl = ToyTreeModel._layout_hash(target, state)  # pylint: disable=protected-access
    weights = jnp.asarray(target.weights)
    h_bk = (jnp.argmax(features_bke, axis=-1) +
            state.cur_token * weights[jnp.clip(positions_bk, 0, target.cache_len - 1)]) % NUM_BUCKETS
    valid_bk = jnp.max(features_bke, axis=-1) > 0.5
    ok_bk = (h_bk == cached_bk) & (valid_bk | (positions_bk == 0))
    table = jnp.asarray(target.table if self.exact else self.table)
    logits_bkv = jnp.where(ok_bk[..., None], table[h_bk], table[(h_bk + 1) % NUM_BUCKETS])
    return logits_bkv, jax.nn.one_hot(h_bk, NUM_BUCKETS), {'cached_key': tokens_bl[..., None, None]}
