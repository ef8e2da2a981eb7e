"""Tests of the accelerator check (specdec/bench/accelerator.py, scripts/accelerator_check.py) on CPU, tiny shapes."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.bench import accelerator
from specdec.bench import accelerator_report
from specdec.bench import ceiling
from specdec import decoding
from specdec import memory
from specdec import models
from specdec import network
from specdec.bench import oracle

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, 'scripts', 'accelerator_check.py')
# The smallest grid that still runs every part once.
QUICK = ['--shapes', 'tiny', '--batch_sizes', '1', '--max_tokens', '3', '--gammas', '2', '--alphas', '0.9',
         '--examples', '2', '--num_calls', '2', '--repeats', '1', '--cost_gamma', '2', '--decode_length', '8',
         '--input_length', '8']
# Run as the lent machine runs it: TensorFlow, seqio and gin are not installed there.
BLOCKED = ('tensorflow', 'seqio', 'gin')
_RUNNER = textwrap.dedent(f'''
    import runpy, sys
    class Blocked:
      def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {BLOCKED!r}:
          raise ImportError('not installed on the accelerator machine: ' + name)
    sys.meta_path.insert(0, Blocked())
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name='__main__')
''')


def _script(args, out, state, **kwargs):
  return subprocess.Popen([sys.executable, '-c', _RUNNER, SCRIPT, *QUICK, '--out', str(out), '--state_dir',
                           str(state), *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kwargs)


# ----------------------------------------------------------------------------------------------------------
# Settings, shapes, memory, the plan.
# ----------------------------------------------------------------------------------------------------------


def test_shapes_are_the_gin_files_sizes():
  """The check measures network.PRESETS; they must be the sizes gin/models/ configures."""
  fields = ('emb_dim', 'num_heads', 'head_dim', 'num_encoder_layers', 'num_decoder_layers', 'mlp_dim')
  for name in accelerator.SHAPES:
    text = open(os.path.join(REPO, 'gin', 'models', f'target_t5_1_1_{name}.gin'), encoding='utf-8').read()
    config = accelerator.shape_config(name)
    for field in fields:
      value = int(re.search(rf'^\s*{field}\s*=\s*(\d+)', text, re.M).group(1))
      assert getattr(config, field) == value, (name, field)
    assert config.dtype == jnp.bfloat16


@pytest.mark.parametrize('change, message', [
    (dict(shapes=('tiny', 'small')), 'cannot be mixed'),
    (dict(shapes=('huge',)), 'subset'),
    (dict(max_tokens=32, decode_length=32), 'below decode_length'),
    (dict(cost_gamma=16), 'cost_gamma'),
    (dict(gammas=(0,)), 'gammas'),
    (dict(alphas=(1.5,)), 'alphas'),
    (dict(gammas=(20,)), 'max_verify_tokens'),
    (dict(batch_sizes=()), 'batch_sizes'),
    (dict(repeats=0), 'repeats'),
])
def test_bad_settings_are_refused(change, message):
  with pytest.raises(ValueError, match=message):
    accelerator.Settings(**change).validate()


def test_drafter_shapes_are_the_papers_sizes_below_the_target():
  shapes = accelerator.SHAPES
  assert accelerator.drafter_shapes('xxl', shapes) == ['small', 'base', 'large']
  assert accelerator.drafter_shapes('large', shapes) == ['small', 'base']
  assert accelerator.drafter_shapes('small', shapes) == []
  assert accelerator.drafter_shapes('xxl', ('base', 'xxl')) == ['base']
  assert accelerator.drafter_shapes('tiny', accelerator.TINY_SHAPES) == ['tiny_drafter']


def test_memory_plan_counts_bf16_params_and_skips_what_does_not_fit():
  settings = accelerator.Settings()
  plan = accelerator.memory_plan(settings, limit_bytes=24 * 2**30)
  for name in accelerator.SHAPES:
    entry = plan[name]
    assert entry['params_bytes'] == 2 * entry['num_params']  # bfloat16
    assert entry['needed_bytes'] > entry['params_bytes'] + entry['cache_bytes']  # its drafters too
  assert 10e9 < plan['xxl']['num_params'] < 13e9  # T5 1.1 XXL: 11B
  assert not plan['xxl']['fits'] and 'GiB' in plan['xxl']['reason']
  assert plan['xl']['fits'] and plan['small']['fits']
  fits = [n for n in accelerator.SHAPES if plan[n]['fits']]
  keys = accelerator.plan(settings, fits, with_tests=True)
  assert not any('xxl' in k for k in keys)
  assert keys[:4] == ['curve:xl:1', 'costs:xl', 'ceiling:xl', 'in_loop:xl']
  assert keys[-1] == 'tests' and sum(k.startswith('ceiling') for k in keys) == 1


def test_plan_runs_the_largest_target_first_and_costs_where_drafters_are():
  settings = accelerator.Settings()
  keys = accelerator.plan(settings, accelerator.SHAPES, with_tests=False)
  assert keys[:8] == ['curve:xxl:1', 'costs:xxl', 'ceiling:xxl', 'in_loop:xxl', 'curve:xl:1', 'costs:xl',
                      'in_loop:xl', 'curve:large:1']
  assert 'costs:base' in keys and 'costs:small' not in keys  # small has no smaller drafter
  # Batch 8 after every target's batch-1 parts.
  assert keys.index('curve:xxl:8') > keys.index('curve:small:1')
  for name in accelerator.SHAPES:
    assert f'curve:{name}:1' in keys and f'curve:{name}:8' in keys
  assert 'tests' not in keys


def test_random_params_scale_by_fan_in_in_bf16():
  config = accelerator.shape_config('tiny')
  params = accelerator.random_params(memory.abstract_params(config), seed=0)
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  assert {leaf.dtype for _, leaf in leaves} == {jnp.dtype(jnp.bfloat16)}
  for path, leaf in leaves:
    values = np.asarray(leaf, np.float32)
    if values.ndim == 1:
      np.testing.assert_array_equal(values, 1.0)
      continue
    want = accelerator.EMBEDDING_STD if 'embedding' in jax.tree_util.keystr(path) else values.shape[0] ** -0.5
    # The sample standard deviation of n normals has relative standard error 1 / sqrt(2n); allow 6 of them
    # and bf16's rounding (2^-8 relative).
    n = values.size
    assert abs(values.std() / want - 1) < 6 / np.sqrt(2 * n) + 2 ** -8, jax.tree_util.keystr(path)
  # Different seeds, different weights; the same seed, the same.
  again = accelerator.random_params(memory.abstract_params(config), seed=0)
  other = accelerator.random_params(memory.abstract_params(config), seed=1)
  kernel = lambda p: np.asarray(p['decoder']['logits_dense']['kernel'], np.float32)
  np.testing.assert_array_equal(kernel(params), kernel(again))
  assert not np.array_equal(kernel(params), kernel(other))


def test_random_models_decode_finite_logits():
  """Random weights must give finite logits at every shape's depth, or the decodes measure NaN handling."""
  config = accelerator.shape_config('tiny')
  module, params = accelerator.t5_params('tiny', seed=0)
  enc = accelerator.random_inputs(2, 8, config.vocab_size, seed=0)
  logits = module.apply({'params': params}, jnp.asarray(enc), jnp.ones((2, 4), jnp.int32),
                        jnp.ones((2, 4), jnp.int32), enable_dropout=False)
  assert np.isfinite(np.asarray(logits, np.float32)).all()


# ----------------------------------------------------------------------------------------------------------
# Pieces of the report.
# ----------------------------------------------------------------------------------------------------------


def _ceiling_part(draft_s):
  """A ceiling part of two examples at one (α*, γ) with known seconds and target calls."""
  label = ceiling.oracle_label(0.8, 2)
  records = [{'baseline_s': 1.0, 'oracle': {label: {'seconds': 0.5, 'target_calls': [10]}}},
             {'baseline_s': 3.0, 'oracle': {label: {'seconds': 1.5, 'target_calls': [30]}}}]
  rows = [{'alpha_target': 0.8, 'gamma': 2, 'alpha_measured': 0.79, 'measured_speedup': 2.0}]
  return {'report': {'rows': rows, 'costs': {'1': {'draft_s': {'2': draft_s}}}}, 'batches': records}


def test_with_drafter_cost_adds_the_drafters_steps_to_each_round():
  # The oracle's draft phase at γ 2 costs 0.002 s: 0.001 s a step.
  part = _ceiling_part(draft_s=0.002)
  same = accelerator.with_drafter_cost(part, draft_step_s=0.001)
  assert same[0]['speedup'] == pytest.approx(2.0)
  dearer = accelerator.with_drafter_cost(part, draft_step_s=0.011)
  # 40 target calls × γ 2 × 0.010 s more a step = 0.8 s more: 4 / (2 + 0.8).
  assert dearer[0]['speedup'] == pytest.approx(4.0 / 2.8)
  assert dearer[0]['measured_oracle_speedup'] == 2.0


def test_test_counts_read_a_pytest_log():
  log = textwrap.dedent('''
      tests/a_test.py::test_one PASSED                                     [ 25%]
      [gw1] [ 50%] FAILED tests/a_test.py::test_two
      tests/a_test.py::test_three SKIPPED (no GPU)                          [ 75%]
      tests/a_test.py::test_four ERROR                                      [100%]
      FAILED tests/a_test.py::test_two - AssertionError
      ==================== 1 failed, 1 passed, 1 skipped, 1 error in 1.00s ====================
  ''')
  assert accelerator.test_counts(log) == {'passed': 1, 'failed': 1, 'skipped': 1, 'error': 1}


def test_test_env_asks_for_full_float32_products_and_no_preallocation():
  env = accelerator.test_env({'PATH': '/bin'})
  assert env['JAX_DEFAULT_MATMUL_PRECISION'] == 'highest'
  assert env['XLA_PYTHON_CLIENT_PREALLOCATE'] == 'false'
  assert accelerator.test_env({'JAX_DEFAULT_MATMUL_PRECISION': 'bfloat16'})['JAX_DEFAULT_MATMUL_PRECISION'] == \
      'bfloat16'


def test_run_tests_counts_outcomes_and_cuts_off(tmp_path):
  (tmp_path / 'quick_test.py').write_text('def test_pass():\n  pass\n\ndef test_fail():\n  assert False\n')
  (tmp_path / 'slow_test.py').write_text('import time\n\ndef test_pass():\n  pass\n\n'
                                         'def test_slow():\n  time.sleep(60)\n')
  done = accelerator.run_tests(str(tmp_path), str(tmp_path / 'quick.log'), 60, files=['quick_test.py'])
  assert done['finished'] and done['returncode'] == 1
  assert done['counts'] == {'passed': 1, 'failed': 1}
  assert '1 failed, 1 passed' in done['summary']
  cut = accelerator.run_tests(str(tmp_path), str(tmp_path / 'slow.log'), 8, files=['slow_test.py'])
  assert not cut['finished'] and cut['counts'] == {'passed': 1} and cut['seconds'] < 30


# ----------------------------------------------------------------------------------------------------------
# The run: budget, skips, resume (fake measurements: the logic is what is tested here).
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_measures(monkeypatch):
  """Each part returns a result at once and records its call. The run's clock is a fake one that only the parts
  advance (by `delay` s each): the budget's logic is tested on any machine, however slow its set-up."""
  calls, delay, clock = [], {'s': 0.0}, {'s': 0.0}
  monkeypatch.setattr(accelerator, 'time', types.SimpleNamespace(perf_counter=lambda: clock['s']))

  def fake(kind):
    def measure(models, target, extra, settings):
      del models, settings
      calls.append(f'{kind}:{target}:{extra}' if kind == 'curve' else f'{kind}:{target}')
      clock['s'] += delay['s']
      if kind == 'curve':
        return {'tokens': [1, 2], 'call_s': [1e-3, 1.5e-3], 'ratio': [1.0, 1.5]}
      if kind == 'costs':
        return {'target_call_s': 1e-3, 'draft_call_s': {'tiny_drafter': 2e-4}, 'c': {'tiny_drafter': 0.2}}
      return {'gamma': 2, 'baseline_round_s': 1e-3, 'draft_step_s': {'tiny_drafter': 2e-4},
              'c_in_loop': {'tiny_drafter': 0.2}}
    return measure

  monkeypatch.setattr(accelerator, 'measure_curve', fake('curve'))
  monkeypatch.setattr(accelerator, 'measure_costs', fake('costs'))
  monkeypatch.setattr(accelerator, 'measure_in_loop', fake('in_loop'))

  def ceiling_fails(models, target, *args):
    del models, args
    calls.append(f'ceiling:{target}')
    raise RuntimeError('out of device memory')

  monkeypatch.setattr(accelerator, 'measure_ceiling', ceiling_fails)
  return calls, delay


def test_a_shape_that_does_not_fit_is_skipped_and_reported(fake_measures, tmp_path):
  calls, _ = fake_measures
  settings = accelerator.Settings(shapes=accelerator.TINY_SHAPES, batch_sizes=(1,))
  plan = accelerator.memory_plan(settings, 2**40)
  # Room for the drafter shape as a target, not for the tiny target (it needs the drafter's bytes too).
  limit = int((plan['tiny_drafter']['needed_bytes'] + plan['tiny']['needed_bytes']) / 2 / accelerator.MEMORY_HEADROOM)
  rep = accelerator.run(settings, str(tmp_path), budget_s=60, tests=False, tests_s=0, memory_limit_bytes=limit,
                        log=lambda _: None)
  assert not rep['memory']['shapes']['tiny']['fits'] and rep['memory']['shapes']['tiny_drafter']['fits']
  assert calls and all(c.split(':')[1] == 'tiny_drafter' for c in calls)
  assert calls[:3] == ['curve:tiny_drafter:1', 'costs:tiny_drafter', 'ceiling:tiny_drafter']
  text = accelerator_report.markdown(rep)
  assert re.search(r'\| tiny \|.*skipped: needs', text)
  # The ceiling's failure is reported, and the other parts still ran.
  assert 'ceiling:tiny_drafter' in rep['errors'] and 'out of device memory' in text
  assert 'parts failed' in rep['summary']


def test_the_budget_stops_parts_and_a_rerun_resumes(fake_measures, tmp_path):
  calls, delay = fake_measures
  settings = accelerator.Settings(shapes=accelerator.TINY_SHAPES, batch_sizes=(1, 8))
  delay['s'] = 0.3
  first = accelerator.run(settings, str(tmp_path), budget_s=0.5, tests=False, tests_s=0, log=lambda _: None)
  done_first = set(first['part_seconds'])
  assert done_first and first['not_reached']
  assert set(first['not_reached']) | done_first | set(first['errors']) == set(first['plan'])
  assert 'not reached' in first['summary'] and 'Not reached within' in accelerator_report.markdown(first)
  calls.clear()
  delay['s'] = 0.0
  second = accelerator.run(settings, str(tmp_path), budget_s=60, tests=False, tests_s=0, log=lambda _: None)
  assert not second['not_reached']
  assert calls and not done_first & set(calls)
  assert 'ceiling:tiny' in calls  # a failed part is tried again
  assert set(second['part_seconds']) | set(second['errors']) == set(second['plan'])
  # Finished parts keep their first measurement.
  assert {k: second['part_seconds'][k] for k in done_first} == {k: first['part_seconds'][k] for k in done_first}


def test_a_state_of_other_settings_is_refused(fake_measures, tmp_path):
  del fake_measures
  accelerator.run(accelerator.Settings(shapes=accelerator.TINY_SHAPES, batch_sizes=(1,)), str(tmp_path), 60,
                  False, 0, log=lambda _: None)
  with pytest.raises(ValueError, match='other settings'):
    accelerator.run(accelerator.Settings(shapes=accelerator.TINY_SHAPES, batch_sizes=(1,), seed=5),
                    str(tmp_path), 60, False, 0, log=lambda _: None)


# ----------------------------------------------------------------------------------------------------------
# The script, for real, without TensorFlow, seqio or gin: a kill, a resume and the complete report.
# ----------------------------------------------------------------------------------------------------------


def test_script_resumes_after_a_kill_and_writes_a_complete_report(tmp_path):
  out, state = tmp_path / 'out', tmp_path / 'state'
  state_file = state / 'state.json'
  proc = _script([], out, state, start_new_session=True)
  deadline = time.time() + 120
  while time.time() < deadline and proc.poll() is None:
    if state_file.exists() and json.loads(state_file.read_text())['parts']:
      break
    time.sleep(0.05)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  killed = json.loads(state_file.read_text())['parts']
  assert killed, 'no part finished before the kill'
  quick_plan = accelerator.plan(accelerator.Settings(shapes=accelerator.TINY_SHAPES, batch_sizes=(1,)),
                                accelerator.TINY_SHAPES, with_tests=False)
  assert len(killed) < len(quick_plan), 'the run finished before the kill'


  proc = _script([], out, state)
  log, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, log
  for key in killed:  # measured before the kill: not measured again
    assert f': {key}\n' not in log
  [folder] = os.listdir(out)
  assert folder == accelerator.run_name(accelerator.device_info())
  rep = json.loads((out / folder / 'report.json').read_text())
  assert set(rep['part_seconds']) == set(rep['plan']) and not rep['errors'] and not rep['not_reached']
  assert {k: rep['part_seconds'][k] for k in killed} == {k: v['seconds'] for k, v in killed.items()}
  assert rep['verify_curves']['tiny']['1']['tokens'] == [1, 2, 3]
  assert set(rep['costs']['tiny']['c']) == {'tiny_drafter', 'head', 'bigram', 'trigram'}
  assert all(v > 0 for v in rep['in_loop']['tiny']['c_in_loop'].values())
  rows = rep['ceiling']['report']['rows']
  assert [(r['alpha_target'], r['gamma']) for r in rows] == [(0.9, 2)] and rows[0]['identical']
  assert rep['ceiling']['with_drafter'][0]['speedup'] > 0
  assert rep['tests'] is None  # on a CPU the suite runs in CI
  for name in ('report.md', 'report.png'):
    assert (out / folder / name).stat().st_size > 0
  text = (out / folder / 'report.md').read_text()
  for section in ('## Verify-cost curve', '## c: a draft step', '## The ceiling at tiny shape', 'Not run'):
    assert section in text
  summary = log.strip().splitlines()[-1]
  assert summary == rep['summary']
  assert summary.startswith(f'accelerator check: cpu cpu ×1, jax {jax.__version__}')
  for field in ('tiny verify 3 tokens', 'c tiny_drafter/tiny', 'oracle α* 0.9:', "with tiny_drafter's c"):
    assert field in summary, field
  assert str(tmp_path) not in rep['command']  # provenance without the machine's paths


def test_random_weights_keep_the_greedy_path_through_verify_calls():
  """The ceiling needs the speculative decode to stay on the baseline's greedy path: in bfloat16, with T5's
  vocabulary, a k-token verify call must not flip the argmax a one-token call takes (the oracle proposes the
  baseline's tokens, so at α* = 1 every draft must be accepted and every decode identical)."""
  # Base's width and vocabulary, two layers: with T5's N(0, 1) embedding a quarter to a half of these decodes
  # left the greedy path on a 2-core x86 CPU (the k-token call's products round otherwise at this width).
  config = network.T5Config(vocab_size=32128, dtype='bfloat16', emb_dim=768, num_heads=12, head_dim=64,
                            num_encoder_layers=2, num_decoder_layers=2, mlp_dim=2048, dropout_rate=0.0)
  module = network.Transformer(config)
  params = accelerator.random_params(memory.abstract_params(config), seed=0)
  enc = accelerator.random_inputs(8, 16, config.vocab_size, seed=1)
  batch = {'encoder_input_tokens': enc, 'decoder_input_tokens': np.zeros((8, 24), np.int32)}
  greedy = {'temperature': 0.0, 'topk': 0, 'topp': 0.0}
  base = models.SpeculativeEncoderDecoderModel(module, None, decode_fn=decoding.temperature_sample)
  decodes = np.asarray(base.compile_predict(greedy)({'target': params}, batch)[0])
  drafter = oracle.OracleDrafter(oracle.OracleConfig(config.vocab_size))
  spec = models.SpeculativeEncoderDecoderModel(module, drafter, decode_fn=decoding.speculative_sample)
  out, aux = spec.compile_predict(dict(greedy, gamma=4, return_stats=True))(
      {'target': params, 'drafter': oracle.oracle_params(decodes, 1.0)}, batch)
  stats = jax.tree_util.tree_map(np.asarray, aux['stats'])
  np.testing.assert_array_equal(np.asarray(out), decodes)
  assert stats['accepted'].sum() == stats['judged'].sum() > 0
