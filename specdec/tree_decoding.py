"""Speculative decoding with a static draft TREE: several candidates per position, verified in one target call.

Each round, from the last committed token x_i (the root, node 0):

1. The drafter drafts the tree level by level: one call on [x_{i-1}, x_i] (its catch-up, as the chain's) gives q
   at the root; each level's nodes are then fed in one call (`draft_tree.tree_layout`: node j at position
   i + depth_j, its key/value at cache slot i + j, attending to the prefix and its ancestors), which gives q at
   each of them; the children of a node are drawn from q there (`draft_tree.draw_children`: the top-k at
   temperature 0, by the sibling rule otherwise). A tree of depth D costs the drafter D calls, as a chain of γ = D.
2. The target scores every node in ONE call of n tokens (the tree's layout, all nodes).
3. `draft_tree.verify_tree_greedy` (argmax: the baseline's tokens) or `draft_tree.verify_tree` (recursive
   rejection over siblings: the target's distribution exactly) walks down the tree: the accepted path and one more
   token.
4. The accepted path is committed; its keys and values move, in both caches, from the tree's slots i + path[d] to
   their positions i + 1 + d (`move_cache_slots`), so that the caches again hold the prefix position by position.

A node whose cache slot i + j lies past the cache is never accepted (its key could not be written), so near the
end of a short cache the tree is cut, never wrong; `models.SpeculativeEncoderDecoderModel` makes the caches
`extra_cache_slots` longer, so that no node is cut.

The drafter must take a `SlotLayout` in its decode step: a T5 network, or a feature head (EAGLE's setting, where
trees came from: each node drafted from its parent's predicted feature, `draft_reads_features=True`). A chain is the tree `static_tree((), γ)`; the tree decode then keeps the chain's
outputs (greedy: token for token). Decoder prompts are not taken (a row's given tokens would have to be forced
through the tree): `inputs` must be zero past BOS.
"""

import dataclasses
import functools
import inspect
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import flax
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from specdec import batch_shrink
from specdec import decoding
from specdec import draft_tree
from specdec import sampling

PyTree = Any
# The self-attention cache leaves that hold one key/value per decode position ([.., B, L, H, D], batch at the
# cache's batch axis, length right after it): the T5X names, which `network.py` keeps.
POSITION_CACHE_LEAVES = ('cached_key', 'cached_value')


@flax.struct.dataclass
class TreeLoopState:
  """State of `tree_speculative_sample`'s loop (see `decoding.SpeculativeLoopState` for the shared fields).

  Attributes:
    cur_index: [B] position of each row's last committed token (the next round's root); both caches hold every
      position before it.
    sequences: [B, L+D+2] committed tokens (position 0 = BOS).
    max_len_b: [B] the last position each row may fill.
    target_cache, draft_cache: the two models' caches.
    ended: [B] rows that emitted EOS or reached their length limit.
    generated: [B, L+D+2] positions holding generated tokens.
    rng: PRNG key (unused at temperature 0).
    log_prob: [B] log-probability of the generated tokens under adjusted p.
    stats: per-row counters, {} unless requested: `target_calls`, `accepted` (drafts kept), `emitted`,
      `accepted_at` [B, D] (how often a draft was kept at depth d+1).
    draft_features: [B, D+1, E] feature drafting only (else None): the target's features of positions
      feature_start .. feature_start+D along the last round's accepted path (zeros before the first round).
    feature_start: [B] feature drafting only: the last round's root position (-1 before the first).
  """
  cur_index: jax.Array
  sequences: jax.Array
  max_len_b: jax.Array
  target_cache: PyTree
  draft_cache: PyTree
  ended: jax.Array
  generated: jax.Array
  rng: jax.Array
  log_prob: jax.Array
  stats: Mapping[str, jax.Array]
  draft_features: Optional[jax.Array] = None
  feature_start: Optional[jax.Array] = None


@dataclasses.dataclass(frozen=True)
class TreeSpec:
  """The static settings of one tree decode.

  Attributes:
    shape: the draft tree.
    rule: how siblings are drawn at temperature > 0 (`draft_tree.RULES`); at temperature 0 the children of a
      node are the drafter's top-k ('fixed').
    target_length, draft_length: the two caches' lengths (slots).
    fast_greedy (derived): argmax decoding known at trace time.
  """
  shape: draft_tree.TreeShape
  eos_id: int
  tokens_to_logits: decoding.TokensToLogits
  draft_tokens_to_logits: decoding.TokensToLogits
  target_length: int
  draft_length: int
  temperature: Any = 1.0
  topk: int = 0
  topp: Any = 0.0
  rule: str = 'without_replacement'
  rescale_log_probs: bool = True
  return_stats: bool = False
  draft_reads_features: bool = False
  fast_greedy: bool = dataclasses.field(init=False)

  def __post_init__(self):
    object.__setattr__(self, 'fast_greedy', sampling.static_greedy(self.temperature))

  @property
  def levels(self) -> Tuple[Tuple[int, ...], ...]:
    """The node numbers at each depth 0..D."""
    depth = self.shape.depth
    return tuple(tuple(int(i) for i in np.flatnonzero(depth == d)) for d in range(self.shape.max_depth + 1))

  def adjust(self, logits_xv: jax.Array) -> jax.Array:
    return sampling.adjusted_log_probs(logits_xv, self.temperature, self.topk, self.topp)


def move_cache_slots(cache: PyTree, from_bd: jax.Array, to_bd: jax.Array, move_bd: jax.Array,
                     cache_offset: int = 0) -> PyTree:
  """Copies each row's keys/values from slots from_bd to slots to_bd where move_bd (POSITION_CACHE_LEAVES).

  All sources are read before any destination is written, so a slot may be both (a path node that is already in
  place, or one that another moves into).
  """
  def move(path, leaf):
    key = getattr(path[-1], 'key', getattr(path[-1], 'name', None))
    if key not in POSITION_CACHE_LEAVES or jnp.ndim(leaf) != 4 + cache_offset:
      return leaf
    # [.., B, L, H, D] -> [B, L, .., H, D]
    x = jnp.moveaxis(leaf, (cache_offset, cache_offset + 1), (0, 1)) if cache_offset else leaf
    rows_b1 = jnp.arange(x.shape[0])[:, None]
    length = x.shape[1]
    values = x[rows_b1, jnp.clip(from_bd, 0, length - 1)]
    x = x.at[rows_b1, jnp.where(move_bd, to_bd, length)].set(values, mode='drop')
    return jnp.moveaxis(x, (0, 1), (cache_offset, cache_offset + 1)) if cache_offset else x

  return jax.tree_util.tree_map_with_path(move, cache)


class TreeDrafts(flax.struct.PyTreeNode):
  """What the draft phase hands to verification: tokens_bn (node 0 the root), valid_bn (nodes that exist and
  fit the caches), logq_bnv (the drafter's adjusted log q at each node; None at temperature 0) and its cache."""
  tokens_bn: jax.Array
  valid_bn: jax.Array
  logq_bnv: Optional[jax.Array]
  cache: PyTree


def _draw(spec: TreeSpec, logits_bv: jax.Array, k: int, rng: Optional[jax.Array]
          ) -> Tuple[jax.Array, jax.Array, Optional[jax.Array]]:
  """k children of a node: (tokens [B, k], valid [B, k], adjusted log q [B, V] or None)."""
  if spec.fast_greedy:
    tokens_bk = lax.top_k(logits_bv, k)[1].astype(jnp.int32)
    return tokens_bk, jnp.ones(tokens_bk.shape, bool), None
  logq_bv = spec.adjust(logits_bv)
  tokens_bk, valid_bk = draft_tree.draw_children(rng, logq_bv, k, spec.rule)
  return tokens_bk, valid_bk, logq_bv


def draft_phase(spec: TreeSpec, state: TreeLoopState, rng: Optional[jax.Array]) -> TreeDrafts:
  """The drafter's D calls: the tree's tokens, level by level (module docstring, step 1)."""
  shape, levels = spec.shape, spec.levels
  i_b = state.cur_index
  rows, n = i_b.shape[0], shape.num_nodes
  node_features = {}
  if spec.draft_reads_features:
    # A feature head re-reads the last round's accepted path with the target's true features: entries
    # s+1 .. s+D+1 (s the last root), each token with the feature of the position before it; the entry at i
    # (offset i-s-1 <= D) is the root's. Entries past i are stale and rewritten by the level calls before any
    # node reads them.
    depth = shape.max_depth
    start_b = state.feature_start + 1
    window_bk = jnp.take_along_axis(state.sequences, start_b[:, None] + jnp.arange(depth + 1), axis=1)
    logits_bkv, features_bke, cache = spec.draft_tokens_to_logits(decoding.DecodingState(
        cur_index=start_b, sequences=state.sequences, cur_token=window_bk, cache=state.draft_cache),
        state.draft_features)
    at_b11 = jnp.clip(i_b - start_b, 0, depth)[:, None, None]
    node_features[0] = jnp.take_along_axis(features_bke, at_b11, axis=1)[:, 0].astype(state.draft_features.dtype)
  else:
    # Catch-up on [x_{i-1}, x_i]: position i-1 may be the last round's leaf, which no level call fed.
    start_b = jnp.maximum(i_b - 1, 0)
    window_bk = jnp.take_along_axis(state.sequences, start_b[:, None] + jnp.arange(2), axis=1)
    logits_bkv, cache = spec.draft_tokens_to_logits(decoding.DecodingState(
        cur_index=start_b, sequences=state.sequences, cur_token=window_bk, cache=state.draft_cache))
    at_b11 = (i_b - start_b)[:, None, None]
  cache = decoding.freeze_like(cache, state.draft_cache)
  node_logits = {0: jnp.take_along_axis(logits_bkv, at_b11, axis=1)[:, 0]}
  root_b = jnp.take_along_axis(state.sequences, i_b[:, None], axis=1)[:, 0]
  tokens_bn = jnp.zeros((rows, n), jnp.int32).at[:, 0].set(root_b)
  slots_fit_bn = i_b[:, None] + jnp.arange(n)[None] < min(spec.target_length, spec.draft_length)
  valid_bn = slots_fit_bn
  logq = {}
  parents = [int(p) for p in range(n) if shape.children[p, 0] >= 0]
  rngs = None if rng is None else jax.random.split(rng, max(len(parents), 1))
  for d in range(1, len(levels)):
    for parent in levels[d - 1]:
      kids = [int(c) for c in shape.children[parent] if c >= 0]
      if not kids:
        continue
      rng_p = None if rngs is None else rngs[parents.index(parent)]
      tokens_bk, valid_bk, logq_bv = _draw(spec, node_logits[parent], len(kids), rng_p)
      tokens_bn = tokens_bn.at[:, kids].set(tokens_bk)
      valid_bn = valid_bn.at[:, kids].set(valid_bn[:, kids] & valid_bk & valid_bn[:, parent:parent + 1])
      logq[parent] = logq_bv
    if d < len(levels) - 1:  # the deepest level's q is never needed
      level = levels[d]
      layout = draft_tree.tree_layout(shape, i_b, spec.draft_length, level)
      call_state = decoding.DecodingState(cur_index=i_b, sequences=state.sequences,
                                          cur_token=tokens_bn[:, list(level)], cache=cache, layout=layout)
      if spec.draft_reads_features:  # each node with its parent's predicted feature
        parents_bme = jnp.stack([node_features[int(shape.parent[node])] for node in level], axis=1)
        logits_bmv, predicted_bme, cache = spec.draft_tokens_to_logits(call_state, parents_bme)
        for m, node in enumerate(level):
          node_features[node] = predicted_bme[:, m].astype(parents_bme.dtype)
      else:
        logits_bmv, cache = spec.draft_tokens_to_logits(call_state)
      cache = decoding.freeze_like(cache, state.draft_cache)
      for m, node in enumerate(level):
        node_logits[node] = logits_bmv[:, m]
  logq_bnv = None
  if not spec.fast_greedy:
    some = next(iter(logq.values()))
    # Leaves' rows are never read (no children to verify there).
    logq_bnv = jnp.stack([logq.get(node, jnp.zeros_like(some)) for node in range(n)], axis=1)
  return TreeDrafts(tokens_bn=tokens_bn, valid_bn=valid_bn, logq_bnv=logq_bnv, cache=cache)


def verify_phase(spec: TreeSpec, state: TreeLoopState, drafts: TreeDrafts
                 ) -> Tuple[jax.Array, PyTree, Optional[jax.Array]]:
  """ONE target call over every node of the tree: (logits [B, n, V], its cache, its features [B, n, E] with
  feature drafting, else None)."""
  layout = draft_tree.tree_layout(spec.shape, state.cur_index, spec.target_length)
  call_state = decoding.DecodingState(cur_index=state.cur_index, sequences=state.sequences,
                                      cur_token=drafts.tokens_bn, cache=state.target_cache, layout=layout)
  features_bne = None
  if spec.draft_reads_features:
    logits_bnv, features_bne, cache = spec.tokens_to_logits(call_state)
    features_bne = features_bne.astype(state.draft_features.dtype)
  else:
    logits_bnv, cache = spec.tokens_to_logits(call_state)
  return logits_bnv, decoding.freeze_like(cache, state.target_cache), features_bne


def accept_phase(spec: TreeSpec, drafts: TreeDrafts, logits_bnv: jax.Array, rng: Optional[jax.Array]
                 ) -> Tuple[draft_tree.TreeVerdict, Optional[jax.Array]]:
  """The walk down the tree: (TreeVerdict, adjusted log p [B, n, V] or None at temperature 0)."""
  if spec.fast_greedy:
    return draft_tree.verify_tree_greedy(spec.shape, drafts.tokens_bn, logits_bnv, drafts.valid_bn), None
  logp_bnv = spec.adjust(logits_bnv)
  logq_bnv = drafts.logq_bnv if spec.rule != 'fixed' else None
  return draft_tree.verify_tree(rng, spec.shape, drafts.tokens_bn, logq_bnv, logp_bnv, drafts.valid_bn,
                                spec.rule), logp_bnv


def commit_phase(spec: TreeSpec, state: TreeLoopState, drafts: TreeDrafts, verdict: draft_tree.TreeVerdict,
                 logits_bnv: jax.Array, logp_bnv: Optional[jax.Array], target_cache: PyTree, rng: jax.Array,
                 cache_offset: int, draft_cache_offset: int,
                 target_features_bne: Optional[jax.Array] = None) -> TreeLoopState:
  """Writes the accepted path and the next token, moves the path's keys/values to their positions, advances."""
  depth = spec.shape.max_depth
  i_b, n_b = state.cur_index, verdict.num_accepted_b
  steps_k = jnp.arange(depth + 1)
  pos_bk = i_b[:, None] + 1 + steps_k
  row_ids = jnp.arange(i_b.shape[0])[:, None]
  old_bk = state.sequences[row_ids, pos_bk]
  cand_bk = jnp.where(steps_k < n_b[:, None], jnp.pad(verdict.tokens_bd, ((0, 0), (0, 1))),
                      verdict.next_token_b[:, None])
  active_b = ~state.ended
  in_budget_bk = (steps_k <= n_b[:, None]) & (pos_bk <= state.max_len_b[:, None])
  is_eos_bk = in_budget_bk & (cand_bk == spec.eos_id)
  before_eos_bk = (jnp.cumsum(is_eos_bk, axis=1) - is_eos_bk) == 0
  write_bk = in_budget_bk & before_eos_bk & active_b[:, None]
  sequences = state.sequences.at[row_ids, pos_bk].set(jnp.where(write_bk, cand_bk, old_bk))
  generated = state.generated.at[row_ids, pos_bk].set(state.generated[row_ids, pos_bk] | write_bk)

  log_prob = state.log_prob
  if not (spec.fast_greedy and spec.rescale_log_probs):  # argmax one-hots score 0
    score_bnv = logp_bnv if spec.rescale_log_probs else jax.nn.log_softmax(logits_bnv.astype(jnp.float32))
    # Token k of the round is scored at the node that predicted it: the root, then the path's nodes.
    nodes_bk = jnp.maximum(jnp.concatenate([jnp.zeros_like(n_b)[:, None], verdict.path_bd], axis=1), 0)
    score_bkv = jnp.take_along_axis(score_bnv, nodes_bk[:, :, None], axis=1)
    log_prob = log_prob + jnp.sum(jnp.where(write_bk, sampling.token_log_prob(score_bkv, cand_bk), 0.0), axis=1)

  # The path's keys/values, written at slots i + node, move to positions i + 1 + d.
  move_bd = (verdict.path_bd >= 0) & active_b[:, None]
  from_bd = i_b[:, None] + jnp.maximum(verdict.path_bd, 0)
  to_bd = pos_bk[:, :depth]
  target_cache = move_cache_slots(target_cache, from_bd, to_bd, move_bd, cache_offset)
  draft_cache = move_cache_slots(drafts.cache, from_bd, to_bd, move_bd, draft_cache_offset)

  hit_eos_b = jnp.any(is_eos_bk & write_bk, axis=1)
  new_i_b = jnp.where(active_b, jnp.minimum(i_b + n_b + 1, state.max_len_b), i_b)
  ended = state.ended | hit_eos_b | (new_i_b >= state.max_len_b)
  features = {}
  if spec.draft_reads_features:  # the target's features along the root and the accepted path
    nodes_bk = jnp.maximum(jnp.concatenate([jnp.zeros_like(n_b)[:, None], verdict.path_bd], axis=1), 0)
    features = dict(draft_features=jnp.take_along_axis(target_features_bne, nodes_bk[:, :, None], axis=1),
                    feature_start=i_b)
  stats = state.stats
  if spec.return_stats:
    kept_bd = write_bk[:, :depth] & (steps_k[:depth] < n_b[:, None])
    stats = dict(target_calls=stats['target_calls'] + active_b,
                 accepted=stats['accepted'] + jnp.sum(kept_bd, axis=1),
                 emitted=stats['emitted'] + jnp.sum(write_bk, axis=1),
                 accepted_at=stats['accepted_at'] + kept_bd)
  return state.replace(cur_index=new_i_b, sequences=sequences, target_cache=target_cache,
                       draft_cache=draft_cache, ended=ended, generated=generated, rng=rng,
                       log_prob=log_prob, stats=stats, **features)


def tree_step(spec: TreeSpec, cache_offset: int, draft_cache_offset: int, state: TreeLoopState) -> TreeLoopState:
  """One round: draft the tree, verify it in one call, walk it, commit."""
  if spec.fast_greedy:
    rng = draft_rng = accept_rng = None
  else:
    rng, draft_rng, accept_rng = jax.random.split(state.rng, 3)
  with jax.named_scope('draft_phase'):
    drafts = draft_phase(spec, state, draft_rng)
  with jax.named_scope('verify_phase'):
    logits_bnv, target_cache, features_bne = verify_phase(spec, state, drafts)
  with jax.named_scope('accept_phase'):
    verdict, logp_bnv = accept_phase(spec, drafts, logits_bnv, accept_rng)
  with jax.named_scope('commit_phase'):
    return commit_phase(spec, state, drafts, verdict, logits_bnv, logp_bnv, target_cache,
                        state.rng if rng is None else rng, cache_offset, draft_cache_offset, features_bne)


def _check_takes_layout(tokens_to_logits, cache, shape: draft_tree.TreeShape, sequences_shape, length: int,
                        name: str, features_in: Optional[jax.ShapeDtypeStruct] = None) -> None:
  """Abstractly evaluates one call over the whole tree (no cost); ValueError naming the model if it fails.
  `features_in` [B, n, E]: the call's second argument (a feature head)."""
  rows = sequences_shape[0]
  cur_b = jax.ShapeDtypeStruct((rows,), jnp.int32)

  def call(cur_index, sequences, tokens_bn, cache, *features):
    layout = draft_tree.tree_layout(shape, cur_index, length)
    return tokens_to_logits(decoding.DecodingState(cur_index=cur_index, sequences=sequences, cur_token=tokens_bn,
                                                   cache=cache, layout=layout), *features)
  try:
    jax.eval_shape(call, cur_b, jax.ShapeDtypeStruct(sequences_shape, jnp.int32),
                   jax.ShapeDtypeStruct((rows, shape.num_nodes), jnp.int32),
                   jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), cache),
                   *(() if features_in is None else (features_in,)))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{name} does not decode a draft tree's nodes (a DecodingState with a layout; T5 networks "
                     f'and feature heads do, n-gram tables do not yet): {e}') from e


def _check_tree_settings(branching, chain, rule, inputs) -> draft_tree.TreeShape:
  draft_tree.check_rule(rule)
  shape = draft_tree.static_tree(tuple(branching), chain)
  if not isinstance(inputs, jax.core.Tracer) and getattr(inputs, 'is_fully_addressable', True):
    if np.any(np.asarray(inputs)[:, 1:] != 0):
      raise ValueError('tree_speculative_sample takes no decoder prompt: inputs must be 0 past position 0.')
  return shape


@decoding.declare_kind(decoding.SPECULATIVE)
def tree_speculative_sample(
    inputs: jax.Array,
    cache: Mapping[str, jax.Array],
    tokens_to_logits: decoding.TokensToLogits,
    draft_cache: Mapping[str, jax.Array],
    draft_tokens_to_logits: decoding.TokensToLogits,
    eos_id: int,
    branching: Sequence[int] = (2,),
    chain: int = 2,
    rule: str = 'without_replacement',
    decode_rng: Optional[jax.Array] = None,
    num_decodes: int = 1,
    temperature: Union[float, jax.Array] = 1.0,
    topk: int = 1,
    topp: float = 0.0,
    cache_offset: int = 0,
    draft_cache_offset: Optional[int] = None,
    max_decode_steps: Optional[Union[int, jax.Array]] = None,
    max_decode_steps_hard_limit: Optional[int] = None,
    rescale_log_probs: bool = True,
    return_stats: bool = False,
    shrink_batch: bool = True,
    draft_reads_features: bool = False,
) -> decoding.SpeculativeOutput:
  """Speculative sampling over a static draft tree (module docstring): the target's output distribution.

  Arguments are `decoding.speculative_sample`'s, except:
    branching, chain: the tree, `draft_tree.static_tree(branching, chain)`: top-k branching at the first draft
      positions, then a chain of `chain` below every leaf. Its depth D = len(branching) + chain is the number
      of drafter calls a round; its size n the width of the verify call.
    rule: how siblings are drawn at temperature > 0 (`draft_tree.RULES`); at temperature 0 a node's children
      are the drafter's top-k.
    draft_reads_features: the drafter is a feature head (`decoding.speculative_sample`'s feature-drafting
      contract, its calls taking a layout): each node is drafted from its parent's predicted feature, and the
      next round's catch-up re-reads the accepted path with the target's true features.
  No `gamma`, `lenience` or `draft_confidence`. `inputs` must hold no decoder prompt.

  Greedy outputs equal `decoding.temperature_sample`'s token for token; sampled outputs have its distribution.
  Returns a `decoding.SpeculativeOutput`; with `return_stats`, per-row `target_calls`, `accepted`, `emitted`
  and `accepted_at` [B, nd, D].
  """
  shape = _check_tree_settings(branching, chain, rule, inputs)
  decoding.validate_decode_args(inputs, eos_id, num_decodes, temperature, topk, topp, max_decode_steps,
                                1.0, gamma=shape.max_depth)
  if draft_cache_offset is None:
    draft_cache_offset = cache_offset
  if decode_rng is None:
    decode_rng = jax.random.PRNGKey(0)
  if max_decode_steps_hard_limit and max_decode_steps is not None:
    max_decode_steps = jnp.minimum(max_decode_steps, max_decode_steps_hard_limit)
  features = decoding.check_models(
      inputs, shape.num_nodes - 1, cache, cache_offset, tokens_to_logits, draft_cache, draft_cache_offset,
      draft_tokens_to_logits, bool(draft_reads_features))
  target_lengths = decoding.position_cache_lengths(cache, cache_offset)
  draft_lengths = decoding.position_cache_lengths(draft_cache, draft_cache_offset)
  if not target_lengths or not draft_lengths:
    raise ValueError('tree_speculative_sample needs both models to keep a key/value cache per position '
                     f"({POSITION_CACHE_LEAVES}): the tree's nodes are written there and moved.")
  target_length, draft_length = min(target_lengths), min(draft_lengths)
  batch_size, length = inputs.shape
  buffer_shape = (batch_size, length + shape.max_depth + 2)
  _check_takes_layout(tokens_to_logits, cache, shape, buffer_shape, target_length, 'tokens_to_logits')
  _check_takes_layout(draft_tokens_to_logits, draft_cache, shape, buffer_shape, draft_length,
                      'draft_tokens_to_logits', features)
  spec = TreeSpec(shape=shape, eos_id=int(eos_id), tokens_to_logits=tokens_to_logits,
                  draft_tokens_to_logits=draft_tokens_to_logits, target_length=target_length,
                  draft_length=draft_length, temperature=temperature, topk=topk, topp=topp, rule=rule,
                  rescale_log_probs=rescale_log_probs, return_stats=return_stats,
                  draft_reads_features=bool(draft_reads_features))
  inputs_x = decoding.expand_rows(inputs, num_decodes).astype(jnp.int32)
  rows = inputs_x.shape[0]
  sequences0 = jnp.pad(inputs_x, ((0, 0), (0, shape.max_depth + 2))).at[:, 0].set(0)
  max_len_b = decoding.max_decode_len(inputs_x, max_decode_steps)
  zeros_b = jnp.zeros((rows,), jnp.int32)
  stats0 = (dict(target_calls=zeros_b, accepted=zeros_b, emitted=zeros_b,
                 accepted_at=jnp.zeros((rows, shape.max_depth), jnp.int32)) if return_stats else {})
  state0 = TreeLoopState(
      cur_index=zeros_b, sequences=sequences0, max_len_b=max_len_b,
      target_cache=decoding.expand_cache(cache, num_decodes, cache_offset),
      draft_cache=decoding.expand_cache(draft_cache, num_decodes, draft_cache_offset),
      ended=max_len_b <= 0, generated=jnp.zeros_like(sequences0, dtype=bool), rng=decode_rng,
      log_prob=jnp.zeros((rows,), jnp.float32), stats=stats0)
  if features is not None:  # the head's first call reads zeros: there is no feature before BOS
    state0 = state0.replace(
        draft_features=jnp.zeros((rows, shape.max_depth + 1, features.shape[-1]), features.dtype),
        feature_start=jnp.full((rows,), -1, jnp.int32))
  axes = None
  if shrink_batch:
    axes = state0.replace(
        cur_index=0, sequences=0, max_len_b=0,
        target_cache=batch_shrink.same_axis(state0.target_cache, cache_offset),
        draft_cache=batch_shrink.same_axis(state0.draft_cache, draft_cache_offset), ended=0, generated=0,
        rng=batch_shrink.SHARED, log_prob=0, stats=batch_shrink.same_axis(state0.stats, 0),
        draft_features=None if features is None else 0, feature_start=None if features is None else 0)
  return decoding.run_rounds(functools.partial(tree_step, spec, cache_offset, draft_cache_offset), state0, axes,
                             eos_id, batch_size, num_decodes, length, return_stats)


def _extra_cache_slots(**settings) -> int:
  """A tree's nodes past a row's last position: its root may sit at the last position, its node j at slot i + j."""
  defaults = inspect.signature(tree_speculative_sample).parameters
  branching = settings.get('branching', defaults['branching'].default)
  chain = settings.get('chain', defaults['chain'].default)
  return draft_tree.static_tree(tuple(branching), chain).num_nodes


# `models.SpeculativeEncoderDecoderModel` makes both caches this much longer (`decoding.cache_slots`), so no node of
# a tree is cut near the end of a sequence.
tree_speculative_sample.extra_cache_slots = _extra_cache_slots
