"""Tests for specdec/bench/reporting.py: α from the loop's statistics, the benchmark's summary, CSV and Markdown, on
hand-made numbers worked out by hand (tests/benchmark_records.py)."""

import json
import math
import os

import pytest

from specdec.bench import benchmark
from specdec.bench import reporting
from specdec import settings
from specdec import theory
from tests import benchmark_records as hand


# -----------------------------------------------------------------------------
# fmt, steps_per_batch
# -----------------------------------------------------------------------------


def test_fmt():
  assert reporting.fmt(1.234) == '1.23'
  assert reporting.fmt(0.5, '.0%') == '50%'
  assert reporting.fmt(None) == '-'
  assert reporting.fmt(float('nan'), none='unreachable') == 'unreachable'


def test_finite_or_none():
  assert reporting.finite_or_none(1.5) == 1.5
  assert reporting.finite_or_none(float('nan')) is None and reporting.finite_or_none(math.inf) is None


def test_steps_per_batch_pads_short_batches_with_rows_of_no_steps():
  got = reporting.steps_per_batch([([6, 5], [2, 3]), ([4], [1])], batch_size=2)
  assert got == [([6, 5], [2, 3]), ([4, 0], [1, 0])]


def test_batch_heads_keeps_the_first_record_of_each_batch():
  assert [r['index'] for r in reporting.batch_heads(hand.records())] == [0, 2]


# -----------------------------------------------------------------------------
# The benchmark's summary and Markdown
# -----------------------------------------------------------------------------


def test_summarize_batched_predicts_each_shrinking_stage():
  by_rows = {2: hand.in_loop(1.0, 2.0, 0.5, 1.0), 1: hand.in_loop(0.5, 1.0, 0.3, 0.6)}
  s = reporting.summarize_benchmark(hand.records(), hand.COSTS, settings.Setting(gamma=hand.GAMMA, batch_size=2),
                                    by_rows)
  # Batch 0 (tokens 6, 5; calls 2, 3): baseline 1 + 5 steps at 2 rows + 1 at 1 row = 3.8, speculative
  # 2 + 2 rounds at 2 rows + 1 at 1 row = 4.6. Batch 1 (one row, padded with a row of no steps): 1 + 4·0.3
  # = 2.2 and 2 + 0.6 = 2.6.
  assert s['predicted_speedup_in_loop'] == pytest.approx(6.0 / 7.2)
  assert s['in_loop'] == by_rows[2] and set(s['in_loop_by_rows']) == {'2', '1'}
  assert s['fitted'] is None  # batch times are not per example
  full = hand.full_summary(hand.records())
  full.update(in_loop=s['in_loop'], in_loop_by_rows=s['in_loop_by_rows'],
              predicted_speedup_in_loop=s['predicted_speedup_in_loop'])
  text = reporting.benchmark_markdown(full)
  assert '| baseline step / speculative round at 2, 1 rows | 500.00 / 1000.00, 300.00 / 600.00 ms |' in text


def test_summarize_hand_made_records():
  s = reporting.summarize_benchmark(hand.records(), hand.COSTS, settings.Setting(gamma=hand.GAMMA, temperature=0.0))
  assert s['examples'] == 3
  assert s['baseline_seconds'] == pytest.approx(0.7)
  assert s['speculative_seconds'] == pytest.approx(0.45)
  assert s['speedup'] == pytest.approx(0.7 / 0.45)
  assert s['median_example_speedup'] == pytest.approx((2.0 + 1.2) / 2)
  assert s['baseline_ms_per_example'] == pytest.approx(350.0)
  assert s['speculative_ms_per_example'] == pytest.approx(225.0)
  assert s['baseline_tokens'] == s['speculative_tokens'] == 15
  assert s['baseline_tokens_per_s'] == pytest.approx(15 / 0.7)
  assert s['speculative_tokens_per_s'] == pytest.approx(15 / 0.45)
  # α two ways: kept / judged drafts (10 / 13) and Σ min(p, q) / verified positions (9.5 / 13).
  alpha = 10 / 13
  assert s['alpha_accept'] == pytest.approx(alpha)
  assert s['alpha_overlap'] == pytest.approx(9.5 / 13)
  assert s['accepted_per_drafted'] == pytest.approx(10 / 18)
  assert s['target_calls'] == 6
  assert s['tokens_per_target_call'] == pytest.approx(16 / 6)
  # accepted_at sums to [5, 3, 2]: P(position 0 kept) = 5 / 6 target calls, then 3 / 5, then 2 / 3.
  assert s['acceptance_per_position'] == pytest.approx([5 / 6, 3 / 5, 2 / 3])
  # Predictions from specdec.theory with the measured α and costs, and in closed form.
  assert s['predicted_speedup_thm38'] == pytest.approx(float(theory.expected_speedup(alpha, hand.GAMMA, 0.2)))
  assert s['predicted_speedup_thm38'] == pytest.approx((1 - alpha ** 4) / (1 - alpha) / (3 * 0.2 + 1))
  from_costs = (1 - alpha ** 4) / (1 - alpha) * 0.010 / (3 * 0.002 + 0.012)
  assert s['predicted_speedup_costs'] == pytest.approx(from_costs)
  assert s['predicted_speedup_costs'] == pytest.approx(float(theory.predicted_speedup_from_costs(
      alpha, hand.GAMMA, 0.002, 0.010, 0.012)))
  assert s['measured_over_predicted'] == pytest.approx((0.7 / 0.45) / from_costs)
  assert s['expected_tokens_per_call'] == pytest.approx((1 - alpha ** 4) / (1 - alpha))
  assert (s['drafted'], s['judged'], s['accepted']) == (18, 13, 10)
  # The α at which this γ and these costs give 1.5× / 2×: the costs' prediction there hits the target.
  for target in (1.5, 2.0):
    needed = s['alpha_needed'][str(target)]
    assert 0 < needed < 1
    assert float(theory.predicted_speedup_from_costs(needed, hand.GAMMA, 0.002, 0.010, 0.012)) == pytest.approx(
        target, rel=1e-6)
  assert s['identical_rate'] == pytest.approx(2 / 3)
  assert s['mismatches'] == [dict(index=1, **hand.MISMATCH)]


def test_summarize_sampling_and_unreached_positions():
  # Nothing kept: position 0 is reached by every call, later positions by none (None, not 0 or NaN).
  rec = hand.record(0, 0, 0.1, 0.2, calls=4, accepted_at=[0, 0, 0], judged=4, drafted=12, emitted=4,
                overlap_sum=1.0, overlap_count=4, tokens=4)
  s = reporting.summarize_benchmark([rec], hand.COSTS, settings.Setting(gamma=hand.GAMMA, temperature=1.0))
  assert s['acceptance_per_position'] == [0.0, None, None]
  assert s['alpha_accept'] == 0.0
  assert s['tokens_per_target_call'] == 1.0
  assert s['speedup'] == pytest.approx(0.5)
  assert s['identical_rate'] is None  # not defined when sampling
  assert s['mismatches'] == []
  json.dumps(s, allow_nan=False)  # strictly JSON-serialisable


def test_markdown():
  s = hand.full_summary(hand.records())
  text = reporting.benchmark_markdown(s)
  assert text.startswith('# Benchmark: specdec_ende_local:test, drafter d1, γ=3, temperature 0, batch 2\n')
  assert '| examples | 3 |' in text
  assert f"**{0.7 / 0.45:.2f}×**" in text  # **1.56×**
  assert f"| α (accepted / judged) | {10 / 13:.3f} |" in text
  assert f"| α (E[Σ min(p, q)]) | {9.5 / 13:.3f} |" in text
  assert '| acceptance per draft position | 0.83, 0.60, 0.67 |' in text
  assert '| c = drafter call / target call | 0.200 (2.000 / 10.000 ms) |' in text
  needed = s['alpha_needed']
  assert f"| α needed at this γ and these costs for 1.5× / 2× | {needed['1.5']:.2f} / {needed['2.0']:.2f} |" in text
  assert '| identical greedy outputs | 66.7% (2/3) |' in text
  assert '| quality, baseline | bleu 12.50 |' in text
  assert '| quality, speculative | bleu 12.25 |' in text
  assert '## Greedy mismatches' in text
  assert '| 1 | 4 | 11 | 12 | 3.00e-07 | 3.00e-07 |' in text
  assert '`python -m specdec.main`' in text


def test_markdown_sampling_has_no_identity_or_mismatch_section():
  recs = [r for r in hand.records() if r['identical']]
  text = reporting.benchmark_markdown(hand.full_summary(recs, temperature=1.0))
  assert 'temperature 1,' in text
  assert 'identical greedy outputs' not in text
  assert 'Greedy mismatches' not in text


def test_summarize_unreachable_target_is_none_and_markdown_says_so():
  # c = 0.9 with verify = 3 target calls: no α reaches 2× at γ = 3 (4 tokens per call cannot pay 2 × 5.7).
  costs = dict(hand.COSTS, c=0.9, draft_call_s=0.009, verify_call_s=0.030, verify_cost_ratio=3.0)
  s = reporting.summarize_benchmark(hand.records(), costs, settings.Setting(gamma=hand.GAMMA, temperature=0.0))
  assert s['alpha_needed']['2.0'] is None
  json.dumps(s, allow_nan=False)


def test_run_command_is_relative_to_the_repository(tmp_path, monkeypatch):
  package = os.path.dirname(os.path.dirname(benchmark.__file__))
  main_py = os.path.join(package, 'main.py')
  assert reporting.run_command([main_py, "--gin.X='y'"]) == "python -m specdec.main --gin.X='y'"
  train_py = os.path.join(package, 'training', 'train.py')
  assert reporting.run_command([train_py, '--gin_file=f.gin']) == 'python -m specdec.training.train --gin_file=f.gin'
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'scripts').mkdir()
  assert reporting.run_command([str(tmp_path / 'scripts' / 'ablate.py'), 'gamma']) == (
      'python scripts/ablate.py gamma')


def test_summarize_fits_the_real_loop_costs_at_batch_1():
  # Baseline 2 ms + 1 ms/token, speculative 3 ms + 2.5 ms/round: a real round costs 2.5 baseline tokens.
  records = [hand.record(i, i, 0.002 + 0.001 * tokens, 0.003 + 0.0025 * calls, calls=calls, accepted_at=[0, 0, 0],
                     judged=calls, drafted=calls, emitted=tokens, overlap_sum=0.0, overlap_count=calls,
                     tokens=tokens)
             for i, (tokens, calls) in enumerate(((10, 4), (20, 7), (6, 3)))]
  for r in records:
    r['batch_rows'] = 1
  s = reporting.summarize_benchmark(records, hand.COSTS, settings.Setting(gamma=hand.GAMMA, temperature=0.0))
  assert s['fitted']['round_in_baseline_tokens'] == pytest.approx(2.5)
  assert s['fitted']['speculative_fixed_s'] == pytest.approx(0.003)
  assert s['fitted']['tokens_per_round'] == pytest.approx(36 / 14)
  s.update(hand.full_summary(records))
  assert '| the real loop (fitted over the examples): round / baseline token | 2.50 (2.500 / 1.000 ms)' in (
      reporting.benchmark_markdown(s))
  # Batches of two rows share one wall time: no fit.
  batched = reporting.summarize_benchmark(hand.records(), hand.COSTS, settings.Setting(gamma=hand.GAMMA))
  assert batched['fitted'] is None


def test_benchmark_csv():
  text = reporting.benchmark_csv(hand.records())
  lines = text.splitlines()
  assert text.endswith('\n') and lines[0] == ','.join(reporting.BENCHMARK_CSV_FIELDS)
  assert lines[2] == '1,11,16,0.4,0.2,5,5,False,3,9,5,3,6'


def test_machine_info_names_the_backend():
  info = reporting.machine_info()
  assert info['cpu_count'] == os.cpu_count() and info['backend'] and info['devices']


def test_machine_info_keeps_the_xla_flags_and_headers_name_them(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_multi_thread_eigen=false')
  info = reporting.machine_info()
  assert info['xla_flags'] == '--xla_cpu_multi_thread_eigen=false'
  assert reporting.xla_flags_note(info) == ' · XLA_FLAGS `--xla_cpu_multi_thread_eigen=false`'
  assert reporting.xla_flags_note({**info, 'xla_flags': ''}) == ''
  assert reporting.xla_flags_note({'processor': 'x86_64'}) == ''  # records written before the field existed
  summary = hand.full_summary(hand.records())
  assert summary['machine']['xla_flags'] == '--xla_cpu_multi_thread_eigen=false'
  assert 'XLA_FLAGS `--xla_cpu_multi_thread_eigen=false`' in reporting.benchmark_markdown(summary)
  summary['machine'] = {**info, 'xla_flags': ''}
  assert 'XLA_FLAGS' not in reporting.benchmark_markdown(summary)
