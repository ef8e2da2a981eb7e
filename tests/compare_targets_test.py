"""Tests of scripts/compare_targets.py's pieces that read no model: its arguments, the learning curve read from a
run's records, the tables, the model card and the figure. (The figures it reports come from
`evaluation.token_loss`, `decode_and_score` and `target_confidence`, tested in evaluation_test.py.)"""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts'))
import compare_targets  # pylint: disable=g-import-not-at-top,wrong-import-position


def _result(path, loss, bleu):
  return {'path': path, 'ende_validation_loss': {'loss': loss, 'tokens': 100},
          'summarize_validation_loss': {'loss': loss + 0.5, 'tokens': 90},
          'ende_validation': {'bleu': bleu}, 'ende_test': {'bleu': bleu - 1},
          'summarize_test': {'rouge1': 20.0, 'rouge2': 3.0, 'rougeLsum': 18.0},
          'confidence': {'top1_median': 0.4, 'share_top1_at_least_0.9': 0.1, 'entropy_mean_nats': 2.5}}


def _run_dir(tmp_path, name='run'):
  run = tmp_path / name
  run.mkdir()
  log = [{'kind': 'train', 'step': 10, 'loss': 3.0},
         {'kind': 'eval', 'step': 300, 'eval_loss': 3.5, 'specdec_ende_local/bleu': 12.0,
          'specdec_summarize_local/rouge1': 21.0},
         {'kind': 'eval', 'step': 600, 'eval_loss': 3.4, 'specdec_ende_local/bleu': 13.5,
          'specdec_summarize_local/rouge1': 21.5}]
  (run / 'train_log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in log))
  (run / 'runs.jsonl').write_text(json.dumps({'command': 'python -m specdec.train', 'from_step': 0, 'to_step': 600,
                                              'minutes': 30.0}) + '\n')
  return run


def test_arguments_are_checked(tmp_path):
  target = tmp_path / 'target'
  target.mkdir()
  args, targets = compare_targets.parse_args(['--targets', f'a={target}', '--out', str(tmp_path / 'o')])
  assert targets == {'a': str(target)} and args.validation_examples is None
  for bad in (['--targets', 'nameless'], ['--targets', f'a={target}', f'a={target}'],
              ['--targets', f'a={tmp_path / "missing"}'], ['--targets', f'a={target}', '--card', 'b'],
              ['--targets', f'a={target}', '--log', str(tmp_path)], ['--targets', f'a={target}', '--test_examples', '0'],
              ['--targets', f'a={target}', '--paired_baseline', 'b']):
    with pytest.raises(SystemExit):
      compare_targets.parse_args(bad + ['--out', str(tmp_path / 'o')])


def test_learning_curve_reads_the_evaluations_at_the_runs_rate(tmp_path):
  curve = compare_targets.learning_curve([str(_run_dir(tmp_path))])
  assert curve['minutes_per_step'] == pytest.approx(30.0 / 600)
  assert [(p['step'], p['minutes'], p['bleu'], p['rouge1']) for p in curve['points']] == [
      (300, pytest.approx(15.0), 12.0, 21.0), (600, pytest.approx(30.0), 13.5, 21.5)]
  start = _result('models/a', 3.1, 11.2)
  text = compare_targets.curve_markdown(curve, start, 'header')
  assert '| 0 | 0 | - | 11.2 (whole split) | - |' in text and '| 600 | 30.0 | 3.4000 | 13.5 | 21.5 |' in text
  compare_targets.plots.plot_learning_curve(str(tmp_path / 'curve.png'), curve, start)
  assert (tmp_path / 'curve.png').stat().st_size > 0


def test_tables_and_card_hold_each_targets_figures(tmp_path):
  target = tmp_path / 'v3'
  target.mkdir()
  (target / 'config.json').write_text(json.dumps({
      'config': {'emb_dim': 384, 'dropout_rate': 0.1}, 'storage_dtype': 'bfloat16',
      'train': {'step': 600, 'minutes': 30.0, 'init_from_dir': 'models/cpu_v2/target', 'corpus_dir': 'data/c',
                'mixture_or_task_name': 'specdec_local_mix',
                'runs': [{'command': 'python -m specdec.train', 'from_step': 0, 'to_step': 600, 'minutes': 30.0}]}}))
  results = {'v2': _result('models/cpu_v2/target', 3.11, 11.2), 'v3': _result(str(target), 2.95, 13.9)}
  args, _ = compare_targets.parse_args(['--targets', f'v3={target}', '--out', str(tmp_path / 'o')])
  table = compare_targets.compare_markdown(results, args, 'header')
  assert '| v2 (`models/cpu_v2/target`) | 3.110 | 3.610 | **11.2** | 10.2 | 20.0 / 3.0 / 18.0 | 0.40 | 0.10 | 2.50 |' \
      in table
  card = compare_targets.model_card('v3', results, 'header')
  assert 'initialised from `models/cpu_v2/target`, dropout 0.1' in card
  assert '| v3 | 2.950 | 3.450 | 13.9 | 12.9 | 20.0 | 0.40 |' in card and 'steps 0→600, 30.0 min' in card


def test_a_continued_runs_curve_counts_on_from_the_first(tmp_path):
  curve = compare_targets.learning_curve([str(_run_dir(tmp_path, 'first')), str(_run_dir(tmp_path, 'second'))])
  assert [(p['step'], p['minutes']) for p in curve['points']] == [
      (300, pytest.approx(15.0)), (600, pytest.approx(30.0)), (900, pytest.approx(45.0)), (1200, pytest.approx(60.0))]
  assert [(r['from_step'], r['to_step']) for r in curve['runs']] == [(0, 600), (600, 1200)]
  assert curve['minutes_per_step'] == pytest.approx(60.0 / 1200)


def test_the_card_lists_every_run_behind_a_continued_target(tmp_path):
  target = tmp_path / 'v3'
  target.mkdir()
  first = {'step': 600, 'init_from_dir': 'models/cpu_v2/target',
           'runs': [{'command': 'first', 'from_step': 0, 'to_step': 600, 'minutes': 30.0}]}
  (target / 'config.json').write_text(json.dumps({
      'config': {'dropout_rate': 0.1}, 'storage_dtype': 'bfloat16',
      'train': {'step': 400, 'init_from_dir': str(target), 'init_train': first, 'corpus_dir': 'data/c',
                'runs': [{'command': 'second', 'from_step': 0, 'to_step': 400, 'minutes': 20.0}]}}))
  card = compare_targets.model_card('v3', {'v3': _result(str(target), 2.9, 14.0)}, 'header')
  assert '1000 steps, 50.0 minutes' in card and 'in 2 run(s), initialised from `models/cpu_v2/target`' in card
  assert '`first`: steps 0→600, 30.0 min, from `models/cpu_v2/target`' in card
  assert f'`second`: steps 600→1000, 20.0 min, from `{target}`' in card


def test_each_target_is_paired_against_the_baseline_on_the_same_references():
  refs = ['Das ist ein Haus.', 'Ich bin hier.', 'Der Hund bellt laut.', 'Es regnet heute.'] * 10
  worse = ['Das ist ein Haus.', 'Ich bin da.', 'Der Hund bellt.', 'Es regnet.'] * 10
  results = {'real': _result('runs/real', 3.0, 0.0), 'self': _result('runs/self', 3.1, 0.0)}
  decodes = {'real': {'predictions': worse, 'targets': refs}, 'self': {'predictions': refs, 'targets': refs}}
  compare_targets.add_paired(results, decodes, 'real')
  assert results['real']['ende_validation_paired'] is None
  paired = results['self']['ende_validation_paired']
  assert paired['against'] == 'real' and paired['candidate'] == pytest.approx(100.0) and paired['delta'] > 0
  lines = compare_targets.paired_markdown(results)
  assert "against real's" in lines[1] and lines[-1].startswith(f"| self | 100.00 | {paired['delta']:+.2f} | [")
  with pytest.raises(ValueError, match='different references'):
    compare_targets.add_paired(results, dict(decodes, self={'predictions': refs, 'targets': worse}), 'real')
