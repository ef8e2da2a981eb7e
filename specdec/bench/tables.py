"""The paper's Table 2 / Table 3 numbers, and measured benchmark summaries laid out beside them."""

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from specdec.bench import auto_gamma
from specdec.bench import machine_load
from specdec.bench import reporting
from specdec import task_names

# PAPER.md Table 2 (T5-XXL target): (task, drafter, temperature) -> (γ, α, speedup).
PAPER_TABLE2: Dict[Tuple[str, str, float], Tuple[int, float, float]] = {
    ('ende', 'small', 0.0): (7, 0.75, 3.4), ('ende', 'base', 0.0): (7, 0.80, 2.8),
    ('ende', 'large', 0.0): (7, 0.82, 1.7), ('ende', 'small', 1.0): (7, 0.62, 2.6),
    ('ende', 'base', 1.0): (5, 0.68, 2.4), ('ende', 'large', 1.0): (3, 0.71, 1.4),
    ('cnndm', 'small', 0.0): (5, 0.65, 3.1), ('cnndm', 'base', 0.0): (5, 0.73, 3.0),
    ('cnndm', 'large', 0.0): (3, 0.74, 2.2), ('cnndm', 'small', 1.0): (5, 0.53, 2.3),
    ('cnndm', 'base', 1.0): (3, 0.55, 2.2), ('cnndm', 'large', 1.0): (3, 0.56, 1.7),
}
# PAPER.md Table 3, T5-XXL rows: (task, drafter) -> (α at t=0, α at t=1).
PAPER_TABLE3: Dict[Tuple[str, str], Tuple[float, float]] = {
    ('ende', 'unigram'): (0.08, 0.07), ('ende', 'bigram'): (0.20, 0.19), ('ende', 'small'): (0.75, 0.62),
    ('ende', 'base'): (0.80, 0.68), ('ende', 'large'): (0.82, 0.71),
    ('cnndm', 'unigram'): (0.13, 0.08), ('cnndm', 'bigram'): (0.23, 0.16), ('cnndm', 'small'): (0.65, 0.53),
    ('cnndm', 'base'): (0.73, 0.55), ('cnndm', 'large'): (0.74, 0.56),
}
# The CPU family's drafters stand in for the paper's by their size relative to the target
# (T5-small / base / large are ~0.7% / 2% / 7% of T5-XXL; d3 / d2 / d1 are 2% / 4% / 24% of the CPU target).
PAPER_DRAFTER_FOR = {'d3': 'small', 'd2': 'base', 'd1': 'large', 'd1kd': 'large',
                     'unigram': 'unigram', 'bigram': 'bigram',
                     'small': 'small', 'base': 'base', 'large': 'large',
                     't5_1_1_small': 'small', 't5_1_1_base': 'base', 't5_1_1_large': 'large'}
TASK_KIND = {task_names.ENDE_LOCAL_TASK: 'ende', task_names.WMT_ENDE_TASK: 'ende',
             task_names.SUMMARIZE_LOCAL_TASK: 'cnndm', task_names.CNN_DAILYMAIL_TASK: 'cnndm'}
TASK_LABEL = {task_names.ENDE_LOCAL_TASK: 'En→De (DDTP)', task_names.SUMMARIZE_LOCAL_TASK: 'summ. (DDTP)',
              task_names.WMT_ENDE_TASK: 'EnDe (WMT)', task_names.CNN_DAILYMAIL_TASK: 'CNNDM'}


def paper_row(task: str, drafter: str, temperature: float) -> Optional[Tuple[int, float, float]]:
  key = (TASK_KIND.get(task), PAPER_DRAFTER_FOR.get(drafter), float(temperature))
  return PAPER_TABLE2.get(key)


def gamma_label(summary: Mapping[str, Any]) -> str:
  """A benchmark summary's γ, marked where `gamma = 'auto'` chose it (`auto_gamma`)."""
  gamma = summary['setting']['gamma']
  return f'{gamma} (auto)' if summary.get('gamma_auto') else str(gamma)


def table2_markdown(summaries: Sequence[Mapping[str, Any]], title: str = 'Table 2 analogue') -> str:
  """One line per benchmark summary, with the paper's row for the corresponding drafter beside it."""
  lines = [
      f'## {title}', '',
      '| task | drafter | temp | γ | batch | α (kept/judged) | α (Σmin) | tokens/call | c | verify/1-token | '
      'c in loop | a in loop | predicted Thm 3.8 | predicted (costs) | predicted (in loop) | '
      '**measured speedup** | α needed for 1.5× / 2× | identical | examples | paper drafter: γ, α, speedup |',
      '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for s in summaries:
    temp = s['setting']['temperature']
    paper = paper_row(s['task'], s['drafter'], temp)
    paper_text = (f"T5-{PAPER_DRAFTER_FOR.get(s['drafter'])}: {paper[0]}, {paper[1]:.2f}, {paper[2]:.1f}×"
                  if paper else '-')
    needed_by = s.get('alpha_needed', {})  # None for a target no α reaches; missing in older summaries
    needed = ' / '.join(reporting.fmt(needed_by[k], none='unreachable') if k in needed_by else '-'
                        for k in ('1.5', '2.0'))
    identical = ('-' if s.get('identical_rate') is None
                 else f"{100 * s['identical_rate']:.0f}%")
    lines.append(
        f"| {TASK_LABEL.get(s['task'], s['task'])} | {s['drafter']} | {temp:g} | {gamma_label(s)} | "
        f"{s['setting'].get('batch_size', 1)} | "
        f"{s['alpha_accept']:.2f} | {s['alpha_overlap']:.2f} | {s['tokens_per_target_call']:.2f} | "
        f"{s['costs']['c']:.3f} | {s['costs']['verify_cost_ratio']:.2f} | "
        f"{reporting.fmt((s.get('in_loop') or {}).get('c_in_loop'), '.3f')} | "
        f"{reporting.fmt((s.get('in_loop') or {}).get('round_fixed_in_loop'))} | "
        f"{s['predicted_speedup_thm38']:.2f}× | "
        f"{s['predicted_speedup_costs']:.2f}× | {reporting.fmt(s.get('predicted_speedup_in_loop'), '.2f')}"
        f"{'×' if s.get('predicted_speedup_in_loop') is not None else ''} | "
        f"**{s['speedup']:.2f}×** | {needed} | {identical} | "
        f"{s['examples']} | "
        f'{paper_text} |')
  if summaries:
    s = summaries[0]
    lines += ['', '"c in loop" and "a in loop": one draft step, and the round less its drafting (verify, accept, '
              'commit), timed inside the compiled loop in baseline-round units, beside the isolated c and '
              'verify/1-token; "predicted (in loop)" is the speedup those in-loop costs predict, so a slow row '
              'shows whether α or the loop is at fault (`profiling.in_loop_costs`).']
    for x in summaries:
      auto = x.get('gamma_auto')
      if auto:
        curve = auto['verify_curve']
        ratios = ', '.join(f'{k}: {r:.2f}' for k, r in zip(curve['tokens'][1:], curve['ratio'][1:]))
        lines += ['', f"γ (auto) of {TASK_LABEL.get(x['task'], x['task'])}, {x['drafter']}, t = "
                  f"{x['setting']['temperature']:g}: **{auto['gamma']}**, the best for α {auto['alpha']:.2f} "
                  f"(calibration at γ {auto['probe_gamma']}{auto_gamma.depth_note(auto)}) and in-loop c "
                  f"{auto['c_in_loop']:.3f} on this "
                  f"machine's verify-cost curve (k tokens: cost over a 1-token call; {ratios}), predicted "
                  f"{auto['predicted_speedup']:.2f}× (`auto_gamma`)."]
    for x in summaries:
      lines += machine_load.warning_lines(
          x.get('others_cpu_share'), f"the row {TASK_LABEL.get(x['task'], x['task'])}, {x['drafter']}, t = "
                                     f"{x['setting']['temperature']:g}")
    batches = sorted({x['setting'].get('batch_size', 1) for x in summaries})
    if batches != [1]:
      lines += ['', 'At batch > 1 a row of the table times whole batches (a batch takes as long as its slowest '
                'row); both loops shrink their batch as rows end (`batch_shrink`), and "predicted (in loop)" '
                'adds up each stage of the shrinking loops at the in-loop costs measured at its batch size.']
    lines += ['', f"Machine: {s['machine']['processor']}, {s['machine']['cpu_count']} CPUs, jax "
              f"{s['machine']['jax']} ({s['machine']['backend']}){reporting.xla_flags_note(s['machine'])}; "
              f"{s['date']}; batch "
              f"{' and '.join(map(str, batches))}, {s['setting']['repeats']} timed repeats per example (median)."]
  return '\n'.join(lines) + '\n'


def table3_markdown(alphas: Mapping[Tuple[str, str], Mapping[float, float]],
                    drafters: Sequence[str], title: str = 'Table 3 analogue') -> str:
  """α (E[Σ min(p, q)]) per task and drafter at t=0 / t=1, with the paper's T5-XXL values beside them.

  Args:
    alphas: {(task, drafter): {temperature: α}}.
    drafters: column order.
  """
  task_names = sorted({t for t, _ in alphas}, key=lambda t: TASK_KIND.get(t, t) != 'ende')
  head = '| target / task | ' + ' | '.join(
      f'{d} (paper: {PAPER_DRAFTER_FOR.get(d, d)})' for d in drafters) + ' |'
  lines = [f'## {title}', '', 'Each cell: α at t=0 / t=1, measured here; the paper\'s T5-XXL value in '
           'brackets.', '', head, '|---|' + '---|' * len(drafters)]
  for task in task_names:
    cells = []
    for d in drafters:
      got = alphas.get((task, d), {})
      paper = PAPER_TABLE3.get((TASK_KIND.get(task), PAPER_DRAFTER_FOR.get(d, d)))
      text = f"{reporting.fmt(got.get(0.0))} / {reporting.fmt(got.get(1.0))}"
      if paper:
        text += f' ({paper[0]:.2f} / {paper[1]:.2f})'
      cells.append(text)
    lines.append(f'| CPU target, {TASK_LABEL.get(task, task)} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'
