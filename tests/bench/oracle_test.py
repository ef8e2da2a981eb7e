"""Tests for specdec/bench/oracle.py: the drafter of controlled acceptance.

The draws are deterministic (a seeded hash), so the statistical checks cannot flake; their tolerances are
binomial: 4.5 standard errors of the measured rate, where a wrong rate (e.g. α*² or α* ± 0.1 at these counts)
falls many standard errors away.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.bench import benchmark
from specdec import decoding
from specdec import models
from specdec import network
from specdec.bench import oracle
from specdec import settings

V = 64
SIGMAS = 4.5


def _within_binomial(successes, n, p):
  se = np.sqrt(p * (1 - p) / n)
  return abs(successes / n - p) <= SIGMAS * se


def _grid(examples=200, length=48):
  ids = jnp.arange(examples, dtype=jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (examples, length))
  greedy = jnp.asarray(np.random.RandomState(0).randint(0, V, (examples, length)), jnp.int32)
  return greedy, ids, positions


@pytest.mark.parametrize('alpha', [0.3, 0.6, 0.9])
def test_proposals_are_right_with_probability_alpha(alpha):
  greedy, ids, positions = _grid()
  tokens, right = map(np.asarray, oracle.proposals(greedy, ids, positions, alpha, 0, V))
  greedy = np.asarray(greedy)
  assert _within_binomial(right.sum(), right.size, alpha)
  np.testing.assert_array_equal(tokens[right], greedy[right])
  assert np.all(tokens[~right] != greedy[~right])
  assert tokens.min() >= 0 and tokens.max() < V


def test_proposals_are_independent_across_positions_and_examples():
  alpha = 0.6
  greedy, ids, positions = _grid()
  right = np.asarray(oracle.proposals(greedy, ids, positions, alpha, 0, V)[1])
  # Neighbouring positions of one example, and one position of neighbouring examples: both right at α*².
  for a, b in ((right[:, :-1], right[:, 1:]), (right[:-1], right[1:])):
    assert _within_binomial(np.sum(a & b), a.size, alpha ** 2)
  # Another seed gives other draws at the same rate.
  other = np.asarray(oracle.proposals(greedy, ids, positions, alpha, 1, V)[1])
  assert np.mean(other != right) > 0.3
  assert _within_binomial(other.sum(), other.size, alpha)


def test_alpha_one_is_always_right_and_zero_never():
  greedy, ids, positions = _grid(50, 20)
  assert np.all(np.asarray(oracle.proposals(greedy, ids, positions, 1.0, 3, V)[1]))
  assert not np.any(np.asarray(oracle.proposals(greedy, ids, positions, 0.0, 3, V)[1]))


def test_wrong_tokens_cover_the_other_ids():
  greedy = jnp.full((400, 48), 7, jnp.int32)
  ids = jnp.arange(400, dtype=jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(48, dtype=jnp.int32), (400, 48))
  tokens = np.asarray(oracle.proposals(greedy, ids, positions, 0.0, 0, V)[0])
  assert set(np.unique(tokens)) == set(range(V)) - {7}


# ---------------------------------------------------------------------------
# Whole decodes with a tiny target.
# ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def target():
  config = network.t5_1_1_config('tiny', vocab_size=V)
  return network.Transformer(config), network.init_params(config, jax.random.PRNGKey(0))


def _batch(rows=16, in_len=6, out_len=24):
  enc = np.random.RandomState(1).randint(2, V, (rows, in_len)).astype(np.int32)
  return {'encoder_input_tokens': enc, 'decoder_input_tokens': np.zeros((rows, out_len), np.int32)}


def _lengths(greedy_bl, eos_id=1):
  """Tokens each row generated: up to and including its first EOS, else the whole length."""
  return np.asarray([int(np.flatnonzero(row == eos_id)[0]) + 1 if np.any(row == eos_id) else len(row)
                     for row in greedy_bl])


def _decode(target, alpha, gamma, shrink=True, batch=None):
  module, params = target
  batch = batch or _batch()
  base = models.SpeculativeEncoderDecoderModel(module, None, decode_fn=decoding.temperature_sample)
  greedy = np.asarray(base.compile_predict({'temperature': 0.0})({'target': params}, batch)[0])
  drafter = oracle.OracleDrafter(oracle.OracleConfig(V))
  spec = models.SpeculativeEncoderDecoderModel(module, drafter)
  predict = spec.compile_predict({'temperature': 0.0, 'gamma': gamma, 'return_stats': True,
                                  'shrink_batch': shrink})
  out, aux = predict({'target': params, 'drafter': oracle.oracle_params(greedy, alpha, seed=5)}, batch)
  return greedy, np.asarray(out), jax.tree_util.tree_map(np.asarray, aux['stats'])


@pytest.mark.parametrize('alpha', [0.0, 0.6, 1.0])
def test_outputs_are_the_baseline_and_alpha_is_controlled(target, alpha):
  greedy, out, stats = _decode(target, alpha, gamma=3)
  np.testing.assert_array_equal(out, greedy)
  judged, accepted = int(stats['judged'].sum()), int(stats['accepted'].sum())
  assert judged >= 100
  if alpha == 1.0:
    assert accepted == judged  # every draft accepted
  elif alpha == 0.0:
    assert accepted == 0  # none
  else:
    assert _within_binomial(accepted, judged, alpha)


def test_every_draft_accepted_gives_gamma_plus_one_tokens_a_round(target):
  gamma = 3
  greedy, _, stats = _decode(target, 1.0, gamma)
  tokens = _lengths(greedy)
  np.testing.assert_array_equal(stats['target_calls'], -(-tokens // (gamma + 1)))
  np.testing.assert_array_equal(stats['emitted'], tokens)


def test_no_draft_accepted_gives_one_token_a_round(target):
  greedy, _, stats = _decode(target, 0.0, 4)
  tokens = _lengths(greedy)
  np.testing.assert_array_equal(stats['target_calls'], tokens)


def test_draws_follow_their_rows_when_the_batch_shrinks(target):
  # The draws depend on (example id, position) only: with or without shrinking, the same rows accept the
  # same drafts.
  batch = _batch(rows=8)
  _, out_shrink, shrink = _decode(target, 0.6, 2, shrink=True, batch=batch)
  _, out_full, full = _decode(target, 0.6, 2, shrink=False, batch=batch)
  np.testing.assert_array_equal(out_shrink, out_full)
  for key in ('accepted', 'judged', 'target_calls'):
    np.testing.assert_array_equal(shrink[key], full[key])


# ---------------------------------------------------------------------------
# Bad input, and no way into a drafter's table.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('alpha', [-0.1, 1.5])
def test_alpha_outside_unit_interval_is_refused(alpha):
  with pytest.raises(ValueError, match=r'accept_prob \(α\*\) must lie in \[0, 1\]'):
    oracle.oracle_params(np.zeros((2, 4), np.int32), alpha)


def test_params_of_another_batch_are_refused(target):
  module, params = target
  batch = _batch(rows=4)
  spec = models.SpeculativeEncoderDecoderModel(module, oracle.OracleDrafter(oracle.OracleConfig(V)))
  wrong = oracle.oracle_params(np.zeros((3, 24), np.int32), 0.5)
  with pytest.raises(ValueError, match='but the batch has 4 rows of decode length 24'):
    spec.compile_predict({'temperature': 0.0, 'gamma': 2})({'target': params, 'drafter': wrong}, batch)


def test_other_vocabulary_is_refused(target):
  module, _ = target
  with pytest.raises(ValueError, match='Vocabulary mismatch'):
    models.SpeculativeEncoderDecoderModel(module, oracle.OracleDrafter(oracle.OracleConfig(V + 1)))


def test_the_benchmark_refuses_the_oracle(target):
  module, params = target
  with pytest.raises(ValueError, match='measuring instrument of controlled acceptance'):
    benchmark.run(benchmark.ModelPair(module, params, oracle.OracleDrafter(oracle.OracleConfig(V)), {}),
                  benchmark.TaskSplit('no_such_task', 'test', {'inputs': 8, 'targets': 8}), settings.Setting(),
                  benchmark.Output('/nonexistent'))
