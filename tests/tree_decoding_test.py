"""Tests for specdec/tree_decoding.py: whole tree decodes keep the target's greedy tokens and its law.

Toy models with exact, enumerable distributions (tests/toy.py `ToyTreeModel`, which decodes a tree's nodes and
keeps its fed tokens where a network keeps its keys), and tiny T5 networks through the model.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import decoding
from specdec import draft_tree
from specdec import feature_drafter
from specdec import models
from specdec import network
from specdec import tree_decoding
from tests import toy

EOS = 1


def _baseline(model, inputs, **kw):
  fn = functools.partial(decoding.temperature_sample, tokens_to_logits=model.tokens_to_logits, eos_id=EOS, **kw)
  return jax.jit(fn)(inputs, model.init_cache(inputs.shape[0]))


def _tree(target, drafter, inputs, branching, chain, **kw):
  fn = functools.partial(tree_decoding.tree_speculative_sample, tokens_to_logits=target.tokens_to_logits,
                         draft_tokens_to_logits=drafter.tokens_to_logits, eos_id=EOS, branching=branching,
                         chain=chain, **kw)
  batch = inputs.shape[0]
  return jax.jit(fn)(inputs, target.init_cache(batch), draft_cache=drafter.init_cache(batch))


TREES = [((), 3), ((2,), 2), ((3, 2), 1), ((2, 2, 2), 0)]


def _no_zero_tokens(model):
  """The toy with token 0 never its argmax: a 0 leaves the toy's prefix hash unchanged, and a greedy decode that
  settles on 0s would no longer tell a wrong prefix or feature from the right one."""
  model.table[:, 0] -= 10.0
  return model


class TestGreedyIdentity:
  LENGTH, VOCAB = 10, 7

  def _models(self, drafter_seed=41):
    target = _no_zero_tokens(toy.ToyTreeModel(40, vocab=self.VOCAB, cache_len=self.LENGTH, scale=1.5,
                                              eos_bias=-1.0))
    return target, toy.ToyTreeModel(drafter_seed, vocab=self.VOCAB, cache_len=self.LENGTH, scale=1.5)

  @pytest.mark.parametrize('branching, chain', TREES)
  @pytest.mark.parametrize('shrink_batch', [False, True])
  def test_the_targets_greedy_tokens(self, branching, chain, shrink_batch):
    target, drafter = self._models()
    inputs = jnp.zeros((16, self.LENGTH), jnp.int32)
    want = _baseline(target, inputs, temperature=0.0)[0][:, -1]
    got = _tree(target, drafter, inputs, branching, chain, temperature=0.0, shrink_batch=shrink_batch)
    np.testing.assert_array_equal(got.decodes[:, -1], want)

  @pytest.mark.parametrize('branching, chain', TREES)
  def test_a_drafter_equal_to_the_target_keeps_a_whole_path_each_round(self, branching, chain):
    target, _ = self._models()
    inputs = jnp.zeros((4, self.LENGTH), jnp.int32)
    want = _baseline(target, inputs, temperature=0.0)[0][:, -1]
    got = _tree(target, target, inputs, branching, chain, temperature=0.0, return_stats=True)
    np.testing.assert_array_equal(got.decodes[:, -1], want)
    stats = jax.tree_util.tree_map(lambda x: np.asarray(x[:, -1]), got.stats)
    # Each round keeps its drafts and one more token; only the last can be cut short (EOS or the length).
    slack = stats['accepted'] + stats['target_calls'] - stats['emitted']
    assert np.all((slack >= 0) & (slack <= 1))
    # Every round but the last keeps the draft at depth 1, so a round emits more than one token.
    assert np.all(stats['accepted_at'][:, 0] >= stats['target_calls'] - 1)

  def test_rows_stop_at_their_step_limit(self):
    target, drafter = self._models()
    inputs = jnp.zeros((3, self.LENGTH), jnp.int32)
    steps = jnp.array([2, 5, 9], jnp.int32)
    want = _baseline(target, inputs, temperature=0.0, max_decode_steps=steps)[0][:, -1]
    got = _tree(target, drafter, inputs, (2,), 2, temperature=0.0, max_decode_steps=steps)
    np.testing.assert_array_equal(got.decodes[:, -1], want)

  def test_without_moving_the_accepted_path_the_output_is_wrong(self, monkeypatch):
    """The move of the accepted path's cache entries to their positions is what keeps later rounds right."""
    target, _ = self._models()
    inputs = jnp.zeros((8, self.LENGTH), jnp.int32)
    want = _baseline(target, inputs, temperature=0.0)[0][:, -1]
    monkeypatch.setattr(tree_decoding, 'move_cache_slots', lambda cache, *args: cache)
    got = _tree(target, target, inputs, (3,), 2, temperature=0.0)
    assert not np.array_equal(got.decodes[:, -1], want)


class TestSequenceDistribution:
  """Whole decodes: the empirical law of sequences equals the target's (one batch of ROWS rows).

  Power. Pearson's chi-square at p < 1e-3 over the decodes (cells expecting under 5 pooled: 27 to 84 degrees of
  freedom here) with ROWS = 20,000 rejects, with probability >= 0.99, any law at chi-square distance
  Σ (p1 - p0)² / p0 >= 0.005 from the target's (noncentrality ROWS × distance >= 97 at 84 degrees, 66 at 27).
  Two wrong loops, their laws estimated from 200,000 decodes each, have these noncentralities at ROWS (power
  1.000 wherever not 0):

    configuration                             every node judged with the root's q   accept coins reuse the draft key
    (2,)+1 without replacement, t 1           1595                                   0
    (3,)+1 with replacement, t 1              1526                                   4793
    (2,2)+0 fixed, t 0.7 top-3                0 (fixed reads no q)                   0 (no random draft)
    (2,)+2 without replacement, t 1.3 p 0.8   723                                    0
    ()+3 with replacement, t 1, no room       5082                                   5735
    (2,)+1 with replacement, t 1.3 p 0.8      513                                    1162
    (3,2)+0 with replacement, t 0.7 top-3     715                                    423

  So the first fails 6 configurations of 7, the second 4 of 7: every one where it changes the law. Reusing the
  draft key makes each child's coin the uniform that drew it under with_replacement (inverse CDF), but under
  without_replacement the Gumbel keys of a row read other random bits than its coins, and the law stays right.
  Before the caches had ROOM (and with the last two configurations absent) each wrong loop failed 2 of 5.
  """

  LENGTH, VOCAB, ROWS = 4, 5, 20_000
  # Cache slots past the decode length, as `models.SpeculativeEncoderDecoderModel` gives a tree's nodes: without
  # them a node whose slot lies past the cache is never accepted, and in a 4-token decode most of a 7-node tree
  # would never be verified.
  ROOM = 16

  def _models(self, room=True):
    cache_len = self.LENGTH + (self.ROOM if room else 0)
    target = toy.ToyTreeModel(30, vocab=self.VOCAB, cache_len=cache_len, scale=1.5, eos_bias=0.5)
    drafter = toy.ToyTreeModel(31, vocab=self.VOCAB, cache_len=cache_len, scale=1.5)
    return target, drafter

  def _samples(self, branching, chain, rule, temperature, topk, topp, seed, room=True):
    target, drafter = self._models(room)
    inputs = jnp.zeros((self.ROWS, self.LENGTH), jnp.int32)
    out = _tree(target, drafter, inputs, branching, chain, rule=rule, temperature=temperature, topk=topk,
                topp=topp, decode_rng=jax.random.PRNGKey(seed), shrink_batch=False)
    return np.asarray(out.decodes[:, 0])

  def _assert_exact_log_probs(self, target, decodes, log_prob, temperature=1.0, topk=0, topp=0.0):
    """Each decode's log_prob is log of its exact probability (`toy.exact_distribution`)."""
    exact = toy.exact_distribution(target, self.LENGTH, EOS, temperature, topk, topp)
    want = np.log([exact[tuple(row)] for row in np.asarray(decodes).tolist()])
    # fp32: each of the <= L terms (all <= 0) is a log-softmax, within a few ulp of its operands (the logits'
    # spread plus log V); their fp32 sum adds at most L ulp of |log P|. The bound is L eps (|log P| + 2 spread
    # + log V), ~2e-5 here; a token kept past EOS, or a log-prob paired with another decode, is off by nats.
    spread = float(np.max(target.table.max(axis=1) - target.table.min(axis=1))) / temperature
    tol = self.LENGTH * np.finfo(np.float32).eps * (np.abs(want) + 2 * spread + np.log(self.VOCAB))
    error = np.abs(np.asarray(log_prob, np.float64) - want)
    assert np.all(error <= tol), np.max(error - tol)

  @pytest.mark.parametrize('branching, chain, rule, temperature, topk, topp, room', [
      ((2,), 1, 'without_replacement', 1.0, 0, 0.0, True),
      ((3,), 1, 'with_replacement', 1.0, 0, 0.0, True),
      ((2, 2), 0, 'fixed', 0.7, 3, 0.0, True),
      ((2,), 2, 'without_replacement', 1.3, 0, 0.8, True),
      ((), 3, 'with_replacement', 1.0, 0, 0.0, False),  # no room: nodes past the cache are cut, never wrong
      ((2,), 1, 'with_replacement', 1.3, 0, 0.8, True),
      ((3, 2), 0, 'with_replacement', 0.7, 3, 0.0, True),
  ])
  def test_tree_decodes_have_the_targets_law(self, branching, chain, rule, temperature, topk, topp, room):
    target, _ = self._models(room)
    exact = toy.exact_distribution(target, self.LENGTH, EOS, temperature, topk, topp)
    samples = self._samples(branching, chain, rule, temperature, topk, topp, seed=len(branching) + chain, room=room)
    assert toy.chi_square_pvalue(samples, exact) > 1e-3

  def test_eos_inside_an_accepted_path_ends_the_row_there(self):
    """A round whose accepted path holds EOS keeps nothing after it: each row's log_prob is the target's exact
    log-probability of its decode, and `emitted` counts its tokens up to and including EOS.

    Decodes alone cannot see tokens written past EOS (the loop's output is zeroed there afterwards): the
    log-probabilities and counts do (the EOS cut replaced by all-True: errors of several nats)."""
    target, drafter = self._models()
    rows = 2000
    out = _tree(target, drafter, jnp.zeros((rows, self.LENGTH), jnp.int32), (2,), 2, rule='without_replacement',
                temperature=1.0, topk=0, topp=0.0, decode_rng=jax.random.PRNGKey(3), shrink_batch=False,
                return_stats=True)
    decodes = np.asarray(out.decodes[:, 0])
    stats = jax.tree_util.tree_map(lambda x: np.asarray(x[:, 0]), out.stats)
    self._assert_exact_log_probs(target, decodes, out.log_prob[:, 0])
    has_eos = np.any(decodes == EOS, axis=1)
    eos_at = np.where(has_eos, np.argmax(decodes == EOS, axis=1) + 1, self.LENGTH)  # tokens up to EOS
    np.testing.assert_array_equal(stats['emitted'], eos_at)
    # The case is exercised: rows whose EOS was a kept draft, so that the round's next token (at least) was cut
    # (`accepted` counts the drafts written; a round writes them and its next token unless cut).
    cut = stats['accepted'] + stats['target_calls'] - stats['emitted']
    assert np.sum(has_eos & (cut > 0)) >= 200, np.sum(has_eos & (cut > 0))

  def test_a_shrinking_batch_keeps_the_law(self):
    """The loop's batch halved as rows end (`batch_shrink`): rows carry their caches, keys and scores along.
    (A stage that gathers its rows but not their target caches fails both checks.)"""
    target, drafter = self._models()
    out = _tree(target, drafter, jnp.zeros((self.ROWS, self.LENGTH), jnp.int32), (2,), 1, rule='with_replacement',
                temperature=1.0, topk=0, topp=0.0, decode_rng=jax.random.PRNGKey(11), shrink_batch=True)
    exact = toy.exact_distribution(target, self.LENGTH, EOS, 1.0, 0, 0.0)
    assert toy.chi_square_pvalue(np.asarray(out.decodes[:, 0]), exact) > 1e-3
    self._assert_exact_log_probs(target, out.decodes[:, 0], out.log_prob[:, 0])

  def test_several_decodes_an_input_keep_the_law(self):
    """num_decodes = 4: every decode of every input is an independent draw from the target, each returned with
    its own log-probability, an input's decodes sorted by it. (Decodes sorted apart from their log-probs fail.)"""
    target, drafter = self._models()
    decodes_per_input = 4
    out = _tree(target, drafter, jnp.zeros((self.ROWS // decodes_per_input, self.LENGTH), jnp.int32), (2,), 2,
                rule='without_replacement', temperature=1.3, topk=0, topp=0.8, decode_rng=jax.random.PRNGKey(12),
                num_decodes=decodes_per_input, shrink_batch=True)
    decodes, log_prob = np.asarray(out.decodes), np.asarray(out.log_prob)
    assert decodes.shape == (self.ROWS // decodes_per_input, decodes_per_input, self.LENGTH)
    exact = toy.exact_distribution(target, self.LENGTH, EOS, 1.3, 0, 0.8)
    assert toy.chi_square_pvalue(decodes.reshape(-1, self.LENGTH), exact) > 1e-3
    self._assert_exact_log_probs(target, decodes.reshape(-1, self.LENGTH), log_prob.reshape(-1), 1.3, 0, 0.8)
    assert np.all(np.diff(log_prob, axis=1) >= 0)

  def test_siblings_verified_by_the_wrong_rule_change_the_law(self, monkeypatch):
    """The drafter's top-k verified as if drawn at random from q: the test above would see it."""
    draw = draft_tree.draw_children
    monkeypatch.setattr(tree_decoding.draft_tree, 'draw_children',
                        lambda rng, logq, k, rule: draw(rng, logq, k, 'fixed'))
    target, _ = self._models()
    exact = toy.exact_distribution(target, self.LENGTH, EOS, 1.0, 0, 0.0)
    samples = self._samples((2,), 1, 'with_replacement', 1.0, 0, 0.0, seed=5)
    assert toy.chi_square_pvalue(samples, exact) < 1e-6


class TestCacheMoves:

  def test_sources_are_read_before_destinations_are_written(self):
    keys = jnp.arange(2 * 6, dtype=jnp.float32).reshape(2, 6, 1, 1)
    cache = {'layer': {'cached_key': keys, 'cached_value': -keys, 'encoded_key': keys}}
    # Row 0: slot 3 -> 2 and slot 4 -> 3 (slot 3 is both); row 1: nothing moves.
    moved = tree_decoding.move_cache_slots(cache, jnp.array([[3, 4], [1, 2]]), jnp.array([[2, 3], [1, 2]]),
                                           jnp.array([[True, True], [False, False]]))
    np.testing.assert_array_equal(moved['layer']['cached_key'][..., 0, 0], [[0, 1, 3, 4, 4, 5],
                                                                            [6, 7, 8, 9, 10, 11]])
    np.testing.assert_array_equal(moved['layer']['cached_value'], -moved['layer']['cached_key'])
    np.testing.assert_array_equal(moved['layer']['encoded_key'], keys)  # not a per-position leaf

  def test_a_batch_axis_after_a_leading_one(self):
    keys = jnp.arange(2 * 2 * 5, dtype=jnp.float32).reshape(2, 2, 5, 1, 1)
    moved = tree_decoding.move_cache_slots({'cached_key': keys}, jnp.array([[4], [3]]), jnp.array([[1], [1]]),
                                           jnp.array([[True], [True]]), cache_offset=1)
    np.testing.assert_array_equal(moved['cached_key'][:, 0, 1, 0, 0], keys[:, 0, 4, 0, 0])
    np.testing.assert_array_equal(moved['cached_key'][:, 1, 1, 0, 0], keys[:, 1, 3, 0, 0])


class TestBadInputs:
  LENGTH = 6

  def _call(self, inputs=None, **kw):
    target = toy.ToyTreeModel(1, vocab=5, cache_len=self.LENGTH)
    inputs = jnp.zeros((2, self.LENGTH), jnp.int32) if inputs is None else inputs
    return tree_decoding.tree_speculative_sample(
        inputs, target.init_cache(2), target.tokens_to_logits, target.init_cache(2), target.tokens_to_logits,
        EOS, **kw)

  @pytest.mark.parametrize('kwargs, message', [
      (dict(rule='greedy'), 'rule must be one of'),
      (dict(branching=(0,)), 'branching must be ints >= 1'),
      (dict(branching=(), chain=0), 'needs at least one draft'),
      (dict(temperature=-1.0), 'temperature'),
  ])
  def test_bad_settings(self, kwargs, message):
    with pytest.raises(ValueError, match=message):
      self._call(**kwargs)

  def test_a_decoder_prompt_is_refused(self):
    with pytest.raises(ValueError, match='no decoder prompt'):
      self._call(inputs=jnp.zeros((2, self.LENGTH), jnp.int32).at[0, 1].set(3))

  def test_a_drafter_that_does_not_decode_trees_is_named(self):
    target, plain = toy.ToyTreeModel(1, vocab=5, cache_len=self.LENGTH), toy.ToyModel(2, vocab=5,
                                                                                     cache_len=self.LENGTH)
    plain_cache = {'cached_key': jnp.zeros((2, self.LENGTH, 1, 1), jnp.int32)}
    with pytest.raises(ValueError, match='draft_tokens_to_logits does not decode a draft tree'):
      tree_decoding.tree_speculative_sample(
          jnp.zeros((2, self.LENGTH), jnp.int32), target.init_cache(2), target.tokens_to_logits, plain_cache,
          lambda state: plain.tokens_to_logits(state.replace(cache={'tokens': state.cache['cached_key'][..., 0, 0],
                                                                    'calls': jnp.zeros((2,), jnp.int32)}))
          if state.layout is None else _refuse_layout(), EOS)


def _refuse_layout():
  raise TypeError("decode_step() got an unexpected keyword argument 'layout'")


class TestT5Networks:
  """Tiny T5 networks through `models.SpeculativeEncoderDecoderModel`: the tree's layout in a real decode step."""

  VOCAB = 48
  TARGET_CFG = network.t5_1_1_config('tiny', vocab_size=VOCAB)
  DRAFTER_CFG = network.t5_1_1_config('tiny', vocab_size=VOCAB, emb_dim=16, num_heads=2, num_encoder_layers=1,
                                      num_decoder_layers=1, mlp_dim=32)

  def _batch(self, batch=6, input_len=9, target_len=12, seed=1):
    rng = np.random.RandomState(seed)
    enc = rng.randint(2, self.VOCAB, size=(batch, input_len))
    for b in range(batch):
      enc[b, input_len - (b % 4):] = 0
    return {'encoder_input_tokens': jnp.asarray(enc, jnp.int32),
            'decoder_input_tokens': jnp.zeros((batch, target_len), jnp.int32)}

  def _params(self, seed=0):
    target_rng, drafter_rng = jax.random.split(jax.random.PRNGKey(seed))
    target = network.init_params(self.TARGET_CFG, target_rng)
    kernel = target['decoder']['logits_dense']['kernel']  # a mild EOS bias: rows end at different steps
    target['decoder']['logits_dense']['kernel'] = kernel.at[:, EOS].add(0.15 * jnp.sign(kernel[:, EOS]))
    return {'target': target, 'drafter': network.init_params(self.DRAFTER_CFG, drafter_rng)}

  def _models(self, drafter_cfg):
    base = models.SpeculativeEncoderDecoderModel(network.Transformer(self.TARGET_CFG), None,
                                                 decode_fn=decoding.temperature_sample)
    tree = models.SpeculativeEncoderDecoderModel(network.Transformer(self.TARGET_CFG),
                                                 network.Transformer(drafter_cfg),
                                                 decode_fn=tree_decoding.tree_speculative_sample)
    return base, tree

  @pytest.mark.parametrize('same, branching, chain', [(False, (2,), 2), (False, (3, 2), 1), (True, (2,), 3)])
  def test_greedy_tokens_and_scores_are_the_baselines(self, same, branching, chain):
    params = self._params()
    if same:
      params = {'target': params['target'], 'drafter': params['target']}
    base, tree = self._models(self.TARGET_CFG if same else self.DRAFTER_CFG)
    batch = self._batch(seed=len(branching) + chain)
    want, want_aux = base.compile_predict({'temperature': 0.0})(params, batch)
    got, aux = tree.compile_predict({'temperature': 0.0, 'branching': branching, 'chain': chain,
                                     'return_stats': True})(params, batch)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(aux['scores'], want_aux['scores'])
    if same:  # the drafter's top child is the target's argmax: whole paths are kept
      stats = jax.tree_util.tree_map(np.asarray, aux['stats'])
      assert np.all(stats['accepted_at'][:, 0] >= stats['target_calls'] - 1)

  def test_the_models_caches_leave_room_for_every_node(self):
    """The model makes both caches `extra_cache_slots` longer: a drafter equal to the target keeps a whole path in
    every round but the last, even where a 9-node tree's slots run past the 12 decode positions."""
    params = self._params()
    params = {'target': params['target'], 'drafter': params['target']}
    base, tree = self._models(self.TARGET_CFG)
    batch = self._batch(seed=9)
    want, _ = base.compile_predict({'temperature': 0.0})(params, batch)
    got, aux = tree.compile_predict({'temperature': 0.0, 'branching': (2,), 'chain': 3, 'return_stats': True})(
        params, batch)
    np.testing.assert_array_equal(got, want)
    stats = jax.tree_util.tree_map(np.asarray, aux['stats'])
    assert np.all(stats['accepted_at'][:, 3] >= stats['target_calls'] - 1)
    assert decoding.cache_slots(tree.decode_fn, 12, {'branching': (2,), 'chain': 3}) == 12 + 9

  def test_sampled_log_probs_equal_teacher_forced_scores(self):
    params = self._params()
    base, tree = self._models(self.DRAFTER_CFG)
    batch = self._batch(seed=4)
    decodes, aux = tree.compile_predict({'temperature': 1.0, 'topk': 0, 'branching': (2,), 'chain': 2})(
        params, batch, jax.random.PRNGKey(2))
    targets = np.asarray(decodes)
    eos_pos = np.where(np.any(targets == EOS, -1), np.argmax(targets == EOS, -1), targets.shape[1] - 1)
    valid = np.arange(targets.shape[1])[None] <= eos_pos[:, None]
    logits = base.module.apply({'params': params['target']}, batch['encoder_input_tokens'],
                               jnp.asarray(np.pad(targets, ((0, 0), (1, 0)))[:, :-1]),
                               jnp.asarray(valid, jnp.int32), enable_dropout=False)
    token_logp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.sum(token_logp * valid, -1), aux['scores'], rtol=1e-4, atol=1e-4)


def _tree_with_head(target, head, inputs, branching, chain, **kw):
  fn = functools.partial(tree_decoding.tree_speculative_sample, tokens_to_logits=target.tokens_to_logits_and_features,
                         draft_tokens_to_logits=head.tokens_to_logits, eos_id=EOS, branching=branching,
                         chain=chain, draft_reads_features=True, **kw)
  batch = inputs.shape[0]
  return jax.jit(fn)(inputs, target.init_cache(batch), draft_cache=head.init_cache(batch))


class TestFeatureHeads:
  """Feature drafting over a tree: each node drafted from its parent's predicted feature, the next round's
  catch-up fed the target's features along the accepted path."""

  LENGTH, VOCAB = 10, 7

  @pytest.mark.parametrize('branching, chain', TREES)
  def test_an_exact_head_has_every_round_keep_a_whole_path(self, branching, chain):
    """The toy head is exact only where it reads its parent's true feature and its cache holds the path: a
    node given the wrong feature, or a catch-up that misses a position, drafts a token the target rejects."""
    # Room past the decode length for the widest tree's slots: a node whose slot is past the cache is never
    # accepted (the tree is cut near the end), which would hide the whole paths this test counts.
    target = _no_zero_tokens(toy.ToyTreeModel(40, vocab=self.VOCAB, cache_len=self.LENGTH + 16, scale=1.5,
                                              eos_bias=-1.0))
    head = toy.ToyTreeFeatureDrafter(target, exact=True)
    inputs = jnp.zeros((6, self.LENGTH), jnp.int32)
    want = _baseline(target, inputs, temperature=0.0)[0][:, -1]
    got = _tree_with_head(target, head, inputs, branching, chain, temperature=0.0, return_stats=True)
    np.testing.assert_array_equal(got.decodes[:, -1], want)
    stats = jax.tree_util.tree_map(lambda x: np.asarray(x[:, -1]), got.stats)
    depth = len(branching) + chain
    # Every round but the last keeps all D drafts (the last may be cut by EOS or the length).
    assert np.all(stats['accepted_at'][:, depth - 1] >= stats['target_calls'] - 1)
    assert np.all(stats['target_calls'] <= -(-stats['emitted'] // (depth + 1)) + 1)

  def test_a_sampled_tree_with_a_head_keeps_the_targets_law(self):
    length, vocab, rows = 4, 5, 20_000
    target = toy.ToyTreeModel(30, vocab=vocab, cache_len=length, scale=1.5, eos_bias=0.5)
    head = toy.ToyTreeFeatureDrafter(target, seed=3, exact=False)
    exact = toy.exact_distribution(target, length, EOS, 1.0, 0, 0.0)
    out = _tree_with_head(target, head, jnp.zeros((rows, length), jnp.int32), (2,), 1, temperature=1.0, topk=0,
                          decode_rng=jax.random.PRNGKey(7), shrink_batch=False)
    assert toy.chi_square_pvalue(np.asarray(out.decodes[:, 0]), exact) > 1e-3

  def test_a_t5_target_with_a_feature_head_through_the_model(self):
    cfg = TestT5Networks.TARGET_CFG
    head_cfg = feature_drafter.FeatureHeadConfig(feature_dim=cfg.emb_dim, vocab_size=TestT5Networks.VOCAB,
                                                 width=16, num_layers=1, num_heads=2, head_dim=8, mlp_dim=32)
    base = models.SpeculativeEncoderDecoderModel(network.Transformer(cfg), None, decode_fn=decoding.temperature_sample)
    tree = models.SpeculativeEncoderDecoderModel(network.Transformer(cfg), feature_drafter.FeatureHead(head_cfg),
                                                 decode_fn=tree_decoding.tree_speculative_sample)
    t5 = TestT5Networks()
    params = {'target': t5._params()['target'], 'drafter': tree.get_initial_params(jax.random.PRNGKey(4))['drafter']}
    batch = t5._batch(seed=8)
    want, want_aux = base.compile_predict({'temperature': 0.0})(params, batch)
    got, aux = tree.compile_predict({'temperature': 0.0, 'branching': (2,), 'chain': 2})(params, batch)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(aux['scores'], want_aux['scores'])


@pytest.mark.parametrize('branching, chain, heads', [((), 3, False), ((3, 2), 1, False), ((2,), 2, True),
                                                    ((2, 2, 2), 0, True)])
def test_the_drafters_calls_are_the_cost_models(branching, chain, heads, monkeypatch):
  """`draft_tree.draft_call_widths`, which `tree_speedup` charges, is what the draft phase feeds: the widths of
  its drafter calls, in order (read while the loop's body is traced)."""
  length = 6
  target = toy.ToyTreeModel(40, vocab=5, cache_len=length + 16)
  drafter = toy.ToyTreeFeatureDrafter(target, exact=True) if heads else toy.ToyTreeModel(41, vocab=5,
                                                                                          cache_len=length + 16)
  widths, recording = [], [False]
  draft_phase = tree_decoding.draft_phase

  def recorded_draft_phase(spec, state, rng):
    recording[0] = True
    try:
      return draft_phase(spec, state, rng)
    finally:
      recording[0] = False

  def draft_tokens_to_logits(state, *features):
    if recording[0]:
      widths.append(state.cur_token.shape[1])
    return drafter.tokens_to_logits(state, *features)

  monkeypatch.setattr(tree_decoding, 'draft_phase', recorded_draft_phase)
  inputs = jnp.zeros((2, length), jnp.int32)
  fn = functools.partial(tree_decoding.tree_speculative_sample,
                         tokens_to_logits=target.tokens_to_logits_and_features if heads else target.tokens_to_logits,
                         draft_tokens_to_logits=draft_tokens_to_logits, eos_id=EOS, branching=branching, chain=chain,
                         draft_reads_features=heads, temperature=0.0, shrink_batch=False)
  jax.jit(fn)(inputs, target.init_cache(2), draft_cache=drafter.init_cache(2))
  assert widths == list(draft_tree.draft_call_widths(draft_tree.static_tree(branching, chain), heads))
