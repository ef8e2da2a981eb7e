"""Side by side with what users would pick instead: Hugging Face assisted generation on the same weights.

`run(target_dir, drafter_dir, task, split, lengths, max_examples, gamma, ...)` exports both networks to
`transformers` T5 (`hf_export.save_hf`, float32), loads them with `T5ForConditionalGeneration.from_pretrained`
and, in one process, on the same examples (`evaluation.task_examples`), interleaved example by example, times:

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
beside what its counted calls would cost at those prices (`model_time_per_token`): the rest is the loop and the
framework around the calls.

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

from specdec import benchmark
from specdec import checkpoints
from specdec import decoding
from specdec import evaluation
from specdec import hf_export
from specdec import models
from specdec import network
from specdec import profiling

INSTALL_HINT = "pip install -e '.[peers]'"
HF, OURS = 'hf', 'ours'
BASELINE = 'baseline'
SPECULATIVE, ADAPTIVE = 'speculative', 'speculative_adaptive'


def require_peers():
  """(torch, transformers), or an ImportError saying how to install them."""
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
    tokens = benchmark.num_tokens(decode, hf_export.EOS_ID)
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
    result = {'decode': decode.tolist(), 'tokens': benchmark.num_tokens(decode, eos_id)}
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


def run(target_dir: str, drafter_dir: str, task_name: str, split: str, lengths: Mapping[str, int],
        max_examples: Optional[int], gamma: int, temperatures: Sequence[float] = (0.0, 1.0),
        output_dir: str = 'results/peers', run_name: Optional[str] = None,
        hf_settings: Sequence[str] = ('constant', 'hf_default'), draft_confidence: float = 0.5,
        repeats: int = 1, seed: int = 0, length_buckets: bool = True, ours_batch_size: int = 0,
        torch_threads: Optional[int] = None, write_plot: bool = True, call_costs: bool = True,
        call_cost_examples: int = 4, call_cost_position: int = 10, call_cost_repeats: int = 5,
        call_cost_num_calls: int = 32, log: Callable[[str], None] = print) -> Dict[str, Any]:
  """Times HF generate / assisted generation against our baseline / speculative decoding; writes the report.

  Args:
    target_dir, drafter_dir: compact model directories (e.g. models/cpu/target, models/cpu/d1kd).
    task_name, split, lengths, max_examples: the examples (`evaluation.task_examples`; tasks must be
      registered, e.g. `tasks.register_local_tasks(corpus_dir)`).
    gamma: our γ, and HF's drafts per round in the 'constant' (and start of the 'heuristic') setting.
    temperatures: 0 (greedy) and/or 1 (sampling, top_k=0).
    output_dir, run_name: writes output_dir/<run_name>.{md,json,png}.
    hf_settings: names from ASSISTANT_SETTINGS.
    draft_confidence: our adaptive-drafting row's cut-off (0: no adaptive row).
    repeats: timed runs per example and system (median kept).
    length_buckets: pad our inputs to a bucket (benchmark.bucket_length); HF takes them unpadded.
    ours_batch_size: > 1 adds our baseline and speculative decoding at this batch size (HF's assisted
      generation is batch 1 only: compare with its batch-1 rows, i.e. HF at batch 1 × B).
    torch_threads: PyTorch's intra-op threads (default os.cpu_count(): as many as XLA's CPU client uses);
      restored when the run ends.
    call_costs: also time each framework's model calls by themselves (`measure_call_costs`) on the first
      `call_cost_examples` examples: encoders, 1-token and γ+1-token cached decoder calls with the decoder at
      `call_cost_position` (HF's cache holds that many positions), median of `call_cost_repeats` runs (ours:
      of `call_cost_num_calls` calls in one compiled scan each), warm-up and compilation excluded; the report
      then shows where each framework's time per token goes (`model_time_per_token`).

  Returns:
    The summary (also in <run_name>.json).
  """
  torch, transformers = require_peers()
  import seqio  # pylint: disable=g-import-not-at-top
  if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
    raise ValueError(f'gamma must be an int >= 1, got {gamma!r}.')
  if repeats < 1:
    raise ValueError(f'repeats must be >= 1, got {repeats}.')
  if call_costs and min(call_cost_examples, call_cost_repeats, call_cost_num_calls, call_cost_position) < 1:
    raise ValueError('call_cost_examples, call_cost_repeats, call_cost_num_calls and call_cost_position must be '
                     f'>= 1, got {call_cost_examples}, {call_cost_repeats}, {call_cost_num_calls}, '
                     f'{call_cost_position}.')
  bad = [t for t in temperatures if t not in (0.0, 1.0)]
  if bad or not temperatures:
    raise ValueError(f'temperatures must be 0 and/or 1 (greedy, plain sampling), got {list(temperatures)}.')
  settings = [assistant_setting(name, gamma) for name in hf_settings]
  run_name = run_name or f'{task_name}_{os.path.basename(os.path.normpath(drafter_dir))}_g{gamma}'

  xla_threads = os.cpu_count() or 1  # XLA's CPU client uses one thread per core
  examples = evaluation.task_examples(task_name, split, lengths, max_examples)
  if not examples:
    raise ValueError(f'{task_name}:{split} gave no examples.')
  vocab = seqio.get_mixture_or_task(task_name).output_features['targets'].vocabulary

  with (tempfile.TemporaryDirectory(prefix='specdec_peers_') as hf_root, _quiet_transformers(transformers),
        _torch_threads(torch, torch_threads or xla_threads)):
    target_module, target_params, hf_target = load_pair(torch, transformers, target_dir,
                                                        os.path.join(hf_root, 'target'))
    drafter_module, drafter_params, hf_drafter = load_pair(torch, transformers, drafter_dir,
                                                           os.path.join(hf_root, 'drafter'))
    if target_module.config.vocab_size != drafter_module.config.vocab_size:
      raise ValueError(f'Vocabulary mismatch: target vocab_size={target_module.config.vocab_size}, '
                       f'drafter vocab_size={drafter_module.config.vocab_size}.')
    counters = (CallCounter(hf_target), CallCounter(hf_drafter))
    batches = [b for _, b in benchmark.make_batches(examples, lengths, 1, length_buckets)]
    params = {'target': target_params, 'drafter': drafter_params}
    base_params = {'target': target_params}
    eos_id = int(vocab.eos_id)
    baseline_model, speculative_model = ours_models(target_module, drafter_module, vocab)
    records: Dict[str, List[Dict[str, Any]]] = {}
    systems_by_temperature = {}
    start = time.perf_counter()
    for temperature in temperatures:
      systems = [_hf_system(torch, hf_target, hf_drafter, counters, s, temperature, examples,
                            lengths['targets'], seed) for s in [None] + settings]
      ours = [(SPECULATIVE, 0.0)] + ([(ADAPTIVE, draft_confidence)] if draft_confidence else [])
      for name, confidence in [(BASELINE, 0.0)] + ours:
        setting = benchmark.Setting(gamma=gamma, temperature=temperature, topk=0, seed=seed,
                                    draft_confidence=confidence)
        if name == BASELINE:
          systems.append(_ours_system(name, baseline_model.compile_predict(setting.decoder_params()),
                                      base_params, batches, temperature, seed, setting.decoder_params(), eos_id))
        else:
          systems.append(_ours_system(name, speculative_model.compile_predict(setting.speculative_params()),
                                      params, batches, temperature, seed, setting.speculative_params(), eos_id))
      systems_by_temperature[temperature] = systems
      for i in range(len(examples)):
        per_system = {}
        for system in systems:  # HF: one untimed call; ours: compile + one untimed run per input shape
          system.warm_up(i)
        for _ in range(repeats):  # interleaved, so slow drifts of the machine hit every system alike
          for system in systems:
            seconds, result = system.run(i)
            per_system.setdefault(system.key, (result, []))[1].append(seconds)
        for key, (result, times) in per_system.items():
          records.setdefault(f'{temperature:g}/{key}', []).append(
              dict(result, index=i, seconds=float(np.median(times))))
      log(f'  t={temperature:g}: {len(examples)} examples, {time.perf_counter() - start:.0f} s so far')
    batch_rows = (time_ours_batched((baseline_model, speculative_model), params, examples, lengths, gamma,
                                     temperatures, seed, ours_batch_size, length_buckets, eos_id)
                  if ours_batch_size > 1 else [])
    for counter in counters:
      counter.remove()
    costs = None
    if call_costs:
      position = max(1, min(call_cost_position, lengths['targets'] - gamma - 1))
      first = records[f'{temperatures[0]:g}/{HF}:{BASELINE}']  # realistic decoder inputs: HF's own decode
      decoder_inputs = [hf_decoder_inputs(r['decode'], position + gamma + 1) for r in first]
      costs = measure_call_costs(torch, hf_target, hf_drafter, target_module, target_params, drafter_module,
                                 drafter_params, examples, batches, decoder_inputs,
                                 range(min(call_cost_examples, len(examples))), position, gamma,
                                 call_cost_repeats, call_cost_num_calls)
      log(f"  call costs: {len(costs['examples'])} examples, {time.perf_counter() - start:.0f} s so far")

  rows = [summarize_system(records[f'{t:g}/{s.key}'], s, t)
          for t, systems in systems_by_temperature.items() for s in systems]
  add_speedups(rows)
  if costs is not None:
    costs['per_token'] = [model_time_per_token(r, costs['ms'][r['framework']]) for r in rows]
  identity = {}
  if 0.0 in temperatures:
    identity = greedy_identity(records, target_module, target_params, examples, lengths)
    identity['constant_calls'] = greedy_constant_calls(records)
  summary = {
      'task': task_name, 'split': split, 'lengths': dict(lengths), 'examples': len(examples),
      'target': target_dir, 'drafter': drafter_dir, 'gamma': gamma, 'draft_confidence': draft_confidence,
      'repeats': repeats, 'seed': seed, 'rows': rows, 'ratios': ratios(rows), 'identity': identity,
      'batched': batch_rows, 'ours_batch_size': ours_batch_size, 'call_costs': costs,
      'threads': {'torch_num_threads': torch_threads or xla_threads, 'xla_cpu_threads': xla_threads},
      'versions': {'torch': torch.__version__, 'transformers': transformers.__version__,
                   'scikit_learn_available': _sklearn_available()},
      'machine': benchmark.machine_info(), 'date': datetime.datetime.now().isoformat(timespec='seconds'),
      'command': benchmark.run_command(), 'records': records,
  }
  write_outputs(output_dir, run_name, summary, write_plot)
  return summary


def time_ours_batched(decoders, params, examples, lengths, gamma, temperatures, seed, batch_size,
                      length_buckets, eos_id) -> List[Dict[str, Any]]:
  """Our baseline and fixed-γ speculative decoding at `batch_size` over all examples (sum of batch times).

  `decoders` is `ours_models(...)`; each batch runs once untimed (compile / warm-up), then once timed.
  """
  rows = []
  batches = benchmark.make_batches(examples, lengths, batch_size, length_buckets)
  for temperature in temperatures:
    setting = benchmark.Setting(gamma=gamma, temperature=temperature, topk=0, seed=seed)
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
        tokens += sum(benchmark.num_tokens(decodes[row], eos_id) for row in range(len(idx)))
      rows.append({'framework': OURS, 'system': f'{name}@batch{batch_size}', 'temperature': temperature,
                   'batch_size': batch_size, 'seconds': seconds, 'tokens': tokens,
                   'tokens_per_s': tokens / seconds})
  return rows


# ----------------------------------------------------------------------------------------------------------
# Per-call costs: where each framework's time goes.
# ----------------------------------------------------------------------------------------------------------

CALL_KINDS = ('target_encoder', 'target_step', 'target_verify', 'drafter_encoder', 'drafter_step')


def call_labels(gamma: int) -> Dict[str, str]:
  return {'target_encoder': 'target encoder', 'target_step': 'target decoder, 1 token (cached)',
          'target_verify': f'target decoder, verify: γ+1 = {gamma + 1} tokens (cached)',
          'drafter_encoder': 'drafter encoder', 'drafter_step': 'drafter decoder, 1 token (cached)'}


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


def _div(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return a / b if a is not None and b else None


def call_cost_ratios(ms: Mapping[str, Mapping[str, float]]) -> Dict[str, Dict[str, Optional[float]]]:
  """From {framework: {call kind: ms}}: HF ms / ours ms per call kind; verify / 1-token target step and
  c = drafter step / target step in each framework."""
  return {'hf_over_ours': {k: _div(ms[HF][k], ms[OURS][k]) for k in CALL_KINDS},
          'verify_over_step': {f: _div(ms[f]['target_verify'], ms[f]['target_step']) for f in (HF, OURS)},
          'c': {f: _div(ms[f]['drafter_step'], ms[f]['target_step']) for f in (HF, OURS)}}


def model_time_per_token(row: Mapping[str, Any], ms: Mapping[str, float]) -> Dict[str, Any]:
  """A summary row's measured ms per token beside what its model calls would cost at `ms` (its framework's
  per-call ms), per generated token; the rest is the loop and the framework around the calls.

  Calls: one target encoder call per example, and for a speculative row a drafter encoder call too; target
  calls (`target_calls`) at the 1-token step cost (baselines) or the γ+1-token verify cost (speculative rows;
  their mean width is `target_call_tokens`); drafter calls at the drafter step cost, HF's as counted
  (`drafter_calls_per_example`), ours one per draft (`drafted`).
  """
  speculative = row['system'] != BASELINE
  n, tokens = row['examples'], row['tokens']
  if speculative:
    drafter_calls = row.get('drafter_calls_per_example', row.get('drafted', 0) / n) * n
  else:
    drafter_calls = 0
  encoders = n * (ms['target_encoder'] + (ms['drafter_encoder'] if speculative else 0.0))
  target = row['target_calls'] * ms['target_verify' if speculative else 'target_step']
  drafter = drafter_calls * ms['drafter_step']
  measured = _div(1000 * row['seconds'], tokens)
  model = _div(encoders + target + drafter, tokens)
  overhead = measured - model if measured is not None and model is not None else None
  return {'temperature': row['temperature'], 'framework': row['framework'], 'system': row['system'],
          'measured_ms_per_token': measured, 'encoders_ms_per_token': _div(encoders, tokens),
          'target_ms_per_token': _div(target, tokens), 'drafter_ms_per_token': _div(drafter, tokens),
          'model_ms_per_token': model, 'overhead_ms_per_token': overhead,
          'overhead_share': _div(overhead, measured),
          'target_call_tokens': (1.0 + row.get('drafted_per_target_call', 0.0)) if speculative else 1.0,
          'drafter_calls_per_example': drafter_calls / n}


def constant_pair_breakdown(per_token: Sequence[Mapping[str, Any]],
                            pairs: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
  """For each ours 'speculative' vs HF 'assisted:constant' pair of `ratios`: the tokens/s ratio beside the
  ratio of their model-call ms per token and each one's ms per token outside the calls."""
  by = {(r['framework'], r['system'], r['temperature']): r for r in per_token}
  out = []
  for p in pairs:
    if p['ours'] != SPECULATIVE or p['hf'] != 'assisted:constant':
      continue
    ours, hf = by.get((OURS, SPECULATIVE, p['temperature'])), by.get((HF, 'assisted:constant', p['temperature']))
    if ours and hf:
      out.append({'temperature': p['temperature'], 'ratio': p['ratio'],
                  'model_ratio': _div(hf['model_ms_per_token'], ours['model_ms_per_token']),
                  'hf': hf, 'ours': ours})
  return out


def call_cost_sentences(call_costs: Mapping[str, Any], pairs: Sequence[Mapping[str, Any]],
                        gamma: int) -> List[str]:
  """The section's prose, from the numbers: per-call HF / ours, c and verify / step in each framework, and for
  the fixed-γ pair at the first temperature, how much of each side's time per token is its model calls."""
  ms, r = call_costs['ms'], call_costs['ratios']
  x = lambda v: fmt(v, '.1f')
  lines = [
      f"HF's 1-token target step costs {x(r['hf_over_ours']['target_step'])}× ours ({ms[HF]['target_step']:.2f} "
      f"vs {ms[OURS]['target_step']:.2f} ms), its {gamma + 1}-token verify call "
      f"{x(r['hf_over_ours']['target_verify'])}× and its drafter step {x(r['hf_over_ours']['drafter_step'])}× "
      f"ours; c (drafter step / target step) is {fmt(r['c'][HF])} in HF and {fmt(r['c'][OURS])} in ours, and a "
      f"verify call costs {fmt(r['verify_over_step'][HF])}× a 1-token step in HF and "
      f"{fmt(r['verify_over_step'][OURS])}× in ours."]
  breakdown = constant_pair_breakdown(call_costs.get('per_token', []), pairs)
  if breakdown:
    b = breakdown[0]
    hf, ours = b['hf'], b['ours']
    pct = lambda v: fmt(None if v is None else 100 * v, '.0f')
    lines.append(
        f"At t = {b['temperature']:g}, ours speculative makes {fmt(b['ratio'])}× HF assisted:constant's tokens/s; "
        f"their model calls alone take {fmt(hf['model_ms_per_token'])} vs {fmt(ours['model_ms_per_token'])} ms "
        f"per token ({fmt(b['model_ratio'])}×), and the time outside the calls is "
        f"{fmt(hf['overhead_ms_per_token'])} ms per token for HF ({pct(hf['overhead_share'])}% of its time) vs "
        f"{fmt(ours['overhead_ms_per_token'])} ms for ours ({pct(ours['overhead_share'])}%).")
  return lines


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
          'ours_calls_per_repeat': num_calls, 'ms': ms, 'ratios': call_cost_ratios(ms),
          'per_example_ms': per_example}


def hf_decoder_inputs(decode_l: Sequence[int], length: int) -> np.ndarray:
  """[decoder start (0), decoded tokens...] zero-padded (or cut) to `length`: the decoder inputs of a decode."""
  row = np.zeros(length, np.int64)
  tokens = np.asarray(decode_l, np.int64)[:length - 1]
  row[1:1 + len(tokens)] = tokens
  return row


# ----------------------------------------------------------------------------------------------------------
# Summaries.
# ----------------------------------------------------------------------------------------------------------


def summarize_system(records: Sequence[Mapping[str, Any]], system: System, temperature: float) -> Dict[str, Any]:
  """One row: totals, tokens/s and call counts of a system over the examples."""
  seconds = float(sum(r['seconds'] for r in records))
  tokens = int(sum(r['tokens'] for r in records))
  calls = int(sum(r['target_calls'] for r in records))
  n = len(records)
  row = {'framework': system.framework, 'system': system.name, 'temperature': temperature,
         'settings': dict(system.settings), 'examples': n, 'seconds': seconds, 'tokens': tokens,
         'tokens_per_s': tokens / seconds if seconds else 0.0,
         'ms_per_example_median': 1000 * float(np.median([r['seconds'] for r in records])),
         'target_calls': calls, 'target_calls_per_example': calls / n,
         'tokens_per_target_call': tokens / calls if calls else 0.0}
  if 'drafted' in records[0] and system.name != BASELINE:
    drafted = int(sum(r['drafted'] for r in records))
    accepted = int(sum(r['accepted'] for r in records))
    row.update(drafted=drafted, accepted=accepted, accepted_per_drafted=accepted / drafted if drafted else 0.0,
               drafted_per_target_call=drafted / calls if calls else 0.0)
    if 'judged' in records[0]:  # ours: α as benchmark.py reports it (accepted / judged inside the loop)
      judged = int(sum(r['judged'] for r in records))
      in_loop = int(sum(r['accepted_in_loop'] for r in records))
      row.update(judged=judged, alpha_accept=in_loop / judged if judged else 0.0)
  if 'drafter_calls' in records[0] and system.name != BASELINE:
    row['drafter_calls_per_example'] = sum(r['drafter_calls'] for r in records) / n
  return row


def add_speedups(rows: List[Dict[str, Any]]) -> None:
  """speedup = own framework's baseline seconds / this row's seconds, at the same temperature."""
  baselines = {(r['framework'], r['temperature']): r['seconds'] for r in rows if r['system'] == BASELINE}
  for r in rows:
    base = baselines.get((r['framework'], r['temperature']))
    r['speedup_vs_own_baseline'] = base / r['seconds'] if base and r['seconds'] else None


def ratios(rows: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
  """ours / HF tokens/s for matched pairs: baselines, and each HF assisted setting against our speculative
  row of the same kind (fixed γ against 'constant', adaptive against the adaptive HF schedules)."""
  by = {(r['framework'], r['system'], r['temperature']): r for r in rows}
  out = []
  for r in rows:
    if r['framework'] != HF:
      continue
    t = r['temperature']
    if r['system'] == BASELINE:
      ours_name = BASELINE
    elif r['system'] == 'assisted:constant' or (OURS, ADAPTIVE, t) not in by:
      ours_name = SPECULATIVE
    else:
      ours_name = ADAPTIVE
    ours = by.get((OURS, ours_name, t))
    if ours:
      out.append({'temperature': t, 'ours': ours_name, 'hf': r['system'],
                  'ours_tokens_per_s': ours['tokens_per_s'], 'hf_tokens_per_s': r['tokens_per_s'],
                  'ratio': ours['tokens_per_s'] / r['tokens_per_s'] if r['tokens_per_s'] else None})
  return out


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


def greedy_constant_calls(records: Mapping[str, Sequence[Mapping[str, Any]]]) -> Optional[Dict[str, Any]]:
  """Greedy, γ drafts every round: HF's target calls per example beside ours (None without both rows).

  With the same drafter network, the same outputs and exact greedy verification both frameworks would run
  the same rounds; examples where the counts differ drafted differently.
  """
  hf, ours = records.get(f'0/{HF}:assisted:constant'), records.get(f'0/{OURS}:{SPECULATIVE}')
  if not hf or not ours:
    return None
  return {'examples': len(hf),
          'same_target_calls': sum(a['target_calls'] == b['target_calls'] for a, b in zip(hf, ours)),
          'hf_target_calls': [r['target_calls'] for r in hf], 'ours_target_calls': [r['target_calls'] for r in ours],
          'hf_accepted': [r['accepted'] for r in hf], 'ours_accepted': [r['accepted'] for r in ours]}


# ----------------------------------------------------------------------------------------------------------
# Outputs.
# ----------------------------------------------------------------------------------------------------------

CALLS_NOTE = (
    "Target calls differ between the frameworks for reasons other than speed: both count one target call per "
    "round (the encoder is not counted), but HF's drafter stops a round at its own EOS and, in 'hf_default', "
    "after a draft it gives < the confidence cut-off (up to 20 drafts), while ours drafts γ every round "
    "(adaptive: stops below draft_confidence, at most γ); HF caps the last round's drafts at the length budget; "
    "at temperature 1 the two frameworks draw different random numbers, so their samples (and lengths) "
    "differ. Greedy with 'constant' and the same outputs, both would run the same rounds if both drafted the "
    "drafter's greedy continuation (see above).")


DRAFTS_NOTE = (
    "With one drafter network, identical outputs and exact greedy checks, different counts mean different "
    "drafts. Observed with transformers 5.24: after a round that rejected a draft, HF's assistant drafts are not "
    "always the drafter's greedy continuation of the accepted prefix (its `generate` reusing the cropped T5 "
    "cache returns other tokens from the third step on than a fresh-cache `generate` of the same prefix); ours "
    "match a teacher-forced replay of Algorithm 1 with the drafter network.")


def fmt(x, spec='.2f', none='-'):
  return none if x is None else format(x, spec)


def markdown(summary: Mapping[str, Any]) -> str:
  s = summary
  m = s['machine']
  lines = [
      f"# Peer benchmark: specdec vs Hugging Face assisted generation, {s['task']}:{s['split']}",
      '',
      f"{s['date']} · {m['processor']}, {m['cpu_count']} CPUs · jax {m['jax']} ({m['backend']}), torch "
      f"{s['versions']['torch']}, transformers {s['versions']['transformers']} · threads: torch "
      f"{s['threads']['torch_num_threads']}, XLA {s['threads']['xla_cpu_threads']} · `{s['command']}`",
      '',
      f"Target `{s['target']}`, drafter `{s['drafter']}`, γ = {s['gamma']}, our adaptive drafting at "
      f"{s['draft_confidence']:g}; {s['examples']} examples at batch 1 (lengths {s['lengths']}), each example's "
      f"time the median of {s['repeats']} run(s), warm-up excluded; the same float32 weights in both "
      f"frameworks (exported with `specdec.hf_export`).",
      '',
      '| t | framework | system | settings | tokens/s | speedup vs own baseline | ms/example (median) | '
      'target calls/example | tokens/target call | accepted/drafted | drafts/call |',
      '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in s['rows']:
    settings = ', '.join(f'{k}={v}' for k, v in r['settings'].items() if k != 'temperature')
    lines.append(
        f"| {r['temperature']:g} | {r['framework']} | {r['system']} | {settings} | {r['tokens_per_s']:.0f} | "
        f"{fmt(r['speedup_vs_own_baseline'])}× | {r['ms_per_example_median']:.1f} | "
        f"{r['target_calls_per_example']:.1f} | {r['tokens_per_target_call']:.2f} | "
        f"{fmt(r.get('accepted_per_drafted'), '.3f')} | {fmt(r.get('drafted_per_target_call'))} |")
  lines += ['', '## ours / HF tokens/s', '', '| t | ours | HF | ours tokens/s | HF tokens/s | ratio |',
            '|---|---|---|---|---|---|']
  lines += [f"| {p['temperature']:g} | {p['ours']} | {p['hf']} | {p['ours_tokens_per_s']:.0f} | "
            f"{p['hf_tokens_per_s']:.0f} | **{fmt(p['ratio'])}×** |" for p in s['ratios']]
  if s.get('call_costs'):
    lines += ['', CALL_COSTS_HEADING, ''] + call_costs_markdown(s['call_costs'], s['ratios'], s['gamma'])
  if s['batched']:
    hf_base = {r['temperature']: r for r in s['rows'] if r['framework'] == HF and r['system'] == BASELINE}
    lines += ['', f"## Ours at batch {s['ours_batch_size']} vs HF at batch 1 × {s['ours_batch_size']} "
              '(HF assisted generation is batch 1 only)', '',
              '| t | system | tokens/s | HF baseline at batch 1, tokens/s |', '|---|---|---|---|']
    lines += [f"| {b['temperature']:g} | {b['system']} | {b['tokens_per_s']:.0f} | "
              f"{hf_base[b['temperature']]['tokens_per_s']:.0f} |" for b in s['batched']]
  if s['identity']:
    ident = s['identity']
    lines += ['', '## Greedy outputs', '',
              f"HF greedy vs specdec greedy (baselines): **{100 * ident['hf_vs_ours_baseline']:.1f}%** identical "
              f"({s['examples'] - len(ident['mismatches'])}/{s['examples']}).", '']
    lines += [f'- {k}: {100 * v:.1f}% identical' for k, v in ident['speculative_vs_baseline'].items()]
    calls = ident.get('constant_calls')
    if calls:
      lines += ['', f"Greedy, γ drafts every round (HF 'constant' vs ours 'speculative'): the same number of target "
                f"calls on {calls['same_target_calls']}/{calls['examples']} examples (HF "
                f"{sum(calls['hf_target_calls'])}, ours {sum(calls['ours_target_calls'])} in all; drafts kept: HF "
                f"{sum(calls['hf_accepted'])}, ours {sum(calls['ours_accepted'])}). {DRAFTS_NOTE}"]
    if ident['mismatches']:
      lines += ['', '| example | position | ours token | HF token | logit margin (ours − HF) | top-2 gap |',
                '|---|---|---|---|---|---|']
      lines += [f"| {x['index']} | {x['position']} | {x['ours_token']} | {x['hf_token']} | {x['margin']:.2e} | "
                f"{x['top2_gap']:.2e} |" for x in ident['mismatches']]
  lines += ['', '## Notes', '', CALLS_NOTE, '',
            f"HF's assistant confidence cut-off is re-fitted during generation only with scikit-learn installed "
            f"(here: {'yes' if s['versions']['scikit_learn_available'] else 'no, so it stays fixed'})."]
  return '\n'.join(lines) + '\n'


CALL_COSTS_HEADING = '## Where the time goes (per-call costs, batch 1)'


def call_costs_markdown(call_costs: Mapping[str, Any], pairs: Sequence[Mapping[str, Any]],
                        gamma: int) -> List[str]:
  """The per-call table, the prose computed from it, and each row's ms per token split into model calls and
  the rest."""
  c = call_costs
  ms, r = c['ms'], c['ratios']
  labels = call_labels(gamma)
  lines = [f"Each model call timed by itself on examples {c['examples']} (median over them of each one's "
           f"median of {c['repeats']} runs, warm-up and compilation excluded), the same float32 weights. HF: the "
           f"torch model called directly under `torch.inference_mode()`, the decoder's cache holding "
           f"{c['position']} positions (cropped back after each timed call). Ours: the jitted calls as our decode "
           f"loops run them, {c['ours_calls_per_repeat']} per run inside one compiled `lax.scan` "
           f"(`profiling.time_decode_calls`; our cache has the decode length, so the position does not matter).",
           '', '| call | HF ms | ours ms | HF / ours |', '|---|---|---|---|']
  lines += [f"| {labels[k]} | {ms[HF][k]:.3f} | {ms[OURS][k]:.3f} | {fmt(r['hf_over_ours'][k])}× |"
            for k in CALL_KINDS]
  lines += [f"| verify / 1-token target step | {fmt(r['verify_over_step'][HF])} | "
            f"{fmt(r['verify_over_step'][OURS])} | |",
            f"| c = drafter step / target step | {fmt(r['c'][HF])} | {fmt(r['c'][OURS])} | |"]
  lines += [''] + call_cost_sentences(c, pairs, gamma)
  lines += ['', 'Per generated token: the measured time (main table) beside what the counted calls cost at the '
            'prices above (encoders once per example; target calls as 1-token steps in baselines, as '
            f'{gamma + 1}-token verify calls in speculative rows, whatever their width; drafter calls: HF as '
            'counted, ours one per draft); the rest is the decode loop and the framework around the calls.', '',
            '| t | framework | system | ms/token measured | encoders | target calls | drafter calls | model calls '
            'in all | rest (loop, framework) | rest share | target call width (mean tokens) | '
            'drafter calls/example |', '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for t in c.get('per_token', []):
    share = None if t['overhead_share'] is None else 100 * t['overhead_share']
    lines.append(
        f"| {t['temperature']:g} | {t['framework']} | {t['system']} | {fmt(t['measured_ms_per_token'], '.3f')} | "
        f"{fmt(t['encoders_ms_per_token'], '.3f')} | {fmt(t['target_ms_per_token'], '.3f')} | "
        f"{fmt(t['drafter_ms_per_token'], '.3f')} | {fmt(t['model_ms_per_token'], '.3f')} | "
        f"{fmt(t['overhead_ms_per_token'], '.3f')} | {fmt(share, '.0f')}% | {t['target_call_tokens']:.2f} | "
        f"{t['drafter_calls_per_example']:.1f} |")
  lines += ['', "Not in either side's encoder or step costs: the cross-attention keys and values of the encoded "
            "input (HF computes them in its first decoder call, ours when it sets up the cache). A negative rest "
            "means the calls cost less inside the decode than timed alone: timing noise, verify calls narrower "
            "than γ+1 tokens, or (HF, whose cache grows) decoding mostly at shorter positions than the one timed."]
  return lines


def plot(path: str, summary: Mapping[str, Any]) -> None:
  """Tokens/s per system, one group of bars per temperature."""
  plt = benchmark.pyplot()
  rows = summary['rows']
  temperatures = sorted({r['temperature'] for r in rows})
  names = list(dict.fromkeys(f"{r['framework']}:{r['system']}" for r in rows))
  fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4))
  width = 0.8 / len(temperatures)
  for j, t in enumerate(temperatures):
    by = {f"{r['framework']}:{r['system']}": r['tokens_per_s'] for r in rows if r['temperature'] == t}
    ax.bar(np.arange(len(names)) + j * width, [by.get(n, np.nan) for n in names], width, label=f't = {t:g}')
  ax.set_xticks(np.arange(len(names)) + width * (len(temperatures) - 1) / 2)
  ax.set_xticklabels(names, rotation=30, ha='right')
  ax.set_ylabel('tokens/s (batch 1)')
  ax.set_title(f"{summary['task']}, γ={summary['gamma']}: specdec vs HF assisted generation")
  ax.legend()
  benchmark.save_png(fig, path)


def write_outputs(output_dir: str, run_name: str, summary: Mapping[str, Any], write_plot: bool = True) -> None:
  """<run_name>.json, .md (and .png), each written atomically."""
  base = os.path.join(output_dir, run_name)
  checkpoints.atomic_write(base + '.json', json.dumps(summary, indent=2, allow_nan=False).encode())
  checkpoints.atomic_write(base + '.md', markdown(summary).encode())
  if write_plot:
    plot(base + '.png', summary)
