"""Where a speculative decode's time goes: one round, phase by phase, timed.

For a target, a drafter, γ and a temperature this module times

* the model calls in isolation (`time_decode_calls`, `measure_costs`): target 1-token, target γ+1-token (verify),
  drafter 1-token;
* each phase of `decoding.speculative_step` (draft, verify, accept, commit) and the whole round, each run N
  times inside one jitted `lax.fori_loop` from a realistic mid-decode state (caches filled with a real prefix),
  so what they cost *inside a compiled loop* is measured, not dispatch;
* the baseline's round (`temperature_sample`'s body: one 1-token call plus its bookkeeping) the same way;
* the per-example fixed costs: the encoder(s) and cache init(s) every example pays before its loop;
* whole decodes side by side (`time_side_by_side`), and what a step of the real loop costs by difference between
  two length budgets (`real_step_cost`): every control-flow region, copy and statistic included (a replayed
  round at one position can miss them);
* one drafter call kernel by kernel (`drafter_call_kernels`): its program's trace and text read by `hlo_facts`;
* the baseline's loop with wider target calls (`widened_decode_fn`), the same outputs from another kernel path.

The arithmetic from these costs to predicted speedups is `cost_model`'s; the compiled programs' HLO and the
profiler's traces are read by `hlo_facts`. Works on any backend (CPU, GPU, TPU).
"""

import dataclasses
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from specdec import decoding
from specdec import drafters
from specdec import feature_decoding
from specdec import feature_drafter
from specdec.bench import hlo_facts
from specdec import models
from specdec import sampling


def median_seconds(fn: Callable[..., Any], *args, repeats: int = 5) -> float:
  """Median wall seconds of `fn(*args)` (blocked until ready) over `repeats` runs, after one untimed run
  (compilation and warm-up excluded)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def fastest_interleaved(calls: Mapping[str, Tuple[Callable[..., Any], tuple]], repeats: int = 5
                        ) -> Dict[str, float]:
  """Fastest wall seconds of each `fn(*args)` in `calls` ({name: (fn, args)}), the calls interleaved.

  Each runs once untimed (compilation and warm-up excluded), then every call runs once per repeat in turn.
  A slow spell of the machine (seconds long on a shared CPU) then hits every call alike instead of one
  call's whole measurement, and the fastest repeat is the statistic the decodes are timed by
  (`time_side_by_side`), so costs measured this way compare with them.
  """
  for fn, args in calls.values():
    jax.block_until_ready(fn(*args))
  best = {name: float('inf') for name in calls}
  for _ in range(repeats):
    for name, (fn, args) in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      best[name] = min(best[name], time.perf_counter() - start)
  return best


def _fresh_cache(module, params, enc: jax.Array, max_decode_length: int):
  """The decode cache of `module` for encoder inputs `enc` (encoded once).

  Compiled as one program: run op by op, the encoder and cache set-up cost hundreds of small compiles per
  timed program, which dominated a short profile.
  """
  def build(params, enc):
    encoded = module.apply({'params': params}, enc, enable_dropout=False, method=module.encode)
    _, variables = module.apply({'params': params}, encoded, enc, max_decode_length,
                                method=module.init_cache, mutable=['cache'])
    return variables.get('cache', {})
  return jax.jit(build)(params, enc)


def _projection(module, params, vocab_ids: Optional[np.ndarray]
                ) -> Tuple[Optional[jax.Array], Optional[jax.Array]]:
  """(projection [E, K], ids [K]) of a T5 network speaking `vocab_ids` only, or (None, None) for all.

  Sliced here, outside the timed programs, as decodes get it sliced once per run
  (`models.SpeculativeEncoderDecoderModel.with_draft_projection`): a slice inside a timed scan would add its
  cost to every call it times.
  """
  if vocab_ids is None:
    return None, None
  ids = jnp.asarray(vocab_ids, jnp.int32)
  return jax.jit(lambda p: module.apply({'params': p}, ids, method=module.projection_rows))(params), ids


def _call(module, params, cache, tokens_bk, position, projection_ek=None, ids=None):
  """One `decode_step` at `position` for every row: (new cache, last position's argmax [B]).

  With `_projection`'s (projection_ek, ids) the logits cover those tokens only and are widened to the whole
  vocabulary (-inf elsewhere) before the argmax, as the decode loop reads them.
  """
  rows = tokens_bk.shape[0]
  extra = {} if projection_ek is None else {'projection_ek': projection_ek}
  logits, new_vars = module.apply({'params': params, 'cache': cache}, tokens_bk,
                                  jnp.full((rows,), position, jnp.int32),
                                  method=module.decode_step, mutable=['cache'], **extra)
  if ids is not None:
    logits = feature_decoding.widen_logits(logits, ids, module.config.vocab_size)
  return new_vars.get('cache', {}), sampling.argmax(logits[:, -1])


def decode_calls(module, params, encoder_input_tokens: np.ndarray, max_decode_length: int,
                  num_new_tokens: int, num_calls: int, vocab_ids: Optional[np.ndarray] = None):
  """(jitted fn, its args): `num_calls` `decode_step` calls of `num_new_tokens` tokens per row in one scan
  (over `vocab_ids` only when given)."""
  enc = jnp.asarray(encoder_input_tokens)
  cache0 = _fresh_cache(module, params, enc, max_decode_length)
  rows = enc.shape[0]
  span = max(max_decode_length - num_new_tokens, 1)
  projection_ek, ids = _projection(module, params, vocab_ids)

  @jax.jit
  def calls(params, cache, projection_ek):
    # params are arguments, not constants folded into the program: the decode loops get them that way.
    def body(cache, i):
      tokens = jnp.full((rows, num_new_tokens), 3, jnp.int32)
      return _call(module, params, cache, tokens, i % span, projection_ek, ids)
    return jax.lax.scan(body, cache, jnp.arange(num_calls))

  return calls, (params, cache0, projection_ek)


def time_decode_calls(module, params, encoder_input_tokens: np.ndarray, max_decode_length: int,
                      num_new_tokens: int, num_calls: int = 32, repeats: int = 5,
                      vocab_ids: Optional[np.ndarray] = None) -> float:
  """Median seconds of one `decode_step` call with `num_new_tokens` tokens per row.

  The calls run inside one jitted `lax.scan` (as they do inside the decode loops), at advancing positions
  of a real encoded input, so dispatch overhead is not counted. `vocab_ids`: a T5 drafter's trimmed
  vocabulary (its projection sliced once, as a decode does).
  """
  calls, args = decode_calls(module, params, encoder_input_tokens, max_decode_length, num_new_tokens,
                              num_calls, vocab_ids)
  return median_seconds(calls, *args, repeats=repeats) / num_calls


def verify_cost_curve(module, params, encoder_input_tokens: np.ndarray, max_decode_length: int,
                      max_tokens: int = 16, num_calls: int = 32, repeats: int = 5) -> Dict[str, Any]:
  """The cost of a k-token `decode_step` call for k = 1..max_tokens, each in one compiled scan of calls,
  the widths interleaved and each width's fastest repeat kept (`fastest_interleaved`).

  Returns {'tokens': [1..K], 'call_s': seconds per call, 'ratio': call_s / the 1-token call's}: the
  machine's side of speculative decoding (a round verifies γ drafts in one (γ+1)-token call), which
  `theory.best_gamma` reads.
  """
  if max_tokens < 1:
    raise ValueError(f'max_tokens must be >= 1, got {max_tokens!r}.')
  if max_tokens >= max_decode_length:
    raise ValueError(f'max_tokens ({max_tokens}) must be below the decode length ({max_decode_length}).')
  tokens = list(range(1, max_tokens + 1))
  best = fastest_interleaved({str(k): decode_calls(module, params, encoder_input_tokens, max_decode_length, k,
                                                    num_calls) for k in tokens}, repeats)
  call_s = [best[str(k)] / num_calls for k in tokens]
  return {'tokens': tokens, 'call_s': call_s, 'ratio': [t / call_s[0] for t in call_s]}


def time_chained_calls(target_module, target_params, drafter_module, drafter_params,
                       encoder_input_tokens: np.ndarray, max_decode_length: int, num_new_tokens: int,
                       draft_steps: int, num_calls: int = 32, repeats: int = 5,
                       draft_vocab_ids: Optional[np.ndarray] = None) -> float:
  """Median seconds of one target call of `num_new_tokens` followed by `draft_steps` drafter calls.

  Each call is fed the previous call's argmax, a dependency chain as in the decode loop: a drafter call
  cannot start before the target's finishes nor overlap it, and it runs with the target's weights just
  streamed through the caches. Independent calls in one program (as `time_decode_calls` times a drafter
  alone) can overlap on a multi-core CPU or run with the drafter's weights hot, so they understate what a
  draft step costs inside the loop: compare (chained(γ) - chained(0)) / γ with the isolated drafter call.
  `draft_vocab_ids`: the drafter's trimmed vocabulary (its logits over those tokens only, as it decodes).
  """
  enc = jnp.asarray(encoder_input_tokens)
  if drafters.kind_of(drafter_module).reads_features:
    return _time_chained_head_calls(target_module, target_params, drafter_module, drafter_params, enc,
                                    max_decode_length, num_new_tokens, draft_steps, num_calls, repeats,
                                    draft_vocab_ids)
  target_cache0 = _fresh_cache(target_module, target_params, enc, max_decode_length)
  draft_cache0 = _fresh_cache(drafter_module, drafter_params, enc, max_decode_length)
  rows = enc.shape[0]
  span = max(max_decode_length - num_new_tokens - draft_steps, 1)
  projection_ek, ids = _projection(drafter_module, drafter_params, draft_vocab_ids)

  @jax.jit
  def calls(target_params, drafter_params, target_cache, draft_cache, projection_ek):
    def body(carry, i):
      target_cache, draft_cache, token_b = carry
      position = i % span
      target_cache, token_b = _call(target_module, target_params, target_cache,
                                    jnp.broadcast_to(token_b[:, None], (rows, num_new_tokens)), position)
      for j in range(draft_steps):
        draft_cache, token_b = _call(drafter_module, drafter_params, draft_cache, token_b[:, None],
                                     position + num_new_tokens + j, projection_ek, ids)
      return (target_cache, draft_cache, token_b), None
    return jax.lax.scan(body, (target_cache, draft_cache, jnp.full((rows,), 3, jnp.int32)),
                        jnp.arange(num_calls))

  return median_seconds(calls, target_params, drafter_params, target_cache0, draft_cache0, projection_ek,
                        repeats=repeats) / num_calls


def _prepared_head_params(target_module, target_params, head, head_params,
                          draft_vocab_ids: Optional[np.ndarray]) -> Dict[str, Any]:
  """A feature head's decode params, prepared once as decodes get them
  (`models.SpeculativeEncoderDecoderModel.with_draft_projection`): a slice or fold inside a timed program
  would add its cost to every call it times."""
  model = models.SpeculativeEncoderDecoderModel(target_module, head, draft_vocab_ids=draft_vocab_ids)
  return model.with_draft_projection({models.TARGET: target_params, models.DRAFTER: head_params})


def _head_decoder_fns(target_module, head, prepared: Dict[str, Any], enc, max_decode_length: int,
                      draft_vocab_ids: Optional[np.ndarray]):
  """`feature_decoding.decoder_fns` on `_prepared_head_params`' params, as a decode calls it."""
  return feature_decoding.decoder_fns(
      target_module, prepared[models.TARGET], head, prepared[models.DRAFTER], enc, max_decode_length,
      draft_vocab_ids, projection_ek=prepared.get(models.DRAFT_PROJECTION),
      logits_kernel_wk=prepared.get(models.DRAFT_LOGITS_KERNEL))


def _head_calls(target_module, target_params, head, head_params, encoder_input_tokens: np.ndarray,
                max_decode_length: int, num_calls: int, draft_vocab_ids: Optional[np.ndarray] = None):
  """(jitted fn, its args): `num_calls` 1-entry feature-head calls in one scan, each reading the feature the
  previous one predicted, as a draft step makes them (over `draft_vocab_ids` only when given; the projection
  sliced, or the head's logits kernel folded, once outside, as decodes get it)."""
  enc = jnp.asarray(encoder_input_tokens)
  prepared = _prepared_head_params(target_module, target_params, head, head_params, draft_vocab_ids)
  _, _, head_cache0, _ = _head_decoder_fns(target_module, head, prepared, enc, max_decode_length,
                                           draft_vocab_ids)
  rows = enc.shape[0]
  span = max(max_decode_length - 1, 1)
  feature0 = jnp.zeros((rows, 1, head.config.feature_dim), jnp.float32)

  @jax.jit
  def calls(prepared, head_cache, feature):
    # Params are arguments, as the decode loops get them; the encoding and cache set-up decoder_fns does
    # here are unused and compiled away.
    _, _, _, draft_fn = _head_decoder_fns(target_module, head, prepared, enc, max_decode_length,
                                          draft_vocab_ids)

    def body(carry, i):
      cache, feature_b1e, token_b = carry
      logits, predicted, cache = draft_fn(decoding.DecodingState(
          cur_index=jnp.full((rows,), i % span, jnp.int32), sequences=jnp.zeros((rows, 1), jnp.int32),
          cur_token=token_b[:, None], cache=cache), feature_b1e)
      return (cache, predicted.astype(feature_b1e.dtype), sampling.argmax(logits[:, -1])), None
    return jax.lax.scan(body, (head_cache, feature, jnp.full((rows,), 3, jnp.int32)), jnp.arange(num_calls))

  return calls, (prepared, head_cache0, feature0)


def time_head_calls(target_module, target_params, head, head_params, encoder_input_tokens: np.ndarray,
                    max_decode_length: int, num_calls: int = 32, repeats: int = 5,
                    draft_vocab_ids: Optional[np.ndarray] = None) -> float:
  """Median seconds of one 1-entry feature-head call (embedding, head, its logits as the head decodes them:
  over `draft_vocab_ids` only when given, through the folded kernel when it folds), as a draft step makes it:
  each call reads the feature the previous one predicted, in one jitted scan (`_head_calls`)."""
  calls, args = _head_calls(target_module, target_params, head, head_params, encoder_input_tokens,
                            max_decode_length, num_calls, draft_vocab_ids)
  return median_seconds(calls, *args, repeats=repeats) / num_calls


def drafter_calls(target_module, target_params, drafter_module, drafter_params,
                  encoder_input_tokens: np.ndarray, max_decode_length: int, num_calls: int = 32,
                  draft_vocab_ids: Optional[np.ndarray] = None):
  """(jitted fn, its args): `num_calls` 1-token drafter calls in one scan, as a draft step makes them: a
  feature head's (`_head_calls`) or an independent drafter's `decode_step` (`decode_calls`)."""
  if drafters.kind_of(drafter_module).reads_features:
    return _head_calls(target_module, target_params, drafter_module, drafter_params, encoder_input_tokens,
                       max_decode_length, num_calls, draft_vocab_ids)
  return decode_calls(drafter_module, drafter_params, encoder_input_tokens, max_decode_length, 1, num_calls,
                       draft_vocab_ids)


def _time_chained_head_calls(target_module, target_params, head, head_params, enc, max_decode_length: int,
                             num_new_tokens: int, draft_steps: int, num_calls: int, repeats: int,
                             draft_vocab_ids: Optional[np.ndarray]) -> float:
  """`time_chained_calls` for a feature head: the target's call returns its features, the head's first step
  reads the last of them and each later step its own prediction (as drafting does)."""
  prepared = _prepared_head_params(target_module, target_params, head, head_params, draft_vocab_ids)
  target_cache0, target_fn, head_cache0, draft_fn = _head_decoder_fns(
      target_module, head, prepared, enc, max_decode_length, draft_vocab_ids)
  rows = enc.shape[0]
  span = max(max_decode_length - num_new_tokens - draft_steps, 1)
  sequences = jnp.zeros((rows, 1), jnp.int32)

  @jax.jit
  def calls(target_cache, head_cache):
    def body(carry, i):
      target_cache, head_cache, token_b = carry
      position = jnp.full((rows,), i % span, jnp.int32)
      logits, features, target_cache = target_fn(decoding.DecodingState(
          cur_index=position, sequences=sequences,
          cur_token=jnp.broadcast_to(token_b[:, None], (rows, num_new_tokens)), cache=target_cache))
      token_b, feature_b1e = sampling.argmax(logits[:, -1]), features[:, -1:]
      for j in range(draft_steps):
        logits, predicted, head_cache = draft_fn(decoding.DecodingState(
            cur_index=position + num_new_tokens + j, sequences=sequences, cur_token=token_b[:, None],
            cache=head_cache), feature_b1e)
        token_b, feature_b1e = sampling.argmax(logits[:, -1]), predicted.astype(feature_b1e.dtype)
      return (target_cache, head_cache, token_b), None
    return jax.lax.scan(body, (target_cache, head_cache, jnp.full((rows,), 3, jnp.int32)),
                        jnp.arange(num_calls))

  return median_seconds(calls, target_cache0, head_cache0, repeats=repeats) / num_calls


def measure_costs(target_module, target_params, drafter_module, drafter_params,
                  encoder_input_tokens: np.ndarray, max_decode_length: int, gamma: int,
                  draft_vocab_ids: Optional[np.ndarray] = None) -> Dict[str, float]:
  """Target 1-token, target γ+1-token (verify) and drafter 1-token call times; c and the verify ratio.

  A feature head's call is `time_head_calls` (it needs the target's embedding and projection; over
  `draft_vocab_ids` when given).
  """
  t_target = time_decode_calls(target_module, target_params, encoder_input_tokens, max_decode_length, 1)
  t_verify = time_decode_calls(target_module, target_params, encoder_input_tokens, max_decode_length,
                               gamma + 1)
  if drafters.kind_of(drafter_module).reads_features:
    t_draft = time_head_calls(target_module, target_params, drafter_module, drafter_params,
                              encoder_input_tokens, max_decode_length, draft_vocab_ids=draft_vocab_ids)
  else:
    t_draft = time_decode_calls(drafter_module, drafter_params, encoder_input_tokens, max_decode_length, 1,
                                vocab_ids=draft_vocab_ids)
  return {'target_call_s': t_target, 'verify_call_s': t_verify, 'draft_call_s': t_draft,
          'c': t_draft / t_target, 'verify_cost_ratio': t_verify / t_target}


def _looped(fn: Callable[[Any, Any], Any], iters: int) -> Callable[[Any, Any], Any]:
  """`iters` applications of `fn(args, carry)` in one jitted fori_loop; `args` (the params) are arguments of
  the program, as the decode loops get them, not constants folded into it (a constant copy of a large
  model's weights would be compiled into every program)."""
  return jax.jit(lambda args, c: lax.fori_loop(0, iters, lambda _, c: fn(args, c), c))


def _prefilled(module, params, encoder_input_tokens, max_decode_length, prefix_bl, vocab_ids=None):
  """(cache, tokens_to_logits) with the cache holding `prefix_bl` at positions 0..P-1 (one k-token call);
  over `vocab_ids` only when given."""
  model = models.SpeculativeEncoderDecoderModel(module, None, decode_fn=decoding.temperature_sample)
  cache, tokens_to_logits = model.decoder_fns(
      module, params, encoder_input_tokens, max_decode_length, vocab_ids=vocab_ids)
  rows = prefix_bl.shape[0]
  _, cache = tokens_to_logits(decoding.DecodingState(
      cur_index=jnp.zeros((rows,), jnp.int32), sequences=prefix_bl, cur_token=prefix_bl, cache=cache))
  return cache, tokens_to_logits


def _prefilled_feature_pair(target_module, target_params, head, head_params, encoder_input_tokens,
                            max_decode_length, prefix_bl, gamma, draft_vocab_ids=None):
  """A target and a feature head mid-decode, as the feature loop leaves them after a round that kept no draft.

  The target's cache holds `prefix_bl` (positions 0..i, i = P-1), the head's its entries 0..i-1 (true
  features); the kept features are the target's of positions i-1 .. i+γ-1 (zeros past i), so the next
  catch-up rewrites entries i..i+γ. Returns (target_cache, target_fn, head_cache, draft_fn, draft_features [B,
  γ+1, E], feature_start [B]). `draft_vocab_ids`: the head's trimmed vocabulary, or None.
  """
  prepared = _prepared_head_params(target_module, target_params, head, head_params, draft_vocab_ids)
  target_cache, target_fn, head_cache, draft_fn = _head_decoder_fns(
      target_module, head, prepared, encoder_input_tokens, max_decode_length, draft_vocab_ids)
  rows, length = prefix_bl.shape
  zeros_b = jnp.zeros((rows,), jnp.int32)
  _, features_bpe, target_cache = target_fn(decoding.DecodingState(
      cur_index=zeros_b, sequences=prefix_bl, cur_token=prefix_bl, cache=target_cache))
  i = length - 1
  if i > 0:
    _, _, head_cache = draft_fn(decoding.DecodingState(
        cur_index=zeros_b, sequences=prefix_bl, cur_token=prefix_bl[:, :i], cache=head_cache),
        feature_drafter.shift_features_right(features_bpe[:, :i]))
  start = max(i - 1, 0)
  kept = features_bpe[:, start:start + gamma + 1]
  kept = jnp.pad(kept, ((0, 0), (0, gamma + 1 - kept.shape[1]), (0, 0)))
  return (target_cache, target_fn, head_cache, draft_fn, kept,
          jnp.full((rows,), start if i > 0 else -1, jnp.int32))


ALL_PARTS = ('draft', 'verify', 'accept', 'commit', 'round', 'baseline_round')
# What the benchmark needs per row (c and a inside the loop); each part is one more compiled loop.
BENCHMARK_PARTS = ('draft', 'round', 'baseline_round')


@dataclasses.dataclass
class PhaseTimes:
  """Seconds per application inside a compiled loop (None: not timed)."""
  draft: Optional[float] = None
  verify: Optional[float] = None
  accept: Optional[float] = None
  commit: Optional[float] = None
  round: Optional[float] = None
  baseline_round: Optional[float] = None


def time_phases(target_module, target_params, drafter_module, drafter_params,
                encoder_input_tokens: np.ndarray, decoded_l: np.ndarray, max_decode_length: int,
                gamma: int, temperature: float = 0.0, topk: int = 0, topp: float = 0.0,
                draft_confidence: float = 0.0, position: Optional[int] = None,
                iters: int = 32, repeats: int = 5, parts: Sequence[str] = ALL_PARTS,
                draft_vocab_ids: Optional[np.ndarray] = None) -> PhaseTimes:
  """Times the phases of one speculative round and the baseline's round at `position`.

  The state is a real mid-decode one: `decoded_l` (e.g. the baseline's greedy output for this input) is the
  committed prefix, both caches hold it, and each timed round replays the round at `position` (its caches
  carried, so nothing is loop-invariant). `parts` picks what to time (each is one compiled loop).
  `draft_vocab_ids`: the drafter's trimmed vocabulary (a feature head's or a T5 drafter's), as it decodes.
  """
  unknown = set(parts) - set(ALL_PARTS)
  if unknown:
    raise ValueError(f'Unknown parts {sorted(unknown)}; choose from {ALL_PARTS}.')
  enc = jnp.asarray(encoder_input_tokens)
  rows = enc.shape[0]
  n_out = int(np.count_nonzero(decoded_l)) or 1
  position = min(n_out // 2, max_decode_length - gamma - 2) if position is None else position
  sequences_l = np.zeros((max_decode_length + gamma + 2,), np.int32)
  sequences_l[1:1 + len(decoded_l)] = decoded_l
  sequences_bl = jnp.asarray(np.tile(sequences_l, (rows, 1)))
  prefix_bl = sequences_bl[:, :position]
  feature = drafters.kind_of(drafter_module).reads_features
  # The caches mid-decode (filled outside the timed programs), and the params the timed programs take.
  # Each filled by one compiled program, the params its arguments: run eagerly, a large model would dispatch
  # and compile op by op.
  feature_state = {}
  if feature:
    def prefill(target_p, head_p):
      target_cache, _, head_cache, _, kept_features, feature_start = _prefilled_feature_pair(
          target_module, target_p, drafter_module, head_p, enc, max_decode_length, prefix_bl, gamma,
          draft_vocab_ids)
      return target_cache, head_cache, dict(draft_features=kept_features, feature_start=feature_start)
    target_cache, draft_cache, feature_state = jax.jit(prefill)(target_params, drafter_params)
    args = _prepared_head_params(target_module, target_params, drafter_module, drafter_params, draft_vocab_ids)
  else:
    def prefill(target_p, drafter_p):
      return (_prefilled(target_module, target_p, enc, max_decode_length, prefix_bl)[0],
              _prefilled(drafter_module, drafter_p, enc, max_decode_length, prefix_bl[:, :max(position - 1, 1)],
                         draft_vocab_ids)[0])
    target_cache, draft_cache = jax.jit(prefill)(target_params, drafter_params)
    args = {'target': target_params, 'drafter': drafter_params,
            'projection': _projection(drafter_module, drafter_params, draft_vocab_ids)[0]}

  def functions(args):
    """(target_fn, draft_fn, the baseline's 1-token call) of `args`, built where they are called: inside a
    timed program from its arguments (the encodings and caches they would also build are unused there and
    compiled away)."""
    if feature:
      _, target_fn, _, draft_fn = _head_decoder_fns(target_module, drafter_module, args, enc, max_decode_length,
                                                    draft_vocab_ids)

      def call(state):  # the baseline's call: the same call, features unused
        logits, _, cache = target_fn(state)
        return logits, cache
      return target_fn, draft_fn, call
    model = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=decoding.temperature_sample)
    target_fn = model.decoder_fns(target_module, args['target'], enc, max_decode_length)[1]
    draft_fn = model.decoder_fns(drafter_module, args['drafter'], enc, max_decode_length, vocab_ids=draft_vocab_ids,
                                 projection_ek=args['projection'])[1]
    return target_fn, draft_fn, target_fn

  def loop_spec(args):
    target_fn, draft_fn, _ = functions(args)
    return decoding.LoopSpec(
        gamma=gamma, eos_id=1, tokens_to_logits=target_fn, draft_tokens_to_logits=draft_fn,
        temperature=temperature, topk=topk, topp=topp, draft_confidence=draft_confidence, return_stats=False,
        draft_reads_features=feature)

  # The loop's settings alone (its functions are built inside each timed program).
  spec = decoding.LoopSpec(gamma=gamma, eos_id=1, tokens_to_logits=None, draft_tokens_to_logits=None,
                           temperature=temperature, topk=topk, topp=topp, draft_confidence=draft_confidence)
  state0 = decoding.SpeculativeLoopState(
      cur_index=jnp.full((rows,), position - 1, jnp.int32), sequences=sequences_bl,
      forced_bl=jnp.zeros(sequences_bl.shape, bool), max_len_b=jnp.full((rows,), max_decode_length, jnp.int32),
      target_cache=target_cache, draft_cache=draft_cache, draft_lag=jnp.ones((rows,), bool),
      ended=jnp.zeros((rows,), bool), generated=jnp.zeros(sequences_bl.shape, bool),
      rng=jax.random.PRNGKey(0), log_prob=jnp.zeros((rows,), jnp.float32), stats={}, **feature_state)
  rng = None if spec.fast_greedy else jax.random.PRNGKey(1)

  def first_round(args, state):
    """The round's drafts, logits and verdict at `position`: the inputs of the verify, accept and commit parts.
    One compiled program (run eagerly, a large model would dispatch and compile op by op)."""
    round_spec = loop_spec(args)
    drafts = decoding.draft_phase(round_spec, state, rng)
    logits, _, _ = decoding.verify_phase(round_spec, state, drafts)
    verdict, logp = decoding.accept_phase(round_spec, state, drafts, logits, rng)
    return drafts, logits, verdict, logp

  if set(parts) & {'verify', 'accept', 'commit'}:
    drafts0, logits0, verdict0, logp0 = jax.jit(first_round)(args, state0)

  def replay(state, acc):
    """The same round again, caches carried. Its position and prefix are selected by a test the compiler
    cannot decide (acc is never negative): as compile-time constants they would let XLA fold and hoist
    position-dependent work and pick other kernels than the real loop, whose positions are loop values."""
    opaque = acc < 0
    features = {}
    if feature:
      features = dict(draft_features=jnp.where(opaque, state.draft_features, state0.draft_features),
                      feature_start=state0.feature_start)
    return state.replace(cur_index=jnp.where(opaque, state.cur_index, state0.cur_index),
                         sequences=jnp.where(opaque, state.sequences, state0.sequences), ended=state0.ended,
                         generated=state0.generated, draft_lag=state0.draft_lag, **features)

  def draft_only(args, carry):
    state, acc = carry
    drafts = decoding.draft_phase(loop_spec(args), replay(state, acc), rng)
    return state.replace(draft_cache=drafts.cache), acc + jnp.sum(drafts.tokens_bg)

  def verify_only(args, carry):
    state, acc = carry
    logits, cache, _ = decoding.verify_phase(loop_spec(args), replay(state, acc), drafts0)
    return state.replace(target_cache=cache), acc + jnp.sum(jnp.argmax(logits, axis=-1))

  def accept_only(args, carry):
    state, acc = carry
    # The logits depend on the carry, so the phase cannot be hoisted out of the loop.
    logits = logits0 + acc.astype(jnp.float32) * 0.0
    verdict, _ = decoding.accept_phase(loop_spec(args), replay(state, acc), drafts0, logits, rng)
    return state, acc + jnp.sum(verdict.num_accepted_b) + jnp.sum(verdict.next_token_b)

  def commit_only(args, carry):
    state, acc = carry
    logits = logits0 + acc.astype(jnp.float32) * 0.0
    new = decoding.commit_phase(loop_spec(args), replay(state, acc), drafts0, verdict0, logits, logp0,
                                state.target_cache, state.rng)
    return state, acc + jnp.sum(new.cur_index) + jnp.sum(new.sequences)

  def whole_round(args, carry):
    state, acc = carry
    new = decoding.speculative_step(loop_spec(args), replay(state, acc))
    return new, acc + jnp.sum(new.cur_index)

  def baseline_round(args, carry):
    # temperature_sample's body: one 1-token call, argmax or sampling, the sequence write.
    (cache, seq_bl, rng_key), acc = carry
    tokens_to_logits = functions(args)[2]
    pos_b = jnp.where(acc < 0, 0, jnp.full((rows,), position, jnp.int32))  # a loop value, as in replay
    logits, cache = tokens_to_logits(decoding.DecodingState(
        cur_index=pos_b, sequences=seq_bl,
        cur_token=jnp.take_along_axis(seq_bl, pos_b[:, None], axis=1), cache=cache))
    if spec.fast_greedy:
      token_b = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
    else:
      rng_key, step_rng = jax.random.split(rng_key)
      token_b = sampling.sample(step_rng, spec.adjust(logits[:, 0]))
    seq_bl = seq_bl.at[jnp.arange(rows), pos_b + 1].set(token_b)
    return (cache, seq_bl, rng_key), acc + jnp.sum(token_b)

  acc0 = jnp.zeros((), jnp.int32)
  carries = {'baseline_round': ((target_cache, sequences_bl, jax.random.PRNGKey(2)), acc0)}
  fns = {'draft': draft_only, 'verify': verify_only, 'accept': accept_only, 'commit': commit_only,
         'round': whole_round, 'baseline_round': baseline_round}
  # The parts interleaved, each part's fastest repeat (`fastest_interleaved`): their ratios (c, a) are what
  # the in-loop prediction uses, and a slow spell of the machine then shifts none of them alone.
  best = fastest_interleaved({part: (_looped(fns[part], iters), (args, carries.get(part, (state0, acc0))))
                              for part in parts}, repeats)
  return PhaseTimes(**{part: best[part] / iters for part in parts})


def time_fixed_costs(target_module, target_params, drafter_module, drafter_params,
                     batch: Mapping[str, np.ndarray], repeats: int = 5) -> Dict[str, float]:
  """Seconds of what every example pays once before its decode loop, baseline and speculative: the jitted
  encoder(s) and cache init(s) (`SpeculativeEncoderDecoderModel.decoder_fns`) for the batch, interleaved,
  the fastest of `repeats` each. A draft vocabulary's projection is sliced once per run
  (`models.SpeculativeEncoderDecoderModel.with_draft_projection`), not per example: not counted here."""
  enc = jnp.asarray(batch['encoder_input_tokens'])
  max_decode_length = batch['decoder_input_tokens'].shape[1]
  model = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=decoding.temperature_sample)

  def caches(modules, params):
    if len(modules) == 1:
      return [model.decoder_fns(modules[0], params[0], enc, max_decode_length)[0]]
    (target, drafter), (target_p, drafter_p) = modules, params
    # As a decode builds them: a feature head shares the target's one encoding.
    return list(drafters.kind_of(drafter).decoder_fns(target, target_p, drafter, drafter_p, enc, max_decode_length,
                                                      model.decoder_fns)[0::2])

  # Params are arguments, as the decodes get them: constants would compile a copy of the weights into the
  # programs (gigabytes for a large target).
  both = (target_module, drafter_module)
  return fastest_interleaved({'baseline': (jax.jit(lambda p: caches(both[:1], p)), ((target_params,),)),
                              'speculative': (jax.jit(lambda p: caches(both, p)),
                                              ((target_params, drafter_params),))}, repeats)


def in_loop_costs(target_module, target_params, drafter_module, drafter_params,
                  batch: Mapping[str, np.ndarray], decoded_l: np.ndarray, gamma: int,
                  decoder_params: Mapping[str, Any], iters: int = 32, repeats: int = 5,
                  parts: Sequence[str] = BENCHMARK_PARTS,
                  draft_vocab_ids: Optional[np.ndarray] = None) -> Dict[str, Optional[float]]:
  """The costs a speculative decode pays inside its compiled loop, in baseline-round units.

  Returns seconds of each part timed (`time_phases`; `parts` beyond the benchmark's draft / round / baseline
  round, None where not timed), the
  per-example fixed costs (`time_fixed_costs`) and
  - `c_in_loop`: one draft step inside the loop / one baseline round (the in-situ c);
  - `round_fixed_in_loop` (a): the round less its drafting, / one baseline round (verify + accept + commit);
  - `round_over_baseline`: the whole round / one baseline round.
  """
  enc = np.asarray(batch['encoder_input_tokens'])
  phases = time_phases(
      target_module, target_params, drafter_module, drafter_params, enc, decoded_l,
      batch['decoder_input_tokens'].shape[1], gamma, temperature=decoder_params.get('temperature', 0.0),
      topk=decoder_params.get('topk', 0), topp=decoder_params.get('topp', 0.0),
      draft_confidence=decoder_params.get('draft_confidence', 0.0), iters=iters, repeats=repeats,
      parts=tuple(dict.fromkeys(tuple(parts) + BENCHMARK_PARTS)), draft_vocab_ids=draft_vocab_ids)
  fixed = time_fixed_costs(target_module, target_params, drafter_module, drafter_params, batch,
                           repeats=repeats)
  base = phases.baseline_round
  return {
      **{f'{k}_s': v for k, v in dataclasses.asdict(phases).items()},
      'baseline_fixed_s': fixed['baseline'], 'speculative_fixed_s': fixed['speculative'],
      'c_in_loop': phases.draft / gamma / base,
      'round_fixed_in_loop': (phases.round - phases.draft) / base,
      'round_over_baseline': phases.round / base,
  }


# ----------------------------------------------------------------------------------------------------------
# Whole decodes timed: side by side, and a step of the real loop by difference.
# ----------------------------------------------------------------------------------------------------------


def time_side_by_side(decoders: Mapping[str, Callable[[Any, jax.Array], Any]], batches: Sequence[Any],
                      repeats: int = 3) -> Dict[str, Dict[str, list]]:
  """Per-example seconds of several decoders, interleaved: for each batch every decoder runs once per repeat.

  `decoders` maps a name to `fn(batch, rng) -> outputs` (compiled; the first call per batch is untimed). A
  machine's slow spells then hit every decoder alike, which separately timed runs (one decoder over all the
  examples, then the next) do not: the ratios between decoders are what this measures. Each example keeps
  its fastest repeat. Returns {name: {'seconds': [...], 'outputs': [...]}}, one entry per batch.
  """
  out = {name: {'seconds': [], 'outputs': []} for name in decoders}
  for n, batch in enumerate(batches):
    rng = jax.random.PRNGKey(n)
    for name, fn in decoders.items():
      out[name]['outputs'].append(jax.block_until_ready(fn(batch, rng)))
    best = {name: float('inf') for name in decoders}
    for _ in range(repeats):
      for name, fn in decoders.items():
        start = time.perf_counter()
        jax.block_until_ready(fn(batch, rng))
        best[name] = min(best[name], time.perf_counter() - start)
    for name in decoders:
      out[name]['seconds'].append(best[name])
  return out


def budgeted_predict(model: models.SpeculativeEncoderDecoderModel, decoder_params: Mapping[str, Any]
                     ) -> Callable[..., Any]:
  """`predict(params, batch, rng, steps)`: `model`'s whole decode stopped after `steps` new tokens a row
  (`max_decode_steps`), one compiled program for every budget (`steps` is an argument, not a constant the
  compiler could fold into the loop)."""
  def run(params, batch, rng, steps):
    return model.predict_batch_with_aux(params, batch, rng, decoder_params=dict(decoder_params,
                                                                                max_decode_steps=steps))
  return jax.jit(run)


def real_step_cost(predict: Callable[..., Any], params, batch, budgets: Tuple[int, int],
                   steps_of: Callable[[Any], int], repeats: int = 5) -> Dict[str, Any]:
  """What one step of a real decode loop costs, by difference: the same example decoded whole at two length
  budgets, seconds over loop steps between them.

  `predict` is a `budgeted_predict`; `steps_of(outputs)` counts the loop's steps in a decode's outputs (its
  tokens for the baseline, its rounds for speculative decoding). Both budgets run the same program on the same
  input, so the difference holds only the steps between them: every kernel, copy, branch and statistic of the
  real loop, and none of the per-example fixed cost (encoding, cache set-up) nor the example-to-example
  variation a fit over examples has (`cost_model.fit_fixed_and_per_step`). The budgets are timed interleaved, fastest of
  `repeats` (`fastest_interleaved`).

  Returns {'budgets', 'steps': loop steps at each, 'seconds': fastest at each, 'per_step_s'}; per_step_s is
  None where both budgets took the same number of steps (the example ended before the first).
  """
  low, high = budgets
  if not 0 < low < high:
    raise ValueError(f'budgets must be two token counts 0 < low < high, got {budgets!r}.')
  rng = jax.random.PRNGKey(0)
  calls = {str(b): (predict, (params, batch, rng, jnp.asarray(b, jnp.int32))) for b in budgets}
  steps = [int(steps_of(jax.block_until_ready(predict(*calls[str(b)][1])))) for b in budgets]
  best = fastest_interleaved(calls, repeats)
  seconds = [best[str(b)] for b in budgets]
  per_step = (seconds[1] - seconds[0]) / (steps[1] - steps[0]) if steps[1] > steps[0] else None
  return {'budgets': [low, high], 'steps': steps, 'seconds': seconds, 'per_step_s': per_step}


# ----------------------------------------------------------------------------------------------------------
# One drafter call, kernel by kernel (jax.profiler).
# ----------------------------------------------------------------------------------------------------------


def drafter_call_kernels(target_module, target_params, drafter_module, drafter_params,
                         encoder_input_tokens: np.ndarray, max_decode_length: int, num_calls: int = 32,
                         draft_vocab_ids: Optional[np.ndarray] = None, top: int = 10) -> Dict[str, Any]:
  """Where one 1-token drafter call's time goes (`drafter_calls`' scan under `jax.profiler`), in
  microseconds per call: its `top` costliest kernels, each with its output shape and its largest operand
  (for a matrix product, the weights it reads), from the compiled program's own text. `dot_share`: the
  share of the call's kernel time spent in matrix products (XLA's `dot` kernels and fusions of a product).
  Kernels the program does not name (the executor's own cost, thread-pool waits) have no shape."""
  calls, args = drafter_calls(target_module, target_params, drafter_module, drafter_params,
                              encoder_input_tokens, max_decode_length, num_calls, draft_vocab_ids)
  compiled = calls.lower(*args).compile()  # one compile, for both the text and the trace
  facts = hlo_facts.instruction_facts(compiled.as_text())
  trace = hlo_facts.trace_kernel_breakdown(lambda: compiled(*args), top=10_000)
  per_call = lambda ms: 1000 * ms / num_calls
  kernels, dots = [], 0.0
  for row in trace['top_kernels']:
    fact = facts.get(row['kernel'])
    us = per_call(row['ms_per_call'])
    is_dot = fact is not None and fact['product']
    dots += us if is_dot else 0.0
    # A matrix-vector product reads its weights whole: name them by the largest operand.
    largest = max((facts[o]['shape'] for o in (fact or {}).get('operands', []) if o in facts),
                  key=hlo_facts.shape_bytes, default='')
    kernels.append({'kernel': row['kernel'], 'us': us, 'shape': fact['shape'] if fact else '',
                    'largest_operand': largest, 'dot': is_dot})
  busy = sum(k['us'] for k in kernels)
  return {'busy_us': busy, 'wall_us': per_call(trace['wall_ms_per_call']),
          'dot_share': dots / busy if busy else 0.0, 'kernels': len(kernels), 'calls': num_calls,
          'top': kernels[:top]}


# ----------------------------------------------------------------------------------------------------------
# Is the baseline the fastest loop on this backend?
# ----------------------------------------------------------------------------------------------------------


def widened_decode_fn(width: int) -> Callable[..., Any]:
  """`decoding.temperature_sample` whose target calls carry `width` tokens a row instead of one: the step's
  token, repeated; only the first position's logits are used, and the extra keys/values written past it are
  overwritten by the next steps (a query never sees positions beyond its own). The same outputs as the
  1-token loop; on a backend where a k-token call is cheaper than a 1-token one (small matmuls take another
  kernel path) it would be the faster baseline, so `scripts/profile_decode.py` times it beside T5X's loop.
  """
  if isinstance(width, bool) or not isinstance(width, int) or width < 1:
    raise ValueError(f'width must be an int >= 1, got {width!r}.')

  def decode(**kwargs):
    tokens_to_logits = kwargs['tokens_to_logits']

    def wide(state: decoding.DecodingState):
      tokens_bw = jnp.tile(state.cur_token, (1, width))
      logits_bwv, cache = tokens_to_logits(decoding.DecodingState(
          cur_index=state.cur_index, sequences=state.sequences, cur_token=tokens_bw, cache=state.cache))
      return logits_bwv[:, :1], cache

    return decoding.temperature_sample(**dict(kwargs, tokens_to_logits=wide))

  return decoding.declare_kind(decoding.AUTOREGRESSIVE)(decode)
