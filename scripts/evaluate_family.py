"""Evaluates the shipped CPU model family: quality, acceptance, greedy identity.

  python scripts/evaluate_family.py --models models/cpu --max_examples 256

For every network in <models>/ (target, d1, d1kd, d1s, d2, d3; those present): validation loss is read
from its config, BLEU on the local En→De test split and ROUGE on the local
summarization test split come from greedy decodes here. For every drafter
(unigram, bigram, trigram, d3, d2, d1s, d1kd, d1, and the feature heads f128mix, f128, f256, which read the
target's own features, each over the draft vocabulary it ships; those present): speculative decoding with the target on both
test splits at temperature 0 and 1 gives α two ways (accepted / judged, and
the mean of Σ min(p, q) over verified positions) next to the paper's Table 3,
and at temperature 0 the share of outputs identical to the target's baseline.

Writes <results>/models.md, acceptance.md and family_eval.json (--results, default results/models_v1:
the first family's) and a MODEL_CARD.md in each model directory. Re-running recomputes everything.
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, installed or not
from specdec import checkpoints
from specdec import decoding
from specdec import evaluation
from specdec import fileio
from specdec import loading
from specdec import models
from specdec import network
from specdec import task_names
from specdec import theory

TASKS = dict(task_names.LOCAL_TASK_BY_NAME)
NETWORKS = ('target', 'd1', 'd1kd', 'd1s', 'd2', 'd3')  # each evaluated if <models>/<name> exists
NGRAMS = ('unigram', 'bigram', 'trigram')
HEADS = ('f128mix', 'f128', 'f256')  # feature heads (specdec/feature_drafter.py): drafters, not networks
DRAFTERS = NGRAMS + ('d3', 'd2', 'd1s', 'd1kd', 'd1') + HEADS
# PAPER.md Table 3, T5-XXL rows (t=0 / t=1); the paper's drafters differ.
PAPER_TABLE3 = {
    'ende': {'unigram': (0.08, 0.07), 'bigram': (0.20, 0.19),
             'small': (0.75, 0.62), 'base': (0.80, 0.68), 'large': (0.82, 0.71)},
    'summarize': {'unigram': (0.13, 0.08), 'bigram': (0.23, 0.16),
                  'small': (0.65, 0.53), 'base': (0.73, 0.55), 'large': (0.74, 0.56)},
}
PAPER_DRAFTER_FOR = {'d3': 'small', 'd2': 'base', 'd1': 'large',
                     'unigram': 'unigram', 'bigram': 'bigram',
                     # The distilled d1 (d1kd) and its one-decoder-layer version (d1s) stand in for the paper's
                     # T5-small: its only drafter near 0.75 greedy.
                     'd1kd': 'small', 'd1s': 'small'}


def _write(path, text):
  fileio.atomic_write(path, text.encode())


def _param_count(params):
  return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))


def _cost_ratio(config, target_config, input_len):
  """Per-token decoder multiply-adds relative to the target's."""
  if not isinstance(config, network.T5Config):
    return 0.0  # n-gram: a table lookup
  return (network.decoder_macs_per_token(config, input_len)
          / network.decoder_macs_per_token(target_config, input_len))


def quality(name, module, params, lengths, max_examples, batch_size):
  model = models.SpeculativeEncoderDecoderModel(
      module, None, decode_fn=decoding.temperature_sample)
  predict = model.compile_predict({'temperature': 0.0})
  out = {}
  for key, task in TASKS.items():
    result = evaluation.decode_and_score(
        predict, {'target': params}, task, 'test', lengths,
        batch_size=batch_size, max_examples=max_examples)
    out[key] = result['metrics']
    print(f'  {name} {key}: {result["metrics"]} ({result["seconds"]:.0f} s)', flush=True)
  return out


def acceptance(target, drafter, lengths, max_examples, batch_size, gamma,
               temperatures=(0.0, 1.0)):
  """α and identity for one drafter ((module, params) or, with its draft vocabulary, (module, params, ids)) on both
  tasks and temperatures."""
  (t_module, t_params), (d_module, d_params, *vocab) = target, drafter
  spec = models.SpeculativeEncoderDecoderModel(t_module, d_module, draft_vocab_ids=(vocab or [None])[0])
  params = spec.with_draft_projection({'target': t_params, 'drafter': d_params})
  base = models.SpeculativeEncoderDecoderModel(
      t_module, None, decode_fn=decoding.temperature_sample)
  out = {}
  for key, task in TASKS.items():
    examples = evaluation.task_examples(task, 'test', lengths, max_examples)
    for temperature in temperatures:
      dp = {'temperature': temperature, 'topk': 0}
      predict = spec.compile_predict(dict(dp, gamma=gamma, return_stats=True))
      base_predict = base.compile_predict(dp)
      totals, identical, rows = {}, 0, 0
      rng = jax.random.PRNGKey(0)
      for idx, batch in evaluation.batches(examples, lengths, batch_size, use_buckets=False):
        rng, step_rng = jax.random.split(rng)
        decodes, aux = predict(params, batch, step_rng)
        stats = jax.tree_util.tree_map(lambda x: np.asarray(x)[:len(idx)],
                                       aux['stats'])
        for k, v in stats.items():
          totals[k] = totals.get(k, 0) + v.sum(0)
        if temperature == 0.0:
          ref, _ = base_predict(params, batch, step_rng)
          same = np.all(np.asarray(decodes) == np.asarray(ref), axis=-1)[:len(idx)]
          identical += int(same.sum())
        rows += len(idx)
      entry = {
          'alpha_accepted_over_judged': float(theory.acceptance_rate(totals['accepted'], totals['judged'])),
          'alpha_sum_min_pq': float(totals['overlap_sum'] / max(totals['overlap_count'], 1)),
          'tokens_per_target_call': float(totals['emitted'] / max(totals['target_calls'], 1)),
          'accepted_at': (totals['accepted_at'] / max(int(totals['target_calls']), 1)).tolist(),
          'examples': rows, 'verified_positions': int(totals['overlap_count'])}
      if temperature == 0.0:
        entry['identical_outputs'] = f'{identical}/{rows}'
      out[f'{key}/t={temperature:g}'] = entry
      print(f'    {key} t={temperature:g}: α={entry["alpha_sum_min_pq"]:.3f} '
            f'(acc/judged {entry["alpha_accepted_over_judged"]:.3f}), '
            f'{entry["tokens_per_target_call"]:.2f} tokens/call'
            + (f', identical {entry["identical_outputs"]}' if temperature == 0.0 else ''),
            flush=True)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='models/cpu')
  parser.add_argument('--results', default='results/models_v1')
  parser.add_argument('--max_examples', type=int, default=256)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--gamma', type=int, default=5)
  parser.add_argument('--inputs_length', type=int, default=96)
  parser.add_argument('--targets_length', type=int, default=48)
  parser.add_argument('--temperatures', default='0,1',
                      help='comma-separated decode temperatures for the acceptance runs')
  parser.add_argument('--no_cards', action='store_true',
                      help='do not (re)write the MODEL_CARD.md files')
  args = parser.parse_args()
  temperatures = tuple(float(t) for t in args.temperatures.split(','))
  lengths = {'inputs': args.inputs_length, 'targets': args.targets_length}
  command = 'python scripts/evaluate_family.py ' + ' '.join(sys.argv[1:])
  started = time.time()

  loaded = {}
  for name in NETWORKS + NGRAMS:
    path = os.path.join(args.models, name)
    if os.path.isdir(path):
      loaded[name] = loading.load_module_and_params(path)
  if 'target' not in loaded:
    raise SystemExit(f'No target model in {args.models}/target.')
  for name in HEADS:
    path = os.path.join(args.models, name)
    if os.path.isdir(path):
      loaded[name] = loading.load_drafter(path, loaded['target'][1])
  target_config = loaded['target'][0].config

  report = {'command': command, 'date': datetime.date.today().isoformat(),
            'machine': f'{platform.machine()}, {os.cpu_count()} CPUs, jax {jax.__version__}',
            'lengths': lengths, 'max_examples': args.max_examples,
            'gamma': args.gamma, 'models': {}, 'acceptance': {}}
  for name in NETWORKS:
    if name not in loaded:
      continue
    module, params = loaded[name]
    with open(os.path.join(args.models, name, checkpoints.CONFIG_FILE)) as f:
      meta = json.load(f)
    report['models'][name] = {
        'params': _param_count(params),
        'decode_cost_vs_target': _cost_ratio(module.config, target_config,
                                             args.inputs_length),
        'train': meta.get('train', {}),
        'test': quality(name, module, params, lengths, args.max_examples,
                        args.batch_size)}
  # How sure the target is of its own greedy decodes: what bounds any drafter's greedy α.
  report['target_confidence'] = evaluation.target_confidence(
      *loaded['target'], evaluation.task_examples(TASKS['ende'], 'test', lengths, args.max_examples), lengths,
      args.batch_size)
  print(f"  target_confidence (En→De): {report['target_confidence']}", flush=True)
  for name in DRAFTERS:
    if name not in loaded:
      continue
    print(f'  drafter {name}:', flush=True)
    report['acceptance'][name] = acceptance(
        loaded['target'], loaded[name], lengths, args.max_examples,
        args.batch_size, args.gamma, temperatures)
  report['seconds'] = time.time() - started

  os.makedirs(args.results, exist_ok=True)
  _write(os.path.join(args.results, 'family_eval.json'),
         json.dumps(report, indent=2, sort_keys=True))
  _write(os.path.join(args.results, 'models.md'), models_table(report))
  _write(os.path.join(args.results, 'acceptance.md'), acceptance_table(report))
  for name, entry in ({} if args.no_cards else report['models']).items():
    card = os.path.join(args.models, name, 'MODEL_CARD.md')
    if writes_card(card, name):
      _write(card, model_card(name, loaded[name][0].config, entry, report))
    else:
      print(f'{card}: kept (written by another tool, e.g. scripts/compare_targets.py --card)')
  for name in NGRAMS:
    if name in report['acceptance'] and not args.no_cards:
      _write(os.path.join(args.models, name, 'MODEL_CARD.md'),
             ngram_card(name, os.path.join(args.models, name), report))
  print(models_table(report))
  print(acceptance_table(report))


def _header(report, title):
  return (f'# {title}\n\nMade by `{report["command"]}` on {report["date"]} '
          f'({report["machine"]}); first {report["max_examples"]} examples of each '
          f'local test split, lengths {report["lengths"]}.\n\n')


def models_table(report):
  lines = [_header(report, 'The CPU model family'),
           '| model | params | decode cost vs target | train steps | val loss | '
           'En→De test BLEU | summ. ROUGE-1/2/Lsum |', '|---|---|---|---|---|---|---|']
  for name, m in report['models'].items():
    ev = m['train'].get('final_eval', {})
    s = m['test']['summarize']
    lines.append(
        f"| {name} | {m['params'] / 1e6:.2f}M | {m['decode_cost_vs_target']:.3f} | "
        f"{train_steps(m['train'])} | {ev.get('eval_loss', float('nan')):.3f} | "
        f"{m['test']['ende'].get('bleu', float('nan')):.1f} | "
        f"{s.get('rouge1', 0):.1f}/{s.get('rouge2', 0):.1f}/{s.get('rougeLsum', 0):.1f} |")
  conf = report.get('target_confidence')
  if conf:
    lines += ['', f"target_confidence (En→De, the target teacher-forced on its own greedy decodes of "
              f"{conf['examples']} test inputs, {conf['positions']} positions): top-1 probability median "
              f"{conf['top1_median']:.2f}, mean {conf['top1_mean']:.2f}; >= 0.5 at "
              f"{100 * conf['share_top1_at_least_0.5']:.0f}% of positions, >= 0.9 at "
              f"{100 * conf['share_top1_at_least_0.9']:.0f}%; mean entropy {conf['entropy_mean_nats']:.2f} nats."]
  return '\n'.join(lines) + '\n'


def acceptance_table(report):
  lines = [_header(report, 'Acceptance rates of the drafters (Table 3 analogue)'),
           f'Target: `target`; γ = {report["gamma"]}. α = mean Σ min(p, q) over verified '
           'positions (the paper\'s estimator), then accepted/judged drafts. Paper: T5-XXL '
           'with T5-small/base/large drafters (d3/d2/d1 play those roles at CPU scale).\n',
           '| task | temp | drafter | α Σmin(p,q) | α acc/judged | tokens/call | '
           'greedy identical | paper α (drafter) |', '|---|---|---|---|---|---|---|---|']
  for name, per_task in report['acceptance'].items():
    for key, e in per_task.items():
      task, temp = key.split('/t=')
      role = PAPER_DRAFTER_FOR.get(name)  # the trigram has no paper row
      paper = (f"{PAPER_TABLE3[task][role][0 if temp == '0' else 1]:.2f} ({role})" if role else '-')
      lines.append(
          f"| {task} | {temp} | {name} | {e['alpha_sum_min_pq']:.3f} | "
          f"{e['alpha_accepted_over_judged']:.3f} | {e['tokens_per_target_call']:.2f} | "
          f"{e.get('identical_outputs', '')} | {paper} |")
  return '\n'.join(lines) + '\n'


def train_steps(record) -> str:
  """A model's training steps over every run of its chain (a continued model's own step count is its last
  trainer's), with the model its first run started from."""
  runs = checkpoints.training_runs(record)
  if not runs:
    return str(record.get('step', '?'))
  start = runs[0].get('init_from_dir')
  return f"{runs[-1]['to_step']}" + (f' (from `{start}`)' if start else '')


def writes_card(path: str, name: str) -> bool:
  """Whether this script (re)writes the card at `path`: where there is none, or where the one there is its own
  (`model_card`'s title). A richer card another tool wrote (a continued target's, with every run and the
  comparison with the target it continues) is kept."""
  if not os.path.exists(path):
    return True
  with open(path, encoding='utf-8') as f:
    return f.readline().rstrip('\n') == f'# Model card: {name}'


def model_card(name, config, entry, report):
  train = entry['train']
  ev = train.get('final_eval', {})
  return f"""# Model card: {name}

- Architecture: T5 1.1 (RMS norm, gated GELU, relative position bias), Flax, T5X param tree.
- Config: {json.dumps(checkpoints.config_to_dict(config))}
- Parameters: {entry['params']:,}; per-token decoder cost {entry['decode_cost_vs_target']:.3f}× the target's.
- Data: local Debian package corpora (specdec/data/corpora.py; `{train.get('mixture_or_task_name', '?')}`),
  vocabulary specdec/assets/spm_ende_8k.model.
- Training: {train.get('step', '?')} steps, {train.get('minutes', float('nan')):.1f} minutes of recorded wall time on
  this 2-core CPU over {len(train.get('runs', []))} recorded run(s) (a run not in the list was not timed):
{chr(10).join(f"  - `{r['command']}`: steps {r['from_step']}→{r['to_step']}, {r['minutes']:.1f} min" for r in train.get('runs', []))}
- Teacher (distillation): {train.get('teacher_dir')}; training corpus: {train.get('corpus_dir') or 'the local corpus'}
  (a `data/distill_*` corpus holds a target's decodes: scripts/build_distill_corpus.py); initialised from:
  {train.get('init_from_dir') or 'random'}.
- Final validation loss: {ev.get('eval_loss', float('nan')):.4f}.
- Test (greedy, first {report['max_examples']} examples): En→De BLEU {entry['test']['ende'].get('bleu', float('nan')):.2f};
  summarization ROUGE {json.dumps({k: round(v, 2) for k, v in entry['test']['summarize'].items()})}.
- Made by `{report['command']}` on {report['date']}.
"""


def ngram_card(name, directory, report):
  with open(os.path.join(directory, checkpoints.CONFIG_FILE)) as f:
    meta = json.load(f)
  data = meta.get('data', {})
  rows = '\n'.join(
      f"  - {key}: α {e['alpha_sum_min_pq']:.3f}, {e['tokens_per_target_call']:.2f} tokens per target call"
      + (f", greedy identical {e['identical_outputs']}" if 'identical_outputs' in e else '')
      for key, e in report['acceptance'][name].items())
  source = ('the references of the local corpus' if not data.get('decodes_of') else
            f"`{data['decodes_of']}`'s own {data.get('decoding', '')} decodes of the training inputs "
            f"(`{data['corpus_dir']}`, made by `{data.get('corpus_command', 'scripts/build_distill_corpus.py')}`)")
  return f"""# Model card: {name}

- A {name} language model over the target vocabulary (specdec/ngram.py; it ignores the encoder input), fitted
  from the token counts of the train targets: {source}.
  Config: {json.dumps(meta['ngram_config'])}.
- Data: {json.dumps(data)}.
- Built by `{meta.get('command', 'python scripts/build_ngram_drafters.py')}` (seconds on 2 CPU cores).
- As a drafter for `target` (γ = {report['gamma']}, first {report['max_examples']} test examples per task):
{rows}
- Made by `{report['command']}` on {report['date']}.
"""


if __name__ == '__main__':
  main()
