"""Drafters and γ side by side against one baseline, interleaved example by example.

  python scripts/compare_drafters.py --models models/cpu_v2 --runs bigram:1 trigram:1 trigram:2 --temperature 0 --run v2_ngrams_t0
  python scripts/compare_drafters.py --runs bigram:1 d1kd:1 --batch_size 8 --shrink both --run v2_batch8_t0
  python scripts/compare_drafters.py --runs d1kd:2 d1kd@models/cpu_v2/draft_vocab/top2048.json:2 f1:3 --run heads_t0
  python scripts/compare_drafters.py --models v2=models/cpu_v2 v3=models/cpu_v3 --runs f128:auto bigram:2 --run v2_v3_t0

A drafter is a directory or a name in --models: a T5 network, an n-gram model or a feature head (which drafts
from the target's own features); DRAFTER@VOCAB_FILE trims a T5 drafter's vocabulary to the ids in VOCAB_FILE.
DRAFTER:GAMMA/CONFIDENCE drafts adaptively: a row stops drafting in a round after a draft its drafter gives less
than CONFIDENCE (`draft_confidence`; e.g. f128:3/0.5). DRAFTER:auto takes γ as the main job's `GAMMA = 'auto'` does
(`auto_gamma.choose`: this machine's verify-cost curve, α of a calibration decode of the first batches and the
in-loop c, measured before any timing) and is timed at its choice beside the fixed γ, so the report says how far
the choice falls from the best fixed γ of the same drafter:

  python scripts/compare_drafters.py --runs f128:1 f128:2 f128:3 f128:4 f128:auto --run v2_f128_gamma_auto_ende_t0

For each batch of the first --examples test examples (--batch_size, default 1) the baseline and every
speculative setting run in turn, --repeats times, keeping each batch's fastest run
(`profiling.time_side_by_side`): a slow spell of the machine hits all of them alike, so their ratios are steadier
than those of separately timed benchmark rows (about ±0.05 on 2 cores). Reports the speedup (Σ baseline /
Σ speculative), α, tokens per target call and, at batch 1, the per-round cost fitted to the real decodes in
baseline tokens. --shrink both runs every decoder with and without `shrink_batch` (rows that ended leave the
batch), each against the baseline of its own mode and against the full-batch baseline. With several --models
(NAME=DIR, each a target and its drafters, e.g. two generations of a family) every run is timed in each family
against that family's own target, all in one interleaved measurement. Writes `results/compare/<run>.{md,json}`.
Measure on a quiet machine.
"""

import argparse
import datetime
import functools
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec.bench import auto_gamma  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.bench import cost_model
from specdec import decoding
from specdec import draft_vocab
from specdec import evaluation
from specdec import fileio
from specdec import loading
from specdec.bench import machine_load
from specdec import models
from specdec.bench import profiling
from specdec.bench import reporting
from specdec import settings
from specdec import task_names
from specdec import theory

TASKS = dict(task_names.LOCAL_TASK_BY_NAME)
LENGTHS = dict(task_names.LOCAL_FEATURE_LENGTHS)


def parse_run(text: str):
  """'drafter:γ', 'drafter@vocab.json:γ' or either with '/confidence' -> (drafter, γ, draft_confidence);
  the vocabulary stays in the name. γ is an int >= 1 or 'auto'."""
  drafter, _, setting = text.rpartition(':')
  gamma, slash, confidence = setting.partition('/')
  bad = argparse.ArgumentTypeError(f"a run is DRAFTER[@VOCAB_FILE]:GAMMA[/CONFIDENCE] with GAMMA >= 1 or "
                                   f"'{settings.AUTO}' and CONFIDENCE in (0, 1), got {text!r}")
  auto = settings.is_auto(gamma)
  if not drafter or not (auto or gamma.isdigit()) or (not auto and int(gamma) < 1) or (slash and not confidence):
    raise bad
  try:
    draft_confidence = float(confidence) if confidence else 0.0
  except ValueError:
    raise bad from None
  if confidence and not 0.0 < draft_confidence < 1.0:
    raise bad
  return drafter, (gamma if auto else int(gamma)), draft_confidence


def run_name(drafter: str, gamma, draft_confidence: float) -> str:
  """The row's name: 'drafter:γ' (or 'drafter:auto'), with '/confidence' when drafting adaptively."""
  return f'{drafter}:{gamma}' + (f'/{draft_confidence:g}' if draft_confidence else '')


def load_run_drafter(name: str, models_dir: str, target_params):
  """(module, params, draft vocabulary ids) of DRAFTER[@VOCAB_FILE]: a directory or a name in models_dir.

  @VOCAB_FILE (a JSON list of ids, scripts/draft_vocab.py) trims a T5 drafter's vocabulary, or replaces the
  one a feature head brings (any set of ids keeps the decode exact: the target verifies over its whole
  vocabulary), so one head can be measured at several K.
  """
  drafter, _, vocab_file = name.partition('@')
  module, params, vocab_ids = loading.load_drafter(loading.model_path(drafter, models_dir), target_params)
  if vocab_file:
    vocab_ids = draft_vocab.load_ids(vocab_file, vocab_size=module.config.vocab_size)
  return module, params, vocab_ids


def parse_family(text: str):
  """'NAME=DIR' or 'DIR' (named by its last component) -> (name, models directory)."""
  name, eq, directory = text.partition('=')
  if not eq:
    name, directory = os.path.basename(os.path.normpath(text)), text
  if not name or not directory:
    raise argparse.ArgumentTypeError(f'a model family is DIR or NAME=DIR, got {text!r}')
  return name, directory


def row_label(family, name: str, shrink=None, several_modes: bool = False) -> str:
  """A decoder's row: 'name', 'family name' when families are compared, '(shrinking batch)' or '(full batch)'
  when both batch modes are."""
  text = name if family is None else f'{family} {name}'
  return f"{text} ({'shrinking' if shrink else 'full'} batch)" if several_modes else text


def compare(args) -> dict:
  families = args.models
  several = len(families) > 1
  examples = evaluation.task_examples(TASKS[args.task], 'test', LENGTHS, args.examples)
  batches = [batch for _, batch in evaluation.batches(examples, LENGTHS, args.batch_size, True)]
  modes = {'on': [True], 'off': [False], 'both': [False, True]}[args.shrink]
  label = lambda family, name, shrink: row_label(family if several else None, name, shrink, len(modes) > 1)
  sampling = {shrink: {'temperature': args.temperature, 'topk': 0, 'topp': 0.0, 'shrink_batch': shrink}
              for shrink in modes}
  chosen, decoders = {}, {}
  for family, models_dir in families:
    target_module, target_params = loading.load_module_and_params(os.path.join(models_dir, 'target'))
    base = models.SpeculativeEncoderDecoderModel(target_module, None, decode_fn=decoding.temperature_sample)
    drafters = {drafter: load_run_drafter(drafter, models_dir, target_params) for drafter, _, _ in args.runs}
    # 'auto' runs take their γ before anything is timed, as the main job does at the start of a row (the baseline
    # compiled here is the one timed below: compile_predict keeps it).
    for drafter, gamma, confidence in args.runs:
      if settings.is_auto(gamma):
        chosen[(family, drafter, confidence)] = choose_gamma(
            target_module, target_params, drafters[drafter], confidence, batches, sampling[modes[0]],
            base.compile_predict(sampling[modes[0]]))
    for shrink in modes:
      sampling_params = sampling[shrink]
      decoders[label(family, 'baseline', shrink)] = functools.partial(base.compile_predict(sampling_params),
                                                                      {'target': target_params})
      for drafter, gamma, confidence in args.runs:
        drafter_module, drafter_params, vocab_ids = drafters[drafter]
        name = run_name(drafter, gamma, confidence)
        if settings.is_auto(gamma):
          gamma = chosen[(family, drafter, confidence)]['gamma']
        spec = models.SpeculativeEncoderDecoderModel(target_module, drafter_module,
                                                     decode_fn=decoding.speculative_sample,
                                                     draft_vocab_ids=vocab_ids)
        predict = spec.compile_predict(dict(sampling_params, gamma=gamma, draft_confidence=confidence,
                                            return_stats=True))
        decoders[label(family, name, shrink)] = functools.partial(
            predict, spec.with_draft_projection({'target': target_params, 'drafter': drafter_params}))
  with machine_load.CpuMeter() as meter:
    timed = profiling.time_side_by_side(decoders, batches, repeats=args.repeats)

  # A batch's steps are its longest row's; per-step costs are fitted at batch 1 only (a shrinking batch's
  # step gets cheaper as rows end).
  fit = args.batch_size == 1
  rows, baselines = [], {}
  for family, _ in families:
    plain = timed[label(family, 'baseline', modes[0])]
    base_tokens = [max(evaluation.num_tokens(row, 1) for row in np.asarray(out[0])) for out in plain['outputs']]
    token_s = cost_model.fit_fixed_and_per_step(base_tokens, plain['seconds'])['per_step_s'] if fit else None
    baselines[family] = {'seconds': sum(plain['seconds']), 'token_s': token_s}
    tag = {'family': family} if several else {}
    for shrink in modes:
      baseline = timed[label(family, 'baseline', shrink)]
      if len(modes) > 1 and shrink:
        rows.append({'run': label(family, 'baseline', shrink), **tag,
                     'speedup': sum(plain['seconds']) / sum(baseline['seconds']),
                     'speedup_vs_full_batch_baseline': sum(plain['seconds']) / sum(baseline['seconds']),
                     'alpha': None, 'tokens_per_call': None, 'round_in_baseline_tokens': None,
                     'identical': (_identical(baseline, plain) if args.temperature == 0 else None)})
      for run in args.runs:
        entry = timed[label(family, run_name(*run), shrink)]
        stats = [jax.tree_util.tree_map(np.asarray, out[1]['stats']) for out in entry['outputs']]
        rounds = [int(s['target_calls'].max()) for s in stats]
        judged = sum(int(s['judged'].sum()) for s in stats)
        round_s = float('nan')
        if fit:
          try:
            round_s = cost_model.fit_fixed_and_per_step(rounds, entry['seconds'])['per_step_s']
          except ValueError:  # every example took the same number of rounds
            pass
        drafter, gamma, confidence = run
        auto = chosen.get((family, drafter, confidence)) if settings.is_auto(gamma) else None
        rows.append({
            'run': label(family, run_name(*run), shrink), **tag,
            'gamma': auto['gamma'] if auto else gamma,
            'speedup': sum(baseline['seconds']) / sum(entry['seconds']),
            'speedup_vs_full_batch_baseline': sum(plain['seconds']) / sum(entry['seconds']),
            'alpha': theory.acceptance_rate(sum(int(s['accepted'].sum()) for s in stats), judged),
            'tokens_per_call': (sum(int(s['emitted'].sum()) for s in stats)
                                / sum(int(s['target_calls'].sum()) for s in stats)),
            'round_in_baseline_tokens': round_s / token_s if fit else None,
            'identical': _identical(entry, baseline) if args.temperature == 0 else None})
  first = baselines[families[0][0]]
  report = {'gamma_auto': [{**({'family': family} if several else {}), 'drafter': drafter,
                            'draft_confidence': confidence, **choice}
                           for (family, drafter, confidence), choice in chosen.items()],
            'command': 'python ' + ' '.join(['scripts/compare_drafters.py'] + sys.argv[1:]),
            'date': datetime.date.today().isoformat(), 'machine': reporting.machine_info(),
            'task': TASKS[args.task], 'temperature': args.temperature, 'examples': len(examples),
            'batch_size': args.batch_size, 'shrink': args.shrink,
            'repeats': args.repeats, 'baseline_seconds': first['seconds'],
            'baseline_token_s': first['token_s'], 'others_cpu_share': meter.share, 'rows': rows}
  if several:
    report['families'] = {name: {'models': directory, **baselines[name]} for name, directory in families}
  return report


def choose_gamma(target_module, target_params, drafter, draft_confidence: float, batches, sampling_params: dict,
                 base_predict) -> dict:
  """`auto_gamma.choose` for one drafter ((module, params, vocabulary ids)) on this run's batches, with the run's
  sampling settings and its compiled baseline."""
  drafter_module, drafter_params, vocab_ids = drafter
  decoder_params = dict(sampling_params, draft_confidence=draft_confidence)
  spec = models.SpeculativeEncoderDecoderModel(target_module, drafter_module, decode_fn=decoding.speculative_sample,
                                               draft_vocab_ids=vocab_ids)
  probe = spec.compile_predict(dict(decoder_params, gamma=auto_gamma.PROBE_GAMMA, return_stats=True))
  params = spec.with_draft_projection({'target': target_params, 'drafter': drafter_params})
  return auto_gamma.choose(target_module, target_params, drafter_module, drafter_params, batches, probe,
                           base_predict, params, {'target': target_params}, decoder_params,
                           draft_vocab_ids=vocab_ids, log=lambda line: print(line, flush=True))


def auto_lines(report: dict) -> list:
  """Under the table: each 'auto' choice, what it was made from, and its measured speedup against the best fixed γ
  of the same drafter in this run."""
  lines = []
  for choice in report.get('gamma_auto', []):
    family = choice.get('family')
    name = row_label(family, run_name(choice['drafter'], settings.AUTO, choice['draft_confidence']))
    measured = [r for r in report['rows'] if r['run'] == name]
    fixed = [r for r in report['rows'] if r['run'] != name and r['run'] == row_label(
        family, run_name(choice['drafter'], r.get('gamma'), choice['draft_confidence']))]
    gamma = choice['gamma']
    line = (f"- **{name}** chose γ = {gamma} (α {choice['alpha']:.3f} at γ = {choice['probe_gamma']}"
            f"{auto_gamma.depth_note(choice)}, c "
            f"{choice['c_in_loop']:.3f}, a {gamma + 1}-token verify = {choice['verify_curve']['ratio'][gamma]:.2f} "
            f"one-token calls; predicted {choice['predicted_speedup']:.2f}×; Thm 3.8 alone: γ = "
            f"{choice['thm38_gamma']}; chosen in {choice['seconds']:.0f} s, not timed)")
    if measured and fixed:
      best = max(fixed, key=lambda r: r['speedup'])
      line += (f": measured **{measured[0]['speedup']:.3f}×**, the best fixed γ here {best['run']} "
               f"{best['speedup']:.3f}×, auto / best = **{measured[0]['speedup'] / best['speedup']:.3f}**")
    lines.append(line + '.')
  return [''] + lines if lines else []


def _identical(entry, reference) -> bool:
  """Whether every batch's decodes are the reference's, token for token."""
  return all(np.array_equal(np.asarray(a[0]), np.asarray(b[0]))
             for a, b in zip(entry['outputs'], reference['outputs']))


def markdown(report: dict) -> str:
  batch = report.get('batch_size', 1)
  token_s = report['baseline_token_s']
  lines = [f"# Drafters side by side: {report['task']}, temperature {report['temperature']}", '',
           f"`{report['command']}` · {report['date']} · {report['machine']['processor']}, {report['machine']['cpu_count']} CPUs, jax "
           f"{report['machine']['jax']}{reporting.xla_flags_note(report['machine'])} · first "
           f"{report['examples']} test examples, batch {batch}, interleaved, fastest of {report['repeats']} per "
           'batch', '',
           f"Baseline: {1000 * report['baseline_seconds']:.1f} ms in all"
           + (f", {1000 * token_s:.3f} ms a token (fitted)." if token_s else '.'), '']
  if report.get('families'):
    lines[-2:] = ['Model families, each drafter against the baseline of its own target (the targets decode '
                  'different outputs, so only their speedups compare): '
                  + '; '.join(f"**{name}** (`{f['models']}`): baseline {1000 * f['seconds']:.1f} ms in all"
                              + (f", {1000 * f['token_s']:.3f} ms a token (fitted)" if f['token_s'] else '')
                              for name, f in report['families'].items()) + '.', '']
  fmt = reporting.fmt
  if report.get('shrink') == 'both':
    lines += ['Speedups against the baseline of the same batch mode; the last column against the full-batch '
              'baseline (rows that ended keep running until the batch ends).', '',
              '| decoder | α (kept/judged) | tokens per target call | **speedup** | vs full-batch baseline | '
              'identical |', '|---|---|---|---|---|---|']
  else:
    lines += ['| drafter:γ | α (kept/judged) | tokens per target call | round (baseline tokens, fitted) | '
              '**speedup** | identical |', '|---|---|---|---|---|---|']
  for r in report['rows']:
    identical = '-' if r['identical'] is None else ('100%' if r['identical'] else 'NO')
    run = r['run'] + (f" (γ = {r['gamma']})" if f':{settings.AUTO}' in r['run'] else '')
    head = f"| {run} | {fmt(r['alpha'], '.3f')} | {fmt(r['tokens_per_call'], '.2f')} | "
    if report.get('shrink') == 'both':
      lines.append(head + f"**{r['speedup']:.3f}×** | {r['speedup_vs_full_batch_baseline']:.3f}× | {identical} |")
    else:
      lines.append(head + f"{fmt(r['round_in_baseline_tokens'], '.2f')} | **{r['speedup']:.3f}×** | {identical} |")
  lines += auto_lines(report)
  lines += machine_load.warning_lines(report.get('others_cpu_share'), 'this comparison')
  return '\n'.join(lines) + '\n'


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', nargs='+', type=parse_family, default=[parse_family('models/cpu_v2')],
                      help='model families: DIR or NAME=DIR, each a target and its drafters; with several, every '
                           'run is timed in each family against its own target, all interleaved')
  parser.add_argument('--runs', nargs='+', type=parse_run, required=True, help='DRAFTER[@VOCAB_FILE]:GAMMA[/CONFIDENCE] ...')
  parser.add_argument('--task', choices=sorted(TASKS), default='ende')
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--examples', type=int, default=32)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--batch_size', type=int, default=1)
  parser.add_argument('--shrink', choices=('on', 'off', 'both'), default='on',
                      help="the decoders' shrink_batch (both: each decoder with and without)")
  parser.add_argument('--run', required=True, help='report name')
  parser.add_argument('--out', default='results/compare')
  args = parser.parse_args(argv)
  if args.temperature < 0:
    parser.error(f'--temperature must be >= 0, got {args.temperature}')
  if args.batch_size < 1:
    parser.error(f'--batch_size must be >= 1, got {args.batch_size}')
  names = [name for name, _ in args.models]
  if len(set(names)) < len(names):
    parser.error(f'--models: each family needs its own name (NAME=DIR), got {names}')
  report = compare(args)
  os.makedirs(args.out, exist_ok=True)
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.json'),
                      json.dumps(report, indent=2, sort_keys=True).encode())
  text = markdown(report)
  fileio.atomic_write(os.path.join(args.out, f'{args.run}.md'), text.encode())
  print(text)


if __name__ == '__main__':
  main()
