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
  (run / 'runs.jsonl').write_text(json.dumps({'command': 'python -m specdec.training.train', 'from_step': 0, 'to_step': 600,
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
                'runs': [{'command': 'python -m specdec.training.train', 'from_step': 0, 'to_step': 600, 'minutes': 30.0}]}}))
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


def _v3_dir(tmp_path):
  target = tmp_path / 'v3'
  target.mkdir()
  (target / 'config.json').write_text(json.dumps({
      'config': {'dropout_rate': 0.1},
      'train': {'step': 400, 'init_from_dir': str(target), 'corpus_dir': 'data/c',
                'init_train': {'step': 600, 'init_from_dir': 'models/cpu_v2/target',
                               'runs': [{'command': 'first', 'from_step': 0, 'to_step': 600, 'minutes': 30.0}]},
                'runs': [{'command': 'second', 'from_step': 0, 'to_step': 400, 'minutes': 20.0}]}}))
  return target


def test_a_targets_steps_and_minutes_come_from_its_record_or_are_unknown(tmp_path):
  known = compare_targets.training_record(str(_v3_dir(tmp_path)))
  assert (known['steps'], known['minutes'], len(known['runs'])) == (1000, pytest.approx(50.0), 2)
  assert known['unknown_because'] is None and known['source'].endswith('config.json')
  # A gin file's caps are what a run was allowed, not what it ran: they do not stand in for a lost record.
  gone = compare_targets.training_record(str(tmp_path / 'not_kept'), 'train/cpu_target_v3_self_real.gin')
  assert gone['steps'] is None and gone['minutes'] is None and gone['runs'] is None
  assert 'not here (the export was not kept)' in gone['unknown_because']
  assert gone['gin'] == {'file': 'train/cpu_target_v3_self_real.gin', 'num_steps': 800, 'max_minutes': 70,
                         'init_from_dir': 'models/cpu_v3/target'}
  table = '\n'.join(compare_targets.training_markdown({'a': dict(_result('x', 3.0, 14.0), training=gone)}))
  assert '| a | unknown | unknown | unknown | `models/cpu_v3/target` | 800 steps / 70 min' in table
  assert '- a: unknown because' in table


def _earlier(tmp_path, v3):
  """An earlier run's compare.{md,json} of v3 (here) and two targets whose directories are gone."""
  earlier = tmp_path / 'earlier'
  earlier.mkdir()
  command = (f'python scripts/compare_targets.py --targets v3={v3} real=runs/gone_real self=runs/gone_self '
             '--paired_baseline real --test_examples 32 --out results/x')
  results = {'v3': _result(str(v3), 3.0, 14.9), 'real': _result('runs/gone_real', 3.2, 14.5),
             'self': _result('runs/gone_self', 3.0, 14.4)}
  for name, test in (('v3', 12.3), ('real', 13.4), ('self', 11.9)):
    results[name]['ende_test']['bleu'] = test
  results['real']['summarize_validation_loss']['loss'] = 5.14
  results['self']['summarize_validation_loss']['loss'] = 4.63
  results['v3']['summarize_validation_loss']['loss'] = 4.69
  results['real']['ende_validation_paired'] = None
  for name in ('v3', 'self'):
    results[name]['ende_validation_paired'] = {'against': 'real', 'baseline': 14.5, 'candidate': 14.0,
                                               'delta': 0.1, 'delta_ci95': [-0.2, 0.4], 'n_samples': 1000,
                                               'share_candidate_not_worse': 0.7}
  (earlier / 'compare.json').write_text(json.dumps({'command': command, 'machine': {'processor': 'x86_64'},
                                                    'targets': results}, sort_keys=True))
  header = f'`{command}` · 2026-01-01T00:00:00 · x86_64, 2 CPUs, jax 0'
  (earlier / 'compare.md').write_text(f'# Targets\n\n{header}\n\nrest\n')
  return earlier, header, results


def test_figures_from_an_earlier_run_keep_its_figures_and_provenance_and_add_training_and_notes(tmp_path):
  v3 = _v3_dir(tmp_path)
  earlier, header, figures = _earlier(tmp_path, v3)
  out = tmp_path / 'out'
  results = compare_targets.main(['--figures_from', str(earlier), '--train_gin', 'real=train/cpu_target_v3_self_real.gin',
                                  '--same_data', 'summarize=real,self', '--out', str(out)])
  assert list(results) == ['v3', 'real', 'self']  # the earlier command's order, not the json's sorted keys
  for name, r in results.items():
    assert {k: v for k, v in r.items() if k != 'training'} == figures[name]
  assert results['v3']['training']['steps'] == 1000 and results['real']['training']['steps'] is None
  written = json.loads((out / 'compare.json').read_text())
  assert written['command'] == json.loads((earlier / 'compare.json').read_text())['command']
  assert written['header'] == header and '--figures_from' in written['rewritten_by']
  text = (out / 'compare.md').read_text()
  assert text.split('\n')[2] == header and 'Rewritten by `python scripts/compare_targets.py --figures_from' in text
  assert 'the first 32 test examples' in text  # the earlier command's settings describe its figures
  assert 'none was trained twice' in text and 'not the variance between training runs' in text
  assert ('whole validation split (what a decision reads): v3 14.9 > real 14.5 > self 14.4; first 32 test examples: '
          'real 13.4 > v3 12.3 > self 11.9 (a different order).') in text
  assert ('real and self were trained on identical summarization data, yet their summarization loss differs by '
          '0.51 nats') in text
  assert 'The other pairs differ by 0.45 (v3–real), 0.06 (v3–self): none by more' in text
  assert ('real (`runs/gone_real`), self (`runs/gone_self`): not here when this file was written, so their figures '
          "(validation and test alike) are those of the one run of the command that made them, and cannot be "
          "recomputed; v3's can.") in text
  # A second rewrite reads the provenance line from the json the first wrote.
  again = tmp_path / 'again'
  compare_targets.main(['--figures_from', str(out), '--out', str(again)])
  assert (again / 'compare.md').read_text().split('\n')[2] == header


def test_figures_from_and_same_data_are_checked(tmp_path):
  earlier, _, _ = _earlier(tmp_path, _v3_dir(tmp_path))
  for bad in (['--figures_from', str(earlier), '--targets', 'a=b'], [],
              ['--figures_from', str(tmp_path / 'missing')],
              ['--figures_from', str(earlier), '--card', 'v3'],
              ['--figures_from', str(earlier), '--same_data', 'summarize=real'],
              ['--figures_from', str(earlier), '--same_data', 'summarize=real,real'],
              ['--figures_from', str(earlier), '--same_data', 'summary=real,self'],
              ['--figures_from', str(earlier), '--same_data', 'summarize=real,other'],
              ['--figures_from', str(earlier), '--train_gin', 'other=train/cpu_target.gin']):
    with pytest.raises(SystemExit):
      compare_targets.parse_args(bad + ['--out', str(tmp_path / 'o')])
