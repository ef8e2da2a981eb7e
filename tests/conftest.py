"""Test-session settings: compile less, and compile faster.

The suite compiles hundreds of small XLA programs and runs each a few times on tiny models, so compiling is most
of its time:
- JAX's persistent compilation cache, in a folder of the machine's temp dir shared by the pytest-xdist workers,
  compiles a program that another test (or the other worker) already compiled only once. Entries are keyed by
  the program, the compile options and the jax/jaxlib version, so a stale one is never used.
  SPECDEC_TEST_JAX_CACHE names another folder ('' turns it off). Off by default from jax 0.11 on (below).
- XLA's quicker code generation (`specdec/xla_flags.py`: optimisation level 0, as the 8-device helper
  processes of sharded_decoding_test, train_sharded_test and rehearsal_test already run, and the CPU backend's
  older elementwise emitters with unsplit LLVM modules; on 2 cores shared by two pytest-xdist workers,
  splitting only adds work): tests/models_test.py ran in about half the time from an empty compilation cache,
  and the tests' models are too small for the slower code to matter. SPECDEC_TEST_XLA_OPT=default keeps all
  of XLA's defaults. Must be set before JAX starts its backend, which no test module does at import;
  pytest-xdist workers inherit the flags from the process that started them.
"""

import gc
import os
import tempfile

# The `[test]` extra installs libtpu (the TPU compile checks use its compiler): without this, JAX would look for a
# TPU at start-up on every machine, print errors where there is none, and hand the profiler a TPU plugin that
# leaves CPU traces empty. TPU topologies still compile with it set.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from specdec import xla_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

if os.environ.get('SPECDEC_TEST_XLA_OPT', '0') != 'default':
  os.environ['XLA_FLAGS'] = xla_flags.fast_compile(os.environ.get('XLA_FLAGS', ''))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

# jax 0.12's persistent cache crashed pytest workers on this CPU (SIGSEGV while serializing or reading an
# executable, in `compilation_cache.put_executable_and_time` / `get_executable_and_time`; three whole-suite runs,
# three different tests); jax 0.10 has run the suite with it for months. So by default it is on before jax 0.11.
_CACHE_SAFE = tuple(int(part) for part in jax.__version__.split('.')[:2]) < (0, 11)
_CACHE_DIR = os.environ.get('SPECDEC_TEST_JAX_CACHE',
                            os.path.join(tempfile.gettempdir(), f'specdec-test-jax-cache-{os.getuid()}')
                            if _CACHE_SAFE else '')
if _CACHE_DIR:
  jax.config.update('jax_compilation_cache_dir', _CACHE_DIR)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)


# Each XLA:CPU executable keeps its machine code in memory maps of its own, and jax keeps every program it compiled
# for the life of the process. A pytest worker runs hundreds of modules: on jax 0.12 one passed Linux's limit of
# 65,530 maps per process (`vm.max_map_count`) and aborted in its next compile (LLVM's RuntimeDyld could not map a
# section; 65,532 maps in the core file), in the same test of tests/models_test.py in three whole-suite runs. So a
# worker drops the programs it compiled at the end of each test module, and after any test that leaves it past half
# the limit (one module alone reached 50,334 maps on jax 0.12).
_MAPS = '/proc/self/maps'


def _map_budget():
  try:
    with open('/proc/sys/vm/max_map_count', encoding='ascii') as f:
      return int(f.read()) // 2
  except (OSError, ValueError):  # not Linux: no such limit to keep under
    return None


_MAP_BUDGET = _map_budget()


def _memory_maps():
  with open(_MAPS, 'rb') as f:
    return sum(1 for _ in f)


def _free_compiled_programs():
  jax.clear_caches()
  gc.collect()


@pytest.fixture(autouse=True, scope='module')
def _free_each_modules_programs():
  yield
  _free_compiled_programs()


@pytest.fixture(autouse=True)
def _free_programs_short_of_the_map_limit():
  yield
  if _MAP_BUDGET is not None and _memory_maps() > _MAP_BUDGET:
    _free_compiled_programs()
