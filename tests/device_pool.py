"""A helper process with simulated CPU devices, for tests that need a mesh.

XLA reads --xla_force_host_platform_device_count once, when JAX starts, so
tests that need 8 devices run their cases in one spawned process started
with that flag; the flag never reaches this pytest process's other tests.
"""

import concurrent.futures
import contextlib
import multiprocessing
import os

DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'


@contextlib.contextmanager
def spawned(xla_flags: str):
  """A one-process pool whose process started with `xla_flags` added to XLA_FLAGS.

  Any device-count flag already in XLA_FLAGS is replaced; this process's
  XLA_FLAGS is restored before the pool is handed out.
  """
  old = os.environ.get('XLA_FLAGS')
  kept = [f for f in (old or '').split() if not f.startswith(DEVICE_COUNT_FLAG)]
  os.environ['XLA_FLAGS'] = ' '.join(kept + xla_flags.split())
  try:
    pool = concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context('spawn'))
    pool.submit(int).result()  # Starts the process with this environment.
  finally:
    if old is None:
      del os.environ['XLA_FLAGS']
    else:
      os.environ['XLA_FLAGS'] = old
  try:
    yield pool
  finally:
    pool.shutdown()
