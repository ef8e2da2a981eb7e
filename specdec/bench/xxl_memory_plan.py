"""Per-chip memory of T5-XXL (target) + T5-small (drafter) decoding on TPU v4.

Both networks are built abstractly (`jax.eval_shape` of init and of
init_cache: no memory, no TPU) and laid out with specdec.partitioning's rules
(T5X's 1-D rules by default) on simulated ('data', 'model') meshes of every
v4 slice from v4-8 (4 chips) to v4-128 (64 chips) and every power-of-two
model-parallel width. Per chip, it counts exactly what the sharded predictor
keeps resident:

  params       bf16 (param_dtype); replicated leaves count in full per chip
  self cache   decoder self-attention K and V: [B, targets + gamma + 1, H, D]
               (the code allocates `targets` positions and drops writes past
               them; gamma + 1 more are counted for implementations that pad)
  cross cache  encoder-side K and V of every decoder layer: [B, inputs, H, D],
               plus the [B, inputs] encoder mask
  activations  an estimate of the encoder's peak working set (one layer's
               attention logits f32 + weights + q/k/v, or its MLP hidden
               states, plus two residual streams); decoding's own
               temporaries ([B, gamma + 1, V] logits) are far smaller
  loop kernels a second copy, in param_dtype, of each decoder's (embed,
               joined_kv) kernels the decode loop reads: self-attention
               query, key and value and the cross-attention query. XLA's TPU
               compiler lays them out again before the loop for the k-token
               matmuls (the params arrive row-major); in the buffer
               assignment of the compiled T5-XXL + T5-small decode on a
               v4-8, 96 + 32 such copies = 4 per decoder layer of each
  code         CODE_GIB of generated code (xxl_plan; no shape predicts it)

and marks a layout as fitting when headroom x (params + caches + activations
+ loop kernels + code) <= 32 GiB of HBM per v4 chip (headroom 1.2 leaves room for XLA temporaries
and fragmentation). Dimensions that do not divide over their mesh axes are
replicated (partitioning.fit_spec), e.g. batch 1 on data > 1 and the
drafter's 6 heads on model > 2; the table counts them as such.

Lengths (the paper does not state them, PAPER.md), as gin/tasks/*.gin decode
them: WMT EnDe 256 input / 256 target tokens (SentencePiece sentences rarely
exceed 200); CNN/DM 512 input / 256 target tokens (T5's input length, which
the Table-2 models are fine-tuned at: gin/train/table2/finetune.gin). gamma =
8, the largest the paper uses. Batch 1 is the paper's setting; batch 32 a
serving batch.

scripts/xxl_memory_plan.py writes the report (`build_report`,
`render_markdown`) to results/xxl_memory_plan.{md,json}.
"""

import datetime
from typing import Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import PartitionSpec

from specdec import memory
from specdec import network
from specdec import partitioning
from specdec.bench.xxl_plan import (CODE_GIB, GIB, HBM_PER_CHIP_GIB, HEADROOM, format_gib,
                              machine_description, mesh_splits)

SLICES = {'v4-8': 4, 'v4-16': 8, 'v4-32': 16, 'v4-64': 32, 'v4-128': 64}
TASKS = {'ende': (256, 256), 'cnndm': (512, 256)}  # (inputs, targets)
TASK_NAMES = {'ende': 'WMT EnDe', 'cnndm': 'CNN/DM'}
BATCHES = (1, 32)
GAMMA = 8


def encoder_activation_bytes(config: network.T5Config,
                             axis_sizes: Mapping[str, int], rules,
                             batch: int, input_len: int) -> int:
  """Estimated peak bytes per chip of one encoder layer's live tensors."""
  b, s, h = batch, input_len, config.num_heads
  act = np.dtype(config.dtype)
  tensors = {  # name: (shape, dtype, logical axes)
      'logits': ((b, h, s, s), np.float32, ('batch', 'heads', 'length', None)),
      'weights': ((b, h, s, s), act, ('batch', 'heads', 'length', None)),
      'qkv': ((3, b, s, h * config.head_dim), act,
              (None, 'batch', 'length', 'joined_kv')),
      'mlp': ((len(config.mlp_activations) + 1, b, s, config.mlp_dim), act,
              (None, 'batch', 'length', 'mlp')),
      'residual': ((2, b, s, config.emb_dim), act,
                   (None, 'batch', 'length', 'embed')),
  }
  shapes = {k: jax.ShapeDtypeStruct(shape, dtype)
            for k, (shape, dtype, _) in tensors.items()}
  logical = {k: PartitionSpec(*axes) for k, (_, _, axes) in tensors.items()}
  specs = partitioning.logical_to_mesh_specs(logical, shapes, rules, axis_sizes)
  per = memory.leaf_bytes_per_device(shapes, specs, axis_sizes)
  per = {k.strip("[]'"): v for k, v in per.items()}
  attention = per['logits'] + per['weights'] + per['qkv']
  return max(attention, per['mlp']) + per['residual']


# The decoder kernels the speculative loop reads in the transposed layout (a second copy per chip).
LOOP_KERNELS = (('self_attention', 'query'), ('self_attention', 'key'), ('self_attention', 'value'),
                ('encoder_decoder_attention', 'query'))


def loop_kernel_bytes(config: network.T5Config, axis_sizes: Mapping[str, int], rules,
                      param_dtype: str) -> int:
  """Per chip, one more copy of every decoder layer's LOOP_KERNELS in `param_dtype`."""
  params = memory.abstract_params(config)
  specs = partitioning.param_specs(network.Transformer(config), params, rules, axis_sizes)
  decoder, decoder_specs = params['decoder'], specs['decoder']
  shapes, kernel_specs = {}, {}
  for i in range(config.num_decoder_layers):
    for block, kernel in LOOP_KERNELS:
      name = f'layers_{i}/{block}/{kernel}'
      shapes[name] = decoder[f'layers_{i}'][block][kernel]['kernel']
      kernel_specs[name] = decoder_specs[f'layers_{i}'][block][kernel]['kernel']
  return memory.bytes_per_device(shapes, kernel_specs, axis_sizes, param_dtype)


def plan_rows(target: network.T5Config, drafter: network.T5Config,
              slices: Mapping[str, int], tasks: Mapping[str, Sequence[int]],
              batches: Iterable[int], gamma: int, rules, param_dtype: str,
              hbm_gib: float, headroom: float) -> list:
  """One dict per (slice, mesh split, task, batch), byte counts per chip."""
  rows = []
  for slice_name, chips in slices.items():
    for data, model in mesh_splits(chips):
      sizes = {'data': data, 'model': model}
      for task, (inputs, targets) in tasks.items():
        for batch in batches:
          kw = dict(batch_size=batch, input_len=inputs,
                    cache_len=targets + gamma + 1, param_dtype=param_dtype)
          t = memory.network_memory(target, sizes, rules, **kw)
          d = memory.network_memory(drafter, sizes, rules, **kw)
          acts = encoder_activation_bytes(target, sizes, rules, batch, inputs)
          loop = (loop_kernel_bytes(target, sizes, rules, param_dtype) +
                  loop_kernel_bytes(drafter, sizes, rules, param_dtype))
          code = int(CODE_GIB * GIB)
          total = (t['params'] + d['params'] + t['self_cache'] +
                   t['cross_cache'] + d['self_cache'] + d['cross_cache'] + acts +
                   loop + code)
          rows.append(dict(
              slice=slice_name, chips=chips, data=data, model=model, task=task,
              inputs=inputs, targets=targets, batch=batch,
              target=t, drafter=d, activations=acts, loop_kernels=loop,
              code=code, total=total,
              fits=total * headroom <= hbm_gib * GIB))
  return rows


def smallest_fits(rows: list) -> dict:
  """(task, batch) -> the first fitting row: fewest chips, then fewest bytes."""
  best = {}
  for r in sorted(rows, key=lambda r: (r['chips'], r['total'])):
    if r['fits']:
      best.setdefault((r['task'], r['batch']), r)
  return best


def build_report(target: network.T5Config, drafter: network.T5Config,
                 command: str, slices: Mapping[str, int] = SLICES,
                 tasks: Mapping[str, Sequence[int]] = TASKS,
                 batches: Sequence[int] = BATCHES, gamma: int = GAMMA,
                 param_dtype: str = 'bfloat16', headroom: float = HEADROOM,
                 parameter_partitioning_dims: int = 1,
                 activation_partitioning_dims: int = 1) -> dict:
  """The plan's report: settings, one-copy param sizes and every row.

  `command` is the command line that made it, recorded in the report.
  """
  rules = partitioning.standard_logical_axis_rules(
      activation_partitioning_dims, parameter_partitioning_dims)
  rows = plan_rows(target, drafter, slices, tasks, batches, gamma, rules,
                   param_dtype, HBM_PER_CHIP_GIB, headroom)
  return {
      'command': command,
      'date': datetime.date.today().isoformat(),
      'machine': machine_description(),
      'settings': dict(
          gamma=gamma, param_dtype=param_dtype,
          headroom=headroom, hbm_gib=HBM_PER_CHIP_GIB,
          rules=(f'{parameter_partitioning_dims}-D parameter / '
                 f'{activation_partitioning_dims}-D activation'),
          tasks=tasks, batches=list(batches), slices=slices),
      'target_params_total': rows[0]['target']['params_total'],
      'drafter_params_total': rows[0]['drafter']['params_total'],
      'rows': rows,
  }


def render_markdown(report: dict) -> str:
  """The report as results/xxl_memory_plan.md."""
  rows, s = report['rows'], report['settings']
  lines = [
      '# T5-XXL + T5-small on TPU v4: memory per chip',
      '',
      f'Made by `{report["command"]}` on {report["date"]} ({report["machine"]}).',
      'Computed abstractly (jax.eval_shape; no TPU involved) by '
      'scripts/xxl_memory_plan.py with specdec.partitioning\'s '
      f'{s["rules"]} rules. GiB = 2^30 bytes, per chip.',
      '',
      f'- Params in {s["param_dtype"]}: target {format_gib(report["target_params_total"])} '
      f'GiB, drafter {format_gib(report["drafter_params_total"])} GiB in one copy.',
      f'- Caches in bfloat16: self-attention K/V for targets + gamma + 1 '
      f'positions (gamma = {s["gamma"]}), cross-attention K/V for the inputs.',
      '- Activations: an estimate of the encoder\'s peak working set '
      '(see the script\'s docstring).',
      '- Loop kernels: the second, transposed copy of each decoder\'s self-attention q/k/v and '
      'cross-attention q kernels that XLA\'s TPU compiler makes for the decode loop; code: '
      f'{CODE_GIB:g} GiB of generated code (both from the compiled programs, results/tpu_compile/).',
      f'- fits: {s["headroom"]} x total <= {s["hbm_gib"]} GiB HBM per v4 chip.',
      '- Non-divisible dimensions are replicated and counted in full '
      '(batch 1 on data > 1; the drafter\'s 6 heads on model > 2).',
      '',
      '## Smallest fitting layout',
      '',
      '| task (inputs/targets) | batch | slice | data x model | total GiB/chip |',
      '|---|---|---|---|---|',
  ]
  best = smallest_fits(rows)
  for task, (inputs, targets) in s['tasks'].items():
    for batch in s['batches']:
      r = best.get((task, batch))
      where = (f'{r["slice"]} | {r["data"]} x {r["model"]} | {format_gib(r["total"])}'
               if r else 'none of these | - | -')
      lines.append(f'| {TASK_NAMES.get(task, task)} ({inputs}/{targets}) | '
                   f'{batch} | {where} |')
  for task, (inputs, targets) in s['tasks'].items():
    for batch in s['batches']:
      lines += [
          '',
          f'## {TASK_NAMES.get(task, task)}, inputs {inputs}, targets '
          f'{targets}, batch {batch}',
          '',
          '| slice | data x model | target params | drafter params | '
          'target self K/V | target cross K/V | drafter caches | activations '
          '(est.) | loop kernels | code | total | fits |',
          '|---|---|---|---|---|---|---|---|---|---|---|---|',
      ]
      for r in rows:
        if r['task'] != task or r['batch'] != batch:
          continue
        t, d = r['target'], r['drafter']
        lines.append(
            f'| {r["slice"]} | {r["data"]} x {r["model"]} | '
            f'{format_gib(t["params"])} | {format_gib(d["params"])} | '
            f'{format_gib(t["self_cache"])} | {format_gib(t["cross_cache"])} | '
            f'{format_gib(d["self_cache"] + d["cross_cache"])} | '
            f'{format_gib(r["activations"])} | {format_gib(r["loop_kernels"])} | '
            f'{format_gib(r["code"])} | {format_gib(r["total"])} | '
            f'{"yes" if r["fits"] else "no"} |')
  return '\n'.join(lines) + '\n'
