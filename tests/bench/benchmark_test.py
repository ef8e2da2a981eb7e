"""Tests for specdec/bench/benchmark.py (CPU, a 1-layer random T5 and the fixture corpus).

The pure parts (buckets, batches, token counts, the outputs) are checked on hand-made data with numbers worked
out by hand (the summary's arithmetic: reporting_test.py); the end-to-end `run` uses a tiny random target whose drafter is a copy of it, so
greedy speculative decoding must match the baseline exactly and accept every draft (α = 1).
"""

import csv
import dataclasses
import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.bench import benchmark
from specdec import feature_drafter
from specdec import fingerprint
from specdec import network
from specdec.bench import reporting
from specdec import settings
from specdec import tasks
from tests import benchmark_records as hand

TESTDATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'testdata', 'tasks')
FIXTURE_CORPUS = os.path.join(TESTDATA, 'corpus')
# The shipped vocabulary has 8100 ids (8000 pieces + 100 sentinels); the CPU family pads it to 8192.
VOCAB_SIZE = 8192
LENGTHS = {'inputs': 16, 'targets': 8}
EOS = 1


def tiny_config(vocab_size=VOCAB_SIZE, **overrides):
  fields = dict(vocab_size=vocab_size, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0, dtype=jnp.float32)
  fields.update(overrides)
  return network.T5Config(**fields)


@pytest.fixture(scope='module')
def tiny():
  config = tiny_config()
  params = network.init_params(config, jax.random.PRNGKey(0))
  return network.Transformer(config), params


# -----------------------------------------------------------------------------
# divergence_margin
# -----------------------------------------------------------------------------


def _step_logits(module, params, enc_1l, tokens):
  """Logits [len(tokens), V] after each prefix, one cached 1-token call at a time (not __call__)."""
  enc = jnp.asarray(enc_1l[None])
  encoded = module.apply({'params': params}, enc, enable_dropout=False, method=module.encode)
  _, variables = module.apply({'params': params}, encoded, enc, len(tokens) + 1,
                              method=module.init_cache, mutable=['cache'])
  cache = variables['cache']

  @jax.jit
  def step(cache, tok, pos):
    logits, new_vars = module.apply({'params': params, 'cache': cache}, jnp.full((1, 1), tok, jnp.int32),
                                    jnp.full((1,), pos, jnp.int32), method=module.decode_step,
                                    mutable=['cache'])
    return logits[0, -1], new_vars['cache']

  out = []
  for pos, tok in enumerate([0] + list(tokens)):
    logits, cache = step(cache, tok, pos)
    out.append(np.asarray(logits, np.float32))
  return np.stack(out)


def test_divergence_margin_against_teacher_forcing(tiny):
  module, params = tiny
  rng = np.random.RandomState(1)
  enc = rng.randint(2, 8000, (8,)).astype(np.int32)
  pos = 3
  prefix = list(rng.randint(2, 8000, (pos,)))
  step_logits = _step_logits(module, params, enc, prefix)
  logits = step_logits[pos]
  top, second = np.argsort(logits)[::-1][:2]
  assert top > 1 and second > 1  # real tokens (not pad / EOS) for this seed
  tail = list(rng.randint(2, 8000, (4,)))
  baseline = np.asarray(prefix + [top] + tail, np.int32)
  speculative = np.asarray(prefix + [second] + [7, 7, 7, 7], np.int32)  # differs from `pos` on
  gap = float(logits[top] - logits[second])
  assert gap > 0

  got = benchmark.divergence_margin(module, params, enc, baseline, speculative)
  assert got['position'] == pos
  assert (got['baseline_token'], got['speculative_token']) == (top, second)
  assert got['margin'] == pytest.approx(gap, rel=1e-3, abs=1e-4)
  assert got['top2_gap'] == pytest.approx(gap, rel=1e-3, abs=1e-4)

  # Swapped: the margin is that of the first argument's token, now the runner-up: negative.
  got = benchmark.divergence_margin(module, params, enc, speculative, baseline)
  assert got['position'] == pos
  assert (got['baseline_token'], got['speculative_token']) == (second, top)
  assert got['margin'] == pytest.approx(-gap, rel=1e-3, abs=1e-4)
  assert got['top2_gap'] == pytest.approx(gap, rel=1e-3, abs=1e-4)

  # A difference at position 0 (no common prefix) and a margin of two arbitrary tokens.
  a, b = 100, 200
  first = benchmark.divergence_margin(module, params, enc, np.asarray([a, 5, 6], np.int32),
                                      np.asarray([b, 5, 6], np.int32))
  logits0 = step_logits[0]  # after BOS alone
  assert first['position'] == 0
  assert first['margin'] == pytest.approx(float(logits0[a] - logits0[b]), rel=1e-3, abs=1e-4)


# -----------------------------------------------------------------------------
# write_outputs (hand-made records)
# -----------------------------------------------------------------------------


def test_write_outputs(tmp_path):
  records = hand.records()
  summary = hand.full_summary(records)
  out = tmp_path / 'bench'
  benchmark.write_outputs(str(out), summary, records)
  assert sorted(os.listdir(out)) == ['benchmark.csv', 'benchmark.json', 'benchmark.md', 'benchmark.png']
  assert json.loads((out / 'benchmark.json').read_text()) == json.loads(json.dumps(summary))
  with open(out / 'benchmark.csv', newline='') as f:
    rows = list(csv.reader(f))
  assert rows[0] == list(reporting.BENCHMARK_CSV_FIELDS)
  assert len(rows) == 1 + len(records)
  assert [int(r[0]) for r in rows[1:]] == [0, 1, 2]
  assert rows[2][reporting.BENCHMARK_CSV_FIELDS.index('identical')] == 'False'
  assert (out / 'benchmark.md').read_text() == reporting.benchmark_markdown(summary)
  assert (out / 'benchmark.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert not [p for p in os.listdir(out) if 'tmp' in p]  # no temporary files left behind
  benchmark.write_outputs(str(tmp_path / 'noplot'), summary, records, write_plot=False)
  assert not (tmp_path / 'noplot' / 'benchmark.png').exists()


# -----------------------------------------------------------------------------
# run: end to end, resume, validation
# -----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def fixture_tasks():
  """Registers the local tasks on the fixture corpus; restores the defaults."""
  tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS)
  yield
  tasks.register_local_tasks()


def _fixture_rows(n):
  with open(os.path.join(FIXTURE_CORPUS, 'translate_en_de', 'test.jsonl'), encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()][:n]


SETTING = settings.Setting(gamma=2, temperature=0.0, repeats=1, length_buckets=False)


@pytest.fixture(scope='module')
def copy_drafter(tiny):
  """A copy of the target (its own module and params): greedy drafts are always kept."""
  module, params = tiny
  return network.Transformer(module.config), jax.tree_util.tree_map(jnp.array, params)


def _run(tiny, drafter, output_dir, max_examples, setting=SETTING, measure_in_loop=False):
  module, params = tiny
  drafter_module, drafter_params = drafter
  return benchmark.run(benchmark.ModelPair(module, params, drafter_module, drafter_params, 'copy'),
                       benchmark.TaskSplit(tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, max_examples), setting,
                       benchmark.Output(str(output_dir)), benchmark.Measuring(measure_in_loop=measure_in_loop))


@pytest.fixture(scope='module')
def first_run(tiny, copy_drafter, fixture_tasks, tmp_path_factory):
  del fixture_tasks
  out = tmp_path_factory.mktemp('run') / 'bench'
  # The one run that also times the round inside the compiled loop (profiling_test covers the rest).
  return _run(tiny, copy_drafter, out, max_examples=2, measure_in_loop=True), out


def test_run_greedy_copy_drafter_is_exact_with_alpha_one(first_run):
  s, out = first_run
  assert s['examples'] == 2
  assert s['identical_rate'] == 1.0
  assert s['mismatches'] == []
  assert s['alpha_accept'] == 1.0
  assert s['accepted_per_drafted'] == 1.0
  assert s['in_loop']['round_s'] > 0 and s['in_loop']['baseline_round_s'] > 0
  assert s['predicted_speedup_in_loop'] > 0
  assert s['alpha_overlap'] == pytest.approx(1.0, abs=1e-5)  # Σ min(p, p) = 1 up to float rounding
  assert s['acceptance_per_position'] == [1.0, 1.0]
  assert s['baseline_tokens'] == s['speculative_tokens'] > 0
  assert s['task'] == tasks.ENDE_LOCAL_TASK and s['drafter'] == 'copy' and s['split'] == 'test'
  assert s['setting']['gamma'] == 2 and s['lengths'] == LENGTHS
  assert set(s['quality']['baseline']) == {'bleu'}
  assert s['quality']['baseline'] == s['quality']['speculative']
  costs = s['costs']
  for key in ('target_call_s', 'verify_call_s', 'draft_call_s', 'c', 'verify_cost_ratio'):
    assert math.isfinite(costs[key]) and costs[key] > 0, key
  assert costs['c'] == pytest.approx(costs['draft_call_s'] / costs['target_call_s'])
  assert costs['verify_cost_ratio'] == pytest.approx(costs['verify_call_s'] / costs['target_call_s'])
  assert math.isfinite(s['speedup']) and s['speedup'] > 0
  assert all(v >= 0 for v in s['wall_seconds'].values())
  # Others' share of the machine, per timed part (None where a part was shorter than the meter resolves).
  assert set(s['others_cpu_share']) == {'timed_decoding', 'cost_measurement'}
  assert all(v is None or 0 <= v <= 1 for v in s['others_cpu_share'].values())
  with open(out / 'examples.jsonl', encoding='utf-8') as f:
    recs = [json.loads(line) for line in f]
  assert [r['index'] for r in recs] == [0, 1]
  for r, row in zip(recs, _fixture_rows(2)):
    assert r['identical'] and r['baseline_text'] == r['speculative_text']
    assert r['baseline_tokens'] == r['speculative_tokens']
    assert r['reference_text'] == row['targets']
    # With every draft kept, each target call emits γ + 1 tokens until the length budget runs out.
    assert r['judged'] == r['accepted'] and r['accepted_at'][0] == r['target_calls']
    assert r['emitted'] == r['speculative_tokens']
    assert r['target_calls'] == math.ceil(r['emitted'] / (SETTING.gamma + 1))
    assert r['padded_input_length'] == LENGTHS['inputs']  # length_buckets=False


def test_run_writes_outputs(first_run):
  s, out = first_run
  assert {'benchmark.json', 'benchmark.csv', 'benchmark.md', 'benchmark.png', 'examples.jsonl'} <= set(
      os.listdir(out))
  assert json.loads((out / 'benchmark.json').read_text())['speedup'] == pytest.approx(s['speedup'])
  assert len((out / 'benchmark.csv').read_text().strip().splitlines()) == 1 + 2
  assert '| identical greedy outputs | 100.0% (2/2) |' in (out / 'benchmark.md').read_text()


def test_run_resumes_and_tolerates_a_torn_line(first_run, tiny, copy_drafter, tmp_path, monkeypatch):
  _, first_out = first_run
  out = tmp_path / 'bench'
  shutil.copytree(first_out, out)
  before = [json.loads(line) for line in (out / 'examples.jsonl').read_text().splitlines()]
  with open(out / 'examples.jsonl', 'a', encoding='utf-8') as f:
    f.write('{"index": 2, "batch": 2, "baseline_s": 0.')  # an interrupted write
  timed = []
  real_timed = benchmark.timed

  def counting_timed(fn, *args):
    timed.append(fn)
    return real_timed(fn, *args)

  monkeypatch.setattr(benchmark, 'timed', counting_timed)
  s = _run(tiny, copy_drafter, out, max_examples=3)
  # Only the new example was measured: one baseline and one speculative decode (repeats=1).
  assert len(timed) == 2
  assert s['examples'] == 3 and s['identical_rate'] == 1.0 and s['alpha_accept'] == 1.0
  after = [json.loads(line) for line in (out / 'examples.jsonl').read_text().splitlines()]
  assert [r['index'] for r in after] == [0, 1, 2]
  assert after[:2] == before  # the earlier measurements are kept as they were
  assert after[2]['reference_text'] == _fixture_rows(3)[2]['targets']
  assert len((out / 'benchmark.csv').read_text().strip().splitlines()) == 1 + 3
  # A third run with nothing new measures nothing.
  timed.clear()
  assert _run(tiny, copy_drafter, out, max_examples=3)['examples'] == 3
  assert not timed


def test_run_records_its_fingerprint(first_run):
  s, out = first_run
  recorded = fingerprint.read(str(out))
  assert s['fingerprint'] == recorded
  assert recorded == fingerprint.normalised(benchmark.fingerprint_fields(
      tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, SETTING, 2, 'copy'))
  assert recorded['outputs'] == 'benchmark' and recorded['code_version'] == benchmark.RECORDS_VERSION
  assert recorded['gamma'] == 2 and recorded['repeats'] == 1 and recorded['max_examples'] == 2


@pytest.mark.parametrize('changes, fewer, expected', [
    ({'gamma': 3}, False, 'gamma 2 -> 3'),
    ({'temperature': 1.0}, False, 'temperature 0.0 -> 1.0'),
    ({'repeats': 2}, False, 'repeats 1 -> 2'),
    ({'seed': 5}, False, 'seed 0 -> 5'),
    ({'draft_confidence': 0.5}, False, 'draft_confidence 0.0 -> 0.5'),
    ({}, True, 'max_examples 2 -> 1 (it holds up to 2 examples'),
])
def test_run_refuses_to_resume_another_configuration(first_run, tiny, copy_drafter, tmp_path, monkeypatch,
                                                     changes, fewer, expected):
  _, first_out = first_run
  out = tmp_path / 'bench'
  shutil.copytree(first_out, out)
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  monkeypatch.setattr(benchmark, 'timed', lambda *args: pytest.fail('decoded before refusing'))
  setting = dataclasses.replace(SETTING, **changes)
  with pytest.raises(fingerprint.ResumeRefused) as e:
    _run(tiny, copy_drafter, out, max_examples=1 if fewer else 2, setting=setting)
  assert expected in str(e.value) and str(e.value).endswith(f'; {fingerprint.MAIN_REMEDY}.')
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_run_refuses_other_models_and_old_outputs_and_overwrite_measures_afresh(first_run, tiny, copy_drafter,
                                                                               tmp_path):
  _, first_out = first_run
  out = tmp_path / 'bench'
  shutil.copytree(first_out, out)
  module, params = tiny
  drafter_module, drafter_params = copy_drafter
  run = lambda **kwargs: benchmark.run(benchmark.ModelPair(module, params, drafter_module, drafter_params, 'copy'),
                                       benchmark.TaskSplit(tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, 2), SETTING,
                                       benchmark.Output(str(out), write_plot=False, **kwargs),
                                       benchmark.Measuring(measure_in_loop=False))
  with pytest.raises(fingerprint.ResumeRefused, match=r"target_checkpoint None -> 'models/x'.*; do Y\.$"):
    run(provenance={'target_checkpoint': 'models/x'}, remedy='do Y')
  os.remove(out / fingerprint.FILE_NAME)
  with pytest.raises(fingerprint.ResumeRefused, match='holds examples.jsonl, benchmark.json, .* without a '
                                                       'fingerprint.json'):
    run()
  (out / 'notes.txt').write_text('mine')
  s = run(provenance={'target_checkpoint': 'models/x'}, overwrite=True)
  assert s['examples'] == 2 and s['fingerprint']['target_checkpoint'] == 'models/x'
  assert not (out / 'benchmark.png').exists()  # the old plot went with the old outputs (this run writes none)
  assert (out / 'notes.txt').read_text() == 'mine'


def test_run_rejects_bad_settings_before_decoding(tiny, copy_drafter, tmp_path):
  """`run` checks its setting first (each bad setting's words: settings_test.py)."""
  out = tmp_path / 'never'
  with pytest.raises(ValueError, match='gamma must be an int >= 1, got 0'):
    _run(tiny, copy_drafter, out, max_examples=1, setting=settings.Setting(gamma=0))
  assert not out.exists()  # nothing was set up, let alone decoded


def test_run_rejects_vocab_mismatch_before_decoding(tiny, tmp_path):
  config = tiny_config(vocab_size=64)
  drafter = (network.Transformer(config), None)  # never used: the check comes first
  out = tmp_path / 'never'
  with pytest.raises(ValueError, match='Vocabulary mismatch.*8192.*64'):
    _run(tiny, drafter, out, max_examples=1)
  assert not out.exists()




def test_validate_accepts_a_matching_pair_and_names_a_mismatch(tiny, copy_drafter):
  module, params = tiny
  benchmark.validate(benchmark.ModelPair(module, params, *copy_drafter), SETTING)
  other = network.Transformer(tiny_config(vocab_size=64))
  with pytest.raises(ValueError, match='Vocabulary mismatch.*8192.*64'):
    benchmark.validate(benchmark.ModelPair(module, params, other, None), SETTING)
  head = feature_drafter.FeatureHead(feature_drafter.FeatureHeadConfig(
      feature_dim=module.config.emb_dim + 1, vocab_size=module.config.vocab_size))
  with pytest.raises(ValueError, match='reads'):
    benchmark.validate(benchmark.ModelPair(module, params, head, None), SETTING)


def test_load_examples_reads_the_first_examples_of_the_split(fixture_tasks):
  del fixture_tasks
  examples = benchmark.load_examples(benchmark.TaskSplit(tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, 2))
  assert [e['targets_pretokenized'].decode('utf-8') for e in examples] == [r['targets'] for r in _fixture_rows(2)]


def test_compile_decoders_pairs_each_decoder_with_its_params(tiny, copy_drafter):
  module, params = tiny
  drafter_module, drafter_params = copy_drafter
  decoders = benchmark.compile_decoders(benchmark.ModelPair(module, params, drafter_module, drafter_params),
                                        None, SETTING)
  assert decoders.base_params == {'target': params}
  assert decoders.params == {'target': params, 'drafter': drafter_params}
  assert decoders.eos_id == EOS and callable(decoders.base_predict) and callable(decoders.spec_predict)


def test_run_with_a_trimmed_feature_head(tiny, fixture_tasks, tmp_path):
  """A feature head with a trimmed vocabulary is benchmarked like any drafter: exact, its costs measured."""
  del fixture_tasks
  module, params = tiny
  head_config = feature_drafter.FeatureHeadConfig(feature_dim=module.config.emb_dim,
                                                  vocab_size=module.config.vocab_size, width=8, num_heads=2,
                                                  head_dim=4, mlp_dim=16)
  head_params = feature_drafter.init_params(head_config, jax.random.PRNGKey(5))
  s = benchmark.run(
      benchmark.ModelPair(module, params, feature_drafter.FeatureHead(head_config), head_params, 'head',
                          draft_vocab_ids=np.arange(1, module.config.vocab_size, 2)),
      benchmark.TaskSplit(tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, 1), SETTING,
      benchmark.Output(str(tmp_path / 'head'), write_plot=False), benchmark.Measuring(measure_in_loop=True))
  assert s['identical_rate'] == 1.0 and s['mismatches'] == []
  assert s['costs']['c'] > 0 and s['in_loop']['draft_s'] > 0
