"""Side by side with what users would pick instead: Hugging Face assisted generation on the same weights.

`run(target_dir, drafter_dir, data, setting, call_costs, output)` (`benchmark.TaskSplit`, `PeerSetting`,
`CallCostSetting`, `PeerOutput`) exports both networks to `transformers` T5 (`hf_export.save_hf`, float32), loads
them with `T5ForConditionalGeneration.from_pretrained` and, in one process, on the same examples
(`evaluation.task_examples`), interleaved example by example, times:

  hf   baseline              `generate` (greedy, or do_sample=True, top_k=0 at temperature 1)
  hf   assisted:<setting>    `generate(..., assistant_model=drafter)`, one row per assistant setting
                             (`ASSISTANT_SETTINGS`: 'constant' = γ drafts every round, 'hf_default' = transformers
                             5's defaults, 'heuristic' = transformers 4's growing/shrinking schedule from γ)
  ours baseline              `decoding.temperature_sample`, compiled as benchmark.py does
  ours speculative           `decoding.speculative_sample` with γ drafts every round
  ours speculative_adaptive  the same with adaptive drafting (`draft_confidence`, when > 0)

transformers 5 reads num_assistant_tokens, num_assistant_tokens_schedule and assistant_confidence_threshold
from the DRAFTER's generation_config, not from generate's keyword arguments, so each setting is written there
before each call (and recorded in its row). Warm-up runs (compilation for ours, a first call for HF) are not
timed; each example's time is the median of `repeats` runs; totals are sums over examples.

Target calls. HF's are counted with a forward pre-hook on the target (the encoder runs outside the model's
forward, so only decoder calls count), with the decoder tokens each call was given: a verify call of an
assisted round gets its drafts + 1 tokens, so drafted = Σ (tokens per call - 1) and accepted = emitted - calls
(each call emits its matching drafts and one token of its own; a final round whose kept draft is the EOS
counts that EOS as the round's own token, as HF's n_matches does). Ours come from `return_stats`, with
accepted counted the same way (`accepted_in_loop` keeps the loop's own count, which includes a kept EOS).

Where the time goes (`call_costs`, on by default). Each framework's model calls are also timed by themselves
on the first examples (`measure_call_costs`): HF's torch models called directly (encoder; 1-token and γ+1-token
decoder calls with a prefilled cache, cropped back after each timed call), ours jitted (`profiling`'s timers: the
decoder calls inside one compiled scan, as in our decode loops). The report gives ms per call, HF / ours per call
kind, verify / step and c = drafter step / target step in each framework, and per row the measured ms per token
beside what its counted calls would cost at those prices (`peers_report.model_time_per_token`): the rest is the
loop and the framework around the calls.

Without torch / transformers installed, `require_peers` raises an ImportError naming the extra to install.
"""

import contextlib
import dataclasses
import datetime
import inspect
import json
import os
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec.bench import benchmark
from specdec import decoding
from specdec import evaluation
from specdec import fileio
from specdec import hf_export
from specdec import import_order
from specdec import models
from specdec import network
from specdec.bench import peers_report
from specdec.bench import plots
from specdec.bench import profiling
from specdec.bench import reporting
from specdec import settings

INSTALL_HINT = "pip install -e '.[peers]'"
# The record keys of the frameworks and systems (`peers_report` sums and renders by them).
HF, OURS = peers_report.HF, peers_report.OURS
BASELINE = peers_report.BASELINE
SPECULATIVE, ADAPTIVE = peers_report.SPECULATIVE, peers_report.ADAPTIVE
CALL_KINDS = peers_report.CALL_KINDS


def require_peers():
  """(torch, transformers), or an ImportError saying how to install them."""
  import_order.check_triton_loadable('torch and transformers')
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f'The peer benchmark needs PyTorch and transformers ({e}); install them with '
                      f'{INSTALL_HINT}') from e
  return torch, transformers


# ----------------------------------------------------------------------------------------------------------
# HF assistant settings.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AssistantSetting:
  """What transformers reads from the drafter's generation_config for assisted generation."""
  name: str
  num_assistant_tokens: int
  num_assistant_tokens_schedule: str  # 'constant' | 'heuristic' | 'heuristic_transient'
  assistant_confidence_threshold: float  # drafting stops below this drafter probability; 0 = off


ASSISTANT_SETTINGS = ('constant', 'hf_default', 'heuristic')


def assistant_setting(name: str, gamma: int) -> AssistantSetting:
  """The named HF assistant setting for our γ."""
  settings = {
      # γ drafts every round, no early stop: as our fixed-γ speculative decoding drafts.
      'constant': AssistantSetting('constant', gamma, 'constant', 0.0),
      # transformers 5's defaults: up to 20 drafts, stopped at drafter probability < 0.4 (a cut-off that
      # transformers re-fits each round from the acceptance history when scikit-learn is installed).
      'hf_default': AssistantSetting('hf_default', 20, 'constant', 0.4),
      # transformers 4's default schedule, started at γ: +2 after a round that kept every draft, -1 otherwise.
      'heuristic': AssistantSetting('heuristic', gamma, 'heuristic', 0.0),
  }
  if name not in settings:
    raise ValueError(f'Unknown HF assistant setting {name!r}; valid names: {list(ASSISTANT_SETTINGS)}.')
  return settings[name]


def apply_assistant_setting(drafter_model, setting: AssistantSetting) -> None:
  """Writes `setting` into the drafter's generation_config (where transformers 5 reads it)."""
  config = drafter_model.generation_config
  config.num_assistant_tokens = setting.num_assistant_tokens
  config.num_assistant_tokens_schedule = setting.num_assistant_tokens_schedule
  config.assistant_confidence_threshold = setting.assistant_confidence_threshold


# ----------------------------------------------------------------------------------------------------------
# Counting HF model calls.
# ----------------------------------------------------------------------------------------------------------


class CallCounter:
  """Forward calls of a torch module and the decoder tokens they were given (a forward pre-hook)."""

  def __init__(self, module):
    self.calls, self.tokens = 0, 0
    self._handle = module.register_forward_pre_hook(self._count, with_kwargs=True)

  def _count(self, module, args, kwargs):
    del module
    del args  # generate passes everything by keyword
    ids = kwargs.get('decoder_input_ids')
    self.calls += 1
    self.tokens += int(ids.shape[1]) if ids is not None else 1

  def reset(self) -> None:
    self.calls, self.tokens = 0, 0

  def remove(self) -> None:
    self._handle.remove()


def hf_decode_row(sequence: np.ndarray, length: int) -> np.ndarray:
  """HF's output [decoder start, tokens...] as our decode row: the tokens, zero-padded to `length`."""
  tokens = np.asarray(sequence)[1:length + 1]
  row = np.zeros(length, np.int32)
  row[:len(tokens)] = tokens
  return row


def hf_generate_kwargs(temperature: float, max_new_tokens: int) -> Dict[str, Any]:
  """generate's decoding arguments matching ours: argmax, or plain sampling (top_k=0: HF's default is 50)."""
  common = dict(max_new_tokens=max_new_tokens, num_beams=1, use_cache=True)
  if temperature == 0:
    return dict(common, do_sample=False)
  return dict(common, do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)


# ----------------------------------------------------------------------------------------------------------
# The systems: each `run(i) -> (seconds, result)` decodes example i once.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class System:
  framework: str
  name: str
  settings: Dict[str, Any]
  run: Callable[[int], Tuple[float, Dict[str, Any]]]
  warm_up: Callable[[int], None]

  @property
  def key(self) -> str:
    return f'{self.framework}:{self.name}'


def _hf_system(torch, target, drafter, counters, setting: Optional[AssistantSetting], temperature: float,
               examples, max_new_tokens: int, seed: int) -> System:
  target_counter, drafter_counter = counters
  kwargs = hf_generate_kwargs(temperature, max_new_tokens)

  def run(i):
    input_ids = torch.tensor(np.asarray(examples[i]['inputs'], np.int64)[None])
    extra = {}
    if setting is not None:
      apply_assistant_setting(drafter, setting)
      extra['assistant_model'] = drafter
    target_counter.reset()
    drafter_counter.reset()
    torch.manual_seed(seed + i)
    start = time.perf_counter()
    with torch.inference_mode():
      out = target.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs, **extra)
    seconds = time.perf_counter() - start
    decode = hf_decode_row(out[0].numpy(), max_new_tokens)
    tokens = evaluation.num_tokens(decode, hf_export.EOS_ID)
    calls = target_counter.calls
    drafted = target_counter.tokens - calls if setting is not None else 0
    return seconds, {'decode': decode.tolist(), 'tokens': tokens, 'target_calls': calls,
                     'drafter_calls': drafter_counter.calls, 'drafted': drafted,
                     'accepted': tokens - calls if setting is not None else 0}

  name = BASELINE if setting is None else f'assisted:{setting.name}'
  settings = {'temperature': temperature, **({} if setting is None else dataclasses.asdict(setting))}
  warmed = []

  def warm_up(i):  # one untimed call (torch allocates and picks its kernels on the first)
    if not warmed:
      run(i)
      warmed.append(i)

  return System(HF, name, settings, run, warm_up)


def _ours_system(name: str, predict, params, batches, temperature: float, seed: int,
                 decoder_params: Mapping[str, Any], eos_id: int) -> System:
  warm_shapes = set()

  def warm_up(i):  # compile + one untimed run per input shape
    shape = batches[i]['encoder_input_tokens'].shape
    if shape not in warm_shapes:
      jax.block_until_ready(predict(params, batches[i], jax.random.PRNGKey(seed + i)))
      warm_shapes.add(shape)

  def run(i):
    rng = jax.random.PRNGKey(seed + i)
    start = time.perf_counter()
    decodes, aux = jax.block_until_ready(predict(params, batches[i], rng))
    seconds = time.perf_counter() - start
    decode = np.asarray(decodes[0])
    result = {'decode': decode.tolist(), 'tokens': evaluation.num_tokens(decode, eos_id)}
    if 'stats' in aux:
      stats = jax.device_get(aux['stats'])
      result.update({k: int(stats[k][0]) for k in ('target_calls', 'drafted', 'judged', 'emitted')})
      result['accepted_in_loop'] = int(stats['accepted'][0])  # also counts a kept EOS draft
      result['accepted'] = result['tokens'] - result['target_calls']  # as HF's count (module docstring)
    else:
      result['target_calls'] = result['tokens']  # one target call per token
    return seconds, result

  settings = {'temperature': temperature,
              **{k: v for k, v in decoder_params.items() if k not in ('temperature', 'return_stats')}}
  return System(OURS, name, settings, run, warm_up)


def ours_models(target_module, drafter_module, vocab):
  """(baseline, speculative) models, built as benchmark.py builds them; each compiles once per setting."""
  return (models.SpeculativeEncoderDecoderModel(target_module, None, output_vocabulary=vocab,
                                                decode_fn=decoding.temperature_sample),
          models.SpeculativeEncoderDecoderModel(target_module, drafter_module, output_vocabulary=vocab,
                                                decode_fn=decoding.speculative_sample))


# ----------------------------------------------------------------------------------------------------------
# Loading.
# ----------------------------------------------------------------------------------------------------------


def load_pair(torch, transformers, model_dir: str, hf_dir: str):
  """(our module, our params, the HF model) of one model directory, the HF one through an export."""
  config, params = hf_export.load_for_export(model_dir)
  if config.num_encoder_layers != config.num_decoder_layers:
    # transformers 5's generate sizes its decoder cache by the encoder's layer count (IndexError otherwise).
    raise ValueError(f'{model_dir}: {config.num_encoder_layers} encoder but {config.num_decoder_layers} decoder '
                     "layers; transformers' T5 generate with a cache needs equal counts.")
  hf_export.save_hf(hf_dir, config, params)
  hf_model = transformers.T5ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
  return network.Transformer(config), params, hf_model


@contextlib.contextmanager
def _quiet_transformers(transformers):
  """transformers' logger at error level and no progress bars (per-call notices would flood the log)."""
  verbosity = transformers.logging.get_verbosity()
  bars = transformers.logging.is_progress_bar_enabled()
  transformers.logging.set_verbosity_error()
  transformers.logging.disable_progress_bar()
  try:
    yield
  finally:
    transformers.logging.set_verbosity(verbosity)
    if bars:
      transformers.logging.enable_progress_bar()


@contextlib.contextmanager
def _torch_threads(torch, threads: int):
  """torch.set_num_threads(threads) for the block (a process-wide setting, so restored after)."""
  before = torch.get_num_threads()
  torch.set_num_threads(threads)
  try:
    yield
  finally:
    torch.set_num_threads(before)


def _sklearn_available() -> bool:
  try:
    import sklearn  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


# ----------------------------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PeerSetting:
  """What a peer run compares, and how it times it.

  gamma: our γ, and HF's drafts per round in the 'constant' (and start of the 'heuristic') setting.
  temperatures: 0 (greedy) and/or 1 (sampling, top_k=0).
  hf_settings: names from ASSISTANT_SETTINGS.
  draft_confidence: our adaptive-drafting row's cut-off (0: no adaptive row).
  repeats: timed runs per example and system (median kept).
  length_buckets: pad our inputs to a bucket (`evaluation.bucket_length`); HF takes them unpadded.
  ours_batch_size: > 1 adds our baseline and speculative decoding at this batch size (HF's assisted generation
    is batch 1 only: compare with its batch-1 rows, i.e. HF at batch 1 × B).
  torch_threads: PyTorch's intra-op threads (None: os.cpu_count(), as many as XLA's CPU client uses); restored
    when the run ends.
  """
  gamma: int
  temperatures: Sequence[float] = (0.0, 1.0)
  hf_settings: Sequence[str] = ('constant', 'hf_default')
  draft_confidence: float = 0.5
  repeats: int = 1
  seed: int = 0
  length_buckets: bool = True
  ours_batch_size: int = 0
  torch_threads: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class CallCostSetting:
  """Timing each framework's model calls by themselves (`measure_call_costs`), on the first `examples` examples.

  Encoders, and 1-token and γ+1-token cached decoder calls with the decoder at `position` (HF's cache holds that
  many positions); the median of `repeats` runs (ours: of `num_calls` calls in one compiled scan each), warm-up
  and compilation excluded. The report then shows where each framework's time per token goes
  (`peers_report.model_time_per_token`). measure=False leaves all of this out.
  """
  measure: bool = True
  examples: int = 4
  position: int = 10
  repeats: int = 5
  num_calls: int = 32


@dataclasses.dataclass(frozen=True)
class PeerOutput:
  """Where a peer run writes: output_dir/<run_name>.{md,json,png} (run_name None: <task>_<drafter>_g<γ>), and
  where its progress lines go (`log`)."""
  output_dir: str = 'results/peers'
  run_name: Optional[str] = None
  write_plot: bool = True
  log: Callable[[str], None] = print


def run(target_dir: str, drafter_dir: str, data: benchmark.TaskSplit, setting: PeerSetting,
        call_costs: CallCostSetting = CallCostSetting(), output: PeerOutput = PeerOutput()) -> Dict[str, Any]:
  """Times HF generate / assisted generation against our baseline / speculative decoding; writes the report.

  target_dir, drafter_dir: compact model directories (e.g. models/cpu/target, models/cpu/d1kd).
  data: the examples (`benchmark.load_examples`; tasks must be registered, e.g.
    `tasks.register_local_tasks(corpus_dir)`).

  Returns the summary (also in <run_name>.json).
  """
  torch, transformers = require_peers()
  import seqio  # pylint: disable=g-import-not-at-top
  validate(setting, call_costs)
  hf_settings = [assistant_setting(name, setting.gamma) for name in setting.hf_settings]
  run_name = output.run_name or f'{data.task}_{os.path.basename(os.path.normpath(drafter_dir))}_g{setting.gamma}'

  xla_threads = os.cpu_count() or 1  # XLA's CPU client uses one thread per core
  examples = benchmark.load_examples(data)
  vocab = seqio.get_mixture_or_task(data.task).output_features['targets'].vocabulary

  with (tempfile.TemporaryDirectory(prefix='specdec_peers_') as hf_root, _quiet_transformers(transformers),
        _torch_threads(torch, setting.torch_threads or xla_threads)):
    frameworks = _load_frameworks(torch, transformers, target_dir, drafter_dir, hf_root, vocab, examples, data,
                                  setting.length_buckets)
    start = time.perf_counter()
    records, systems_by_temperature = _time_every_system(frameworks, setting, hf_settings, examples,
                                                         data.lengths['targets'], output.log, start)
    pair = frameworks.pair
    batch_rows = _batched_rows(frameworks, examples, data.lengths, setting) if setting.ours_batch_size > 1 else []
    for counter in frameworks.counters:
      counter.remove()
    costs = None
    if call_costs.measure:
      costs = _measure_call_costs(frameworks, records, examples, data.lengths, setting, call_costs)
      output.log(f"  call costs: {len(costs['examples'])} examples, {time.perf_counter() - start:.0f} s so far")

  rows = _rows(systems_by_temperature, records, costs)
  identity = _identity(records, pair, examples, data.lengths) if 0.0 in setting.temperatures else {}
  summary = {
      'task': data.task, 'split': data.split, 'lengths': dict(data.lengths), 'examples': len(examples),
      'target': target_dir, 'drafter': drafter_dir, 'gamma': setting.gamma,
      'draft_confidence': setting.draft_confidence, 'repeats': setting.repeats, 'seed': setting.seed,
      'rows': rows, 'ratios': peers_report.ratios(rows), 'identity': identity,
      'batched': batch_rows, 'ours_batch_size': setting.ours_batch_size, 'call_costs': costs,
      'threads': {'torch_num_threads': setting.torch_threads or xla_threads, 'xla_cpu_threads': xla_threads},
      'versions': {'torch': torch.__version__, 'transformers': transformers.__version__,
                   'scikit_learn_available': _sklearn_available()},
      'machine': reporting.machine_info(), 'date': datetime.datetime.now().isoformat(timespec='seconds'),
      'command': reporting.run_command(), 'records': records,
  }
  write_outputs(output.output_dir, run_name, summary, output.write_plot)
  return summary


def validate(setting: PeerSetting, call_costs: CallCostSetting) -> None:
  """Raises ValueError for settings a peer run cannot measure (before anything is loaded)."""
  gamma, repeats, temperatures = setting.gamma, setting.repeats, setting.temperatures
  decoding.validate_settings(gamma=gamma)
  if repeats < 1:
    raise ValueError(f'repeats must be >= 1, got {repeats}.')
  c = call_costs
  if c.measure and min(c.examples, c.repeats, c.num_calls, c.position) < 1:
    raise ValueError('the call costs\' examples, repeats, num_calls and position must be >= 1, got '
                     f'call_cost_examples={c.examples}, call_cost_repeats={c.repeats}, '
                     f'call_cost_num_calls={c.num_calls}, call_cost_position={c.position}.')
  bad = [t for t in temperatures if t not in (0.0, 1.0)]
  if bad or not temperatures:
    raise ValueError(f'temperatures must be 0 and/or 1 (greedy, plain sampling), got {list(temperatures)}.')


@dataclasses.dataclass(frozen=True)
class _Frameworks:
  """Both frameworks' models of one run: HF's torch models with their call counters, and ours (`ours_models`)
  with their params and batch-1 inputs (one batch per example)."""
  torch: Any
  hf_target: Any
  hf_drafter: Any
  counters: Tuple[CallCounter, CallCounter]
  pair: benchmark.ModelPair
  decoders: Tuple[models.SpeculativeEncoderDecoderModel, models.SpeculativeEncoderDecoderModel]
  batches: List[Dict[str, np.ndarray]]
  eos_id: int

  @property
  def params(self) -> Dict[str, Any]:
    return {'target': self.pair.target_params, 'drafter': self.pair.drafter_params}


def _load_frameworks(torch, transformers, target_dir: str, drafter_dir: str, hf_root: str, vocab, examples,
                     data: benchmark.TaskSplit, length_buckets: bool) -> _Frameworks:
  """Loads both model directories into both frameworks (HF's through an export under `hf_root`)."""
  target_module, target_params, hf_target = load_pair(torch, transformers, target_dir,
                                                      os.path.join(hf_root, 'target'))
  drafter_module, drafter_params, hf_drafter = load_pair(torch, transformers, drafter_dir,
                                                         os.path.join(hf_root, 'drafter'))
  if target_module.config.vocab_size != drafter_module.config.vocab_size:
    raise ValueError(f'Vocabulary mismatch: target vocab_size={target_module.config.vocab_size}, '
                     f'drafter vocab_size={drafter_module.config.vocab_size}.')
  counters = (CallCounter(hf_target), CallCounter(hf_drafter))
  batches = [b for _, b in evaluation.batches(examples, data.lengths, 1, length_buckets)]
  return _Frameworks(torch, hf_target, hf_drafter, counters,
                    benchmark.ModelPair(target_module, target_params, drafter_module, drafter_params),
                    ours_models(target_module, drafter_module, vocab), batches, int(vocab.eos_id))


def _systems(frameworks: _Frameworks, setting: PeerSetting, hf_settings: Sequence[AssistantSetting],
             temperature: float, examples, max_new_tokens: int) -> List[System]:
  """Every system at `temperature`: HF's baseline and assisted settings, then ours (baseline, speculative and,
  with a draft confidence, adaptive)."""
  f = frameworks
  systems = [_hf_system(f.torch, f.hf_target, f.hf_drafter, f.counters, s, temperature, examples, max_new_tokens,
                        setting.seed) for s in [None] + list(hf_settings)]
  baseline_model, speculative_model = f.decoders
  ours = [(SPECULATIVE, 0.0)] + ([(ADAPTIVE, setting.draft_confidence)] if setting.draft_confidence else [])
  for name, confidence in [(BASELINE, 0.0)] + ours:
    ours_setting = settings.Setting(gamma=setting.gamma, temperature=temperature, topk=0, seed=setting.seed,
                                    draft_confidence=confidence)
    if name == BASELINE:
      systems.append(_ours_system(name, baseline_model.compile_predict(ours_setting.decoder_params()),
                                  {'target': f.pair.target_params}, f.batches, temperature, setting.seed,
                                  ours_setting.decoder_params(), f.eos_id))
    else:
      systems.append(_ours_system(name, speculative_model.compile_predict(ours_setting.speculative_params()),
                                  f.params, f.batches, temperature, setting.seed,
                                  ours_setting.speculative_params(), f.eos_id))
  return systems


def _time_every_system(frameworks: _Frameworks, setting: PeerSetting, hf_settings: Sequence[AssistantSetting],
                       examples, max_new_tokens: int, log: Callable[[str], None], start: float
                       ) -> Tuple[Dict[str, List[Dict[str, Any]]], Dict[float, List[System]]]:
  """(records by '<temperature>/<system key>', systems by temperature): every system timed at each temperature."""
  records: Dict[str, List[Dict[str, Any]]] = {}
  systems_by_temperature = {}
  for temperature in setting.temperatures:
    systems = _systems(frameworks, setting, hf_settings, temperature, examples, max_new_tokens)
    systems_by_temperature[temperature] = systems
    _time_systems(systems, len(examples), setting.repeats, temperature, records)
    log(f'  t={temperature:g}: {len(examples)} examples, {time.perf_counter() - start:.0f} s so far')
  return records, systems_by_temperature


def _batched_rows(frameworks: _Frameworks, examples, lengths: Mapping[str, int], setting: PeerSetting
                  ) -> List[Dict[str, Any]]:
  """`time_ours_batched` at `setting.ours_batch_size`."""
  return time_ours_batched(frameworks.decoders, frameworks.params, examples, lengths, setting.gamma,
                           setting.temperatures, setting.seed, setting.ours_batch_size, setting.length_buckets,
                           frameworks.eos_id)


def _time_systems(systems: Sequence[System], num_examples: int, repeats: int, temperature: float,
                  records: Dict[str, List[Dict[str, Any]]]) -> None:
  """Times every system on every example, interleaved; appends each example's record (median seconds) to
  records['<temperature>/<system key>']."""
  for i in range(num_examples):
    per_system = {}
    for system in systems:  # HF: one untimed call; ours: compile + one untimed run per input shape
      system.warm_up(i)
    for _ in range(repeats):  # interleaved, so slow drifts of the machine hit every system alike
      for system in systems:
        seconds, result = system.run(i)
        per_system.setdefault(system.key, (result, []))[1].append(seconds)
    for key, (result, times) in per_system.items():
      records.setdefault(f'{temperature:g}/{key}', []).append(dict(result, index=i, seconds=float(np.median(times))))


def _measure_call_costs(frameworks: _Frameworks, records, examples, lengths: Mapping[str, int],
                        setting: PeerSetting, call_costs: CallCostSetting) -> Dict[str, Any]:
  """`measure_call_costs` on the first examples, HF's decoder given its own greedy (or first temperature's)
  baseline decode as realistic decoder inputs."""
  gamma = setting.gamma
  position = max(1, min(call_costs.position, lengths['targets'] - gamma - 1))
  first = records[f'{setting.temperatures[0]:g}/{HF}:{BASELINE}']
  decoder_inputs = [hf_decoder_inputs(r['decode'], position + gamma + 1) for r in first]
  f, m = frameworks, frameworks.pair
  return measure_call_costs(f.torch, f.hf_target, f.hf_drafter, m.target_module, m.target_params,
                            m.drafter_module, m.drafter_params, examples, f.batches, decoder_inputs,
                            range(min(call_costs.examples, len(examples))), position, gamma, call_costs.repeats,
                            call_costs.num_calls)


def _identity(records, pair: benchmark.ModelPair, examples, lengths: Mapping[str, int]) -> Dict[str, Any]:
  """`greedy_identity`, with HF's and our target calls per example at γ drafts every round
  (`peers_report.greedy_constant_calls`)."""
  identity = greedy_identity(records, pair.target_module, pair.target_params, examples, lengths)
  identity['constant_calls'] = peers_report.greedy_constant_calls(records)
  return identity


def _rows(systems_by_temperature: Mapping[float, Sequence[System]], records, costs: Optional[Dict[str, Any]]
          ) -> List[Dict[str, Any]]:
  """One summed row per (temperature, system), with speedups; `costs` gains each row's model time per token."""
  rows = [peers_report.summarize_system(records[f'{t:g}/{s.key}'], s, t)
          for t, systems in systems_by_temperature.items() for s in systems]
  peers_report.add_speedups(rows)
  if costs is not None:
    costs['per_token'] = [peers_report.model_time_per_token(r, costs['ms'][r['framework']]) for r in rows]
  return rows


def time_ours_batched(decoders, params, examples, lengths, gamma, temperatures, seed, batch_size,
                      length_buckets, eos_id) -> List[Dict[str, Any]]:
  """Our baseline and fixed-γ speculative decoding at `batch_size` over all examples (sum of batch times).

  `decoders` is `ours_models(...)`; each batch runs once untimed (compile / warm-up), then once timed.
  """
  rows = []
  batches = evaluation.batches(examples, lengths, batch_size, length_buckets)
  for temperature in temperatures:
    setting = settings.Setting(gamma=gamma, temperature=temperature, topk=0, seed=seed)
    base_predict = decoders[0].compile_predict(setting.decoder_params())
    spec_predict = decoders[1].compile_predict(setting.speculative_params())
    for name, predict, these_params in ((BASELINE, base_predict, {'target': params['target']}),
                                        (SPECULATIVE, spec_predict, params)):
      seconds, tokens = 0.0, 0
      for batch_no, (idx, batch) in enumerate(batches):
        rng = jax.random.PRNGKey(seed + batch_no)
        jax.block_until_ready(predict(these_params, batch, rng))  # compile / warm-up, untimed
        begin = time.perf_counter()
        decodes, _ = jax.block_until_ready(predict(these_params, batch, rng))
        seconds += time.perf_counter() - begin
        decodes = np.asarray(decodes)
        tokens += sum(evaluation.num_tokens(decodes[row], eos_id) for row in range(len(idx)))
      rows.append({'framework': OURS, 'system': f'{name}@batch{batch_size}', 'temperature': temperature,
                   'batch_size': batch_size, 'seconds': seconds, 'tokens': tokens,
                   'tokens_per_s': tokens / seconds})
  return rows


# ----------------------------------------------------------------------------------------------------------
# Per-call costs: where each framework's time goes.
# ----------------------------------------------------------------------------------------------------------


def _hf_cache_keyword(model) -> str:
  """The decoder cache's keyword in this transformers version's forward: `cache` (5.x, where `past_key_values`
  is a deprecated alias) or `past_key_values` (4.x)."""
  return 'cache' if 'cache' in inspect.signature(model.forward).parameters else 'past_key_values'


def _hf_output_cache(output):
  cache = getattr(output, 'cache', None)
  return cache if cache is not None else output.past_key_values


def hf_crop(cache, length: int) -> None:
  """Cuts an HF decoder cache back to its first `length` self-attention positions (cross-attention kept).

  transformers 5.x's `Cache.crop(n)` takes the number of tokens to remove, as a negative n (a positive n, the
  absolute length 4.x took, raises ValueError); 4.x also read a negative n that way, so -extra works in both.
  """
  extra = cache.get_seq_length() - length
  if extra > 0:
    cache.crop(-extra)


def _median_ms(fn: Callable[[], Any], repeats: int, reset: Optional[Callable[[], None]] = None) -> float:
  """Median wall ms of `fn()` over `repeats` runs after one untimed run; `reset()` after each run, untimed."""
  times = []
  for r in range(repeats + 1):
    start = time.perf_counter()
    fn()
    if r:
      times.append(time.perf_counter() - start)
    if reset is not None:
      reset()
  return 1000 * float(np.median(times))


def hf_call_costs(torch, target, drafter, input_ids_l, decoder_inputs_l, position: int, gamma: int,
                  repeats: int) -> Dict[str, float]:
  """ms per call of HF's models at batch 1 (`CALL_KINDS`), each called by itself under torch.inference_mode().

  The encoder: `get_encoder()(input_ids, attention_mask)`. The decoder calls: the model's forward with the
  encoder's outputs and a cache prefilled (untimed) with `decoder_inputs_l[:position]` (decoder start and the
  first decoded tokens); each timed call adds 1 (or γ+1) tokens at `position` and the cache is cropped back to
  `position` after it (untimed), so every timed call starts from the same state. Median of `repeats` runs after
  one untimed warm-up run.
  """
  input_ids = torch.tensor(np.asarray(input_ids_l, np.int64)[None])
  mask = torch.ones_like(input_ids)
  decoder_inputs = torch.tensor(np.asarray(decoder_inputs_l, np.int64)[None])
  if decoder_inputs.shape[1] < position + gamma + 1:
    raise ValueError(f'{decoder_inputs.shape[1]} decoder inputs, need position + γ + 1 = {position + gamma + 1}.')
  out = {}
  with torch.inference_mode():
    for name, model in (('target', target), ('drafter', drafter)):
      encoder = model.get_encoder()
      out[f'{name}_encoder'] = _median_ms(lambda e=encoder: e(input_ids=input_ids, attention_mask=mask), repeats)
      encoded = encoder(input_ids=input_ids, attention_mask=mask)
      prefill = model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=decoder_inputs[:, :position],
                      use_cache=True)
      cache = _hf_output_cache(prefill)
      cache_kw = {_hf_cache_keyword(model): cache}
      for kind, k in (('step', 1),) + ((('verify', gamma + 1),) if name == 'target' else ()):
        ids = decoder_inputs[:, position:position + k]
        out[f'{name}_{kind}'] = _median_ms(
            lambda m=model, ids=ids: m(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=ids,
                                       use_cache=True, **cache_kw),
            repeats, reset=lambda c=cache: hf_crop(c, position))
  return out


def ours_call_costs(target_module, target_params, drafter_module, drafter_params, batch: Mapping[str, Any],
                    gamma: int, repeats: int, num_calls: int) -> Dict[str, float]:
  """ms per call of our networks at batch 1 (`CALL_KINDS`), jitted, for one batch as our decoders get it.

  The encoder: `module.encode` jitted (`profiling.median_seconds`: median of `repeats` runs after an untimed
  compile run). The decoder calls: `profiling.time_decode_calls`, `num_calls` cached decode_step calls of 1 (or
  γ+1) tokens inside one jitted lax.scan (as inside our decode loops, so no per-call dispatch), at advancing
  positions of the encoded input; our cache has the decode length whatever the position, so a call's cost does
  not depend on it.
  """
  enc = np.asarray(batch['encoder_input_tokens'])
  length = int(batch['decoder_input_tokens'].shape[1])
  out = {}
  for name, module, params in (('target', target_module, target_params),
                               ('drafter', drafter_module, drafter_params)):
    encode = jax.jit(lambda p, e, m=module: m.apply({'params': p}, e, enable_dropout=False, method=m.encode))
    out[f'{name}_encoder'] = 1000 * profiling.median_seconds(encode, params, enc, repeats=repeats)
    for kind, k in (('step', 1),) + ((('verify', gamma + 1),) if name == 'target' else ()):
      out[f'{name}_{kind}'] = 1000 * profiling.time_decode_calls(module, params, enc, length, k,
                                                                 num_calls=num_calls, repeats=repeats)
  return out


def measure_call_costs(torch, hf_target, hf_drafter, target_module, target_params, drafter_module,
                       drafter_params, examples, batches, decoder_inputs, indices: Sequence[int], position: int,
                       gamma: int, repeats: int, num_calls: int) -> Dict[str, Any]:
  """`hf_call_costs` and `ours_call_costs` for the examples at `indices` (HF given the example's inputs and
  `decoder_inputs[i]`, ours `batches[i]`); medians over the examples, the ratios, and the per-example ms."""
  per_example = {f: {k: [] for k in CALL_KINDS} for f in (HF, OURS)}
  for i in indices:
    costs = {HF: hf_call_costs(torch, hf_target, hf_drafter, examples[i]['inputs'], decoder_inputs[i], position,
                               gamma, repeats),
             OURS: ours_call_costs(target_module, target_params, drafter_module, drafter_params, batches[i],
                                   gamma, repeats, num_calls)}
    for framework, kinds in costs.items():
      for k, v in kinds.items():
        per_example[framework][k].append(float(v))
  ms = {f: {k: float(np.median(v)) for k, v in kinds.items()} for f, kinds in per_example.items()}
  return {'examples': [int(i) for i in indices], 'position': position, 'repeats': repeats,
          'ours_calls_per_repeat': num_calls, 'ms': ms, 'ratios': peers_report.call_cost_ratios(ms),
          'per_example_ms': per_example}


def hf_decoder_inputs(decode_l: Sequence[int], length: int) -> np.ndarray:
  """[decoder start (0), decoded tokens...] zero-padded (or cut) to `length`: the decoder inputs of a decode."""
  row = np.zeros(length, np.int64)
  tokens = np.asarray(decode_l, np.int64)[:length - 1]
  row[1:1 + len(tokens)] = tokens
  return row


# ----------------------------------------------------------------------------------------------------------
# Greedy outputs compared.
# ----------------------------------------------------------------------------------------------------------


def greedy_identity(records: Mapping[str, Sequence[Mapping[str, Any]]], target_module, target_params,
                    examples, lengths) -> Dict[str, Any]:
  """Greedy outputs compared: HF vs ours (baselines), and each speculative system vs its own baseline.

  HF vs ours mismatches are listed with our target's logit margin where they first differ
  (`benchmark.divergence_margin`: ours token's logit minus HF's, teacher-forced on our decode).
  """
  greedy = {k.split('/', 1)[1]: v for k, v in records.items() if k.startswith('0/')}
  decodes = {k: [np.asarray(r['decode']) for r in v] for k, v in greedy.items()}
  out = {}
  for key, rows in decodes.items():
    if key.endswith(':' + BASELINE):
      continue
    own_baseline = decodes[key.split(':')[0] + ':' + BASELINE]
    out[f'{key} vs own baseline'] = float(np.mean([np.array_equal(a, b) for a, b in zip(rows, own_baseline)]))
  ours, hf = decodes[f'{OURS}:{BASELINE}'], decodes[f'{HF}:{BASELINE}']
  mismatches = []
  for i, (a, b) in enumerate(zip(ours, hf)):
    if not np.array_equal(a, b):
      enc = np.asarray(examples[i]['inputs'], np.int32)[:lengths['inputs']]
      m = benchmark.divergence_margin(target_module, target_params, enc, a, b)
      mismatches.append({'index': i, 'position': m['position'], 'ours_token': m['baseline_token'],
                         'hf_token': m['speculative_token'], 'margin': m['margin'], 'top2_gap': m['top2_gap']})
  return {'hf_vs_ours_baseline': 1.0 - len(mismatches) / len(ours), 'mismatches': mismatches,
          'speculative_vs_baseline': out}


# ----------------------------------------------------------------------------------------------------------
# Outputs.
# ----------------------------------------------------------------------------------------------------------


def write_outputs(output_dir: str, run_name: str, summary: Mapping[str, Any], write_plot: bool = True) -> None:
  """<run_name>.json, .md (`peers_report.markdown`) and .png (`plots.plot_peers`), each written atomically."""
  base = os.path.join(output_dir, run_name)
  fileio.atomic_write(base + '.json', json.dumps(summary, indent=2, allow_nan=False).encode())
  fileio.atomic_write(base + '.md', peers_report.markdown(summary).encode())
  if write_plot:
    plots.plot_peers(base + '.png', summary)
