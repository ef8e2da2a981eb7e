"""Tests for specdec/bench/tables.py: the paper's numbers and the tables laid out beside them."""

import pytest

from specdec.bench import tables
from specdec import task_names as tasks

# The paper's Table 2 (T5-XXL target), copied by hand: (task, drafter, temperature): (γ, α, speedup).
PAPER_TABLE2 = {
    ('ende', 'small', 0.0): (7, 0.75, 3.4),
    ('ende', 'base', 0.0): (7, 0.80, 2.8),
    ('ende', 'large', 0.0): (7, 0.82, 1.7),
    ('ende', 'small', 1.0): (7, 0.62, 2.6),
    ('ende', 'base', 1.0): (5, 0.68, 2.4),
    ('ende', 'large', 1.0): (3, 0.71, 1.4),
    ('cnndm', 'small', 0.0): (5, 0.65, 3.1),
    ('cnndm', 'base', 0.0): (5, 0.73, 3.0),
    ('cnndm', 'large', 0.0): (3, 0.74, 2.2),
    ('cnndm', 'small', 1.0): (5, 0.53, 2.3),
    ('cnndm', 'base', 1.0): (3, 0.55, 2.2),
    ('cnndm', 'large', 1.0): (3, 0.56, 1.7),
}
# The paper's Table 3, T5-XXL rows: α at t=0 / t=1.
PAPER_TABLE3 = {
    ('ende', 'unigram'): (0.08, 0.07), ('ende', 'bigram'): (0.20, 0.19), ('ende', 'small'): (0.75, 0.62),
    ('ende', 'base'): (0.80, 0.68), ('ende', 'large'): (0.82, 0.71),
    ('cnndm', 'unigram'): (0.13, 0.08), ('cnndm', 'bigram'): (0.23, 0.16), ('cnndm', 'small'): (0.65, 0.53),
    ('cnndm', 'base'): (0.73, 0.55), ('cnndm', 'large'): (0.74, 0.56),
}


def test_paper_table2_has_the_papers_twelve_rows():
  assert tables.PAPER_TABLE2 == PAPER_TABLE2
  # Spot checks, as printed in the paper.
  assert tables.PAPER_TABLE2[('ende', 'small', 0.0)] == (7, 0.75, 3.4)  # the best EnDe row
  assert tables.PAPER_TABLE2[('cnndm', 'large', 1.0)] == (3, 0.56, 1.7)
  assert [tables.PAPER_TABLE2[('ende', d, 1.0)][0] for d in ('small', 'base', 'large')] == [7, 5, 3]


def test_paper_table2_is_consistent():
  for (task, drafter, temp), (gamma, alpha, speedup) in tables.PAPER_TABLE2.items():
    assert isinstance(gamma, int) and gamma >= 1
    # Table 2's α is Table 3's (same target, task, drafter and temperature).
    assert tables.PAPER_TABLE3[(task, drafter)][int(temp)] == alpha
    assert 1.0 < speedup < gamma + 1


def test_paper_table3():
  assert tables.PAPER_TABLE3 == PAPER_TABLE3
  assert tables.PAPER_TABLE3[('ende', 'bigram')] == (0.20, 0.19)
  assert tables.PAPER_TABLE3[('cnndm', 'unigram')] == (0.13, 0.08)


@pytest.mark.parametrize('task, drafter, temperature, expected', [
    # CPU family: d3 / d2 / d1 stand in for T5-small / base / large.
    (tasks.ENDE_LOCAL_TASK, 'd3', 0.0, (7, 0.75, 3.4)),
    (tasks.ENDE_LOCAL_TASK, 'd2', 1.0, (5, 0.68, 2.4)),
    (tasks.ENDE_LOCAL_TASK, 'd1', 0.0, (7, 0.82, 1.7)),
    (tasks.ENDE_LOCAL_TASK, 'd1kd', 1, (3, 0.71, 1.4)),  # an int temperature works too
    (tasks.SUMMARIZE_LOCAL_TASK, 'd1', 0.0, (3, 0.74, 2.2)),
    (tasks.SUMMARIZE_LOCAL_TASK, 'd3', 1.0, (5, 0.53, 2.3)),
    # The paper's own tasks and drafter names.
    (tasks.WMT_ENDE_TASK, 'small', 1.0, (7, 0.62, 2.6)),
    (tasks.CNN_DAILYMAIL_TASK, 'base', 0.0, (5, 0.73, 3.0)),
    (tasks.CNN_DAILYMAIL_TASK, 't5_1_1_large', 1.0, (3, 0.56, 1.7)),
    # No Table 2 row: n-gram drafters, other temperatures, unknown tasks or drafters.
    (tasks.ENDE_LOCAL_TASK, 'bigram', 0.0, None),
    (tasks.ENDE_LOCAL_TASK, 'd1', 0.5, None),
    ('some_other_task', 'd1', 0.0, None),
    (tasks.ENDE_LOCAL_TASK, 'd9', 0.0, None),
])
def test_paper_row(task, drafter, temperature, expected):
  assert tables.paper_row(task, drafter, temperature) == expected


def _summary(task, drafter, temperature, gamma, identical_rate, speedup=1.234, alpha_needed=None):
  s = {
      'task': task, 'drafter': drafter, 'examples': 16,
      'setting': {'temperature': temperature, 'gamma': gamma, 'batch_size': 1, 'repeats': 3},
      'alpha_accept': 0.6789, 'alpha_overlap': 0.7012, 'tokens_per_target_call': 2.345,
      'costs': {'c': 0.0456, 'verify_cost_ratio': 1.234},
      'predicted_speedup_thm38': 2.001, 'predicted_speedup_costs': 1.876, 'speedup': speedup,
      'identical_rate': identical_rate,
      'machine': {'processor': 'x86_64', 'cpu_count': 2, 'jax': '0.0.test', 'backend': 'cpu'},
      'date': '2026-01-02T03:04:05',
  }
  if alpha_needed is not None:
    s['alpha_needed'] = alpha_needed
  return s


def test_table2_markdown():
  summaries = [_summary(tasks.ENDE_LOCAL_TASK, 'd1', 0.0, 4, 1.0, alpha_needed={'1.5': 0.456, '2.0': 0.789}),
               _summary(tasks.SUMMARIZE_LOCAL_TASK, 'd3', 1.0, 4, None, speedup=0.987),
               _summary('other_task', 'mine', 0.0, 2, 0.5)]
  summaries[2]['setting']['batch_size'] = 8
  summaries[0].update(in_loop={'c_in_loop': 0.1234, 'round_fixed_in_loop': 1.5}, predicted_speedup_in_loop=1.111)
  text = tables.table2_markdown(summaries, title='My table')
  lines = text.splitlines()
  assert lines[0] == '## My table'
  assert lines[2].startswith('| task | drafter | temp | γ | batch | α (kept/judged) |')
  assert set(lines[3]) == {'|', '-'}
  rows = [l for l in lines[4:] if l.startswith('| ')]
  assert len(rows) == 3
  # Header, rule and rows have the same number of cells (else Markdown renders no table).
  assert {l.count('|') for l in [lines[2], lines[3]] + rows} == {21}  # 20 columns
  assert rows[0] == ('| En→De (DDTP) | d1 | 0 | 4 | 1 | 0.68 | 0.70 | 2.35 | 0.046 | 1.23 | 0.123 | 1.50 | '
                     '2.00× | 1.88× | 1.11× | **1.23×** | 0.46 / 0.79 | 100% | 16 | T5-large: 7, 0.82, 1.7× |')
  assert rows[1].startswith('| summ. (DDTP) | d3 | 1 | 4 | 1 |')
  # Sampling: no identity rate; a summary without alpha_needed shows '-'.
  assert '| **0.99×** | - / - | - | 16 | T5-small: 5, 0.53, 2.3× |' in rows[1]
  assert '| 1.23 | - | - | 2.00× | 1.88× | - | **0.99×**' in rows[1]  # no in-loop costs measured
  assert rows[2].startswith('| other_task | mine | 0 | 2 | 8 |')  # an unknown task is shown by name
  assert rows[2].endswith('| 50% | 16 | - |')  # and has no paper row
  assert 'both loops shrink their batch as rows end' in text  # a batch-8 row is explained
  assert lines[-1] == ('Machine: x86_64, 2 CPUs, jax 0.0.test (cpu); 2026-01-02T03:04:05; batch 1 and 8, '
                       '3 timed repeats per example (median).')
  assert text.endswith('\n')


def test_table2_markdown_warns_of_a_busy_machine_per_row():
  quiet = _summary(tasks.ENDE_LOCAL_TASK, 'd1', 0.0, 4, 1.0)
  quiet['others_cpu_share'] = {'timed_decoding': 0.02, 'cost_measurement': None}
  busy = _summary(tasks.SUMMARIZE_LOCAL_TASK, 'd3', 1.0, 4, None)
  busy['others_cpu_share'] = {'gamma_auto': 0.45, 'timed_decoding': 0.05}
  text = tables.table2_markdown([quiet, busy])
  warnings = [l for l in text.splitlines() if 'Other processes used' in l]
  assert warnings == ["**Other processes used 45% of the machine while the row summ. (DDTP), d3, t = 1 was timed: "
                      "its timings (and a γ 'auto' choice) may be off. Time on a quiet machine (`uptime`).**"]
  assert 'Other processes' not in tables.table2_markdown([quiet])


def test_table2_markdown_empty():
  text = tables.table2_markdown([])
  assert text.startswith('## Table 2 analogue\n')
  assert 'Machine' not in text
  assert len(text.splitlines()) == 4  # title, blank, header, rule
  assert 'in loop' not in text.splitlines()[-1]  # the footnote comes with rows only


def test_table3_markdown():
  alphas = {
      (tasks.SUMMARIZE_LOCAL_TASK, 'd1'): {0.0: 0.4, 1.0: 0.3},
      (tasks.ENDE_LOCAL_TASK, 'unigram'): {0.0: 0.1, 1.0: 0.09},
      (tasks.ENDE_LOCAL_TASK, 'd1'): {0.0: 0.5},
  }
  text = tables.table3_markdown(alphas, drafters=['unigram', 'd1'], title='α table')
  lines = text.splitlines()
  assert lines[0] == '## α table'
  assert '| target / task | unigram (paper: unigram) | d1 (paper: large) |' in lines
  rows = [l for l in lines if l.startswith('| CPU target')]
  # En→De first, then summarization; a missing measurement is '-'; the paper's value in brackets.
  assert rows == [
      '| CPU target, En→De (DDTP) | 0.10 / 0.09 (0.08 / 0.07) | 0.50 / - (0.82 / 0.71) |',
      '| CPU target, summ. (DDTP) | - / - (0.13 / 0.08) | 0.40 / 0.30 (0.74 / 0.56) |',
  ]


def test_table3_markdown_drafter_without_paper_value():
  text = tables.table3_markdown({(tasks.ENDE_LOCAL_TASK, 'mine'): {0.0: 0.25, 1.0: 0.2}}, drafters=['mine'])
  assert '| CPU target, En→De (DDTP) | 0.25 / 0.20 |' in text
  assert 'mine (paper: mine)' in text
