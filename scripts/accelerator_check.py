"""The accelerator check: the paper's regime measured on whatever backend JAX has, in one budgeted run.

  python scripts/accelerator_check.py --shapes tiny      # CPU, under a minute: every part on tiny shapes
  python scripts/accelerator_check.py                    # CPU: small and base; an accelerator: small..xxl
  python scripts/accelerator_check.py --out "$OUT"       # on a lent machine: the report lands in $OUT

Random bfloat16 weights of the T5 1.1 shapes (no checkpoint, no TensorFlow, no seqio, no gin): each target's
verify-cost curve (k = 1..16 tokens a call, batch 1 and 8), c of the paper's drafters (T5 small / base / large),
of a feature head of the target's width and of the n-gram tables, isolated and inside the loop; the ceiling
(the oracle drafter of controlled acceptance on the largest target's own greedy decodes, α* × γ, batch 1,
interleaved with the baseline) beside Thm 3.8 and beside the same decodes paying a T5-small drafter's measured
cost; and the loop's test files (decoding, sampling, models) on this backend (`specdec/bench/accelerator.py`).

Writes <out>/<backend>_<device kind>/report.{md,json,png} after every part and prints the device, the jax
version and a summary line. One budget (--budget_s) covers the whole run; a shape that does not fit the device's
memory is skipped. Resumable: finished parts are kept in --state_dir (default runs/accelerator/<backend>_<device
kind>/, with the compiled programs' cache) and a rerun measures only what is missing.
"""

import argparse
import dataclasses
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from specdec import xla_flags  # pylint: disable=g-import-not-at-top,wrong-import-position  (imports no JAX)


def _before_jax(argv) -> None:
  """What must be set before JAX starts its backend: the tests' workers share the device with this process,
  so neither preallocates it; tiny shapes compile with XLA's quicker settings (compiling is their time)."""
  os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument('--shapes', nargs='+')
  if pre.parse_known_args(argv)[0].shapes == ['tiny']:
    os.environ['XLA_FLAGS'] = xla_flags.fast_compile(os.environ.get('XLA_FLAGS', ''))


_before_jax(sys.argv[1:])

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

from specdec.bench import accelerator  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.bench import accelerator_report
from specdec import fileio
from specdec.bench import plots
from specdec.bench import reporting

CPU_SHAPES = ('small', 'base')
# Lighter defaults where a run would not fit its time otherwise (any flag given still wins):
# --shapes tiny checks the whole pipeline in under a minute on a CPU, most of it compiling: fewer widths, calls,
# repeats and γs than a measurement.
TINY_DEFAULTS = {'max_tokens': 8, 'num_calls': 8, 'repeats': 2, 'gammas': (2, 5), 'ceiling_examples': 16}
# small and base on a CPU in under 10 minutes: a base decode step takes tens of milliseconds there (a decode
# of 32 tokens about a second) and each of the curve's widths compiles for seconds, so batch 1 only, two γs
# and 4 inputs for the ceiling.
CPU_DEFAULTS = {'batch_sizes': (1,), 'repeats': 2, 'gammas': (2, 5), 'ceiling_examples': 4}


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--shapes', nargs='+', default=None,
                      help=f"T5 1.1 shapes ({' '.join(accelerator.SHAPES)}) or 'tiny'; default: all on an "
                           f"accelerator, {' '.join(CPU_SHAPES)} on a CPU")
  parser.add_argument('--budget_s', type=float, default=480.0, help='one time budget for the whole run')
  parser.add_argument('--tests', choices=('auto', 'yes', 'no'), default='auto',
                      help="run the loop's test files on this backend (auto: on an accelerator only; on a CPU "
                           'the suite runs in CI)')
  parser.add_argument('--tests_s', type=float, default=150.0, help='the share of the budget kept for the tests')
  parser.add_argument('--test_workers', type=int, default=None,
                      help='pytest-xdist workers for the tests (default: half the CPUs, at most 8; 0: one process)')
  parser.add_argument('--memory_limit_gb', type=float, default=None,
                      help="the device's memory in GiB (default: what the device reports)")
  parser.add_argument('--out', default=os.path.join('results', 'accelerator'))
  parser.add_argument('--state_dir', default=None,
                      help='progress and compiled programs (default runs/accelerator/<backend>_<device kind>)')
  parser.add_argument('--fresh', action='store_true', help='delete the state first and measure everything again')
  # Measurement settings: None takes accelerator.Settings' default, or TINY_DEFAULTS' with --shapes tiny.
  parser.add_argument('--batch_sizes', type=int, nargs='+')
  parser.add_argument('--max_tokens', type=int, help='the verify curve: k = 1..this')
  parser.add_argument('--input_length', type=int)
  parser.add_argument('--decode_length', type=int)
  parser.add_argument('--num_calls', type=int, help='calls per compiled scan')
  parser.add_argument('--repeats', type=int)
  parser.add_argument('--alphas', type=float, nargs='+', help='the ceiling: α*')
  parser.add_argument('--gammas', type=int, nargs='+', help='the ceiling: γ')
  parser.add_argument('--examples', type=int, dest='ceiling_examples', help='the ceiling: inputs')
  parser.add_argument('--cost_gamma', type=int, help='γ of the in-loop c')
  parser.add_argument('--seed', type=int)
  args = parser.parse_args(argv)
  backend = jax.default_backend()
  shapes = args.shapes or (CPU_SHAPES if backend == 'cpu' else accelerator.SHAPES)
  tiny = list(shapes) == ['tiny']
  chosen = {f.name: getattr(args, f.name) for f in dataclasses.fields(accelerator.Settings)
            if f.name != 'shapes' and getattr(args, f.name, None) is not None}
  defaults = TINY_DEFAULTS if tiny else CPU_DEFAULTS if backend == 'cpu' else {}
  settings = accelerator.Settings(
      shapes=accelerator.TINY_SHAPES if tiny else tuple(shapes),
      **{k: tuple(v) if isinstance(v, list) else v for k, v in {**defaults, **chosen}.items()})
  try:
    settings.validate()
  except ValueError as e:
    parser.error(str(e))
  if args.budget_s <= 0:
    parser.error(f'--budget_s must be > 0, got {args.budget_s}')
  if args.tests_s < 0:
    parser.error(f'--tests_s must be >= 0, got {args.tests_s}')
  if args.memory_limit_gb is not None and args.memory_limit_gb <= 0:
    parser.error(f'--memory_limit_gb must be > 0, got {args.memory_limit_gb}')
  if args.test_workers is not None and args.test_workers < 0:
    parser.error(f'--test_workers must be >= 0, got {args.test_workers}')
  return args, settings


def _relative(arg: str) -> str:
  """An argument as a report may quote it: a path in the working directory relative to it, another absolute
  path (a lent machine's output folder, say) by its last component only."""
  if not os.path.isabs(arg):
    return arg
  rel = os.path.relpath(arg)
  return rel if not rel.startswith('..') else os.path.join('...', os.path.basename(arg.rstrip('/')))


def main(argv=None):
  args, settings = parse_args(argv)
  info = accelerator.device_info()
  name = accelerator.run_name(info)
  state_dir = args.state_dir or os.path.join('runs', 'accelerator', name)
  out_dir = os.path.join(args.out, name)
  if args.fresh and os.path.isdir(state_dir):
    shutil.rmtree(state_dir)
  os.makedirs(state_dir, exist_ok=True)
  os.makedirs(out_dir, exist_ok=True)
  # Compiled programs are kept with the state, so a resumed run on this machine does not compile them again.
  jax.config.update('jax_compilation_cache_dir', os.path.join(os.path.abspath(state_dir), 'jax_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  tests = args.tests == 'yes' or (args.tests == 'auto' and info['backend'] != 'cpu')
  workers = args.test_workers
  if workers is None:
    workers = min(8, (os.cpu_count() or 1) // 2) if (os.cpu_count() or 1) >= 4 else 0
  command = reporting.run_command(['scripts/accelerator_check.py'] +
                                  [_relative(a) for a in (sys.argv[1:] if argv is None else list(argv))])
  print(f"device: {info['backend']} · {info['device_kind']} × {info['device_count']} · jax {info['jax']} · "
        f"shapes {' '.join(settings.shapes)} · budget {args.budget_s:.0f} s · tests {'on' if tests else 'off'}",
        flush=True)

  def write(rep):
    header = f"`{command}` · {rep['date']}"
    fileio.write_json(os.path.join(out_dir, 'report.json'), dict(rep, command=command))
    fileio.atomic_write(os.path.join(out_dir, 'report.md'), accelerator_report.markdown(rep, header).encode())
    plots.plot_accelerator(os.path.join(out_dir, 'report.png'), rep)

  rep = accelerator.run(settings, state_dir, args.budget_s, tests, args.tests_s,
                        memory_limit_bytes=(int(args.memory_limit_gb * 2**30) if args.memory_limit_gb else None),
                        repo_root=REPO, test_workers=workers, tests_log_path=os.path.join(out_dir, 'tests.log'),
                        log=lambda line: print(line, flush=True), on_part=write)
  print(f"report: {os.path.join(out_dir, 'report.md')} ({rep['wall_s']:.0f} s)")
  print(rep['summary'])
  return rep


if __name__ == '__main__':
  main()
