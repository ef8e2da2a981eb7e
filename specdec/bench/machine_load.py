"""How busy the rest of the machine was while this process timed something.

Timings are only comparable on a quiet machine. Two processes on two cores can move a decode's time by tens of
percent, and not evenly across what is compared (a verify-cost curve measured beside a test suite picked γ 5
where γ 3 was 14% faster). `CpuMeter` measures, over a span, the CPU time every other process used: the
machine's busy time (`/proc/stat`, steal included: on a virtual machine a busy neighbour shows there) minus this
process's own (`resource.getrusage`, all its threads). The share is of all the machine's CPU time in the span, so
0.5 on two cores is one other core-worth of work. Where `/proc/stat` is absent (not Linux) it measures nothing.
"""

import dataclasses
import os
import resource
import time
from typing import List, Mapping, Optional, Union

# Above this share of the machine used by others, a report warns that its timings may be off.
BUSY_SHARE = 0.1
# Spans shorter than this measure nothing: /proc/stat counts in ticks (10 ms), too coarse for them.
MIN_WALL_S = 1.0
PROC_STAT = '/proc/stat'


@dataclasses.dataclass(frozen=True)
class CpuTimes:
  """Seconds of CPU time so far: the whole machine's busy time, this process's, and the machine's CPU count."""
  machine_busy_s: float
  own_s: float
  cpus: int


def parse_proc_stat(text: str, ticks_per_s: float) -> tuple:
  """(busy seconds summed over all CPUs, number of CPUs) from `/proc/stat`'s text.

  Busy is user + nice + system + irq + softirq + steal; idle and iowait are not busy. Guest time is already
  counted in user and nice.
  """
  total = None
  cpus = 0
  for line in text.splitlines():
    fields = line.split()
    if not fields:
      continue
    if fields[0] == 'cpu':
      values = [int(v) for v in fields[1:]] + [0] * 8
      user, nice, system, _, _, irq, softirq, steal = values[:8]
      total = user + nice + system + irq + softirq + steal
    elif fields[0].startswith('cpu') and fields[0][3:].isdigit():
      cpus += 1
  if total is None or cpus == 0:
    raise ValueError("no 'cpu' lines in /proc/stat's text.")
  return total / ticks_per_s, cpus


def read_cpu_times(proc_stat: str = PROC_STAT) -> Optional[CpuTimes]:
  """The machine's and this process's CPU seconds now, or None where `proc_stat` cannot be read."""
  try:
    with open(proc_stat, encoding='ascii') as f:
      text = f.read()
    busy_s, cpus = parse_proc_stat(text, float(os.sysconf('SC_CLK_TCK')))
  except (OSError, ValueError):
    return None
  return CpuTimes(busy_s, _own_cpu_s(), cpus)


def _own_cpu_s() -> float:
  """This process's CPU seconds so far, all its threads (XLA's included), user and system."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def others_share(before: CpuTimes, after: CpuTimes, wall_s: float) -> float:
  """The share (0..1) of the machine's CPU time in `wall_s` that other processes used between two readings."""
  if wall_s <= 0:
    raise ValueError(f'wall_s must be positive, got {wall_s!r}.')
  others_s = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
  # Tick counts are coarse (10 ms) and this process's time is exact: clip the difference's rounding.
  return min(max(others_s / (after.cpus * wall_s), 0.0), 1.0)


class CpuMeter:
  """Others' share of the machine over a span: `with CpuMeter() as meter: ...`, then `meter.share` (None where
  nothing could be measured, or the span was shorter than `MIN_WALL_S`)."""

  def __init__(self, proc_stat: str = PROC_STAT):
    self._proc_stat = proc_stat
    self._before: Optional[CpuTimes] = None
    self._start = 0.0
    self.share: Optional[float] = None

  def __enter__(self) -> 'CpuMeter':
    self._before = read_cpu_times(self._proc_stat)
    self._start = time.perf_counter()
    return self

  def __exit__(self, *exc) -> None:
    wall_s = time.perf_counter() - self._start
    after = read_cpu_times(self._proc_stat)
    if self._before is not None and after is not None and wall_s >= MIN_WALL_S:
      self.share = others_share(self._before, after, wall_s)


Shares = Union[None, float, Mapping[str, Optional[float]]]


def largest_share(shares: Shares) -> Optional[float]:
  """One share, or the largest of a mapping of them (a run's timed parts; parts not measured are None)."""
  if isinstance(shares, Mapping):
    return max((v for v in shares.values() if v is not None), default=None)
  return shares


def warning(shares: Shares, what: str) -> Optional[str]:
  """A one-line warning when others used more than `BUSY_SHARE` of the machine while `what` was timed (`shares`:
  a share, or a mapping of shares of which the largest counts)."""
  share = largest_share(shares)
  if share is None or share <= BUSY_SHARE:
    return None
  return (f'Other processes used {share:.0%} of the machine while {what} was timed: its timings (and a γ '
          f"'auto' choice) may be off. Time on a quiet machine (`uptime`).")


def warning_lines(shares: Shares, what: str) -> List[str]:
  """`warning` as Markdown lines to put under a report: a blank line and the warning in bold, or none."""
  line = warning(shares, what)
  return ['', f'**{line}**'] if line else []
