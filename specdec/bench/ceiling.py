"""What the loop gives when the drafts are good: measured speedup against a controlled acceptance rate.

The paper answers "what would speculative decoding give at acceptance rate α" with Thm 3.8; this module
answers it by measurement. `oracle.OracleDrafter` proposes the target's greedy token with probability α*
(i.i.d. per row and position) at the cost of a table lookup, so a grid of α* × γ, decoded greedily beside
the baseline, shows the speedup the real loop delivers on this machine at each acceptance rate: the
ceiling a trained drafter of that α could reach. Its rows are "controlled acceptance", never a drafter's.

`measure` runs, per batch size:
  1. the costs: the target's verify-cost curve (`profiling.verify_cost_curve`, k = 1..16 tokens a call) and
     the in-loop costs of a round at each γ and at each batch size the shrinking loop runs at
     (`profiling.in_loop_costs`: c, a, the baseline's round), which do not depend on α*;
  2. the decodes: for each batch, the baseline (whose greedy output the oracle reads), every (α*, γ)
     oracle decoder and the shipped drafters interleaved (`profiling.time_side_by_side`), each batch's
     fastest repeat kept.
Each finished step is written to a state file (atomically), so an interrupted run resumes where it stopped.
`report` turns the state into rows (measured speedup, Thm 3.8, the in-loop prediction, their ratio), the
best γ against α, and the costs replayed against the costs fitted to the real decodes;
`ceiling_report.markdown` and `plots.plot_ceiling` render it.
"""

import dataclasses
import datetime
import functools
import hashlib
import json
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec.bench import auto_gamma
from specdec import batch_shrink
from specdec.bench import ceiling_report
from specdec.bench import cost_model
from specdec import decoding
from specdec import evaluation
from specdec import fileio
from specdec import models
from specdec.bench import oracle
from specdec.bench import profiling
from specdec.bench import reporting
from specdec import theory

ALPHAS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
GAMMAS = (1, 2, 3, 4, 6, 8)
BATCH_SIZES = (1, 8)
EOS_ID = 1
# What every oracle row is called in a table: it is an instrument, not a drafter.
CONTROLLED = ceiling_report.CONTROLLED
# α* of the oracle whose round is timed for the in-loop costs (a draft step's cost does not depend on it).
_COST_ALPHA = 0.9


@dataclasses.dataclass(frozen=True)
class Settings:
  """The grid: acceptance rates α*, γs, batch sizes; timed repeats per batch; the oracle's seed; the
  longest target call of the verify-cost curve; timed repeats of each in-loop cost."""
  alphas: Tuple[float, ...] = ALPHAS
  gammas: Tuple[int, ...] = GAMMAS
  batch_sizes: Tuple[int, ...] = BATCH_SIZES
  repeats: int = 3
  seed: int = 0
  max_verify_tokens: int = 16
  cost_repeats: int = 5

  def validate(self) -> None:
    if not self.alphas or any(not 0.0 <= a <= 1.0 for a in self.alphas):
      raise ValueError(f'alphas (α*) must be non-empty and lie in [0, 1], got {self.alphas!r}.')
    if not self.gammas or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in self.gammas):
      raise ValueError(f'gammas must be integers >= 1, got {self.gammas!r}.')
    if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
      raise ValueError(f'batch_sizes must be >= 1, got {self.batch_sizes!r}.')
    if self.repeats < 1 or self.cost_repeats < 1:
      raise ValueError(f'repeats and cost_repeats must be >= 1, got {self.repeats!r} and {self.cost_repeats!r}.')
    if max(self.gammas) + 1 > self.max_verify_tokens:
      raise ValueError(f'max_verify_tokens ({self.max_verify_tokens}) must cover the widest verify call, '
                       f'γ + 1 = {max(self.gammas) + 1}.')


def oracle_label(alpha: float, gamma: int) -> str:
  return f'oracle α*={alpha:g} γ={gamma} ({CONTROLLED})'


def _as_json(tree):
  return json.loads(json.dumps(tree, default=lambda x: np.asarray(x).tolist()))


class _State:
  """The run's progress as one JSON file, rewritten atomically after every step."""

  def __init__(self, path: str, settings: Settings, identity: Mapping[str, Any]):
    self.path = path
    head = {'settings': _as_json(dataclasses.asdict(settings)), 'identity': _as_json(dict(identity))}
    self.data = {**head, 'costs': {}, 'batches': {}}
    if path and fileio.exists(path):
      with fileio.open(path, 'rb') as f:
        old = json.loads(f.read())
      if {k: old.get(k) for k in head} != head:
        raise ValueError(f'{path} holds a run of other settings or inputs: delete it to measure afresh, or '
                         'give this run another state file.')
      self.data = old

  def save(self) -> None:
    if self.path:
      fileio.atomic_write(self.path, json.dumps(self.data, sort_keys=True).encode())


def _stats_row(stats, rows: int) -> Dict[str, List[int]]:
  stats = jax.tree_util.tree_map(np.asarray, stats)
  return {k: stats[k][:rows].astype(int).tolist() for k in ('accepted', 'judged', 'emitted', 'target_calls')}


def measure(target_module, target_params, examples: Sequence[Mapping[str, Any]], lengths: Mapping[str, int],
            settings: Settings = Settings(),
            shipped: Optional[Mapping[str, Tuple[Any, Any, int]]] = None,
            state_path: Optional[str] = None, log: Callable[[str], None] = print,
            verify_curves: Optional[Mapping[int, Mapping[str, Any]]] = None) -> Dict[str, Any]:
  """Measures the ceiling grid (see the module docstring); returns the state (`report` reads it).

  Args:
    target_module, target_params: the target.
    examples: tokenized examples (`evaluation.task_examples`), decoded in order.
    lengths: {'inputs': ..., 'targets': ...}.
    settings: the grid.
    shipped: {name: (drafter module, params, γ)}: trained drafters timed in the same interleave, so the
      report can place them under the ceiling.
    state_path: the resumable state file (None: nothing written).
    log: progress lines.
    verify_curves: {batch size: `profiling.verify_cost_curve` of this target on the first batch's inputs}
      already measured by the caller, used instead of measuring them again; each must cover k = 1..
      `settings.max_verify_tokens`.
  """
  settings.validate()
  verify_curves = dict(verify_curves or {})
  for batch_size, curve in verify_curves.items():
    if list(curve['tokens']) != list(range(1, settings.max_verify_tokens + 1)):
      raise ValueError(f'the given verify-cost curve of batch {batch_size} covers k = {list(curve["tokens"])}, '
                       f'not 1..{settings.max_verify_tokens}.')
  shipped = dict(shipped or {})
  vocab_size = target_module.config.vocab_size
  for name, (module, _, gamma) in shipped.items():
    if module.config.vocab_size != vocab_size:
      raise ValueError(f'shipped drafter {name!r} has vocab_size {module.config.vocab_size}, the target '
                       f'{vocab_size}.')
    if gamma < 1:
      raise ValueError(f'shipped drafter {name!r}: γ must be >= 1, got {gamma}.')
  identity = {'examples': len(examples), 'lengths': dict(lengths), 'shipped': {n: g for n, (_, _, g) in
                                                                                 shipped.items()},
              'inputs_sha': _inputs_digest([np.asarray(e['inputs']) for e in examples])}
  state = _State(state_path, settings, identity)
  oracle_module = oracle.OracleDrafter(oracle.OracleConfig(vocab_size))
  base = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=decoding.temperature_sample)
  greedy = {'temperature': 0.0, 'topk': 0, 'topp': 0.0}
  base_predict = base.compile_predict(greedy)
  oracle_spec = models.SpeculativeEncoderDecoderModel(target_module, oracle_module,
                                                      decode_fn=decoding.speculative_sample)
  spec_predict = {gamma: oracle_spec.compile_predict(dict(greedy, gamma=gamma, return_stats=True))
                  for gamma in settings.gammas}
  shipped_predict = {}
  for name, (module, params, gamma) in shipped.items():
    spec = models.SpeculativeEncoderDecoderModel(target_module, module, decode_fn=decoding.speculative_sample)
    shipped_predict[name] = functools.partial(spec.compile_predict(dict(greedy, gamma=gamma, return_stats=True)),
                                              {'target': target_params, 'drafter': params})
  target_only = {'target': target_params}

  for batch_size in settings.batch_sizes:
    key = str(batch_size)
    batches = evaluation.batches(examples, lengths, batch_size, True)
    _, first = batches[0]
    first_decodes = np.asarray(base_predict(target_only, first)[0])
    costs = state.data['costs'].setdefault(key, {})
    if 'verify_curve' not in costs and batch_size in verify_curves:
      costs['verify_curve'] = dict(verify_curves[batch_size])
      state.save()
    if 'verify_curve' not in costs:
      log(f'[batch {batch_size}] verify-cost curve, k = 1..{settings.max_verify_tokens} tokens a call')
      costs['verify_curve'] = profiling.verify_cost_curve(
          target_module, target_params, first['encoder_input_tokens'], lengths['targets'],
          settings.max_verify_tokens)
      state.save()
    in_loop = costs.setdefault('in_loop', {})
    for gamma in settings.gammas:
      for rows in batch_shrink.stage_sizes(batch_size):
        cost_key = f'{gamma}/{rows}'
        if cost_key in in_loop:
          continue
        log(f'[batch {batch_size}] in-loop costs, γ = {gamma}, {rows} rows')
        sub = {k: v[:rows] for k, v in first.items()}
        params = oracle.oracle_params(first_decodes[:rows], _COST_ALPHA, np.arange(rows), settings.seed)
        in_loop[cost_key] = profiling.in_loop_costs(target_module, target_params, oracle_module, params, sub,
                                                    first_decodes[0], gamma, greedy, repeats=settings.cost_repeats)
        state.save()

    done = state.data['batches'].setdefault(key, [])
    started, timed_before = time.perf_counter(), len(done)
    for n, (idx, batch) in enumerate(batches):
      if n < len(done):
        continue
      rows = len(idx)
      decodes = np.asarray(base_predict(target_only, batch)[0])
      ids = np.asarray(list(idx) + [len(examples) + r for r in range(batch_size - rows)])
      decoders = {'baseline': functools.partial(base_predict, target_only)}
      for alpha in settings.alphas:
        for gamma in settings.gammas:
          params = {'target': target_params,
                    'drafter': oracle.oracle_params(decodes, alpha, ids, settings.seed)}
          decoders[oracle_label(alpha, gamma)] = functools.partial(spec_predict[gamma], params)
      decoders.update(shipped_predict)
      timed = profiling.time_side_by_side(decoders, [batch], repeats=settings.repeats)
      record = {'index': n, 'example_ids': list(idx), 'rows': rows,
                'baseline_s': timed['baseline']['seconds'][0],
                'baseline_tokens': [evaluation.num_tokens(d, EOS_ID) for d in decodes[:rows]],
                'oracle': {}, 'shipped': {}}
      for name, entry in timed.items():
        if name == 'baseline':
          continue
        out = entry['outputs'][0]
        row = {'seconds': entry['seconds'][0],
               'identical': bool(np.array_equal(np.asarray(out[0])[:rows], decodes[:rows])),
               **_stats_row(out[1]['stats'], rows)}
        if name in shipped_predict:
          record['shipped'][name] = row
        else:
          record['oracle'][name] = row
      done.append(record)
      state.save()
      elapsed = time.perf_counter() - started
      finished = len(done) - timed_before
      eta = elapsed / finished * (len(batches) - len(done))
      tokens = sum(record['baseline_tokens'])
      log(f'[batch {batch_size}] {len(done)}/{len(batches)} batches, {len(decoders)} decoders each; baseline '
          f'{tokens / record["baseline_s"]:.0f} tokens/s; ETA {eta / 60:.1f} min')
  state.data['date'] = datetime.datetime.now().isoformat(timespec='seconds')
  state.save()
  return state.data


def _inputs_digest(arrays: Sequence[np.ndarray]) -> str:
  """A digest of the inputs, so a resumed run checks it is decoding the same examples."""
  digest = hashlib.sha256()
  for a in arrays:
    digest.update(np.asarray(a, np.int64).tobytes())
    digest.update(b'|')
  return digest.hexdigest()


# ----------------------------------------------------------------------------------------------------------
# From the measured state to the report.
# ----------------------------------------------------------------------------------------------------------


def _sum(records, kind, name, field):
  return sum(sum(r[kind][name][field]) for r in records)


def _row(records, kind, name, batch_size, in_loop_by_rows=None):
  judged, accepted = _sum(records, kind, name, 'judged'), _sum(records, kind, name, 'accepted')
  out = {'batch': batch_size, 'alpha_measured': theory.acceptance_rate(accepted, judged), 'judged': judged,
         'alpha_stderr': theory.acceptance_stderr(accepted, judged),
         'tokens_per_call': _sum(records, kind, name, 'emitted') / max(_sum(records, kind, name, 'target_calls'), 1),
         'measured_speedup': sum(r['baseline_s'] for r in records) / sum(r[kind][name]['seconds'] for r in records),
         'identical': all(r[kind][name]['identical'] for r in records),
         'examples': sum(r['rows'] for r in records)}
  if in_loop_by_rows is not None:
    out['predicted_in_loop'] = cost_model.predicted_speedup_in_loop_batched(
        in_loop_by_rows, reporting.steps_per_batch(
            [(r['baseline_tokens'], r[kind][name]['target_calls']) for r in records], batch_size))
    out['measured_over_predicted'] = out['measured_speedup'] / out['predicted_in_loop']
  return out


def _fitted_round_costs(records, names_by_gamma) -> Optional[Dict[Any, Any]]:
  """Batch 1: the baseline's fixed and per-token cost, and per γ the round's fixed and per-round cost, fitted
  over every example (and every α*: rounds vary with α*, so the fit is well posed); None where the examples
  cannot separate the two terms."""
  def fit(steps, seconds):
    try:
      return cost_model.fit_fixed_and_per_step(steps, seconds)
    except ValueError:  # a single distinct step count
      return None

  base = fit([sum(r['baseline_tokens']) for r in records], [r['baseline_s'] for r in records])
  if base is None:
    return None
  out = {'baseline': base}
  for gamma, names in names_by_gamma.items():
    out[gamma] = fit([sum(r['oracle'][n]['target_calls']) for r in records for n in names],
                     [r['oracle'][n]['seconds'] for r in records for n in names])
  return out


def controlled_row(target_module, target_params, examples: Sequence[Mapping[str, Any]],
                   lengths: Mapping[str, int], alpha: float = 0.9, max_verify_tokens: int = 12,
                   repeats: int = 3, seed: int = 0, state_dir: Optional[str] = None,
                   log: Callable[[str], None] = print) -> Dict[str, Any]:
  """One row of controlled acceptance for a table: the oracle at α* = `alpha`, batch 1, greedy, interleaved
  with the baseline on `examples`, at the γ this machine's verify-cost curve favours.

  The curve (k = 1..`max_verify_tokens` tokens a call, on the first example's input) is measured first and
  kept in `state_dir`/verify_curve.json; γ is `auto_gamma.pick(alpha, 0, curve)` (`theory.best_gamma`): the
  oracle's draft is a lookup, so the curve alone decides how many drafts a round pays for. Then `measure` runs that one (α*, γ)
  with its state in `state_dir` (resumable; None: nothing kept). Returns `report`'s row with the curve, the
  γ and its predicted speedup (`best_gamma_predicted`).
  """
  if isinstance(alpha, bool) or not 0.0 < float(alpha) <= 1.0:
    raise ValueError(f'alpha must be in (0, 1], got {alpha!r}.')
  if isinstance(max_verify_tokens, bool) or not isinstance(max_verify_tokens, int) or max_verify_tokens < 2:
    raise ValueError(f'max_verify_tokens must be an integer >= 2, got {max_verify_tokens!r}.')
  if not examples:
    raise ValueError('controlled_row needs at least one example.')
  curve_path = fileio.join(state_dir, 'verify_curve.json') if state_dir else None
  curve = fileio.read_json_object(curve_path, 'verify-cost curve') if curve_path and fileio.exists(curve_path) \
      else None
  if curve is None or list(curve['tokens']) != list(range(1, max_verify_tokens + 1)):
    log(f'controlled acceptance: verify-cost curve, k = 1..{max_verify_tokens} tokens a call')
    (_, first), = evaluation.batches(examples[:1], lengths, 1, True)
    curve = profiling.verify_cost_curve(target_module, target_params, first['encoder_input_tokens'],
                                        lengths['targets'], max_verify_tokens, repeats=repeats)
    if curve_path:
      fileio.write_json(curve_path, curve)
  choice = auto_gamma.pick(alpha, 0.0, curve, max_gamma=max_verify_tokens - 1)
  gamma, predicted = choice['gamma'], choice['predicted_speedup']
  settings = Settings(alphas=(float(alpha),), gammas=(gamma,), batch_sizes=(1,), repeats=repeats, seed=seed,
                      max_verify_tokens=max_verify_tokens, cost_repeats=repeats)
  log(f'controlled acceptance: oracle α* {alpha:g}, γ {gamma} (best of the curve), {len(examples)} examples')
  state = measure(target_module, target_params, examples, lengths, settings,
                  state_path=(fileio.join(state_dir, f'state_a{alpha:g}_g{gamma}_n{len(examples)}.json')
                              if state_dir else None),
                  log=log, verify_curves={1: curve})
  (row,) = report(state)['rows']
  return dict(row, verify_curve=curve, best_gamma_predicted=predicted)


def report(state: Mapping[str, Any], confidence: Optional[Mapping[str, float]] = None) -> Dict[str, Any]:
  """Rows, best γ, costs and the shipped drafters' places from a `measure` state."""
  settings = Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in state['settings'].items()})
  rows, shipped_rows, best, costs_out = [], [], [], {}
  for batch_size in settings.batch_sizes:
    key = str(batch_size)
    records = state['batches'].get(key, [])
    if not records:
      continue
    costs = state['costs'][key]
    curve = costs['verify_curve']
    ratio_of = dict(zip(curve['tokens'], curve['ratio']))
    # The in-loop costs of the full batch at each γ (the shrinking stages' sizes are read per row below).
    full = {g: costs['in_loop'][f'{g}/{batch_size}'] for g in settings.gammas}
    for gamma in settings.gammas:
      by_rows = {rows: costs['in_loop'][f'{gamma}/{rows}'] for rows in batch_shrink.stage_sizes(batch_size)}
      for alpha in settings.alphas:
        r = _row(records, 'oracle', oracle_label(alpha, gamma), batch_size, by_rows)
        # α measured is accepted / judged, in [0, 1] by construction.
        r.update(drafter=CONTROLLED, alpha_target=alpha, gamma=gamma, c_in_loop=full[gamma]['c_in_loop'],
                 a_in_loop=full[gamma]['round_fixed_in_loop'], verify_ratio=ratio_of.get(gamma + 1),
                 predicted_thm38=theory.expected_speedup(r['alpha_measured'], gamma, full[gamma]['c_in_loop']),
                 expected_tokens_per_call=theory.expected_tokens(r['alpha_measured'], gamma))
        rows.append(r)
    for name, gamma in state['identity']['shipped'].items():
      r = _row(records, 'shipped', name, batch_size)
      r.update(drafter=name, gamma=gamma)
      shipped_rows.append(r)
    c_median = float(np.median([full[g]['c_in_loop'] for g in settings.gammas]))
    grid_curve = {g + 1: ratio_of[g + 1] for g in settings.gammas}
    for alpha in settings.alphas:
      mine = [r for r in rows if r['batch'] == batch_size and r['alpha_target'] == alpha]
      top = max(mine, key=lambda r: r['measured_speedup'])
      pooled = (sum(r['alpha_measured'] * r['judged'] for r in mine) / max(sum(r['judged'] for r in mine), 1))
      helper_gamma, helper_speedup = theory.best_gamma(pooled, c_median, grid_curve)
      paper_gamma, paper_speedup = theory.optimal_gamma(pooled, c_median, max_gamma=max(settings.gammas))
      at = {r['gamma']: r['measured_speedup'] for r in mine}
      best.append({'batch': batch_size, 'alpha_target': alpha, 'alpha_measured': pooled,
                   'best_gamma_measured': top['gamma'], 'best_speedup_measured': top['measured_speedup'],
                   'best_gamma_helper': helper_gamma, 'helper_predicted_speedup': helper_speedup,
                   'measured_at_helper_gamma': at.get(helper_gamma),
                   'optimal_gamma_thm38': paper_gamma, 'thm38_predicted_speedup': paper_speedup,
                   'measured_at_thm38_gamma': at.get(paper_gamma)})
    per_gamma = lambda field: {str(g): full[g][field] for g in settings.gammas}
    first = full[settings.gammas[0]]
    costs_out[key] = {'verify_curve': curve, 'c_in_loop': per_gamma('c_in_loop'),
                      'a_in_loop': per_gamma('round_fixed_in_loop'), 'c_median': c_median,
                      'baseline_round_s': first['baseline_round_s'], 'baseline_fixed_s': first['baseline_fixed_s'],
                      'round_s': per_gamma('round_s'), 'draft_s': per_gamma('draft_s'),
                      'speculative_fixed_s': per_gamma('speculative_fixed_s')}
    fitted = _fitted_round_costs(records, {g: [oracle_label(a, g) for a in settings.alphas]
                                           for g in settings.gammas}) if batch_size == 1 else None
    if fitted:
      costs_out[key]['fitted'] = {str(k): v for k, v in fitted.items()}
  return {'settings': dataclasses.asdict(settings), 'identity': state['identity'], 'date': state.get('date'),
          'rows': rows, 'shipped': shipped_rows, 'best_gamma': best, 'costs': costs_out,
          'target_confidence': dict(confidence) if confidence else None}
