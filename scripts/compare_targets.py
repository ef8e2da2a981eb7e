"""Targets side by side on the same held-out examples, and a training run's learning curve.

  python scripts/compare_targets.py --targets v2=models/cpu_v2/target v3=models/cpu_v3/target \
      --log runs/target_v3 runs/target_v3_run2 --out results/target_v3

Per target, on the same examples:
  - token loss (teacher-forced, nats per target token) on the first --loss_examples validation examples of each
    task (`evaluation.token_loss`);
  - greedy BLEU on the whole En→De validation split and on its first --test_examples test examples; each target's
    validation BLEU beside the --paired_baseline target's (default the first) by paired bootstrap resampling
    (`tasks.paired_bleu`: the difference, its 95% interval, the share of draws on which it is not worse);
  - greedy ROUGE on the first --test_examples summarization test examples;
  - `evaluation.target_confidence` (top-1 probability on its own greedy decodes) on the first
    --confidence_examples En→De validation inputs.
Per target also its training (`training_record`): steps and minutes from the training record in its directory's
config.json, or unknown and why (a directory not kept); with --train_gin NAME=FILE the caps of the gin file its run
was trained with (num_steps, max_minutes: what it was allowed, not what it ran). --same_data TASK=A,B names two
targets trained on identical data of TASK: their loss difference on it is set beside the others' (`notes`).
--figures_from DIR takes the figures of an earlier run of this script (DIR/compare.json) instead of decoding, keeps
its provenance line, and adds what is above: for targets whose directories are gone.
Writes <out>/compare.{md,json}. With --log (training runs' MODEL_DIRs: train_log.jsonl and runs.jsonl; several when
each continued the export of the one before, in order) also the learning curve: the trainer's evaluations
(validation loss of the training mixture, BLEU and ROUGE on 64 validation examples) against steps and CPU minutes
counted from the first run's start, the first target's figures at step 0 → <out>/curve.{md,json,png}.
"""

import argparse
import datetime
import os
import shlex
import sys
from typing import Any, Dict, List, Mapping, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec import checkpoints  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import evaluation  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import fileio
from specdec import loading
from specdec import models
from specdec import decoding
from specdec import task_names
from specdec.bench import plots
from specdec.bench import reporting
from specdec import tasks

LENGTHS = dict(task_names.LOCAL_FEATURE_LENGTHS)
TASKS = dict(task_names.LOCAL_TASK_BY_NAME)
TASK_LABELS = {'ende': 'En→De', 'summarize': 'summarization'}


def parse_args(argv=None, check_dirs: bool = True):
  """(args, {name: directory}). `check_dirs` False: an earlier command's, whose directories may be gone."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--targets', nargs='+', default=None,
                      help='NAME=DIR, e.g. v2=models/cpu_v2/target (required without --figures_from)')
  parser.add_argument('--figures_from', default=None,
                      help="a directory with an earlier run's compare.json: its figures, not decoded again")
  parser.add_argument('--train_gin', nargs='+', default=(),
                      help="NAME=GIN_FILE: the gin file a target's run was trained with (its caps are recorded)")
  parser.add_argument('--same_data', nargs='+', default=(),
                      help='TASK=A,B: targets A and B were trained on identical data of TASK (ende or summarize)')
  parser.add_argument('--log', nargs='+', default=None,
                      help="training runs' MODEL_DIRs, for the learning curve (in order, when each continued the "
                           "export of the one before)")
  parser.add_argument('--out', required=True)
  parser.add_argument('--loss_examples', type=int, default=512)
  parser.add_argument('--test_examples', type=int, default=64)
  parser.add_argument('--validation_examples', type=int, default=None,
                      help='En→De validation examples for BLEU (default: the whole split)')
  parser.add_argument('--confidence_examples', type=int, default=256)
  parser.add_argument('--paired_baseline', default=None,
                      help="a target's NAME: the others' validation BLEU against its, paired (default: the first)")
  parser.add_argument('--card', default=None,
                      help="a target's NAME: (re)write MODEL_CARD.md in its directory from these figures")
  args = parser.parse_args(argv)
  targets = {}
  if (args.targets is None) == (args.figures_from is None):
    parser.error('give --targets or --figures_from, one of them')
  if args.figures_from is not None:
    if args.log or args.card:
      parser.error('--figures_from reads no model: --log and --card need --targets')
    try:
      _, _, targets, _ = earlier_figures(args.figures_from)
    except (FileNotFoundError, ValueError) as e:
      parser.error(f'--figures_from: {e}')
  for spec in args.targets or ():
    name, sep, path = spec.partition('=')
    if not sep or not name or not path:
      parser.error(f'--targets takes NAME=DIR, got {spec!r}')
    if name in targets:
      parser.error(f'--targets names {name!r} twice')
    if check_dirs and not os.path.isdir(path):
      parser.error(f'--targets {name}: {path} is not a directory')
    targets[name] = path
  train_gin = {}
  for spec in args.train_gin:
    name, sep, path = spec.partition('=')
    if not sep or name not in targets or name in train_gin:
      parser.error(f'--train_gin takes NAME=GIN_FILE once per target of {sorted(targets)}, got {spec!r}')
    train_gin[name] = path
  args.train_gin = train_gin
  same_data = []
  for spec in args.same_data:
    task, sep, names = spec.partition('=')
    pair = names.split(',')
    if not sep or task not in TASKS or len(pair) != 2 or len(set(pair)) != 2 or not set(pair) <= set(targets):
      parser.error(f'--same_data takes TASK=A,B (TASK one of {sorted(TASKS)}, A and B two of {sorted(targets)}), '
                   f'got {spec!r}')
    same_data.append((task, pair[0], pair[1]))
  args.same_data = same_data
  for flag in ('loss_examples', 'test_examples', 'confidence_examples'):
    if getattr(args, flag) < 1:
      parser.error(f'--{flag} must be >= 1, got {getattr(args, flag)}')
  for flag in ('card', 'paired_baseline'):
    if getattr(args, flag) is not None and getattr(args, flag) not in targets:
      parser.error(f'--{flag} {getattr(args, flag)!r} is not one of the --targets names {sorted(targets)}')
  for log in args.log or () if check_dirs else ():
    if not os.path.isfile(os.path.join(log, 'train_log.jsonl')):
      parser.error(f'--log {log}: no train_log.jsonl there')
  return args, targets


def evaluate_target(path: str, args) -> Tuple[Dict[str, Any], Dict[str, List[str]]]:
  """The figures of one target (see the module docstring), and its En→De validation decodes with their
  references ({'predictions', 'targets'}) for the paired comparison."""
  module, params = loading.load_module_and_params(path)
  predict = models.SpeculativeEncoderDecoderModel(module, None, decode_fn=decoding.temperature_sample
                                                  ).compile_predict({'temperature': 0.0})
  out: Dict[str, Any] = {'path': path}
  for key, task in TASKS.items():
    examples = evaluation.task_examples(task, 'validation', LENGTHS, args.loss_examples)
    out[f'{key}_validation_loss'] = evaluation.token_loss(module, params, examples, LENGTHS)
  validation = evaluation.decode_and_score(predict, {'target': params}, TASKS['ende'], 'validation', LENGTHS,
                                           max_examples=args.validation_examples)
  out['ende_validation'] = validation['metrics']
  out['ende_test'] = evaluation.decode_and_score(predict, {'target': params}, TASKS['ende'], 'test', LENGTHS,
                                                 max_examples=args.test_examples)['metrics']
  out['summarize_test'] = evaluation.decode_and_score(predict, {'target': params}, TASKS['summarize'], 'test',
                                                      LENGTHS, max_examples=args.test_examples)['metrics']
  held_out = evaluation.task_examples(TASKS['ende'], 'validation', LENGTHS, args.confidence_examples)
  out['confidence'] = evaluation.target_confidence(module, params, held_out, LENGTHS)
  return out, {'predictions': validation['predictions'], 'targets': validation['targets']}


def add_paired(results: Dict[str, Dict[str, Any]], decodes: Mapping[str, Mapping[str, List[str]]],
               baseline: str) -> None:
  """Each target's whole-split validation BLEU against `baseline`'s, paired (`tasks.paired_bleu`), as
  results[name]['ende_validation_paired'] (the baseline's own is None)."""
  base = decodes[baseline]
  for name in results:
    if name == baseline:
      results[name]['ende_validation_paired'] = None
      continue
    if decodes[name]['targets'] != base['targets']:
      raise ValueError(f'{name} and {baseline} were scored on different references.')
    results[name]['ende_validation_paired'] = dict(
        tasks.paired_bleu(base['targets'], base['predictions'], decodes[name]['predictions']), against=baseline)


def paired_markdown(results: Mapping[str, Mapping[str, Any]]) -> List[str]:
  rows = [(name, r['ende_validation_paired']) for name, r in results.items() if r.get('ende_validation_paired')]
  if not rows:
    return []
  lines = ['', f"En→De validation BLEU against {rows[0][1]['against']}'s on the same examples, by paired bootstrap "
           f"resampling ({rows[0][1]['n_samples']} draws of the examples with replacement; `tasks.paired_bleu`):", '',
           '| target | BLEU | Δ BLEU | 95% interval of Δ | draws not worse |', '|---|---|---|---|---|']
  for name, p in rows:
    low, high = p['delta_ci95']
    lines.append(f"| {name} | {p['candidate']:.2f} | {p['delta']:+.2f} | [{low:+.2f}, {high:+.2f}] | "
                 f"{p['share_candidate_not_worse']:.1%} |")
  return lines


def compare_markdown(results: Mapping[str, Mapping[str, Any]], args, header: str) -> str:
  lines = ['# Targets side by side on the same held-out examples', '', header, '',
           f'Token loss: nats per target token, teacher-forced, first {args.loss_examples} validation examples '
           'of each task. BLEU: greedy, the whole En→De validation split '
           f'({"all" if args.validation_examples is None else args.validation_examples} examples) and the first '
           f'{args.test_examples} test examples. ROUGE: greedy, first {args.test_examples} summarization test '
           f'examples. Top-1: the target\'s top-1 probability on its own greedy decodes of the first '
           f'{args.confidence_examples} En→De validation inputs (`evaluation.target_confidence`).', '',
           '| target | En→De loss | summ. loss | **En→De BLEU val.** | En→De BLEU test | ROUGE-1 / 2 / Lsum test | '
           'top-1 median | top-1 ≥ 0.9 | entropy (nats) |', '|---|---|---|---|---|---|---|---|---|']
  for name, r in results.items():
    rouge = r['summarize_test']
    lines.append(
        f"| {name} (`{r['path']}`) | {r['ende_validation_loss']['loss']:.3f} | "
        f"{r['summarize_validation_loss']['loss']:.3f} | **{r['ende_validation']['bleu']:.1f}** | "
        f"{r['ende_test']['bleu']:.1f} | {rouge['rouge1']:.1f} / {rouge['rouge2']:.1f} / {rouge['rougeLsum']:.1f} | "
        f"{r['confidence']['top1_median']:.2f} | {r['confidence']['share_top1_at_least_0.9']:.2f} | "
        f"{r['confidence']['entropy_mean_nats']:.2f} |")
  lines += paired_markdown(results)
  if any('training' in r for r in results.values()):
    lines += training_markdown(results)
  lines += notes(results, args.same_data, args.test_examples)
  return '\n'.join(lines) + '\n'


def earlier_figures(figures_dir: str) -> Tuple[Dict[str, Any], Any, Dict[str, str], str]:
  """An earlier run's (compare.json, its parsed arguments, its targets in its command's order, its provenance
  line), for --figures_from. The provenance line is the json's `header`, or else its compare.md's line that quotes
  its command."""
  earlier = fileio.read_json_object(os.path.join(figures_dir, 'compare.json'), 'comparison')
  words = shlex.split(earlier['command'])
  earlier_args, targets = parse_args(words[words.index('scripts/compare_targets.py') + 1:], check_dirs=False)
  header = earlier.get('header')
  md_path = os.path.join(figures_dir, 'compare.md')
  if header is None and os.path.isfile(md_path):
    with open(md_path, encoding='utf-8') as f:
      header = next((line.rstrip('\n') for line in f if line.startswith(f"`{earlier['command']}`")), None)
  return earlier, earlier_args, targets, header or f"`{earlier['command']}`"


def gin_caps(gin_file: str) -> Dict[str, Any]:
  """The steps and minutes a training gin file allows ({'file', 'num_steps', 'max_minutes', 'init_from_dir'}):
  the trainer stops at whichever comes first, so neither is what a run of it did."""
  import gin  # pylint: disable=g-import-not-at-top
  from specdec import gin_utils  # pylint: disable=g-import-not-at-top
  from specdec.training import train_config  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    gin_utils.parse([gin_file], ["MODEL_DIR = 'unused'"])
    flat = train_config.flat_settings(gin.get_configurable(train_config.TrainConfig)())
  finally:
    gin.clear_config()
  return {'file': gin_file, 'num_steps': flat['num_steps'], 'max_minutes': flat['max_minutes'],
          'init_from_dir': flat['init_from_dir']}


def training_record(path: str, gin_file: str = None) -> Dict[str, Any]:
  """How a target was trained, from what is here: steps and minutes (counted from the first run's start) and the
  runs, from the training record in `path`/config.json; None each, with `unknown_because`, where that cannot be
  read. `gin` the caps of `gin_file` (`gin_caps`), if given."""
  out: Dict[str, Any] = {'steps': None, 'minutes': None, 'runs': None, 'source': None, 'unknown_because': None,
                         'gin': gin_caps(gin_file) if gin_file else None}
  config_path = os.path.join(path, 'config.json')
  if not os.path.isfile(config_path):
    out['unknown_because'] = f'{config_path} is not here (the export was not kept)'
    return out
  runs = checkpoints.training_runs(fileio.read_json_object(config_path, 'model config').get('train'))
  if not runs:
    out['unknown_because'] = f'{config_path} holds no training record'
    return out
  out.update(steps=runs[-1]['to_step'], minutes=sum(r['minutes'] for r in runs), source=config_path,
             runs=[{k: r[k] for k in ('from_step', 'to_step', 'minutes', 'init_from_dir', 'command')} for r in runs])
  return out


def training_markdown(results: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = ['', "Training: steps and wall minutes from each target's own training record (its config.json), counted "
           "from its first run's start; a gin file's caps are what its run was allowed (it stops at the first "
           'reached), not what it ran.', '',
           '| target | steps | minutes | runs | from | gin caps |', '|---|---|---|---|---|---|']
  for name, r in results.items():
    t = r.get('training') or {}
    g = t.get('gin')
    caps = f"{g['num_steps']} steps / {reporting.fmt(g['max_minutes'], 'g')} min (`{g['file']}`)" if g else '-'
    if t.get('runs'):
      lines.append(f"| {name} | {t['steps']} | {t['minutes']:.1f} | {len(t['runs'])} | "
                   f"`{t['runs'][0]['init_from_dir'] or 'random'}` | {caps} |")
    else:
      lines.append(f"| {name} | unknown | unknown | unknown | {'`' + g['init_from_dir'] + '`' if g else '-'} | "
                   f"{caps} |")
  unknown = [f"- {name}: unknown because {r['training']['unknown_because']}." for name, r in results.items()
             if (r.get('training') or {}).get('unknown_because')]
  return lines + ([''] + unknown if unknown else [])
  return lines


def _order(results: Mapping[str, Mapping[str, Any]], figure) -> List[Tuple[str, float]]:
  return sorted(((name, figure(r)) for name, r in results.items()), key=lambda nv: -nv[1])


def notes(results: Mapping[str, Mapping[str, Any]], same_data: Sequence[Tuple[str, str, str]],
          test_examples: int) -> List[str]:
  """What the figures can and cannot tell, computed from them: one model per target; the test split's order
  beside the validation split's; each `same_data` pair's loss difference beside every other pair's."""
  lines = ['', '## Reading these figures', '',
           '- Each target is one trained model; none was trained twice. The paired bootstrap interval covers the '
           'sampling of the examples, not the variance between training runs: a second run of the same command '
           'may differ by more than the interval.']
  val = _order(results, lambda r: r['ende_validation']['bleu'])
  test = _order(results, lambda r: r['ende_test']['bleu'])
  lines.append(f"- En→De BLEU, whole validation split (what a decision reads): "
               f"{' > '.join(f'{n} {v:.1f}' for n, v in val)}; first {test_examples} test examples: "
               f"{' > '.join(f'{n} {v:.1f}' for n, v in test)}"
               + (' (a different order).' if [n for n, _ in val] != [n for n, _ in test] else ' (the same order).'))
  names = list(results)
  for task, a, b in same_data:
    key = f'{task}_validation_loss'
    gap = abs(results[a][key]['loss'] - results[b][key]['loss'])
    others = [(x, y, abs(results[x][key]['loss'] - results[y][key]['loss']))
              for i, x in enumerate(names) for y in names[i + 1:] if {x, y} != {a, b}]
    label = TASK_LABELS[task]
    lines.append(f"- {a} and {b} were trained on identical {label} data, yet their {label} loss differs by "
                 f"{gap:.2f} nats: that much comes from something other than the {label} data (the other task's "
                 'data through the shared weights, or one training run against another), and with one run per '
                 'target these figures cannot tell which. The other pairs differ by '
                 + ', '.join(f'{d:.2f} ({x}–{y})' for x, y, d in others)
                 + (': none by more, so none of these differences can be told from run-to-run noise.'
                    if all(d <= gap for _, _, d in others) else '.'))
  here = [n for n, r in results.items() if os.path.isfile(os.path.join(r['path'], 'config.json'))]
  gone = [n for n in results if n not in here]
  if gone:
    lines.append('- ' + ', '.join(f"{n} (`{results[n]['path']}`)" for n in gone)
                 + ': not here when this file was written, so their figures (validation and test alike) are those '
                 'of the one run of the command that made them, and cannot be recomputed'
                 + (f"; {', '.join(here)}'s can." if here else '.'))
  return lines


def learning_curve(model_dirs: Sequence[str]) -> Dict[str, Any]:
  """The trainer's evaluations of one or more runs, each continuing the one before
  ({'points': [{step, minutes, eval_loss, bleu, rouge1}]}). A later run's steps and minutes count on from where the
  earlier ones ended (each run directory counts its own from 0); minutes at each run directory's recorded rate (its
  runs' minutes over their steps)."""
  points, all_runs = [], []
  step_offset, minute_offset = 0, 0.0
  for model_dir in model_dirs:
    log = fileio.read_jsonl(os.path.join(model_dir, 'train_log.jsonl'))
    runs = fileio.read_jsonl(os.path.join(model_dir, 'runs.jsonl'))
    steps = sum(r['to_step'] - r['from_step'] for r in runs)
    minutes = sum(r['minutes'] for r in runs)
    per_step = minutes / steps if steps else None
    for rec in log:
      if rec.get('kind') != 'eval':
        continue
      points.append({'step': step_offset + rec['step'],
                     'minutes': None if per_step is None else minute_offset + rec['step'] * per_step,
                     'eval_loss': rec['eval_loss'], 'bleu': rec.get(f"{TASKS['ende']}/bleu"),
                     'rouge1': rec.get(f"{TASKS['summarize']}/rouge1")})
    all_runs += [dict(r, model_dir=model_dir, from_step=step_offset + r['from_step'],
                      to_step=step_offset + r['to_step']) for r in runs]
    step_offset += max((r['to_step'] for r in runs), default=0)
    minute_offset += minutes
  return {'points': points, 'minutes_per_step': minute_offset / step_offset if step_offset else None,
          'runs': all_runs}


def curve_markdown(curve: Mapping[str, Any], start: Mapping[str, Any], header: str) -> str:
  lines = ['# Learning curve', '', header, '',
           "The trainer's own evaluations: validation loss of the training mixture (8 batches), greedy BLEU and "
           'ROUGE-1 on the first 64 validation examples of each task. Step 0 is the starting point '
           f"(`{start['path']}`, scored the same way by this script: its BLEU on 64 validation examples is not "
           'computed there, so the row shows its whole-split BLEU). Minutes at the run\'s average rate.', '',
           '| step | CPU minutes | validation loss | En→De BLEU (64 val.) | ROUGE-1 (64 val.) |', '|---|---|---|---|---|',
           f"| 0 | 0 | - | {start['ende_validation']['bleu']:.1f} (whole split) | - |"]
  for p in curve['points']:
    lines.append(f"| {p['step']} | {reporting.fmt(p['minutes'], '.1f')} | {p['eval_loss']:.4f} | "
                 f"{reporting.fmt(p['bleu'], '.1f')} | {reporting.fmt(p['rouge1'], '.1f')} |")
  return '\n'.join(lines) + '\n'


def model_card(name: str, results: Mapping[str, Mapping[str, Any]], header: str) -> str:
  """MODEL_CARD.md of target `name`: its config and training (from its config.json), its figures beside the
  other targets'."""
  path = results[name]['path']
  meta = fileio.read_json_object(os.path.join(path, 'config.json'), 'model config')
  train = meta.get('train') or {}
  config = meta['config']
  runs = checkpoints.training_runs(train)
  first_init = runs[0]['init_from_dir'] if runs else train.get('init_from_dir')
  others = [n for n in results if n != name]
  lines = [f'# Model card: {name} (`{path}`)', '',
           '- Architecture: T5 1.1 (RMS norm, gated GELU, relative position bias), Flax, T5X param tree; '
           f"stored in {meta.get('storage_dtype', '?')}.",
           f"- Config: {config}",
           f"- Training: {runs[-1]['to_step'] if runs else '?'} steps, "
           f"{sum(r['minutes'] for r in runs):.1f} minutes of recorded wall time on a 2-core CPU in {len(runs)} "
           f"run(s), initialised from `{first_init or 'random'}`, dropout {config.get('dropout_rate')}, corpus "
           f"`{train.get('corpus_dir') or 'data/corpus'}` (`{train.get('mixture_or_task_name', '?')}`); each run "
           'continued the model before it:']
  lines += [f"  - `{r['command']}`: steps {r['from_step']}→{r['to_step']}, {r['minutes']:.1f} min, from "
            f"`{r['init_from_dir'] or 'random'}`" for r in runs]
  lines += ['', f'Beside {", ".join(others) or "nothing"} on the same held-out examples ({header}):', '',
            '| target | En→De loss | summ. loss | En→De BLEU val. | En→De BLEU test | ROUGE-1 test | top-1 median |',
            '|---|---|---|---|---|---|---|']
  for n, r in results.items():
    lines.append(f"| {n} | {r['ende_validation_loss']['loss']:.3f} | {r['summarize_validation_loss']['loss']:.3f} | "
                 f"{r['ende_validation']['bleu']:.1f} | {r['ende_test']['bleu']:.1f} | "
                 f"{r['summarize_test']['rouge1']:.1f} | {r['confidence']['top1_median']:.2f} |")
  return '\n'.join(lines) + '\n'


def main(argv=None):
  args, targets = parse_args(argv)
  tasks.register_tasks()
  command = reporting.run_command(['scripts/compare_targets.py'] + list(sys.argv[1:] if argv is None else argv))
  machine = reporting.machine_info()
  now = datetime.datetime.now().isoformat(timespec='seconds')
  header = f"`{command}` · {now} · {machine['processor']}, {machine['cpu_count']} CPUs, jax {machine['jax']}"
  rewritten_by = None
  results: Dict[str, Any] = {}
  if args.figures_from is not None:
    earlier, earlier_args, _, header = earlier_figures(args.figures_from)
    rewritten_by, command, machine = command, earlier['command'], earlier['machine']
    results = {name: {k: v for k, v in earlier['targets'][name].items() if k != 'training'} for name in targets}
    for flag in ('loss_examples', 'test_examples', 'validation_examples', 'confidence_examples'):
      setattr(args, flag, getattr(earlier_args, flag))
    header += (f'\n\nRewritten by `{rewritten_by}` · {now}, without decoding: the figures are those of the '
               'command above (its compare.json); the training table and the notes are this command\'s.')
  else:
    decodes: Dict[str, Any] = {}
    for name, path in targets.items():
      print(f'evaluating {name} ({path})', flush=True)
      results[name], decodes[name] = evaluate_target(path, args)
    add_paired(results, decodes, args.paired_baseline or next(iter(targets)))
  for name, path in targets.items():
    results[name]['training'] = training_record(path, args.train_gin.get(name))
  os.makedirs(args.out, exist_ok=True)
  fileio.write_json(os.path.join(args.out, 'compare.json'), {'command': command, 'header': header.split('\n')[0],
                                                            'rewritten_by': rewritten_by, 'machine': machine,
                                                            'targets': results})
  text = compare_markdown(results, args, header)
  fileio.atomic_write(os.path.join(args.out, 'compare.md'), text.encode())
  print(text, flush=True)
  if args.card:
    fileio.atomic_write(os.path.join(targets[args.card], 'MODEL_CARD.md'),
                        model_card(args.card, results, header).encode())
  if args.log:
    curve = learning_curve(args.log)
    start = next(iter(results.values()))
    fileio.write_json(os.path.join(args.out, 'curve.json'), dict(curve, command=command, start=start))
    fileio.atomic_write(os.path.join(args.out, 'curve.md'), curve_markdown(curve, start, header).encode())
    plots.plot_learning_curve(os.path.join(args.out, 'curve.png'), curve, start)
  return results


if __name__ == '__main__':
  main()
