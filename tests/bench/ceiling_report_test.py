"""Tests for specdec/bench/ceiling_report.py: the ceiling's Markdown from a report of a hand-made state."""

from specdec.bench import ceiling
from specdec.bench import ceiling_report
from tests import ceiling_states


def test_markdown_lists_the_rows_outside_the_predicted_band():
  rep = ceiling.report(ceiling_states.hand_state())
  # measured 1.85x against 1.33x predicted: the report lists the row as a miss.
  misses = ceiling_report.markdown(rep).split('## Rows outside')[1]
  assert 'batch 1, α* 0.8, γ 2: measured 1.85×, predicted 1.33× (1.39)' in misses


def test_markdown_of_every_row_and_the_best_gamma():
  rep = ceiling.report(ceiling_states.hand_state())
  text = ceiling_report.markdown(rep, 'the header')
  assert text.startswith('# The ceiling: measured speedup against a controlled acceptance rate\n\nthe header\n')
  assert f'*{ceiling_report.CONTROLLED}*, not a trained drafter' in text
  # α 21/26 = 0.808 ± sqrt(α(1 - α) / 26) = 0.077; speedup 0.050 / 0.027.
  assert '| 0.8 | 2 | 0.808 ± 0.077 | 2.14 |' in text
  assert '**1.85×**' in text
  assert 'The shipped (trained) drafters' not in text  # none in this state
  assert '## Costs inside the loop: replayed against fitted (batch 1)' in text


def test_best_at():
  rep = ceiling.report(ceiling_states.hand_state())
  assert ceiling_report.best_at(rep, 0.8, 1)['best_gamma_measured'] == 2
  assert ceiling_report.best_at(rep, 0.9, 1) is None
