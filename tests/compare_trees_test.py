"""Tests of scripts/compare_trees.py's pieces that decode nothing: its arguments, the decoders it builds, the
summary and the table. (The decoders themselves are tested in tree_decoding_test.py and decoding_test.py.)"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts'))
import compare_trees  # pylint: disable=g-import-not-at-top,wrong-import-position


def _args(tmp_path, *extra):
  for name in ('t', 'd'):
    (tmp_path / name).mkdir(exist_ok=True)
  return compare_trees.parse_args(['--target', str(tmp_path / 't'), '--drafter', str(tmp_path / 'd'),
                                   '--out', str(tmp_path / 'o'), *extra])


def test_arguments_are_checked(tmp_path):
  args = _args(tmp_path, '--chains', '2', '--trees', '3x2+1')
  assert args.tree_shapes == {'3x2+1': ((3, 2), 1)}
  for bad in (['--trees', '2+x'], ['--chains', '0'], ['--chains', '--trees'], ['--examples', '0'],
              ['--temperature', '-1']):
    with pytest.raises(SystemExit):
      _args(tmp_path, *bad)
  with pytest.raises(SystemExit):
    compare_trees.parse_args(['--target', str(tmp_path / 'missing'), '--drafter', str(tmp_path / 'd'),
                              '--out', 'o'])


def test_decoders_and_their_verify_widths(tmp_path):
  specs = compare_trees.decoder_specs(_args(tmp_path, '--chains', '1', '3', '--trees', '2+2', '3x2+1'))
  assert list(specs) == ['baseline', 'chain γ=1', 'chain γ=3', 'tree 2+2', 'tree 3x2+1']
  assert [s['width'] for s in specs.values()] == [1, 2, 4, 7, 16]
  assert specs['tree 3x2+1']['params']['branching'] == (3, 2) and specs['chain γ=3']['params']['gamma'] == 3


def test_summary_and_table(tmp_path):
  args = _args(tmp_path, '--chains', '2', '--trees', '2+1')
  specs = compare_trees.decoder_specs(args)
  records = [{'seconds': {'baseline': 2.0, 'chain γ=2': 1.0, 'tree 2+1': 1.6},
              'target_calls': {'chain γ=2': 10, 'tree 2+1': 8}, 'emitted': {'chain γ=2': 20, 'tree 2+1': 20},
              'identical': {'chain γ=2': True, 'tree 2+1': False}},
             {'seconds': {'baseline': 2.0, 'chain γ=2': 1.0, 'tree 2+1': 0.9},
              'target_calls': {'chain γ=2': 10, 'tree 2+1': 12}, 'emitted': {'chain γ=2': 20, 'tree 2+1': 20},
              'identical': {'chain γ=2': True, 'tree 2+1': True}}]
  curve = {'tokens': [1, 2, 3, 4, 5], 'ratio': [1.0, 1.1, 1.2, 1.3, 1.4]}
  summary = compare_trees.summarize(specs, records, curve)
  assert summary['chain γ=2']['speedup'] == pytest.approx(2.0)
  assert summary['tree 2+1']['speedup'] == pytest.approx(4.0 / 2.5)
  assert summary['tree 2+1']['tokens_per_call'] == pytest.approx(2.0)
  assert summary['tree 2+1']['identical'] == pytest.approx(0.5) and summary['tree 2+1']['verify_ratio'] == 1.4
  text = compare_trees.markdown(summary, args, 'header', 2, greedy=True)
  assert '| **tree 2+1** | 1.600× | - | 2.00 | - | 5 | 1.40 | 50% |' in text
  assert 'Best tree (tree 2+1) / best chain (chain γ=2): **0.800×**' in text


def test_the_auto_tree_is_added_once_and_predicted(tmp_path):
  args = _args(tmp_path, '--chains', '1', '--trees', '2+1')
  assert list(compare_trees.decoder_specs(args, ((2,), 1))) == ['baseline', 'chain γ=1', 'tree 2+1']
  specs = compare_trees.decoder_specs(args, ((3,), 2))
  assert list(specs) == ['baseline', 'chain γ=1', 'tree 2+1', 'tree auto 3+2']
  assert specs['tree auto 3+2']['params']['branching'] == (3,) and specs['tree auto 3+2']['width'] == 10
  records = [{'seconds': dict.fromkeys(specs, 1.0), 'target_calls': dict.fromkeys(specs, 4),
              'emitted': dict.fromkeys(specs, 8), 'identical': dict.fromkeys(specs, True)}]
  curve = {'tokens': list(range(1, 17)), 'ratio': [1.0 + 0.1 * k for k in range(16)]}
  summary = compare_trees.summarize(specs, records, curve, [0.5, 0.2], 0.1)
  assert summary['chain γ=1']['predicted_tokens_per_call'] == pytest.approx(1.5)
  # The drafter's calls at their widths, on the target's curve (no drafter curve given): γ = 1 is one 2-token
  # catch-up; 2+1 the catch-up and one call over its 2 first-level nodes.
  assert summary['chain γ=1']['predicted_speedup'] == pytest.approx(1.5 / (0.1 * 1.1 + 1.1))
  # 2+1: 1 + (0.5 + 0.2) + (0.25 + 0.1) = 2.05 tokens; 5 nodes.
  assert summary['tree 2+1']['predicted_speedup'] == pytest.approx(2.05 / (0.1 * (1.1 + 1.1) + 1.4))
  flat = {'tokens': list(range(1, 17)), 'ratio': [1.0] * 16}
  summary = compare_trees.summarize(specs, records, curve, [0.5, 0.2], 0.1, draft_curve=flat)
  assert summary['tree 2+1']['predicted_speedup'] == pytest.approx(2.05 / (0.2 + 1.4))
  calibration = {'examples': 32, 'positions': 400, 'rank_probs': [0.5, 0.2], 'c': 0.1, 'c_isolated': 0.05,
                 'best_tree': [[3], 2], 'best_tree_speedup': 1.2}
  text = compare_trees.markdown(summary, args, 'header', 1, greedy=True, calibration=calibration)
  assert ('choice with probabilities 0.500, 0.200; c in the loop = 0.100 (isolated 0.050); `draft_tree.best_tree` '
          'picks 3+2') in text
