"""Tests for specdec/ngram.py: counts, tables, the decoding interface."""

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import decoding
from specdec import models
from specdec import network
from specdec import ngram

V = 16
SEQS = [[3, 4, 5, 1], [3, 4, 1], [6, 1, 0, 0], [4, 4, 4, 1]]


def test_counts():
  unigram, bigram = ngram.count(SEQS, V)
  assert unigram[3] == 2 and unigram[4] == 5 and unigram[1] == 4
  assert unigram[0] == 0 and unigram.sum() == 13  # padding is not counted
  pairs = {(int(p), int(n)): int(c) for p, n, c in bigram}
  assert pairs[(0, 3)] == 2 and pairs[(0, 6)] == 1 and pairs[(0, 4)] == 1
  assert pairs[(3, 4)] == 2 and pairs[(4, 4)] == 2 and pairs[(4, 1)] == 2
  assert sum(pairs.values()) == 13


@pytest.mark.parametrize('order', [1, 2])
def test_tables_are_distributions(order):
  unigram, bigram = ngram.count(SEQS, V)
  table = ngram.log_prob_table(ngram.NgramConfig(V, order=order), unigram, bigram)
  probs = np.exp(table.astype(np.float64))
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  assert np.all(probs[..., 0] == 0)  # padding gets no mass
  if order == 2:
    # Seen bigrams dominate: after 3 the next token is 4 both times.
    assert np.argmax(probs[3]) == 4
    # An unseen context falls back to the unigram.
    uni = np.exp(ngram.log_prob_table(ngram.NgramConfig(V, order=1), unigram, bigram))
    np.testing.assert_allclose(probs[9], uni, atol=1e-6)


def test_bad_config():
  with pytest.raises(ValueError, match='order'):
    ngram.NgramConfig(V, order=4)
  with pytest.raises(ValueError, match='num_contexts'):
    ngram.NgramConfig(V, order=3)  # a trigram needs its context count
  with pytest.raises(ValueError, match='num_contexts'):
    ngram.NgramConfig(V, order=2, num_contexts=3)
  with pytest.raises(ValueError, match='top_k'):
    ngram.NgramConfig(V, order=3, num_contexts=3, top_k=0)
  with pytest.raises(ValueError, match='too large for a trigram'):
    ngram.NgramConfig(2 ** 16, order=3, num_contexts=3)
  with pytest.raises(ValueError, match='prior'):
    ngram.NgramConfig(V, prior=0.0)


def _config(order, seqs=SEQS, top_k=8):
  contexts = ngram.num_contexts(ngram.count_trigrams(seqs, V)) if order == 3 else 0
  return ngram.NgramConfig(V, order=order, num_contexts=contexts, top_k=top_k)


def _fitted(order, tmp_path, seqs=SEQS, top_k=8):
  unigram, bigram = ngram.count(seqs, V)
  ngram.save(str(tmp_path / f'ng{order}'), _config(order, seqs, top_k), unigram, bigram,
             trigram=ngram.count_trigrams(seqs, V) if order == 3 else None)
  return ngram.load(str(tmp_path / f'ng{order}'))


@pytest.mark.parametrize('order', [1, 2])
def test_decode_step_contract(order, tmp_path):
  module, params = _fitted(order, tmp_path)
  enc = jnp.ones((2, 5), jnp.int32)
  _, variables = module.apply({'params': params}, None, enc, 8,
                              method=module.init_cache, mutable=['cache'])
  assert not variables.get('cache')  # stateless
  tokens = jnp.asarray([[3, 4, 5], [6, 1, 0]])
  logits, _ = module.apply({'params': params},
                           tokens, jnp.asarray([0, 4]),
                           method=module.decode_step, mutable=['cache'])
  assert logits.shape == (2, 3, V)
  table = params['log_probs']
  expected = table[tokens] if order == 2 else jnp.broadcast_to(table, (2, 3, V))
  np.testing.assert_array_equal(logits, expected)


def test_save_load_round_trip(tmp_path):
  module, params = _fitted(2, tmp_path)
  assert module.config == ngram.NgramConfig(V, order=2)
  with pytest.raises(FileNotFoundError, match='No (config.json|counts.npz)'):
    ngram.load(str(tmp_path))


def _saved(tmp_path, extra=None):
  unigram, bigram = ngram.count(SEQS, V)
  directory = tmp_path / 'ng'
  ngram.save(str(directory), ngram.NgramConfig(V, order=2), unigram, bigram, extra=extra)
  return directory


def test_save_records_the_counts_hash(tmp_path):
  directory = _saved(tmp_path, extra={'command': 'x'})
  meta = json.loads((directory / ngram.CONFIG_FILE).read_text())
  data = (directory / ngram.COUNTS_FILE).read_bytes()
  assert meta['files'] == {ngram.COUNTS_FILE: hashlib.sha256(data).hexdigest()}
  assert meta['command'] == 'x'
  with pytest.raises(ValueError, match='files'):
    _saved(tmp_path, extra={'files': {}})


def _damage(path, how):
  raw = bytearray(path.read_bytes())
  if how == 'truncate':
    raw = raw[:len(raw) // 2]
  else:  # overwrite bytes in the middle, same size
    raw[len(raw) // 2:len(raw) // 2 + 8] = b'\xff' * 8
  path.write_bytes(bytes(raw))


@pytest.mark.parametrize('how', ['truncate', 'overwrite'])
def test_damaged_counts_name_the_file(tmp_path, how):
  directory = _saved(tmp_path)
  path = directory / ngram.COUNTS_FILE
  _damage(path, how)
  with pytest.raises(ValueError, match=f'^{path}: damaged, truncated or modified'):
    ngram.load(str(directory))


@pytest.mark.parametrize('how', ['truncate', 'overwrite'])
def test_damaged_counts_without_hashes(tmp_path, how):
  """A directory saved before hashes existed: the zip's own checks name the file."""
  directory = _saved(tmp_path)
  meta_path = directory / ngram.CONFIG_FILE
  meta = json.loads(meta_path.read_text())
  del meta['files']
  meta_path.write_text(json.dumps(meta))
  assert ngram.load(str(directory))[0].config.order == 2  # the old format loads
  path = directory / ngram.COUNTS_FILE
  _damage(path, how)
  with pytest.raises(ValueError, match=f'^{path}: damaged or truncated counts file'):
    ngram.load(str(directory))


@pytest.mark.parametrize('content, match', [
    (b'{"ngram_config": {"vocab_size": 16, "ord', 'damaged or incomplete config file'),
    (b'{"config": {}}', "no valid 'ngram_config'"),
    (b'{"ngram_config": {"order": 2}}', "no valid 'ngram_config'"),
])
def test_bad_config_json_names_the_file(tmp_path, content, match):
  directory = _saved(tmp_path)
  path = directory / ngram.CONFIG_FILE
  path.write_bytes(content)
  with pytest.raises(ValueError, match=match) as e:
    ngram.load(str(directory))
  assert str(e.value).startswith(f'{path}: ')


@pytest.mark.parametrize('order', [1, 2, 3])
def test_greedy_identity_with_ngram_drafter(order, tmp_path):
  drafter, drafter_params = _fitted(order, tmp_path)
  cfg = network.t5_1_1_config('tiny', vocab_size=V)
  target_params = network.init_params(cfg, jax.random.PRNGKey(0))
  params = {'target': target_params, 'drafter': drafter_params}
  batch = {'encoder_input_tokens': jnp.asarray(
               np.random.RandomState(0).randint(2, V, (3, 6)), jnp.int32),
           'decoder_input_tokens': jnp.zeros((3, 10), jnp.int32)}
  spec = models.SpeculativeEncoderDecoderModel(network.Transformer(cfg), drafter)
  base = models.SpeculativeEncoderDecoderModel(
      network.Transformer(cfg), None, decode_fn=decoding.temperature_sample)
  out, aux = spec.compile_predict({'temperature': 0.0, 'gamma': 3,
                                   'return_stats': True})(params, batch)
  ref, _ = base.compile_predict({'temperature': 0.0})(params, batch)
  np.testing.assert_array_equal(out, ref)
  assert int(np.sum(aux['stats']['judged'])) > 0


def test_vocab_mismatch_with_target(tmp_path):
  drafter, _ = _fitted(2, tmp_path)
  with pytest.raises(ValueError, match='Vocabulary mismatch'):
    models.SpeculativeEncoderDecoderModel(
        network.Transformer(network.t5_1_1_config('tiny', vocab_size=V + 1)),
        drafter)


# ---------------------------------------------------------------------------
# The trigram.
# ---------------------------------------------------------------------------


def test_trigram_counts():
  trigram = ngram.count_trigrams(SEQS, V)
  triples = {(int(a), int(b), int(x)): int(c) for a, b, x, c in trigram}
  # [3, 4, 5, 1] and [3, 4, 1]: contexts (0, 0) -> 3, (0, 3) -> 4, (3, 4) -> 5 and 1.
  assert triples[(0, 0, 3)] == 2 and triples[(0, 3, 4)] == 2
  assert triples[(3, 4, 5)] == 1 and triples[(3, 4, 1)] == 1 and triples[(4, 5, 1)] == 1
  # [4, 4, 4, 1]: (0, 4) -> 4, (4, 4) -> 4 then 1; padding ends [6, 1, 0, 0].
  assert triples[(0, 4, 4)] == 1 and triples[(4, 4, 4)] == 1 and triples[(4, 4, 1)] == 1
  assert triples[(0, 6, 1)] == 1
  assert sum(triples.values()) == 13  # one per counted token, as the unigram
  keys = (trigram[:, 0] * V + trigram[:, 1]) * V + trigram[:, 2]
  assert np.all(np.diff(keys) > 0)
  assert ngram.num_contexts(trigram) == 7


def test_trigram_tables_keep_the_top_k_continuations():
  # Context (0, 3) is followed by 5 three times, 4 twice, 6 and 7 once each.
  seqs = [[3, 5, 1]] * 3 + [[3, 4, 1]] * 2 + [[3, 6, 1], [3, 7, 1]]
  trigram = ngram.count_trigrams(seqs, V)
  keys, ids, counts = ngram.trigram_tables(_config(3, seqs, top_k=3), trigram)
  assert keys.dtype == np.int32 and np.all(np.diff(keys) > 0)
  row = int(np.searchsorted(keys, 0 * V + 3))
  assert keys[row] == 3
  np.testing.assert_array_equal(ids[row], [5, 4, 6])  # 6 before 7: ties by token id
  np.testing.assert_array_equal(counts[row], [3, 2, 1])
  row = int(np.searchsorted(keys, 3 * V + 5))
  np.testing.assert_array_equal(ids[row], [1, 0, 0])  # unused slots: id 0, count 0
  np.testing.assert_array_equal(counts[row], [3, 0, 0])


def _decode(module, params, tokens_bk, positions_b, cache):
  logits, variables = module.apply({'params': params, 'cache': cache}, jnp.asarray(tokens_bk),
                                   jnp.asarray(positions_b), method=module.decode_step,
                                   mutable=['cache'])
  return np.asarray(logits), variables['cache']


def _init_cache(module, params, rows, length):
  _, variables = module.apply({'params': params}, None, jnp.ones((rows, 5), jnp.int32), length,
                              method=module.init_cache, mutable=['cache'])
  return variables['cache']


def test_trigram_rows_are_the_interpolated_distribution(tmp_path):
  module, params = _fitted(3, tmp_path)
  unigram, bigram = ngram.count(SEQS, V)
  bigram_p = np.exp(ngram.log_prob_table(ngram.NgramConfig(V), unigram, bigram).astype(np.float64))
  cache = _init_cache(module, params, 1, 8)
  # Feed BOS, 3, 4: rows for contexts (0, 0), (0, 3), (3, 4).
  logits, _ = _decode(module, params, [[0, 3, 4]], [0], cache)
  probs = np.exp(logits[0].astype(np.float64))
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  assert np.all(probs[:, 0] == 0)
  prior = module.config.prior
  for j, (b, continuations) in enumerate([(0, {3: 2, 6: 1, 4: 1}), (3, {4: 2}), (4, {5: 1, 1: 1})]):
    n = sum(continuations.values())
    expected = bigram_p[b] * prior / (n + prior)
    for x, c in continuations.items():
      expected[x] += c / (n + prior)
    np.testing.assert_allclose(probs[j], expected, rtol=1e-5, atol=1e-7)
  # An unseen context (5, 3) is the bigram row of 3.
  logits, _ = _decode(module, params, [[5, 3]], [1], _init_cache(module, params, 1, 8))
  np.testing.assert_allclose(np.exp(logits[0, 1].astype(np.float64)), bigram_p[3], rtol=1e-5, atol=1e-7)


def test_trigram_cache_matches_one_call_and_teacher_forcing(tmp_path):
  module, params = _fitted(3, tmp_path)
  tokens = np.array([[0, 3, 4, 5, 1, 0], [0, 4, 4, 4, 1, 0]], np.int32)
  whole, _ = _decode(module, params, tokens, [0, 0], _init_cache(module, params, 2, 8))
  # The same positions fed 1, then 3, then 2 tokens a call: the cache carries the context.
  cache = _init_cache(module, params, 2, 8)
  parts = []
  for start, stop in ((0, 1), (1, 4), (4, 6)):
    logits, cache = _decode(module, params, tokens[:, start:stop], [start, start], cache)
    parts.append(logits)
  np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-6)
  np.testing.assert_array_equal(cache['decoded_tokens'][:, :6], tokens)
  forced = module.apply({'params': params}, None, jnp.asarray(tokens), enable_dropout=False)
  np.testing.assert_allclose(np.asarray(forced), whole, rtol=1e-6)
  # Packed: the second segment's BOS restarts the context, as a new decode does.
  packed = np.concatenate([tokens[:1, :5], tokens[1:, :5]], axis=1)
  segments = np.repeat([[1, 2]], 5, axis=1)
  forced = module.apply({'params': params}, None, jnp.asarray(packed),
                        decoder_segment_ids=jnp.asarray(segments), enable_dropout=False)
  np.testing.assert_allclose(np.asarray(forced)[0, 5:], whole[1, :5], rtol=1e-6)
  # Rows at different positions, and writes past the cache's end dropped.
  cache = _init_cache(module, params, 2, 4)
  _, cache = _decode(module, params, tokens[:, :3], [0, 0], cache)
  logits, cache = _decode(module, params, tokens[:, 3:5], [3, 3], cache)  # position 4 is past the end
  np.testing.assert_allclose(logits[:, 0], whole[:, 3], rtol=1e-6)
  assert cache['decoded_tokens'].shape == (2, 4)


def test_trigram_save_checks_its_counts(tmp_path):
  unigram, bigram = ngram.count(SEQS, V)
  trigram = ngram.count_trigrams(SEQS, V)
  with pytest.raises(ValueError, match='trigram counts'):
    ngram.save(str(tmp_path / 'a'), _config(3), unigram, bigram)
  with pytest.raises(ValueError, match='trigram counts'):
    ngram.save(str(tmp_path / 'b'), ngram.NgramConfig(V, order=3, num_contexts=2), unigram, bigram,
               trigram=trigram)
  # A config edited after saving no longer fits the counts: the load names it.
  ngram.save(str(tmp_path / 'c'), _config(3), unigram, bigram, trigram=trigram)
  meta_path = tmp_path / 'c' / ngram.CONFIG_FILE
  meta = json.loads(meta_path.read_text())
  meta['ngram_config']['num_contexts'] = 3
  meta_path.write_text(json.dumps(meta))
  with pytest.raises(ValueError, match='7 trigram contexts, but the config says num_contexts=3'):
    ngram.load(str(tmp_path / 'c'))


def test_trigram_sampling_decodes_run(tmp_path):
  """At temperature 1 the trigram's q enters Algorithm 1's test (exactness is the
  decoding tests' job; here: the loop runs, drafts are judged and some kept)."""
  drafter, drafter_params = _fitted(3, tmp_path)
  cfg = network.t5_1_1_config('tiny', vocab_size=V)
  params = {'target': network.init_params(cfg, jax.random.PRNGKey(0)), 'drafter': drafter_params}
  batch = {'encoder_input_tokens': jnp.asarray(np.random.RandomState(1).randint(2, V, (4, 6)), jnp.int32),
           'decoder_input_tokens': jnp.zeros((4, 12), jnp.int32)}
  spec = models.SpeculativeEncoderDecoderModel(network.Transformer(cfg), drafter)
  out, aux = spec.compile_predict({'temperature': 1.0, 'gamma': 3, 'return_stats': True})(
      params, batch, jax.random.PRNGKey(3))
  assert out.shape == (4, 12) and np.all((np.asarray(out) >= 0) & (np.asarray(out) < V))
  assert int(np.sum(aux['stats']['judged'])) > 0
