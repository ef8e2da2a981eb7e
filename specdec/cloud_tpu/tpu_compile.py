"""What XLA's TPU compiler says each program needs per chip, and the sweep that records it.

  figures = compile_figures(program.lower, hbm_gib=32.0)   # compile (never run): memory, FLOPs, collectives
  sweep(programs, tpu, 'results/tpu_compile/v4-8.json', command=...)   # resumable; .md beside the .json

Per chip, from `Compiled.memory_analysis()`: arguments, outputs, temporaries, generated code, and the bytes
outputs share with donated arguments (aliases); the program needs arguments + outputs - aliases + temporaries
+ code of the chip's HBM. From `cost_analysis()`: FLOPs and bytes accessed, per call only for straight-line
programs (XLA counts a while_loop's body once). From the compiled HLO text: collectives by kind.

A program that does not fit is recorded as such ("does not fit: needs X GiB of Y per chip") and the sweep goes
on; one that fails to lower or compile is recorded with its error's first line, and the sweep goes on.
"""

import json
import os
import re
import time
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

from specdec import fileio

GIB = 2 ** 30
COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute')
# An instruction of each kind in compiled HLO: `name = type kind(` or its async `kind-start(` (a `-done` pairs
# with each start and is not counted twice).
_COLLECTIVE_RE = re.compile(r'=\s*\S.*?\s(' + '|'.join(COLLECTIVES) + r')(-start)?\(')


def count_collectives(hlo_text: str) -> Dict[str, int]:
  """{kind: instructions of that kind} in HLO text, for every kind of `COLLECTIVES` (0 where absent)."""
  counts = dict.fromkeys(COLLECTIVES, 0)
  for line in hlo_text.splitlines():
    match = _COLLECTIVE_RE.search(line)
    if match:
      counts[match.group(1)] += 1
  return counts


def _memory(compiled) -> Dict[str, int]:
  stats = compiled.memory_analysis()
  return {'arguments': int(stats.argument_size_in_bytes), 'outputs': int(stats.output_size_in_bytes),
          'aliases': int(stats.alias_size_in_bytes), 'temporaries': int(stats.temp_size_in_bytes),
          'code': int(stats.generated_code_size_in_bytes)}


def needed_bytes(memory: Mapping[str, int]) -> int:
  """HBM a program holds at its peak: arguments and outputs (less what donated arguments share with outputs),
  temporaries and the generated code."""
  return (memory['arguments'] + memory['outputs'] - memory['aliases'] + memory['temporaries']
          + memory['code'])


def fit_verdict(needed: int, hbm_gib: float) -> str:
  """'fits: X GiB of Y per chip, Z GiB free' or 'does not fit: needs X GiB of Y per chip'."""
  gib = needed / GIB
  if needed <= hbm_gib * GIB:
    return f'fits: {gib:.2f} GiB of {hbm_gib:g} per chip, {hbm_gib - gib:.2f} GiB free'
  return f'does not fit: needs {gib:.2f} GiB of {hbm_gib:g} per chip'


def _cost(compiled) -> Dict[str, Optional[float]]:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
    cost = cost[0] if cost else {}
  cost = cost or {}
  return {'flops': cost.get('flops'), 'bytes_accessed': cost.get('bytes accessed')}


def compile_figures(lower: Callable[[], Any], hbm_gib: float, straight_line: bool = True) -> Dict[str, Any]:
  """Lowers and compiles a program (never runs it); its per-chip figures.

  Returns {'lower_s', 'compile_s', 'memory': {arguments, outputs, aliases, temporaries, code} bytes,
  'needed_gib', 'hbm_gib', 'fits', 'verdict', 'collectives': {kind: count}, 'flops', 'bytes_accessed'}
  (FLOPs and bytes per call for a straight-line program; for a loop, the body counted once).
  """
  import jax  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  lowered = lower()
  lowered_at = time.perf_counter()
  # No persistent compilation cache (the test suite sets one): an executable for a TPU topology cannot be read
  # back on a machine without a TPU, so caching it would only write it (gigabytes for XXL) and warn on reading.
  cached = jax.config.jax_enable_compilation_cache
  jax.config.update('jax_enable_compilation_cache', False)
  try:
    compiled = lowered.compile()
  finally:
    jax.config.update('jax_enable_compilation_cache', cached)
  compiled_at = time.perf_counter()
  memory = _memory(compiled)
  needed = needed_bytes(memory)
  return {'lower_s': round(lowered_at - start, 1), 'compile_s': round(compiled_at - lowered_at, 1),
          'memory': memory, 'needed_gib': round(needed / GIB, 3), 'hbm_gib': hbm_gib,
          'fits': needed <= hbm_gib * GIB, 'verdict': fit_verdict(needed, hbm_gib),
          'collectives': count_collectives(compiled.as_text()), 'straight_line': straight_line,
          **_cost(compiled)}


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return f'{type(error).__name__}: {text.splitlines()[0][:400] if text else ""}'


# ------------------------------------------------------------------------------------------------------------
# The sweep: resumable, one program at a time, results rewritten atomically after each.
# ------------------------------------------------------------------------------------------------------------


def read_results(json_path: str) -> Dict[str, Any]:
  """The results a sweep wrote to `json_path` ({'programs': {}} when there are none yet)."""
  if not os.path.exists(json_path):
    return {'programs': {}}
  with open(json_path, encoding='utf-8') as f:
    return json.load(f)


def sweep(programs: Iterable[Any], tpu, json_path: str, header: Mapping[str, Any],
          log: Callable[[str], None] = print, retry_failed: bool = False) -> Dict[str, Any]:
  """Compiles every program not already in `json_path` (one that failed only with `retry_failed`).

  `programs` yields `tpu_programs.Program`s, or (name, error) pairs for programs that could not even be built
  (recorded as failures). After each program the .json and its .md (`markdown`) are rewritten atomically, so an
  interrupted sweep resumes where it stopped. `header`: command, versions, slice (stored at the top).
  """
  results = read_results(json_path)
  header = dict(header)
  command = header.pop('command', None)
  results.update(header)
  if command and command not in results.setdefault('commands', []):  # each piece of a sweep adds its own
    results['commands'].append(command)
  done = results['programs']
  for item in programs:
    if isinstance(item, tuple):
      name, error = item
      if name in done and not (retry_failed and 'error' in done[name]):
        continue
      done[name] = {'kind': 'unknown', 'error': _first_line(error)}
      log(f'{name}: could not be built: {done[name]["error"]}')
      _write(results, json_path)
      continue
    program = item
    if program.name in done and not (retry_failed and 'error' in done[program.name]):
      log(f'{program.name}: already compiled ({done[program.name].get("verdict") or "failed"}); skipped')
      if done[program.name].get('settings') != dict(program.settings):  # described anew, not recompiled
        done[program.name]['settings'] = dict(program.settings)
        _write(results, json_path)
      continue
    log(f'{program.name}: compiling for {tpu.name} ...')
    record = {'kind': program.kind, 'settings': dict(program.settings)}
    try:
      record.update(compile_figures(program.lower, tpu.hbm_gib, program.straight_line))
      log(f'{program.name}: {record["verdict"]} (lower {record["lower_s"]} s, compile {record["compile_s"]} s)')
    except Exception as e:  # pylint: disable=broad-except  (one program's failure is recorded; the rest go on)
      record['error'] = _first_line(e)
      log(f'{program.name}: failed: {record["error"]}')
    done[program.name] = record
    _write(results, json_path)
    _release_compiled_programs()
  return results


def _release_compiled_programs() -> None:
  """Drops jax's traces and executables of the programs compiled so far: an XXL program's compile holds
  gigabytes, and a sweep compiles each program once."""
  import gc  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  jax.clear_caches()
  gc.collect()


def _write(results: Mapping[str, Any], json_path: str) -> None:
  fileio.atomic_write(json_path, (json.dumps(results, indent=2, sort_keys=False) + '\n').encode())
  fileio.atomic_write(os.path.splitext(json_path)[0] + '.md', markdown(results).encode())


# ------------------------------------------------------------------------------------------------------------
# Reports.
# ------------------------------------------------------------------------------------------------------------


def _gib(n: Optional[int]) -> str:
  return '' if n is None else f'{n / GIB:.2f}'


def _sci(x: Optional[float]) -> str:
  return '' if x is None else f'{x:.3g}'


def _cell(value) -> str:
  return '' if value is None else f'{value:g}' if isinstance(value, float) else str(value)


def _collective_cell(counts: Mapping[str, int]) -> str:
  return ' / '.join(str(counts.get(kind, 0)) for kind in COLLECTIVES)


def markdown(results: Mapping[str, Any]) -> str:
  """The sweep's table: per program and chip, memory against HBM, compile seconds, collectives, FLOPs."""
  tpu = results.get('slice', {})
  lines = [f'# Compiled by XLA\'s TPU compiler for {tpu.get("name", "?")}, never run',
           '',
           'Made by ' + ', then '.join(f'`{c}`' for c in results.get('commands', ['?'])) + f' with jax {results.get("jax", "?")}, libtpu '
           f'{results.get("libtpu", "?")}, on {results.get("machine", "?")}. Topology `{tpu.get("topology")}` '
           f'({tpu.get("chip_config")}), {tpu.get("chips")} chips on {tpu.get("hosts")} host(s), '
           f'{tpu.get("hbm_gib")} GiB HBM per chip.',
           '',
           '- Every program is lowered for abstract params and optimizer state (ShapeDtypeStructs with the '
           'project\'s shardings; no weights) and compiled for the slice\'s devices; nothing runs.',
           '- GiB = 2^30 bytes, **per chip**. needed = arguments + outputs - aliases (donated arguments the outputs '
           'reuse) + temporaries + code.',
           '- Collectives: instructions in the compiled HLO, ' + ' / '.join(COLLECTIVES) + '.',
           '- FLOPs and bytes are XLA\'s cost analysis per chip. Only straight-line programs (verify, draft step, '
           'train step) give per-call figures; a decode is a while_loop whose body XLA counts once.',
           '',
           '- Verify and draft step: one call of the network\'s decoder into its cache; jit drops the params the '
           'call does not read (the encoder\'s), so their arguments are the decoder\'s params and cache.',
           '',
           '| program | kind | drafter | γ | temperature | mesh | batch | inputs/targets | arguments | outputs | '
           'temporaries | code | needed | fits | lower s | compile s | collectives | GFLOP | GB accessed |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  for name, rec in results.get('programs', {}).items():
    settings = rec.get('settings', {})
    lengths = (f'{settings.get("inputs")}/{settings.get("targets")}' if settings else '')
    described = ' | '.join(_cell(settings.get(key)) for key in ('drafter', 'gamma', 'temperature', 'mesh', 'batch'))
    if 'error' in rec:
      lines.append(f'| {name} | {rec.get("kind")} | {described} | {lengths} | '
                   f'failed: {rec["error"].replace("|", "/")} ||||||||||')
      continue
    memory = rec['memory']
    straight = rec.get('straight_line')
    flops = _sci(rec['flops'] / 1e9) if straight and rec.get('flops') is not None else ''
    accessed = _sci(rec['bytes_accessed'] / 1e9) if straight and rec.get('bytes_accessed') is not None else ''
    fits = 'yes' if rec['fits'] else f'**no** ({rec["verdict"]})'
    lines.append(f'| {name} | {rec["kind"]} | {described} | {lengths} '
                 f'| {_gib(memory["arguments"])} | {_gib(memory["outputs"])} | {_gib(memory["temporaries"])} | '
                 f'{_gib(memory["code"])} | {rec["needed_gib"]:.2f} | {fits} | {rec["lower_s"]} | '
                 f'{rec["compile_s"]} | {_collective_cell(rec["collectives"])} | {flops} | {accessed} |')
  return '\n'.join(lines) + '\n'
