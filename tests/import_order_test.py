"""specdec loads triton's library before TensorFlow's, and says so in one line where it is too late.

Each check runs in a fresh interpreter: what a process has loaded is the thing under test. Stand-in `triton` and
`tensorflow` packages on the path make the checks hold where the real ones are absent (the CPU torch build has no
triton); the last check uses whatever this environment installed, the real crash where triton is present.
"""

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, path=(), timeout: int = 120) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, REPO, os.environ.get('PYTHONPATH', '')]))
  return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True,
                        env=env, timeout=timeout, check=False)


@pytest.fixture(scope='module')
def stand_ins(tmp_path_factory):
  """A folder with a `triton` whose compiled library is a plain module, and an empty `tensorflow`."""
  root = tmp_path_factory.mktemp('stand_ins')
  (root / 'triton' / '_C').mkdir(parents=True)
  (root / 'triton' / '__init__.py').write_text('')
  (root / 'triton' / '_C' / '__init__.py').write_text('')
  (root / 'triton' / '_C' / 'libtriton.py').write_text('')
  (root / 'tensorflow').mkdir()
  (root / 'tensorflow' / '__init__.py').write_text('')
  return str(root)


def test_importing_specdec_loads_triton_first_where_installed(stand_ins):
  result = _run("""
      import sys
      import specdec
      assert 'triton._C.libtriton' in sys.modules, sorted(m for m in sys.modules if 'triton' in m)
      import tensorflow
      from specdec import import_order
      import_order.check_triton_loadable()
      print('ok')
      """, path=[stand_ins])
  assert result.returncode == 0 and result.stdout.strip() == 'ok', result.stderr[-2000:]


def test_tensorflow_first_is_one_line_error_before_torch(stand_ins):
  result = _run("""
      import sys
      import tensorflow
      import specdec
      from specdec import import_order
      from specdec.bench import peers
      assert 'triton._C.libtriton' not in sys.modules
      try:
        peers.require_peers()
      except RuntimeError as e:
        assert 'torch' not in sys.modules
        print(e)
      """, path=[stand_ins])
  assert result.returncode == 0, result.stderr[-2000:]
  message = result.stdout.strip()
  assert '\n' not in message and message.startswith('TensorFlow was imported before triton'), message
  assert 'import specdec (or triton) before seqio or tensorflow' in message


def test_without_triton_nothing_is_loaded_and_nothing_is_refused(tmp_path):
  (tmp_path / 'tensorflow').mkdir()
  (tmp_path / 'tensorflow' / '__init__.py').write_text('')
  result = _run("""
      import importlib.abc, sys
      class NoTriton(importlib.abc.MetaPathFinder):  # hides an installed triton
        def find_spec(self, name, path=None, target=None):
          if name == 'triton' or name.startswith('triton.'):
            raise ModuleNotFoundError(name)
      sys.meta_path.insert(0, NoTriton())
      import specdec
      from specdec import import_order
      assert not any(m.startswith('triton') for m in sys.modules)
      assert not import_order.load_triton_first()
      import tensorflow
      import_order.check_triton_loadable()
      print('ok')
      """, path=[str(tmp_path)])
  assert result.returncode == 0 and result.stdout.strip() == 'ok', result.stderr[-2000:]


def test_seqio_then_hugging_face_t5_in_one_process():
  """The order the suite and `specdec.bench.peers` create: specdec, then seqio (TensorFlow), then transformers' T5."""
  result = _run("""
      import specdec
      import seqio
      from transformers import T5ForConditionalGeneration
      print('ok')
      """, timeout=300)
  assert result.returncode == 0 and result.stdout.strip().endswith('ok'), (
      f'exit {result.returncode}: {result.stderr[-2000:]}')


def test_tensorflow_imported_quietly_keeps_the_log_level_and_stays_off_accelerators():
  result = _run("""
      import os
      os.environ['TF_CPP_MIN_LOG_LEVEL'] = '1'
      from specdec import import_order
      import_order.import_tensorflow_quietly()
      import tensorflow as tf
      print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), tf.config.get_visible_devices('GPU'))
      """, timeout=300)
  assert result.returncode == 0 and result.stdout.split() == ['1', '[]'], result.stderr[-2000:]
  for noise in ('oneDNN', 'cuInit', 'cudart', 'absl::InitializeLog'):
    assert noise not in result.stderr
