"""The math of exact draft TREES, as pure jit-able functions.

A chain of γ drafts is verified by one target call over γ+1 positions. A draft
tree drafts several candidates (siblings) per position and is verified by one
target call over all of its nodes, each node attending only to its ancestors.
This module holds the pieces, independent of any network:

* `TreeShape`, `static_tree`: a static tree (node 0 is the root, the last
  committed token; the other nodes are drafts, numbered breadth-first).
* `tree_attention_mask`, `tree_positions`, `tree_cache_mask`,
  `tree_key_positions`: what the one target call over the tree needs.
* `verify_tree_greedy`: argmax decoding walks the tree along the target's
  argmax; the output equals the baseline's token for token.
* `draw_children`, `sibling_draft_log_probs`, `sibling_acceptance`,
  `verify_siblings`, `verify_tree`: exact sampling over siblings (recursive
  rejection sampling: SpecInfer's multi-step speculative sampling for
  siblings drawn with replacement, Recursive Speculative Decoding's rule for
  siblings drawn without replacement), and the walk down the whole tree.

Distributions are log-probabilities (`-inf` for zero mass), as in
`specdec/sampling.py`, whose acceptance and residual this module reuses.

The sibling rule. At a node with target p, children x_1..x_k are verified in
order: child i is accepted with probability a_i = min(1, p_i(x_i) / q_i(x_i)),
where q_i is the law x_i was drawn from GIVEN x_1..x_{i-1}; on rejection
p_{i+1} = norm(max(0, p_i - q_i)); if all k are rejected the token is drawn
from p_{k+1}. The three draw rules differ only in q_i:

  'with_replacement'     x_i i.i.d. ~ q:            q_i = q
  'without_replacement'  x_i ~ q without x_1..x_{i-1}: q_i = q with those
                         zeroed, renormalised (distinct siblings)
  'fixed'                x_i a fixed function of the drafter's state (e.g.
                         the top-k of q):          q_i = one-hot(x_i), so
                         a_i = p_i(x_i) and p_{i+1} = p_i without x_i

Proof of exactness (induction on the number of siblings left): whatever
x_1..x_{i-1} were, x_i ~ q_i, so steps i.. emit y with probability
q_i(y) a_i(y) + P(reject) p_{i+1}(y) = min(p_i, q_i)(y) + max(0, p_i - q_i)(y)
= p_i(y), because p_{i+1} does not depend on x_i and steps i+1.. emit
~p_{i+1} by induction (the base: no sibling left, the token is drawn from
p_{k+1}). Hence the emitted token ~ p_1 = p. The acceptance probabilities
a_1..a_k and p_{k+1} are functions of (p, q, x_1..x_k) alone, not of the coin
flips: `sibling_acceptance` computes them, which is what the tests enumerate.

Down the tree: an accepted child's subtree was drafted from q at that child
independently of the coin flips at its parent, so the same rule at the child
is exact for the next token given the accepted prefix; a leaf's next token is
drawn from the target's p at the leaf (the bonus token).
"""

import dataclasses
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec import sampling

RULES = ('with_replacement', 'without_replacement', 'fixed')


# ---------------------------------------------------------------------------
# The static tree
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TreeShape:
  """A static draft tree of n nodes; node 0 is the root (the last committed token).

  Attributes:
    parent: [n] int32, the parent of each node; -1 for the root. A node's
      parent has a smaller number (`static_tree` numbers breadth-first).
    depth: [n] int32, 0 for the root, the draft position of the others.
    children: [n, K] int32, each node's children in order, -1 padded; K is the
      largest number of children of any node.

  Hashable (by `parent`), so that it can be a static argument of `jax.jit`.
  """
  parent: np.ndarray
  depth: np.ndarray
  children: np.ndarray

  @property
  def num_nodes(self) -> int:
    return int(self.parent.shape[0])

  @property
  def max_depth(self) -> int:
    return int(self.depth.max())

  @property
  def max_children(self) -> int:
    return int(self.children.shape[1])

  def __hash__(self) -> int:
    return hash(self.parent.tobytes())

  def __eq__(self, other) -> bool:
    return isinstance(other, TreeShape) and np.array_equal(self.parent, other.parent)


def tree_from_parents(parent: Sequence[int]) -> TreeShape:
  """The TreeShape of a parent list (parent[0] = -1, 0 <= parent[i] < i)."""
  parent_n = np.asarray(parent)
  if parent_n.ndim != 1 or parent_n.size < 2 or not np.issubdtype(parent_n.dtype, np.integer):
    raise ValueError(f'parent must be a list of >= 2 ints (the root and a draft), got {list(parent)!r}.')
  nodes_n = np.arange(parent_n.size)
  if parent_n[0] != -1 or np.any((parent_n[1:] < 0) | (parent_n[1:] >= nodes_n[1:])):
    raise ValueError(f'parent[0] must be -1 and 0 <= parent[i] < i, got {parent_n.tolist()}.')
  parent_n = parent_n.astype(np.int32)
  depth_n = np.zeros(parent_n.size, np.int32)
  for i in range(1, parent_n.size):  # parents come first
    depth_n[i] = depth_n[parent_n[i]] + 1
  kids = [[] for _ in nodes_n]
  for i in nodes_n[1:]:
    kids[parent_n[i]].append(int(i))
  width = max(len(k) for k in kids)
  children_nk = np.full((parent_n.size, width), -1, np.int32)
  for i, k in enumerate(kids):
    children_nk[i, :len(k)] = k
  return TreeShape(parent_n, depth_n, children_nk)


def static_tree(branching: Sequence[int], chain: int) -> TreeShape:
  """Top-k branching at the first draft positions, then a chain below every leaf.

  branching=(3, 2), chain=1: the root has 3 children, each of them 2, and each
  of those 6 one more: 1 + 3 + 6 + 6 = 16 nodes, depth 3. branching=() is a
  chain of `chain` drafts: today's γ = chain.
  """
  branching = tuple(branching)
  if any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in branching):
    raise ValueError(f'branching must be ints >= 1, got {branching!r}.')
  if isinstance(chain, bool) or not isinstance(chain, (int, np.integer)) or chain < 0:
    raise ValueError(f'chain must be an int >= 0, got {chain!r}.')
  if not branching and chain == 0:
    raise ValueError('a tree needs at least one draft: branching=() and chain=0.')
  parent, level = [-1], [0]
  for width in list(branching) + [1] * chain:
    next_level = []
    for node in level:  # breadth-first: a whole level before the next
      for _ in range(width):
        parent.append(node)
        next_level.append(len(parent) - 1)
    level = next_level
  return tree_from_parents(parent)


def parse_tree(spec: str) -> Tuple[Tuple[int, ...], int]:
  """(branching, chain) of a tree written 'B1xB2+C': '2+2' is 2 children of the root, a chain of 2 below each;
  '3x2+1' branches 3 then 2, then a chain of 1; '+4' (or '4') is a chain of 4."""
  text = str(spec).strip()
  head, plus, tail = text.rpartition('+')
  if not plus:
    head, tail = '', text
  try:
    branching = tuple(int(b) for b in head.split('x')) if head else ()
    chain = int(tail)
  except ValueError:
    raise ValueError(f"a tree is written 'B1xB2+C' (e.g. '2+2', '3x2+1', '+4'), got {spec!r}.") from None
  static_tree(branching, chain)  # the same checks as a tree given in numbers
  return branching, chain


def tree_name(branching: Sequence[int], chain: int) -> str:
  """The 'B1xB2+C' name of a tree (`parse_tree`'s inverse)."""
  return 'x'.join(str(int(b)) for b in branching) + f'+{int(chain)}'


# ---------------------------------------------------------------------------
# The inputs of one target call over the tree
# ---------------------------------------------------------------------------


def tree_attention_mask(shape: TreeShape) -> np.ndarray:
  """[n, n] bool: node i attends to node j iff j is i or an ancestor of i.

  For a chain (branching=()) it is lower-triangular: the causal mask of
  today's verify call.
  """
  n = shape.num_nodes
  mask_nn = np.eye(n, dtype=bool)
  for i in range(1, n):  # a parent's row is complete before its children's
    mask_nn[i] |= mask_nn[shape.parent[i]]
  return mask_nn


def tree_positions(shape: TreeShape, cur_index_b: jax.Array) -> jax.Array:
  """[B, n] int32: the sequence position of each node, cur_index + depth.

  Siblings share a position (they are alternatives for the same token); the
  root, node 0, sits at cur_index (the last committed token).
  """
  cur_index_b = jnp.asarray(cur_index_b)
  if cur_index_b.ndim != 1:
    raise ValueError(f'cur_index_b must be [B], got shape {cur_index_b.shape}.')
  return cur_index_b.astype(jnp.int32)[:, None] + jnp.asarray(shape.depth)[None, :]


def tree_cache_mask(shape: TreeShape, cur_index_b: jax.Array, length: int) -> jax.Array:
  """[B, n, L] bool: which cache slots node i may read, with the tree written at slots cur_index + node.

  The committed prefix (slots < cur_index) is visible to every node, slot
  cur_index + j iff node j is node i or one of its ancestors. (Nodes are
  written at distinct slots cur_index + node, not at their positions
  cur_index + depth, which siblings share.)
  """
  cur_index_b = jnp.asarray(cur_index_b)
  if cur_index_b.ndim != 1:
    raise ValueError(f'cur_index_b must be [B], got shape {cur_index_b.shape}.')
  n = shape.num_nodes
  slot_b1l = jnp.arange(length)[None, None, :] - cur_index_b[:, None, None]
  in_tree_b1l = (slot_b1l >= 0) & (slot_b1l < n)
  mask_nn = jnp.asarray(tree_attention_mask(shape))
  node_mask_bnl = mask_nn[jnp.arange(n)[None, :, None], jnp.clip(slot_b1l, 0, n - 1)]
  return (slot_b1l < 0) | (in_tree_b1l & node_mask_bnl)


def tree_key_positions(shape: TreeShape, cur_index_b: jax.Array, length: int) -> jax.Array:
  """[B, L] int32: the sequence position of what each cache slot holds, with the tree at slots cur_index + node.

  Slot l holds position l outside the tree, and node j's position
  cur_index + depth_j at slot cur_index + j: the key positions of T5's
  relative position bias (the query positions are `tree_positions`).
  """
  cur_index_b = jnp.asarray(cur_index_b)
  if cur_index_b.ndim != 1:
    raise ValueError(f'cur_index_b must be [B], got shape {cur_index_b.shape}.')
  n = shape.num_nodes
  slot_bl = jnp.arange(length, dtype=jnp.int32)[None, :] - cur_index_b.astype(jnp.int32)[:, None]
  in_tree_bl = (slot_bl >= 0) & (slot_bl < n)
  depth_bl = jnp.asarray(shape.depth)[jnp.clip(slot_bl, 0, n - 1)]
  return jnp.where(in_tree_bl, cur_index_b[:, None] + depth_bl, jnp.arange(length, dtype=jnp.int32)[None, :])


class SlotLayout(NamedTuple):
  """Where the k tokens of one cached decode step sit, when not at consecutive positions (a draft tree's).

  Attributes:
    positions_bk: [B, k] int32, each token's sequence position (siblings share one).
    slots_bk: [B, k] int32, the cache slot its key/value is written to (distinct).
    attend_bkl: [B, k, L] bool, the cache slots each token attends to.
    key_positions_bl: [B, L] int32, the sequence position of what each slot holds (relative position bias).
  """
  positions_bk: jax.Array
  slots_bk: jax.Array
  attend_bkl: jax.Array
  key_positions_bl: jax.Array

  def check(self, tokens_shape, length: int) -> None:
    batch, k = tokens_shape
    want = {'positions_bk': (batch, k), 'slots_bk': (batch, k), 'attend_bkl': (batch, k, length),
            'key_positions_bl': (batch, length)}
    for name, shape in want.items():
      if tuple(getattr(self, name).shape) != shape:
        raise ValueError(f'SlotLayout.{name} must be {shape} for tokens {tuple(tokens_shape)} and a cache of '
                         f'length {length}, got {tuple(getattr(self, name).shape)}.')


def tree_layout(shape: TreeShape, cur_index_b: jax.Array, length: int,
                nodes: Optional[Sequence[int]] = None) -> SlotLayout:
  """The SlotLayout of a call over `nodes` of the tree (default all), the tree at slots cur_index + node.

  One verify call feeds every node; a drafter drafting level by level feeds
  one level a call (its ancestors were written by earlier calls, and a node
  attends only to those and to the committed prefix).
  """
  nodes_m = np.arange(shape.num_nodes) if nodes is None else np.asarray(nodes, np.int32)
  if nodes_m.ndim != 1 or nodes_m.size == 0 or nodes_m.min() < 0 or nodes_m.max() >= shape.num_nodes:
    raise ValueError(f'nodes must be a non-empty list of node numbers < {shape.num_nodes}, got {nodes!r}.')
  cur_index_b = jnp.asarray(cur_index_b, jnp.int32)
  return SlotLayout(positions_bk=tree_positions(shape, cur_index_b)[:, nodes_m],
                    slots_bk=cur_index_b[:, None] + jnp.asarray(nodes_m)[None, :],
                    attend_bkl=tree_cache_mask(shape, cur_index_b, length)[:, nodes_m],
                    key_positions_bl=tree_key_positions(shape, cur_index_b, length))


# ---------------------------------------------------------------------------
# Greedy verification
# ---------------------------------------------------------------------------


class TreeVerdict(NamedTuple):
  """The outcome of verifying a draft tree, per row.

  Attributes:
    path_bd: [B, D] the accepted nodes, depth 1..D in order, -1 past
      num_accepted_b.
    tokens_bd: [B, D] their tokens, 0 past num_accepted_b.
    num_accepted_b: [B] int32, the number of accepted drafts, in [0, D].
    last_node_b: [B] int32, the last accepted node (0, the root, if none):
      its logits gave next_token_b.
    next_token_b: [B] int32, the token after the accepted drafts: the
      argmax, residual or bonus sample at last_node_b.
  """
  path_bd: jax.Array
  tokens_bd: jax.Array
  num_accepted_b: jax.Array
  last_node_b: jax.Array
  next_token_b: jax.Array


def _check_tree_inputs(shape: TreeShape, tokens_bn: jax.Array, per_node_bnv: jax.Array,
                       name: str) -> None:
  n = shape.num_nodes
  if tokens_bn.ndim != 2 or tokens_bn.shape[1] != n:
    raise ValueError(f'tokens_bn must be [B, n={n}], got shape {tokens_bn.shape}.')
  if per_node_bnv.ndim != 3 or per_node_bnv.shape[:2] != tokens_bn.shape:
    raise ValueError(f'{name} must be [B, n, V] = {tokens_bn.shape} + [V], got shape {per_node_bnv.shape}.')


def _children_of(shape: TreeShape, node_b: jax.Array, tokens_bn: jax.Array,
                 valid_bn: jax.Array) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """(children_bk -1 padded, their tokens_bk, valid_bk) of each row's node."""
  children_bk = jnp.asarray(shape.children)[node_b]
  safe_bk = jnp.maximum(children_bk, 0)
  tokens_bk = jnp.take_along_axis(tokens_bn, safe_bk, axis=1)
  valid_bk = (children_bk >= 0) & jnp.take_along_axis(valid_bn, safe_bk, axis=1)
  return children_bk, tokens_bk, valid_bk


def _first_true(x_bk: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """(whether any, the index of the first True, 0 if none) per row."""
  return jnp.any(x_bk, axis=1), jnp.argmax(x_bk, axis=1).astype(jnp.int32)


def _verdict(path: Sequence[jax.Array], tokens: Sequence[jax.Array], node_b: jax.Array,
             next_token_b: jax.Array, batch: int) -> TreeVerdict:
  if path:
    path_bd, tokens_bd = jnp.stack(path, axis=1), jnp.stack(tokens, axis=1)
  else:
    path_bd = tokens_bd = jnp.zeros((batch, 0), jnp.int32)
  num_accepted_b = jnp.sum(path_bd >= 0, axis=1).astype(jnp.int32)
  return TreeVerdict(path_bd, tokens_bd, num_accepted_b, node_b, next_token_b.astype(jnp.int32))


def verify_tree_greedy(shape: TreeShape, tokens_bn: jax.Array, target_logits_bnv: jax.Array,
                       valid_bn: Optional[jax.Array] = None) -> TreeVerdict:
  """Argmax decoding over a tree: walk from the root along the target's argmax.

  At each node the child whose token equals argmax of the node's logits is
  accepted (the first in order if siblings repeat a token), and the walk goes
  on from it; it stops where no child matches, and the next token is the
  argmax at the last accepted node. Every accepted token is the target's
  argmax given the tokens before it, so the output is the baseline's.

  Args:
    shape: the static tree.
    tokens_bn: [B, n] int, node 0 the last committed token, the others drafts.
    target_logits_bnv: [B, n, V] the target's logits AT each node (predicting
      its children), from one call over the tree; or log-probs (same argmax).
    valid_bn: [B, n] bool, drafts that exist (default all): an invalid node is
      never accepted.
  """
  tokens_bn = jnp.asarray(tokens_bn)
  _check_tree_inputs(shape, tokens_bn, target_logits_bnv, 'target_logits_bnv')
  batch = tokens_bn.shape[0]
  valid_bn = jnp.ones(tokens_bn.shape, bool) if valid_bn is None else jnp.asarray(valid_bn, bool)
  argmax_bn = sampling.argmax(target_logits_bnv)
  node_b = jnp.zeros((batch,), jnp.int32)
  walking_b = jnp.ones((batch,), bool)
  path, tokens = [], []
  for _ in range(shape.max_depth):  # static: one step per draft position
    children_bk, child_tokens_bk, valid_bk = _children_of(shape, node_b, tokens_bn, valid_bn)
    want_b = jnp.take_along_axis(argmax_bn, node_b[:, None], axis=1)[:, 0]
    hit_b, first_b = _first_true(valid_bk & (child_tokens_bk == want_b[:, None]))
    walking_b = walking_b & hit_b
    child_b = jnp.take_along_axis(children_bk, first_b[:, None], axis=1)[:, 0]
    node_b = jnp.where(walking_b, child_b, node_b)
    path.append(jnp.where(walking_b, child_b, -1))
    tokens.append(jnp.where(walking_b, want_b, 0))
  next_token_b = jnp.take_along_axis(argmax_bn, node_b[:, None], axis=1)[:, 0]
  return _verdict(path, tokens, node_b, next_token_b, batch)


# ---------------------------------------------------------------------------
# Exact sampling over siblings
# ---------------------------------------------------------------------------


def check_rule(rule: str) -> None:
  """ValueError (one line) unless `rule` is one of the sibling rules (`RULES`)."""
  if rule not in RULES:
    raise ValueError(f'rule must be one of {RULES}, got {rule!r}.')


def _normalise(logp_xv: jax.Array) -> jax.Array:
  """log p - log Σ p; a row with no mass stays all -inf (not NaN)."""
  total_x1 = jax.nn.logsumexp(logp_xv, axis=-1, keepdims=True)
  return jnp.where(total_x1 > -jnp.inf, logp_xv - total_x1, -jnp.inf)


def draw_children(rng: jax.Array, logq_xv: jax.Array, k: int,
                  rule: str) -> Tuple[jax.Array, jax.Array]:
  """k children of a node from the drafter's q, by `rule`: (tokens_xk int32, valid_xk).

  'with_replacement': k i.i.d. draws. 'without_replacement': the Gumbel-top-k
  trick (the k largest of log q + Gumbel noise, in order, are distributed as
  k sequential draws without replacement). 'fixed': the top-k of q.
  A child is invalid where q had no mass left to draw it (fewer than k tokens
  with q > 0, without replacement or fixed).
  """
  check_rule(rule)
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f'k must be an int >= 1, got {k!r}.')
  logq_xv = jnp.asarray(logq_xv, jnp.float32)
  if rule == 'with_replacement':
    logq_xkv = jnp.broadcast_to(logq_xv[..., None, :], logq_xv.shape[:-1] + (k, logq_xv.shape[-1]))
    tokens_xk = sampling.inverse_cdf_sample(rng, logq_xkv)
    return tokens_xk, jnp.ones(tokens_xk.shape, bool)
  if k > logq_xv.shape[-1]:
    raise ValueError(f'k={k} distinct children need a vocabulary of >= k, got {logq_xv.shape[-1]}.')
  keys_xv = logq_xv
  if rule == 'without_replacement':
    keys_xv = logq_xv + jax.random.gumbel(rng, logq_xv.shape, jnp.float32)
  top_xk, tokens_xk = jax.lax.top_k(keys_xv, k)
  return tokens_xk.astype(jnp.int32), top_xk > -jnp.inf


def sibling_draft_log_probs(logq_xv: jax.Array, tokens_xk: jax.Array, valid_xk: jax.Array,
                            rule: str) -> Tuple[jax.Array, jax.Array]:
  """(log q_i [.., k, V], valid_xk): the law each child was drawn from given the ones before it.

  'with_replacement': q. 'without_replacement': q with the earlier valid
  siblings' tokens zeroed, renormalised. 'fixed': one-hot of the child. The
  returned valid mask also drops a child whose q_i has no mass (it could not
  have been drawn).
  """
  check_rule(rule)
  logq_xv = jnp.asarray(logq_xv)
  vocab = logq_xv.shape[-1]
  onehot_xkv = tokens_xk[..., None] == jnp.arange(vocab)
  if rule == 'fixed':
    logq_xkv = jnp.where(onehot_xkv, 0.0, -jnp.inf).astype(logq_xv.dtype)
  else:
    logq_xkv = jnp.broadcast_to(logq_xv[..., None, :], tokens_xk.shape + (vocab,))
    if rule == 'without_replacement':
      drawn_xkv = onehot_xkv & valid_xk[..., None]
      # Tokens of siblings 1..i-1 (exclusive cumulative): removed from q_i.
      before_xkv = (jnp.cumsum(drawn_xkv, axis=-2) - drawn_xkv) > 0
      # Renormalised over what is left (a log-sum over the rest, not
      # log(1 - Σ q(x_j)), which cancels when the drawn tokens hold most mass).
      logq_xkv = _normalise(jnp.where(before_xkv, -jnp.inf, logq_xkv))
  has_mass_xk = jnp.any(logq_xkv > -jnp.inf, axis=-1)
  return logq_xkv, valid_xk & has_mass_xk


def _rejected_target(logp_xv: jax.Array, logq_xv: jax.Array) -> jax.Array:
  """log p_{i+1} = log norm(max(0, p_i - q_i)); p_i itself where that residual's mass is within rounding of 0.

  The residual's mass is the probability of a rejection (Σ max(0, p - q) =
  Σ max(0, q - p) for normalised p, q). When p_i = q_i up to rounding it is
  float noise, and normalising noise would give an arbitrary distribution;
  falling back to p_i changes the law by at most that mass (a few float eps,
  the precision of the whole computation).
  """
  residual_xv = sampling.residual_log_probs(logp_xv, logq_xv)
  mass_x1 = jax.nn.logsumexp(residual_xv, axis=-1, keepdims=True)
  noise_floor = float(np.log(16 * np.finfo(residual_xv.dtype).eps))
  return jnp.where(mass_x1 > noise_floor, residual_xv - mass_x1, logp_xv)


def sibling_acceptance(logp_xv: jax.Array, logq_xkv: jax.Array, tokens_xk: jax.Array,
                       valid_xk: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """The deterministic part of recursive rejection: (a_xk, log p_{k+1} [.., V]).

  a_i = min(1, p_i(x_i) / q_i(x_i)), the probability that child i is accepted
  given that children 1..i-1 were rejected (0 for an invalid child, which is
  skipped: p is not updated); p_1 = p, p_{i+1} = norm(max(0, p_i - q_i)).
  Child i is the accepted one with probability a_i Π_{j<i} (1 - a_j); with
  probability Π_j (1 - a_j) all are rejected and the token is drawn from
  p_{k+1} (normalised; p itself when there are no valid children).
  """
  logp_xv = _normalise(jnp.asarray(logp_xv))
  accept = []
  for i in range(tokens_xk.shape[-1]):  # k is static and small
    logq_i_xv, token_x, valid_x = logq_xkv[..., i, :], tokens_xk[..., i], valid_xk[..., i]
    a_x = sampling.acceptance_probability(sampling.token_log_prob(logp_xv, token_x),
                                          sampling.token_log_prob(logq_i_xv, token_x))
    accept.append(jnp.where(valid_x, a_x, 0.0))
    logp_xv = jnp.where(valid_x[..., None], _rejected_target(logp_xv, logq_i_xv), logp_xv)
  return jnp.stack(accept, axis=-1).astype(logp_xv.dtype), logp_xv


def _first_accepted(rng: jax.Array, accept_xk: jax.Array) -> jax.Array:
  """The first child whose uniform falls below its a_i, -1 if none, [..] int32."""
  uniform_xk = jax.random.uniform(rng, accept_xk.shape, accept_xk.dtype)
  take_xk = uniform_xk < accept_xk
  first_x = jnp.argmax(take_xk, axis=-1).astype(jnp.int32)
  return jnp.where(jnp.any(take_xk, axis=-1), first_x, -1)


class SiblingVerdict(NamedTuple):
  """One node's siblings verified: accepted_x, the accepted child (-1 if all
  were rejected); token_x, the emitted token (that child's, or a p_{k+1} sample)."""
  accepted_x: jax.Array
  token_x: jax.Array


def verify_siblings(rng: jax.Array, logp_xv: jax.Array, logq_xv: jax.Array, tokens_xk: jax.Array,
                    valid_xk: Optional[jax.Array] = None,
                    rule: str = 'without_replacement') -> SiblingVerdict:
  """Recursive rejection sampling at one node: the emitted token ~ p exactly.

  Args:
    rng: PRNG key.
    logp_xv: [.., V] the target's adjusted log p at the node.
    logq_xv: [.., V] the drafter's adjusted log q at the node, which the
      children were drawn from by `rule` (unused for 'fixed').
    tokens_xk: [.., k] the children, in the order they were drawn.
    valid_xk: [.., k] children that exist (default all).
    rule: how the children were drawn: one of RULES.
  """
  check_rule(rule)
  tokens_xk = jnp.asarray(tokens_xk)
  if tokens_xk.shape[:-1] != logp_xv.shape[:-1] or logq_xv.shape != logp_xv.shape:
    raise ValueError(f'logp_xv {logp_xv.shape}, logq_xv {logq_xv.shape} and tokens_xk '
                     f'{tokens_xk.shape} must share the leading dims [..], V the same.')
  valid_xk = jnp.ones(tokens_xk.shape, bool) if valid_xk is None else jnp.asarray(valid_xk, bool)
  u_rng, sample_rng = jax.random.split(rng)
  logq_xkv, valid_xk = sibling_draft_log_probs(logq_xv, tokens_xk, valid_xk, rule)
  accept_xk, final_logp_xv = sibling_acceptance(logp_xv, logq_xkv, tokens_xk, valid_xk)
  accepted_x = _first_accepted(u_rng, accept_xk)
  child_token_x = jnp.take_along_axis(tokens_xk, jnp.maximum(accepted_x, 0)[..., None], axis=-1)[..., 0]
  token_x = jnp.where(accepted_x >= 0, child_token_x, sampling.sample(sample_rng, final_logp_xv))
  return SiblingVerdict(accepted_x, token_x.astype(jnp.int32))


def verify_tree(rng: jax.Array, shape: TreeShape, tokens_bn: jax.Array,
                draft_logq_bnv: Optional[jax.Array], target_logp_bnv: jax.Array,
                valid_bn: Optional[jax.Array] = None,
                rule: str = 'without_replacement') -> TreeVerdict:
  """Exact sampling over a draft tree verified by one target call.

  From the root: recursive rejection among the node's children (see the
  module docstring); an accepted child becomes the next node; where all are
  rejected the next token is drawn from the final residual p_{k+1}, and at a
  leaf from the target's p there (the bonus token). The emitted sequence
  (accepted tokens, then next_token_b) has the target's law.

  Args:
    rng: PRNG key.
    shape: the static tree.
    tokens_bn: [B, n] node 0 the last committed token, the others drafts,
      each node's children drawn from draft_logq at the node by `rule`.
    draft_logq_bnv: [B, n, V] the drafter's adjusted log q AT each node (the
      law its children were drawn from; leaves' rows are never read). None
      with rule 'fixed', which does not read q (no [B, n, V] to keep).
    target_logp_bnv: [B, n, V] the target's adjusted log p AT each node.
    valid_bn: [B, n] bool, nodes that were drafted (see `draw_children`;
      default all). An invalid node is never accepted.
    rule: how each node's children were drawn: one of RULES.
  """
  check_rule(rule)
  tokens_bn = jnp.asarray(tokens_bn)
  _check_tree_inputs(shape, tokens_bn, target_logp_bnv, 'target_logp_bnv')
  if draft_logq_bnv is None:
    if rule != 'fixed':
      raise ValueError(f"draft_logq_bnv is needed unless rule is 'fixed', got rule {rule!r}.")
    draft_logq_bnv = target_logp_bnv  # only its shape is read: 'fixed' takes q_i = one-hot(x_i)
  _check_tree_inputs(shape, tokens_bn, draft_logq_bnv, 'draft_logq_bnv')
  if draft_logq_bnv.shape != target_logp_bnv.shape:
    raise ValueError(f'draft_logq_bnv {draft_logq_bnv.shape} and target_logp_bnv '
                     f'{target_logp_bnv.shape} must have the same shape.')
  batch = tokens_bn.shape[0]
  valid_bn = jnp.ones(tokens_bn.shape, bool) if valid_bn is None else jnp.asarray(valid_bn, bool)
  depth_rngs = jax.random.split(rng, shape.max_depth + 1)

  def at_node(x_bnv, node_b):
    return jnp.take_along_axis(x_bnv, node_b[:, None, None], axis=1)[:, 0]

  node_b = jnp.zeros((batch,), jnp.int32)
  walking_b = jnp.ones((batch,), bool)
  final_logp_bv = jnp.zeros(target_logp_bnv.shape[::2], jnp.float32)
  path, tokens = [], []
  for d in range(shape.max_depth):  # static: one step per draft position
    children_bk, child_tokens_bk, valid_bk = _children_of(shape, node_b, tokens_bn, valid_bn)
    logq_bkv, valid_bk = sibling_draft_log_probs(at_node(draft_logq_bnv, node_b), child_tokens_bk,
                                                 valid_bk, rule)
    accept_bk, residual_logp_bv = sibling_acceptance(at_node(target_logp_bnv, node_b), logq_bkv,
                                                     child_tokens_bk, valid_bk)
    first_b = _first_accepted(depth_rngs[d], accept_bk)
    stops_b = walking_b & (first_b < 0)
    final_logp_bv = jnp.where(stops_b[:, None], residual_logp_bv, final_logp_bv)
    walking_b = walking_b & (first_b >= 0)
    safe_first_b1 = jnp.maximum(first_b, 0)[:, None]
    node_b = jnp.where(walking_b, jnp.take_along_axis(children_bk, safe_first_b1, axis=1)[:, 0], node_b)
    path.append(jnp.where(walking_b, node_b, -1))
    tokens.append(jnp.where(walking_b, jnp.take_along_axis(child_tokens_bk, safe_first_b1, axis=1)[:, 0], 0))
  # Rows still walking reached a leaf: the bonus token from p at the leaf.
  final_logp_bv = jnp.where(walking_b[:, None], at_node(target_logp_bnv, node_b), final_logp_bv)
  next_token_b = sampling.sample(depth_rngs[-1], final_logp_bv)
  return _verdict(path, tokens, node_b, next_token_b, batch)


# ---------------------------------------------------------------------------
# What a tree is expected to give, and the tree a machine should draft
# ---------------------------------------------------------------------------


def _check_rank_probs(rank_probs) -> np.ndarray:
  probs_r = np.asarray(rank_probs, np.float64)
  if probs_r.ndim != 1 or probs_r.size == 0 or np.any(~np.isfinite(probs_r)) or np.any(probs_r < 0) or \
      probs_r.sum() > 1 + 1e-9:
    raise ValueError('rank_probs must be a non-empty list of probabilities >= 0 summing to <= 1 (P(the target\'s '
                     f'token is the drafter\'s r-th choice), r = 1, 2, ...), got {rank_probs!r}.')
  return probs_r


def expected_tree_tokens(shape: TreeShape, rank_probs: Sequence[float]) -> float:
  """E[tokens a round emits] with a greedy drafter's top-k children: 1 + Σ over draft nodes of P(on the path).

  rank_probs[r]: the probability that the target's token is the drafter's (r+1)-th most likely one, the same
  at every position whatever came before (the i.i.d. assumption of Thm 3.8, one rate per rank). A node that
  is its parent's (r+1)-th child is accepted, given its parent was, with probability rank_probs[r]; ranks past
  the list are never accepted. For a chain of γ this is Eq. (1), (1 - α^(γ+1)) / (1 - α), α = rank_probs[0].
  """
  probs_r = _check_rank_probs(rank_probs)
  on_path_n = np.zeros(shape.num_nodes)
  on_path_n[0] = 1.0
  for node in range(shape.num_nodes):  # parents first
    for rank, child in enumerate(int(c) for c in shape.children[node] if c >= 0):
      on_path_n[child] = on_path_n[node] * (probs_r[rank] if rank < probs_r.size else 0.0)
  return float(on_path_n.sum())


def monotone_cost_curve(cost_ratios) -> Dict[int, float]:
  """{k: max over measured j <= k of r(j)}: a measured cost curve made non-decreasing in the width.

  A k-token call does at least the work of a narrower one, so a width measured cheaper than a narrower width
  (timing noise, or a tiling accident of the isolated call that the loop's calls need not share) is charged the
  narrower width's cost. This is the envelope from above: it never lowers a measured cost, so a dip cannot draw
  `best_tree` to its width and cannot raise a prediction. (The envelope from below, min over j >= k, would be
  the cost only if the loop padded its calls to the cheaper width, which it does not.)
  """
  try:
    curve = {int(k): float(v) for k, v in dict(cost_ratios).items()}
  except (TypeError, ValueError) as e:
    raise ValueError(f'a cost curve maps tokens per call to cost ratios, got {cost_ratios!r}.') from e
  if any(k < 1 or not np.isfinite(r) or r <= 0 for k, r in curve.items()):
    raise ValueError(f'a cost curve needs widths k >= 1 and finite costs r(k) > 0, got {curve}.')
  out, running = {}, 0.0
  for k in sorted(curve):
    running = max(running, curve[k])
    out[k] = running
  return out


def draft_call_widths(shape: TreeShape, draft_reads_features: bool = False) -> Tuple[int, ...]:
  """The tokens of each of the drafter's D calls in a round of `tree_decoding`: the catch-up ([x_{i-1}, x_i]; a
  feature head re-reads the last round's D+1 positions), then one call per level of nodes 1..D-1 (the deepest
  level's children are never fed)."""
  first = shape.max_depth + 1 if draft_reads_features else 2
  return (first,) + tuple(int(np.count_nonzero(shape.depth == d)) for d in range(1, shape.max_depth))


def tree_speedup(shape: TreeShape, rank_probs: Sequence[float], c: float, verify_cost_ratios,
                 draft_cost_ratios=None, draft_reads_features: bool = False) -> float:
  """Predicted speedup of a tree round: E[tokens] / (c Σ_calls r_q(w) + r(n)).

  n: the tree's nodes (the verify call's tokens), r(n) a call of n tokens over a one-token call
  (`verify_cost_ratios`, {k: r(k)}); w: the width of each drafter call (`draft_call_widths`), r_q(w) its cost
  over the drafter's one-token call (`draft_cost_ratios`; None: the target's curve, the same machine's cost of
  width, where the drafter's own was not measured); c: the drafter's one-token call over the target's, the
  in-loop c where the caller has it (an isolated call leaves out the draft step's sampling and bookkeeping).
  Both curves are read through `monotone_cost_curve`. A chain with a flat drafter curve ({k: 1}) is
  `theory.best_gamma`'s γ·c + r(γ+1).
  """
  curve = monotone_cost_curve(verify_cost_ratios)
  if shape.num_nodes not in curve:
    raise ValueError(f'verify_cost_ratios has no r({shape.num_nodes}) for a tree of {shape.num_nodes} nodes.')
  if not np.isfinite(c) or c < 0:
    raise ValueError(f'c must be a finite cost >= 0, got {c!r}.')
  draft_curve = curve if draft_cost_ratios is None else monotone_cost_curve(draft_cost_ratios)
  widths = draft_call_widths(shape, draft_reads_features)
  missing = sorted(set(w for w in widths if w not in draft_curve))
  if missing:
    raise ValueError(f'the drafter\'s cost curve has no r_q({missing[0]}) for its calls of {list(widths)} tokens.')
  draft_cost = c * sum(draft_curve[w] for w in widths)
  return expected_tree_tokens(shape, rank_probs) / (draft_cost + curve[shape.num_nodes])


def candidate_trees(max_nodes: int, max_branching: int = 4, max_levels: int = 3
                    ) -> List[Tuple[Tuple[int, ...], int]]:
  """Every static tree of at most `max_nodes` nodes: up to `max_levels` levels branching 2..`max_branching`,
  then a chain (chains alone included), as (branching, chain)."""
  out = []

  def grow(branching: Tuple[int, ...]):
    for chain in range(0, max_nodes):
      if not branching and chain == 0:
        continue
      if static_tree(branching, chain).num_nodes > max_nodes:
        break
      out.append((branching, chain))
    if len(branching) < max_levels:
      for b in range(2, max_branching + 1):
        if static_tree(branching + (b,), 0).num_nodes <= max_nodes:
          grow(branching + (b,))

  grow(())
  return out


def best_tree(rank_probs: Sequence[float], c: float, verify_cost_ratios, max_branching: int = 4,
              max_levels: int = 3, draft_cost_ratios=None, draft_reads_features: bool = False
              ) -> Tuple[Tuple[int, ...], int, float]:
  """(branching, chain, predicted speedup) of the candidate tree (`candidate_trees`) that `tree_speedup`
  ranks first among those whose width the curve holds (and whose drafter calls the drafter's curve holds);
  ties to the smaller tree."""
  curve = {int(k): float(v) for k, v in dict(verify_cost_ratios).items()}
  widths = [k for k in curve if k >= 2]
  if not widths:
    raise ValueError(f'verify_cost_ratios holds no width >= 2, got keys {sorted(curve)}.')
  draft_curve = curve if draft_cost_ratios is None else {int(k): float(v) for k, v in dict(draft_cost_ratios).items()}
  best = None
  for branching, chain in candidate_trees(max(widths), max_branching, max_levels):
    shape = static_tree(branching, chain)
    if shape.num_nodes not in curve or any(w not in draft_curve
                                           for w in draft_call_widths(shape, draft_reads_features)):
      continue
    speedup = tree_speedup(shape, rank_probs, c, curve, draft_cost_ratios, draft_reads_features)
    if best is None or speedup > best[2] + 1e-12 or (
        abs(speedup - best[2]) <= 1e-12 and shape.num_nodes < static_tree(best[0], best[1]).num_nodes):
      best = (branching, chain, speedup)
  if best is None:
    raise ValueError(f'no candidate tree fits both cost curves (the drafter\'s holds widths {sorted(draft_curve)}).')
  return best
