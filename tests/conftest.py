"""Test-session settings: compile less, and compile faster.

The suite compiles hundreds of small XLA programs and runs each a few times on tiny models, so compiling is most
of its time:
- JAX's persistent compilation cache, in a folder of the machine's temp dir shared by the pytest-xdist workers,
  compiles a program that another test (or the other worker) already compiled only once. Entries are keyed by
  the program, the compile options and the jax/jaxlib version, so a stale one is never used.
  SPECDEC_TEST_JAX_CACHE names another folder ('' turns it off).
- XLA's CPU backend at optimisation level 0 (as the 8-device helper processes of sharded_decoding_test,
  train_sharded_test and rehearsal_test already run) generates code faster; the tests' models are too small
  for the slower code to matter. So does the CPU backend's older elementwise code generator
  (`xla_cpu_use_fusion_emitters=false`) with each program's LLVM module compiled in one piece
  (`xla_cpu_parallel_codegen_split_count=1`: on 2 cores shared by two pytest-xdist workers, splitting only adds
  work): with both, tests/models_test.py ran in about half the time from an empty compilation cache. XLA
  aborts on a flag it does not know, so those two are first tried in a child process and left out if
  refused (a later jaxlib may drop them). SPECDEC_TEST_XLA_OPT=default keeps all of XLA's defaults. Must be
  set before JAX starts its backend, which no test module does at import; pytest-xdist workers inherit the
  flags from the process that started them.
"""

import os
import subprocess
import sys
import tempfile

_FAST_CODEGEN_FLAGS = ('--xla_cpu_use_fusion_emitters=false',
                       '--xla_cpu_parallel_codegen_split_count=1')


def _accepted(flags: str) -> bool:
  """Whether a JAX process with XLA_FLAGS=flags compiles and runs a program (unknown flags abort it)."""
  probe = 'import jax; jax.jit(lambda x: x + 1)(1).block_until_ready()'
  try:
    return subprocess.run([sys.executable, '-c', probe], env={**os.environ, 'XLA_FLAGS': flags},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=120, check=False).returncode == 0
  except subprocess.TimeoutExpired:
    return False


if os.environ.get('SPECDEC_TEST_XLA_OPT', '0') != 'default':
  _flags = os.environ.get('XLA_FLAGS', '')
  if 'xla_backend_optimization_level' not in _flags:
    _flags = (_flags + ' --xla_backend_optimization_level=0').strip()
  if not any(flag.split('=')[0] in _flags for flag in _FAST_CODEGEN_FLAGS):
    _faster = (_flags + ' ' + ' '.join(_FAST_CODEGEN_FLAGS)).strip()
    if _accepted(_faster):
      _flags = _faster
  os.environ['XLA_FLAGS'] = _flags

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

_CACHE_DIR = os.environ.get('SPECDEC_TEST_JAX_CACHE',
                            os.path.join(tempfile.gettempdir(), f'specdec-test-jax-cache-{os.getuid()}'))
if _CACHE_DIR:
  jax.config.update('jax_compilation_cache_dir', _CACHE_DIR)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
