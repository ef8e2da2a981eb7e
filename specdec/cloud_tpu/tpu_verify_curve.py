"""A TPU verify-cost curve predicted from compiled programs, not measured, and Table 2's speedups from it.

The XXL target's k-token decode step (k = 1 ... 16, batch 1 and 8) and each drafter's one-token step are
compiled for the slice (`tpu_programs.lower_decode_step`: one `tokens_to_logits` call into a cache laid out as the
sharded decode lays it out). Each call's time is predicted from the compiler's per-chip figures against the
chip's published peaks, plus a stated cost per collective:

  seconds = max(FLOPs / peak FLOP/s, bytes accessed / HBM bytes/s) + collectives x COLLECTIVE_SECONDS

From that curve: t_p (k = 1), t_verify (k = γ + 1), t_q (the drafter's step), c = t_q / t_p, and with the
paper's α and γ (`tables.PAPER_TABLE2`) the speedup `theory.predicted_speedup_from_costs` gives, beside the
paper's measured one. The curve is compiled at WMT's lengths (256 inputs, 256 targets) and serves both tasks.
"""

import json
import os
from typing import Any, Callable, Dict, List, Mapping, Sequence

from specdec import fileio
from specdec.bench import tables
from specdec import theory
from specdec.cloud_tpu import tpu_programs

# Published per-chip peaks (Cloud TPU v4: 275 TFLOP/s bf16, 1.2 TB/s HBM).
PEAKS = {'v4': {'flops': 275e12, 'hbm_bytes_per_s': 1.2e12}}
# A stated assumption, not a measurement: what one collective costs at batch 1 (small messages on the ICI are
# latency-bound; ~10 µs each).
COLLECTIVE_SECONDS = 10e-6
KS = tuple(range(1, 17))
BATCHES = (1, 8)
CURVE_ROW = 'experiments/table2/xxl_ende_small_t0.gin'
DRAFTER_ROWS = {'small': 'experiments/table2/xxl_ende_small_t0.gin',
                'base': 'experiments/table2/xxl_ende_base_t0.gin',
                'large': 'experiments/table2/xxl_ende_large_t0.gin'}
LABEL = 'predicted from compiled programs, not measured'


def target_name(k: int, batch: int) -> str:
  return f'target_k{k}_b{batch}'


def drafter_name(drafter: str, batch: int) -> str:
  return f'drafter_{drafter}_b{batch}'


def curve_programs(mesh_of: Callable[[int], Any], ks: Sequence[int] = KS, batches: Sequence[int] = BATCHES,
                   drafter_rows: Mapping[str, str] = DRAFTER_ROWS, bindings: Sequence[str] = ()):
  """Yields the target's k-token steps and each drafter's one-token step, as `tpu_programs.Program`s."""
  from specdec.bench import benchmark  # pylint: disable=g-import-not-at-top
  for drafter, gin_file in drafter_rows.items():
    run = tpu_programs.read_decode_run(gin_file, mesh_of, bindings)
    pair = benchmark.ModelPair(run.target_module, run.target_params, run.drafter_module, run.drafter_params)
    _, speculative = benchmark.sharded_decoders(pair, None, run.setting, run.mesh)
    params = {'target': run.target_params, 'drafter': run.drafter_params}
    first = drafter == next(iter(drafter_rows))
    for batch in batches:
      shapes = tpu_programs.decode_batch_shapes(batch, run.lengths)
      settings = dict(mesh=f'{dict(run.mesh.shape)["data"]} x {dict(run.mesh.shape)["model"]}', batch=batch,
                      inputs=run.lengths['inputs'], targets=run.lengths['targets'], dtype=run.dtype)
      if first:  # the target's curve, once
        for k in ks:
          yield tpu_programs.Program(
              target_name(k, batch), 'verify', True, dict(settings, tokens=k),
              lambda s=shapes, k=k, sp=speculative, p=params: tpu_programs.lower_decode_step(sp, 'target', p, s, k,
                                                                                            k - 1))
      yield tpu_programs.Program(
          drafter_name(drafter, batch), 'draft_step', True, dict(settings, drafter=drafter, tokens=1),
          lambda s=shapes, sp=speculative, p=params: tpu_programs.lower_decode_step(sp, 'drafter', p, s, 1, 7))


def call_seconds(record: Mapping[str, Any], generation: str = 'v4',
                 collective_seconds: float = COLLECTIVE_SECONDS) -> float:
  """One call's predicted seconds from its compiled figures (roofline of FLOPs and bytes, plus collectives)."""
  peak = PEAKS[generation]
  roofline = max(record['flops'] / peak['flops'], record['bytes_accessed'] / peak['hbm_bytes_per_s'])
  return roofline + sum(record['collectives'].values()) * collective_seconds


def compiled_seconds(programs: Mapping[str, Mapping[str, Any]], generation: str = 'v4') -> Dict[str, Dict]:
  """{'target': {(k, batch): s}, 'drafter': {(name, batch): s}} predicted from the compiled records."""
  seconds = {'target': {}, 'drafter': {}}
  for k in KS:
    for b in BATCHES:
      record = programs.get(target_name(k, b))
      if record is not None and 'error' not in record:
        seconds['target'][(k, b)] = call_seconds(record, generation)
  for drafter in DRAFTER_ROWS:
    for b in BATCHES:
      record = programs.get(drafter_name(drafter, b))
      if record is not None and 'error' not in record:
        seconds['drafter'][(drafter, b)] = call_seconds(record, generation)
  return seconds


def table2_rows(seconds: Mapping[str, Mapping[Any, float]]) -> List[Dict[str, Any]]:
  """The twelve Table-2 rows at batch 1 from call times: c, verify cost ratio and the speedup beside the paper's.

  Raises KeyError naming the first call time missing.
  """
  rows = []
  target, drafters = seconds['target'], seconds['drafter']
  if (1, 1) not in target:
    raise KeyError(target_name(1, 1))
  target_1 = target[(1, 1)]
  for (task, drafter, temperature), (gamma, alpha, paper_speedup) in tables.PAPER_TABLE2.items():
    if (gamma + 1, 1) not in target:
      raise KeyError(target_name(gamma + 1, 1))
    if (drafter, 1) not in drafters:
      raise KeyError(drafter_name(drafter, 1))
    verify, draft = target[(gamma + 1, 1)], drafters[(drafter, 1)]
    rows.append({'task': task, 'drafter': drafter, 'temperature': temperature, 'gamma': gamma, 'alpha': alpha,
                 'c': draft / target_1, 'verify_ratio': verify / target_1,
                 'predicted_speedup': float(theory.predicted_speedup_from_costs(alpha, gamma, draft, target_1,
                                                                                 verify)),
                 'paper_speedup': paper_speedup})
  return rows


def predictions(programs: Mapping[str, Mapping[str, Any]], generation: str = 'v4') -> List[Dict[str, Any]]:
  """The twelve Table-2 rows at batch 1 from the compiled programs' predicted call times."""
  return table2_rows(compiled_seconds(programs, generation))


# ------------------------------------------------------------------------------------------------------------
# A measured curve (scripts/accelerator_check.py on a TPU) instead of the predicted one.
# ------------------------------------------------------------------------------------------------------------

MEASURED_TARGET = 'xxl'
ACCELERATOR_RESULTS = 'results/accelerator'


def measured_seconds(report: Mapping[str, Any], target: str = MEASURED_TARGET) -> Dict[str, Dict]:
  """Call times in the form `compiled_seconds` gives, from an accelerator check's report.json.

  The target's curve is `verify_curves[target][batch]['call_s']` (k = `tokens`), the drafters' steps
  `costs[target]['draft_call_s']` (measured at batch 1, interleaved with the target's own step). Raises ValueError
  when the report has no curve or costs for `target`.
  """
  curves = report.get('verify_curves', {}).get(target)
  costs = report.get('costs', {}).get(target)
  if not curves or not costs:
    raise ValueError(f'the accelerator report has no verify-cost curve and costs for the {target!r} target '
                     f'(it has curves for {sorted(report.get("verify_curves", {}))}, costs for '
                     f'{sorted(report.get("costs", {}))}).')
  seconds = {'target': {}, 'drafter': {}}
  for batch, curve in curves.items():
    for k, call_s in zip(curve['tokens'], curve['call_s']):
      seconds['target'][(int(k), int(batch))] = float(call_s)
  for drafter, call_s in costs['draft_call_s'].items():
    seconds['drafter'][(drafter, 1)] = float(call_s)
  return seconds


def find_measured_report(repo: str, target: str = MEASURED_TARGET) -> str:
  """The newest accelerator check's report.json run on a TPU with `target`'s curve and costs, or '' if none."""
  root = os.path.join(repo, ACCELERATOR_RESULTS)
  found = []
  for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    path = os.path.join(root, name, 'report.json')
    if not os.path.exists(path):
      continue
    with open(path, encoding='utf-8') as f:
      report = json.load(f)
    if (report.get('machine', {}).get('platform') == 'tpu' and target in report.get('verify_curves', {})
        and target in report.get('costs', {})):
      found.append((report.get('date', ''), path))
  return max(found)[1] if found else ''


def measured_markdown(report: Mapping[str, Any], report_path: str, compiled: Mapping[str, Any] = None,
                      target: str = MEASURED_TARGET, generation: str = 'v4') -> str:
  """The measured curve (beside the compiled prediction where there is one) and Table 2's speedups from it."""
  seconds = measured_seconds(report, target)
  machine = report.get('machine', {})
  device = f'{machine.get("device_kind", "?")} ×{machine.get("device_count", "?")}'
  predicted = compiled_seconds(compiled['programs'], generation)['target'] if compiled else {}
  lines = [f'# T5-{target.upper()} verify-cost curve measured on {device}', '',
           f'Measured by `{report.get("command", "scripts/accelerator_check.py")}` ({report_path}, '
           f'{report.get("date", "")}, jax {machine.get("jax", "?")}); Table 2 below from these measured call times '
           'and the paper\'s α and γ. The column "predicted" is the compiled programs\' roofline (`--verify_curve`) '
           f'for {compiled["slice"]["name"] if compiled else "no slice"}, where it exists.', '',
           '| k | batch | measured ms | ratio to k = 1 | predicted ms | measured / predicted |', '|---|---|---|---|---|---|']
  for (k, batch), call_s in sorted(seconds['target'].items(), key=lambda kv: (kv[0][1], kv[0][0])):
    base = seconds['target'].get((1, batch))
    ratio = f'{call_s / base:.2f}' if base else ''
    guess = predicted.get((k, batch))
    lines.append(f'| {k} | {batch} | {call_s * 1e3:.3f} | {ratio} | '
                 + (f'{guess * 1e3:.3f} | {call_s / guess:.2f} |' if guess else ' | |'))
  lines += ['', '| drafter | measured ms (batch 1) |', '|---|---|']
  for (drafter, _), call_s in sorted(seconds['drafter'].items()):
    lines.append(f'| {drafter} | {call_s * 1e3:.3f} |')
  try:
    rows = table2_rows(seconds)
  except KeyError as e:
    lines += ['', f'(Table 2 needs {e} measured.)']
    return '\n'.join(lines) + '\n'
  lines += ['', f'## Table 2 at batch 1: speedups from the call times measured on {device}, beside the paper\'s', '',
            'speedup = E[tokens] t_p / (γ t_q + t_verify) (`theory.predicted_speedup_from_costs`) with the paper\'s α '
            'and γ and the measured t_p, t_q, t_verify.', '',
            *_table2_lines(rows, 'speedup from measured costs')]
  return '\n'.join(lines) + '\n'


def write_measured_markdown(report_path: str, md_path: str, compiled_json: str = '', repo: str = '') -> None:
  """`measured_markdown` of the report at `report_path` (beside the compiled curve in `compiled_json`, if any)."""
  with open(report_path, encoding='utf-8') as f:
    report = json.load(f)
  compiled = None
  if compiled_json and os.path.exists(compiled_json):
    with open(compiled_json, encoding='utf-8') as f:
      compiled = json.load(f)
  shown = os.path.relpath(report_path, repo) if repo else report_path
  fileio.atomic_write(md_path, measured_markdown(report, shown, compiled).encode())


def markdown(results: Mapping[str, Any], generation: str = 'v4') -> str:
  programs = results['programs']
  peak = PEAKS[generation]
  lines = [f'# T5-XXL verify-cost curve on {results["slice"]["name"]}: {LABEL}', '',
           'Made by ' + ', then '.join(f'`{c}`' for c in results.get('commands', [])) +
           f' with jax {results.get("jax")}, libtpu {results.get("libtpu")}.', '',
           f'- **{LABEL.capitalize()}.** Each call compiled for the slice (per chip: XLA\'s FLOPs and bytes '
           f'accessed), its time = max(FLOPs / {peak["flops"] / 1e12:g} TFLOP/s, bytes / '
           f'{peak["hbm_bytes_per_s"] / 1e12:g} TB/s) + collectives x {COLLECTIVE_SECONDS * 1e6:g} µs '
           '(a stated assumption, not measured). No TPU ran anything.',
           '- XLA\'s bytes accessed count every operand of every operation, so they can exceed the bytes the chip '
           'reads from HBM (the target\'s step reads more than its decoder\'s params per chip here): the times are '
           'an upper bound where memory-bound; the collectives\' stated cost dominates the drafters\' steps.',
           '- Target: one k-token decode step of T5 1.1 XXL into its cache (WMT lengths 256 / 256); drafters: one '
           'token.', '',
           '| k | batch 1 ms (' + LABEL + ') | ratio to k = 1 | batch 8 ms | ratio to k = 1 |',
           '|---|---|---|---|---|']
  base = {b: call_seconds(programs[target_name(1, b)], generation) for b in BATCHES
          if target_name(1, b) in programs}
  for k in KS:
    cells = []
    for b in BATCHES:
      record = programs.get(target_name(k, b))
      if record is None or 'error' in record or b not in base:
        cells += ['', '']
        continue
      seconds = call_seconds(record, generation)
      cells += [f'{seconds * 1e3:.3f}', f'{seconds / base[b]:.2f}']
    lines.append(f'| {k} | ' + ' | '.join(cells) + ' |')
  lines += ['', '| drafter | batch 1 ms | batch 8 ms |', '|---|---|---|']
  for drafter in DRAFTER_ROWS:
    cells = [f'{call_seconds(programs[drafter_name(drafter, b)], generation) * 1e3:.3f}'
             if drafter_name(drafter, b) in programs and 'error' not in programs[drafter_name(drafter, b)] else ''
             for b in BATCHES]
    lines.append(f'| {drafter} | ' + ' | '.join(cells) + ' |')
  try:
    rows = predictions(programs, generation)
  except KeyError as e:
    lines += ['', f'(Table 2 predictions need {e} compiled first.)']
    return '\n'.join(lines) + '\n'
  lines += ['', f'## Table 2 at batch 1: speedups {LABEL}, beside the paper\'s measured ones', '',
            't_p = the target\'s 1-token step, t_verify = its (γ + 1)-token step, t_q = the drafter\'s step, c = '
            't_q / t_p; speedup = E[tokens] t_p / (γ t_q + t_verify) (`theory.predicted_speedup_from_costs`) with '
            'the paper\'s α and γ. CNN/DM rows use the same curve (WMT lengths; CNN/DM\'s 512 inputs only lengthen '
            'the cross-attention cache).', '',
            *_table2_lines(rows, 'predicted speedup')]
  return '\n'.join(lines) + '\n'


def _table2_lines(rows: Sequence[Mapping[str, Any]], speedup_header: str) -> List[str]:
  """The Table-2 rows as a Markdown table, the speedup column headed `speedup_header`."""
  lines = ['| task | drafter | temperature | γ | α (paper) | c | verify / one step | ' + speedup_header
           + ' | paper speedup |', '|---|---|---|---|---|---|---|---|---|']
  for row in rows:
    lines.append(f'| {row["task"]} | {row["drafter"]} | {row["temperature"]:g} | {row["gamma"]} | '
                 f'{row["alpha"]:.2f} | {row["c"]:.3f} | {row["verify_ratio"]:.2f} | '
                 f'{row["predicted_speedup"]:.2f}X | {row["paper_speedup"]:.1f}X |')
  return lines


def write_markdown(json_path: str, md_path: str) -> None:
  with open(json_path, encoding='utf-8') as f:
    results = json.load(f)
  fileio.atomic_write(md_path, markdown(results).encode())
  fileio.atomic_write(os.path.splitext(md_path)[0] + '.predictions.json',
                      (json.dumps({'label': LABEL, 'commands': results.get('commands', []),
                                   'rows': predictions(results['programs'])}, indent=2) + '\n').encode())
