"""Tests for specdec/bench/peers.py and scripts/peer_benchmark.py: specdec beside HF assisted generation.

The pure parts (HF outputs in our layout, generate's arguments, assistant settings) are checked on hand-made
data (the rows and the report's arithmetic: peers_report_test.py); a tiny end-to-end run (random 1-layer networks exported to HF in a temp dir, 2 examples of the
embedded test slices, greedy and temperature 1) checks that greedy outputs agree across frameworks and
decoders, that the call and token counts add up, that the per-call costs ("where the time goes") are measured,
and that the report files are written.
"""

import importlib.util
import json
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from specdec.bench import benchmark
from specdec import checkpoints
from specdec import evaluation
from specdec import hf_export
from specdec import network
from specdec.bench import peers
from specdec.bench import peers_report
from specdec import tasks

TEST_SLICES = os.path.join(tasks.PACKAGE_DIR, 'assets', 'test_slices')
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'scripts',
                      'peer_benchmark.py')
# The shipped vocabulary has 8100 ids; the networks need at least as many embeddings.
VOCAB = 8192
LENGTHS = {'inputs': 32, 'targets': 8}
GAMMA = 3


def _config():
  return network.T5Config(vocab_size=VOCAB, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                          num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0)


def _random_params(config, seed, scale=0.5):
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map(lambda s: rng.normal(0, scale, s.shape).astype(np.float32),
                                checkpoints.expected_params(config))


# -----------------------------------------------------------------------------
# Pure parts.
# -----------------------------------------------------------------------------


def test_hf_decode_row_drops_the_start_token_and_pads():
  np.testing.assert_array_equal(peers.hf_decode_row(np.array([0, 5, 6, 1]), 6), [5, 6, 1, 0, 0, 0])
  np.testing.assert_array_equal(peers.hf_decode_row(np.array([0, 5, 6, 7, 8]), 3), [5, 6, 7])


def test_generate_kwargs_match_our_decoding():
  greedy = peers.hf_generate_kwargs(0.0, 12)
  assert greedy == {'max_new_tokens': 12, 'num_beams': 1, 'use_cache': True, 'do_sample': False}
  sample = peers.hf_generate_kwargs(1.0, 12)
  # top_k=0: plain sampling as ours (HF's default top_k is 50).
  assert sample['do_sample'] and sample['top_k'] == 0 and sample['temperature'] == 1.0 and sample['top_p'] == 1.0


def test_assistant_settings_are_written_where_transformers_reads_them():
  constant = peers.assistant_setting('constant', 4)
  assert constant == peers.AssistantSetting('constant', 4, 'constant', 0.0)
  assert peers.assistant_setting('hf_default', 4) == peers.AssistantSetting('hf_default', 20, 'constant', 0.4)
  assert peers.assistant_setting('heuristic', 4).num_assistant_tokens_schedule == 'heuristic'
  with pytest.raises(ValueError, match="Unknown HF assistant setting 'fast'"):
    peers.assistant_setting('fast', 4)

  class Drafter:
    generation_config = transformers.GenerationConfig()
  peers.apply_assistant_setting(Drafter, constant)
  config = Drafter.generation_config
  assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule,
          config.assistant_confidence_threshold) == (4, 'constant', 0.0)


def test_without_transformers_the_error_names_the_extra(monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, 'transformers', None)  # `import transformers` raises ImportError
  with pytest.raises(ImportError, match=r"pip install -e '\.\[peers\]'"):
    peers.require_peers()
  assert _script().main(['--examples', '1']) == 1
  assert "pip install -e '.[peers]'" in capsys.readouterr().err


def _script():
  spec = importlib.util.spec_from_file_location('peer_benchmark', SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_call_counter_counts_decoder_calls(tmp_path):
  config = _config()
  directory = hf_export.save_hf(str(tmp_path), config, _random_params(config, 0))
  model = transformers.T5ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
  counter = peers.CallCounter(model)
  ids = torch.tensor([[5, 6, 7, 1]])
  with torch.no_grad():
    out = model.generate(input_ids=ids, **peers.hf_generate_kwargs(0.0, 6))
  tokens = out.shape[1] - 1
  assert counter.calls == tokens and counter.tokens == tokens  # one 1-token decoder call per token
  counter.remove()
  with torch.no_grad():
    model.generate(input_ids=ids, **peers.hf_generate_kwargs(0.0, 6))
  assert counter.calls == tokens


# -----------------------------------------------------------------------------
# A tiny end-to-end run.
# -----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def peer_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('peers')
  config = _config()
  target_params = _random_params(config, 0)
  # The drafter: the target with noise, so it agrees with the target on some tokens and not on others.
  noise = _random_params(config, 1, scale=0.3)
  drafter_params = jax.tree_util.tree_map(lambda a, b: a + b, target_params, noise)
  for name, params in (('target', target_params), ('drafter', drafter_params)):
    checkpoints.save_compact(str(root / name), config, params, storage_dtype=jnp.float32)
  tasks.register_local_tasks(corpus_dir=TEST_SLICES)
  try:
    summary = peers.run(str(root / 'target'), str(root / 'drafter'),
                        benchmark.TaskSplit(tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, max_examples=2),
                        peers.PeerSetting(
                            gamma=GAMMA, temperatures=(0.0, 1.0), hf_settings=('constant', 'hf_default'),
                            # No adaptive row (draft_confidence=0): every decoder of ours is one more compile.
                            draft_confidence=0.0, repeats=1, length_buckets=False,
                            # One torch thread: on a busy test machine more spin against XLA's (timing is moot).
                            torch_threads=1),
                        # Per-call costs of both examples, briefly.
                        call_costs=peers.CallCostSetting(repeats=2, num_calls=4),
                        output=peers.PeerOutput(str(root / 'out'), run_name='tiny', log=lambda _: None))
  finally:
    tasks.register_local_tasks()
  return summary, str(root / 'out')


def _rows(summary):
  return {(r['temperature'], r['framework'], r['system']): r for r in summary['rows']}


def test_greedy_outputs_identical(peer_run):
  summary, _ = peer_run
  identity = summary['identity']
  assert identity['hf_vs_ours_baseline'] == 1.0 and identity['mismatches'] == []
  assert identity['speculative_vs_baseline'] == {
      'hf:assisted:constant vs own baseline': 1.0, 'hf:assisted:hf_default vs own baseline': 1.0,
      'ours:speculative vs own baseline': 1.0}


def test_every_system_at_both_temperatures(peer_run):
  summary, _ = peer_run
  assert set(_rows(summary)) == {
      (t, f, s) for t in (0.0, 1.0) for f, s in (
          ('hf', 'baseline'), ('hf', 'assisted:constant'), ('hf', 'assisted:hf_default'),
          ('ours', 'baseline'), ('ours', 'speculative'))}
  assert summary['examples'] == 2
  for r in summary['rows']:
    assert r['examples'] == 2 and r['seconds'] > 0 and r['tokens_per_s'] > 0
    assert r['speedup_vs_own_baseline'] > 0
  rows = _rows(summary)
  assert rows[(0.0, 'hf', 'assisted:constant')]['settings'] == {
      'temperature': 0.0, 'name': 'constant', 'num_assistant_tokens': GAMMA,
      'num_assistant_tokens_schedule': 'constant', 'assistant_confidence_threshold': 0.0}
  assert rows[(0.0, 'hf', 'assisted:hf_default')]['settings']['num_assistant_tokens'] == 20
  assert rows[(0.0, 'ours', 'speculative')]['settings'] == {
      'temperature': 0.0, 'topk': 0, 'topp': 0.0, 'gamma': GAMMA}
  assert summary['threads'] == {'torch_num_threads': 1, 'xla_cpu_threads': os.cpu_count()}


def test_counts_add_up(peer_run):
  summary, _ = peer_run
  records = summary['records']
  for t in ('0', '1'):
    for framework in ('hf', 'ours'):
      for r in records[f'{t}/{framework}:baseline']:  # one target call per token
        assert r['target_calls'] == r['tokens'] >= 1
    for r in records[f'{t}/hf:assisted:constant'] + records[f'{t}/ours:speculative']:
      assert r['drafted'] <= GAMMA * r['target_calls']
      assert r['accepted'] <= r['drafted']
      assert r['target_calls'] <= r['tokens']
    for r in records[f'{t}/hf:assisted:constant'] + records[f'{t}/hf:assisted:hf_default']:
      assert r['tokens'] == r['accepted'] + r['target_calls']  # each call: its kept drafts + one token
      assert r['drafter_calls'] >= r['drafted']
  # The noisy drafter: some drafts kept, some rejected.
  ours = records['0/ours:speculative']
  assert 0 < sum(r['accepted'] for r in ours) < sum(r['drafted'] for r in ours)
  # HF's rounds beside ours (not asserted equal: transformers 5.24's assistant can draft differently, see
  # peers.DRAFTS_NOTE).
  calls = summary['identity']['constant_calls']
  assert calls['examples'] == 2 and calls['ours_target_calls'] == [r['target_calls'] for r in ours]
  assert calls['hf_target_calls'] == [r['target_calls'] for r in records['0/hf:assisted:constant']]


def test_report_files(peer_run):
  summary, out = peer_run
  with open(os.path.join(out, 'tiny.json')) as f:
    written = json.load(f)
  assert written['rows'] == json.loads(json.dumps(summary['rows']))
  with open(os.path.join(out, 'tiny.md')) as f:
    text = f.read()
  assert text.startswith('# Peer benchmark')
  assert 'HF greedy vs specdec greedy (baselines): **100.0%** identical (2/2)' in text
  assert '| 0 | hf | assisted:constant |' in text
  assert os.path.getsize(os.path.join(out, 'tiny.png')) > 1000
  assert {(p['ours'], p['hf']) for p in summary['ratios'] if p['temperature'] == 0} == {
      ('baseline', 'baseline'), ('speculative', 'assisted:constant'), ('speculative', 'assisted:hf_default')}
  assert all(math.isfinite(p['ratio']) for p in summary['ratios'])


def test_ours_batched_rows_and_their_report(peer_run):
  """Ours at batch 2 over 3 examples (the last batch padded): greedy speculative = baseline, token for token."""
  summary, _ = peer_run
  config = _config()
  target = network.Transformer(config)
  params = {'target': _random_params(config, 0), 'drafter': _random_params(config, 1)}
  tasks.register_local_tasks(corpus_dir=TEST_SLICES)
  try:
    vocab = tasks.get_vocabulary()
    examples = evaluation.task_examples(tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, 3)
  finally:
    tasks.register_local_tasks()
  rows = peers.time_ours_batched(peers.ours_models(target, target, vocab), params, examples, LENGTHS, GAMMA,
                                 (0.0,), seed=0, batch_size=2, length_buckets=False, eos_id=1)
  assert [(r['system'], r['batch_size']) for r in rows] == [('baseline@batch2', 2), ('speculative@batch2', 2)]
  assert rows[0]['tokens'] == rows[1]['tokens'] > 0 and all(r['tokens_per_s'] > 0 for r in rows)
  text = peers_report.markdown(dict(summary, batched=rows, ours_batch_size=2))
  assert '## Ours at batch 2 vs HF at batch 1 × 2' in text and '| 0 | speculative@batch2 |' in text


# -----------------------------------------------------------------------------
# Where the time goes: per-call costs.
# -----------------------------------------------------------------------------


def test_hf_decoder_inputs():
  np.testing.assert_array_equal(peers.hf_decoder_inputs([5, 6, 1, 0], 6), [0, 5, 6, 1, 0, 0])
  np.testing.assert_array_equal(peers.hf_decoder_inputs([5, 6, 7, 8], 3), [0, 5, 6])


def test_hf_crop_restores_the_cache_between_timed_calls(tmp_path):
  """A cached call after `hf_crop` sees the prefix again: its logits match a teacher-forced full call."""
  config = _config()
  directory = hf_export.save_hf(str(tmp_path), config, _random_params(config, 0))
  model = transformers.T5ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
  ids = torch.tensor([[5, 6, 7, 8, 1]])
  mask = torch.ones_like(ids)
  dec = torch.tensor([[0, 11, 12, 13, 14, 15, 16, 17]])
  with torch.inference_mode():
    encoded = model.get_encoder()(input_ids=ids, attention_mask=mask)
    full = model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=dec).logits
    cache = peers._hf_output_cache(model(encoder_outputs=encoded, attention_mask=mask,
                                         decoder_input_ids=dec[:, :4], use_cache=True))
    keyword = peers._hf_cache_keyword(model)
    for k in (1, 4, 1):  # each call from the same 4-position state
      out = model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=dec[:, 4:4 + k], use_cache=True,
                  **{keyword: cache})
      assert cache.get_seq_length() == 4 + k
      np.testing.assert_allclose(out.logits.numpy(), full[:, 4:4 + k].numpy(), atol=1e-5)
      peers.hf_crop(cache, 4)
      assert cache.get_seq_length() == 4
    peers.hf_crop(cache, 6)  # nothing to cut
    assert cache.get_seq_length() == 4
  costs = peers.hf_call_costs(torch, model, model, [5, 6, 7, 8, 1], dec[0].numpy(), position=4, gamma=3,
                              repeats=1)
  assert set(costs) == set(peers.CALL_KINDS) and all(v > 0 for v in costs.values())
  with pytest.raises(ValueError, match='need position'):
    peers.hf_call_costs(torch, model, model, [5, 1], dec[0].numpy(), position=5, gamma=3, repeats=1)


def test_call_costs_in_the_run(peer_run):
  summary, out = peer_run
  costs = summary['call_costs']
  assert costs['examples'] == [0, 1] and costs['repeats'] == 2 and costs['ours_calls_per_repeat'] == 4
  assert costs['position'] == LENGTHS['targets'] - GAMMA - 1  # capped: 8 target tokens
  for framework in ('hf', 'ours'):
    assert set(costs['ms'][framework]) == set(peers.CALL_KINDS)
    assert all(math.isfinite(v) and v > 0 for v in costs['ms'][framework].values())
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in costs['per_example_ms'][framework].values())
  for group in costs['ratios'].values():
    assert all(math.isfinite(v) and v > 0 for v in group.values())
  per_token = {(t['temperature'], t['framework'], t['system']): t for t in costs['per_token']}
  assert set(per_token) == set(_rows(summary))
  for key, t in per_token.items():
    row = _rows(summary)[key]
    assert t['measured_ms_per_token'] == pytest.approx(1000 * row['seconds'] / row['tokens'])
    assert t['model_ms_per_token'] > 0 and math.isfinite(t['overhead_ms_per_token'])
    assert t['model_ms_per_token'] + t['overhead_ms_per_token'] == pytest.approx(t['measured_ms_per_token'])
    assert (t['drafter_ms_per_token'] > 0) == (key[2] != 'baseline')
  with open(os.path.join(out, 'tiny.json')) as f:
    assert json.load(f)['call_costs'] == json.loads(json.dumps(costs))
  with open(os.path.join(out, 'tiny.md')) as f:
    text = f.read()
  assert '## Where the time goes (per-call costs, batch 1)' in text
  assert f"| target decoder, verify: γ+1 = {GAMMA + 1} tokens (cached) |" in text
  assert "HF's 1-token target step costs" in text and 'At t = 0, ours speculative makes' in text
  assert '| 0 | hf | assisted:constant |' in text.split('## Where the time goes')[1]


def test_call_costs_off(tmp_path, monkeypatch):
  """call_costs=False: nothing measured, no section, null in the JSON; old summaries without the key render."""
  config = _config()
  for name, seed in (('target', 0), ('drafter', 1)):
    checkpoints.save_compact(str(tmp_path / name), config, _random_params(config, seed), storage_dtype=jnp.float32)

  def fail(*args, **kwargs):
    raise AssertionError('measured with call_costs=False')
  monkeypatch.setattr(peers, 'measure_call_costs', fail)
  tasks.register_local_tasks(corpus_dir=TEST_SLICES)
  try:
    summary = peers.run(str(tmp_path / 'target'), str(tmp_path / 'drafter'),
                        benchmark.TaskSplit(tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, max_examples=1),
                        peers.PeerSetting(gamma=GAMMA, temperatures=(0.0,), hf_settings=('constant',),
                                          draft_confidence=0.0, length_buckets=False, torch_threads=1),
                        call_costs=peers.CallCostSetting(measure=False),
                        output=peers.PeerOutput(str(tmp_path / 'out'), run_name='off', write_plot=False,
                                                log=lambda _: None))
  finally:
    tasks.register_local_tasks()
  assert summary['call_costs'] is None
  with open(tmp_path / 'out' / 'off.json') as f:
    assert json.load(f)['call_costs'] is None
  with open(tmp_path / 'out' / 'off.md') as f:
    assert 'Where the time goes' not in f.read()
  old = {k: v for k, v in summary.items() if k != 'call_costs'}
  assert 'Where the time goes' not in peers_report.markdown(old)
  with pytest.raises(ValueError, match='call_cost_examples'):
    peers.run(str(tmp_path / 'target'), str(tmp_path / 'drafter'),
              benchmark.TaskSplit(tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, max_examples=1), peers.PeerSetting(GAMMA),
              call_costs=peers.CallCostSetting(examples=0))


def test_script_flag_switches_call_costs_off(monkeypatch, tmp_path):
  script = _script()
  assert not script.parse_args([]).no_call_costs and script.parse_args(['--no_call_costs']).no_call_costs
  seen = []

  def fake_run(*args, **kwargs):
    seen.append(kwargs['call_costs'].measure)
    return {'rows': [], 'identity': {}, 'call_costs': None}
  monkeypatch.setattr(peers, 'run', fake_run)
  monkeypatch.setattr(tasks, 'register_local_tasks', lambda *a, **k: None)
  argv = ['--out', str(tmp_path), '--run', 'peers']
  assert script.main(argv) == 0 and script.main(argv + ['--no_call_costs']) == 0
  assert seen == [True, False]


@pytest.mark.parametrize('setting, call_costs, match', [
    (peers.PeerSetting(gamma=0), peers.CallCostSetting(), 'gamma'),
    (peers.PeerSetting(gamma=True), peers.CallCostSetting(), 'gamma'),
    (peers.PeerSetting(gamma=2, repeats=0), peers.CallCostSetting(), 'repeats'),
    (peers.PeerSetting(gamma=2, temperatures=(0.5,)), peers.CallCostSetting(), 'temperatures'),
    (peers.PeerSetting(gamma=2, temperatures=()), peers.CallCostSetting(), 'temperatures'),
    (peers.PeerSetting(gamma=2), peers.CallCostSetting(num_calls=0), 'call_cost_num_calls=0'),
])
def test_validate_names_what_cannot_run(setting, call_costs, match):
  with pytest.raises(ValueError, match=match):
    peers.validate(setting, call_costs)


def test_validate_ignores_call_cost_fields_when_not_measured():
  peers.validate(peers.PeerSetting(gamma=2), peers.CallCostSetting(measure=False, examples=0))
