"""Hand-made benchmark records (the per-example dicts `benchmark.run` writes) and the summary built from them,
shared by reporting_test.py and benchmark_test.py. Three examples in two batches, numbers chosen to be worked
out by hand."""

from specdec.bench import reporting
from specdec import settings

GAMMA = 3
COSTS = {'target_call_s': 0.010, 'verify_call_s': 0.012, 'draft_call_s': 0.002, 'c': 0.2,
         'verify_cost_ratio': 1.2}
MISMATCH = {'position': 4, 'baseline_token': 11, 'speculative_token': 12, 'margin': 3e-7, 'top2_gap': 3e-7}


def record(index, batch, baseline_s, speculative_s, calls, accepted_at, judged, drafted, emitted, overlap_sum,
           overlap_count, tokens, identical=True):
  rec = {'index': index, 'batch': batch, 'input_length': 10 + index, 'padded_input_length': 16,
         'baseline_s': baseline_s, 'speculative_s': speculative_s, 'batch_rows': 1,
         'baseline_tokens': tokens, 'speculative_tokens': tokens, 'identical': identical,
         'target_calls': calls, 'drafted': drafted, 'judged': judged, 'accepted': int(sum(accepted_at)),
         'accepted_at': accepted_at, 'overlap_sum': overlap_sum, 'overlap_count': overlap_count,
         'emitted': emitted, 'baseline_text': 'x', 'speculative_text': 'x', 'reference_text': 'y'}
  if not identical:
    rec['mismatch'] = dict(MISMATCH)
  return rec


def records():
  # Batch 0 has two rows (batch wall times are stored on both), batch 1 one row: summing every record
  # instead of one per batch would give (0.8 + 0.3) / (0.4 + 0.25) = 1.69, not 0.7 / 0.45.
  return [
      record(0, 0, 0.4, 0.2, calls=2, accepted_at=[2, 1, 1], judged=5, drafted=6, emitted=6,
             overlap_sum=4.0, overlap_count=5, tokens=6),
      record(1, 0, 0.4, 0.2, calls=3, accepted_at=[2, 1, 0], judged=5, drafted=9, emitted=6,
             overlap_sum=3.0, overlap_count=5, tokens=5, identical=False),
      record(2, 1, 0.3, 0.25, calls=1, accepted_at=[1, 1, 1], judged=3, drafted=3, emitted=4,
             overlap_sum=2.5, overlap_count=3, tokens=4),
  ]


def in_loop(fixed, spec_fixed, step, round_):
  return {'baseline_fixed_s': fixed, 'speculative_fixed_s': spec_fixed, 'baseline_round_s': step,
          'round_s': round_, 'draft_s': 0.1 * round_, 'c_in_loop': 0.1 * round_ / GAMMA / step,
          'round_fixed_in_loop': 0.9 * round_ / step}


def full_summary(records, temperature=0.0):  # pylint: disable=redefined-outer-name
  setting = settings.Setting(gamma=GAMMA, temperature=temperature, repeats=1)
  s = reporting.summarize_benchmark(records, COSTS, setting)
  s.update(task='specdec_ende_local', split='test', drafter='d1', lengths={'inputs': 16, 'targets': 8},
           setting={'gamma': GAMMA, 'temperature': temperature, 'topk': 0, 'topp': 0.0, 'batch_size': 2,
                    'repeats': 1, 'seed': 0, 'length_buckets': True},
           quality={'baseline': {'bleu': 12.5}, 'speculative': {'bleu': 12.25}}, costs=dict(COSTS),
           machine=reporting.machine_info(), date='2026-01-02T03:04:05', command='python -m specdec.main')
  return s
