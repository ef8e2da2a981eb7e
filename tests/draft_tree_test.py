"""Tests for specdec/draft_tree.py: the static tree, its mask, greedy and exact sampling verification.

The sibling rule is checked analytically (every draw of the siblings and every accept/reject branch enumerated
in float64: the emitted token's law must be p to 1e-9) and by chi-square on jitted samples; deliberately wrong
rules must fail both, so that the tests are seen to have power. The whole-tree walk is checked against a toy
target and drafter given as per-prefix tables: the law of the first tokens a round emits is the target's.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec import draft_tree
from specdec import sampling
from specdec import theory
from tests import toy

SHAPES = [((3, 2), 1), ((2,), 2), ((), 4), ((1, 3), 0), ((4,), 0)]


def _brute_force_ancestors(parent, i):
  """{i and its ancestors}, by walking up the parent links."""
  seen = {i}
  while parent[i] >= 0:
    i = int(parent[i])
    seen.add(i)
  return seen


def _log(p):
  with np.errstate(divide='ignore'):
    return np.log(np.asarray(p, np.float64))


# ---------------------------------------------------------------------------------------------------------------
# The static tree
# ---------------------------------------------------------------------------------------------------------------


class TestTreeShape:

  def test_branching_then_chain(self):
    shape = draft_tree.static_tree((3, 2), 1)
    assert shape.num_nodes == 1 + 3 + 6 + 6 and shape.max_depth == 3 and shape.max_children == 3
    np.testing.assert_array_equal(shape.parent[:10], [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(shape.parent[10:], range(4, 10))  # the chain below each of the 6 leaves
    np.testing.assert_array_equal(shape.depth, [0] + [1] * 3 + [2] * 6 + [3] * 6)
    np.testing.assert_array_equal(shape.children[0], [1, 2, 3])
    np.testing.assert_array_equal(shape.children[1], [4, 5, -1])
    np.testing.assert_array_equal(shape.children[4], [10, -1, -1])
    np.testing.assert_array_equal(shape.children[15], [-1, -1, -1])

  @pytest.mark.parametrize('branching, chain', SHAPES)
  def test_breadth_first_and_consistent(self, branching, chain):
    shape = draft_tree.static_tree(branching, chain)
    assert shape.num_nodes == 1 + sum(int(np.prod(branching[:d + 1])) for d in range(len(branching))) + (
        chain * int(np.prod(branching)))
    assert np.all(np.diff(shape.depth) >= 0) and np.all(shape.parent[1:] < np.arange(1, shape.num_nodes))
    np.testing.assert_array_equal(shape.depth[1:], shape.depth[shape.parent[1:]] + 1)
    for node in range(shape.num_nodes):
      kids = [c for c in shape.children[node] if c >= 0]
      assert kids == [i for i in range(shape.num_nodes) if shape.parent[i] == node]
    assert shape.max_depth == len(branching) + chain

  def test_chain_is_a_chain(self):
    shape = draft_tree.static_tree((), 3)
    np.testing.assert_array_equal(shape.parent, [-1, 0, 1, 2])
    np.testing.assert_array_equal(shape.depth, [0, 1, 2, 3])

  def test_hashable_static_argument(self):
    a, b = draft_tree.static_tree((2,), 1), draft_tree.static_tree((2,), 1)
    assert a == b and hash(a) == hash(b) and a != draft_tree.static_tree((1, 2), 0)
    f = jax.jit(lambda shape, x: draft_tree.tree_positions(shape, x), static_argnums=0)
    np.testing.assert_array_equal(f(a, jnp.asarray([5])), [[5, 6, 6, 7, 7]])

  @pytest.mark.parametrize('branching, chain, match', [
      ((0,), 1, 'branching'), ((2.0,), 1, 'branching'), ((True,), 1, 'branching'), ((2,), -1, 'chain'),
      ((2,), 1.5, 'chain'), ((), 0, 'at least one draft')])
  def test_bad_input(self, branching, chain, match):
    with pytest.raises(ValueError, match=match):
      draft_tree.static_tree(branching, chain)

  @pytest.mark.parametrize('parent', [[-1], [0, 0], [-1, 1], [-1, 0, 3], [-1, 0.5]])
  def test_bad_parents(self, parent):
    with pytest.raises(ValueError, match='parent'):
      draft_tree.tree_from_parents(parent)


# ---------------------------------------------------------------------------------------------------------------
# The target call's inputs
# ---------------------------------------------------------------------------------------------------------------


class TestMaskAndPositions:

  @pytest.mark.parametrize('branching, chain', SHAPES)
  def test_mask_is_the_ancestor_relation(self, branching, chain):
    shape = draft_tree.static_tree(branching, chain)
    mask = draft_tree.tree_attention_mask(shape)
    n = shape.num_nodes
    expected = np.zeros((n, n), bool)
    for i in range(n):
      expected[i, sorted(_brute_force_ancestors(shape.parent, i))] = True
    np.testing.assert_array_equal(mask, expected)

  def test_mask_of_random_parent_lists(self):
    rng = np.random.RandomState(0)
    for _ in range(20):
      n = rng.randint(2, 12)
      parent = [-1] + [int(rng.randint(0, i)) for i in range(1, n)]
      mask = draft_tree.tree_attention_mask(draft_tree.tree_from_parents(parent))
      for i, j in itertools.product(range(n), repeat=2):
        assert mask[i, j] == (j in _brute_force_ancestors(parent, i))

  @pytest.mark.parametrize('chain', [1, 2, 5])
  def test_a_chain_is_causal(self, chain):
    shape = draft_tree.static_tree((), chain)
    np.testing.assert_array_equal(draft_tree.tree_attention_mask(shape), np.tril(np.ones((chain + 1,) * 2, bool)))
    cur_b = jnp.asarray([0, 3, 7])
    positions = draft_tree.tree_positions(shape, cur_b)
    np.testing.assert_array_equal(positions, np.asarray(cur_b)[:, None] + np.arange(chain + 1))
    # The cache mask of a chain is network.decode_step's causal mask: slot l visible iff l <= position.
    length = 12
    np.testing.assert_array_equal(draft_tree.tree_cache_mask(shape, cur_b, length),
                                  np.arange(length)[None, None, :] <= np.asarray(positions)[:, :, None])

  def test_positions_are_cur_plus_depth(self):
    shape = draft_tree.static_tree((3, 2), 1)
    positions = draft_tree.tree_positions(shape, jnp.asarray([4, 9]))
    assert positions.shape == (2, 16) and positions.dtype == jnp.int32
    np.testing.assert_array_equal(positions, np.asarray([[4], [9]]) + shape.depth)

  def test_cache_mask(self):
    shape = draft_tree.static_tree((2, 2), 0)
    cur_b, length = np.asarray([0, 2]), 10
    mask = np.asarray(draft_tree.tree_cache_mask(shape, jnp.asarray(cur_b), length))
    assert mask.shape == (2, 7, length)
    for b, i, l in itertools.product(range(2), range(7), range(length)):
      slot = l - cur_b[b]
      expected = slot < 0 or (slot < 7 and slot in _brute_force_ancestors(shape.parent, i))
      assert mask[b, i, l] == expected, (b, i, l)

  def test_key_positions(self):
    shape = draft_tree.static_tree((2,), 1)  # depths 0, 1, 1, 2, 2
    keys = draft_tree.tree_key_positions(shape, jnp.asarray([0, 3]), 10)
    np.testing.assert_array_equal(keys, [[0, 1, 1, 2, 2, 5, 6, 7, 8, 9],
                                         [0, 1, 2, 3, 4, 4, 5, 5, 8, 9]])
    chain = draft_tree.static_tree((), 3)  # a chain's slots hold their own positions
    np.testing.assert_array_equal(draft_tree.tree_key_positions(chain, jnp.asarray([0, 2, 6]), 8),
                                  np.broadcast_to(np.arange(8), (3, 8)))

  def test_bad_cur_index(self):
    shape = draft_tree.static_tree((2,), 0)
    with pytest.raises(ValueError, match='cur_index_b'):
      draft_tree.tree_positions(shape, jnp.zeros((2, 1), jnp.int32))
    with pytest.raises(ValueError, match='cur_index_b'):
      draft_tree.tree_cache_mask(shape, 3, 8)
    with pytest.raises(ValueError, match='cur_index_b'):
      draft_tree.tree_key_positions(shape, 3, 8)


# ---------------------------------------------------------------------------------------------------------------
# Greedy verification
# ---------------------------------------------------------------------------------------------------------------


def _brute_force_greedy(shape, tokens_n, logits_nv):
  """(path, next token) by a Python walk: the first child whose token is the argmax, until none is."""
  node, path = 0, []
  while True:
    want = int(np.argmax(logits_nv[node]))
    hit = [int(c) for c in shape.children[node] if c >= 0 and tokens_n[c] == want]
    if not hit:
      return path, want
    node = hit[0]
    path.append(node)


def _greedy_drafts(rng, shape, logits_bnv, hit_rate, vocab):
  """Drafts that often equal the argmax of their parent's logits (else random), so walks go deep."""
  argmax_bn = np.argmax(logits_bnv, axis=-1)
  tokens = rng.randint(0, vocab, size=argmax_bn.shape)
  lucky = rng.rand(*argmax_bn.shape) < hit_rate
  tokens[:, 1:] = np.where(lucky[:, 1:], argmax_bn[:, shape.parent[1:]], tokens[:, 1:])
  return tokens


class TestGreedy:

  @pytest.mark.parametrize('branching, chain', SHAPES)
  def test_equals_a_brute_force_walk(self, branching, chain):
    shape = draft_tree.static_tree(branching, chain)
    rng = np.random.RandomState(len(branching) * 10 + chain)
    batch, vocab = 64, 6
    logits = rng.normal(size=(batch, shape.num_nodes, vocab)).astype(np.float32)
    tokens = _greedy_drafts(rng, shape, logits, 0.6, vocab)
    verdict = jax.jit(draft_tree.verify_tree_greedy, static_argnums=0)(shape, jnp.asarray(tokens),
                                                                       jnp.asarray(logits))
    depths = []
    for b in range(batch):
      path, nxt = _brute_force_greedy(shape, tokens[b], logits[b])
      n = len(path)
      depths.append(n)
      assert int(verdict.num_accepted_b[b]) == n
      np.testing.assert_array_equal(verdict.path_bd[b], path + [-1] * (shape.max_depth - n))
      np.testing.assert_array_equal(verdict.tokens_bd[b], [tokens[b, c] for c in path] + [0] * (shape.max_depth - n))
      assert int(verdict.last_node_b[b]) == (path[-1] if path else 0)
      assert int(verdict.next_token_b[b]) == nxt
    assert min(depths) == 0 and max(depths) == shape.max_depth  # both ends of the walk were exercised

  def test_duplicate_siblings_take_the_first(self):
    shape = draft_tree.static_tree((3,), 1)  # root -> 1, 2, 3; below them 4, 5, 6
    vocab = 5
    logits = np.zeros((2, 7, vocab), np.float32)
    logits[:, 0, 2] = 1.0  # the root's argmax: 2
    logits[:, 1, 3] = 1.0  # node 1's argmax: 3
    logits[:, 2, 4] = 1.0  # node 2's argmax: 4
    logits[:, 5, 1] = 1.0  # node 5's argmax: 1
    tokens = np.asarray([[4, 2, 2, 2, 0, 4, 1],    # 1, 2 and 3 all match: node 1 is taken, its child 0 is not 3
                         [4, 1, 2, 2, 0, 4, 1]])   # node 2 is the first match, its child 5 (token 4) too
    verdict = draft_tree.verify_tree_greedy(shape, jnp.asarray(tokens), jnp.asarray(logits))
    np.testing.assert_array_equal(verdict.path_bd, [[1, -1], [2, 5]])
    np.testing.assert_array_equal(verdict.tokens_bd, [[2, 0], [2, 4]])
    np.testing.assert_array_equal(verdict.next_token_b, [3, 1])
    for b in range(2):
      path, nxt = _brute_force_greedy(shape, tokens[b], logits[b])
      assert path == [c for c in np.asarray(verdict.path_bd[b]) if c >= 0] and nxt == verdict.next_token_b[b]

  def test_invalid_nodes_are_never_accepted(self):
    shape = draft_tree.static_tree((2,), 0)
    logits = jnp.asarray(np.eye(4, dtype=np.float32)[[1, 0, 0]][None])
    tokens = jnp.asarray([[0, 1, 1]])
    valid = jnp.asarray([[True, False, True]])
    verdict = draft_tree.verify_tree_greedy(shape, tokens, logits, valid)
    np.testing.assert_array_equal(verdict.path_bd, [[2]])

  @pytest.mark.parametrize('gamma', [1, 4])
  def test_a_chain_is_verify_greedy(self, gamma):
    shape = draft_tree.static_tree((), gamma)
    rng = np.random.RandomState(gamma)
    logits = rng.normal(size=(200, gamma + 1, 5)).astype(np.float32)
    tokens = _greedy_drafts(rng, shape, logits, 0.7, 5)
    tree = draft_tree.verify_tree_greedy(shape, jnp.asarray(tokens), jnp.asarray(logits))
    chain = sampling.verify_greedy(jnp.asarray(tokens[:, 1:]), jnp.asarray(logits))
    np.testing.assert_array_equal(tree.num_accepted_b, chain.num_accepted_b)
    np.testing.assert_array_equal(tree.next_token_b, chain.next_token_b)

  def test_output_is_the_baseline_greedy_decode(self):
    # A toy target whose logits depend on the whole prefix, and an unrelated drafter whose top-k at each node
    # are the children: the tokens a round emits are the first tokens of the target's own greedy decode.
    vocab, rows = 5, 128
    rng = np.random.RandomState(3)
    target, drafter = _PrefixTable(rng, vocab, 0.0), _PrefixTable(rng, vocab, 0.0)
    shape = draft_tree.static_tree((3, 2), 1)
    contexts, tokens, logits = [], [], []
    for _ in range(rows):
      context = [int(t) for t in rng.randint(0, vocab, size=rng.randint(0, 3))]
      row_tokens, prefixes = [context[-1] if context else 0], [context]
      for i in range(1, shape.num_nodes):
        parent = shape.parent[i]
        rank = list(shape.children[parent]).index(i)
        token = int(np.argsort(-drafter.logits(prefixes[parent]), kind='stable')[rank])
        if rng.rand() < 0.5:  # sometimes the target's own choice, so that walks go deep
          token = int(np.argmax(target.logits(prefixes[parent])))
        row_tokens.append(token)
        prefixes.append(prefixes[parent] + [token])
      contexts.append(context)
      tokens.append(row_tokens)
      logits.append(np.stack([target.logits(p) for p in prefixes]))
    verdict = draft_tree.verify_tree_greedy(shape, jnp.asarray(tokens), jnp.asarray(np.stack(logits)))
    for r, context in enumerate(contexts):
      emitted = [int(t) for t in np.asarray(verdict.tokens_bd[r, :int(verdict.num_accepted_b[r])])] + [
          int(verdict.next_token_b[r])]
      baseline = list(context)
      for _ in emitted:
        baseline.append(int(np.argmax(target.logits(baseline))))
      assert emitted == baseline[len(context):], r
    assert len(set(np.asarray(verdict.num_accepted_b).tolist())) == shape.max_depth + 1


# ---------------------------------------------------------------------------------------------------------------
# One node's siblings: the analytic law
# ---------------------------------------------------------------------------------------------------------------


def _draws(q, k, rule, fixed_tokens):
  """[(probability, tokens, valid)] of every draw of k children from q by `rule` (float64, exact)."""
  vocab = len(q)
  if rule == 'fixed':
    return [(1.0, tuple(fixed_tokens), (True,) * k)]
  if rule == 'with_replacement':
    return [(float(np.prod(q[list(t)])), t, (True,) * k) for t in itertools.product(range(vocab), repeat=k)
            if np.prod(q[list(t)]) > 0]
  draws = []

  def extend(prob, tokens, valid, left):
    if len(tokens) == k:
      draws.append((prob, tuple(tokens), tuple(valid)))
      return
    mass = left.sum()
    if mass <= 0:  # nothing left to draw: the child does not exist
      extend(prob, tokens + [0], valid + [False], left)
      return
    for x in np.flatnonzero(left):
      rest = left.copy()
      rest[x] = 0.0
      extend(prob * left[x] / mass, tokens + [int(x)], valid + [True], rest)

  extend(1.0, [], [], np.asarray(q, np.float64))
  return draws


def _emitted_law(p, q, k, draw_rule, verify_rule=None, fixed_tokens=None):
  """The exact law of the token one node emits, float64: Σ over draws of P(draw) × [Σ_i a_i Π_{j<i}(1 - a_j)
  1{x_i} + Π_j (1 - a_j) p_{k+1}], with a_i and p_{k+1} from the module's `sibling_acceptance`."""
  draws = _draws(q, k, draw_rule, fixed_tokens)
  prob_d = np.asarray([d[0] for d in draws])
  tokens_dk = np.asarray([d[1] for d in draws], np.int32)
  valid_dk = np.asarray([d[2] for d in draws], bool)
  vocab = len(p)
  with jax.enable_x64(True):
    logp_dv = jnp.asarray(np.broadcast_to(_log(p), (len(draws), vocab)))
    logq_dv = jnp.asarray(np.broadcast_to(_log(q), (len(draws), vocab)))
    logq_dkv, valid = draft_tree.sibling_draft_log_probs(logq_dv, jnp.asarray(tokens_dk), jnp.asarray(valid_dk),
                                                         verify_rule or draw_rule)
    accept_dk, final_dv = draft_tree.sibling_acceptance(logp_dv, logq_dkv, jnp.asarray(tokens_dk), valid)
  # What the module returns is float64 under x64, before any cast here: a float32 result would leave ~1e-7 of
  # rounding, and a 1e-9 check would then fail for that, not for the rule.
  assert accept_dk.dtype == jnp.float64 and final_dv.dtype == jnp.float64, (accept_dk.dtype, final_dv.dtype)
  accept_dk, final_dv = np.asarray(accept_dk), np.exp(np.asarray(final_dv))
  law = np.zeros(vocab)
  for d in range(len(draws)):
    reach = 1.0
    for i in range(k):
      law[tokens_dk[d, i]] += prob_d[d] * reach * accept_dk[d, i]
      reach *= 1.0 - accept_dk[d, i]
    law += prob_d[d] * reach * final_dv[d]
  return law


def _pairs():
  """(name, p, q) over V = 5: random pairs, zeros in q or p, q = p, disjoint supports, q narrower than k."""
  rng = np.random.RandomState(0)
  pairs = [(f'random{s}', rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))) for s in range(4)]
  p = rng.dirichlet(np.ones(5))
  pairs.append(('q=p', p, p.copy()))
  q = rng.dirichlet(np.ones(5))
  q[[1, 3]] = 0.0
  pairs.append(('q zeros', rng.dirichlet(np.ones(5)), q / q.sum()))
  p = rng.dirichlet(np.ones(5))
  p[[0, 4]] = 0.0
  pairs.append(('p zeros', p / p.sum(), rng.dirichlet(np.ones(5))))
  pairs.append(('disjoint', np.asarray([0.5, 0.5, 0, 0, 0]), np.asarray([0, 0, 0.2, 0.3, 0.5])))
  pairs.append(('q one token', rng.dirichlet(np.ones(5)), np.asarray([0, 0, 1.0, 0, 0])))
  pairs.append(('peaked', np.asarray([0.9, 0.05, 0.03, 0.02, 0.0]), np.asarray([0.02, 0.03, 0.05, 0.0, 0.9])))
  return pairs


PAIRS = _pairs()


class TestSiblingLaw:
  """The emitted token's exact law is p, for every rule, k and (p, q)."""

  @pytest.mark.parametrize('rule', ['with_replacement', 'without_replacement'])
  @pytest.mark.parametrize('k', [1, 2, 3])
  def test_drawn_children(self, rule, k):
    for name, p, q in PAIRS:
      np.testing.assert_allclose(_emitted_law(p, q, k, rule), p, atol=1e-9, err_msg=name)

  @pytest.mark.parametrize('fixed', [(0,), (4, 1), (2, 0, 3), (3, 2, 1, 0)])
  def test_fixed_children(self, fixed):
    # Any fixed children (top-k of q or not, p-zero tokens included) are verified exactly.
    for name, p, q in PAIRS:
      law = _emitted_law(p, q, len(fixed), 'fixed', fixed_tokens=fixed)
      np.testing.assert_allclose(law, p, atol=1e-9, err_msg=name)

  def test_wrong_q_update_is_detected(self):
    # Children drawn without replacement but verified as if i.i.d. (q never updated): a wrong law.
    errors = [np.max(np.abs(_emitted_law(p, q, 2, 'without_replacement', 'with_replacement') - p))
              for _, p, q in PAIRS]
    assert max(errors) > 1e-2, errors
    # ... and i.i.d. children verified as if drawn without replacement.
    errors = [np.max(np.abs(_emitted_law(p, q, 2, 'with_replacement', 'without_replacement') - p))
              for _, p, q in PAIRS]
    assert max(errors) > 1e-2, errors

  @pytest.mark.parametrize('rule', ['with_replacement', 'without_replacement'])
  def test_wrong_p_update_is_detected(self, rule, monkeypatch):
    # p not updated after a rejection (the residual replaced by p itself): a wrong law.
    monkeypatch.setattr(draft_tree.sampling, 'residual_log_probs', lambda logp, logq: logp)
    errors = [np.max(np.abs(_emitted_law(p, q, 2, rule) - p)) for _, p, q in PAIRS]
    assert max(errors) > 1e-2, errors

  def test_one_child_is_algorithm_1(self):
    # k = 1: a_1 and p_2 are sampling.py's acceptance probability and residual.
    for _, p, q in PAIRS:
      logp, logq = jnp.asarray(_log(p), jnp.float32), jnp.asarray(_log(q), jnp.float32)
      for x in range(5):
        logq_kv, valid = draft_tree.sibling_draft_log_probs(logq, jnp.asarray([x]), jnp.asarray([True]),
                                                            'with_replacement')
        accept, final = draft_tree.sibling_acceptance(logp, logq_kv, jnp.asarray([x]), valid)
        np.testing.assert_allclose(accept[0], sampling.acceptance_probability(logp[x], logq[x]), atol=1e-6)
        residual = np.exp(np.asarray(sampling.residual_log_probs(logp, logq), np.float64))
        np.testing.assert_allclose(np.exp(np.asarray(final)), residual / residual.sum(), atol=1e-6)

  def test_without_replacement_q_update(self):
    q = np.asarray([0.1, 0.2, 0.3, 0.4, 0.0])
    logq_kv, valid = draft_tree.sibling_draft_log_probs(
        jnp.asarray(_log(q), jnp.float32), jnp.asarray([3, 1, 0]), jnp.asarray([True, True, True]),
        'without_replacement')
    np.testing.assert_allclose(np.exp(np.asarray(logq_kv)),
                               [q, [1 / 6, 2 / 6, 3 / 6, 0, 0], [0.25, 0, 0.75, 0, 0]], atol=1e-6)
    assert np.all(np.asarray(valid))
    # With one token of mass, a second child cannot exist.
    _, valid = draft_tree.sibling_draft_log_probs(
        jnp.asarray(_log([0, 1.0, 0, 0, 0]), jnp.float32), jnp.asarray([1, 0]), jnp.asarray([True, True]),
        'without_replacement')
    np.testing.assert_array_equal(valid, [True, False])

  def test_bad_rule(self):
    with pytest.raises(ValueError, match='rule'):
      draft_tree.sibling_draft_log_probs(jnp.zeros(4), jnp.zeros(2, jnp.int32), jnp.ones(2, bool), 'iid')
    with pytest.raises(ValueError, match='k must'):
      draft_tree.draw_children(jax.random.PRNGKey(0), jnp.zeros(4), 0, 'fixed')
    with pytest.raises(ValueError, match='vocabulary'):
      draft_tree.draw_children(jax.random.PRNGKey(0), jnp.zeros(4), 5, 'without_replacement')


# ---------------------------------------------------------------------------------------------------------------
# One node's siblings: sampled
# ---------------------------------------------------------------------------------------------------------------

ROWS = 200_000


def _sampled_tokens(p, q, k, draw_rule, verify_rule=None, seed=0):
  """ROWS jitted one-node rounds: children drawn by `draw_rule`, verified by `verify_rule`; the emitted tokens."""
  logp = jnp.broadcast_to(jnp.asarray(_log(p), jnp.float32), (ROWS, len(p)))
  logq = jnp.broadcast_to(jnp.asarray(_log(q), jnp.float32), (ROWS, len(q)))

  @jax.jit
  def run(rng, logp, logq):  # arguments, not constants: XLA would spend seconds folding [ROWS, V] constants
    draw_rng, verify_rng = jax.random.split(rng)
    tokens_bk, valid_bk = draft_tree.draw_children(draw_rng, logq, k, draw_rule)
    return draft_tree.verify_siblings(verify_rng, logp, logq, tokens_bk, valid_bk, verify_rule or draw_rule)

  verdict = run(jax.random.PRNGKey(seed), logp, logq)
  return np.asarray(verdict.token_x), np.asarray(verdict.accepted_x)


def _pvalue(tokens, p):
  return toy.chi_square_pvalue(tokens[:, None], {(v,): float(pv) for v, pv in enumerate(p) if pv > 0})


# A pair where the wrong rules are far off (analytic error ~0.05-0.1), so 200k samples see them.
POWER_P = np.asarray([0.45, 0.3, 0.15, 0.1, 0.0])
POWER_Q = np.asarray([0.1, 0.15, 0.3, 0.35, 0.1])


class TestSiblingSamples:

  @pytest.mark.parametrize('rule, k', [('with_replacement', 3), ('without_replacement', 3), ('fixed', 2),
                                       ('without_replacement', 5)])
  def test_chi_square(self, rule, k):
    for seed, (name, p, q) in enumerate([PAIRS[0], PAIRS[5], (None, POWER_P, POWER_Q)]):
      tokens, accepted = _sampled_tokens(p, q, k, rule, seed=seed)
      assert _pvalue(tokens, p) > 1e-3, (name, rule, k)
      if k < np.count_nonzero(q):
        assert 0 < np.mean(accepted >= 0) < 1  # both branches taken
      elif rule == 'without_replacement':
        # Every token q can draw was drafted: all are rejected exactly when the emitted token is one q
        # cannot draw (rejected tokens have no mass left in the residual).
        outside = p[q == 0].sum()
        assert abs(np.mean(accepted < 0) - outside) < 5 * np.sqrt(outside * (1 - outside) / ROWS) + 1e-9

  def test_wrong_q_update_fails(self):
    assert np.max(np.abs(_emitted_law(POWER_P, POWER_Q, 3, 'without_replacement', 'with_replacement')
                         - POWER_P)) > 0.02
    tokens, _ = _sampled_tokens(POWER_P, POWER_Q, 3, 'without_replacement', 'with_replacement')
    assert _pvalue(tokens, POWER_P) < 1e-6

  def test_wrong_p_update_fails(self, monkeypatch):
    monkeypatch.setattr(draft_tree.sampling, 'residual_log_probs', lambda logp, logq: logp)
    assert np.max(np.abs(_emitted_law(POWER_P, POWER_Q, 3, 'without_replacement') - POWER_P)) > 0.02
    tokens, _ = _sampled_tokens(POWER_P, POWER_Q, 3, 'without_replacement')
    assert _pvalue(tokens, POWER_P) < 1e-6

  def test_draws_without_replacement_are_sequential_draws(self):
    # Gumbel-top-k's ordered children have the law of drawing one by one without replacement.
    q = POWER_Q
    logq = jnp.broadcast_to(jnp.asarray(_log(q), jnp.float32), (ROWS, 5))
    tokens, valid = jax.jit(lambda r, lq: draft_tree.draw_children(r, lq, 2, 'without_replacement'))(
        jax.random.PRNGKey(7), logq)
    assert np.all(np.asarray(valid))
    law = {d[1]: d[0] for d in _draws(q, 2, 'without_replacement', None)}
    assert toy.chi_square_pvalue(np.asarray(tokens), law) > 1e-3
    # Not the i.i.d. law: the same test rejects it.
    iid = {t: float(q[t[0]] * q[t[1]]) for t in itertools.product(range(5), repeat=2)}
    assert toy.chi_square_pvalue(np.asarray(tokens), iid) < 1e-6

  def test_draw_children_edge_cases(self):
    logq = jnp.asarray(_log([[0, 0.5, 0, 0.5, 0], [0, 0, 1.0, 0, 0]]), jnp.float32)
    for rule in ('without_replacement', 'fixed'):
      tokens, valid = draft_tree.draw_children(jax.random.PRNGKey(0), logq, 3, rule)
      np.testing.assert_array_equal(valid, [[True, True, False], [True, False, False]])
      assert sorted(np.asarray(tokens[0, :2]).tolist()) == [1, 3] and int(tokens[1, 0]) == 2
    tokens, valid = draft_tree.draw_children(jax.random.PRNGKey(0), logq, 3, 'with_replacement')
    assert np.all(np.asarray(valid)) and set(np.asarray(tokens[1]).tolist()) == {2}


# ---------------------------------------------------------------------------------------------------------------
# The whole tree
# ---------------------------------------------------------------------------------------------------------------


class _PrefixTable:
  """A toy model as a table: log-probabilities over `vocab` tokens for every prefix (up to a few tokens)."""

  def __init__(self, rng, vocab, zero_rate, max_len=6):
    self.vocab = vocab
    size = (vocab + 1) ** max_len
    logits = rng.normal(size=(size, vocab)) * 1.5
    zero = rng.rand(size, vocab) < zero_rate
    zero[np.arange(size), rng.randint(0, vocab, size)] = False  # every prefix keeps some mass
    logits[zero] = -np.inf
    self.logp = (logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)).astype(np.float32)

  def code(self, prefix):
    """A prefix's row: tokens as base-(V+1) digits 1..V, so prefixes of different lengths differ."""
    c = 0
    for t in prefix:
      c = c * (self.vocab + 1) + int(t) + 1
    return c

  def logits(self, prefix):
    return self.logp[self.code(prefix)]

  def probs(self, prefix):
    p = np.exp(self.logp[self.code(prefix)].astype(np.float64))
    return p / p.sum()


def _draft_rows(shape, p_table, q_table, rule, rows, draw_rng):
  """`rows` trees drafted from the empty prefix node by node (children drawn from the drafter's q at their parent
  by `rule`): (tokens_bn, valid_bn, the drafter's log q at each node, the target's log p at each node)."""
  vocab = p_table.shape[1]
  keys = jax.random.split(draw_rng, shape.num_nodes)
  code = [jnp.zeros((rows,), jnp.int32)] + [None] * (shape.num_nodes - 1)
  tokens = [jnp.zeros((rows,), jnp.int32)] + [None] * (shape.num_nodes - 1)
  valid = [jnp.ones((rows,), bool)] + [None] * (shape.num_nodes - 1)
  for node in range(shape.num_nodes):  # breadth-first: a node's code is known before its children are drawn
    kids = [int(c) for c in shape.children[node] if c >= 0]
    if not kids:
      continue
    kid_tokens, kid_valid = draft_tree.draw_children(keys[node], q_table[code[node]], len(kids), rule)
    for i, kid in enumerate(kids):
      tokens[kid], valid[kid] = kid_tokens[:, i], kid_valid[:, i] & valid[node]
      code[kid] = code[node] * (vocab + 1) + tokens[kid] + 1
  code_bn = jnp.stack(code, axis=1)
  return jnp.stack(tokens, axis=1), jnp.stack(valid, axis=1), q_table[code_bn], p_table[code_bn]


def _tree_round(shape, target, drafter, rule, rows, seed, wrong_q=False, verify_rule=None):
  """ROWS jitted tree rounds from the empty prefix: the tree drafted node by node (`_draft_rows`), verified by
  `verify_tree`. Returns the emitted sequences (accepted tokens then the next token, -1 padded) [rows, D+1]."""
  p_table, q_table = jnp.asarray(target.logp), jnp.asarray(drafter.logp)

  @jax.jit
  def run(rng, p_table, q_table):
    draw_rng, verify_rng = jax.random.split(rng)
    tokens_bn, valid_bn, logq_bnv, logp_bnv = _draft_rows(shape, p_table, q_table, rule, rows, draw_rng)
    if wrong_q:  # a bug to catch: every node verified with the root's q
      logq_bnv = jnp.broadcast_to(logq_bnv[:, :1], logq_bnv.shape)
    return draft_tree.verify_tree(verify_rng, shape, tokens_bn, logq_bnv, logp_bnv, valid_bn, verify_rule or rule)

  verdict = run(jax.random.PRNGKey(seed), p_table, q_table)
  tokens_bd, n_b = np.asarray(verdict.tokens_bd), np.asarray(verdict.num_accepted_b)
  emitted = np.full((rows, shape.max_depth + 1), -1, np.int64)
  emitted[:, :shape.max_depth] = np.where(np.arange(shape.max_depth) < n_b[:, None], tokens_bd, -1)
  emitted[np.arange(rows), n_b] = np.asarray(verdict.next_token_b)
  return emitted, n_b


def _complete(emitted, target, length, seed):
  """The first `length` tokens, sampled from the exact target where the round emitted fewer (as the next
  round would): then an exact round has the target's law over them."""
  rng = np.random.RandomState(seed)
  out = emitted[:, :length].copy()
  for t in range(length):
    missing = np.flatnonzero(out[:, t] < 0)
    prefixes = {tuple(r) for r in out[missing, :t]}
    for prefix in sorted(prefixes):  # one draw per row, grouped by prefix
      rows = missing[np.all(out[missing, :t] == np.asarray(prefix, np.int64), axis=1)]
      out[rows, t] = rng.choice(target.vocab, size=len(rows), p=target.probs(prefix))
  return out


def _target_law(target, length):
  law = {}
  for seq in itertools.product(range(target.vocab), repeat=length):
    prob = 1.0
    for t in range(length):
      prob *= target.probs(seq[:t])[seq[t]]
    if prob > 0:
      law[seq] = prob
  return law


TREES = [((2,), 1), ((3, 2), 0), ((2,), 2)]


class TestWholeTree:
  ROWS = 100_000

  @pytest.fixture(scope='class')
  def models(self):
    rng = np.random.RandomState(11)
    return _PrefixTable(rng, 4, 0.2), _PrefixTable(rng, 4, 0.2)

  @pytest.mark.parametrize('branching, chain', TREES)
  @pytest.mark.parametrize('rule', draft_tree.RULES)
  def test_emitted_law_is_the_targets(self, models, branching, chain, rule):
    target, drafter = models
    shape = draft_tree.static_tree(branching, chain)
    emitted, n_b = _tree_round(shape, target, drafter, rule, self.ROWS, seed=1)
    assert np.all(np.isin(emitted[:, 0], range(4)))
    # Walks of every length happen, so the law below covers accepted, rejected and bonus tokens.
    assert set(np.unique(n_b)) == set(range(shape.max_depth + 1))
    assert _pvalue(emitted[:, 0], target.probs([])) > 1e-3
    first_two = _complete(emitted, target, 2, seed=2)
    assert toy.chi_square_pvalue(first_two, _target_law(target, 2)) > 1e-3
    # The second token where the first was an accepted draft: the target's law given the first.
    accepted = n_b >= 1
    for first in range(4):
      rows = accepted & (emitted[:, 0] == first)
      if rows.sum() > 2000:
        assert _pvalue(emitted[rows, 1], target.probs([first])) > 1e-3, first
    if shape.max_depth >= 3:
      first_three = _complete(emitted, target, 3, seed=3)
      assert toy.chi_square_pvalue(first_three, _target_law(target, 3)) > 1e-3

  @pytest.mark.parametrize('bug', ['root q everywhere', 'q not updated', 'p not updated'])
  def test_a_wrong_walk_fails(self, models, bug, monkeypatch):
    target, drafter = models
    shape = draft_tree.static_tree((3, 2), 0)
    if bug == 'p not updated':
      monkeypatch.setattr(draft_tree.sampling, 'residual_log_probs', lambda logp, logq: logp)
    emitted, _ = _tree_round(shape, target, drafter, 'without_replacement', self.ROWS, seed=1,
                             wrong_q=bug == 'root q everywhere',
                             verify_rule='with_replacement' if bug == 'q not updated' else None)
    assert toy.chi_square_pvalue(_complete(emitted, target, 2, seed=2), _target_law(target, 2)) < 1e-6

  def test_a_chain_accepts_like_verify(self, models):
    """A chain tree (one child per node) is Algorithm 1: on the same drafts, q and p, `verify_tree` and
    `sampling.verify` draw (accepted count, next token) from the same law, and the counts from the exact
    per-row law of Algorithm 1 (draft j+1 kept with min(1, p_j/q_j) once drafts 1..j were)."""
    target, drafter = models
    shape = draft_tree.static_tree((), 2)

    @jax.jit
    def run(rng, p_table, q_table, wrong_q):
      draw_rng, tree_rng, chain_rng = jax.random.split(rng, 3)
      tokens_bn, valid_bn, logq_bnv, logp_bnv = _draft_rows(shape, p_table, q_table, 'with_replacement', self.ROWS,
                                                            draw_rng)
      tree_logq_bnv = jnp.where(wrong_q, jnp.broadcast_to(logq_bnv[:, :1], logq_bnv.shape), logq_bnv)
      tree = draft_tree.verify_tree(tree_rng, shape, tokens_bn, tree_logq_bnv, logp_bnv, valid_bn,
                                    'with_replacement')
      chain = sampling.verify(chain_rng, tokens_bn[:, 1:], logq_bnv[:, :2], logp_bnv)
      drafts_bg = tokens_bn[:, 1:]
      accept_bg = sampling.acceptance_probability(sampling.token_log_prob(logp_bnv[:, :2], drafts_bg),
                                                  sampling.token_log_prob(logq_bnv[:, :2], drafts_bg))
      return tree, chain, accept_bg

    tables = jnp.asarray(target.logp), jnp.asarray(drafter.logp)
    tree, chain, accept_bg = run(jax.random.PRNGKey(4), *tables, False)
    a1, a2 = np.asarray(accept_bg, np.float64).T
    expected = np.stack([1 - a1, a1 * (1 - a2), a1 * a2], axis=1).sum(axis=0)  # Σ over rows of P(n | row)
    counts = {}
    for name, verdict in (('tree', tree), ('verify', chain)):
      n_b, next_b = np.asarray(verdict.num_accepted_b), np.asarray(verdict.next_token_b)
      counts[name] = np.bincount(n_b * target.vocab + next_b, minlength=3 * target.vocab)
      # Rows differ in their law: Pearson's statistic against the summed expectation is conservative, not wrong.
      assert stats.chisquare(np.bincount(n_b, minlength=3), expected).pvalue > 1e-3, name
    assert np.all(counts['tree'].reshape(3, -1).sum(axis=1) > 1000)  # every count, 0 to 2, is common
    keep = (counts['tree'] + counts['verify']) > 0
    assert stats.chi2_contingency(np.stack([counts['tree'][keep], counts['verify'][keep]])).pvalue > 1e-3
    # The same check sees a walk that verifies every node with the root's q.
    wrong, _, _ = run(jax.random.PRNGKey(4), *tables, True)
    wrong_counts = np.bincount(np.asarray(wrong.num_accepted_b) * target.vocab + np.asarray(wrong.next_token_b),
                               minlength=3 * target.vocab)
    keep = (wrong_counts + counts['verify']) > 0
    assert stats.chi2_contingency(np.stack([wrong_counts[keep], counts['verify'][keep]])).pvalue < 1e-6

  def test_identical_models_accept_everything(self, models):
    target, _ = models
    shape = draft_tree.static_tree((2,), 1)
    _, n_b = _tree_round(shape, target, target, 'with_replacement', 2000, seed=6)
    assert np.all(n_b == shape.max_depth)

  def test_bad_shapes(self):
    shape = draft_tree.static_tree((2,), 0)
    good = jnp.zeros((1, 3, 4))
    with pytest.raises(ValueError, match='tokens_bn'):
      draft_tree.verify_tree(jax.random.PRNGKey(0), shape, jnp.zeros((1, 4), jnp.int32), good, good)
    with pytest.raises(ValueError, match='draft_logq_bnv'):
      draft_tree.verify_tree(jax.random.PRNGKey(0), shape, jnp.zeros((1, 3), jnp.int32), good[:, :2], good)
    with pytest.raises(ValueError, match='target_logits_bnv'):
      draft_tree.verify_tree_greedy(shape, jnp.zeros((1, 3), jnp.int32), good[0])
    with pytest.raises(ValueError, match='rule'):
      draft_tree.verify_tree(jax.random.PRNGKey(0), shape, jnp.zeros((1, 3), jnp.int32), good, good, rule='x')
    with pytest.raises(ValueError, match='draft_logq_bnv is needed'):
      draft_tree.verify_tree(jax.random.PRNGKey(0), shape, jnp.zeros((1, 3), jnp.int32), None, good)

  def test_fixed_rule_needs_no_q(self):
    shape = draft_tree.static_tree((2,), 1)
    rng = np.random.RandomState(0)
    logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(50, 5, 4)), jnp.float32))
    tokens = jnp.asarray(rng.randint(0, 4, size=(50, 5)))
    with_q = draft_tree.verify_tree(jax.random.PRNGKey(1), shape, tokens, logp[::-1], logp, rule='fixed')
    without_q = draft_tree.verify_tree(jax.random.PRNGKey(1), shape, tokens, None, logp, rule='fixed')
    for a, b in zip(with_q, without_q):
      np.testing.assert_array_equal(a, b)


def _exact_tables(vocab=3, seed=5):
  """{prefix: p} and {prefix: q} (float64) for every prefix of up to two tokens: random laws, with a token of no
  mass in a few of them (q lacking one of p's tokens, p lacking one of q's)."""
  rng = np.random.RandomState(seed)
  prefixes = [()] + [(a,) for a in range(vocab)] + [(a, b) for a in range(vocab) for b in range(vocab)]
  p, q = {}, {}
  for i, prefix in enumerate(prefixes):
    p[prefix], q[prefix] = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
    if i % 4 == 1:
      q[prefix][i % vocab] = 0.0
    if i % 4 == 2:
      p[prefix][(i + 1) % vocab] = 0.0
    p[prefix], q[prefix] = p[prefix] / p[prefix].sum(), q[prefix] / q[prefix].sum()
  return p, q


def _tree_drafts(shape, q, rule):
  """Every draft of `shape` (children drawn from q at their parent's prefix by `rule`, 'fixed': q's top-k), as
  rows: (probability [R], tokens [R, n], valid [R, n], prefix of each node [R][n])."""
  rows = [(1.0, [0], [True], [()])]
  for node in range(shape.num_nodes):  # breadth-first: a node's prefix is known before its children are drawn
    kids = [int(c) for c in shape.children[node] if c >= 0]
    if not kids:
      continue
    grown = []
    for prob, tokens, valid, prefixes in rows:
      if not valid[node]:  # an invalid node's children do not exist
        draws = [(1.0, (0,) * len(kids), (False,) * len(kids))]
      else:
        law = q[prefixes[node]]
        draws = _draws(law, len(kids), rule, tuple(np.argsort(-law, kind='stable')[:len(kids)]))
      for d_prob, d_tokens, d_valid in draws:
        t, v, pre = list(tokens), list(valid), list(prefixes)
        for kid, token, ok in zip(kids, d_tokens, d_valid):
          t.append(int(token))
          v.append(bool(ok and valid[node]))
          pre.append(prefixes[node] + (int(token),))
        assert len(t) == kids[-1] + 1  # breadth-first numbering: the kids are the next nodes
        grown.append((prob * d_prob, t, v, pre))
    rows = grown
  return (np.asarray([r[0] for r in rows]), np.asarray([r[1] for r in rows], np.int32),
          np.asarray([r[2] for r in rows], bool), [r[3] for r in rows])


def _exact_two_token_law(shape, p, q, rule, wrong_q=False):
  """The exact law of the first two tokens of a decode whose first round drafts `shape` from q and is walked by
  `verify_tree` against p (the next round, where this one emitted one token, draws from p): every draft and every
  coin outcome enumerated, float64.

  The coins are enumerated through `verify_tree` itself: its draw of the first accepted child at depth d is
  replaced by a chosen outcome (-1: all rejected), weighted by the probability verify_tree's own acceptance
  probabilities give it, and its final sample by the law it would be drawn from."""
  vocab = len(p[()])
  assert shape.max_depth <= 2  # the tables hold prefixes of up to two tokens
  prob_r, tokens_rn, valid_rn, prefixes = _tree_drafts(shape, q, rule)
  logq_rnv = np.stack([[_log(q[pre]) for pre in row] for row in prefixes])
  logp_rnv = np.stack([[_log(p[pre]) for pre in row] for row in prefixes])
  if wrong_q:  # a bug to catch: every node verified with the root's q
    logq_rnv = np.broadcast_to(logq_rnv[:, :1], logq_rnv.shape)
  rows = len(prob_r)
  outcomes = [range(-1, shape.max_children)] * shape.max_depth
  law = np.zeros((vocab, vocab))
  for chosen in itertools.product(*outcomes):
    weights, depth, final = [], [0], {}

    def first_accepted(rng, accept_rk, chosen=chosen):
      del rng
      o = chosen[depth[0]]
      accept_rk = np.asarray(accept_rk, np.float64)
      reject_rk = np.cumprod(1.0 - accept_rk, axis=1)
      weights.append(reject_rk[:, -1] if o < 0 else accept_rk[:, o] * (reject_rk[:, o - 1] if o else 1.0))
      depth[0] += 1
      return jnp.full((accept_rk.shape[0],), o, jnp.int32)

    def sample(rng, logp_rv, greedy=False):
      del rng, greedy
      final['p'] = np.exp(np.asarray(logp_rv, np.float64))
      return jnp.zeros(logp_rv.shape[:1], jnp.int32)

    with pytest.MonkeyPatch.context() as patch, jax.enable_x64(True):
      patch.setattr(draft_tree, '_first_accepted', first_accepted)
      patch.setattr(draft_tree.sampling, 'sample', sample)
      verdict = draft_tree.verify_tree(jax.random.PRNGKey(0), shape, jnp.asarray(tokens_rn), jnp.asarray(logq_rnv),
                                       jnp.asarray(logp_rnv), jnp.asarray(valid_rn), rule)
    n_r, tokens_rd = np.asarray(verdict.num_accepted_b), np.asarray(verdict.tokens_bd)
    weight_r = prob_r.copy()
    for d, o in enumerate(chosen):
      # After the walk stopped (at depth s), later outcomes are not drawn: count each stopped walk once.
      stopped_r = n_r < d
      weight_r *= np.where(stopped_r, float(o == -1), weights[d])
    assert np.all(final['p'][weight_r > 0].sum(axis=1) > 1 - 1e-9)
    for r in np.flatnonzero(weight_r > 0):
      if n_r[r] >= 2:
        law[tokens_rd[r, 0], tokens_rd[r, 1]] += weight_r[r]
      elif n_r[r] == 1:
        law[tokens_rd[r, 0]] += weight_r[r] * final['p'][r]
      else:  # one token this round; the next round draws the second from p
        law += weight_r[r] * final['p'][r][:, None] * np.stack([p[(a,)] for a in range(vocab)])
  return law


class TestWholeTreeExactly:
  """The whole tree's law, exactly: every draft of the tree (2,)+1 over V = 3 and every accept/reject outcome
  at both depths, in float64. Two tokens: the first is the root's siblings', the second an accepted child's
  child's, its residual or the bonus token, or (after a rejection at the root) the next round's."""

  SHAPE = draft_tree.static_tree((2,), 1)

  @pytest.mark.parametrize('rule', draft_tree.RULES)
  def test_the_first_two_tokens_have_the_targets_law(self, rule):
    p, q = _exact_tables()
    law = _exact_two_token_law(self.SHAPE, p, q, rule)
    want = np.stack([p[()][a] * p[(a,)] for a in range(3)])
    np.testing.assert_allclose(law, want, rtol=0, atol=1e-9)

  @pytest.mark.parametrize('rule', draft_tree.RULES)
  def test_a_wrong_acceptance_rule_fails(self, rule, monkeypatch):
    # The ratio inverted, min(1, q/p): a plausible slip that the enumeration must see under every rule.
    p, q = _exact_tables()
    want = np.stack([p[()][a] * p[(a,)] for a in range(3)])
    inverted = lambda logp, logq, lenience=1.0: jnp.exp(jnp.minimum(jnp.nan_to_num(logq - logp), 0.0))
    monkeypatch.setattr(draft_tree.sampling, 'acceptance_probability', inverted)
    law = _exact_two_token_law(self.SHAPE, p, q, rule)
    assert np.max(np.abs(law - want)) > 1e-2

  @pytest.mark.parametrize('rule', ['with_replacement', 'without_replacement'])
  def test_every_node_verified_with_the_roots_q_fails(self, rule):
    p, q = _exact_tables()
    want = np.stack([p[()][a] * p[(a,)] for a in range(3)])
    law = _exact_two_token_law(self.SHAPE, p, q, rule, wrong_q=True)
    assert np.max(np.abs(law - want)) > 1e-2


@pytest.mark.parametrize('spec, want', [('2+2', ((2,), 2)), ('3x2+1', ((3, 2), 1)), ('+4', ((), 4)), ('4', ((), 4)),
                                        ('2x2+0', ((2, 2), 0))])
def test_parse_tree_and_its_name(spec, want):
  assert draft_tree.parse_tree(spec) == want
  assert draft_tree.parse_tree(draft_tree.tree_name(*want)) == want


@pytest.mark.parametrize('spec', ['', 'x+1', '2x+1', '0+1', '+0', 'a+b', '2+-1'])
def test_parse_tree_refuses_what_is_not_a_tree(spec):
  with pytest.raises(ValueError):
    draft_tree.parse_tree(spec)


# ---------------------------------------------------------------------------
# Expected tokens of a tree, and the tree for a machine
# ---------------------------------------------------------------------------


def _brute_force_tokens(shape, rank_probs):
  """E[tokens] by enumerating the target's rank at every depth (or a miss), walking the tree each time."""
  ranks = list(range(len(rank_probs))) + [None]
  probs = list(rank_probs) + [1 - sum(rank_probs)]
  total = 0.0
  for outcome in itertools.product(range(len(ranks)), repeat=shape.max_depth):
    weight, node, tokens = float(np.prod([probs[o] for o in outcome])), 0, 1
    for o in outcome:
      kids = [int(c) for c in shape.children[node] if c >= 0]
      if ranks[o] is None or ranks[o] >= len(kids):
        break
      node, tokens = kids[ranks[o]], tokens + 1
    total += weight * tokens
  return total


@pytest.mark.parametrize('branching, chain', [((), 4), ((2,), 2), ((3, 2), 1), ((2, 2, 2), 0), ((4,), 0)])
def test_expected_tree_tokens_equals_the_enumerated_walk(branching, chain):
  shape = draft_tree.static_tree(branching, chain)
  rank_probs = [0.55, 0.2, 0.08]
  assert draft_tree.expected_tree_tokens(shape, rank_probs) == pytest.approx(_brute_force_tokens(shape, rank_probs))


@pytest.mark.parametrize('alpha, gamma', [(0.3, 1), (0.6, 3), (0.9, 7)])
def test_a_chains_expected_tokens_and_speedup_are_the_papers(alpha, gamma):
  shape = draft_tree.static_tree((), gamma)
  assert draft_tree.expected_tree_tokens(shape, [alpha, (1 - alpha) / 2]) == pytest.approx(
      theory.expected_tokens(alpha, gamma))
  curve = {k: 1.0 + 0.07 * (k - 1) for k in range(1, 10)}
  best_gamma, best_speedup = theory.best_gamma(alpha, 0.1, curve)
  flat = {k: 1.0 for k in range(1, 10)}  # every drafter call costs c: theory's γ·c
  assert draft_tree.tree_speedup(draft_tree.static_tree((), best_gamma), [alpha], 0.1, curve,
                                 draft_cost_ratios=flat) == pytest.approx(best_speedup)


def test_the_best_tree_follows_the_machine():
  rank_probs = [0.6, 0.15, 0.06]
  flat = {k: 1.0 for k in range(1, 17)}  # an accelerator: width is free
  steep = {k: 1.0 + 0.3 * (k - 1) for k in range(1, 17)}  # a CPU whose wide calls cost
  branching, chain, speedup = draft_tree.best_tree(rank_probs, 0.05, flat)
  assert branching and speedup > draft_tree.tree_speedup(draft_tree.static_tree((), 4), rank_probs, 0.05, flat)
  branching, chain, _ = draft_tree.best_tree(rank_probs, 0.05, steep)
  assert branching == () and chain <= 2
  for b, ch in draft_tree.candidate_trees(16):
    assert draft_tree.static_tree(b, ch).num_nodes <= 16
  assert len(set(draft_tree.candidate_trees(16))) == len(draft_tree.candidate_trees(16))


@pytest.mark.parametrize('branching, chain, heads, want', [
    ((), 3, False, (2, 1, 1)), ((), 3, True, (4, 1, 1)), ((2,), 2, False, (2, 2, 2)), ((3, 2), 1, False, (2, 3, 6)),
    ((3, 2), 1, True, (4, 3, 6)), ((4,), 0, False, (2,))])
def test_draft_call_widths(branching, chain, heads, want):
  # The catch-up ([x_{i-1}, x_i], or a head's D+1 window), then one call a level above the deepest.
  assert draft_tree.draft_call_widths(draft_tree.static_tree(branching, chain), heads) == want


def test_each_drafter_call_is_charged_at_its_width():
  shape = draft_tree.static_tree((3, 2), 1)  # calls of 2 (catch-up), 3 and 6 tokens; 16 nodes
  rank_probs, c = [0.6, 0.2, 0.1], 0.08
  target = {k: 1.0 + 0.1 * (k - 1) for k in range(1, 17)}
  drafter = {k: 1.0 + 0.03 * (k - 1) for k in range(1, 17)}
  tokens = draft_tree.expected_tree_tokens(shape, rank_probs)
  assert draft_tree.tree_speedup(shape, rank_probs, c, target, drafter) == pytest.approx(
      tokens / (c * (drafter[2] + drafter[3] + drafter[6]) + target[16]))
  # Without a drafter curve the target's stands in; a head's first call is its 4-token window.
  assert draft_tree.tree_speedup(shape, rank_probs, c, target, draft_reads_features=True) == pytest.approx(
      tokens / (c * (target[4] + target[3] + target[6]) + target[16]))


def test_the_curve_is_read_through_its_monotone_envelope():
  measured = {1: 1.0, 2: 1.2, 3: 1.3, 4: 1.25, 5: 1.45, 7: 1.4, 8: 1.6}
  assert draft_tree.monotone_cost_curve(measured) == {1: 1.0, 2: 1.2, 3: 1.3, 4: 1.3, 5: 1.45, 7: 1.45, 8: 1.6}
  with pytest.raises(ValueError, match='finite costs'):
    draft_tree.monotone_cost_curve({1: 1.0, 2: -1.0})


def test_a_dip_in_the_curve_does_not_draw_the_pick():
  # A width measured cheaper than narrower ones (r(7) below r(5), as a CPU's noisy curve had it) would make a
  # 7-node tree look best; read through the envelope, a 7-node call costs what a 6-node one does.
  rank_probs, c = [0.65, 0.13, 0.05, 0.04], 0.03
  smooth = {k: 1.0 + 0.1 * (k - 1) for k in range(1, 17)}
  dipped = {**smooth, 7: smooth[4]}
  raw_best = max(draft_tree.candidate_trees(16), key=lambda t: draft_tree.expected_tree_tokens(
      draft_tree.static_tree(*t), rank_probs) / (c * sum(dipped[w] for w in draft_tree.draft_call_widths(
          draft_tree.static_tree(*t))) + dipped[draft_tree.static_tree(*t).num_nodes]))
  assert draft_tree.static_tree(*raw_best).num_nodes == 7  # the dip would draw the pick
  branching, chain, speedup = draft_tree.best_tree(rank_probs, c, dipped)
  assert (branching, chain) == draft_tree.best_tree(rank_probs, c, {**smooth, 7: smooth[6]})[:2]
  assert draft_tree.static_tree(branching, chain).num_nodes != 7
  assert speedup <= draft_tree.best_tree(rank_probs, c, smooth)[2] + 1e-12


def test_tree_theory_refuses_bad_inputs():
  shape = draft_tree.static_tree((2,), 1)
  with pytest.raises(ValueError, match='rank_probs'):
    draft_tree.expected_tree_tokens(shape, [0.7, 0.5])
  with pytest.raises(ValueError, match='no r\\(5\\)'):
    draft_tree.tree_speedup(shape, [0.5], 0.1, {1: 1.0, 2: 1.1})
  with pytest.raises(ValueError, match='no width >= 2'):
    draft_tree.best_tree([0.5], 0.1, {1: 1.0})
  with pytest.raises(ValueError, match='r_q\\(2\\)'):
    draft_tree.tree_speedup(shape, [0.5], 0.1, {k: 1.0 for k in range(1, 6)}, {1: 1.0})
  with pytest.raises(ValueError, match='no candidate tree'):
    draft_tree.best_tree([0.5], 0.1, {k: 1.0 for k in range(1, 6)}, draft_cost_ratios={1: 1.0})
