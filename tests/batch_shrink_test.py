"""Tests for specdec/batch_shrink.py: the loop whose batch halves as rows end."""

import functools

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import batch_shrink
from specdec import decoding
from tests import toy

EOS = 1


def _counting_loop(ends_r, shrink, min_rows=1):
  """Rows count up to their own end; a shared counter adds up the rows each step paid for.

  Returns (per-row counts, row-steps paid).
  """
  ends_r = jnp.asarray(ends_r, jnp.int32)

  def step(carry):
    count_r, end_r, paid = carry
    ended_r = count_r >= end_r
    return jnp.where(ended_r, count_r, count_r + 1), end_r, paid + count_r.shape[0]

  carry0 = (jnp.zeros_like(ends_r), ends_r, jnp.zeros((), jnp.int32))
  ended_fn = lambda carry: carry[0] >= carry[1]
  if not shrink:
    final = lax.while_loop(lambda c: ~jnp.all(ended_fn(c)), step, carry0)
    return final[0], final[2]
  # The counter is shared; return it beside the rows' counts through outputs_fn.
  out = jax.jit(lambda c: batch_shrink.shrinking_while_loop(
      step, c, (0, 0, batch_shrink.SHARED), ended_fn, lambda c: (c[0], c[2]),
      output_axes=(0, batch_shrink.SHARED), min_rows=min_rows))(carry0)
  return out


class TestRows:

  def test_take_and_put_rows_on_any_axis(self):
    tree = {'a': jnp.arange(12).reshape(4, 3), 'b': jnp.arange(24).reshape(2, 4, 3),
            'key': jnp.arange(2)}
    axes = {'a': 0, 'b': 1, 'key': batch_shrink.SHARED}
    rows = jnp.asarray([3, 1])
    taken = batch_shrink.take_rows(tree, rows, axes)
    np.testing.assert_array_equal(taken['a'], np.asarray(tree['a'])[[3, 1]])
    np.testing.assert_array_equal(taken['b'], np.asarray(tree['b'])[:, [3, 1]])
    np.testing.assert_array_equal(taken['key'], tree['key'])
    changed = jax.tree.map(lambda x: -x, taken)
    put = batch_shrink.put_rows(tree, changed, rows, axes)
    want_a = np.asarray(tree['a']).copy()
    want_a[[3, 1]] *= -1
    want_b = np.asarray(tree['b']).copy()
    want_b[:, [3, 1]] *= -1
    np.testing.assert_array_equal(put['a'], want_a)
    np.testing.assert_array_equal(put['b'], want_b)
    np.testing.assert_array_equal(put['key'], -np.arange(2))  # shared: the source's


class TestShrinkingWhileLoop:

  def test_stage_sizes(self):
    assert batch_shrink.stage_sizes(8) == [8, 4, 2, 1] and batch_shrink.stage_sizes(6, min_rows=2) == [6, 3]
    assert batch_shrink.stage_sizes(64) == [64, 32, 16, 8]  # at most MAX_STAGES stages by default
    assert batch_shrink.stage_sizes(1) == [1]

  def test_same_outputs_fewer_row_steps(self):
    ends = [3, 8, 1, 6, 2, 7, 4, 5]
    counts, paid = _counting_loop(ends, shrink=True)
    plain_counts, plain_paid = _counting_loop(ends, shrink=False)
    np.testing.assert_array_equal(counts, ends)
    np.testing.assert_array_equal(plain_counts, ends)
    assert int(plain_paid) == 8 * 8
    # 4 steps at 8 rows (then 4 active), 2 at 4 (then 2), 1 at 2, 1 at 1.
    assert int(paid) == 4 * 8 + 2 * 4 + 1 * 2 + 1 * 1

  def test_min_rows_is_the_smallest_stage(self):
    counts, paid = _counting_loop([3, 8, 1, 6, 2, 7, 4, 5], shrink=True, min_rows=2)
    np.testing.assert_array_equal(counts, [3, 8, 1, 6, 2, 7, 4, 5])
    assert int(paid) == 4 * 8 + 2 * 4 + 2 * 2  # the 2-row stage runs to the end

  def test_rows_that_end_together_and_odd_batches(self):
    for ends in ([5, 5, 5, 5, 5], [0, 0, 0], [2, 0, 9], [4]):
      counts, paid = _counting_loop(ends, shrink=True)
      np.testing.assert_array_equal(counts, ends)
      assert int(paid) <= len(ends) * max(ends)


def _baseline(model, inputs, **kw):
  fn = functools.partial(decoding.temperature_sample, tokens_to_logits=model.tokens_to_logits,
                         eos_id=EOS, **kw)
  return jax.jit(fn)(inputs, model.init_cache(inputs.shape[0]))


def _speculative(target, drafter, inputs, gamma, **kw):
  batch = inputs.shape[0]
  fn = functools.partial(decoding.speculative_sample, tokens_to_logits=target.tokens_to_logits,
                         draft_tokens_to_logits=drafter.tokens_to_logits, eos_id=EOS, gamma=gamma,
                         return_stats=True, **kw)
  return jax.jit(fn)(inputs, target.init_cache(batch), draft_cache=drafter.init_cache(batch))


def _inputs(batch, length):
  inputs = np.zeros((batch, length), np.int32)
  for b in range(batch):  # prompts of 0..3 tokens
    inputs[b, 1:1 + b % 4] = np.arange(2, 2 + b % 4)
  return jnp.asarray(inputs)


class TestDecodersShrink:
  """Both decoders give the same rows with and without shrinking (rows end at different times)."""

  @pytest.mark.parametrize('num_decodes', [1, 2])
  def test_greedy_rows_unchanged(self, num_decodes):
    target = toy.ToyModel(13, vocab=9, cache_len=14, eos_bias=1.5)
    drafter = toy.ToyModel(14, vocab=9, cache_len=14, eos_bias=1.0)
    inputs = _inputs(8, 14)
    # Per-row limits (a [B] max_decode_steps is per input row, so only with one decode a row).
    steps = jnp.asarray(np.arange(8) % 5 + 3) if num_decodes == 1 else None
    base_on, lp_on = _baseline(target, inputs, temperature=0.0, num_decodes=num_decodes,
                               max_decode_steps=steps)
    base_off, lp_off = _baseline(target, inputs, temperature=0.0, num_decodes=num_decodes,
                                 max_decode_steps=steps, shrink_batch=False)
    np.testing.assert_array_equal(base_on, base_off)
    np.testing.assert_array_equal(lp_on, lp_off)
    lengths = np.sum(np.asarray(base_off) != 0, axis=-1)
    assert len(set(lengths.ravel().tolist())) > 2  # really different ends
    for gamma in (1, 3):
      on = _speculative(target, drafter, inputs, gamma, temperature=0.0, num_decodes=num_decodes,
                        max_decode_steps=steps)
      off = _speculative(target, drafter, inputs, gamma, temperature=0.0,
                         num_decodes=num_decodes, max_decode_steps=steps, shrink_batch=False)
      np.testing.assert_array_equal(on[0], base_off)
      jax.tree.map(np.testing.assert_array_equal, on, off)  # decodes, scores, every statistic

  def test_sampled_rows_keep_their_scores(self):
    # Sampled draws differ with the batch's shape, but each output's log-probability is its own.
    target = toy.ToyModel(21, vocab=9, cache_len=12, eos_bias=0.5)
    drafter = toy.ToyModel(22, vocab=9, cache_len=12, eos_bias=0.5)
    inputs = _inputs(8, 12)
    decodes, log_prob, _ = _speculative(target, drafter, inputs, 2, temperature=1.0, topk=0,
                                        decode_rng=jax.random.PRNGKey(3))
    for b in range(8):
      tokens = [0] + [int(t) for t in np.asarray(decodes[b, 0])]
      want = 0.0
      for t in range(1, len(tokens)):  # every sampled token up to and including EOS
        if t >= inputs.shape[1] or np.asarray(inputs)[b, t] == 0:
          want += float(jax.nn.log_softmax(target.prefix_logits(tokens[:t]))[tokens[t]])
        if tokens[t] == EOS:
          break
      np.testing.assert_allclose(float(log_prob[b, 0]), want, rtol=1e-5, atol=1e-5)

  def test_callbacks_see_the_whole_batch(self):
    target = toy.ToyModel(13, vocab=9, cache_len=10, eos_bias=1.5)
    seen = []

    def state_callback_fn(state):
      seen.append(state.sequences.shape[0])
      return state

    _baseline(target, _inputs(8, 10), temperature=0.0, state_callback_fn=state_callback_fn)
    assert seen and set(seen) == {8}


class TestShrinkingLaw:
  """Sampled decodes of a shrinking batch have the target's law (rows end after 1 to 4 steps)."""

  LENGTH, VOCAB, ROWS = 4, 5, 20_000

  def test_both_decoders_match_the_target(self):
    target = toy.ToyModel(30, vocab=self.VOCAB, cache_len=self.LENGTH, scale=1.5, eos_bias=0.5)
    drafter = toy.ToyModel(31, vocab=self.VOCAB, cache_len=self.LENGTH, scale=1.5)
    exact = toy.exact_distribution(target, self.LENGTH, EOS)
    inputs = jnp.zeros((self.ROWS, self.LENGTH), jnp.int32)
    base, _ = _baseline(target, inputs, temperature=1.0, topk=0, decode_rng=jax.random.PRNGKey(7))
    spec, _, _ = _speculative(target, drafter, inputs, 3, temperature=1.0, topk=0,
                              decode_rng=jax.random.PRNGKey(8))
    for samples in (np.asarray(base[:, 0]), np.asarray(spec[:, 0])):
      ends = np.where(np.any(samples == EOS, -1), np.argmax(samples == EOS, -1) + 1, self.LENGTH)
      assert np.mean(ends < self.LENGTH) > 0.5  # most rows leave the batch early
      assert toy.chi_square_pvalue(samples, exact) > 1e-3
