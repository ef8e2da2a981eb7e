"""One safe load order for TensorFlow's and triton's compiled libraries in one process.

seqio brings TensorFlow; the Hugging Face side (transformers' T5, the parity tests, `specdec.bench.peers`) brings torch,
and torch builds that ship triton (the CUDA builds, which pip takes on Python 3.12 and newer) load triton's
compiled library when `torch._dynamo` is imported, as transformers' T5 does. Loaded after TensorFlow's, that
library crashes the process with a segmentation fault at load time (triton 3.7, TensorFlow 2.21); loaded before,
both work. Importing `specdec` therefore loads triton's library first whenever triton is installed and TensorFlow is
not loaded yet (about 0.1 s, and nothing where triton is absent, as with the CPU torch build).

A process that imported TensorFlow (or seqio) before `specdec` or triton cannot be mended: `check_triton_loadable`
turns the crash that would follow into a one-line error before torch is imported. docs/install.md gives the order
that works for a user's own scripts.

`import_tensorflow_quietly` loads TensorFlow (and seqio) without its start-up noise and off accelerators, for entry
points that import it before anything else does.
"""

import contextlib
import importlib
import importlib.util
import os
import sys

TRITON_LIBRARY = 'triton._C.libtriton'


def _installed(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False


def tensorflow_loaded() -> bool:
  return 'tensorflow' in sys.modules


def triton_loaded() -> bool:
  return TRITON_LIBRARY in sys.modules


def load_triton_first() -> bool:
  """Loads triton's compiled library if triton is installed and TensorFlow is not loaded yet; True if it did.

  A triton that fails to import for any other reason is left for torch to report, as it would without this.
  """
  if triton_loaded() or tensorflow_loaded() or not _installed('triton'):
    return False
  try:
    importlib.import_module(TRITON_LIBRARY)
  except Exception:  # pylint: disable=broad-except  (torch reports a broken triton itself, later, if it needs it)
    return False
  return True


def check_triton_loadable(what: str = 'torch') -> None:
  """Raises a one-line error where loading `what` would load triton after TensorFlow and crash the process."""
  if tensorflow_loaded() and not triton_loaded() and _installed('triton'):
    raise RuntimeError(
        f'TensorFlow was imported before triton, and importing {what} now would crash this process (a segmentation '
        'fault as triton loads): import specdec (or triton) before seqio or tensorflow; see docs/install.md.')


@contextlib.contextmanager
def _stderr_to_devnull():
  """Points file descriptor 2 at /dev/null (C++ libraries write there directly, past sys.stderr)."""
  sys.stderr.flush()
  saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  try:
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def import_tensorflow_quietly() -> None:
  """Imports TensorFlow (seqio's input pipeline, the project's only use of it) kept off accelerators and quiet.

  TF prints start-up noise (oneDNN banners, "failed call to cuInit", cache_dataset_ops warnings) that says nothing
  about this project. Its C++ log level is read once, so it is raised only while TF loads and lists its devices,
  then put back for JAX (which reads the same variable, TF_CPP_MIN_LOG_LEVEL). TF is kept off GPUs so it never
  takes accelerator memory from JAX. SPECDEC_TF_LOGS=1 shows everything.
  """
  if 'tensorflow' in sys.modules or os.environ.get('SPECDEC_TF_LOGS') == '1':
    return
  level = os.environ.get('TF_CPP_MIN_LOG_LEVEL')
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
  try:
    with _stderr_to_devnull():  # the banners printed while TF's libraries load ignore the log level
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      # seqio loads more of TF's libraries (text ops), and each reads the level as it loads.
      import seqio  # pylint: disable=g-import-not-at-top,unused-import
      try:
        tf.config.set_visible_devices([], 'GPU')
      except RuntimeError:  # TF's devices are already initialised (TF was used before): leave them
        pass
  finally:
    if level is None:
      os.environ.pop('TF_CPP_MIN_LOG_LEVEL', None)
    else:
      os.environ['TF_CPP_MIN_LOG_LEVEL'] = level
  tf.get_logger().setLevel('ERROR')  # TF's Python-side deprecation warnings
