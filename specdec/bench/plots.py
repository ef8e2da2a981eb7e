"""The figures of the reports (matplotlib on the non-interactive Agg backend, imported on first use).

Each `plot_*` draws one report's figure from its summary and writes it as PNG atomically (`save_png`).
"""

import io
from typing import Any, Mapping, Sequence

import numpy as np

from specdec.bench import ceiling_report
from specdec import fileio
from specdec.bench import reporting


def pyplot():
  """matplotlib.pyplot on the non-interactive Agg backend (imported on first use: plots are optional)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_png(fig, path: str) -> None:
  """Writes a figure as PNG atomically (`fileio.atomic_write`) and closes it."""
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=110)
  pyplot().close(fig)
  fileio.atomic_write(path, buf.getvalue())


def plot_benchmark(path: str, summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> None:
  """Per-example wall times (baseline vs speculative) and acceptance per draft position."""
  plt = pyplot()
  heads = reporting.batch_heads(records)
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
  base = np.array([1000 * r['baseline_s'] for r in heads])
  spec = np.array([1000 * r['speculative_s'] for r in heads])
  ax1.scatter(base, spec, s=10)
  top = float(max(base.max(), spec.max())) * 1.05
  ax1.plot([0, top], [0, top], 'k--', lw=1, label='equal time')
  ax1.plot([0, top], [0, top / 2], 'g:', lw=1, label='2× faster')
  ax1.set_xlabel('baseline ms per batch')
  ax1.set_ylabel('speculative ms per batch')
  ax1.set_title(f"speedup {summary['speedup']:.2f}× (predicted {summary['predicted_speedup_costs']:.2f}×)")
  ax1.legend()
  pos = summary['acceptance_per_position']
  ax2.bar(np.arange(1, len(pos) + 1), [np.nan if x is None else x for x in pos])
  ax2.axhline(summary['alpha_accept'], color='k', ls='--', lw=1, label=f"α = {summary['alpha_accept']:.2f}")
  ax2.set_xlabel('draft position')
  ax2.set_ylabel('P(kept | earlier drafts kept)')
  ax2.set_ylim(0, 1)
  ax2.legend()
  fig.suptitle(f"{summary['task']}, drafter {summary['drafter']}, γ={summary['setting']['gamma']}, "
               f"t={summary['setting']['temperature']:g}")
  save_png(fig, path)


def plot_peers(path: str, summary: Mapping[str, Any]) -> None:
  """Tokens/s per system, one group of bars per temperature."""
  plt = pyplot()
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
  save_png(fig, path)


def _starred(ax, alpha: float, speedup: float, label: str) -> None:
  """A labelled star: a measured drafter, or the paper's row, among the oracle's points."""
  ax.plot([alpha], [speedup], 'k*', ms=11)
  ax.annotate(label, (alpha, speedup), textcoords='offset points', xytext=(4, -12), fontsize=8)


def _speedup_axes(ax, ylabel: str, title: str, legend_size: int) -> None:
  """Speedup against α: the 1× line, labels, grid and legend."""
  ax.axhline(1.0, color='grey', lw=0.8)
  ax.set_xlabel('α (accepted / judged)')
  ax.set_ylabel(ylabel)
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=legend_size, loc='upper left')


def plot_ceiling(path: str, rep: Mapping[str, Any]) -> None:
  """Speedup against α, one panel per batch size: measured points over the in-loop predicted lines, one
  colour per γ, and the shipped drafters marked."""
  plt = pyplot()
  sizes = sorted({r['batch'] for r in rep['rows']})
  fig, axes = plt.subplots(1, len(sizes), figsize=(6.2 * len(sizes), 4.6), squeeze=False)
  gammas = rep['settings']['gammas']
  colours = plt.get_cmap('viridis')(np.linspace(0.0, 0.9, len(gammas)))
  for ax, b in zip(axes[0], sizes):
    for colour, g in zip(colours, gammas):
      mine = sorted((r for r in rep['rows'] if r['batch'] == b and r['gamma'] == g),
                    key=lambda r: r['alpha_measured'])
      x = [r['alpha_measured'] for r in mine]
      ax.plot(x, [r['predicted_in_loop'] for r in mine], '--', color=colour, lw=1)
      ax.plot(x, [r['measured_speedup'] for r in mine], 'o', color=colour, ms=5, label=f'γ = {g}')
    for r in rep['shipped']:
      if r['batch'] == b:
        _starred(ax, r['alpha_measured'], r['measured_speedup'], f"{r['drafter']} (γ {r['gamma']})")
    _speedup_axes(ax, 'measured speedup over the baseline',
                  f'batch {b}: oracle of {ceiling_report.CONTROLLED} (points measured, dashed in-loop predicted);\n'
                  '★ the shipped trained drafters', legend_size=8)
  save_png(fig, path)


def plot_accelerator(path: str, rep: Mapping[str, Any]) -> None:
  """The accelerator check's figure: each target's verify-cost curve (left) and, where measured, the ceiling's
  speedup against α, measured with the oracle (points) and with the small drafter's in-loop cost (dashed)."""
  plt = pyplot()
  ceil = rep.get('ceiling')
  fig, axes = plt.subplots(1, 2 if ceil else 1, figsize=(12.4 if ceil else 6.2, 4.6), squeeze=False)
  ax = axes[0][0]
  for target, by_batch in rep['verify_curves'].items():
    for batch, curve in sorted(by_batch.items(), key=lambda kv: int(kv[0])):
      ax.plot(curve['tokens'], curve['ratio'], 'o-' if batch == '1' else 's--', ms=3,
              label=f'{target}, batch {batch}')
  ax.axhline(1.0, color='grey', lw=0.8)
  ax.set_xlabel('k tokens in one target call')
  ax.set_ylabel('cost over a 1-token call')
  ax.set_title(f"verify-cost curves, {rep['machine']['device_kind']}", fontsize=9)
  ax.grid(alpha=0.3)
  if rep['verify_curves']:
    ax.legend(fontsize=7)
  if ceil:
    ax = axes[0][1]
    gammas = sorted({r['gamma'] for r in ceil['report']['rows']})
    colours = plt.get_cmap('viridis')(np.linspace(0.0, 0.9, len(gammas)))
    for colour, g in zip(colours, gammas):
      mine = sorted((r for r in ceil['report']['rows'] if r['gamma'] == g), key=lambda r: r['alpha_measured'])
      ax.plot([r['alpha_measured'] for r in mine], [r['measured_speedup'] for r in mine], 'o', color=colour,
              label=f'γ = {g}, oracle')
      drafted = sorted((r for r in ceil.get('with_drafter', []) if r['gamma'] == g),
                       key=lambda r: r['alpha_measured'])
      if drafted:
        ax.plot([r['alpha_measured'] for r in drafted], [r['speedup'] for r in drafted], '--', color=colour,
                label=f"γ = {g}, {ceil['drafter']}'s c")
    paper = rep['paper']
    _starred(ax, paper['alpha'], paper['speedup'], f"paper: T5-small, {paper['chip']}")
    _speedup_axes(ax, 'speedup over the baseline, batch 1', f"{ceil['target']} shape, {ceiling_report.CONTROLLED}",
                  legend_size=7)
  save_png(fig, path)


def plot_learning_curve(path: str, curve: Mapping[str, Any], start: Mapping[str, Any]) -> None:
  """A training run's evaluations (`scripts/compare_targets.py`): validation loss (left) and En→De BLEU on 64
  validation examples (right) against steps; the starting target's whole-split BLEU as a dashed line."""
  plt = pyplot()
  points = curve['points']
  fig, (loss_ax, bleu_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
  steps = [p['step'] for p in points]
  loss_ax.plot(steps, [p['eval_loss'] for p in points], 'o-')
  loss_ax.set_xlabel('step')
  loss_ax.set_ylabel('validation loss (training mixture)')
  bleu_ax.plot(steps, [p['bleu'] for p in points], 'o-', label='En→De BLEU, 64 validation examples')
  bleu_ax.axhline(start['ende_validation']['bleu'], color='grey', ls='--',
                  label=f"start ({start['path']}), whole validation split")
  bleu_ax.set_xlabel('step')
  bleu_ax.set_ylabel('BLEU')
  bleu_ax.legend(fontsize=8)
  for ax in (loss_ax, bleu_ax):
    ax.grid(alpha=0.3)
  if curve.get('minutes_per_step'):
    fig.suptitle(f"{curve['minutes_per_step'] * 60:.1f} s a step on this CPU", fontsize=9)
  save_png(fig, path)
