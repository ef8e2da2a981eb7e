"""A hand-made `ceiling.measure` state (one α*, one γ, batch 1, two examples), shared by ceiling_test.py and
ceiling_report_test.py."""

from specdec.bench import ceiling

LENGTHS = {'inputs': 8, 'targets': 10}


def hand_state():
  """One α*, one γ, batch 1, two examples, with costs and counts chosen by hand."""
  label = ceiling.oracle_label(0.8, 2)
  in_loop = {'c_in_loop': 0.1, 'round_fixed_in_loop': 1.2, 'round_s': 0.0014, 'draft_s': 0.0002,
             'baseline_round_s': 0.001, 'baseline_fixed_s': 0.002, 'speculative_fixed_s': 0.003}

  def record(n, tokens, base_s, spec_s, calls, accepted, judged, emitted):
    return {'index': n, 'example_ids': [n], 'rows': 1, 'baseline_s': base_s, 'baseline_tokens': [tokens],
            'oracle': {label: {'seconds': spec_s, 'identical': True, 'accepted': [accepted],
                               'judged': [judged], 'emitted': [emitted], 'target_calls': [calls]}},
            'shipped': {}}

  return {'settings': {'alphas': [0.8], 'gammas': [2], 'batch_sizes': [1], 'repeats': 1, 'seed': 0,
                       'max_verify_tokens': 3},
          'identity': {'examples': 2, 'lengths': LENGTHS, 'shipped': {}, 'inputs_sha': 'x'},
          'costs': {'1': {'verify_curve': {'tokens': [1, 2, 3], 'call_s': [0.001, 0.0012, 0.0013],
                                           'ratio': [1.0, 1.2, 1.3]},
                          'in_loop': {'2/1': in_loop}}},
          'batches': {'1': [record(0, 20, 0.030, 0.015, 9, 15, 18, 20),
                            record(1, 10, 0.020, 0.012, 5, 6, 8, 10)]}}
