"""Tests for specdec/bench/plots.py: each report's figure is written as a PNG, atomically, from hand-made summaries."""

import os

from specdec.bench import ceiling
from specdec.bench import plots
from tests import benchmark_records as hand
from tests import ceiling_states

PNG = b'\x89PNG\r\n\x1a\n'


def _is_png(path) -> bool:
  with open(path, 'rb') as f:
    return f.read(8) == PNG


def test_plot_benchmark(tmp_path):
  records = hand.records()
  plots.plot_benchmark(str(tmp_path / 'benchmark.png'), hand.full_summary(records), records)
  assert _is_png(tmp_path / 'benchmark.png')
  assert os.listdir(tmp_path) == ['benchmark.png']  # no temporary file left behind


def test_plot_peers(tmp_path):
  rows = [{'framework': f, 'system': s, 'temperature': t, 'tokens_per_s': 100.0 * (n + 1)}
          for n, (f, s) in enumerate((('hf', 'baseline'), ('ours', 'speculative'))) for t in (0.0, 1.0)]
  plots.plot_peers(str(tmp_path / 'peers.png'), {'rows': rows, 'task': 'specdec_ende_local', 'gamma': 4})
  assert _is_png(tmp_path / 'peers.png')


def test_plot_ceiling_marks_the_shipped_drafters(tmp_path):
  rep = ceiling.report(ceiling_states.hand_state())
  shipped = dict(rep['rows'][0], drafter='bigram', gamma=1)
  plots.plot_ceiling(str(tmp_path / 'ceiling.png'), dict(rep, shipped=[shipped]))
  assert _is_png(tmp_path / 'ceiling.png')
