"""The accelerator check: what the paper measured, measured on whatever backend JAX has, in one budgeted run.

No trained weights are needed for any of it: the T5 1.1 shapes (`network.PRESETS`, the sizes of T5X's
t5_1_1 gin files and of `gin/models/`) get random bfloat16 weights (`random_params`), and the speed of a
call, of a round and of a controlled-acceptance decode does not depend on what the weights say.

The parts, each a key of the state file, run in this order (`plan`), the largest target that fits first:

  curve:<target>:<batch>  the target's verify-cost curve, k = 1..max_tokens tokens a call, each width in one
                          compiled scan (`profiling.verify_cost_curve`)
  costs:<target>          c of Def. 3.7 in isolation: one drafter call over one target call, every drafter
                          and the target interleaved (`profiling.fastest_interleaved`); the drafters are the
                          paper's T5 sizes smaller than the target (small, base, large), a feature head of the
                          target's width, and the bigram and trigram tables
  ceiling:<target>        (the largest target only) the oracle drafter of controlled acceptance
                          (`specdec/bench/oracle.py`) on the target's own greedy decodes of random inputs, α* × γ,
                          batch 1, interleaved with the baseline (`ceiling.measure`)
  in_loop:<target>        c inside the compiled loop: one draft step at `cost_gamma` over one baseline round
                          (`profiling.time_phases`)
  tests                   the loop's own test files (decoding, sampling, models) run on this backend
                          (`run_tests`)

A shape whose params and caches do not fit the device's memory (`memory_plan`, from `memory.py`'s abstract
shapes) is skipped, and the report says so. One time budget covers the run: a part starts only while time is
left (the tests keep their share), so the run may overrun by the part in flight and no more. Every finished
part is saved at once (atomically), so a cut-off or killed run resumes where it stopped and still reports.
"""

import dataclasses
import datetime
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec.bench import ceiling
from specdec import feature_drafter
from specdec import fileio
from specdec import memory
from specdec import network
from specdec import ngram
from specdec.bench import profiling
from specdec.bench import reporting
from specdec import theory

SHAPES = ('small', 'base', 'large', 'xl', 'xxl')
# The paper's drafter sizes (its Tables 2 and 4): a target is measured against those smaller than it.
DRAFTER_SHAPES = ('small', 'base', 'large')
# `--shapes tiny`: a two-layer target and a one-layer drafter, for CPU runs and tests.
TINY_SHAPES = ('tiny_drafter', 'tiny')
PARAM_DTYPE = jnp.bfloat16
# The share of the device's memory a shape may plan to use: XLA needs room for temporaries and programs.
MEMORY_HEADROOM = 0.9
EOS_ID = 1
# The test files that check the loop (exactness of the math and of whole decodes).
TEST_FILES = ('tests/decoding_test.py', 'tests/sampling_test.py', 'tests/models_test.py')
# What the paper reports for T5-XXL with T5-small on En→De, greedy (Table 2), to compare with.
PAPER_REFERENCE = {'speedup': 3.4, 'alpha': 0.75, 'gamma': 7, 'drafter': 'small', 'chip': 'TPU-v4'}
# The acceptance rate the summary line states a speedup at.
SUMMARY_ALPHA = 0.8
# Trigram contexts in the random trigram table (a trained one holds about this many).
TRIGRAM_CONTEXTS = 65536


def shape_config(name: str) -> network.T5Config:
  """The T5 1.1 config of shape `name` (SHAPES or TINY_SHAPES) in bfloat16, without dropout."""
  if name == 'tiny_drafter':
    return network.T5Config(vocab_size=network.PRESETS['tiny'].vocab_size, dtype=PARAM_DTYPE, emb_dim=16,
                            num_heads=2, head_dim=8, num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
                            dropout_rate=0.0)
  if name not in SHAPES and name != 'tiny':
    raise ValueError(f'unknown shape {name!r}; choose from {SHAPES} or tiny.')
  return network.t5_1_1_config(name, dtype=PARAM_DTYPE, dropout_rate=0.0)


def head_config(target: network.T5Config) -> feature_drafter.FeatureHeadConfig:
  """A feature head of the target's width (EAGLE's: one decoder layer of the target's own sizes)."""
  return feature_drafter.FeatureHeadConfig(
      feature_dim=target.emb_dim, vocab_size=target.vocab_size, width=target.emb_dim, num_layers=1,
      num_heads=target.num_heads, head_dim=target.head_dim, mlp_dim=target.mlp_dim, dtype=PARAM_DTYPE)


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one check measures. Everything here is part of the run's identity: a state file of other settings
  is refused, never mixed in."""
  shapes: Tuple[str, ...] = SHAPES
  batch_sizes: Tuple[int, ...] = (1, 8)
  max_tokens: int = 16
  input_length: int = 64
  decode_length: int = 32
  num_calls: int = 16
  repeats: int = 3
  alphas: Tuple[float, ...] = (0.6, 0.7, 0.8, 0.9)
  gammas: Tuple[int, ...] = (2, 3, 5, 7)
  ceiling_examples: int = 32
  cost_gamma: int = 5
  seed: int = 0

  def validate(self) -> None:
    known = set(SHAPES) | set(TINY_SHAPES)
    if not self.shapes or set(self.shapes) - known:
      raise ValueError(f'shapes must be a non-empty subset of {sorted(known)}, got {self.shapes!r}.')
    if (set(self.shapes) & set(TINY_SHAPES)) and (set(self.shapes) & set(SHAPES)):
      raise ValueError('tiny shapes (a vocabulary of 128) and T5 1.1 shapes (32128) cannot be mixed: '
                       'a drafter must share its target\'s vocabulary.')
    for name in ('max_tokens', 'input_length', 'decode_length', 'num_calls', 'repeats', 'ceiling_examples',
                 'cost_gamma'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be an integer >= 1, got {value!r}.')
    if not self.batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                   for b in self.batch_sizes):
      raise ValueError(f'batch_sizes must be integers >= 1, got {self.batch_sizes!r}.')
    if self.max_tokens >= self.decode_length:
      raise ValueError(f'max_tokens ({self.max_tokens}) must be below decode_length ({self.decode_length}).')
    if self.cost_gamma + 1 > self.max_tokens:
      raise ValueError(f'cost_gamma + 1 ({self.cost_gamma + 1}) must be within max_tokens ({self.max_tokens}).')
    ceiling.Settings(alphas=self.alphas, gammas=self.gammas, batch_sizes=(1,), repeats=self.repeats,
                     seed=self.seed, max_verify_tokens=self.max_tokens).validate()

  def lengths(self) -> Dict[str, int]:
    return {'inputs': self.input_length, 'targets': self.decode_length}


# ----------------------------------------------------------------------------------------------------------
# Shapes, memory and random weights.
# ----------------------------------------------------------------------------------------------------------


def device_memory_bytes() -> Tuple[int, str]:
  """(bytes the first device may hold, where the figure comes from): the allocator's limit on an accelerator,
  the machine's physical memory on a CPU."""
  stats = None
  try:
    stats = jax.local_devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except  (a backend without memory statistics)
    stats = None
  if stats and stats.get('bytes_limit'):
    return int(stats['bytes_limit']), 'device memory_stats bytes_limit'
  return int(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')), 'physical memory'


def drafter_shapes(target: str, shapes: Sequence[str]) -> List[str]:
  """The T5 drafter shapes measured against `target`: the paper's drafter sizes (or the tiny drafter) among
  `shapes` that are smaller than it, smallest first."""
  order = list(TINY_SHAPES) if target in TINY_SHAPES else list(SHAPES)
  allowed = ('tiny_drafter',) if target in TINY_SHAPES else DRAFTER_SHAPES
  return [s for s in order[:order.index(target)] if s in shapes and s in allowed]


def _ngram_bytes(vocab_size: int) -> int:
  """The bigram's [V, V] float32 table (the trigram shares it) and the trigram's contexts."""
  return vocab_size * vocab_size * 4 + TRIGRAM_CONTEXTS * (4 + 8 * 8)


def shape_bytes(name: str, batch_size: int, settings: Settings) -> Dict[str, int]:
  """Bytes of shape `name`'s bfloat16 params and of its decode caches at `batch_size` rows."""
  config = shape_config(name)
  cache_len = settings.decode_length + settings.max_tokens + 2
  return {'params': memory.total_bytes(memory.abstract_params(config), PARAM_DTYPE),
          'caches': memory.total_bytes(memory.abstract_cache(config, batch_size, settings.input_length,
                                                             cache_len))}


def memory_plan(settings: Settings, limit_bytes: int) -> Dict[str, Dict[str, Any]]:
  """{shape: its bytes, what it needs as a target (its params, caches at the largest batch and its drafters:
  T5 sizes, the feature head, the n-gram tables) and whether that fits within MEMORY_HEADROOM of
  `limit_bytes`}. A shape too large as a target may still serve as a drafter."""
  plan = {}
  largest = max(settings.batch_sizes)
  for name in settings.shapes:
    own = shape_bytes(name, largest, settings)
    config = shape_config(name)
    head = memory.total_bytes(jax.eval_shape(functools.partial(feature_drafter.init_params,
                                                               head_config(config)), jax.random.PRNGKey(0)),
                              PARAM_DTYPE)
    drafters = sum(shape_bytes(d, 1, settings)['params'] + shape_bytes(d, 1, settings)['caches']
                   for d in drafter_shapes(name, settings.shapes))
    needed = own['params'] + own['caches'] + drafters + head + _ngram_bytes(config.vocab_size)
    fits = needed <= MEMORY_HEADROOM * limit_bytes
    plan[name] = {'params_bytes': own['params'], 'cache_bytes': own['caches'], 'needed_bytes': needed,
                  'num_params': sum(math.prod(x.shape) for x in
                                    jax.tree_util.tree_leaves(memory.abstract_params(config))),
                  'fits': fits}
    if not fits:
      plan[name]['reason'] = (f'needs {needed / 2**30:.1f} GiB as a target (params, caches at batch {largest}, '
                              f'drafters), over {MEMORY_HEADROOM:.0%} of the {limit_bytes / 2**30:.1f} GiB '
                              'the device holds')
  return plan


@functools.partial(jax.jit, static_argnums=(1, 2))
def _normal(key, shape, dtype, std):
  return (jax.random.normal(key, shape, jnp.float32) * std).astype(dtype)


# The embedding's scale in random weights. With T5's own initialiser (N(0, 1)) a random network is as unsure
# as a network can be: its top two logits lie about 0.2 standard deviations apart, and a k-token verify call,
# rounded otherwise than k one-token calls in bfloat16, flips the argmax at a few percent of positions. The
# speculative decode then leaves the baseline's greedy path and the oracle's drafts, read off that path, stop
# being accepted (measured at base shape: α 0.10 for α* 0.9, no decode identical). A large embedding makes the
# residual stream, and so the argmax, follow the input token, which both calls round alike (α 0.86, every
# decode identical at 3000); the calls do the same work at any scale.
EMBEDDING_STD = 3000.0


def random_params(abstract_tree: Any, seed: int, dtype=PARAM_DTYPE) -> Any:
  """Random params of a tree of ShapeDtypeStructs: RMS-norm scales (1-D) ones, embeddings N(0, EMBEDDING_STD²),
  every other matrix N(0, 1/fan_in) (its first dimension), so each layer's output stays O(1) through any depth,
  in `dtype`. Leaf by leaf, so nothing larger than the params themselves is ever allocated."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract_tree)
  keys = jax.random.split(jax.random.PRNGKey(seed), max(len(leaves), 1))
  out = []
  for (path, leaf), key in zip(leaves, keys):
    shape = tuple(leaf.shape)
    if len(shape) <= 1:
      out.append(jnp.ones(shape, dtype))
    else:
      std = EMBEDDING_STD if 'embedding' in jax.tree_util.keystr(path) else float(shape[0]) ** -0.5
      out.append(_normal(key, shape, dtype, std))
  return jax.tree_util.tree_unflatten(treedef, out)


def t5_params(name: str, seed: int):
  """(module, random bfloat16 params) of T5 shape `name`."""
  config = shape_config(name)
  return network.Transformer(config), random_params(memory.abstract_params(config), seed)


def head_params(target: network.T5Config, seed: int):
  """(feature head of the target's width, random bfloat16 params)."""
  config = head_config(target)
  abstract = jax.eval_shape(functools.partial(feature_drafter.init_params, config), jax.random.PRNGKey(0))
  return feature_drafter.FeatureHead(config), random_params(abstract, seed)


def ngram_params(vocab_size: int, seed: int):
  """{'bigram': (module, params), 'trigram': (module, params)}: random tables of the target's vocabulary. The
  trigram's backoff is the bigram's table (one array, held once); its contexts are sorted random keys."""
  rng = np.random.default_rng(seed)
  table = _normal(jax.random.PRNGKey(seed), (vocab_size, vocab_size), jnp.float32, 1.0)
  contexts = min(TRIGRAM_CONTEXTS, vocab_size * vocab_size)
  keys = np.sort(rng.choice(vocab_size * vocab_size, size=contexts, replace=False)).astype(np.int32)
  top_k = min(8, vocab_size)
  trigram_config = ngram.NgramConfig(vocab_size=vocab_size, order=3, top_k=top_k, num_contexts=contexts)
  trigram = {'log_probs': table, 'context_keys': jnp.asarray(keys),
             'next_ids': jnp.asarray(rng.integers(2, vocab_size, size=(contexts, top_k)), jnp.int32),
             'next_counts': jnp.asarray(rng.integers(1, 5, size=(contexts, top_k)), jnp.float32)}
  return {'bigram': (ngram.NgramLM(ngram.NgramConfig(vocab_size=vocab_size, order=2)), {'log_probs': table}),
          'trigram': (ngram.NgramLM(trigram_config), trigram)}


def random_inputs(rows: int, length: int, vocab_size: int, seed: int) -> np.ndarray:
  """Encoder inputs [rows, length] of random ids in [2, V) (no padding, no EOS)."""
  return np.random.default_rng(seed).integers(2, vocab_size, size=(rows, length)).astype(np.int32)


# ----------------------------------------------------------------------------------------------------------
# The parts.
# ----------------------------------------------------------------------------------------------------------


def by_size(shapes: Sequence[str]) -> List[str]:
  """Shapes largest first."""
  shapes = list(shapes)
  order = list(TINY_SHAPES) + list(SHAPES)
  return sorted(shapes, key=order.index, reverse=True)


def plan(settings: Settings, fitting: Sequence[str], with_tests: bool) -> List[str]:
  """The part keys in the order they run. First each target, largest first, at batch 1: its verify curve, its
  drafters' c (where it has a T5 drafter among the measured shapes, or is the largest), the ceiling (the
  largest only) and the in-loop c; then every target's curves at the other batch sizes; the tests last. So the
  paper's figures (the largest target's curve, Table 4's c, the ceiling) come first within any budget."""
  keys = []
  targets = by_size(fitting)
  first, *rest = settings.batch_sizes
  for n, target in enumerate(targets):
    keys.append(f'curve:{target}:{first}')
    with_costs = n == 0 or drafter_shapes(target, fitting)
    if with_costs:
      keys.append(f'costs:{target}')
    if n == 0:
      keys.append(f'ceiling:{target}')
    if with_costs:
      keys.append(f'in_loop:{target}')
  keys += [f'curve:{target}:{b}' for target in targets for b in rest]
  if with_tests:
    keys.append('tests')
  return keys


class _Models:
  """Random-weight models, each made once and released when no later part reads it."""

  def __init__(self, settings: Settings):
    self.settings = settings
    self._made: Dict[str, Any] = {}

  def target(self, name: str):
    if name not in self._made:
      self._made[name] = t5_params(name, self.settings.seed + 10 + list(TINY_SHAPES + SHAPES).index(name))
    return self._made[name]

  def drafters(self, target: str, fitting: Sequence[str]) -> Dict[str, Tuple[Any, Any]]:
    """{drafter name: (module, params)} measured against `target`: `drafter_shapes`, a feature head of its
    width, the bigram and trigram tables (shared by every target: one vocabulary)."""
    module, _ = self.target(target)
    out = {name: self.target(name) for name in drafter_shapes(target, fitting)}
    key = f'head:{target}'
    if key not in self._made:
      self._made[key] = head_params(module.config, self.settings.seed + 1)
    out['head'] = self._made[key]
    if 'ngrams' not in self._made:
      self._made['ngrams'] = ngram_params(module.config.vocab_size, self.settings.seed + 2)
    out.update(self._made['ngrams'])
    return out

  def release(self, target: str) -> None:
    """Drops a target no later part reads, and its head (its memory is freed once unreferenced); drafter
    shapes stay, as later targets read them."""
    if target not in DRAFTER_SHAPES and target not in TINY_SHAPES:
      self._made.pop(target, None)
    self._made.pop(f'head:{target}', None)


def measure_curve(models: _Models, target: str, batch_size: int, settings: Settings) -> Dict[str, Any]:
  module, params = models.target(target)
  enc = random_inputs(batch_size, settings.input_length, module.config.vocab_size, settings.seed)
  return profiling.verify_cost_curve(module, params, enc, settings.decode_length, settings.max_tokens,
                                     settings.num_calls, settings.repeats)


def measure_costs(models: _Models, target: str, fitting: Sequence[str], settings: Settings) -> Dict[str, Any]:
  """c of every drafter in isolation: its 1-token call over the target's, all interleaved (batch 1)."""
  module, params = models.target(target)
  enc = random_inputs(1, settings.input_length, module.config.vocab_size, settings.seed)
  length, calls = settings.decode_length, settings.num_calls
  programs = {'target': profiling.decode_calls(module, params, enc, length, 1, calls)}
  for name, (d_module, d_params) in models.drafters(target, fitting).items():
    programs[name] = profiling.drafter_calls(module, params, d_module, d_params, enc, length, calls)
  best = profiling.fastest_interleaved(programs, settings.repeats)
  target_s = best.pop('target')
  return {'target_call_s': target_s / calls, 'draft_call_s': {name: s / calls for name, s in best.items()},
          'c': {name: s / target_s for name, s in best.items()}}


def measure_in_loop(models: _Models, target: str, fitting: Sequence[str], settings: Settings) -> Dict[str, Any]:
  """c inside the compiled loop: each drafter's draft phase at `cost_gamma` (per step) over the target's
  baseline round, from one mid-decode state (`profiling.time_phases`; the baseline round timed once, with the
  first drafter)."""
  module, params = models.target(target)
  vocab = module.config.vocab_size
  enc = random_inputs(1, settings.input_length, vocab, settings.seed)
  prefix = random_inputs(1, settings.decode_length - settings.cost_gamma - 2, vocab, settings.seed + 3)[0]
  gamma = settings.cost_gamma
  draft_step_s, baseline_round_s = {}, None
  for name, (d_module, d_params) in models.drafters(target, fitting).items():
    parts = ('draft',) if baseline_round_s is not None else ('draft', 'baseline_round')
    phases = profiling.time_phases(module, params, d_module, d_params, enc, prefix, settings.decode_length, gamma,
                                   iters=settings.num_calls, repeats=settings.repeats, parts=parts)
    if baseline_round_s is None:
      baseline_round_s = phases.baseline_round
    draft_step_s[name] = phases.draft / gamma
  return {'gamma': gamma, 'baseline_round_s': baseline_round_s, 'draft_step_s': draft_step_s,
          'c_in_loop': {name: s / baseline_round_s for name, s in draft_step_s.items()}}


def ceiling_examples(settings: Settings, vocab_size: int) -> List[Dict[str, np.ndarray]]:
  inputs = random_inputs(settings.ceiling_examples, settings.input_length, vocab_size, settings.seed + 4)
  return [{'inputs': row} for row in inputs]


def measure_ceiling(models: _Models, target: str, settings: Settings, curve_b1: Optional[Mapping[str, Any]],
                    state_path: str, log: Callable[[str], None]) -> Dict[str, Any]:
  """`ceiling.measure` at batch 1 on the target's greedy decodes of random inputs, then `ceiling.report`."""
  module, params = models.target(target)
  grid = ceiling.Settings(alphas=settings.alphas, gammas=settings.gammas, batch_sizes=(1,),
                          repeats=settings.repeats, seed=settings.seed, max_verify_tokens=settings.max_tokens,
                          cost_repeats=settings.repeats)
  state = ceiling.measure(module, params, ceiling_examples(settings, module.config.vocab_size),
                          settings.lengths(), grid, state_path=state_path, log=log,
                          verify_curves={1: curve_b1} if curve_b1 else None)
  return {'report': ceiling.report(state), 'batches': state['batches']['1']}


def with_drafter_cost(ceiling_part: Mapping[str, Any], draft_step_s: float) -> List[Dict[str, Any]]:
  """The ceiling's rows as they would run with a drafter whose draft step costs `draft_step_s` inside the
  loop instead of the oracle's: each decode's measured seconds plus (its target calls) × γ × (the drafter's
  step less the oracle's), the acceptance the oracle's. Returns [{alpha_target, gamma, alpha_measured,
  speedup, measured_oracle_speedup}]."""
  rep, records = ceiling_part['report'], ceiling_part['batches']
  oracle_step = {int(g): s / int(g) for g, s in rep['costs']['1']['draft_s'].items()}
  base_s = sum(r['baseline_s'] for r in records)
  out = []
  for row in rep['rows']:
    label = ceiling.oracle_label(row['alpha_target'], row['gamma'])
    extra = row['gamma'] * (draft_step_s - oracle_step[row['gamma']])
    seconds = sum(r['oracle'][label]['seconds'] + sum(r['oracle'][label]['target_calls']) * extra
                  for r in records)
    out.append({'alpha_target': row['alpha_target'], 'gamma': row['gamma'],
                'alpha_measured': row['alpha_measured'], 'speedup': base_s / seconds,
                'measured_oracle_speedup': row['measured_speedup']})
  return out


# ----------------------------------------------------------------------------------------------------------
# The tests on this backend.
# ----------------------------------------------------------------------------------------------------------

_OUTCOME = re.compile(r'\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b')
_SUMMARY = re.compile(r'=+ (.*\d+ (?:passed|failed|error|errors|skipped).*) in [\d.]+s')


def test_counts(log_text: str) -> Dict[str, int]:
  """{'passed', 'failed', 'error', 'skipped', ...: count} from a `pytest -v` log (with or without xdist): one
  outcome word per test line, so a log cut off mid-run still counts what ran."""
  counts: Dict[str, int] = {}
  for line in log_text.splitlines():
    # Section rules, and the short summary's lines ("FAILED path::name - reason"), which repeat a test's line.
    if line.startswith(('=', '_')) or _OUTCOME.match(line):
      continue
    m = _OUTCOME.search(line)
    if m and '::' in line:
      key = m.group(1).lower()
      counts[key] = counts.get(key, 0) + 1
  return counts


def test_env(base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
  """The tests' environment on this backend: float32 matrix products at full precision (a GPU's default
  would run them in TF32, whose 10-bit mantissa the tests' float32 tolerances do not allow), and no
  preallocation of device memory (this process and the test workers share one device)."""
  env = dict(os.environ if base is None else base)
  env.setdefault('JAX_DEFAULT_MATMUL_PRECISION', 'highest')
  env.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  return env


def run_tests(repo_root: str, log_path: str, timeout_s: float, workers: int = 0,
              files: Sequence[str] = TEST_FILES) -> Dict[str, Any]:
  """Runs the test `files` (paths relative to `repo_root`) with pytest on this process's backend (a child
  process), its output in `log_path`; cut off after `timeout_s`. Returns the outcome counts, whether it
  finished, its return code and seconds."""
  cmd = [sys.executable, '-m', 'pytest', '-v', '-p', 'no:cacheprovider', *files]
  if workers > 1:
    cmd += ['-n', str(workers)]
  env = test_env()
  start = time.perf_counter()
  fileio.makedirs(os.path.dirname(log_path) or '.')
  with open(log_path, 'wb') as log:
    proc = subprocess.Popen(cmd, cwd=repo_root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
      returncode, finished = proc.wait(timeout=max(timeout_s, 1.0)), True
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      returncode, finished = proc.wait(), False
  with open(log_path, encoding='utf-8', errors='replace') as f:
    text = f.read()
  summary = _SUMMARY.findall(text)
  return {'counts': test_counts(text), 'finished': finished, 'returncode': returncode,
          'seconds': time.perf_counter() - start, 'files': list(files),
          'summary': summary[-1] if summary else None, 'workers': workers,
          'matmul_precision': env['JAX_DEFAULT_MATMUL_PRECISION']}


# ----------------------------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------------------------


def device_info() -> Dict[str, Any]:
  """The backend, the first device's kind and count, and the machine (`reporting.machine_info`)."""
  device = jax.devices()[0]
  return {**reporting.machine_info(), 'device_kind': device.device_kind, 'device_count': jax.device_count(),
          'platform_version': getattr(device.client, 'platform_version', '')}


def run_name(info: Mapping[str, Any]) -> str:
  """`<backend>_<device kind>` in file-name characters, e.g. gpu_nvidia-h200, tpu_tpu-v4, cpu_cpu."""
  kind = re.sub(r'[^a-z0-9.]+', '-', str(info['device_kind']).lower()).strip('-') or 'unknown'
  return f"{info['backend']}_{kind}"


def _as_json(tree):
  return json.loads(json.dumps(tree, default=lambda x: np.asarray(x).tolist()))


class State:
  """The run's progress as one JSON file, rewritten atomically after every part. A file of other settings or
  another device is refused (delete it, or pass another state directory)."""

  def __init__(self, path: str, identity: Mapping[str, Any]):
    self.path = path
    self.data = {'identity': _as_json(dict(identity)), 'parts': {}, 'errors': {}}
    if path and fileio.exists(path):
      old = fileio.read_json_object(path, 'accelerator check state')
      if old.get('identity') != self.data['identity']:
        raise ValueError(f'{path} holds a check of other settings or another device: delete it to measure '
                         'afresh, or give this run another state directory.')
      self.data = old
      self.data.setdefault('errors', {})

  def done(self, key: str) -> bool:
    return key in self.data['parts']

  def put(self, key: str, result: Any, seconds: float) -> None:
    self.data['parts'][key] = {'result': _as_json(result), 'seconds': seconds}
    self.data['errors'].pop(key, None)
    self.save()

  def error(self, key: str, message: str, seconds: float) -> None:
    self.data['errors'][key] = {'message': message, 'seconds': seconds}
    self.save()

  def result(self, key: str) -> Any:
    part = self.data['parts'].get(key)
    return None if part is None else part['result']

  def save(self) -> None:
    if self.path:
      fileio.atomic_write(self.path, json.dumps(self.data, sort_keys=True).encode())


def run(settings: Settings, state_dir: str, budget_s: float, tests: bool, tests_s: float,
        memory_limit_bytes: Optional[int] = None, repo_root: str = '.', test_workers: int = 0,
        tests_log_path: Optional[str] = None,
        log: Callable[[str], None] = print, on_part: Optional[Callable[[Dict[str, Any]], None]] = None
        ) -> Dict[str, Any]:
  """Runs the plan's parts within `budget_s` seconds, resuming from `state_dir`/state.json; returns the
  report (`report`). The tests (when `tests`) keep the last `tests_s` of the budget, write their log to
  `tests_log_path` (default `state_dir`/tests.log) and run with `test_workers` pytest-xdist workers (0: one
  process). `on_part(report)` is called after every part (the script writes the files there), so a cut-off
  run has reported everything it measured."""
  settings.validate()
  start = time.perf_counter()
  info = device_info()
  limit, limit_source = ((memory_limit_bytes, 'given on the command line') if memory_limit_bytes
                         else device_memory_bytes())
  mem = memory_plan(settings, limit)
  fitting = [s for s in settings.shapes if mem[s]['fits']]
  identity = {'settings': dataclasses.asdict(settings), 'backend': info['backend'],
              'device_kind': info['device_kind'], 'jax': info['jax']}
  state = State(os.path.join(state_dir, 'state.json'), identity)
  keys = plan(settings, fitting, tests)
  models = _Models(settings)
  context = {'info': info, 'memory': {'limit_bytes': limit, 'limit_source': limit_source, 'shapes': mem,
                                      'headroom': MEMORY_HEADROOM},
             'plan': keys, 'budget_s': budget_s}
  not_reached: List[str] = []

  def emit():
    rep = report(settings, state.data, dict(context, not_reached=list(not_reached)))
    if on_part:
      on_part(rep)
    return rep

  emit()
  measuring_deadline = budget_s - (tests_s if tests else 0.0)
  for n, key in enumerate(keys):
    if state.done(key):
      continue
    elapsed = time.perf_counter() - start
    limit_s = budget_s if key == 'tests' else measuring_deadline
    if elapsed >= limit_s:
      not_reached.append(key)
      continue
    kind, target = key.split(':')[0], key.split(':')[1] if ':' in key else None
    log(f'[{elapsed:6.1f} s of {budget_s:.0f} s] part {n + 1}/{len(keys)}: {key}')
    part_start = time.perf_counter()
    try:
      if kind == 'curve':
        result = measure_curve(models, target, int(key.split(':')[2]), settings)
      elif kind == 'costs':
        result = measure_costs(models, target, fitting, settings)
      elif kind == 'in_loop':
        result = measure_in_loop(models, target, fitting, settings)
      elif kind == 'ceiling':
        result = measure_ceiling(models, target, settings, state.result(f'curve:{target}:1'),
                                 os.path.join(state_dir, 'ceiling_state.json'),
                                 lambda line: log(f'  [{time.perf_counter() - start:6.1f} s] {line}'))
      else:
        result = run_tests(repo_root, tests_log_path or os.path.join(state_dir, 'tests.log'),
                           budget_s - elapsed, test_workers)
      state.put(key, result, time.perf_counter() - part_start)
    except Exception as e:  # pylint: disable=broad-except  (one failed part must not cost the others)
      state.error(key, f'{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}',
                  time.perf_counter() - part_start)
      log(f'  {key} failed: {type(e).__name__}: {e}')
    seconds = time.perf_counter() - part_start
    log(f'  {key}: {seconds:.1f} s')
    if target and all(k.split(':')[1:2] != [target] for k in keys[n + 1:]):
      models.release(target)
    emit()
  rep = emit()
  rep['wall_s'] = time.perf_counter() - start
  return rep


# ----------------------------------------------------------------------------------------------------------
# From the state to the report.
# ----------------------------------------------------------------------------------------------------------


def _best(rows: Sequence[Mapping[str, Any]], field: str) -> Optional[Mapping[str, Any]]:
  """The row of the most `field` at the grid's α* nearest SUMMARY_ALPHA (None without rows)."""
  if not rows:
    return None
  alpha = min({r['alpha_target'] for r in rows}, key=lambda a: (abs(a - SUMMARY_ALPHA), a))
  return max((r for r in rows if r['alpha_target'] == alpha), key=lambda r: r[field])


def report(settings: Settings, state: Mapping[str, Any], context: Mapping[str, Any]) -> Dict[str, Any]:
  """Everything measured so far, by part: the verify curves, c isolated and in the loop, the ceiling with
  Thm 3.8 and with a T5-small drafter's cost, the tests, and the one-line summary."""
  parts = {k: v['result'] for k, v in state['parts'].items()}
  curves: Dict[str, Dict[str, Any]] = {}
  costs, in_loop = {}, {}
  for key, result in parts.items():
    kind, *rest = key.split(':')
    if kind == 'curve':
      curves.setdefault(rest[0], {})[rest[1]] = result
    elif kind == 'costs':
      costs[rest[0]] = result
    elif kind == 'in_loop':
      in_loop[rest[0]] = result
  rep: Dict[str, Any] = {
      'date': datetime.datetime.now().isoformat(timespec='seconds'), 'settings': dataclasses.asdict(settings),
      'machine': dict(context['info']), 'memory': context['memory'], 'plan': context['plan'],
      'budget_s': context['budget_s'], 'not_reached': context.get('not_reached', []),
      'part_seconds': {k: v['seconds'] for k, v in state['parts'].items()},
      'errors': dict(state.get('errors', {})), 'verify_curves': curves, 'costs': costs, 'in_loop': in_loop,
      'tests': parts.get('tests'), 'ceiling': None, 'paper': PAPER_REFERENCE}
  ceiling_key = next((k for k in parts if k.startswith('ceiling:')), None)
  if ceiling_key:
    target = ceiling_key.split(':')[1]
    part = parts[ceiling_key]
    ceiling_out = {'target': target, 'report': part['report']}
    small = 'small' if 'small' in in_loop.get(target, {}).get('draft_step_s', {}) else None
    small = small or ('tiny_drafter' if 'tiny_drafter' in in_loop.get(target, {}).get('draft_step_s', {})
                      else None)
    if small:
      loop = in_loop[target]
      c_small = loop['c_in_loop'][small]
      rows = with_drafter_cost(part, loop['draft_step_s'][small])
      for r in rows:
        r['thm38_with_drafter_c'] = theory.expected_speedup(r['alpha_measured'], r['gamma'], c_small)
      ceiling_out.update(drafter=small, drafter_c_in_loop=c_small, with_drafter=rows)
    rep['ceiling'] = ceiling_out
  rep['summary'] = summary_line(rep)
  return rep


def summary_line(rep: Mapping[str, Any]) -> str:
  """One line: the device, jax, the largest target's verify ratio at 8 tokens, c of the smallest drafter, the
  oracle's best speedup at α* 0.8 (or the grid's nearest) and the same with that drafter's cost, the tests'
  counts; what is not measured is left out."""
  m = rep['machine']
  parts = [f"accelerator check: {m['backend']} {m['device_kind']} ×{m['device_count']}, jax {m['jax']}"]
  curves = rep['verify_curves']
  if curves:
    target = by_size(list(curves))[0]
    curve = curves[target].get('1') or next(iter(curves[target].values()))
    ratio = dict(zip(curve['tokens'], curve['ratio']))
    k = 8 if 8 in ratio else max(ratio)
    parts.append(f'{target} verify {k} tokens = {ratio[k]:.2f} one-token calls')
  for target in by_size(list(rep['costs'])):
    c = rep['costs'][target]['c']
    drafter = next((d for d in ('small', 'tiny_drafter') if d in c), None)
    if drafter:
      loop = rep['in_loop'].get(target, {}).get('c_in_loop', {})
      parts.append(f"c {drafter}/{target} = {c[drafter]:.3f} (in loop {reporting.fmt(loop.get(drafter), '.3f')})")
    break
  ceil = rep.get('ceiling')
  if ceil:
    best = _best(ceil['report']['rows'], 'measured_speedup')
    if best:
      parts.append(f"oracle α* {best['alpha_target']:g}: {best['measured_speedup']:.2f}× (γ {best['gamma']})")
    if ceil.get('with_drafter'):
      b = _best(ceil['with_drafter'], 'speedup')
      if b:
        parts.append(f"with {ceil['drafter']}'s c: {b['speedup']:.2f}× (γ {b['gamma']}; paper "
                     f"{PAPER_REFERENCE['speedup']}×)")
  tests = rep.get('tests')
  if tests:
    counts = tests['counts']
    parts.append(f"tests {counts.get('passed', 0)} passed, {counts.get('failed', 0) + counts.get('error', 0)} "
                 f"failed{'' if tests['finished'] else ' (cut off)'}")
  if rep['not_reached']:
    parts.append(f"{len(rep['not_reached'])} parts not reached")
  if rep['errors']:
    parts.append(f"{len(rep['errors'])} parts failed")
  return ' · '.join(parts)
