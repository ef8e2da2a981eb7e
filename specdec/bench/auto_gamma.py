"""γ from the machine: `gamma = 'auto'` picks drafts per round from what this machine and this drafter measure.

Thm 3.8's optimal γ assumes a (γ + 1)-token verify call costs one 1-token call. On the machines this project
runs on it costs 0.9–1.9 one-token calls depending on the machine and the width, so the best γ is the
machine's, not the paper's. At the start of a run `choose` measures, in seconds:

  - the acceptance a_k at each depth k = 1..PROBE_GAMMA, from a calibration decode of the first real examples
    (padded batch rows are neither counted nor read) at γ = PROBE_GAMMA, at the run's temperature and sampling
    settings (`acceptance_by_depth`); deeper than the probe, its deepest a_k stands. α (accepted / judged) is
    recorded beside them. A calibration that judged no draft is refused before anything is timed: there is no
    α to choose from;
  - the target's verify-cost curve r(k), k = 1..γ_max + 1 tokens a call, at the run's batch size
    (`profiling.verify_cost_curve`);
  - c, one draft step inside the compiled loop over one baseline round, at γ = PROBE_GAMMA
    (`profiling.time_phases`);

and takes γ = `theory.best_gamma(a, c, r)`: the γ whose expected tokens per round (1 + Σ_k Π_{j≤k} a_j) over
its round cost (γ·c + r(γ + 1)) is largest. One α at every depth overstates deep rounds of a drafter that
accepts less at depth; the record keeps that pick too (`gamma_one_alpha`), so a report shows whether it differs.
The choice, what it was made from and the machine it was measured on (`this_machine`) are kept in a JSON file
with the run: a run resumed on the same machine decodes at the same γ, one resumed on another measures afresh.
"""

import json
import os
import platform
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import jax
import numpy as np

from specdec import fileio
from specdec.bench import profiling
from specdec import theory

# The widest round `choose` considers: its verify call is MAX_GAMMA + 1 tokens wide.
MAX_GAMMA = 8
# γ of the calibration decode and of the in-loop c (a draft step's cost and the acceptance at a depth do not
# depend on γ; depths beyond it are not measured).
PROBE_GAMMA = 2
# Real examples decoded for α (whole batches, the run's first, at least this many real rows). Four examples at
# batch 1 measured f128's greedy α at 0.48 against 0.59 over 48, and picked γ = 2 where γ = 3 was 4% faster.
CALIBRATION_EXAMPLES = 16
FILE_NAME = 'gamma_auto.json'
CPUINFO = '/proc/cpuinfo'


def pick(alpha: float, c: float, curve: Mapping[str, Sequence[float]], max_gamma: int = MAX_GAMMA,
         acceptance: Optional[Sequence[float]] = None) -> Dict[str, Any]:
  """The choice from measured α, c and verify curve ({'tokens': [1..K], 'ratio': [...]}): {gamma,
  predicted_speedup, thm38_gamma}; γ at most `max_gamma` and K - 1. With `acceptance` (a_1..a_m by depth,
  `acceptance_by_depth`; the last stands for deeper drafts) γ and its speedup are from it, and `gamma_one_alpha`
  is what one α at every depth would pick."""
  ratios = dict(zip(curve['tokens'], curve['ratio']))
  top = min(max_gamma, max(ratios) - 1)
  choice = {'thm38_gamma': int(np.asarray(theory.optimal_gamma(alpha, c)[0]))}
  gamma, speedup = theory.best_gamma(alpha, c, ratios, max_gamma=top)
  if acceptance is not None:
    choice['gamma_one_alpha'] = int(gamma)
    gamma, speedup = theory.best_gamma(extend(acceptance, top), c, ratios, max_gamma=top)
  return {'gamma': int(gamma), 'predicted_speedup': float(speedup), **choice}


def extend(acceptance: Sequence[float], depth: int) -> List[float]:
  """a_1..a_depth: the measured depths, then the deepest measured one for each deeper draft (the calibration
  probes PROBE_GAMMA depths; what lies beyond is not measured)."""
  acceptance = [float(a) for a in acceptance]
  if not acceptance:
    raise ValueError('acceptance needs at least one depth, got none.')
  return (acceptance + [acceptance[-1]] * depth)[:max(depth, 1)]


def acceptance_by_depth(accepted_at: Sequence[float], judged: float) -> List[float]:
  """a_k = P(draft k kept | drafts < k kept), k = 1..γ, from a decode's counts: `accepted_at[k-1]` rounds kept
  draft k, `judged` drafts were compared in all.

  Draft k (k >= 2) is compared in the rounds that kept draft k - 1, and draft 1 in the other compared drafts'
  rounds: judged - Σ_{k<γ} accepted_at[k-1]. These denominators sum to `judged`, so with one true α at every
  depth the a_k pool back to accepted / judged. (A round cut by the length limit or an accepted EOS after
  keeping draft k - 1 is counted as comparing draft k: rare, a few rounds of a decode.) A depth no round
  reached takes the one above it (it cannot change the expected tokens: the product before it is 0).
  """
  kept = np.asarray(accepted_at, np.float64)
  if kept.ndim != 1 or kept.size == 0 or np.any(kept < 0) or np.any(np.diff(kept) > 0):
    raise ValueError(f'accepted_at must be non-increasing counts by depth, got {accepted_at!r}.')
  if not judged > 0:
    raise ValueError(f'acceptance by depth needs judged drafts, got judged = {judged!r}.')
  reached = np.concatenate([[judged - kept[:-1].sum()], kept[:-1]])
  out = []
  for k, (kept_k, reached_k) in enumerate(zip(kept, reached)):
    if max(reached_k, kept_k) > 0:
      out.append(float(kept_k / max(reached_k, kept_k)))
    else:
      out.append(out[k - 1])
  return out


def real_rows(batch: Mapping[str, np.ndarray]) -> np.ndarray:
  """[B] bool: the rows that hold an example (a batch is padded to its size with all-zero inputs)."""
  return np.any(np.asarray(batch['encoder_input_tokens']) != 0, axis=-1)


def calibration_batches(batches: Sequence[Mapping[str, np.ndarray]], examples: int = CALIBRATION_EXAMPLES) -> list:
  """The first batches holding at least `examples` real rows (all of them if they hold fewer); batches with
  none are skipped (nothing in them to calibrate on)."""
  taken, rows = [], 0
  for batch in batches:
    if rows >= examples:
      break
    real = int(np.sum(real_rows(batch)))
    if real:
      taken.append(batch)
      rows += real
  return taken


def this_machine() -> Dict[str, Any]:
  """What a γ choice was measured on: the accelerator (backend, device kind and count) and the host (CPU model
  and count). A verify-cost curve and c measured on one do not hold on another."""
  devices = jax.devices()
  return {'backend': jax.default_backend(), 'device_kind': str(devices[0].device_kind),
          'device_count': len(devices), 'cpu_model': cpu_model(), 'cpu_count': os.cpu_count()}


def cpu_model(cpuinfo: Optional[str] = None) -> str:
  """The CPU's model name (Linux's /proc/cpuinfo, or `cpuinfo`), else what `platform` says."""
  try:
    with open(cpuinfo or CPUINFO, encoding='utf-8', errors='replace') as f:
      for line in f:
        key, _, value = line.partition(':')
        if key.strip() in ('model name', 'Model', 'Hardware') and value.strip():
          return value.strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def depth_note(record: Mapping[str, Any]) -> str:
  """'; acceptance by depth 0.65, 0.55, one α at every depth: γ = 3' for a report's line on a choice ('' for a
  record made before acceptance was measured by depth)."""
  if 'acceptance_by_depth' not in record:
    return ''
  depths = ', '.join(f'{a:.2f}' for a in record['acceptance_by_depth'])
  same = ' (the same)' if record['gamma_one_alpha'] == record['gamma'] else ''
  return f"; acceptance by depth {depths}, one α at every depth: γ = {record['gamma_one_alpha']}{same}"


def describe_machine(machine: Optional[Mapping[str, Any]]) -> str:
  if not machine:
    return 'an unrecorded machine'
  return (f"{machine.get('backend')} {machine.get('device_kind')} x{machine.get('device_count')}, "
          f"{machine.get('cpu_model')}, {machine.get('cpu_count')} CPUs")


def _stored_choice(state_path: Optional[str], machine: Mapping[str, Any], log: Callable[[str], None]
                   ) -> tuple:
  """(the stored record if it was measured on `machine`, else None; what a re-measured record replaces)."""
  if not (state_path and fileio.exists(state_path)):
    return None, None
  stored = fileio.read_json_object(state_path, 'γ choice')
  if stored.get('machine') == machine:
    return stored, None
  log(f"  gamma 'auto': the stored γ = {stored.get('gamma')} was measured on "
      f"{describe_machine(stored.get('machine'))}, this is {describe_machine(machine)}: measuring again")
  return None, {'gamma': stored.get('gamma'), 'machine': stored.get('machine')}


def choose(target_module, target_params, drafter_module, drafter_params, batches: Sequence[Mapping[str, np.ndarray]],
           spec_predict: Callable[..., Any], base_predict: Callable[..., Any],
           params: Mapping[str, Any], base_params: Mapping[str, Any], decoder_params: Mapping[str, Any],
           seed: int = 0, draft_vocab_ids: Optional[np.ndarray] = None, state_path: Optional[str] = None,
           log: Callable[[str], None] = print, machine: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """Measures α by depth, the curve and c on `batches` (the run's first batches; the first sets the curve's
  batch size and input) and picks γ (`pick`). `spec_predict(params, batch, rng)` is the run's speculative
  decoder compiled at γ = PROBE_GAMMA with statistics on, `base_predict(base_params, batch, rng)` its baseline;
  `decoder_params` the speculative decoder's settings (temperature, top-k, top-p, draft confidence). A record
  in `state_path` measured on this machine (`machine`, default `this_machine()`) is returned as it is (the
  run's choice stands when it resumes); one from another machine is measured afresh and replaced (the new
  record's `replaces` names the old γ and machine). ValueError when the calibration judged no draft."""
  # As read back from JSON, so it compares with a stored record's.
  machine = json.loads(json.dumps(dict(this_machine() if machine is None else machine)))
  stored, replaces = _stored_choice(state_path, machine, log)
  if stored is not None:
    return stored
  if not batches:
    raise ValueError("gamma='auto' needs at least one batch to measure on.")
  start = time.perf_counter()
  first = batches[0]
  length = first['decoder_input_tokens'].shape[1]
  max_tokens = min(MAX_GAMMA + 1, length - 1)
  if max_tokens < 2:
    raise ValueError(f"gamma='auto' needs a decode length of at least 3 tokens, got {length}.")
  # α first: a calibration that judged nothing is refused before the curve and c are timed.
  calibration = calibration_batches(batches)
  log(f"  gamma 'auto': α from {len(calibration)} batches at γ = {PROBE_GAMMA}")
  accepted = judged = examples = 0
  accepted_at = np.zeros(PROBE_GAMMA, np.int64)
  for n, batch in enumerate(calibration):
    _, aux = spec_predict(params, batch, jax.random.PRNGKey(seed + n))
    real = real_rows(batch)
    stats = {k: np.asarray(v)[real] for k, v in aux['stats'].items()}  # rows first; padded rows dropped
    examples += int(np.sum(real))
    accepted += int(np.sum(stats['accepted']))
    judged += int(np.sum(stats['judged']))
    accepted_at += np.asarray(stats['accepted_at']).reshape(-1, PROBE_GAMMA).sum(0).astype(np.int64)
  if not judged:
    raise ValueError(f"gamma='auto' judged no draft in its calibration decode of {examples} examples (every "
                     'decode ended before a draft was compared), so there is no α to choose γ from: give γ as '
                     'an int.')
  alpha = accepted / judged
  acceptance = acceptance_by_depth(accepted_at, judged)
  log(f"  gamma 'auto': verify-cost curve, k = 1..{max_tokens} tokens a call")
  curve = profiling.verify_cost_curve(target_module, target_params, first['encoder_input_tokens'], length,
                                      max_tokens)
  log(f"  gamma 'auto': c inside the loop at γ = {PROBE_GAMMA}")
  decoded_l = np.asarray(base_predict(base_params, first, jax.random.PRNGKey(seed))[0])[0]
  phases = profiling.time_phases(
      target_module, target_params, drafter_module, drafter_params,
      np.asarray(first['encoder_input_tokens']), decoded_l, length, PROBE_GAMMA,
      temperature=decoder_params.get('temperature', 0.0), topk=decoder_params.get('topk', 0),
      topp=decoder_params.get('topp', 0.0), draft_confidence=decoder_params.get('draft_confidence', 0.0),
      parts=('draft', 'baseline_round'), draft_vocab_ids=draft_vocab_ids)
  c = phases.draft / PROBE_GAMMA / phases.baseline_round
  record = {**pick(alpha, c, curve, acceptance=acceptance), 'alpha': alpha, 'judged': judged,
            'acceptance_by_depth': acceptance, 'accepted_at': accepted_at.tolist(),
            'calibration_examples': examples, 'c_in_loop': c, 'probe_gamma': PROBE_GAMMA, 'verify_curve': curve,
            'batch_size': int(first['decoder_input_tokens'].shape[0]), 'machine': machine,
            'seconds': time.perf_counter() - start}
  if replaces is not None:
    record['replaces'] = replaces
  depths = ', '.join(f'{a:.3f}' for a in acceptance)
  log(f"  gamma 'auto': γ = {record['gamma']} (α {alpha:.3f}, by depth {depths}, c {c:.3f}, verify "
      f"{record['gamma'] + 1} tokens = {curve['ratio'][record['gamma']]:.2f} one-token calls; predicted "
      f"{record['predicted_speedup']:.2f}×; one α at every depth: γ = {record['gamma_one_alpha']})")
  if state_path:
    fileio.write_json(state_path, record)
  return record
