"""Distillation for speculative decoding: which divergence and which data align a drafter with the target.

  python scripts/distill_drafters.py train    [RUN ...]   # resumable; a finished run is skipped
  python scripts/distill_drafters.py evaluate [RUN ...] --max_examples 128 --out results/distill/divergences
  python scripts/distill_drafters.py ship RUN --name NAME     # -> <family's models>/NAME + MODEL_CARD.md

Each run belongs to a family (`FAMILIES`: the target it is distilled against, v1 = models/cpu/target, v2 =
models/cpu_v2/target) and continues a shipped drafter (`init`) on one kind of data and loss:

* data: the reference corpus (`data/corpus`), the target's greedy decodes of the training inputs
  (`data/distill_greedy`), or one sample per input at temperature 1 (`data/distill_t1`); the last two come from
  `scripts/build_distill_corpus.py` and carry a fingerprint of the target that made them;
* loss: cross-entropy on the data's tokens alone (no teacher: on greedy decodes this is the cross-entropy on the
  target's greedy tokens, sequence-level KD), or a divergence to the target's distribution at every position
  (`train_config.DistillConfig(teacher_dir=..., divergence=...)`: fkl, rkl, tvd; specdec/training/distill.py).

`train` runs `python -m specdec.training.train` per run into runs/distill/<run> (checkpoints, logs, export).
`evaluate` measures, for each finished run and for the shipped drafters it started from, α against the shipped
target on the first `--max_examples` test examples of both local tasks, greedy and at temperature 1
(`scripts/evaluate_family.acceptance`: α = mean Σ min(p, q) over verified positions), and writes
OUT.md / OUT.json atomically. No timing is involved, so `evaluate` may share the machine.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RUNS_DIR = 'runs/distill'
# A family: the target the drafters are distilled against, where its drafters ship, and its corpora.
FAMILIES = {
    # The first CPU family: the 13.6M target (256 wide).
    'v1': {'target': 'models/cpu/target', 'models': 'models/cpu',
           'data': {'ref': 'data/corpus', 'greedy': 'data/distill_greedy', 't1': 'data/distill_t1'},
           'baselines': ('d2', 'd1kd')},
    # The second: the 22.8M target (384 wide, gin/train/cpu_target_v2.gin), whose decoder outgrows the L3 cache.
    'v2': {'target': 'models/cpu_v2/target', 'models': 'models/cpu_v2',
           'data': {'ref': 'data/corpus', 'greedy': 'data/distill_greedy_v2', 't1': 'data/distill_t1_v2'},
           'baselines': ('d2', 'd1s', 'd1kd')},
}
# name: (train gin, init_from_dir, data key, divergence or None (CE on the data), steps, init_matching_only,
#        family)
RUNS = {
    'd2_ce_greedy': ('train/cpu_drafter_d2.gin', 'models/cpu/d2', 'greedy', None, 600, False, 'v1'),
    'd2_fkl_ref': ('train/cpu_drafter_d2.gin', 'models/cpu/d2', 'ref', 'fkl', 600, False, 'v1'),
    'd2_fkl_greedy': ('train/cpu_drafter_d2.gin', 'models/cpu/d2', 'greedy', 'fkl', 600, False, 'v1'),
    'd2_rkl_greedy': ('train/cpu_drafter_d2.gin', 'models/cpu/d2', 'greedy', 'rkl', 600, False, 'v1'),
    'd2_tvd_greedy': ('train/cpu_drafter_d2.gin', 'models/cpu/d2', 'greedy', 'tvd', 600, False, 'v1'),
    'd2_fkl_t1': ('train/cpu_drafter_d2.gin', 'models/cpu/d2', 't1', 'fkl', 600, False, 'v1'),
    'd2_tvd_t1': ('train/cpu_drafter_d2.gin', 'models/cpu/d2', 't1', 'tvd', 600, False, 'v1'),  # not run yet
    # One decoder layer under d1's encoder, from d1kd's shared parameters (train.init_matching_only).
    'd1s_fkl_greedy': ('train/cpu_drafter_d1s.gin', 'models/cpu/d1kd', 'greedy', 'fkl', 600, True, 'v1'),
    # Against the v2 target: the v1 drafters continued on its greedy decodes (sequence-level KD: cheap, and
    # the winner for greedy in results/distill/divergences.md).
    'v2_d1kd_ce_greedy': ('train/cpu_drafter_d1.gin', 'models/cpu/d1kd', 'greedy', None, 1200, False, 'v2'),
    'v2_d1s_ce_greedy': ('train/cpu_drafter_d1s.gin', 'models/cpu/d1s', 'greedy', None, 1200, False, 'v2'),
    'v2_d2_ce_greedy': ('train/cpu_drafter_d2.gin', 'models/cpu/d2', 'greedy', None, 1200, False, 'v2'),
    'v2_d1kd_fkl_greedy': ('train/cpu_drafter_d1.gin', 'models/cpu/d1kd', 'greedy', 'fkl', 600, False, 'v2'),
    # The shipped v2 d1kd continued for longer on twice the greedy decodes (--max_examples 16000).
    'v2_d1kd_ce_greedy_long': ('train/cpu_drafter_d1.gin', 'models/cpu_v2/d1kd', 'greedy', None, 3000, False,
                               'v2'),
}


def family_of(names) -> dict:
  """The one family the runs `names` belong to (evaluating or shipping mixes none)."""
  families = sorted({RUNS[n][6] for n in names})
  if len(families) != 1:
    raise SystemExit(f'runs {sorted(names)} belong to families {families}; pass runs of one family.')
  return FAMILIES[families[0]]


def train_command(name: str) -> list:
  gin_file, init, data, divergence, steps, matching, family = RUNS[name]
  teacher, data_dir = FAMILIES[family]['target'], FAMILIES[family]['data'][data]
  run_dir = os.path.join(RUNS_DIR, name)
  cmd = ['python', '-m', 'specdec.training.train', f'--gin_file={gin_file}',
         f"--gin.MODEL_DIR='{run_dir}'", f"--gin.EXPORT_DIR='{run_dir}/export'",
         f"--gin.train_config.InitConfig.init_from_dir='{init}'",
         f"--gin.train_config.DataConfig.corpus_dir='{data_dir}'",
         f'--gin.train_config.TrainConfig.num_steps={steps}',
         '--gin.train_config.TrainConfig.max_minutes=None',
         f'--gin.train_config.EvalConfig.eval_every={steps}',
         '--gin.train_config.TrainConfig.checkpoint_every=100']
  if matching:
    cmd.append('--gin.train_config.InitConfig.init_matching_only=True')
  if divergence:
    cmd += [f"--gin.train_config.DistillConfig.teacher_dir='{teacher}'",
            '--gin.train_config.DistillConfig.distill_weight=1.0',
            f"--gin.train_config.DistillConfig.divergence='{divergence}'"]
  return cmd


def exported_step(name: str):
  path = os.path.join(RUNS_DIR, name, 'export', 'config.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)['train']['step']


def train(names) -> int:
  for name in names:
    steps = RUNS[name][4]
    if (exported_step(name) or 0) >= steps:
      print(f'== {name}: finished (step {steps}); skipped', flush=True)
      continue
    data_dir = FAMILIES[RUNS[name][6]]['data'][RUNS[name][2]]
    if not os.path.exists(os.path.join(data_dir, 'translate_en_de', 'train.jsonl')):
      raise SystemExit(f'{name}: no corpus at {data_dir} (build it first: see the docstring).')
    cmd = train_command(name)
    print(f'== {name}: {" ".join(cmd)}', flush=True)
    rc = subprocess.call(cmd)
    if rc:
      print(f'== {name}: exited {rc}; run again to resume', flush=True)
      return rc
  return 0


def _row(name, directory, train_record, acceptance):
  t = train_record or {}
  runs = t.get('runs', [])
  return {'drafter': name, 'directory': directory,
          'init': t.get('init_from_dir'), 'corpus': t.get('corpus_dir'),
          'divergence': t.get('divergence') if t.get('teacher_dir') else 'ce (data)',
          'steps': t.get('step'), 'minutes': sum(r.get('minutes', 0) for r in runs),
          'eval_loss': (t.get('final_eval') or {}).get('eval_loss'), 'acceptance': acceptance}


def evaluate(names, args) -> int:
  from specdec import fileio  # pylint: disable=g-import-not-at-top
  from specdec import loading  # pylint: disable=g-import-not-at-top
  from specdec import task_names  # pylint: disable=g-import-not-at-top
  from specdec import tasks  # pylint: disable=g-import-not-at-top
  import evaluate_family  # pylint: disable=g-import-not-at-top
  tasks.register_local_tasks(args.corpus)
  lengths = dict(task_names.LOCAL_FEATURE_LENGTHS)
  family = family_of(names)
  target = loading.load_module_and_params(family['target'])
  todo = [(b, os.path.join('models/cpu', b)) for b in family['baselines']]
  todo += [(n, os.path.join(RUNS_DIR, n, 'export')) for n in names if exported_step(n) == RUNS[n][4]]
  rows = []
  for name, directory in todo:
    print(f'== {name}', flush=True)
    with open(os.path.join(directory, 'config.json')) as f:
      train_record = json.load(f).get('train')
    acc = evaluate_family.acceptance(target, loading.load_module_and_params(directory), lengths,
                                     args.max_examples, 32, args.gamma, (0.0, 1.0))
    rows.append(_row(name if name in RUNS else f'{name} (shipped)', directory,
                     None if name not in RUNS else train_record, acc))
  command = 'python scripts/distill_drafters.py evaluate ' + ' '.join(sys.argv[2:])
  lines = [f'# Distilling drafters: divergences and data ({os.path.basename(args.out)})', '',
           f'Made by `{command.strip()}` on {time.strftime("%Y-%m-%d")}. Target `{family["target"]}`; first '
           f'{args.max_examples} test examples per task; γ = {args.gamma}; α = mean Σ min(p, q) over verified '
           'positions (greedy: agreement of the argmaxes). Each run continues the shipped drafter for the '
           'same number of steps (batch 32, Adafactor); minutes are wall minutes on this 2-core CPU. Data: '
           'ref = the reference corpus; greedy / t1 = the target\'s greedy decodes / samples at temperature 1 '
           'of the training inputs (scripts/build_distill_corpus.py). Training commands: '
           '`python scripts/distill_drafters.py train RUN`.', '',
           '| drafter | data | loss | steps | minutes | val CE (refs) | α En→De t=0 | α En→De t=1 '
           '| α summ. t=0 | α summ. t=1 |', '|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    a = r['acceptance']
    data = next((k for k, v in family['data'].items() if v == r['corpus']), r['corpus'] or '—')
    lines.append(
        f"| {r['drafter']} | {data} | {r['divergence'] if r['steps'] else '—'} | {r['steps'] or '—'} | "
        f"{r['minutes']:.1f} | " + (f"{r['eval_loss']:.3f}" if r['eval_loss'] else '—') + ' | '
        + ' | '.join(f"{a[k]['alpha_sum_min_pq']:.3f}" for k in ('ende/t=0', 'ende/t=1', 'summarize/t=0',
                                                                   'summarize/t=1')) + ' |')
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  fileio.atomic_write(args.out + '.json', json.dumps(
      {'command': command.strip(), 'date': time.strftime('%Y-%m-%d'), 'max_examples': args.max_examples,
       'gamma': args.gamma, 'rows': rows}, indent=2).encode())
  fileio.atomic_write(args.out + '.md', ('\n'.join(lines) + '\n').encode())
  print('\n'.join(lines))
  return 0


def ship(name: str, model_name: str, results: str) -> int:
  """Copies a finished run's export to <family's models>/<model_name> with a model card."""
  import shutil  # pylint: disable=g-import-not-at-top
  from specdec import checkpoints  # pylint: disable=g-import-not-at-top
  from specdec import fileio  # pylint: disable=g-import-not-at-top
  from specdec import network  # pylint: disable=g-import-not-at-top
  if exported_step(name) != RUNS[name][4]:
    raise SystemExit(f'{name} has not finished ({exported_step(name)} of {RUNS[name][4]} steps).')
  family = family_of([name])
  teacher = family['target']
  src, dst = os.path.join(RUNS_DIR, name, 'export'), os.path.join(family['models'], model_name)
  config, params = checkpoints.load_compact(src)
  target_config, _ = checkpoints.load_compact(teacher)
  with open(os.path.join(src, 'config.json')) as f:
    t = json.load(f)['train']
  manifest_path = os.path.join(t['corpus_dir'], 'manifest.json')
  corpus_command = None
  if os.path.exists(manifest_path):
    with open(manifest_path) as f:
      corpus_command = json.load(f).get('command')
  alpha_lines = []
  if os.path.exists(results + '.json'):
    with open(results + '.json') as f:
      evaluated = json.load(f)
    for row in evaluated['rows']:
      if row['drafter'] == name:
        alpha_lines = [f"  - {k}: α {v['alpha_sum_min_pq']:.3f}, {v['tokens_per_target_call']:.2f} tokens per "
                       f"target call" + (f", greedy identical {v['identical_outputs']}"
                                         if 'identical_outputs' in v else '')
                       for k, v in row['acceptance'].items()]
        alpha_lines.insert(0, f"- Acceptance against `{teacher}` (γ = {evaluated['gamma']}, first "
                              f"{evaluated['max_examples']} test examples per task; `{evaluated['command']}`):")
  ev = t.get('final_eval') or {}
  data_text = (f"the target's decodes of the training inputs, made by `{corpus_command}`" if corpus_command
               else t['corpus_dir'])
  n_params = sum(np.size(x) for x in jax_leaves(params))
  cost = network.decoder_macs_per_token(config, 96) / network.decoder_macs_per_token(target_config, 96)
  card = f"""# Model card: {model_name} (distilled drafter)

- What: a drafter trained to predict the target `{teacher}` for speculative decoding (scripts/distill_drafters.py,
  run `{name}`): loss {t.get('divergence') or 'cross-entropy on the data'} (specdec/training/distill.py) to the target at
  every position{', weight ' + str(t.get('distill_weight')) if t.get('teacher_dir') else ''}, on
  `{t['corpus_dir']}`, starting from `{t.get('init_from_dir')}`{' (the parameters it shares: train.init_matching_only)' if RUNS[name][5] else ''}.
- Data: {data_text};
  validation and test splits are the references. Vocabulary specdec/assets/spm_ende_8k.model (the target's).
- Architecture: T5 1.1 (RMS norm, gated GELU, relative position bias), Flax, T5X param tree.
- Config: {json.dumps(checkpoints.config_to_dict(config))}
- Parameters: {n_params:,}; per-token decoder cost {cost:.3f}× the target's (multiply-adds).
- Training: {t['step']} steps, {t.get('minutes', float('nan')):.1f} minutes of recorded wall time on this 2-core CPU
  (shared with other jobs, so minutes overstate the cost) over {len(t.get('runs', []))} run(s):
{chr(10).join(f"  - `{r['command']}`: steps {r['from_step']}→{r['to_step']}, {r['minutes']:.1f} min" for r in t.get('runs', []))}
- Final evaluation by the trainer (validation cross-entropy on the references; greedy decodes of 64 validation
  examples per task): loss {ev.get('eval_loss', float('nan')):.4f}, En→De BLEU
  {ev.get('specdec_ende_local/bleu', float('nan')):.2f}, summarization ROUGE-1/2/Lsum
  {ev.get('specdec_summarize_local/rouge1', float('nan')):.2f} / {ev.get('specdec_summarize_local/rouge2', float('nan')):.2f} / {ev.get('specdec_summarize_local/rougeLsum', float('nan')):.2f}.
{chr(10).join(alpha_lines)}
- Shipped by `python scripts/distill_drafters.py ship {name} --name {model_name}`.
"""
  if os.path.exists(dst):
    shutil.rmtree(dst)
  shutil.copytree(src, dst)
  fileio.atomic_write(os.path.join(dst, 'MODEL_CARD.md'), card.encode())
  print(card)
  return 0


def jax_leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_leaves(tree)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('what', choices=('train', 'evaluate', 'ship'))
  parser.add_argument('--name', help="ship: the model directory name under the family's models (models/cpu, models/cpu_v2)")
  parser.add_argument('runs', nargs='*', help=f'default: all of {sorted(RUNS)}')
  parser.add_argument('--max_examples', type=int, default=128)
  parser.add_argument('--gamma', type=int, default=4)
  parser.add_argument('--corpus', default='data/corpus', help='the test splits α is measured on')
  parser.add_argument('--out', default='results/distill/divergences')
  args = parser.parse_args(argv)
  names = args.runs or list(RUNS)
  unknown = [n for n in names if n not in RUNS]
  if unknown:
    raise SystemExit(f'unknown runs {unknown}; known: {sorted(RUNS)}')
  if args.what == 'ship':
    if len(args.runs) != 1 or not args.name:
      raise SystemExit('ship takes one RUN and --name NAME.')
    return ship(args.runs[0], args.name, args.out)
  return train(names) if args.what == 'train' else evaluate(names, args)


if __name__ == '__main__':
  sys.exit(main())
