"""The decoder settings: `Setting`, the one object a run's γ, sampling and batching come from, and its validation.

A launcher run binds it in gin (`settings.Setting.gamma = 4`, `decoding = @settings.Setting()` in a
`run_config.RunConfig`); a script builds one directly. `validate` says in one line what a decode cannot run with;
`decoder_params` and `speculative_params` are the keyword arguments the decode functions are compiled with
(`decoding.temperature_sample`, `decoding.speculative_sample`). γ may be `AUTO` ('auto'): the benchmark picks it
from what the machine measures before any decoder is compiled (`auto_gamma`).
"""

import dataclasses
from typing import Any, Dict, Union

from specdec import decoding

AUTO = 'auto'


def is_auto(gamma: Any) -> bool:
  """Whether `gamma` asks for γ to be chosen from measurements (`AUTO`) rather than given."""
  return isinstance(gamma, str) and gamma == AUTO


@dataclasses.dataclass(frozen=True)
class Setting:
  """One run's decoding settings. `gamma`: drafts per round, or 'auto' (`auto_gamma`: chosen at the start of the run
  from this machine's verify-cost curve, a calibration α and the in-loop c)."""
  gamma: Union[int, str] = 5
  temperature: float = 0.0
  topk: int = 0
  topp: float = 0.0
  batch_size: int = 1
  repeats: int = 3
  seed: int = 0
  length_buckets: bool = True
  # Adaptive drafting (`decoding.speculative_sample`): stop a row's drafts below this drafter confidence.
  draft_confidence: float = 0.0

  def validate(self) -> None:
    """Raises ValueError naming the setting a decode cannot run with (the decode loops' words,
    `decoding.validate_settings`)."""
    if isinstance(self.gamma, str) and not is_auto(self.gamma):
      raise ValueError(f"gamma must be an int >= 1 or '{AUTO}', got {self.gamma!r}.")
    decoding.validate_settings(self.temperature, self.topk, self.topp,
                               gamma=1 if is_auto(self.gamma) else self.gamma,
                               draft_confidence=self.draft_confidence)
    if self.batch_size < 1 or self.repeats < 1:
      raise ValueError(f'batch_size and repeats must be >= 1, got {self.batch_size}, {self.repeats}.')

  def speculative_params(self) -> Dict[str, Any]:
    """`decoder_params` plus γ, statistics and (when on) adaptive drafting."""
    if is_auto(self.gamma):
      raise ValueError("gamma='auto' is resolved by benchmark.run before any decoder is compiled.")
    params = dict(self.decoder_params(), gamma=self.gamma, return_stats=True)
    if self.draft_confidence:
      params['draft_confidence'] = float(self.draft_confidence)
    return params

  def decoder_params(self) -> Dict[str, Any]:
    # T5X's decode functions default to topk=1 (argmax); 0 means "no top-k".
    return {'temperature': float(self.temperature), 'topk': int(self.topk),
            'topp': float(self.topp)}
