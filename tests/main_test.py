"""Tests for specdec/main.py: the gin launcher end to end on tiny models and the fixture corpus (CPU).

The target is a 1-layer random T5 over the shipped vocabulary (8192 padded ids) in the project's compact
format; the drafter `d1` beside it is a copy, so greedy speculative decoding accepts every draft. Runs use the
shipped experiment gin files with command-line overrides, as the README does. The benchmark's isolated
call-cost measurement is covered by tests/bench/benchmark_test.py and replaced by fixed costs here.
"""

import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import pytest

from specdec.bench import auto_gamma
from specdec.bench import benchmark
from specdec import checkpoints
from specdec import fingerprint
from specdec import gin_utils
from specdec import loading
from specdec import main
from specdec.bench import profiling
from specdec import network
from specdec import ngram
from specdec import run_config
from specdec import settings
from specdec import tasks
from specdec import theory

TESTDATA = os.path.join(os.path.dirname(__file__), 'testdata', 'tasks')
FIXTURE_CORPUS = os.path.join(TESTDATA, 'corpus')
VOCAB_SIZE = 8192
NGRAM_VOCAB = 64
COSTS = {'target_call_s': 0.010, 'verify_call_s': 0.012, 'draft_call_s': 0.002, 'c': 0.2,
         'verify_cost_ratio': 1.2}
# In-loop costs (profiling.in_loop_costs is timed for real in profiling_test and benchmark_test).
IN_LOOP = {'draft_s': 4e-4, 'verify_s': 1.5e-3, 'accept_s': 1e-5, 'commit_s': 1e-5, 'round_s': 2e-3,
           'baseline_round_s': 1e-3, 'baseline_fixed_s': 2e-3, 'speculative_fixed_s': 3e-3,
           'c_in_loop': 0.1, 'round_fixed_in_loop': 1.6, 'round_over_baseline': 2.0}


def tiny_config(**overrides):
  fields = dict(vocab_size=VOCAB_SIZE, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0, dtype=jnp.float32)
  fields.update(overrides)
  return network.T5Config(**fields)


@pytest.fixture(scope='module')
def family(tmp_path_factory):
  """models/{target,d1,d3} (compact; d1 = a copy of the target, d3 another init) and models/bigram (n-gram)."""
  root = tmp_path_factory.mktemp('models')
  config = tiny_config()
  params = network.init_params(config, jax.random.PRNGKey(0))
  checkpoints.save_compact(str(root / 'target'), config, params, storage_dtype=jnp.float32)
  checkpoints.save_compact(str(root / 'd1'), config, params, storage_dtype=jnp.float32)
  checkpoints.save_compact(str(root / 'd3'), config, network.init_params(config, jax.random.PRNGKey(3)),
                           storage_dtype=jnp.float32)
  # A small-vocabulary bigram (its table is V x V).
  unigram, bigram = ngram.count([[5, 6, 7, 1], [5, 7, 1]], NGRAM_VOCAB)
  ngram.save(str(root / 'bigram'), ngram.NgramConfig(NGRAM_VOCAB, order=2), unigram, bigram)
  return {'root': root, 'config': config, 'params': params}


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch):
  """Fresh gin config per test; the default task registration restored after; fixed call costs."""
  default_corpus = tasks.DEFAULT_CORPUS_DIR  # before any test patches it
  gin.clear_config()
  monkeypatch.setattr(profiling, 'measure_costs', lambda *args, **kwargs: dict(COSTS))
  monkeypatch.setattr(profiling, 'in_loop_costs', lambda *args, **kwargs: dict(IN_LOOP))
  yield
  gin.clear_config()
  tasks.register_local_tasks(corpus_dir=default_corpus)


def _flags(family, out, *extra, gin_file='experiments/cpu/table2/ende_d1_t0.gin', drafter='d1'):
  root = family['root']
  return [
      f'--gin_file={gin_file}',
      f"--gin.OUTPUT_DIR='{out}'",
      f"--gin.TARGET_CHECKPOINT='{root / 'target'}'",
      f"--gin.DRAFTER_CHECKPOINT='{root / drafter}'" if drafter else '--gin.DRAFTER_CHECKPOINT=None',
      f"--gin.run_config.DataConfig.corpus_dir='{FIXTURE_CORPUS}'",
      "--gin.run_config.DataConfig.feature_lengths={'inputs': 16, 'targets': 8}",
      '--gin.run_config.DataConfig.max_examples=2',
      '--gin.settings.Setting.repeats=1',
      '--gin.settings.Setting.length_buckets=False',
      '--gin.GAMMA=2',
  ] + list(extra)


INFER = "--gin.run_config.RunConfig.mode='infer'"


def _jsonl(path):
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


def _fixture_rows(corpus, n):
  return _jsonl(os.path.join(FIXTURE_CORPUS, corpus, 'test.jsonl'))[:n]


# -----------------------------------------------------------------------------
# The modes, end to end
# -----------------------------------------------------------------------------


def test_infer(family, tmp_path):
  out = tmp_path / 'infer'
  main.main(_flags(family, out, "--gin.run_config.RunConfig.mode='infer'"))
  preds = _jsonl(out / 'predictions.jsonl')
  assert [p['index'] for p in preds] == [0, 1]
  for p, row in zip(preds, _fixture_rows('translate_en_de', 2)):
    assert p['reference'] == row['targets']
    assert p['inputs'] == 'translate English to German: ' + row['inputs']
    assert 1 <= p['tokens'] <= 8
    assert p['accepted'] == p['judged']  # the drafter is a copy of the target
  stats = json.loads((out / 'statistics.json').read_text())
  assert stats['task'] == tasks.ENDE_LOCAL_TASK and stats['drafter'] == 'd1'
  assert stats['setting']['gamma'] == 2 and stats['setting']['temperature'] == 0.0
  assert stats['statistics']['examples'] == 2
  assert stats['statistics']['alpha_accept'] == 1.0
  assert stats['statistics']['tokens'] == sum(p['tokens'] for p in preds)
  assert not (out / 'metrics.json').exists()

  # Resumable: a rerun with more examples decodes only the new one (the earlier lines stay as they were).
  gin.clear_config()  # main.main parses and locks the config, as a one-shot command does
  main.main(_flags(family, out, INFER, '--gin.run_config.DataConfig.max_examples=3'))
  again = _jsonl(out / 'predictions.jsonl')
  assert [p['index'] for p in again] == [0, 1, 2] and again[:2] == preds


def test_eval_baseline_only_on_the_summarization_task(family, tmp_path):
  """'eval' without a drafter decodes with the target alone and scores with the task's metrics."""
  out = tmp_path / 'eval'
  main.main(_flags(family, out, "--gin.run_config.RunConfig.mode='eval'",
                   gin_file='experiments/cpu/table2/summ_d3_t0.gin',
                   drafter=None))
  summary = json.loads((out / 'metrics.json').read_text())
  assert summary['task'] == tasks.SUMMARIZE_LOCAL_TASK
  assert summary['drafter'] == 'none'  # no drafter checkpoint: no drafter ran, whatever the file names
  assert set(summary['metrics']) == {'rouge1', 'rouge2', 'rougeLsum'}
  assert all(0 <= v <= 100 for v in summary['metrics'].values())
  assert set(summary['statistics']) == {'examples', 'tokens'}  # no speculative statistics
  preds = _jsonl(out / 'predictions.jsonl')
  assert [p['reference'] for p in preds] == [r['targets'] for r in _fixture_rows('summarize_ddtp', 2)]
  assert 'target_calls' not in preds[0]


def test_benchmark(family, tmp_path):
  out = tmp_path / 'bench'
  main.main(_flags(family, out))  # the experiment file's mode is 'benchmark'
  s = json.loads((out / 'benchmark.json').read_text())
  assert s['task'] == tasks.ENDE_LOCAL_TASK and s['drafter'] == 'd1'
  assert s['examples'] == 2
  assert s['identical_rate'] == 1.0 and s['alpha_accept'] == 1.0
  assert s['setting']['gamma'] == 2 and s['setting']['repeats'] == 1
  assert s['lengths'] == {'inputs': 16, 'targets': 8}
  assert s['costs'] == COSTS
  assert {'benchmark.csv', 'benchmark.md', 'benchmark.png', 'examples.jsonl'} <= set(os.listdir(out))


def test_a_resumed_benchmark_keeps_the_costs_its_first_run_measured(family, tmp_path, monkeypatch, capsys):
  out = tmp_path / 'bench'
  _main(_flags(family, out))
  first = json.loads((out / 'benchmark.json').read_text())
  doubled = lambda costs: {k: 2 * v for k, v in costs.items()}
  monkeypatch.setattr(profiling, 'measure_costs', lambda *args, **kwargs: doubled(COSTS))
  monkeypatch.setattr(profiling, 'in_loop_costs', lambda *args, **kwargs: doubled(IN_LOOP))
  benchmark._COST_CACHE.clear()  # pylint: disable=protected-access  (as a new process starts)
  capsys.readouterr()
  _main(_flags(family, out, '--gin.run_config.DataConfig.max_examples=3'))  # resumed and extended
  again = json.loads((out / 'benchmark.json').read_text())
  assert again['examples'] == 3
  assert again['costs'] == first['costs'] == COSTS and again['in_loop'] == first['in_loop'] == IN_LOOP
  assert 'as measured by the run being resumed' in capsys.readouterr().out
  benchmark._COST_CACHE.clear()  # pylint: disable=protected-access
  _main(_flags(family, out, '--gin.run_config.DataConfig.max_examples=3',
               '--gin.run_config.RunConfig.overwrite=True'))
  assert json.loads((out / 'benchmark.json').read_text())['costs'] == doubled(COSTS)  # measured afresh


def test_table_from_own_gin_file(family, tmp_path):
  """A gin file given by path; rows' drafters are found beside the target."""
  gin_file = _one_row_table(tmp_path, 'specdec_summarize_local', table_name='tiny table')
  out = tmp_path / 'table'
  # The file binds no drafter checkpoint (rows name theirs), so binding DRAFTER_CHECKPOINT would be refused.
  main.main([f for f in _flags(family, out, gin_file=str(gin_file)) if not f.startswith('--gin.DRAFTER_CHECKPOINT')])
  text = (out / 'table.md').read_text()
  assert text.startswith('## tiny table\n')
  assert '| summ. (DDTP) | d1 | 0 | 2 |' in text
  assert 'T5-large: 3, 0.74, 2.2×' in text  # the paper's CNNDM / T5-large / t=0 row (d1 stands in for large)
  rows = json.loads((out / 'table.json').read_text())
  assert len(rows) == 1 and rows[0]['identical_rate'] == 1.0 and rows[0]['drafter'] == 'd1'
  assert os.path.exists(out / 'specdec_summarize_local_d1_t0_g2' / 'benchmark.json')


# -----------------------------------------------------------------------------
# Bad command lines and settings fail before any model loads
# -----------------------------------------------------------------------------


def _error_line(flags):
  """(exit status, stderr) of a command that fails: main.main as a fresh command, stderr captured."""
  gin.clear_config()
  err = io.StringIO()
  with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
    main.main(flags)
  return e.value.code, err.getvalue()


def _assert_one_line(flags, match, out=None):
  """The command ends with exactly one line on stderr matching `match`, exit status 2, nothing under `out`."""
  status, err = _error_line(flags)
  assert status == main.USAGE_EXIT
  assert err.count('\n') == 1 and err.startswith('specdec: '), err
  assert re.search(match, err), err
  assert 'Traceback' not in err
  if out is not None:
    assert not out.exists()
  return err.rstrip('\n')


def test_unknown_arguments_are_one_line():
  _assert_one_line(['--bogus', '--gin_file=experiments/cpu/table2/ende_d1_t0.gin'], r"unknown arguments \['--bogus'\]")


def test_a_binding_without_a_value_is_one_line():
  _assert_one_line(['--gin.GAMMA'], "Expected --gin.NAME=VALUE, got '--gin.GAMMA'")


# The target path does not exist: had the files been checked first, 'target checkpoint not found' would come.
@pytest.mark.parametrize('extra, drafter, match', [
    (["--gin.run_config.RunConfig.mode='train'"], 'd1', "mode must be one of .*'train'"),
    ([], None, 'needs a drafter'),
    (['--gin.GAMMA=0'], 'd1', 'gamma must be an int >= 1, got 0'),
    (['--gin.settings.Setting.temperature=-1.0'], 'd1', 'temperature'),
    (['--gin.settings.Setting.topk=5', '--gin.settings.Setting.topp=0.9'], 'd1', 'top-k or top-p'),
    (["--gin.run_config.RunConfig.mode='table'"], 'd1', 'needs rows'),
    (["--gin.run_config.RunConfig.mode='table'",
      "--gin.run_config.RunConfig.rows=[{'task': 't', 'drafter': 'd1', 'temperature': 0.0, 'gamma': 0}]"], 'd1',
     'table row 1 .*gamma'),
    (["--gin.run_config.DataConfig.feature_lengths={'inputs': 16}"], 'd1', 'feature_lengths'),
    (['--gin.run_config.RunConfig.ceiling_alpha=1.5'], 'd1', r'ceiling_alpha must be a number in \[0, 1\]'),
    (['--gin.run_config.RunConfig.ceiling_alpha=0.9'], 'd1', "ceiling_alpha .* needs mode='table'"),
])
def test_bad_settings_are_one_line_before_anything_is_read_or_written(family, tmp_path, extra, drafter, match):
  flags = _flags(family, tmp_path / 'out', *extra, drafter=drafter)
  flags = [f for f in flags if not f.startswith('--gin.TARGET_CHECKPOINT')]
  flags.append(f"--gin.TARGET_CHECKPOINT='{tmp_path / 'no_such_model'}'")
  _assert_one_line(flags, match, tmp_path / 'out')


def test_run_raises_the_config_error_itself(family, tmp_path):
  """Called from Python, run raises (run_config.ConfigError is a ValueError); nothing is written."""
  config = run_config.RunConfig(output_dir=str(tmp_path / 'out'), decoding=settings.Setting(gamma=0),
                                models=run_config.ModelsConfig(target_checkpoint=str(family['root'] / 'target'),
                                                               drafter_checkpoint=str(family['root'] / 'd1')))
  with pytest.raises(ValueError, match='gamma must be an int >= 1'):
    main.run(config)
  assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('flag, match', [
    ('TARGET_CHECKPOINT', 'target checkpoint not found: .*no_such_model'),
    ('DRAFTER_CHECKPOINT', 'drafter checkpoint not found: .*no_such_model'),
])
def test_a_missing_checkpoint_is_one_line_and_writes_nothing(family, tmp_path, flag, match):
  flags = [f for f in _flags(family, tmp_path / 'out') if not f.startswith(f'--gin.{flag}')]
  _assert_one_line(flags + [f"--gin.{flag}='{tmp_path / 'no_such_model'}'"], match, tmp_path / 'out')


def test_a_missing_table_row_drafter_is_one_line(family, tmp_path):
  flags = [f for f in _flags(family, tmp_path / 'out', gin_file=_one_row_table(tmp_path, drafter='d9'))
           if not f.startswith('--gin.DRAFTER_CHECKPOINT')]
  _assert_one_line(flags, r'table row 1 drafter d9 not found: .*d9$', tmp_path / 'out')


def test_a_drafter_of_another_vocabulary_is_one_line(family, tmp_path):
  _assert_one_line(_flags(family, tmp_path / 'out', drafter='bigram'),
                   f'Vocabulary mismatch: target vocab_size={VOCAB_SIZE}, drafter checkpoint .* vocab_size=64',
                   tmp_path / 'out')


def test_an_unknown_task_is_one_line(family, tmp_path):
  _assert_one_line(_flags(family, tmp_path / 'out', "--gin.run_config.DataConfig.task='specdec_nope'"),
                   "unknown task 'specdec_nope'", tmp_path / 'out')


def test_a_missing_gin_file_is_one_line():
  _assert_one_line(['--gin_file=experiments/no_such.gin'], 'gin file not found: experiments/no_such.gin')


def test_a_former_run_parameter_names_its_new_spelling(family, tmp_path):
  message = _assert_one_line(_flags(family, tmp_path / 'out', '--gin.main.run.max_examples=1'),
                             'main.run.max_examples is now run_config.DataConfig.max_examples', tmp_path / 'out')
  assert message.endswith('(--gin.run_config.DataConfig.max_examples=1).')


def test_debug_shows_the_traceback_instead(family, tmp_path):
  gin.clear_config()
  with pytest.raises(run_config.ConfigError, match='gamma must be an int >= 1'):
    main.main(_flags(family, tmp_path / 'out', '--gin.GAMMA=0', '--debug'))


def test_an_unexpected_failure_is_one_line_with_status_1(family, tmp_path, monkeypatch):
  def broken(*args, **kwargs):
    raise RuntimeError('out of memory\nmore detail')
  monkeypatch.setattr(loading, 'restore', broken)
  status, err = _error_line(_flags(family, tmp_path / 'out', INFER))
  assert status == main.FAILURE_EXIT
  assert err == 'specdec: RuntimeError: out of memory\n'.replace('\n', ' (rerun with --debug for the traceback)\n')


# -----------------------------------------------------------------------------
# --help, and what a run says as it goes
# -----------------------------------------------------------------------------


def test_help_lists_modes_gin_folders_and_the_main_jobs_macros(capsys):
  for flag in ('--help', '-h'):
    gin.clear_config()
    main.main([flag])  # returns: exit status 0
    text = capsys.readouterr().out
    assert text.startswith('usage: python -m specdec.main')
    for mode in main.MODES:
      assert f'  {mode} ' in text
    for folder in ('models', 'tasks', 'experiments', 'train'):
      assert f'  gin/{folder}: ' in text
    values = gin_utils.macro_values([main.DEFAULT_GIN_FILE])
    for macro in ('GAMMA', 'ENDE_DRAFTER', 'SUMMARIZE_DRAFTER', 'OUTPUT_DIR', 'TARGET_CHECKPOINT', 'DRAFT_CONFIDENCE',
                  'CEILING_ALPHA'):
      assert f'  {macro} = {values[macro]!r}\n' in text + '\n'


def test_help_as_a_command_exits_0_and_an_error_exits_2_with_one_line(tmp_path):
  done = subprocess.run([sys.executable, '-m', 'specdec.main', '--help'], capture_output=True, text=True)
  assert done.returncode == 0 and 'GAMMA = ' in done.stdout and 'Unknown' not in done.stderr
  done = subprocess.run([sys.executable, '-m', 'specdec.main', '--gin.GAMMA=0',
                         f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'"], capture_output=True, text=True)
  assert done.returncode == 2
  assert done.stderr == 'specdec: table row 1 (specdec_ende_local, f128): gamma must be an int >= 1, got 0.\n'
  assert not (tmp_path / 'out').exists()


def test_the_header_and_progress_lines_name_the_task_and_row(family, tmp_path, capsys):
  gin_file = _one_row_table(tmp_path, 'specdec_summarize_local')
  flags = [f for f in _flags(family, tmp_path / 'table', gin_file=gin_file)
           if not f.startswith('--gin.DRAFTER_CHECKPOINT')]
  _main(flags)
  lines = capsys.readouterr().out.splitlines()
  header = next(line for line in lines if line.startswith('specdec table:'))
  assert header.startswith('specdec table: 1 rows on specdec_summarize_local:test, target ')
  assert 'Row 1/1: task specdec_summarize_local, drafter d1, temperature 0, γ 2' in lines
  assert any(line.startswith('  [specdec_summarize_local d1 γ=2 t=0] 2/2 examples') for line in lines)

  _main(_flags(family, tmp_path / 'infer', INFER))
  lines = capsys.readouterr().out.splitlines()
  assert any(line.startswith('specdec infer: task specdec_ende_local:test, drafter ') for line in lines)
  assert any(line.startswith('  [specdec_ende_local] 2/2 examples') for line in lines)


# -----------------------------------------------------------------------------
# Resuming only what the same configuration wrote (fingerprint.json)
# -----------------------------------------------------------------------------


def _main(flags):
  """main.main as a fresh command (it parses and locks the gin config)."""
  gin.clear_config()
  main.main(flags)


def _refused(flags):
  """The one line (on stderr, exit status 2) a refused command ends with."""
  status, err = _error_line(flags)
  assert status == main.USAGE_EXIT and err.startswith('specdec: ') and err.count('\n') == 1, err
  return err.rstrip('\n')


def _files(out, names):
  return {name: (out / name).read_bytes() for name in names}


def test_benchmark_rerun_of_another_drafter_gamma_and_temperature_is_refused(family, tmp_path):
  """The issue's case: d1 / t=1 measured, then d3 / γ=3 / t=0 into the same OUTPUT_DIR relabelled its numbers."""
  out = tmp_path / 'bench'
  _main(_flags(family, out, gin_file='experiments/cpu/table2/ende_d1_t1.gin'))
  before = _files(out, ('benchmark.json', 'benchmark.md', 'examples.jsonl', 'fingerprint.json'))
  message = _refused(_flags(family, out, '--gin.GAMMA=3', gin_file='experiments/cpu/table2/ende_d3_t0.gin',
                            drafter='d3'))
  for part in ("drafter 'd1' -> 'd3'", 'gamma 2 -> 3', 'temperature 1.0 -> 0.0',
               f"drafter_checkpoint '{family['root'] / 'd1'}' -> '{family['root'] / 'd3'}'", 'drafter_content',
               'use a new OUTPUT_DIR, or --gin.run_config.RunConfig.overwrite=True'):
    assert part in message
  assert _files(out, before) == before  # nothing relabelled
  recorded = json.loads(before['benchmark.json'])['fingerprint']
  assert recorded == fingerprint.read(str(out))
  assert recorded['target_content'] == fingerprint.checkpoint_digest(str(family['root'] / 'target'))


def test_infer_rerun_with_another_gamma_is_refused_and_overwrite_starts_afresh(family, tmp_path):
  out = tmp_path / 'infer'
  _main(_flags(family, out, INFER))
  (out / 'notes.txt').write_text('mine')
  before = _files(out, ('predictions.jsonl', 'statistics.json'))
  assert 'gamma 2 -> 3' in _refused(_flags(family, out, INFER, '--gin.GAMMA=3'))
  assert _files(out, before) == before

  _main(_flags(family, out, INFER, '--gin.GAMMA=3', '--gin.run_config.RunConfig.overwrite=True'))
  assert json.loads((out / 'statistics.json').read_text())['setting']['gamma'] == 3
  assert fingerprint.read(str(out))['gamma'] == 3
  preds = _jsonl(out / 'predictions.jsonl')
  assert [p['index'] for p in preds] == [0, 1]  # decoded afresh with γ = 3 (every draft kept: γ + 1 per call)
  assert all(p['target_calls'] == math.ceil(p['emitted'] / 4) for p in preds)
  assert (out / 'notes.txt').read_text() == 'mine'  # only the run's own outputs were discarded


def test_eval_of_another_task_into_an_infer_directory_is_refused(family, tmp_path):
  out = tmp_path / 'run'
  _main(_flags(family, out, INFER))
  message = _refused(_flags(family, out, "--gin.run_config.RunConfig.mode='eval'",
                            gin_file='experiments/cpu/table2/summ_d1_t0.gin'))
  assert "task 'specdec_ende_local' -> 'specdec_summarize_local'" in message
  assert not (out / 'metrics.json').exists()
  # 'eval' of the same configuration scores the 'infer' run's predictions (they share predictions.jsonl).
  _main(_flags(family, out, "--gin.run_config.RunConfig.mode='eval'"))
  assert json.loads((out / 'metrics.json').read_text())['statistics']['examples'] == 2


def test_fewer_examples_than_the_directory_holds_is_refused(family, tmp_path):
  out = tmp_path / 'infer'
  _main(_flags(family, out, INFER, '--gin.run_config.DataConfig.max_examples=3'))
  message = _refused(_flags(family, out, INFER))  # max_examples=2
  assert 'max_examples 3 -> 2 (it holds up to 3 examples: max_examples may grow, not shrink)' in message
  assert json.loads((out / 'statistics.json').read_text())['statistics']['examples'] == 3


def test_outputs_from_before_fingerprints_are_refused(family, tmp_path):
  out = tmp_path / 'old'
  _main(_flags(family, out, INFER))
  os.remove(out / fingerprint.FILE_NAME)
  message = _refused(_flags(family, out, INFER))
  assert 'holds predictions.jsonl, statistics.json written without a fingerprint.json' in message
  assert message.endswith('or --gin.run_config.RunConfig.overwrite=True to discard them and start afresh.')


def test_another_mode_into_the_same_directory_is_refused(family, tmp_path):
  out = tmp_path / 'run'
  _main(_flags(family, out, INFER))
  assert "outputs 'predictions' -> 'benchmark';" in _refused(_flags(family, out))  # the file's mode: benchmark


def test_a_checkpoint_changed_in_place_is_refused(family, tmp_path):
  models = tmp_path / 'models'
  for name in ('target', 'd1'):
    shutil.copytree(family['root'] / name, models / name)
  out = tmp_path / 'infer'
  flags = [f for f in _flags(family, out, INFER)
           if not f.startswith(('--gin.TARGET_CHECKPOINT', '--gin.DRAFTER_CHECKPOINT'))]
  flags += [f"--gin.TARGET_CHECKPOINT='{models / 'target'}'", f"--gin.DRAFTER_CHECKPOINT='{models / 'd1'}'"]
  _main(flags)
  shutil.copy(family['root'] / 'd3' / 'params.msgpack', models / 'd1' / 'params.msgpack')  # retrained in place
  message = _refused(flags)
  assert 'drafter_content' in message and 'drafter_checkpoint' not in message and 'target_content' not in message


def _one_row_table(tmp_path, task='specdec_ende_local', table_name=None, drafter='d1'):
  """A table gin file (written under tmp_path) with one row on `task`; returns its path."""
  gin_file = tmp_path / 'table.gin'
  gin_file.write_text(
      "include 'experiments/cpu/base.gin'\n"
      'from __gin__ import dynamic_registration\n'
      'from specdec import run_config\n'
      'run_config.RunConfig:\n'
      "  mode = 'table'\n"
      + (f"  table_name = '{table_name}'\n" if table_name else '')
      + f"  rows = [{{'task': '{task}', 'drafter': '{drafter}', 'temperature': 0.0, 'gamma': %GAMMA}}]\n")
  return str(gin_file)


def test_a_table_row_of_gamma_auto_decodes_at_the_gamma_it_chose_and_keeps_it(family, tmp_path, monkeypatch):
  """GAMMA='auto': the row's γ is chosen from the measured curve, α and c (auto_gamma), it decodes and is costed
  at that γ, the table says so with the curve, and a rerun keeps the choice without measuring it again."""
  out = tmp_path / 'table'
  flags = [f for f in _flags(family, out, gin_file=_one_row_table(tmp_path))
           if not f.startswith(('--gin.DRAFTER_CHECKPOINT', '--gin.GAMMA'))] + ["--gin.GAMMA='auto'"]
  _main(flags)
  row_dir = out / 'specdec_ende_local_d1_t0_gauto'
  summary = json.loads((row_dir / 'benchmark.json').read_text())
  chosen = json.loads((row_dir / 'gamma_auto.json').read_text())
  assert summary['gamma_auto'] == chosen and summary['fingerprint']['gamma'] == 'auto'
  assert summary['setting']['gamma'] == chosen['gamma'] >= 1
  assert chosen['gamma'] == auto_gamma.pick(chosen['alpha'], chosen['c_in_loop'], chosen['verify_curve'],
                                            acceptance=chosen['acceptance_by_depth'])['gamma']
  assert chosen['machine'] == auto_gamma.this_machine()
  text = (out / 'table.md').read_text()
  assert f"| En→De (DDTP) | d1 | 0 | {chosen['gamma']} (auto) |" in text
  assert f"γ (auto) of En→De (DDTP), d1, t = 0: **{chosen['gamma']}**" in text
  assert auto_gamma.depth_note(chosen) in text

  def measured_again(*args, **kwargs):
    raise AssertionError('the choice was measured again')

  measure_curve, time_phases = profiling.verify_cost_curve, profiling.time_phases
  monkeypatch.setattr(profiling, 'verify_cost_curve', measured_again)
  monkeypatch.setattr(profiling, 'time_phases', measured_again)
  _main(flags)
  assert json.loads((row_dir / 'benchmark.json').read_text())['gamma_auto'] == chosen
  # overwrite discards the choice with the other outputs: it is measured afresh.
  curves = []
  monkeypatch.setattr(profiling, 'verify_cost_curve', lambda *a, **k: curves.append(1) or measure_curve(*a, **k))
  monkeypatch.setattr(profiling, 'time_phases', time_phases)
  _main(flags + ['--gin.run_config.RunConfig.overwrite=True'])
  assert curves == [1]


def test_the_controlled_row_follows_more_examples(family, tmp_path):
  """max_examples may grow on a rerun of a table: the controlled row is measured on the new examples, not refused."""
  out = tmp_path / 'table'
  flags = [f for f in _flags(family, out, gin_file=_one_row_table(tmp_path))
           if not f.startswith('--gin.DRAFTER_CHECKPOINT')] + ['--gin.run_config.RunConfig.ceiling_alpha=0.9']
  _main(flags)
  _main(flags + ['--gin.run_config.DataConfig.max_examples=3'])
  assert json.loads((out / main.CONTROLLED_FILE).read_text())['examples'] == 3


def test_a_gamma_that_is_neither_an_int_nor_auto_is_one_line(family, tmp_path):
  flags = [f for f in _flags(family, tmp_path / 'out') if not f.startswith('--gin.GAMMA')] + ["--gin.GAMMA='best'"]
  _assert_one_line(flags, r"gamma must be an int >= 1 or 'auto', got 'best'", tmp_path / 'out')


def test_a_table_prints_a_controlled_acceptance_row_and_resumes_it(family, tmp_path, monkeypatch):
  """ceiling_alpha adds the oracle's row under the table (marked controlled acceptance), at the γ the measured
  verify-cost curve favours; a rerun reads it back without measuring again."""
  out = tmp_path / 'table'
  flags = [f for f in _flags(family, out, gin_file=_one_row_table(tmp_path))
           if not f.startswith('--gin.DRAFTER_CHECKPOINT')] + ['--gin.run_config.RunConfig.ceiling_alpha=0.9']
  _main(flags)
  row = json.loads((out / main.CONTROLLED_FILE).read_text())
  assert row['drafter'] == 'controlled acceptance' and row['alpha_target'] == 0.9 and row['batch'] == 1
  assert row['identical'] and row['examples'] == 2 and 0.0 <= row['alpha_measured'] <= 1.0
  # The decode length is 8: the curve covers k = 1..7 and γ + 1 lies on it.
  assert row['verify_curve']['tokens'] == list(range(1, 8)) and 1 <= row['gamma'] <= 6
  ratios = dict(zip(row['verify_curve']['tokens'], row['verify_curve']['ratio']))
  assert row['gamma'] == theory.best_gamma(0.9, 0.0, ratios)[0]
  text = (out / 'table.md').read_text()
  assert '### When drafts are good: controlled acceptance (not a drafter)' in text
  assert f"| En→De (DDTP) | controlled acceptance (oracle) | 0.9 | {row['gamma']} |" in text
  assert text.index('| En→De (DDTP) | d1 |') < text.index('controlled acceptance (oracle)')

  def measured_again(*args, **kwargs):
    raise AssertionError('the controlled row was measured again')

  monkeypatch.setattr(profiling, 'verify_cost_curve', measured_again)
  monkeypatch.setattr(profiling, 'time_side_by_side', measured_again)
  _main(flags)
  assert json.loads((out / main.CONTROLLED_FILE).read_text()) == row


def test_table_rows_are_checked_before_any_model_loads(family, tmp_path, monkeypatch):
  out = tmp_path / 'table'
  flags = [f for f in _flags(family, out, gin_file=_one_row_table(tmp_path))
           if not f.startswith('--gin.DRAFTER_CHECKPOINT')]
  _main(flags)
  assert fingerprint.read(str(out)) == {'outputs': 'table'}

  def no_loading(*args, **kwargs):
    raise AssertionError('a model was loaded before the fingerprints were checked')

  monkeypatch.setattr(loading, 'restore', no_loading)
  message = _refused(flags + ['--gin.settings.Setting.seed=1'])
  assert f"{out / 'specdec_ende_local_d1_t0_g2'} holds outputs of another configuration: seed 0 -> 1;" in message


def test_an_interrupted_infer_resumes_to_the_uninterrupted_outputs(family, tmp_path):
  flags = lambda out: _flags(family, out, INFER, '--gin.run_config.DataConfig.max_examples=3')
  whole, cut = tmp_path / 'whole', tmp_path / 'cut'
  _main(flags(whole))
  _main(flags(cut))
  lines = (cut / 'predictions.jsonl').read_text().splitlines(keepends=True)
  (cut / 'predictions.jsonl').write_text(lines[0] + lines[1][:20])  # killed while writing the second record
  os.remove(cut / 'statistics.json')
  _main(flags(cut))
  assert _files(cut, ('predictions.jsonl', 'statistics.json', 'fingerprint.json')) == _files(
      whole, ('predictions.jsonl', 'statistics.json', 'fingerprint.json'))


def test_a_missing_output_dir_is_one_line():
  assert _refused(['--gin_file=experiments/cpu/table2/ende_d1_t0.gin']) == (
      'specdec: macro OUTPUT_DIR is used but never set: bind it, e.g. --gin.OUTPUT_DIR=VALUE.')


def test_a_misspelt_macro_is_one_line_and_runs_nothing(family, tmp_path):
  message = _refused(_flags(family, tmp_path / 'out', '--gin.GAMA=3'))
  assert message == ("specdec: binding 'GAMA = 3': no gin file uses macro GAMA, so it would change nothing "
                     '(did you mean GAMMA?).')
  assert not (tmp_path / 'out').exists()


def test_importing_main_keeps_tensorflow_quiet_and_off_accelerators():
  code = ('import os, specdec.main, tensorflow as tf; '
          "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), tf.config.get_visible_devices('GPU'))")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='1')
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, check=True)
  assert done.stdout.split() == ['1', '[]']  # JAX's (shared) log level is left as it was
  for noise in ('oneDNN', 'cuInit', 'cudart', 'absl::InitializeLog'):
    assert noise not in done.stderr


def test_remote_output_dir_is_written_locally_then_copied_and_resumed_from():
  import tensorflow as tf  # the gfile filesystems (ram:// here stands in for gs://)
  remote = 'ram://specdec_main_test/out'
  with main.local_output_dir(remote) as local:
    assert not local.startswith('ram://') and os.path.isdir(local)
    os.makedirs(os.path.join(local, 'row'), exist_ok=True)
    with open(os.path.join(local, 'row', 'examples.jsonl'), 'w') as f:
      f.write('{"index": 0}\n')
  assert tf.io.gfile.exists(remote + '/row/examples.jsonl')
  # A rerun starts from the remote contents (resume), even from a fresh local directory.
  import shutil
  shutil.rmtree(local)
  with main.local_output_dir(remote) as local2:
    with open(os.path.join(local2, 'row', 'examples.jsonl')) as f:
      assert f.read() == '{"index": 0}\n'
