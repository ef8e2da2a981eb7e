"""Tests for specdec/network.py: T5X parameter tree, presets, k-token cache.

Everything runs on CPU in float32 with the 'tiny' preset. Shapes are kept to
a few (B=2, S=6, T=L=8) so the jitted functions compile only a handful of
times.
"""

import dataclasses
import os
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from specdec import draft_tree
from specdec import network

ATOL = 1e-5
B, S, T = 2, 6, 8  # Batch, encoder length, decoder length = cache length.

CFG = network.t5_1_1_config('tiny')
MODEL = network.Transformer(CFG)
Transformer = network.Transformer

# -----------------------------------------------------------------------------
# Jitted entry points (one compile per shape) and shared data
# -----------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames='model')
def forward(params, enc, dec_in, dec_tgt, enc_seg=None, dec_seg=None,
            model=MODEL):
  return model.apply({'params': params}, enc, dec_in, dec_tgt, enc_seg,
                     dec_seg, enable_dropout=False)


@jax.jit
def encode(params, enc):
  return MODEL.apply({'params': params}, enc, enable_dropout=False,
                     method=Transformer.encode)


@jax.jit
def decode(params, encoded, enc, dec_in, dec_tgt):
  return MODEL.apply({'params': params}, encoded, enc, dec_in, dec_tgt,
                     enable_dropout=False, method=Transformer.decode)


@functools.partial(jax.jit, static_argnums=3)
def init_cache(params, encoded, enc, max_len):
  _, variables = MODEL.apply({'params': params}, encoded, enc, max_len,
                             method=Transformer.init_cache, mutable=['cache'])
  return variables['cache']


@jax.jit
def step(params, cache, tokens, positions):
  logits, variables = MODEL.apply(
      {'params': params, 'cache': cache}, tokens, positions,
      method=Transformer.decode_step, mutable=['cache'])
  return logits, variables['cache']


def _tokens(rng, shape):
  return jnp.asarray(rng.integers(1, CFG.vocab_size, size=shape), jnp.int32)


def _shift_right(targets):
  return jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]


def _flat(tree):
  return {'/'.join(str(k.key) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _assert_trees_close(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(x, y, atol=ATOL)


@pytest.fixture(scope='module')
def params():
  return network.init_params(CFG, jax.random.key(0))


@pytest.fixture(scope='module')
def data():
  rng = np.random.default_rng(0)
  enc = _tokens(rng, (B, S)).at[0, 4:].set(0)  # Row 0 is padded.
  targets = _tokens(rng, (B, T))
  return dict(enc=enc, targets=targets, dec_in=_shift_right(targets),
              other=_tokens(rng, (B, T)))


@pytest.fixture(scope='module')
def reference(params, data):
  """Teacher-forced logits, the encoder output and a fresh cache."""
  logits = forward(params, data['enc'], data['dec_in'], data['targets'])
  encoded = encode(params, data['enc'])
  cache = init_cache(params, encoded, data['enc'], T)
  return dict(logits=logits, encoded=encoded, cache=cache)


def _run_steps(params, cache, tokens_bt, chunks):
  """decode_step over (start, k) chunks of tokens_bt, all rows at `start`."""
  outs = []
  for start, k in chunks:
    positions = jnp.full((B,), start, jnp.int32)
    logits, cache = step(params, cache, tokens_bt[:, start:start + k],
                         positions)
    outs.append(logits)
  return jnp.concatenate(outs, axis=1), cache


# -----------------------------------------------------------------------------
# Parameter tree, logical axes, presets
# -----------------------------------------------------------------------------


def _expected_t5x_shapes(cfg):
  """{path: shape} of T5X's T5 1.1 tree (T5X.md)."""
  e, m, v = cfg.emb_dim, cfg.mlp_dim, cfg.vocab_size
  hd = cfg.num_heads * cfg.head_dim
  rel = (cfg.num_heads, cfg.relative_attention_num_buckets)

  def attention(prefix):
    names = ('query', 'key', 'value')
    shapes = {f'{prefix}/{name}/kernel': (e, hd) for name in names}
    return shapes | {f'{prefix}/out/kernel': (hd, e)}

  def mlp(prefix):
    return {f'{prefix}/wi_0/kernel': (e, m), f'{prefix}/wi_1/kernel': (e, m),
            f'{prefix}/wo/kernel': (m, e)}

  shapes = {
      'token_embedder/embedding': (v, e),
      'encoder/relpos_bias/rel_embedding': rel,
      'decoder/relpos_bias/rel_embedding': rel,
      'encoder/encoder_norm/scale': (e,),
      'decoder/decoder_norm/scale': (e,),
      'decoder/logits_dense/kernel': (e, v),
  }
  for i in range(cfg.num_encoder_layers):
    p = f'encoder/layers_{i}'
    shapes |= {f'{p}/pre_attention_layer_norm/scale': (e,),
               f'{p}/pre_mlp_layer_norm/scale': (e,)}
    shapes |= attention(f'{p}/attention') | mlp(f'{p}/mlp')
  for i in range(cfg.num_decoder_layers):
    p = f'decoder/layers_{i}'
    shapes |= {f'{p}/pre_self_attention_layer_norm/scale': (e,),
               f'{p}/pre_cross_attention_layer_norm/scale': (e,),
               f'{p}/pre_mlp_layer_norm/scale': (e,)}
    shapes |= attention(f'{p}/self_attention')
    shapes |= attention(f'{p}/encoder_decoder_attention')
    shapes |= mlp(f'{p}/mlp')
  return shapes


def test_param_tree_matches_t5x(params):
  assert set(params) == {'token_embedder', 'encoder', 'decoder'}
  flat = _flat(params)
  shapes = {k: tuple(v.shape) for k, v in flat.items()}
  assert shapes == _expected_t5x_shapes(CFG)
  for leaf in flat.values():  # Unboxed float32 arrays.
    assert isinstance(leaf, jax.Array) and leaf.dtype == jnp.float32


def test_param_tree_with_tied_logits_has_no_logits_dense():
  cfg = network.t5_1_1_config('tiny', logits_via_embedding=True)
  tree = jax.eval_shape(lambda key: network.init_params(cfg, key),
                        jax.random.key(0))
  expected = _expected_t5x_shapes(cfg)
  del expected['decoder/logits_dense/kernel']
  assert {k: tuple(v.shape) for k, v in _flat(tree).items()} == expected


def _expected_axes(path):
  by_owner = {
      'query': P('embed', 'joined_kv'), 'key': P('embed', 'joined_kv'),
      'value': P('embed', 'joined_kv'), 'out': P('joined_kv', 'embed'),
      'wi_0': P('embed', 'mlp'), 'wi_1': P('embed', 'mlp'),
      'wo': P('mlp', 'embed'), 'logits_dense': P('embed', 'vocab'),
      'token_embedder': P('vocab', 'embed'),
      'relpos_bias': P('heads', 'relpos_buckets')}
  if path.endswith('/scale'):
    return P('embed')
  return by_owner[path.split('/')[-2]]


def test_param_logical_axes():
  axes = _flat(network.param_logical_axes(CFG))
  assert set(axes) == set(_expected_t5x_shapes(CFG))
  for path, spec in axes.items():
    assert spec == _expected_axes(path), path


def test_initialisers(params):
  attention = params['encoder']['layers_0']['attention']
  # 1/sqrt(head_dim) is folded into the query init: stddev
  # (emb * head_dim)**-0.5, against emb**-0.5 for keys.
  np.testing.assert_allclose(np.std(attention['query']['kernel']),
                             (CFG.emb_dim * CFG.head_dim)**-0.5, rtol=0.15)
  np.testing.assert_allclose(np.std(attention['key']['kernel']),
                             CFG.emb_dim**-0.5, rtol=0.15)
  np.testing.assert_allclose(np.std(params['token_embedder']['embedding']),
                             1.0, rtol=0.1)
  np.testing.assert_array_equal(params['encoder']['encoder_norm']['scale'], 1)


# PAPER.md, "T5 1.1 sizes": emb, heads, head_dim, layers (enc = dec), mlp.
PAPER_TABLE = {
    'small': (512, 6, 64, 8, 1024),
    'base': (768, 12, 64, 12, 2048),
    'large': (1024, 16, 64, 24, 2816),
    'xl': (2048, 32, 64, 24, 5120),
    'xxl': (4096, 64, 64, 24, 10240),
}


@pytest.mark.parametrize('name', sorted(PAPER_TABLE))
def test_presets_match_paper_table(name):
  cfg = network.t5_1_1_config(name)
  emb, heads, head_dim, layers, mlp = PAPER_TABLE[name]
  assert (cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (
      emb, heads, head_dim, mlp)
  assert (cfg.num_encoder_layers, cfg.num_decoder_layers) == (layers, layers)
  assert cfg.vocab_size == 32128 and cfg.dtype == jnp.float32
  assert cfg.mlp_activations == ('gelu', 'linear')
  assert not cfg.logits_via_embedding
  assert (cfg.relative_attention_num_buckets,
          cfg.relative_attention_max_distance) == (32, 128)
  assert network.PRESETS[name] == cfg


def test_preset_overrides_and_dtype_names():
  cfg = network.t5_1_1_config('tiny', vocab_size=7, dtype='bfloat16')
  assert cfg.vocab_size == 7 and cfg.dtype == jnp.bfloat16
  assert cfg == network.t5_1_1_config('tiny', vocab_size=7,
                                      dtype=jnp.bfloat16)
  assert network.t5_1_1_config('tiny').dtype == jnp.float32


def test_small_param_count_is_77m():
  cfg = network.t5_1_1_config('small')
  tree = jax.eval_shape(lambda key: network.init_params(cfg, key),
                        jax.random.key(0))
  count = sum(x.size for x in jax.tree_util.tree_leaves(tree))
  assert count == 76_961_152


def test_unknown_preset_lists_valid_names():
  with pytest.raises(ValueError, match=r"'base'.*'xxl'"):
    network.t5_1_1_config('medium')


@pytest.mark.parametrize('field,value', [
    ('vocab_size', 0), ('emb_dim', -1), ('num_heads', 0), ('head_dim', 2.5),
    ('mlp_dim', 0), ('num_encoder_layers', 0), ('num_decoder_layers', -2),
    ('relative_attention_num_buckets', 0),
    ('relative_attention_max_distance', 0), ('dropout_rate', 1.0),
    ('mlp_activations', ()), ('mlp_activations', ('no_such_fn',)),
    ('dtype', jnp.int32)])
def test_bad_config_raises(field, value):
  with pytest.raises(ValueError, match=field):
    network.t5_1_1_config('tiny', **{field: value})


def test_relative_position_buckets():
  uni = network._relative_position_bucket_table(False, 32, 128)
  bi = network._relative_position_bucket_table(True, 32, 128)
  bucket = lambda table, rel: int(table[rel + 128])
  # Unidirectional: the future is bucket 0; exact up to 15 back, then log.
  assert [bucket(uni, r) for r in (5, 0, -1, -15, -16, -20, -127, -128)] == [
      0, 0, 1, 15, 16, 17, 31, 31]
  # Bidirectional: 16 buckets a direction, future keys in 16..31.
  assert [bucket(bi, r) for r in (0, -1, -7, -8, 1, 7, 8, 128, -128)] == [
      0, 1, 7, 8, 17, 23, 24, 31, 15]


# -----------------------------------------------------------------------------
# Errors
# -----------------------------------------------------------------------------


def test_call_with_decode_true_raises(params, data):
  with pytest.raises(ValueError, match='init_cache.*decode_step'):
    MODEL.apply({'params': params}, data['enc'], data['dec_in'],
                data['targets'], decode=True)


def test_decode_step_without_cache_raises(params, data):
  with pytest.raises(ValueError, match='init_cache'):
    MODEL.apply({'params': params}, data['dec_in'][:, :1],
                jnp.zeros((B,), jnp.int32), method=Transformer.decode_step,
                mutable=['cache'])


def test_encoder_segments_without_decoder_segments_raise(params, data):
  apply = lambda: MODEL.apply(
      {'params': params}, data['enc'], data['dec_in'], data['targets'],
      encoder_segment_ids=jnp.ones_like(data['enc']), enable_dropout=False)
  with pytest.raises(ValueError, match='decoder_segment_ids'):
    jax.eval_shape(apply)


# -----------------------------------------------------------------------------
# Cached decoding == teacher forcing
# -----------------------------------------------------------------------------


def test_call_is_encode_then_decode(params, data, reference):
  logits = reference['logits']
  assert logits.shape == (B, T, CFG.vocab_size)
  assert logits.dtype == jnp.float32
  decoded = decode(params, reference['encoded'], data['enc'], data['dec_in'],
                   data['targets'])
  np.testing.assert_allclose(decoded, logits, atol=ATOL)


def test_decode_steps_match_teacher_forcing(params, data, reference):
  logits, _ = _run_steps(params, reference['cache'], data['dec_in'],
                         [(0, 1), (1, 3), (4, 2), (6, 2)])
  np.testing.assert_allclose(logits, reference['logits'], atol=ATOL)


def test_k_token_call_equals_k_one_token_calls(params, data, reference):
  dec_in = data['dec_in']
  _, cache = _run_steps(params, reference['cache'], dec_in, [(0, 2)])
  many, cache_many = _run_steps(params, cache, dec_in, [(2, 4)])
  ones, cache_ones = _run_steps(params, cache, dec_in,
                                [(2, 1), (3, 1), (4, 1), (5, 1)])
  np.testing.assert_allclose(many, ones, atol=ATOL)
  _assert_trees_close(cache_many, cache_ones)


def test_rows_at_different_positions(params, data, reference):
  dec_in, ref = data['dec_in'], reference['logits']
  _, cache = _run_steps(params, reference['cache'], dec_in, [(0, 2)])
  # Both rows at 2: row 0 writes junk at 2..4, row 1 its real tokens.
  tokens = jnp.stack([data['other'][0, 2:5], dec_in[1, 2:5]])
  logits, cache = step(params, cache, tokens, jnp.array([2, 2], jnp.int32))
  np.testing.assert_allclose(logits[1], ref[1, 2:5], atol=ATOL)
  # Row 0 redoes 2..4 over the junk while row 1 goes on at 5..7.
  tokens = jnp.stack([dec_in[0, 2:5], dec_in[1, 5:8]])
  logits, _ = step(params, cache, tokens, jnp.array([2, 5], jnp.int32))
  np.testing.assert_allclose(logits[0], ref[0, 2:5], atol=ATOL)
  np.testing.assert_allclose(logits[1], ref[1, 5:8], atol=ATOL)


def test_stale_entries_beyond_position_are_masked(params, data, reference):
  dec_in, at = data['dec_in'], lambda p: jnp.full((B,), p, jnp.int32)
  _, cache = _run_steps(params, reference['cache'], dec_in, [(0, 3)])
  logits, cache = step(params, cache, dec_in[:, 3:7], at(3))  # Writes 3..6.
  np.testing.assert_allclose(logits, reference['logits'][:, 3:7], atol=ATOL)
  # Two other tokens at 4..5; position 6 keeps its entry from above.
  new_in = dec_in.at[:, 4:6].set(data['other'][:, 4:6])
  logits, _ = step(params, cache, new_in[:, 4:6], at(4))
  fresh = forward(params, data['enc'], new_in, data['targets'])
  np.testing.assert_allclose(logits, fresh[:, 4:6], atol=ATOL)
  # The new tokens do change the logits.
  assert not np.allclose(fresh[:, 4:6], reference['logits'][:, 4:6],
                         atol=1e-3)


def test_writes_past_cache_end_are_dropped(params, data, reference):
  dec_in, at = data['dec_in'], lambda p: jnp.full((B,), p, jnp.int32)
  _, full = _run_steps(params, reference['cache'], dec_in,
                       [(0, 3), (3, 3), (6, 2)])
  _, cache = _run_steps(params, reference['cache'], dec_in, [(0, 3), (3, 3)])
  # 4 tokens at 6..9 into a cache of 8: 6 and 7 land, 8 and 9 are dropped (a
  # clamped write would move the block to 4..7, over the prefix).
  tokens = jnp.concatenate([dec_in[:, 6:8], data['other'][:, :2]], axis=1)
  logits, cache = step(params, cache, tokens, at(6))
  np.testing.assert_allclose(logits[:, :2], reference['logits'][:, 6:8],
                             atol=ATOL)
  _assert_trees_close(cache, full)
  # Negative positions are dropped too, not wrapped to the end.
  _, after = step(params, cache, data['other'][:, :2], at(-2))
  jax.tree_util.tree_map(np.testing.assert_array_equal, after, cache)


# -----------------------------------------------------------------------------
# Encoder side: padding, cached cross-attention, packing
# -----------------------------------------------------------------------------


def test_encoder_padding_is_ignored(params, data, reference):
  enc, dec_in, targets = data['enc'], data['dec_in'], data['targets']
  ref = reference['logits']
  # What the encoder output holds at padded positions (row 0, 4..5) does not
  # reach the decoder, teacher-forced or cached ...
  noisy = reference['encoded'].at[0, 4:].set(100.0)
  np.testing.assert_allclose(decode(params, noisy, enc, dec_in, targets), ref,
                             atol=ATOL)
  logits, _ = _run_steps(params, init_cache(params, noisy, enc, T), dec_in,
                         [(0, 3), (3, 3), (6, 2)])
  np.testing.assert_allclose(logits, ref, atol=ATOL)
  # ... and neither does the amount of padding.
  longer = jnp.pad(enc, ((0, 0), (0, 4)))
  np.testing.assert_allclose(forward(params, longer, dec_in, targets), ref,
                             atol=ATOL)


def test_cross_attention_projections_are_cached_once(params, data, reference):
  encoded, cache = reference['encoded'], reference['cache']
  np.testing.assert_array_equal(cache['decoder']['encoder_mask'],
                                data['enc'] > 0)
  heads = (CFG.num_heads, CFG.head_dim)
  for i in range(CFG.num_decoder_layers):
    kernels = params['decoder'][f'layers_{i}']['encoder_decoder_attention']
    cached = cache['decoder'][f'layers_{i}']['encoder_decoder_attention']
    for name in ('key', 'value'):
      expected = encoded @ kernels[name]['kernel']
      np.testing.assert_allclose(cached[f'encoded_{name}'],
                                 expected.reshape((B, S) + heads), atol=ATOL)
  # Zeroing the cross key/value kernels after init_cache changes nothing:
  # decode_step never projects the encoder output again.
  def zero_cross_kv(path, x):
    owner = [k.key for k in path][-3:-1]
    is_cross_kv = owner in (['encoder_decoder_attention', 'key'],
                            ['encoder_decoder_attention', 'value'])
    return jnp.zeros_like(x) if is_cross_kv else x

  zeroed = jax.tree_util.tree_map_with_path(zero_cross_kv, params)
  zero_leaves = sum(not np.any(x) for x in jax.tree_util.tree_leaves(zeroed))
  assert zero_leaves == 2 * CFG.num_decoder_layers
  logits, _ = _run_steps(zeroed, cache, data['dec_in'],
                         [(0, 3), (3, 3), (6, 2)])
  np.testing.assert_allclose(logits, reference['logits'], atol=ATOL)


def test_cache_layout(reference):
  cache = reference['cache']
  heads = (CFG.num_heads, CFG.head_dim)
  expected = {'decoder/encoder_mask': ((B, S), jnp.bool_)}
  for i in range(CFG.num_decoder_layers):
    p = f'decoder/layers_{i}'
    for name in ('cached_key', 'cached_value'):
      expected[f'{p}/self_attention/{name}'] = ((B, T) + heads, jnp.float32)
    for name in ('encoded_key', 'encoded_value'):
      expected[f'{p}/encoder_decoder_attention/{name}'] = ((B, S) + heads,
                                                           jnp.float32)
  assert {k: (v.shape, v.dtype) for k, v in _flat(cache).items()} == expected
  self_cache = cache['decoder']['layers_0']['self_attention']
  np.testing.assert_array_equal(self_cache['cached_key'], 0.0)


def test_packed_segments_match_separate_examples(params):
  rng = np.random.default_rng(1)
  a_enc, b_enc = _tokens(rng, (3,)), _tokens(rng, (2,))
  a_tgt, b_tgt = _tokens(rng, (3,)), _tokens(rng, (4,))
  pad = lambda x, n: jnp.pad(x, (0, n - x.shape[0]))
  cat = lambda x, y, n: pad(jnp.concatenate([x, y]), n)
  shift = lambda x: _shift_right(x[None])[0]
  segments = lambda n1, n2, n: cat(jnp.ones(n1, jnp.int32),
                                   jnp.full(n2, 2, jnp.int32), n)
  # Alone: one example a row.
  alone = forward(params, jnp.stack([pad(a_enc, S), pad(b_enc, S)]),
                  jnp.stack([pad(shift(a_tgt), T), pad(shift(b_tgt), T)]),
                  jnp.stack([pad(a_tgt, T), pad(b_tgt, T)]))
  # Packed: row 0 is a|b, row 1 is b|a.
  packed = forward(
      params,
      jnp.stack([cat(a_enc, b_enc, S), cat(b_enc, a_enc, S)]),
      jnp.stack([cat(shift(a_tgt), shift(b_tgt), T),
                 cat(shift(b_tgt), shift(a_tgt), T)]),
      jnp.stack([cat(a_tgt, b_tgt, T), cat(b_tgt, a_tgt, T)]),
      jnp.stack([segments(3, 2, S), segments(2, 3, S)]),
      jnp.stack([segments(3, 4, T), segments(4, 3, T)]))
  np.testing.assert_allclose(packed[0, :3], alone[0, :3], atol=ATOL)
  np.testing.assert_allclose(packed[0, 3:7], alone[1, :4], atol=ATOL)
  np.testing.assert_allclose(packed[1, :4], alone[1, :4], atol=ATOL)
  np.testing.assert_allclose(packed[1, 4:7], alone[0, :3], atol=ATOL)


# -----------------------------------------------------------------------------
# Dropout, tied logits, bfloat16
# -----------------------------------------------------------------------------


def test_dropout_only_when_enabled(params, data, reference):
  # The other tests run with the default dropout_rate (0.1) and
  # enable_dropout=False, decode_step's default.
  @jax.jit
  def encode_with_dropout(params, enc, key):
    return MODEL.apply({'params': params}, enc, enable_dropout=True,
                       rngs={'dropout': key}, method=Transformer.encode)

  dropped = encode_with_dropout(params, data['enc'], jax.random.key(1))
  assert not np.allclose(dropped, reference['encoded'], atol=1e-3)
  again = encode_with_dropout(params, data['enc'], jax.random.key(1))
  np.testing.assert_array_equal(dropped, again)


def test_logits_via_embedding_scales_by_rsqrt_emb(params, data):
  tied_model = Transformer(
      network.t5_1_1_config('tiny', logits_via_embedding=True))
  tied_params = dict(params, decoder={
      k: v for k, v in params['decoder'].items() if k != 'logits_dense'})
  args = (data['enc'], data['dec_in'], data['targets'])
  tied = forward(tied_params, *args, model=tied_model)
  # The same as an untied layer with kernel embedding.T / sqrt(emb).
  kernel = params['token_embedder']['embedding'].T / np.sqrt(CFG.emb_dim)
  untied_params = dict(params, decoder=dict(
      params['decoder'], logits_dense={'kernel': kernel}))
  np.testing.assert_allclose(tied, forward(untied_params, *args), atol=ATOL)


def test_bfloat16_activations(params, data):
  model = Transformer(network.t5_1_1_config('tiny', dtype=jnp.bfloat16))

  @jax.jit  # One compile for the whole round trip.
  def run(params, enc, dec_in, targets):
    teacher = model.apply({'params': params}, enc, dec_in, targets,
                          enable_dropout=False)
    encoded = model.apply({'params': params}, enc, enable_dropout=False,
                          method=Transformer.encode)
    _, variables = model.apply({'params': params}, encoded, enc, T,
                               method=Transformer.init_cache,
                               mutable=['cache'])
    logits, variables = model.apply(
        {'params': params, **variables}, dec_in, jnp.zeros((B,), jnp.int32),
        method=Transformer.decode_step, mutable=['cache'])
    return teacher, encoded, logits, variables['cache']

  teacher, encoded, logits, cache = run(params, data['enc'], data['dec_in'],
                                        data['targets'])
  assert teacher.dtype == logits.dtype == jnp.float32
  assert encoded.dtype == jnp.bfloat16
  for path, leaf in _flat(cache).items():
    assert leaf.dtype == (jnp.bool_ if 'mask' in path else jnp.bfloat16)
  scale = float(jnp.abs(teacher).max())
  assert float(jnp.abs(logits - teacher).max()) < 0.05 * scale


# -----------------------------------------------------------------------------
# Row-wise projections (few rows, large kernels): the decode path's fast path.
# -----------------------------------------------------------------------------


@pytest.mark.parametrize('rows, kernel_shape, rowwise', [
    (1, (256, 256), False), (5, (256, 256), True), (8, (64, 1024), True), (9, (256, 256), False),
    (5, (16, 64), False)])
def test_project_rowwise_equals_dot(rows, kernel_shape, rowwise, monkeypatch):
  monkeypatch.setattr(network, 'ROWWISE_MAX_ROWS', 8)
  rng = np.random.RandomState(0)
  x = jnp.asarray(rng.normal(size=(1, rows, kernel_shape[0])).astype(np.float32))
  kernel = jnp.asarray(rng.normal(size=kernel_shape).astype(np.float32))
  jaxpr = str(jax.make_jaxpr(network._project)(x, kernel))
  assert (jaxpr.count('dot_general') == rows) == rowwise or (rows == 1 and jaxpr.count('dot_general') == 1)
  np.testing.assert_allclose(np.asarray(network._project(x, kernel)), np.asarray(x @ kernel),
                             rtol=1e-5, atol=1e-4)


def test_project_is_one_dot_by_default():
  # Off unless SPECDEC_ROWWISE_MAX_ROWS asks for it (its speed depends on the machine).
  if 'SPECDEC_ROWWISE_MAX_ROWS' in os.environ:
    pytest.skip('SPECDEC_ROWWISE_MAX_ROWS is set in this environment')
  jax.clear_caches()  # traces of _project made with row-wise switched on by other tests
  x = jnp.ones((1, 5, 256), jnp.float32)
  kernel = jnp.ones((256, 256), jnp.float32)
  assert str(jax.make_jaxpr(network._project)(x, kernel)).count('dot_general') == 1


def test_k_token_call_matches_one_token_calls_tightly_with_rowwise_kernels(monkeypatch):
  monkeypatch.setattr(network, 'ROWWISE_MAX_ROWS', 8)
  # Kernels of >= ROWWISE_MIN_KERNEL_SIZE weights: every projection of a k-token call is the same
  # matrix-vector product as a one-token call's (bit for bit, checked first); what differs is attention, whose
  # softmax sums and weighted sums run over the attended positions in another order. A reordered float32 sum of
  # n terms moves by at most about n ulps of its scale, so the logits may differ by (self + cross positions) ulps of
  # their largest magnitude per sum, times 2 (the normaliser and the weighted sum); any projection computed
  # differently (a matrix-matrix product) would add reduction-order error over 64–1024 terms.
  config = network.T5Config(vocab_size=1024, emb_dim=64, num_heads=2, head_dim=32, num_encoder_layers=1,
                            num_decoder_layers=1, mlp_dim=1024, dropout_rate=0.0, dtype=jnp.float32)
  assert 64 * 1024 >= network.ROWWISE_MIN_KERNEL_SIZE
  module = network.Transformer(config)
  p = network.init_params(config, jax.random.PRNGKey(3))
  enc = jnp.asarray(np.random.RandomState(1).randint(2, 1024, (1, 6)).astype(np.int32))
  encoded = module.apply({'params': p}, enc, enable_dropout=False, method=module.encode)
  _, v = module.apply({'params': p}, encoded, enc, 8, method=module.init_cache, mutable=['cache'])
  tokens = jnp.asarray([[0, 5, 9, 11, 4]], jnp.int32)
  step = jax.jit(lambda c, t, i: module.apply({'params': p, 'cache': c}, t, i, method=module.decode_step,
                                             mutable=['cache']))
  many, _ = step(v['cache'], tokens, jnp.zeros((1,), jnp.int32))
  cache, ones = v['cache'], []
  for j in range(tokens.shape[1]):
    logits, new = step(cache, tokens[:, j:j + 1], jnp.full((1,), j, jnp.int32))
    cache = new['cache']
    ones.append(logits[:, 0])
  many_kv, ones_kv = np.asarray(many[0]), np.asarray(jnp.stack(ones, 1)[0])
  attended = tokens.shape[1] + enc.shape[1]
  ulp = np.spacing(np.float32(np.abs(many_kv).max()))
  np.testing.assert_allclose(many_kv, ones_kv, rtol=0, atol=2 * attended * ulp)


def test_rowwise_projection_of_k_rows_is_bitwise_the_one_row_projection(monkeypatch):
  monkeypatch.setattr(network, 'ROWWISE_MAX_ROWS', 8)
  rng = np.random.RandomState(0)
  kernel = jnp.asarray(rng.normal(size=(64, 1024)).astype(np.float32))
  x = jnp.asarray(rng.normal(size=(1, 5, 64)).astype(np.float32))
  project = jax.jit(network._project)
  rows = np.asarray(project(x, kernel))
  for j in range(x.shape[1]):
    np.testing.assert_array_equal(rows[:, j], np.asarray(project(x[:, j:j + 1], kernel))[:, 0])


# -----------------------------------------------------------------------------
# The output projection over a subset of the vocabulary
# -----------------------------------------------------------------------------


@pytest.mark.parametrize('tied', [False, True])
def test_projection_over_vocab_ids_is_those_columns_of_the_full_one(tied):
  model = network.Transformer(dataclasses.replace(CFG, logits_via_embedding=tied))
  model_params = network.init_params(model.config, jax.random.key(1))
  rng = np.random.default_rng(1)
  features = jnp.asarray(rng.normal(size=(B, 3, CFG.emb_dim)), jnp.float32)
  ids = jnp.asarray(np.sort(rng.choice(CFG.vocab_size, 40, replace=False)), jnp.int32)
  apply = lambda method, *args: model.apply({'params': model_params}, *args, method=method)
  full = np.asarray(apply(Transformer.project, features))
  subset = np.asarray(apply(Transformer.project, features, ids))
  kernel_ek = apply(Transformer.projection_rows, ids)
  rows = np.asarray(network.project_rows(features, kernel_ek))
  assert subset.shape == rows.shape == (B, 3, 40)
  # fp32 dot products of length E, summed in any order (and, tied, the
  # 1/sqrt(E) scale applied before or after): |error| <= 2·E·eps·Σ|x||k|.
  magnitude = np.abs(np.asarray(features)) @ np.abs(np.asarray(kernel_ek))
  bound = 2 * CFG.emb_dim * np.finfo(np.float32).eps * magnitude + 1e-30
  assert np.all(np.abs(subset - full[..., np.asarray(ids)]) <= bound)
  np.testing.assert_array_equal(rows, subset)


def test_decode_step_with_a_sliced_projection_matches_vocab_ids(params, reference, data):
  ids = jnp.asarray([1, 5, 7, 100, CFG.vocab_size - 1], jnp.int32)
  kernel_ek = MODEL.apply({'params': params}, ids, method=Transformer.projection_rows)
  tokens, positions = data['dec_in'][:, :2], jnp.zeros((B,), jnp.int32)

  def call(**kw):
    logits, _ = MODEL.apply({'params': params, 'cache': reference['cache']}, tokens, positions,
                            method=Transformer.decode_step, mutable=['cache'], **kw)
    return np.asarray(logits)

  np.testing.assert_array_equal(call(projection_ek=kernel_ek), call(vocab_ids=ids))
  with pytest.raises(ValueError, match='vocab_ids or projection_ek, not both'):
    call(vocab_ids=ids, projection_ek=kernel_ek)


# -----------------------------------------------------------------------------
# Draft trees: one call over a tree (SlotLayout)
# -----------------------------------------------------------------------------

TREE = draft_tree.static_tree((2,), 2)  # 7 nodes: the root, 2 children, a chain of 2 below each
TREE_CACHE = 16


@functools.partial(jax.jit, static_argnames='nodes')
def _tree_step(params, cache, tokens_bm, cur_b, nodes=None):
  layout = draft_tree.tree_layout(TREE, cur_b, TREE_CACHE, nodes)
  logits, variables = MODEL.apply({'params': params, 'cache': cache}, tokens_bm, cur_b, layout=layout,
                                  method=Transformer.decode_step, mutable=['cache'])
  return logits, variables['cache']


@pytest.fixture(scope='module')
def tree_case(params, data, reference):
  """A cache holding a 5-token prefix, rows at 2 and 4, and a tree of random tokens (node 0 = the row's token)."""
  cache = init_cache(params, reference['encoded'], data['enc'], TREE_CACHE)
  prefix = jnp.pad(data['dec_in'], ((0, 0), (0, TREE_CACHE - T)))
  cache = step(params, cache, prefix[:, :5], jnp.zeros((B,), jnp.int32))[1]
  cur_b = jnp.array([2, 4], jnp.int32)
  tokens_bn = _tokens(np.random.default_rng(1), (B, TREE.num_nodes))
  tokens_bn = tokens_bn.at[:, 0].set(jnp.take_along_axis(prefix, cur_b[:, None], axis=1)[:, 0])
  return dict(cache=cache, cur_b=cur_b, tokens_bn=tokens_bn)


def _leaf_paths(shape):
  leaves = [i for i in range(shape.num_nodes) if shape.children[i, 0] < 0]
  paths = []
  for leaf in leaves:
    path = [leaf]
    while path[-1] != 0:
      path.append(int(shape.parent[path[-1]]))
    paths.append(path[::-1])
  return paths


def test_a_tree_call_equals_a_chain_call_along_every_root_to_leaf_path(params, tree_case):
  tree_logits, _ = _tree_step(params, tree_case['cache'], tree_case['tokens_bn'], tree_case['cur_b'])
  assert tree_logits.shape == (B, TREE.num_nodes, CFG.vocab_size)
  for path in _leaf_paths(TREE):
    chain_logits, _ = step(params, tree_case['cache'], tree_case['tokens_bn'][:, path], tree_case['cur_b'])
    np.testing.assert_allclose(tree_logits[:, path], chain_logits, atol=ATOL)
  # Siblings at the same position see different ancestors: their logits differ (the mask is not ignored).
  assert not np.allclose(tree_logits[:, 3], tree_logits[:, 4], atol=1e-3)


def test_a_tree_fed_level_by_level_equals_one_call(params, tree_case):
  whole, whole_cache = _tree_step(params, tree_case['cache'], tree_case['tokens_bn'], tree_case['cur_b'])
  cache, parts = tree_case['cache'], []
  for depth in range(TREE.max_depth + 1):
    nodes = tuple(int(i) for i in np.flatnonzero(TREE.depth == depth))
    logits, cache = _tree_step(params, cache, tree_case['tokens_bn'][:, list(nodes)], tree_case['cur_b'],
                               nodes=nodes)
    parts.append(logits)
  np.testing.assert_allclose(jnp.concatenate(parts, axis=1), whole, atol=ATOL)
  _assert_trees_close(cache, whole_cache)


def test_a_layout_of_the_wrong_shape_is_refused(params, tree_case):
  layout = draft_tree.tree_layout(TREE, tree_case['cur_b'], TREE_CACHE)
  with pytest.raises(ValueError, match='SlotLayout.positions_bk must be'):
    MODEL.apply({'params': params, 'cache': tree_case['cache']}, tree_case['tokens_bn'][:, :3],
                tree_case['cur_b'], layout=layout, method=Transformer.decode_step, mutable=['cache'])


# -----------------------------------------------------------------------------
# Activation layout (the trainer's T5X activation pins)
# -----------------------------------------------------------------------------

_RULES = (('batch', 'data'), ('vocab', 'model'), ('mlp', 'model'), ('heads', 'model'),
          ('kv', None), ('embed', None), ('length', None))


def _one_device_mesh():
  return jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('data', 'model'))


def test_constrain_is_the_identity_outside_a_layout():
  x = jnp.ones((2, 3, 4))
  assert network.constrain(x, network.BATCH_LENGTH_EMBED) is x


def test_layout_pins_activations_and_keeps_the_values(params, data):
  enc, dec_in, dec_tgt = data['enc'], data['dec_in'], data['targets']
  apply = lambda p, *a: MODEL.apply({'params': p}, *a, enable_dropout=False)

  def pinned(p, *a):
    with network.activation_layout(_one_device_mesh(), _RULES):
      return apply(p, *a)

  # Shardy writes a constraint as `sdy.sharding_constraint`, the older GSPMD lowering as `@Sharding`.
  constraints = lambda text: text.count('sharding_constraint') + text.count('@Sharding')
  plain_text = jax.jit(apply).lower(params, enc, dec_in, dec_tgt).as_text()
  pinned_lowered = jax.jit(pinned).lower(params, enc, dec_in, dec_tgt)
  # Every layer's residual stream, MLP hidden, q/k/v and the logits: dozens of constraints in the
  # pinned program, none in the plain one (decoding and one-device programs stay as they were).
  assert constraints(plain_text) == 0
  assert constraints(pinned_lowered.as_text()) >= 2 * (CFG.num_encoder_layers + CFG.num_decoder_layers)
  np.testing.assert_array_equal(np.asarray(pinned_lowered.compile()(params, enc, dec_in, dec_tgt)),
                                np.asarray(forward(params, enc, dec_in, dec_tgt)))


def test_layout_ends_with_its_block():
  with network.activation_layout(_one_device_mesh(), _RULES):
    pass
  x = jnp.ones((2, 3, 4))
  assert network.constrain(x, network.BATCH_LENGTH_EMBED) is x
