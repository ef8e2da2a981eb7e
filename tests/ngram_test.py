"""Tests for specdec/ngram.py: counts, tables, the decoding interface."""

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import checkpoints
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
    ngram.NgramConfig(V, order=3)
  with pytest.raises(ValueError, match='prior'):
    ngram.NgramConfig(V, prior=0.0)


def _fitted(order, tmp_path):
  unigram, bigram = ngram.count(SEQS, V)
  ngram.save(str(tmp_path / f'ng{order}'), ngram.NgramConfig(V, order=order),
             unigram, bigram)
  return checkpoints.load_module_and_params(str(tmp_path / f'ng{order}'))


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
    checkpoints.load_module_and_params(str(directory))
  assert str(e.value).startswith(f'{path}: ')


@pytest.mark.parametrize('order', [1, 2])
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
