"""Tests for specdec/bench/machine_load.py: other processes' share of the machine over a span."""

import pytest

from specdec.bench import machine_load

# /proc/stat's layout: the machine's totals, then one line per CPU (user nice system idle iowait irq softirq steal ...).
PROC_STAT = '''cpu  1000 50 200 9000 30 5 15 100 0 0
cpu0 500 25 100 4500 15 3 7 50 0 0
cpu1 500 25 100 4500 15 2 8 50 0 0
intr 123 0 0
ctxt 456
'''


def test_parse_proc_stat_counts_busy_ticks_and_cpus():
  busy_s, cpus = machine_load.parse_proc_stat(PROC_STAT, ticks_per_s=100.0)
  # user + nice + system + irq + softirq + steal; idle and iowait are not busy.
  assert busy_s == pytest.approx((1000 + 50 + 200 + 5 + 15 + 100) / 100.0)
  assert cpus == 2


def test_parse_proc_stat_refuses_text_without_cpu_lines():
  with pytest.raises(ValueError, match="no 'cpu' lines"):
    machine_load.parse_proc_stat('intr 1\nctxt 2\n', 100.0)


def test_others_share_subtracts_this_process():
  before = machine_load.CpuTimes(machine_busy_s=100.0, own_s=10.0, cpus=2)
  # In 4 s the machine was busy 6 CPU-seconds, 5 of them this process's: others used 1 of 8.
  after = machine_load.CpuTimes(machine_busy_s=106.0, own_s=15.0, cpus=2)
  assert machine_load.others_share(before, after, wall_s=4.0) == pytest.approx(1 / 8)
  # Tick rounding can make the difference slightly negative, or above the machine: clipped to [0, 1].
  assert machine_load.others_share(before, machine_load.CpuTimes(104.99, 15.0, 2), 4.0) == 0.0
  assert machine_load.others_share(before, machine_load.CpuTimes(200.0, 10.0, 2), 4.0) == 1.0
  with pytest.raises(ValueError, match='wall_s must be positive'):
    machine_load.others_share(before, after, wall_s=0.0)


def test_meter_reads_the_given_file(tmp_path, monkeypatch):
  stat = tmp_path / 'stat'
  stat.write_text(PROC_STAT)
  clock = iter([10.0, 12.0])
  monkeypatch.setattr(machine_load.time, 'perf_counter', lambda: next(clock))
  own = iter([3.0, 3.0])
  monkeypatch.setattr(machine_load, '_own_cpu_s', lambda: next(own))
  with machine_load.CpuMeter(str(stat)) as meter:
    # Others add 100 ticks (1 s at 100 ticks a second) of user time on the machine's 2 CPUs in 2 s.
    stat.write_text(PROC_STAT.replace('cpu  1000', 'cpu  1100'))
  ticks = machine_load.os.sysconf('SC_CLK_TCK')
  assert meter.share == pytest.approx(100 / ticks / (2 * 2.0))


def test_meter_measures_nothing_without_proc_stat_or_over_a_short_span(tmp_path):
  with machine_load.CpuMeter(str(tmp_path / 'missing')) as meter:
    pass
  assert meter.share is None
  stat = tmp_path / 'stat'
  stat.write_text(PROC_STAT)
  with machine_load.CpuMeter(str(stat)) as meter:
    pass  # far shorter than MIN_WALL_S
  assert meter.share is None


def test_warning_only_above_the_busy_share():
  assert machine_load.warning(None, 'x') is None
  assert machine_load.warning(machine_load.BUSY_SHARE, 'x') is None
  line = machine_load.warning(0.3, 'the row En→De')
  assert line.startswith('Other processes used 30% of the machine while the row En→De was timed')
  assert '\n' not in line


def test_a_mapping_of_shares_warns_by_its_largest_and_as_markdown_lines():
  parts = {'gamma_auto': 0.3, 'timed_decoding': 0.02, 'cost_measurement': None}
  assert machine_load.largest_share(parts) == 0.3
  assert machine_load.largest_share({'timed_decoding': None}) is None
  assert machine_load.largest_share(0.05) == 0.05
  assert machine_load.warning(parts, 'x') == machine_load.warning(0.3, 'x')
  assert machine_load.warning_lines(parts, 'x') == ['', f"**{machine_load.warning(0.3, 'x')}**"]
  assert machine_load.warning_lines({'timed_decoding': 0.02}, 'x') == []
  assert machine_load.warning_lines(None, 'x') == []
