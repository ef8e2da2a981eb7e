"""Tests of the pure helpers in scripts/ (the ablation summaries) and of the XXL plans' command lines."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts'))
import ablate  # pylint: disable=g-import-not-at-top,wrong-import-position


def _run(gamma, t_iter, calls=10, t_tok=0.002, tokens=30, accepted=5, judged=10):
  return {'setting': {'gamma': gamma}, 'speculative_seconds': t_iter * calls, 'target_calls': calls,
          'baseline_seconds': t_tok * tokens, 'baseline_tokens': tokens, 'accepted': accepted, 'judged': judged}


def test_in_loop_costs_recovers_a_line():
  runs = [_run(g, 0.003 + 0.0004 * g) for g in (1, 3, 6, 10)]
  fit = ablate.in_loop_costs(runs)
  assert fit['a'] == pytest.approx(0.003) and fit['b'] == pytest.approx(0.0004)
  assert fit['c_in_situ'] == pytest.approx(0.2) and fit['a_over_t_tok'] == pytest.approx(1.5)


def test_in_loop_costs_single_gamma_has_no_slope():
  fit = ablate.in_loop_costs([_run(4, 0.005)])
  assert np.isnan(fit['b']) and fit['a'] == pytest.approx(0.005)


def test_pooled_alpha_weights_by_judged_drafts():
  runs = [_run(1, 0.004, accepted=1, judged=10), _run(2, 0.004, accepted=30, judged=40)]
  assert ablate._pooled_alpha(runs) == pytest.approx(31 / 50)  # not the mean of 0.1 and 0.75
  assert ablate._pooled_alpha([]) == 0.0


def test_verify_curve_is_read_from_the_runs_costs():
  runs = [dict(_run(g, 0.004), costs={'verify_cost_ratio': r}) for g, r in ((1, 1.1), (2, 1.4), (4, 1.6))]
  assert ablate.verify_curve(runs) == {2: 1.1, 3: 1.4, 5: 1.6}


def test_needed_alpha_takes_the_best_gamma_and_says_unreachable():
  fit = {'c_in_situ': 0.1, 'a_over_t_tok': 1.2}
  alpha, gamma = ablate.needed_alpha(fit, 2.0, 10)
  from specdec import theory
  reachable = [a for a in (theory.required_alpha(2.0, g, 0.1, 1.2) for g in range(1, 11)) if np.isfinite(a)]
  assert alpha == pytest.approx(min(reachable))
  assert 1 <= gamma <= 10
  assert ablate.needed_alpha({'c_in_situ': 0.9, 'a_over_t_tok': 5.0}, 2.0, 3) == (None, None)


def test_ablate_imports_tensorflow_quietly():
  import subprocess  # pylint: disable=g-import-not-at-top
  script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts', 'ablate.py')
  env = {k: v for k, v in os.environ.items() if k not in ('TF_CPP_MIN_LOG_LEVEL', 'SPECDEC_TF_LOGS')}
  done = subprocess.run([sys.executable, script, '--help'], capture_output=True, text=True, env=env, check=True,
                        timeout=300)
  assert 'usage:' in done.stdout
  for noise in ('oneDNN', 'cuInit', 'cudart', 'absl::InitializeLog'):
    assert noise not in done.stderr


# -----------------------------------------------------------------------------
# ablate: runs are kept or resumed only for the same configuration
# -----------------------------------------------------------------------------


def _ablate_args(tmp_path, **overrides):
  import argparse  # pylint: disable=g-import-not-at-top
  models = tmp_path / 'models'
  for name in ('target', 'd1'):
    (models / name).mkdir(parents=True, exist_ok=True)
    (models / name / 'config.json').write_text('{"name": "%s"}' % name)
    (models / name / 'params.msgpack').write_bytes(name.encode())
  fields = dict(models=str(models), out=str(tmp_path / 'out'), max_examples=4, repeats=1, seed=0,
                overwrite=False, corpus_dir=None, draft_confidence=0.0)
  fields.update(overrides)
  return argparse.Namespace(**fields)


GRID = [('d1', 'ende', 0.0, 2)]


def _finish(plan):
  from specdec import fingerprint  # pylint: disable=g-import-not-at-top
  from specdec.bench import benchmark  # pylint: disable=g-import-not-at-top
  fingerprint.prepare(plan['dir'], plan['fingerprint'], benchmark.OUTPUT_FILES)
  with open(os.path.join(plan['dir'], 'benchmark.json'), 'w') as f:
    f.write('{}')


def test_ablate_adaptive_runs_and_drafters_given_as_paths(tmp_path):
  args = _ablate_args(tmp_path, draft_confidence=0.5)
  elsewhere = tmp_path / 'other_family' / 'bigram'
  elsewhere.mkdir(parents=True)
  (elsewhere / 'config.json').write_text('{"name": "bigram"}')
  [plain, path] = ablate.plan_runs(args, GRID + [(str(elsewhere), 'ende', 0.0, 2)])
  assert plain['name'] == 'ende_d1_t0_g2_c0.5' and plain['setting'].draft_confidence == 0.5
  assert path['name'] == 'ende_' + os.path.normpath(str(elsewhere)).replace(os.sep, '_') + '_t0_g2_c0.5'
  assert ablate._drafter_dir(args, str(elsewhere)) == str(elsewhere)
  assert ablate._drafter_dir(args, 'd1') == os.path.join(args.models, 'd1')
  # An adaptive run is a different configuration from the fixed-γ one.
  [fixed] = ablate.plan_runs(_ablate_args(tmp_path), GRID)
  assert fixed['fingerprint'] != plain['fingerprint']


def test_ablate_keeps_a_finished_run_of_the_same_configuration(tmp_path):
  [plan] = ablate.plan_runs(_ablate_args(tmp_path), GRID)
  assert plan['name'] == 'ende_d1_t0_g2' and plan['fingerprint']['gamma'] == 2
  assert plan['fingerprint']['drafter_checkpoint'].endswith('models/d1')
  assert ablate.refusals([plan]) == [] and not ablate.is_finished(plan)
  _finish(plan)
  assert ablate.refusals([plan]) == [] and ablate.is_finished(plan)
  # More examples: not finished, resumed (extended).
  [more] = ablate.plan_runs(_ablate_args(tmp_path, max_examples=8), GRID)
  assert ablate.refusals([more]) == [] and not ablate.is_finished(more)


@pytest.mark.parametrize('overrides, change, expected', [
    ({'repeats': 3}, None, 'repeats 1 -> 3'),
    ({'seed': 7}, None, 'seed 0 -> 7'),
    ({'max_examples': 2}, None, 'max_examples 4 -> 2'),
    ({}, 'd1', 'drafter_content'),
])
def test_ablate_refuses_a_run_of_another_configuration_before_measuring(tmp_path, overrides, change, expected):
  [plan] = ablate.plan_runs(_ablate_args(tmp_path), GRID)
  _finish(plan)
  args = _ablate_args(tmp_path, **overrides)
  if change:  # the drafter retrained in place
    with open(os.path.join(args.models, change, 'params.msgpack'), 'wb') as f:
      f.write(b'retrained, longer')
  [reason] = ablate.refusals(ablate.plan_runs(args, GRID))
  assert expected in reason and reason.endswith(f'; {ablate.REMEDY}.')
  with pytest.raises(SystemExit, match='^ablate: .*' + expected.replace('(', r'\(')):
    ablate._run_all(args, GRID)  # pylint: disable=protected-access  (refused before any model loads)


def test_ablate_refuses_runs_from_before_fingerprints(tmp_path):
  [plan] = ablate.plan_runs(_ablate_args(tmp_path), GRID)
  os.makedirs(plan['dir'])
  with open(os.path.join(plan['dir'], 'benchmark.json'), 'w') as f:
    f.write('{}')
  [reason] = ablate.refusals([plan])
  assert 'holds benchmark.json written without a fingerprint.json' in reason and '--overwrite' in reason


def test_compare_drafters_parses_runs_and_refuses_bad_ones():
  import argparse
  import compare_drafters  # pylint: disable=g-import-not-at-top
  assert compare_drafters.parse_run('trigram:2') == ('trigram', 2, 0.0)
  assert compare_drafters.parse_run('models/cpu/d1:3') == ('models/cpu/d1', 3, 0.0)
  assert compare_drafters.parse_run('d1kd@vocab/top2048.json:2') == ('d1kd@vocab/top2048.json', 2, 0.0)
  assert compare_drafters.parse_run('f128@v/top1024.json:3/0.5') == ('f128@v/top1024.json', 3, 0.5)
  assert compare_drafters.run_name('f128', 3, 0.5) == 'f128:3/0.5'
  assert compare_drafters.run_name('f128', 1, 0.0) == 'f128:1'
  assert compare_drafters.parse_run('f128:auto') == ('f128', 'auto', 0.0)
  assert compare_drafters.parse_run('f128:auto/0.5') == ('f128', 'auto', 0.5)
  assert compare_drafters.run_name('f128', 'auto', 0.0) == 'f128:auto'
  for bad in ('trigram', 'trigram:0', ':2', 'trigram:x', 'trigram:Auto', 'trigram:auto/', 'trigram:2/', 'trigram:2/1', 'trigram:2/0', 'trigram:2/x',
              'trigram:2/-0.5'):
    with pytest.raises(argparse.ArgumentTypeError, match=r'DRAFTER\[@VOCAB_FILE\]:GAMMA\[/CONFIDENCE\]'):
      compare_drafters.parse_run(bad)


def test_compare_drafters_vocab_file_replaces_a_heads_own_or_trims_a_t5_drafters(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  import compare_drafters  # pylint: disable=g-import-not-at-top
  from specdec import checkpoints, feature_drafter, feature_head_checkpoint  # pylint: disable=g-import-not-at-top
  from specdec import network  # pylint: disable=g-import-not-at-top
  cfg = network.t5_1_1_config('tiny', vocab_size=32)
  target_params = network.init_params(cfg, jax.random.PRNGKey(0))
  head_config = feature_drafter.FeatureHeadConfig(feature_dim=cfg.emb_dim, vocab_size=32, width=8, num_heads=2,
                                                  head_dim=4, mlp_dim=16)
  feature_head_checkpoint.save(str(tmp_path / 'head'), head_config,
                               feature_drafter.init_params(head_config, jax.random.PRNGKey(1)),
                               target_sha256=feature_head_checkpoint.params_sha256(target_params),
                               draft_vocab_ids=[1, 5, 9, 20])
  checkpoints.save_compact(str(tmp_path / 't5'), cfg, target_params)
  with open(tmp_path / 'top2.json', 'w') as f:
    f.write('[5, 20]')
  _, _, own = compare_drafters.load_run_drafter('head', str(tmp_path), target_params)
  np.testing.assert_array_equal(own, [1, 5, 9, 20])
  _, _, replaced = compare_drafters.load_run_drafter(f'head@{tmp_path / "top2.json"}', str(tmp_path), target_params)
  np.testing.assert_array_equal(replaced, [5, 20])
  _, _, untrimmed = compare_drafters.load_run_drafter('t5', str(tmp_path), target_params)
  assert untrimmed is None
  _, _, trimmed = compare_drafters.load_run_drafter(f't5@{tmp_path / "top2.json"}', str(tmp_path), target_params)
  np.testing.assert_array_equal(trimmed, [5, 20])


def test_compare_drafters_table():
  import compare_drafters  # pylint: disable=g-import-not-at-top
  report = {'task': 'specdec_ende_local', 'temperature': 0.0, 'command': 'python scripts/compare_drafters.py',
            'date': '2026-12-02', 'machine': {'processor': 'x86_64', 'cpu_count': 2, 'jax': '0.10.2'},
            'examples': 4, 'repeats': 3, 'baseline_seconds': 0.1, 'baseline_token_s': 0.002,
            'rows': [{'run': 'trigram:1', 'alpha': 0.4, 'tokens_per_call': 1.4, 'round_in_baseline_tokens': 1.2,
                      'speedup': 1.1, 'identical': True},
                     {'run': 'bigram:1', 'alpha': 0.3, 'tokens_per_call': 1.3, 'round_in_baseline_tokens': 1.1,
                      'speedup': 1.05, 'identical': False}]}
  text = compare_drafters.markdown(report)
  assert '| trigram:1 | 0.400 | 1.40 | 1.20 | **1.100×** | 100% |' in text
  assert '| bigram:1 | 0.300 | 1.30 | 1.10 | **1.050×** | NO |' in text
  assert 'Other processes' not in text  # a report without the measurement, or a quiet one, warns of nothing
  report['others_cpu_share'] = 0.05
  assert 'Other processes' not in compare_drafters.markdown(report)
  report['others_cpu_share'] = 0.5
  assert compare_drafters.markdown(report).splitlines()[-1].startswith(
      '**Other processes used 50% of the machine while this comparison was timed')


def test_compare_drafters_auto_line_measures_the_choice_against_the_best_fixed_gamma():
  import compare_drafters  # pylint: disable=g-import-not-at-top
  row = lambda run, gamma, speedup: {'run': run, 'gamma': gamma, 'alpha': 0.6, 'tokens_per_call': 2.0,
                                     'round_in_baseline_tokens': 1.5, 'speedup': speedup, 'identical': True}
  report = {'task': 'specdec_ende_local', 'temperature': 0.0, 'command': 'python scripts/compare_drafters.py',
            'date': '2026-12-05', 'machine': {'processor': 'x86_64', 'cpu_count': 2, 'jax': '0.10.2'},
            'examples': 4, 'repeats': 3, 'baseline_seconds': 0.1, 'baseline_token_s': 0.002,
            'rows': [row('f128:1', 1, 1.2), row('f128:3', 3, 1.3), row('bigram:3', 3, 1.5), row('f128:auto', 2, 1.25)],
            'gamma_auto': [{'drafter': 'f128', 'draft_confidence': 0.0, 'gamma': 2, 'alpha': 0.61, 'probe_gamma': 2,
                            'c_in_loop': 0.08, 'verify_curve': {'tokens': [1, 2, 3], 'ratio': [1.0, 1.1, 1.3]},
                            'predicted_speedup': 1.4, 'thm38_gamma': 4, 'seconds': 12.0}]}
  text = compare_drafters.markdown(report)
  assert '| f128:auto (γ = 2) | 0.600 |' in text and '| f128:3 | 0.600 |' in text
  # The bigram's faster row is another drafter's: auto is held against f128's own best fixed γ (3).
  assert ('- **f128:auto** chose γ = 2 (α 0.610 at γ = 2, c 0.080, a 3-token verify = 1.30 one-token calls; '
          'predicted 1.40×; Thm 3.8 alone: γ = 4; chosen in 12 s, not timed): measured **1.250×**, the best fixed '
          'γ here f128:3 1.300×, auto / best = **0.962**.') in text
  # A choice made from acceptance by depth says so, and what one α at every depth would have picked.
  report['gamma_auto'][0].update(acceptance_by_depth=[0.65, 0.55], gamma_one_alpha=3)
  assert ('chose γ = 2 (α 0.610 at γ = 2; acceptance by depth 0.65, 0.55, one α at every depth: γ = 3, c 0.080'
          in compare_drafters.markdown(report))
  report['rows'] = report['rows'][-1:]
  assert 'not timed).' in compare_drafters.markdown(report)


def test_compare_drafters_families_are_named_and_labelled():
  import argparse
  import compare_drafters  # pylint: disable=g-import-not-at-top
  assert compare_drafters.parse_family('models/cpu_v3') == ('cpu_v3', 'models/cpu_v3')
  assert compare_drafters.parse_family('models/cpu_v3/') == ('cpu_v3', 'models/cpu_v3/')
  assert compare_drafters.parse_family('v3=models/cpu_v3') == ('v3', 'models/cpu_v3')
  for bad in ('=models/cpu_v3', 'v3='):
    with pytest.raises(argparse.ArgumentTypeError, match='a model family is DIR or NAME=DIR'):
      compare_drafters.parse_family(bad)
  assert compare_drafters.row_label(None, 'f128:3') == 'f128:3'
  assert compare_drafters.row_label('v3', 'f128:3') == 'v3 f128:3'
  assert compare_drafters.row_label('v3', 'baseline', True, True) == 'v3 baseline (shrinking batch)'
  with pytest.raises(SystemExit):  # two families of one name
    compare_drafters.main(['--models', 'models/a', 'b/a', '--runs', 'bigram:1', '--run', 'x'])


def test_compare_drafters_table_of_two_families_holds_each_auto_choice_against_its_own_family():
  import compare_drafters  # pylint: disable=g-import-not-at-top
  row = lambda run, family, gamma, speedup: {'run': f'{family} {run}', 'family': family, 'gamma': gamma,
                                             'alpha': 0.6, 'tokens_per_call': 2.0, 'round_in_baseline_tokens': 1.5,
                                             'speedup': speedup, 'identical': True}
  choice = lambda family, gamma: {'family': family, 'drafter': 'f128', 'draft_confidence': 0.0, 'gamma': gamma,
                                  'alpha': 0.6, 'probe_gamma': 2, 'c_in_loop': 0.08,
                                  'verify_curve': {'tokens': [1, 2, 3, 4], 'ratio': [1.0, 1.1, 1.3, 1.4]},
                                  'predicted_speedup': 1.4, 'thm38_gamma': 4, 'seconds': 12.0}
  report = {'task': 'specdec_ende_local', 'temperature': 0.0, 'command': 'python scripts/compare_drafters.py',
            'date': '2026-12-05', 'machine': {'processor': 'x86_64', 'cpu_count': 2, 'jax': '0.10.2'},
            'examples': 4, 'repeats': 3, 'baseline_seconds': 0.1, 'baseline_token_s': 0.002,
            'families': {'v2': {'models': 'models/cpu_v2', 'seconds': 0.1, 'token_s': 0.002},
                         'v3': {'models': 'models/cpu_v3', 'seconds': 0.12, 'token_s': 0.0021}},
            'rows': [row('f128:3', 'v2', 3, 1.3), row('f128:auto', 'v2', 3, 1.28),
                     row('f128:3', 'v3', 3, 1.6), row('f128:auto', 'v3', 2, 1.5)],
            'gamma_auto': [choice('v2', 3), choice('v3', 2)]}
  text = compare_drafters.markdown(report)
  assert ('**v2** (`models/cpu_v2`): baseline 100.0 ms in all, 2.000 ms a token (fitted); **v3** (`models/cpu_v3`): '
          'baseline 120.0 ms in all, 2.100 ms a token (fitted).') in text
  assert '| v3 f128:auto (γ = 2) | 0.600 | 2.00 | 1.50 | **1.500×** | 100% |' in text
  # Each family's choice against its own fixed γ: v3's faster f128:3 is not v2's best.
  assert 'the best fixed γ here v2 f128:3 1.300×, auto / best = **0.985**' in text
  assert 'the best fixed γ here v3 f128:3 1.600×, auto / best = **0.938**' in text


def test_compare_drafters_table_with_and_without_shrinking():
  import compare_drafters  # pylint: disable=g-import-not-at-top
  report = {'task': 'specdec_ende_local', 'temperature': 0.0, 'command': 'python scripts/compare_drafters.py',
            'date': '2026-12-02', 'machine': {'processor': 'x86_64', 'cpu_count': 2, 'jax': '0.10.2'},
            'examples': 16, 'repeats': 3, 'baseline_seconds': 0.5, 'baseline_token_s': None, 'batch_size': 8,
            'shrink': 'both',
            'rows': [{'run': 'bigram:1 (full batch)', 'alpha': 0.3, 'tokens_per_call': 1.3,
                      'round_in_baseline_tokens': None, 'speedup': 0.9, 'speedup_vs_full_batch_baseline': 0.9,
                      'identical': True},
                     {'run': 'baseline (shrinking batch)', 'alpha': None, 'tokens_per_call': None,
                      'round_in_baseline_tokens': None, 'speedup': 1.2, 'speedup_vs_full_batch_baseline': 1.2,
                      'identical': True},
                     {'run': 'bigram:1 (shrinking batch)', 'alpha': 0.3, 'tokens_per_call': 1.3,
                      'round_in_baseline_tokens': None, 'speedup': 1.0, 'speedup_vs_full_batch_baseline': 1.2,
                      'identical': False}]}
  text = compare_drafters.markdown(report)
  assert 'batch 8' in text and 'a token (fitted)' not in text
  assert '| baseline (shrinking batch) | - | - | **1.200×** | 1.200× | 100% |' in text
  assert '| bigram:1 (shrinking batch) | 0.300 | 1.30 | **1.000×** | 1.200× | NO |' in text


# -----------------------------------------------------------------------------
# xxl_memory_plan and xxl_training_plan: the command lines over specdec's plans
# -----------------------------------------------------------------------------


def test_xxl_memory_plan_writes_reports(tmp_path, monkeypatch):
  import json  # pylint: disable=g-import-not-at-top
  import xxl_memory_plan  # pylint: disable=g-import-not-at-top
  from specdec import network  # pylint: disable=g-import-not-at-top
  from specdec.bench import xxl_memory_plan as plan  # pylint: disable=g-import-not-at-top
  small = dict(num_encoder_layers=1, num_decoder_layers=1, head_dim=4, relative_attention_num_buckets=8,
               relative_attention_max_distance=16, dropout_rate=0.0)
  target = network.T5Config(vocab_size=64, emb_dim=16, num_heads=4, mlp_dim=32, **small)
  drafter = network.T5Config(vocab_size=64, emb_dim=8, num_heads=2, mlp_dim=16, **small)
  monkeypatch.setattr(plan, 'SLICES', {'v4-8': 4})
  monkeypatch.setattr(plan, 'TASKS', {'ende': (16, 8)})
  monkeypatch.setattr(plan, 'BATCHES', (1,))
  monkeypatch.setattr(network, 't5_1_1_config', lambda name, **kw: target if name == 'xxl' else drafter)
  report = xxl_memory_plan.main(['--out_dir', str(tmp_path)])
  text = (tmp_path / 'xxl_memory_plan.md').read_text()
  assert 'python scripts/xxl_memory_plan.py --out_dir' in text
  assert report['date'] in text and 'jax ' in text
  assert '| v4-8 | 1 x 4 |' in text
  saved = (tmp_path / 'xxl_memory_plan.json').read_text()
  assert '"rows"' in saved and len(report['rows']) == 3
  assert json.loads(saved) == json.loads(json.dumps(report))


def test_xxl_training_plan_writes_the_report(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import xxl_training_plan  # pylint: disable=g-import-not-at-top
  from specdec.bench import xxl_training_plan as plan  # pylint: disable=g-import-not-at-top
  report = xxl_training_plan.main(['--out_dir', str(tmp_path), '--microbatches', '2'])
  assert [r['name'] for r in report['runs']] == [r.name for r in plan.RUNS]
  assert all(r['configured']['fits'] for r in report['runs'])
  text = (tmp_path / 'xxl_training_plan.md').read_text()
  assert text.count('\n| xxl_') >= 2 and 'python scripts/xxl_training_plan.py --out_dir' in text
  saved = json.loads((tmp_path / 'xxl_training_plan.json').read_text())
  assert saved['runs'][0]['chip_hours'] == pytest.approx(report['runs'][0]['chip_hours'])


# -----------------------------------------------------------------------------
# build_distill_corpus: decoding in shards, resumable within a task
# -----------------------------------------------------------------------------


def _distill_rows(n, with_reference=lambda i: True):
  return [{'inputs': f'input {i}', 'targets': f'reference {i}' if with_reference(i) else '', 'kind': 'short'}
          for i in range(n)]


class _Killed(Exception):
  """The fake decoder's stand-in for a killed process: an exception no real Ctrl-C could be mistaken for."""


class _FakeDecoder:
  """decode_batch: the text names the row and the batch's first sorted position; can fail after some calls."""

  def __init__(self, fail_after=None):
    self.calls, self.fail_after = [], fail_after

  def __call__(self, first, idx):
    if self.fail_after is not None and len(self.calls) >= self.fail_after:
      raise _Killed('killed')
    self.calls.append((first, [int(i) for i in idx]))
    return [f'decode of {int(i)} in batch at {first}' for i in idx]


def _lengths(n):
  return [(7 * i) % 11 for i in range(n)]  # unsorted, with ties


def test_distill_shards_deal_every_sorted_batch_once():
  import build_distill_corpus as bdc  # pylint: disable=g-import-not-at-top
  batches = bdc.plan_batches(_lengths(50), 4)
  flat = [int(i) for b in batches for i in b]
  assert sorted(flat) == list(range(50)) and [len(b) for b in batches] == [4] * 12 + [2]
  assert [_lengths(50)[i] for i in flat] == sorted(_lengths(50))
  shards = bdc.plan_shards(len(batches), 4, 16)
  assert len(shards) == 4 and sorted(b for s in shards for b in s) == list(range(13))
  assert shards[0] == [0, 4, 8, 12] and shards[3] == [3, 7, 11]  # every shard spans all lengths
  assert bdc.plan_shards(3, 128, 4096) == [[0, 1, 2]] and bdc.plan_shards(0, 4, 16) == []
  assert bdc.plan_shards(5, 4, 1) == [[0], [1], [2], [3], [4]]


def test_distill_sharded_output_is_the_unsharded_one(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import build_distill_corpus as bdc  # pylint: disable=g-import-not-at-top
  rows = _distill_rows(50)
  outs = {}
  for shard_size in (4, 16, 10 ** 6):
    out = tmp_path / str(shard_size)
    bdc.decode_task('t', rows, _lengths(50), str(out), _FakeDecoder(), 4, shard_size, log=lambda _: None)
    outs[shard_size] = (out / 'train.jsonl').read_text()
    assert not (out / bdc.SHARDS_DIR).exists()
  assert outs[4] == outs[16] == outs[10 ** 6]
  # The format of the unsharded script: the row, `targets` replaced in place, the reference appended.
  first = json.loads(outs[4].split('\n')[0])
  assert list(first) == ['inputs', 'targets', 'kind', 'gold_targets']
  assert first['gold_targets'] == 'reference 0' and first['targets'].startswith('decode of 0 in batch at ')
  expected = '\n'.join(json.dumps(dict(r, gold_targets=r['targets'], targets=json.loads(line)['targets']),
                                  ensure_ascii=False)
                       for r, line in zip(rows, outs[4].splitlines())) + '\n'
  assert outs[4] == expected


def test_distill_keeps_gold_targets_only_where_a_reference_exists(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import build_distill_corpus as bdc  # pylint: disable=g-import-not-at-top
  rows = _distill_rows(9, with_reference=lambda i: i % 3 == 0)  # a pool: most rows without a reference
  bdc.decode_task('t', rows, _lengths(9), str(tmp_path), _FakeDecoder(), 2, 4, log=lambda _: None)
  got = [json.loads(line) for line in (tmp_path / 'train.jsonl').read_text().splitlines()]
  assert [r['inputs'] for r in got] == [r['inputs'] for r in rows]
  for i, r in enumerate(got):
    assert r['targets'].startswith(f'decode of {i} ')
    assert r.get('gold_targets') == (f'reference {i}' if i % 3 == 0 else None)


def test_distill_resumes_within_a_task_and_skips_finished_shards(tmp_path):
  import build_distill_corpus as bdc  # pylint: disable=g-import-not-at-top
  rows, lengths = _distill_rows(50), _lengths(50)
  killed = _FakeDecoder(fail_after=6)  # 4 shards of 3-4 batches: the first finishes, the second does not
  with pytest.raises(_Killed):
    bdc.decode_task('t', rows, lengths, str(tmp_path), killed, 4, 16, log=lambda _: None)
  shards = sorted(os.listdir(tmp_path / bdc.SHARDS_DIR))
  assert shards == ['00000.jsonl', bdc.LAYOUT_NAME] and not (tmp_path / 'train.jsonl').exists()
  logs = []
  resumed = _FakeDecoder()
  bdc.decode_task('t', rows, lengths, str(tmp_path), resumed, 4, 16, log=logs.append)
  assert sorted(first // 4 for first, _ in resumed.calls) == [b for b in range(13) if b % 4]  # shard 0 skipped
  assert '14/50 decoded in 1 finished shards (resumed)' in logs[0]
  assert any('50/50 decoded (shard 4/4)' in line and 'ex/s, ETA 0.0 min' in line for line in logs)
  fresh = tmp_path / 'fresh'
  bdc.decode_task('t', rows, lengths, str(fresh), _FakeDecoder(), 4, 16, log=lambda _: None)
  assert (tmp_path / 'train.jsonl').read_text() == (fresh / 'train.jsonl').read_text()


def test_distill_refuses_shards_of_another_layout(tmp_path):
  import build_distill_corpus as bdc  # pylint: disable=g-import-not-at-top
  rows, lengths = _distill_rows(50), _lengths(50)
  with pytest.raises(_Killed):
    bdc.decode_task('t', rows, lengths, str(tmp_path), _FakeDecoder(fail_after=5), 4, 16, log=lambda _: None)
  with pytest.raises(SystemExit, match='another layout .*shard_size: 16 -> 8'):
    bdc.decode_task('t', rows, lengths, str(tmp_path), _FakeDecoder(), 4, 8, log=lambda _: None)
  with pytest.raises(SystemExit, match='batch_size: 4 -> 2'):
    bdc.decode_task('t', rows, lengths, str(tmp_path), _FakeDecoder(), 2, 16, log=lambda _: None)


def test_distill_extend_decodes_only_the_new_rows(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import build_distill_corpus as bdc  # pylint: disable=g-import-not-at-top
  rows, lengths = _distill_rows(50), _lengths(50)
  small = tmp_path / 'small'
  bdc.decode_task('t', rows[:20], lengths[:20], str(small), _FakeDecoder(), 4, 16, log=lambda _: None)
  known = bdc.reused_decodes(str(tmp_path), 'small', rows)
  assert sorted(known) == list(range(20))
  grown, logs = _FakeDecoder(), []
  bdc.decode_task('t', rows, lengths, str(tmp_path / 'big'), grown, 4, 16, log=logs.append, known=known)
  decoded = sorted(i for _, idx in grown.calls for i in idx)
  assert decoded == list(range(20, 50))  # each new row once, no old one again
  assert min(first for first, _ in grown.calls) == 20  # PRNG positions past the reused corpus's
  assert '20/50 decodes reused' in logs[0]
  got = [json.loads(line) for line in (tmp_path / 'big' / 'train.jsonl').read_text().splitlines()]
  assert [r['inputs'] for r in got] == [r['inputs'] for r in rows]
  assert [r['targets'] for r in got[:20]] == [known[i] for i in range(20)]
  # Rows of another corpus, or more rows than the new one holds, are refused.
  with pytest.raises(SystemExit, match='row 3 has other inputs'):
    bdc.reused_decodes(str(tmp_path), 'small', rows[:3] + [dict(rows[3], inputs='other')] + rows[4:])
  with pytest.raises(SystemExit, match='raise --max_examples'):
    bdc.reused_decodes(str(tmp_path), 'small', rows[:10])


def test_distill_extend_needs_the_same_settings_and_fewer_examples(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import build_distill_corpus as bdc  # pylint: disable=g-import-not-at-top
  want = {'model_files': {'params.msgpack': 'a'}, 'corpus_manifest': 'b', 'lengths': {'inputs': 8},
          'temperature': 0.0, 'seed': 0, 'max_examples': 100}
  (tmp_path / 'manifest.json').write_text(json.dumps({'fingerprint': dict(want, max_examples=40)}))
  bdc.check_extendable(str(tmp_path), want)
  with pytest.raises(SystemExit, match='must be larger'):
    bdc.check_extendable(str(tmp_path), dict(want, max_examples=40))
  with pytest.raises(SystemExit, match='other settings \\(temperature\\)'):
    bdc.check_extendable(str(tmp_path), dict(want, temperature=1.0))
  with pytest.raises(SystemExit, match='no manifest.json'):
    bdc.check_extendable(str(tmp_path / 'none'), want)


def test_profile_kernel_origin_table():
  import profile_decode  # pylint: disable=g-import-not-at-top
  kernels = {'baseline': {'loop': {'MLP': 4, 'norms': 6}},
             'speculative': {'draft_phase': {'norms': 3, 'MLP': 1}, 'verify_phase': {'MLP': 4, 'norms': 6},
                             'loop': {'logits, sampling, other': 2}}}
  lines = profile_decode.kernel_origin_lines(kernels)
  assert '| part | baseline step | draft | verify | loop |' in lines
  assert '| norms | 6 | 3 | 6 | 0 |' in lines and '| MLP | 4 | 1 | 4 | 0 |' in lines
  assert '| **all** | 10 | 4 | 10 | 2 |' in lines
  assert profile_decode.kernel_origin_lines(None) == []


def test_profile_drafter_call_table():
  import profile_decode  # pylint: disable=g-import-not-at-top
  dk = {'busy_us': 400.0, 'wall_us': 420.0, 'dot_share': 0.75, 'calls': 32,
        'top': [{'kernel': 'dot.9', 'us': 100.0, 'shape': 'f32[1,2048]', 'largest_operand': 'f32[384,2048]'},
                {'kernel': 'ThunkExecutor::Execute', 'us': 30.0, 'shape': '', 'largest_operand': ''}]}
  lines = profile_decode.drafter_call_lines(dk, 0.002)
  assert '| `dot.9` | 100.0 | `f32[1,2048]` | `f32[384,2048]` | 3.15 |' in lines
  assert '| `ThunkExecutor::Execute` | 30.0 | | | |' in lines
  assert any(line.startswith('32 1-token drafter calls') and '**75% of it in matrix products**' in line
             and '2000 µs' in line for line in lines)
  assert profile_decode.drafter_call_lines(None, 0.002) == []


def test_round_cost_parses_runs_and_lays_out_real_beside_replayed():
  import argparse
  import round_cost  # pylint: disable=g-import-not-at-top
  assert round_cost.parse_run('f128:3') == ('f128', 3)
  for bad in ('f128', 'f128:0', ':3', 'f128:auto'):
    with pytest.raises(argparse.ArgumentTypeError, match='DRAFTER:GAMMA'):
      round_cost.parse_run(bad)
  with pytest.raises(SystemExit):
    round_cost.main(['--runs', 'f128:3', '--budgets', '40', '8', '--run', 'x'])
  replay = {'round_s': 0.004, 'baseline_round_s': 0.002, 'draft_s': 0.0005, 'verify_s': 0.003, 'accept_s': 0.0001,
            'commit_s': 0.0001}
  report = {'task': 'specdec_ende_local', 'temperature': 0.0, 'command': 'python scripts/round_cost.py',
            'date': '2026-12-05', 'machine': {'processor': 'x86_64', 'cpu_count': 2, 'jax': '0.10.2'},
            'models': 'models/cpu_v2', 'examples': 8, 'budgets': [8, 40], 'repeats': 5, 'others_cpu_share': 0.01,
            'baseline': {'real_token_s': 0.0019},
            'rows': [{'run': 'f128:3', 'real_round_s': 0.005, 'real_round_in_tokens': 0.005 / 0.0019,
                      'replay': replay, 'replay_round_in_rounds': 2.0}]}
  text = round_cost.markdown(report)
  assert 'Baseline token: real 1.900 ms; replayed baseline round 2.000 ms.' in text
  assert '| f128:3 | 5.000 | - | 4.000 | 1.25 | 2.63 | 2.00 | 0.500 / 3.000 / 0.100 / 0.100 |' in text
  assert 'Other processes' not in text


def test_evaluate_family_keeps_a_card_another_tool_wrote(tmp_path):
  import evaluate_family  # pylint: disable=g-import-not-at-top
  card = tmp_path / 'MODEL_CARD.md'
  assert evaluate_family.writes_card(str(card), 'target')  # none yet
  card.write_text('# Model card: target\n\n- Architecture: ...\n')
  assert evaluate_family.writes_card(str(card), 'target')  # its own: rewritten
  card.write_text('# Model card: v3 (`models/cpu_v3/target`)\n\n- Training: 3 runs ...\n')
  assert not evaluate_family.writes_card(str(card), 'target')  # compare_targets.py's: kept


def test_evaluate_family_counts_a_continued_models_steps_over_its_runs():
  import evaluate_family  # pylint: disable=g-import-not-at-top
  assert evaluate_family.train_steps({'step': 2650}) == '2650'
  run = lambda a, b: {'command': 'python -m specdec.training.train', 'from_step': a, 'to_step': b, 'minutes': 1.0}
  first = {'step': 1060, 'runs': [run(0, 1060)]}
  continued = {'step': 1890, 'runs': [run(0, 1890)], 'init_train': first, 'init_from_dir': 'models/cpu_v3/target'}
  first['init_from_dir'] = 'models/cpu_v2/target'
  assert evaluate_family.train_steps(continued) == '2950 (from `models/cpu_v2/target`)'


def test_gamma_auto_by_depth_repicks_a_stored_row_from_its_acceptance_by_depth():
  import gamma_auto_by_depth  # pylint: disable=g-import-not-at-top
  flat = {'tokens': list(range(1, 10)), 'ratio': [1.0] * 9}
  # 10 rounds at γ 3: draft 1 kept in 6, draft 2 in 3, draft 3 in none; judged 10 + 6 + 3 = 19 (a round that kept
  # draft k < 3 judged k + 1). Acceptance by depth 0.6, 0.5, 0: one α (0.6, stored γ 8 on a flat curve) overstates.
  summary = {'task': 'specdec_ende_local', 'drafter': 'f128', 'setting': {'temperature': 0.0, 'gamma': 3},
             'target_calls': 10, 'judged': 19, 'acceptance_per_position': [0.6, 0.5, 0.0], 'speedup': 1.2,
             'gamma_auto': {'gamma': 8, 'alpha': 0.6, 'c_in_loop': 0.0, 'verify_curve': flat}}
  row = gamma_auto_by_depth.repick(summary)
  assert row['acceptance_by_depth'] == pytest.approx([0.6, 0.5, 0.0])
  assert row['gamma_one_alpha'] == 8
  assert row['gamma_probe_depths'] == 8  # 0.6 then 0.5 at every depth: on a flat curve the widest still pays
  assert row['gamma_every_depth'] == 2 and row['predicted_every_depth'] == pytest.approx(1 + 0.6 + 0.3)
  rep = {'command': 'python scripts/gamma_auto_by_depth.py x.json --out y', 'date': '2026-12-05',
         'probe_gamma': 2, 'rows': [dict(row, file='results/main_job/x.json')]}
  text = gamma_auto_by_depth.markdown(rep)
  assert '| x.json | specdec_ende_local | f128 | 0 | 8 | 0.60, 0.50, 0.00 | 8 (' in text and '| **2** (1.90×) |' in text
  assert 'From depths 1..2: 0 of 1 rows change.' in text


_CPU_V2 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'models', 'cpu_v2')


def test_hash_decode_programs_names_each_program_that_changed(tmp_path, monkeypatch, capsys):
  import hash_decode_programs  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(hash_decode_programs, 'PROGRAMS', {'ngram': ('bigram', None, 'chain')})
  monkeypatch.setattr(hash_decode_programs, 'TEMPERATURES', (0.0, 1.0))
  stored = tmp_path / 'hashes.json'
  assert hash_decode_programs.main(['--models', _CPU_V2, '--out', str(stored)]) == 0
  found = json.loads(stored.read_text())
  assert sorted(found) == ['ngram_t0', 'ngram_t1'] and found['ngram_t0'] != found['ngram_t1']
  assert hash_decode_programs.main(['--models', _CPU_V2, '--compare', str(stored)]) == 0
  assert 'identical: all 2' in capsys.readouterr().out
  stored.write_text(json.dumps(dict(found, ngram_t1='0' * 64)))
  assert hash_decode_programs.main(['--models', _CPU_V2, '--compare', str(stored)]) == 1
  assert capsys.readouterr().out.strip().endswith('differ: ngram_t1')


def test_distill_model_batch_pads_inputs_to_the_corpus_buckets():
  import build_distill_corpus as bdc  # pylint: disable=g-import-not-at-top
  examples = [{'inputs': np.arange(2, 22)}, {'inputs': np.arange(2, 42)}, {'inputs': np.arange(2, 200)}]
  batch = bdc.model_batch(examples, [1, 0], 4, {'inputs': 96, 'targets': 8})
  assert batch['encoder_input_tokens'].shape == (4, 64) and batch['decoder_input_tokens'].shape == (4, 8)
  np.testing.assert_array_equal(batch['encoder_input_tokens'][0, :40], np.arange(2, 42))
  np.testing.assert_array_equal(batch['encoder_input_tokens'][1, :20], np.arange(2, 22))
  assert not batch['encoder_input_tokens'][1, 20:].any() and not batch['encoder_input_tokens'][2:].any()
  # Past the last bucket within the length: the configured length (96 here, not the corpus's 128 bucket).
  assert bdc.model_batch(examples, [2], 1, {'inputs': 96, 'targets': 8})['encoder_input_tokens'].shape == (1, 96)
