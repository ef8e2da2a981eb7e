"""Test-session settings: compile less, and compile faster.

The suite compiles hundreds of small XLA programs and runs each a few times on tiny models, so compiling is most
of its time:
- JAX's persistent compilation cache, in a folder of the machine's temp dir shared by the pytest-xdist workers,
  compiles a program that another test (or the other worker) already compiled only once. Entries are keyed by
  the program, the compile options and the jax/jaxlib version, so a stale one is never used.
  SPECDEC_TEST_JAX_CACHE names another folder ('' turns it off).
- XLA's CPU backend at optimisation level 0 (as the 8-device helper processes of sharded_decoding_test,
  train_sharded_test and rehearsal_test already run) generates code faster; the tests' models are too small
  for the slower code to matter. SPECDEC_TEST_XLA_OPT=default keeps XLA's level. Must be set before JAX
  starts its backend, which no test module does at import.
"""

import os
import tempfile

if os.environ.get('SPECDEC_TEST_XLA_OPT', '0') != 'default':
  _flags = os.environ.get('XLA_FLAGS', '')
  if 'xla_backend_optimization_level' not in _flags:
    os.environ['XLA_FLAGS'] = (_flags + ' --xla_backend_optimization_level=0').strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

_CACHE_DIR = os.environ.get('SPECDEC_TEST_JAX_CACHE',
                            os.path.join(tempfile.gettempdir(), f'specdec-test-jax-cache-{os.getuid()}'))
if _CACHE_DIR:
  jax.config.update('jax_compilation_cache_dir', _CACHE_DIR)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
