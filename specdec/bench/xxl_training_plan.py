"""Per-chip memory and chip-hours of the eight Table-2 fine-tunes on TPU v4.

The runs are gin/train/table2/{xxl,large,base,small}_{ende,cnndm}.gin: T5
1.1 from the public T5X checkpoints, T5X's fine-tuning defaults (Adafactor,
constant learning rate 1e-3, dropout 0.1, 128 packed rows a step) at the
lengths, step counts and meshes of RUNS below (why those lengths:
gin/train/table2/finetune.gin). tests/bench/xxl_training_plan_test.py checks that
RUNS and the gin files agree.

Memory. Every network is built abstractly (jax.eval_shape: no memory, no TPU)
and laid out with specdec.partitioning's rules (T5X's, 1-D activations and
1-D or 2-D parameters) on simulated ('data', 'model') meshes of v4 slices
from v4-8 to v4-256, every power-of-two model width the trainer accepts (it
refuses a param dimension the mesh does not divide). Per chip, the step's
peak is counted as:

  params       float32 (T5X keeps float32 params and computes in bfloat16)
  optimizer    Adafactor's state (optax.adafactor as specdec.training.train makes
               it): factored second moments, one row and one column vector
               per matrix, full for vectors and matrices narrower than 128;
               counted replicated, an upper bound (~0.05% of XXL's params)
  activations  what the backward pass keeps of every layer (layer_residuals:
               norm inputs in f32 and outputs, q and k in f32, v and the
               attended values, softmax outputs in f32 and their bf16 casts,
               the MLP's two projections, their activation and product; the
               f32 logits and softmax of the loss), all live when the
               backward pass starts. Dropout masks are broadcast along the
               length (T5X), so they are left out. The network pins
               activations to (batch, length, ...) as T5X does
               (network.activation_layout), so they split over 'data' by rows.
  code         CODE_GIB, the compiler's generated code (no shape predicts it)

Float32 gradients and bf16 kernel casts are shown beside but not added: XLA's
TPU compiler makes and consumes them layer by layer (each parameter's
Adafactor update applied as its gradient is made, the casts fused into the
matmuls), and the compiled steps (results/tpu_compile/v4-128.md) hold
neither whole at the peak: adding them overstated the drafters' fine-tunes
by up to 79%. Gradient accumulation (`microbatches` > 1) does hold a whole
float32 gradient buffer across microbatches, and it is added.

A layout fits when headroom x total <= 32 GiB of HBM per v4 chip (headroom
1.2: XLA temporaries, fragmentation, the transient update tree). specdec.training.train
has no gradient accumulation, so the whole per-replica batch (batch / data
rows) is live at once; `microbatches` > 1 shows what accumulation would buy (T5X's
Trainer.num_microbatches; one more gradient buffer).

Cost. FLOPs per step = 6 x (N_enc x inputs + N_dec x targets) x batch, with
N_enc / N_dec the encoder's / decoder's matmul parameters (the logits layer is
the decoder's; the embedding lookup is no matmul), plus attention's
12 x L_q x L_k x heads x head_dim per layer and row (QK and AV, forward and
backward). Padding inside packed rows costs the same as tokens, so rows x
lengths is what is counted. chip-hours = steps x FLOPs per step / (MFU x 275
TFLOP/s bf16 peak of a v4 chip) / 3600, at MFU 40% by default.

scripts/xxl_training_plan.py writes the report (`build_report`,
`render_markdown`) to results/xxl_training_plan.{md,json}.
"""

import datetime
import functools
import math
from typing import Mapping, NamedTuple, Optional, Sequence

import flax
import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec

from specdec import memory
from specdec import network
from specdec import partitioning
from specdec.bench.xxl_plan import (CODE_GIB, GIB, HBM_PER_CHIP_GIB, HEADROOM, format_gib,
                              machine_description, mesh_splits)

PEAK_TFLOPS = 275.0     # TPU v4, bf16 matmuls
MFU = 0.40
SLICES = {'v4-8': 4, 'v4-16': 8, 'v4-32': 16, 'v4-64': 32, 'v4-128': 64,
          'v4-256': 128}


class Run(NamedTuple):
  """One fine-tune: gin/train/table2/<size>_<task>.gin."""
  size: str
  task: str
  inputs: int
  targets: int
  batch: int
  steps: int
  num_partitions: int  # the 'model' axis of the gin's mesh
  param_dims: int      # parameter_partitioning_dims

  @property
  def name(self) -> str:
    return f'{self.size}_{self.task}'


# As in the gin files: (inputs, targets) per task, batch, steps, and per size
# the mesh (num_partitions, parameter_partitioning_dims) on LAUNCH_SLICE.
TASK_LENGTHS = {'ende': (256, 256), 'cnndm': (512, 128)}
TASK_NAMES = {'ende': 'WMT EnDe', 'cnndm': 'CNN/DM'}
BATCH = 128
STEPS = 20_000
LAYOUTS = {'xxl': (4, 2), 'large': (1, 1), 'base': (1, 1), 'small': (1, 1)}
LAUNCH_SLICE = 'v4-128'  # scripts/tpu/finetune_table2.sh's default
RUNS = tuple(Run(size, task, *TASK_LENGTHS[task], BATCH, STEPS, *LAYOUTS[size])
             for size in LAYOUTS for task in TASK_LENGTHS)


# -----------------------------------------------------------------------------
# FLOPs and chip-hours.
# -----------------------------------------------------------------------------


def matmul_params(config: network.T5Config) -> dict:
  """{'encoder': N_enc, 'decoder': N_dec}: parameters used in matmuls.

  The decoder's include the logits layer (or, when logits reuse the
  embedding, the embedding as that matmul); layer-norm scales and relative
  position tables are counted too (they are < 0.01%).
  """
  params = memory.abstract_params(config)
  count = lambda tree: sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(tree))
  n = {'encoder': count(params['encoder']), 'decoder': count(params['decoder'])}
  if config.logits_via_embedding:
    n['decoder'] += count(params['token_embedder'])
  return n


def step_flops(config: network.T5Config, inputs: int, targets: int,
               batch: int) -> dict:
  """Training FLOPs of one step (forward + backward) of `batch` packed rows."""
  n = matmul_params(config)
  dense = 6 * (n['encoder'] * inputs + n['decoder'] * targets) * batch
  per_pair = 12 * config.num_heads * config.head_dim  # per query-key pair, per layer
  attention = per_pair * batch * (
      config.num_encoder_layers * inputs * inputs +
      config.num_decoder_layers * (targets * targets + targets * inputs))
  return {'dense': dense, 'attention': attention, 'total': dense + attention}


def chip_hours(flops: float, mfu: float = MFU,
               peak_tflops: float = PEAK_TFLOPS) -> float:
  """Chip-hours that `flops` take at `mfu` of `peak_tflops` per chip."""
  return flops / (mfu * peak_tflops * 1e12) / 3600


# -----------------------------------------------------------------------------
# Memory per chip.
# -----------------------------------------------------------------------------


def _per_chip(tensors: Mapping[str, tuple], axis_sizes: Mapping[str, int],
              rules) -> int:
  """Bytes per chip of {name: (shape, dtype, logical axes)}, laid out by the rules."""
  shapes = {k: jax.ShapeDtypeStruct(shape, dtype)
            for k, (shape, dtype, _) in tensors.items()}
  logical = {k: PartitionSpec(*axes) for k, (_, _, axes) in tensors.items()}
  specs = partitioning.logical_to_mesh_specs(logical, shapes, rules, axis_sizes)
  return memory.bytes_per_device(shapes, specs, axis_sizes)


def layer_residuals(config: network.T5Config, rows: int, q_len: int,
                    kv_len: Optional[int] = None) -> dict:
  """What the backward pass keeps of one layer: {name: (shape, dtype, axes)}.

  kv_len None: an encoder layer over q_len tokens. Otherwise a decoder layer
  over q_len target tokens whose cross-attention reads kv_len encoder tokens.
  """
  b, e, h, m = rows, config.emb_dim, config.num_heads, config.mlp_dim
  hd = config.num_heads * config.head_dim
  act, f32 = np.dtype(config.dtype), np.float32

  def tokens(n, length, width, dtype, axis):
    return ((n, b, length, width), dtype, (None, 'batch', 'length', axis))

  def scores(q, k):  # softmax outputs (f32) and their casts, [b, h, q, k]
    return [((b, h, q, k), f32, ('batch', 'heads', 'length', None)),
            ((b, h, q, k), act, ('batch', 'heads', 'length', None))]

  mlp_tensors = len(config.mlp_activations) * 2  # projections + activations
  if kv_len is None:
    s = q_len
    parts = {'norm_in_f32': tokens(2, s, e, f32, 'embed'),
             'norm_out': tokens(2, s, e, act, 'embed'),
             'qk_f32': tokens(2, s, hd, f32, 'joined_kv'),
             'v_attended': tokens(2, s, hd, act, 'joined_kv'),
             'mlp': tokens(mlp_tensors, s, m, act, 'mlp')}
    parts.update(zip(('self_probs', 'self_weights'), scores(s, s)))
    return parts
  t, s = q_len, kv_len
  parts = {'norm_in_f32': tokens(3, t, e, f32, 'embed'),
           'norm_out': tokens(3, t, e, act, 'embed'),
           'qk_f32': tokens(3, t, hd, f32, 'joined_kv'),  # self q, k; cross q
           'v_attended': tokens(3, t, hd, act, 'joined_kv'),  # self v, both outputs
           'cross_k_f32': tokens(1, s, hd, f32, 'joined_kv'),
           'cross_v': tokens(1, s, hd, act, 'joined_kv'),
           'mlp': tokens(mlp_tensors, t, m, act, 'mlp')}
  parts.update(zip(('self_probs', 'self_weights'), scores(t, t)))
  parts.update(zip(('cross_probs', 'cross_weights'), scores(t, s)))
  return parts


def activation_bytes(config: network.T5Config, axis_sizes: Mapping[str, int],
                     rules, rows: int, inputs: int, targets: int) -> int:
  """Bytes per chip the backward pass keeps for `rows` rows (all layers + loss).

  `rows` is the global (micro)batch: the rules shard it over the data axis.
  """
  encoder = _per_chip(layer_residuals(config, rows, inputs), axis_sizes, rules)
  decoder = _per_chip(layer_residuals(config, rows, targets, inputs),
                      axis_sizes, rules)
  loss = _per_chip({'logits_and_softmax': (
      (2, rows, targets, config.vocab_size), np.float32,
      (None, 'batch', 'length', 'vocab'))}, axis_sizes, rules)
  return (config.num_encoder_layers * encoder +
          config.num_decoder_layers * decoder + loss)


@functools.lru_cache(maxsize=None)
def optimizer_state_bytes(config: network.T5Config) -> int:
  """Adafactor's state for `config`, one copy (as specdec.training.train's optimizer)."""
  opt = optax.adafactor(learning_rate=1e-3, multiply_by_parameter_scale=True)
  state = jax.eval_shape(opt.init, memory.abstract_params(config))
  return memory.total_bytes(state)


@functools.lru_cache(maxsize=None)
def _param_logical_axes(config: network.T5Config):
  return network.param_logical_axes(config)


@functools.lru_cache(maxsize=None)
def _state_bytes(config: network.T5Config, data: int, model: int,
                 param_dims: int) -> tuple:
  sizes = {'data': data, 'model': model}
  rules = partitioning.standard_logical_axis_rules(1, param_dims)
  return tuple(state_bytes(config, sizes, rules).items())


def state_bytes(config: network.T5Config, axis_sizes: Mapping[str, int],
                rules) -> dict:
  """Per chip: float32 params and grads, optimizer state, bf16 kernel casts."""
  params = memory.abstract_params(config)
  specs = partitioning.logical_to_mesh_specs(
      _param_logical_axes(config), params, rules, axis_sizes)
  per_leaf = memory.leaf_bytes_per_device(params, specs, axis_sizes)
  kernels = sum(b for path, b in per_leaf.items() if 'kernel' in path)
  f32 = sum(per_leaf.values())
  return {'params': f32, 'grads': f32, 'optimizer': optimizer_state_bytes(config),
          'bf16_kernels': kernels // 2}


@functools.lru_cache(maxsize=None)
def trainer_accepts(config: network.T5Config, data: int, model: int,
                    param_dims: int) -> bool:
  """Whether every param dimension divides over its mesh axes.

  specdec.training.train refuses a mesh that does not (decoding would replicate the
  dimension instead), e.g. T5-small's 6 heads on model = 4.
  """
  sizes = {'data': data, 'model': model}
  rules = partitioning.standard_logical_axis_rules(1, param_dims)
  logical = jax.tree_util.tree_leaves(
      flax.core.unfreeze(_param_logical_axes(config)),
      is_leaf=lambda x: isinstance(x, PartitionSpec))
  shapes = jax.tree_util.tree_leaves(
      flax.core.unfreeze(memory.abstract_params(config)))
  for spec, leaf in zip(logical, shapes, strict=True):
    for size, axes in zip(leaf.shape, nn.logical_to_mesh_axes(tuple(spec), rules)):
      names = (axes,) if isinstance(axes, str) else tuple(axes or ())
      if size % math.prod(sizes[a] for a in names):
        return False
  return True


def layout_row(run: Run, config: network.T5Config, slice_name: str,
               chips: int, data: int, model: int, param_dims: int,
               microbatches: int, hbm_gib: float, headroom: float) -> dict:
  """Memory per chip of one run on one layout."""
  sizes = {'data': data, 'model': model}
  rules = partitioning.standard_logical_axis_rules(1, param_dims)
  rows = run.batch // microbatches  # one microbatch's rows, sharded over data
  state = dict(_state_bytes(config, data, model, param_dims))
  acts = activation_bytes(config, sizes, rules, rows, run.inputs, run.targets)
  accumulator = state['grads'] if microbatches > 1 else 0
  code = int(CODE_GIB * GIB)
  # Gradients and bf16 casts are not at the peak (module docstring); the accumulator is.
  total = state['params'] + state['optimizer'] + accumulator + acts + code
  return dict(run=run.name, slice=slice_name, chips=chips, data=data, model=model,
              param_dims=param_dims, microbatches=microbatches,
              rows_per_chip=rows // data,
              **state, accumulator=accumulator, activations=acts, code=code, total=total,
              fits=total * headroom <= hbm_gib * GIB)


def plan_layouts(run: Run, config: network.T5Config, slices: Mapping[str, int],
                 param_dims: Sequence[int], microbatches: Sequence[int],
                 hbm_gib: float = HBM_PER_CHIP_GIB,
                 headroom: float = HEADROOM) -> list:
  """layout_row for every slice, mesh split, parameter rule and microbatch count.

  Layouts the trainer refuses are skipped: a data axis that does not divide
  the (micro)batch, or a param dimension the mesh does not divide.
  """
  rows = []
  for slice_name, chips in slices.items():
    for data, model in mesh_splits(chips):
      for k in microbatches:
        if run.batch % (data * k):
          continue
        for dims in param_dims:
          if not trainer_accepts(config, data, model, dims):
            continue
          rows.append(layout_row(run, config, slice_name, chips, data, model,
                                 dims, k, hbm_gib, headroom))
  return rows


def smallest_fit(rows: Sequence[dict], microbatches: int = 1) -> Optional[dict]:
  """The fitting layout with fewest chips, then least memory, at `microbatches`."""
  fitting = [r for r in rows if r['fits'] and r['microbatches'] == microbatches]
  return min(fitting, key=lambda r: (r['chips'], r['total']), default=None)


# -----------------------------------------------------------------------------
# The report.
# -----------------------------------------------------------------------------


def configured_layout(run: Run, layouts: Sequence[dict],
                      slice_name: str = LAUNCH_SLICE) -> Optional[dict]:
  """The layout the run's gin file asks for on `slice_name` (microbatches 1)."""
  for r in layouts:
    if (r['slice'] == slice_name and r['model'] == run.num_partitions and
        r['param_dims'] == run.param_dims and r['microbatches'] == 1):
      return r
  return None


def run_summary(run: Run, mfu: float, layouts: Sequence[dict]) -> dict:
  """One run's size, FLOPs, chip-hours, configured layout and smallest fits."""
  config = network.t5_1_1_config(run.size, dtype='bfloat16')
  flops = step_flops(config, run.inputs, run.targets, run.batch)
  hours = chip_hours(flops['total'] * run.steps, mfu)
  configured = configured_layout(run, layouts)
  params = memory.abstract_params(config)
  return dict(
      run._asdict(), name=run.name,
      params=sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params)),
      matmul_params=matmul_params(config), step_flops=flops,
      total_flops=flops['total'] * run.steps, chip_hours=hours,
      configured=configured,
      wall_hours=hours / configured['chips'] if configured else None,
      smallest_fit=smallest_fit(layouts),
      smallest_fit_accumulating={
          k: smallest_fit(layouts, k)
          for k in sorted({r['microbatches'] for r in layouts}) if k > 1})


def _where(r: Optional[dict]) -> str:
  if r is None:
    return 'none up to v4-256'
  return (f'{r["slice"]} {r["data"]} x {r["model"]} {r["param_dims"]}-D '
          f'({format_gib(r["total"])})')


def _runs_table(report: dict) -> list:
  lines = [
      f'| run | params | inputs/targets | steps | TFLOP/step | chip-hours | on {LAUNCH_SLICE} '
      '(gin\'s mesh) | GiB/chip | fits | wall hours | smallest fitting slice (GiB/chip) |',
      '|---|---|---|---|---|---|---|---|---|---|---|']
  for r in report['runs']:
    c = r['configured']
    lines.append(
        f'| {r["name"]} | {r["params"] / 1e9:.2f}B | {r["inputs"]}/{r["targets"]} | '
        f'{r["steps"]:,} | {r["step_flops"]["total"] / 1e12:,.0f} | {r["chip_hours"]:,.1f} | '
        f'{c["data"]} x {c["model"]}, {c["param_dims"]}-D params | {format_gib(c["total"])} | '
        f'{"yes" if c["fits"] else "**no**"} | {r["wall_hours"]:.2f} | '
        f'{_where(r["smallest_fit"])} |')
  return lines


def _accumulation_table(report: dict) -> list:
  counts = sorted({int(k) for r in report['runs'] for k in r['smallest_fit_accumulating']})
  if not counts:
    return []
  lines = ['', '## With gradient accumulation (not in specdec.training.train)', '',
           'The smallest fitting slice if each step were split into k microbatches (T5X\'s '
           '`Trainer.num_microbatches`; one more float32 gradient buffer):', '',
           '| run | ' + ' | '.join(f'k = {k}' for k in counts) + ' |',
           '|---|' + '---|' * len(counts)]
  for r in report['runs']:
    acc = r['smallest_fit_accumulating']
    lines.append(f'| {r["name"]} | ' + ' | '.join(
        _where(acc.get(k, acc.get(str(k)))) for k in counts) + ' |')
  return lines


def _layouts_table(run: dict, layouts: Sequence[dict]) -> list:
  lines = ['', f'## {run["name"]}: {TASK_NAMES[run["task"]]}, inputs {run["inputs"]}, '
           f'targets {run["targets"]}, batch {run["batch"]}, every layout', '',
           '| slice | data x model | params | rows/chip | params f32 | Adafactor | activations | code | total | '
           'fits | grads f32 (not at the peak) | bf16 kernels (not at the peak) |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r in layouts:
    if r['microbatches'] != 1:
      continue
    lines.append(
        f'| {r["slice"]} | {r["data"]} x {r["model"]} | {r["param_dims"]}-D | '
        f'{r["rows_per_chip"]} | {format_gib(r["params"])} | {format_gib(r["optimizer"])} | '
        f'{format_gib(r["activations"])} | {format_gib(r["code"])} | {format_gib(r["total"])} | '
        f'{"yes" if r["fits"] else "no"} | {format_gib(r["grads"])} | {format_gib(r["bf16_kernels"])} |')
  return lines


def render_markdown(report: dict) -> str:
  """The report as results/xxl_training_plan.md."""
  s = report['settings']
  total = sum(r['chip_hours'] for r in report['runs'])
  lines = [
      '# Fine-tuning the Table-2 models on TPU v4: memory per chip and chip-hours',
      '',
      f'Made by `{report["command"]}` on {report["date"]} ({report["machine"]}).',
      'Computed abstractly (jax.eval_shape; no TPU involved) by scripts/xxl_training_plan.py with '
      'specdec.partitioning\'s T5X rules (1-D activations; 1-D or 2-D parameters). The runs are '
      'gin/train/table2/*.gin (T5X fine-tuning defaults: Adafactor, constant learning rate 1e-3, '
      'dropout 0.1, batch 128 packed rows). GiB = 2^30 bytes, per chip.',
      '',
      '- Cost: FLOPs/step = 6 x (N_enc x inputs + N_dec x targets) x batch + attention '
      f'(12 x L_q x L_k x heads x head_dim per layer and row); chip-hours at MFU {s["mfu"]:.0%} '
      f'of {s["peak_tflops"]:g} TFLOP/s (v4, bf16). Wall hours = chip-hours / chips of {LAUNCH_SLICE}.',
      '- Memory at the step\'s peak: float32 params, Adafactor\'s factored moments (replicated: an upper '
      'bound), the activations the backward pass keeps for the per-chip rows (pinned to (batch, length, ...) '
      f'as T5X pins them) and {CODE_GIB:g} GiB of generated code. Float32 gradients and bf16 kernel casts are '
      'made and consumed layer by layer, not held whole at the peak (XLA\'s TPU compiler, '
      'results/tpu_compile/v4-128.md): shown, not added. See the script\'s docstring.',
      f'- fits: {s["headroom"]} x total <= {s["hbm_gib"]} GiB HBM per v4 chip; specdec.training.train keeps '
      'a whole per-replica batch live (no gradient accumulation).',
      '- The drafters get 2 rows per chip on 64 chips, too little work to reach the XXL runs\' MFU: '
      'their wall hours are a lower bound (minutes either way).',
      '',
      f'**All eight: {total:,.0f} chip-hours** at MFU {s["mfu"]:.0%}, '
      f'{total / SLICES[LAUNCH_SLICE]:.1f} hours on one {LAUNCH_SLICE} '
      '(compilation, evaluation, checkpointing, data loading and idle time not included).',
      '',
      '## The eight runs',
      '',
  ]
  lines += _runs_table(report)
  lines += _accumulation_table(report)
  for run in report['runs']:
    if run['size'] == 'xxl':
      lines += _layouts_table(run, report['layouts'][run['name']])
  return '\n'.join(lines) + '\n'


def build_report(command: str, mfu: float = MFU, headroom: float = HEADROOM,
                 microbatches: Sequence[int] = (1, 2, 4),
                 runs: Sequence[Run] = RUNS,
                 slices: Mapping[str, int] = SLICES) -> dict:
  """The plan's report: settings, every run's summary and its layouts.

  `microbatches`: gradient-accumulation counts to tabulate (1: what
  specdec.training.train does). `command` is the command line that made the report.
  """
  report = {
      'command': command,
      'date': datetime.date.today().isoformat(),
      'machine': machine_description(),
      'settings': dict(mfu=mfu, peak_tflops=PEAK_TFLOPS, headroom=headroom,
                       hbm_gib=HBM_PER_CHIP_GIB, slices=slices,
                       microbatches=microbatches),
      'runs': [], 'layouts': {}}
  for run in runs:
    config = network.t5_1_1_config(run.size, dtype='bfloat16')
    layouts = plan_layouts(run, config, slices, (1, 2),
                           sorted({1, *microbatches}), headroom=headroom)
    report['runs'].append(run_summary(run, mfu, layouts))
    # Every layout as specdec.training.train runs it; accumulation only as the runs' smallest fits.
    report['layouts'][run.name] = [r for r in layouts if r['microbatches'] == 1]
  return report
