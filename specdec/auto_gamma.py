"""γ from the machine: `gamma = 'auto'` picks drafts per round from what this machine and this drafter measure.

Thm 3.8's optimal γ assumes a (γ + 1)-token verify call costs one 1-token call. On the machines this project
runs on it costs 0.9–1.9 one-token calls depending on the machine and the width, so the best γ is the
machine's, not the paper's. At the start of a run `choose` measures, in seconds:

  - the target's verify-cost curve r(k), k = 1..γ_max + 1 tokens a call, at the run's batch size
    (`profiling.verify_cost_curve`);
  - α, from a calibration decode of the first examples at γ = PROBE_GAMMA (accepted / judged, at the run's
    temperature and sampling settings);
  - c, one draft step inside the compiled loop over one baseline round, at γ = PROBE_GAMMA
    (`profiling.time_phases`);

and takes γ = `theory.best_gamma(α, c, r)`: the γ whose expected tokens per round over its round cost
(γ·c + r(γ + 1)) is largest. The choice and what it was made from are kept in a JSON file with the run, so a
resumed run decodes at the same γ.
"""

import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import jax
import numpy as np

from specdec import fileio
from specdec import profiling
from specdec import theory

AUTO = 'auto'
# The widest round `choose` considers: its verify call is MAX_GAMMA + 1 tokens wide.
MAX_GAMMA = 8
# γ of the calibration decode and of the in-loop c (a draft step's cost and α do not depend on γ).
PROBE_GAMMA = 2
# Examples decoded for α (whole batches, the run's first, at least this many rows). Four examples at batch 1 measured
# f128's greedy α at 0.48 against 0.59 over 48, and picked γ = 2 where γ = 3 was 4% faster.
CALIBRATION_EXAMPLES = 16
FILE_NAME = 'gamma_auto.json'


def is_auto(gamma: Any) -> bool:
  return isinstance(gamma, str) and gamma == AUTO


def pick(alpha: float, c: float, curve: Mapping[str, Sequence[float]], max_gamma: int = MAX_GAMMA
         ) -> Dict[str, Any]:
  """The choice from measured α, c and verify curve ({'tokens': [1..K], 'ratio': [...]}): {gamma,
  predicted_speedup, thm38_gamma}; γ at most `max_gamma` and K - 1."""
  ratios = dict(zip(curve['tokens'], curve['ratio']))
  gamma, speedup = theory.best_gamma(alpha, c, ratios, max_gamma=min(max_gamma, max(ratios) - 1))
  return {'gamma': int(gamma), 'predicted_speedup': float(speedup),
          'thm38_gamma': int(np.asarray(theory.optimal_gamma(alpha, c)[0]))}


def calibration_batches(batches: Sequence[Mapping[str, np.ndarray]], examples: int = CALIBRATION_EXAMPLES) -> list:
  """The first batches holding at least `examples` rows (all of them if they hold fewer)."""
  taken, rows = [], 0
  for batch in batches:
    if rows >= examples:
      break
    taken.append(batch)
    rows += int(np.asarray(batch['decoder_input_tokens']).shape[0])
  return taken


def choose(target_module, target_params, drafter_module, drafter_params, batches: Sequence[Mapping[str, np.ndarray]],
           spec_predict: Callable[..., Any], base_predict: Callable[..., Any],
           params: Mapping[str, Any], base_params: Mapping[str, Any], decoder_params: Mapping[str, Any],
           seed: int = 0, draft_vocab_ids: Optional[np.ndarray] = None, state_path: Optional[str] = None,
           log: Callable[[str], None] = print) -> Dict[str, Any]:
  """Measures the curve, α and c on `batches` (the run's first batches; the first sets the curve's batch size
  and input) and picks γ (`pick`). `spec_predict(params, batch, rng)` is the run's speculative decoder
  compiled at γ = PROBE_GAMMA with statistics on, `base_predict(base_params, batch, rng)` its baseline;
  `decoder_params` the speculative decoder's settings (temperature, top-k, top-p, draft confidence). A record
  in `state_path` is returned as it is (the run's choice stands when it resumes)."""
  if state_path and fileio.exists(state_path):
    return fileio.read_json_object(state_path, 'γ choice')
  if not batches:
    raise ValueError("gamma='auto' needs at least one batch to measure on.")
  start = time.perf_counter()
  first = batches[0]
  length = first['decoder_input_tokens'].shape[1]
  max_tokens = min(MAX_GAMMA + 1, length - 1)
  if max_tokens < 2:
    raise ValueError(f"gamma='auto' needs a decode length of at least 3 tokens, got {length}.")
  log(f"  gamma 'auto': verify-cost curve, k = 1..{max_tokens} tokens a call")
  curve = profiling.verify_cost_curve(target_module, target_params, first['encoder_input_tokens'], length,
                                      max_tokens)
  calibration = calibration_batches(batches)
  log(f"  gamma 'auto': α from {len(calibration)} batches at γ = {PROBE_GAMMA}")
  accepted = judged = 0
  for n, batch in enumerate(calibration):
    _, aux = spec_predict(params, batch, jax.random.PRNGKey(seed + n))
    accepted += int(np.sum(aux['stats']['accepted']))
    judged += int(np.sum(aux['stats']['judged']))
  alpha = accepted / judged if judged else 0.0
  log(f"  gamma 'auto': c inside the loop at γ = {PROBE_GAMMA}")
  decoded_l = np.asarray(base_predict(base_params, first, jax.random.PRNGKey(seed))[0])[0]
  phases = profiling.time_phases(
      target_module, target_params, drafter_module, drafter_params,
      np.asarray(first['encoder_input_tokens']), decoded_l, length, PROBE_GAMMA,
      temperature=decoder_params.get('temperature', 0.0), topk=decoder_params.get('topk', 0),
      topp=decoder_params.get('topp', 0.0), draft_confidence=decoder_params.get('draft_confidence', 0.0),
      parts=('draft', 'baseline_round'), draft_vocab_ids=draft_vocab_ids)
  c = phases.draft / PROBE_GAMMA / phases.baseline_round
  record = {**pick(alpha, c, curve), 'alpha': alpha, 'judged': judged, 'c_in_loop': c,
            'probe_gamma': PROBE_GAMMA, 'verify_curve': curve, 'batch_size': int(first['decoder_input_tokens'].shape[0]),
            'seconds': time.perf_counter() - start}
  log(f"  gamma 'auto': γ = {record['gamma']} (α {alpha:.3f}, c {c:.3f}, verify {record['gamma'] + 1} tokens = "
      f"{curve['ratio'][record['gamma']]:.2f} one-token calls; predicted {record['predicted_speedup']:.2f}×)")
  if state_path:
    fileio.write_json(state_path, record)
  return record
