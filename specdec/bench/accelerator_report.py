"""The accelerator check's report (`accelerator.report`) as Markdown; its figure is `plots.plot_accelerator`.

The ceiling's rows are the oracle drafter's, an instrument of controlled acceptance (`ceiling_report.CONTROLLED`),
never a trained drafter's.
"""

from typing import Any, List, Mapping

from specdec.bench import accelerator
from specdec.bench import ceiling_report
from specdec.bench import reporting

_GIB = 2 ** 30
_order = accelerator.by_size


def markdown(rep: Mapping[str, Any], header: str = '') -> str:
  """report.md: the summary line, the device, what was skipped or not reached, the verify curves, c isolated
  and in the loop, the ceiling (measured, Thm 3.8, with the small drafter's c), the tests, the parts' times."""
  s, m, mem = rep['settings'], rep['machine'], rep['memory']
  lines = ['# The accelerator check: the paper\'s regime measured on this device', '']
  if header:
    lines += [header, '']
  lines += [f"**{rep['summary']}**", '',
            f"Device: {m['backend']} · {m['device_kind']} × {m['device_count']} · {m.get('platform_version', '')} · "
            f"jax {m['jax']} · Python {m['python']} · {m['processor']}, {m['cpu_count']} CPUs"
            f"{reporting.xla_flags_note(m)}.", '',
            'Every model has random bfloat16 weights of the T5 1.1 shapes (the sizes of `gin/models/`); '
            'speed does not depend on what the weights say. Inputs are random ids: '
            f"{s['input_length']} input tokens, {s['decode_length']} decode positions. Calls are timed inside "
            f"one compiled scan of {s['num_calls']} calls, the fastest of {s['repeats']} repeats, compilation "
            'excluded.', '']
  lines += ['## Shapes and memory', '',
            f"The device holds {mem['limit_bytes'] / _GIB:.1f} GiB ({mem['limit_source']}); a target runs where "
            f"its params, its caches at the largest batch and its drafters need at most {mem['headroom']:.0%} "
            'of that.', '', '| shape | parameters | params GiB (bf16) | needed as a target GiB | measured |',
            '|---|---|---|---|---|']
  for name in _order(mem['shapes']):
    e = mem['shapes'][name]
    lines.append(f"| {name} | {e['num_params'] / 1e6:,.{0 if e['num_params'] >= 1e7 else 3}f}M | {e['params_bytes'] / _GIB:.2f} | "
                 f"{e['needed_bytes'] / _GIB:.2f} | {'yes' if e['fits'] else 'skipped: ' + e['reason']} |")
  if rep['not_reached']:
    lines += ['', f"**Not reached within the {rep['budget_s']:.0f} s budget** (a rerun resumes and measures "
              'them; finished parts are kept): ' + ', '.join(f'`{k}`' for k in rep['not_reached']) + '.']
  if rep['errors']:
    lines += ['', '**Parts that failed** (a rerun tries them again):', '']
    for key, e in rep['errors'].items():
      first = e['message'].strip().splitlines()[0]
      lines.append(f'- `{key}` after {e["seconds"]:.1f} s: {first}')
  lines += _curve_lines(rep) + _cost_lines(rep) + _ceiling_lines(rep) + _test_lines(rep)
  lines += ['', '## Where the run\'s time went', '', '| part | seconds (compilation included) |', '|---|---|']
  for key in rep['plan']:
    if key in rep['part_seconds']:
      lines.append(f"| `{key}` | {rep['part_seconds'][key]:.1f} |")
  return '\n'.join(lines) + '\n'


def _curve_lines(rep) -> List[str]:
  curves = rep['verify_curves']
  if not curves:
    return []
  columns = [(t, b) for t in _order(curves) for b in sorted(curves[t], key=int)]
  lines = ['', '## Verify-cost curve', '',
           'A k-token target call over a 1-token call (`profiling.verify_cost_curve`): a round verifies γ '
           'drafts in one call of γ + 1 tokens, and Thm 3.8 assumes that call costs one 1-token call. The '
           'first row is the 1-token call in ms.', '',
           '| k | ' + ' | '.join(f'{t} b{b}' for t, b in columns) + ' |', '|---|' + '---|' * len(columns)]
  first = curves[columns[0][0]][columns[0][1]]
  lines.append('| 1-token ms | ' + ' | '.join(f"{1000 * curves[t][b]['call_s'][0]:.3f}" for t, b in columns) + ' |')
  for i, k in enumerate(first['tokens']):
    cells = []
    for t, b in columns:
      ratio = curves[t][b]['ratio']
      cells.append(f'{ratio[i]:.2f}' if i < len(ratio) else '-')
    lines.append(f'| {k} | ' + ' | '.join(cells) + ' |')
  return lines


def _cost_lines(rep) -> List[str]:
  if not rep['costs']:
    return []
  lines = ['', '## c: a draft step over a target call (Def. 3.7; the paper\'s Table 4)', '',
           'Isolated: one drafter call over one target call, batch 1, each in its own compiled scan, all '
           'interleaved. In the loop: one draft step of the compiled draft phase (γ = '
           f"{rep['settings']['cost_gamma']}) over one baseline round (`profiling.time_phases`). The feature "
           "head is one decoder layer of the target's width reading the target's features and projection; "
           'the n-gram tables are lookups.', '',
           '| target | drafter | draft call ms | target call ms | **c** | c in the loop |', '|---|---|---|---|---|---|']
  for target in _order(rep['costs']):
    c = rep['costs'][target]
    loop = rep['in_loop'].get(target, {})
    for name, value in c['c'].items():
      lines.append(f"| {target} | {name} | {1000 * c['draft_call_s'][name]:.3f} | {1000 * c['target_call_s']:.3f} | "
                   f"**{value:.3f}** | {reporting.fmt(loop.get('c_in_loop', {}).get(name), '.3f')} |")
  return lines


def _ceiling_lines(rep) -> List[str]:
  ceil = rep.get('ceiling')
  if not ceil:
    return []
  crep = ceil['report']
  paper = rep['paper']
  lines = ['', f"## The ceiling at {ceil['target']} shape: speedup against a controlled acceptance rate", '',
           f"The oracle drafter ({ceiling_report.CONTROLLED}, `specdec/bench/oracle.py`) proposes the target's own "
           'greedy token with probability α* and a wrong one otherwise, at the cost of a lookup; the target '
           "verifies every draft (greedy outputs stay the baseline's). "
           f"{crep['identity']['examples']} random inputs, batch 1, each decoded by the baseline and by every "
           'oracle decoder interleaved. Thm 3.8 here uses the measured α and the in-loop c of the oracle.']
  if ceil.get('with_drafter'):
    lines += ['', f"\"With {ceil['drafter']}'s c\": the same decodes, each round paying γ draft steps of the "
              f"{ceil['drafter']} drafter measured in the loop on this device (c = {ceil['drafter_c_in_loop']:.3f}) "
              f"instead of the oracle's lookup: a drafter as good as α* and as costly as {ceil['drafter']} here."]
  with_drafter = {(r['alpha_target'], r['gamma']): r for r in ceil.get('with_drafter', [])}
  lines += ['', '| α* | γ | α measured | tokens / call | **measured** | in-loop predicted | Thm 3.8 | '
            'with the drafter\'s c | Thm 3.8 with its c | identical |', '|---|---|---|---|---|---|---|---|---|---|']
  for r in crep['rows']:
    w = with_drafter.get((r['alpha_target'], r['gamma']), {})
    lines.append(f"| {r['alpha_target']:g} | {r['gamma']} | {r['alpha_measured']:.3f} | {r['tokens_per_call']:.2f} | "
                 f"**{r['measured_speedup']:.2f}×** | {r['predicted_in_loop']:.2f}× | {r['predicted_thm38']:.2f}× | "
                 f"{reporting.fmt(w.get('speedup'))}× | {reporting.fmt(w.get('thm38_with_drafter_c'))}× | "
                 f"{'100%' if r['identical'] else 'NO'} |")
  lines += ['', f"The paper (Table 2): T5-XXL with T5-small on En→De, greedy, α {paper['alpha']}, γ "
            f"{paper['gamma']}: **{paper['speedup']}×** on one {paper['chip']}."]
  return lines


def _test_lines(rep) -> List[str]:
  tests = rep.get('tests')
  if tests is None:
    return ['', '## The loop\'s tests on this backend', '', 'Not run in this report.']
  counts = tests['counts']
  state = 'finished' if tests['finished'] else f"cut off after {tests['seconds']:.0f} s (the rest not run)"
  return ['', '## The loop\'s tests on this backend', '',
          f"`python -m pytest -v {' '.join(tests['files'])}`"
          f"{' -n ' + str(tests['workers']) if tests['workers'] > 1 else ''}, float32 products at "
          f"`JAX_DEFAULT_MATMUL_PRECISION={tests['matmul_precision']}`: {state} in {tests['seconds']:.0f} s, "
          f"return code {tests['returncode']}.", '',
          '| passed | failed | errors | skipped |', '|---|---|---|---|',
          f"| {counts.get('passed', 0)} | {counts.get('failed', 0)} | {counts.get('error', 0)} | "
          f"{counts.get('skipped', 0)} |"]
