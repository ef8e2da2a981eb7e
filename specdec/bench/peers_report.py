"""The peer benchmark's rows and report: `peers.run`'s per-example records summed per system, the per-call
costs set against the counted calls, and the whole as Markdown (the figure is `plots.plot_peers`).

Pure functions over records (dicts); a system is anything with `framework`, `name` and `settings` (`peers.System`).
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from specdec.bench import reporting
from specdec import theory

# The frameworks and systems, as the records and rows name them.
HF, OURS = 'hf', 'ours'
BASELINE = 'baseline'
SPECULATIVE, ADAPTIVE = 'speculative', 'speculative_adaptive'


# ----------------------------------------------------------------------------------------------------------
# Rows: one per system and temperature.
# ----------------------------------------------------------------------------------------------------------


def summarize_system(records: Sequence[Mapping[str, Any]], system, temperature: float) -> Dict[str, Any]:
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
      row.update(judged=judged, alpha_accept=theory.acceptance_rate(in_loop, judged))
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
# Per-call costs against the counted calls.
# ----------------------------------------------------------------------------------------------------------

CALL_KINDS = ('target_encoder', 'target_step', 'target_verify', 'drafter_encoder', 'drafter_step')


def call_labels(gamma: int) -> Dict[str, str]:
  return {'target_encoder': 'target encoder', 'target_step': 'target decoder, 1 token (cached)',
          'target_verify': f'target decoder, verify: γ+1 = {gamma + 1} tokens (cached)',
          'drafter_encoder': 'drafter encoder', 'drafter_step': 'drafter decoder, 1 token (cached)'}


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


# ----------------------------------------------------------------------------------------------------------
# Markdown.
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
        f"{reporting.fmt(r['speedup_vs_own_baseline'])}× | {r['ms_per_example_median']:.1f} | "
        f"{r['target_calls_per_example']:.1f} | {r['tokens_per_target_call']:.2f} | "
        f"{reporting.fmt(r.get('accepted_per_drafted'), '.3f')} | {reporting.fmt(r.get('drafted_per_target_call'))} |")
  lines += ['', '## ours / HF tokens/s', '', '| t | ours | HF | ours tokens/s | HF tokens/s | ratio |',
            '|---|---|---|---|---|---|']
  lines += [f"| {p['temperature']:g} | {p['ours']} | {p['hf']} | {p['ours_tokens_per_s']:.0f} | "
            f"{p['hf_tokens_per_s']:.0f} | **{reporting.fmt(p['ratio'])}×** |" for p in s['ratios']]
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
  lines += [f"| {labels[k]} | {ms[HF][k]:.3f} | {ms[OURS][k]:.3f} | {reporting.fmt(r['hf_over_ours'][k])}× |"
            for k in CALL_KINDS]
  lines += [f"| verify / 1-token target step | {reporting.fmt(r['verify_over_step'][HF])} | "
            f"{reporting.fmt(r['verify_over_step'][OURS])} | |",
            f"| c = drafter step / target step | {reporting.fmt(r['c'][HF])} | {reporting.fmt(r['c'][OURS])} | |"]
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
        f"| {t['temperature']:g} | {t['framework']} | {t['system']} | {reporting.fmt(t['measured_ms_per_token'], '.3f')} | "
        f"{reporting.fmt(t['encoders_ms_per_token'], '.3f')} | {reporting.fmt(t['target_ms_per_token'], '.3f')} | "
        f"{reporting.fmt(t['drafter_ms_per_token'], '.3f')} | {reporting.fmt(t['model_ms_per_token'], '.3f')} | "
        f"{reporting.fmt(t['overhead_ms_per_token'], '.3f')} | {reporting.fmt(share, '.0f')}% | {t['target_call_tokens']:.2f} | "
        f"{t['drafter_calls_per_example']:.1f} |")
  lines += ['', "Not in either side's encoder or step costs: the cross-attention keys and values of the encoded "
            "input (HF computes them in its first decoder call, ours when it sets up the cache). A negative rest "
            "means the calls cost less inside the decode than timed alone: timing noise, verify calls narrower "
            "than γ+1 tokens, or (HF, whose cache grows) decoding mostly at shorter positions than the one timed."]
  return lines


def call_cost_sentences(call_costs: Mapping[str, Any], pairs: Sequence[Mapping[str, Any]],
                        gamma: int) -> List[str]:
  """The section's prose, from the numbers: per-call HF / ours, c and verify / step in each framework, and for
  the fixed-γ pair at the first temperature, how much of each side's time per token is its model calls."""
  ms, r = call_costs['ms'], call_costs['ratios']
  x = lambda v: reporting.fmt(v, '.1f')
  lines = [
      f"HF's 1-token target step costs {x(r['hf_over_ours']['target_step'])}× ours ({ms[HF]['target_step']:.2f} "
      f"vs {ms[OURS]['target_step']:.2f} ms), its {gamma + 1}-token verify call "
      f"{x(r['hf_over_ours']['target_verify'])}× and its drafter step {x(r['hf_over_ours']['drafter_step'])}× "
      f"ours; c (drafter step / target step) is {reporting.fmt(r['c'][HF])} in HF and {reporting.fmt(r['c'][OURS])} in ours, and a "
      f"verify call costs {reporting.fmt(r['verify_over_step'][HF])}× a 1-token step in HF and "
      f"{reporting.fmt(r['verify_over_step'][OURS])}× in ours."]
  breakdown = constant_pair_breakdown(call_costs.get('per_token', []), pairs)
  if breakdown:
    b = breakdown[0]
    hf, ours = b['hf'], b['ours']
    pct = lambda v: reporting.fmt(None if v is None else 100 * v, '.0f')
    lines.append(
        f"At t = {b['temperature']:g}, ours speculative makes {reporting.fmt(b['ratio'])}× HF assisted:constant's tokens/s; "
        f"their model calls alone take {reporting.fmt(hf['model_ms_per_token'])} vs {reporting.fmt(ours['model_ms_per_token'])} ms "
        f"per token ({reporting.fmt(b['model_ratio'])}×), and the time outside the calls is "
        f"{reporting.fmt(hf['overhead_ms_per_token'])} ms per token for HF ({pct(hf['overhead_share'])}% of its time) vs "
        f"{reporting.fmt(ours['overhead_ms_per_token'])} ms for ours ({pct(ours['overhead_share'])}%).")
  return lines
