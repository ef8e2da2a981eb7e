"""Tests for specdec/fileio.py and the gs:// paths of train.py / checkpoints.py.

GCS cannot be reached here: TensorFlow's in-memory filesystem (`ram://`)
stands in for it, as another URL tf.io.gfile serves. Every helper runs on a
ram:// URL and on a local tmp_path. Each test runs in a fresh working
directory and checks that no local 'ram:' directory appeared there: a URL
that fell back to `os` would have made one (os.makedirs('ram://x') makes
./ram:/x). Orbax and TensorStore do not serve ram://, so training itself
and Orbax checkpoints are not run on it; their directory logic (step
listing, moving a damaged step) is.
"""

import ast
import json
import os
import uuid

import jax
import numpy as np
import pytest
import tensorflow as tf

from specdec import checkpoints
from specdec import fileio
from specdec import loading
from specdec import network
from specdec import ngram
from specdec import t5x_checkpoint
from specdec.training import train

CFG = network.t5_1_1_config('tiny', vocab_size=64)


@pytest.fixture(autouse=True)
def no_local_fallback(tmp_path_factory, monkeypatch):
  """Runs each test in an empty directory; afterwards, nothing named 'ram:' may be in it."""
  cwd = tmp_path_factory.mktemp('cwd')
  monkeypatch.chdir(cwd)
  yield
  assert os.listdir(cwd) == [], f'a URL path was written locally: {os.listdir(cwd)}'


@pytest.fixture
def ram_dir():
  """A fresh directory on TensorFlow's in-memory filesystem (process-wide: unique names)."""
  path = f'ram://specdec_fileio_test/{uuid.uuid4().hex}'
  yield path
  if tf.io.gfile.exists(path):
    tf.io.gfile.rmtree(path)


@pytest.fixture(params=['local', 'url'])
def base(request, tmp_path):
  """The same test on a local directory and on a ram:// URL."""
  if request.param == 'local':
    return str(tmp_path / 'base')
  return request.getfixturevalue('ram_dir')


def _on_gfile(path):
  """True if `path` is visible through tf.io.gfile (for a URL: it really went there)."""
  return tf.io.gfile.exists(path)


@pytest.fixture(scope='module')
def params():
  return network.init_params(CFG, jax.random.PRNGKey(0))


# -----------------------------------------------------------------------------
# Path names.
# -----------------------------------------------------------------------------


def test_fileio_is_the_lowest_floor():
  """fileio imports nothing from specdec, so every module may import it without a circle."""
  tree = ast.parse(open(fileio.__file__, encoding='utf-8').read())
  imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
  imported += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
  assert not [name for name in imported if name and name.split('.')[0] == 'specdec']


def test_is_url():
  assert fileio.is_url('gs://bucket/dir') and fileio.is_url('ram://x')
  assert not fileio.is_url('/var/lib/x') and not fileio.is_url('runs/target')
  assert not fileio.is_url('weird/gs://x')  # a scheme only at the start
  assert fileio.is_url(type('P', (os.PathLike,), {'__fspath__': lambda s: 'gs://b'})())


def test_path_names():
  assert fileio.join('gs://b/m', 'checkpoints', '5') == 'gs://b/m/checkpoints/5'
  assert fileio.join('gs://b/m/', 'x') == 'gs://b/m/x'
  assert fileio.join('runs', 'x') == os.path.join('runs', 'x')
  assert fileio.abspath('gs://b/m') == 'gs://b/m'
  assert fileio.abspath('runs/x') == os.path.abspath('runs/x')
  # os.path.normpath would make 'gs:/b/m'.
  assert fileio.normpath('gs://b/m/../n/') == 'gs://b/n'
  assert fileio.normpath('runs//x/') == 'runs/x'
  assert fileio.dirname('gs://b/m/target') == 'gs://b/m'
  assert fileio.dirname(fileio.normpath('gs://b/m/target/')) == 'gs://b/m'
  assert fileio.dirname('gs://b') == 'gs://'
  assert fileio.basename('gs://b/m/small') == 'small'
  assert fileio.basename('/a/b') == 'b'


# -----------------------------------------------------------------------------
# Every helper, local and URL.
# -----------------------------------------------------------------------------


def test_makedirs_exists_isdir_listdir(base):
  assert not fileio.exists(base) and not fileio.isdir(base)
  fileio.makedirs(fileio.join(base, 'a', 'b'))
  fileio.makedirs(fileio.join(base, 'a', 'b'))  # exist_ok by default
  with pytest.raises(FileExistsError):
    fileio.makedirs(fileio.join(base, 'a'), exist_ok=False)
  with fileio.open(fileio.join(base, 'a', 'f.txt'), 'w') as f:
    f.write('x')
  assert fileio.exists(base) and fileio.isdir(fileio.join(base, 'a', 'b'))
  assert fileio.isfile(fileio.join(base, 'a', 'f.txt'))
  assert not fileio.isfile(fileio.join(base, 'a', 'b'))
  assert not fileio.isdir(fileio.join(base, 'a', 'f.txt'))
  assert sorted(fileio.listdir(fileio.join(base, 'a'))) == ['b', 'f.txt']
  with pytest.raises(FileExistsError):  # a file is in the way
    fileio.makedirs(fileio.join(base, 'a', 'f.txt'))
  with pytest.raises(FileNotFoundError):
    fileio.listdir(fileio.join(base, 'missing'))
  if fileio.is_url(base):
    assert _on_gfile(fileio.join(base, 'a', 'f.txt'))


def test_open_text_and_binary(base):
  fileio.makedirs(base)
  text, binary = fileio.join(base, 't.txt'), fileio.join(base, 'b.bin')
  with fileio.open(text, 'w') as f:
    f.write('one\ntwo — ünïcode\n')
  with fileio.open(binary, 'wb') as f:
    f.write(bytes(range(256)))
  with fileio.open(text) as f:
    assert f.read() == 'one\ntwo — ünïcode\n'
  with fileio.open(binary, 'rb') as f:
    assert f.read() == bytes(range(256))
  with pytest.raises(FileNotFoundError):
    fileio.open(fileio.join(base, 'missing.txt'))
  with fileio.open(text, 'w') as f:  # 'w' truncates, as the builtin open
    f.write('1')
  with fileio.open(text) as f:
    assert f.read() == '1'
  if fileio.is_url(base):
    with tf.io.gfile.GFile(binary, 'rb') as f:
      assert f.read() == bytes(range(256))


def test_append_text(base):
  path = fileio.join(base, 'log.jsonl')
  fileio.makedirs(base)
  fileio.append_text(path, 'a\n')  # creates
  fileio.append_text(path, 'b\n')
  with fileio.open(path) as f:
    assert f.read() == 'a\nb\n'


def test_atomic_write(base):
  path = fileio.join(base, 'sub', 'file.bin')  # the parent is made
  fileio.atomic_write(path, b'first, longer contents')
  fileio.atomic_write(path, b'second')
  with fileio.open(path, 'rb') as f:
    assert f.read() == b'second'
  assert fileio.listdir(fileio.join(base, 'sub')) == ['file.bin']  # no temp files left


def test_local_atomic_write_goes_through_a_rename(tmp_path, monkeypatch):
  """The destination only ever appears complete (os.replace of a temp file)."""
  renames = []
  real_replace = os.replace

  def spy(src, dst):
    with open(src, 'rb') as f:
      renames.append((src, dst, f.read()))
    real_replace(src, dst)

  monkeypatch.setattr(os, 'replace', spy)
  path = tmp_path / 'file.bin'
  fileio.atomic_write(str(path), b'payload')
  assert len(renames) == 1
  src, dst, data = renames[0]
  assert os.path.abspath(dst) == str(path)
  assert os.path.dirname(src) == str(tmp_path)  # same filesystem
  assert src != dst and data == b'payload'


def test_atomic_write_leaves_nothing_when_writing_fails(tmp_path, monkeypatch):
  path = str(tmp_path / 'file.bin')
  fileio.atomic_write(path, b'old')
  monkeypatch.setattr(os, 'replace', lambda a, b: (_ for _ in ()).throw(OSError('disk full')))
  with pytest.raises(OSError, match='disk full'):
    fileio.atomic_write(path, b'new')
  assert os.listdir(tmp_path) == ['file.bin']
  assert (tmp_path / 'file.bin').read_bytes() == b'old'


# -----------------------------------------------------------------------------
# Hashes, hash-checked reads, JSON and JSON Lines.
# -----------------------------------------------------------------------------


def test_sha256_hex():
  assert fileio.sha256_hex(b'') == (
      'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855')


def test_file_sha256(base):
  path = fileio.join(base, 'big.bin')
  data = bytes(range(256)) * 5000  # more than one 1 MiB block
  fileio.atomic_write(path, data)
  assert fileio.file_sha256(path) == fileio.sha256_hex(data)


def test_read_verified(base):
  path = fileio.join(base, 'params.msgpack')
  fileio.atomic_write(path, b'payload')
  digest = fileio.sha256_hex(b'payload')
  assert fileio.read_verified(path, digest, 'config.json') == b'payload'
  assert fileio.read_verified(path, None, 'config.json') == b'payload'  # nothing recorded
  fileio.atomic_write(path, b'payloaD')
  with pytest.raises(ValueError, match=f'^{path}: damaged, truncated or modified file '
                     rf'\(sha256 [0-9a-f]{{16}}\.\.\., config.json records {digest[:16]}'):
    fileio.read_verified(path, digest, 'config.json')
  with pytest.raises(FileNotFoundError, match='No missing.bin at'):
    fileio.read_verified(fileio.join(base, 'missing.bin'), digest, 'config.json')


def test_json_object_round_trip(base):
  path = fileio.join(base, 'meta.json')
  fileio.write_json(path, {'b': 1, 'a': [1, 2]})
  with fileio.open(path, 'rb') as f:
    assert f.read() == b'{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}'
  assert fileio.read_json_object(path) == {'a': [1, 2], 'b': 1}


@pytest.mark.parametrize('data, message', [
    (b'{"a": ', 'damaged or incomplete config file'),
    (b'\xff\xfe{', 'damaged or incomplete config file'),
    (b'[1, 2]', r'damaged config file \(a JSON list, expected an object\)'),
])
def test_read_json_object_names_a_damaged_file(base, data, message):
  path = fileio.join(base, 'config.json')
  fileio.atomic_write(path, data)
  with pytest.raises(ValueError, match=f'^{path}: {message}'):
    fileio.read_json_object(path, kind='config file')


def test_read_json_object_missing(base):
  with pytest.raises(FileNotFoundError, match='No config file at'):
    fileio.read_json_object(fileio.join(base, 'config.json'), kind='config file')


def test_jsonl_round_trip(base):
  path = fileio.join(base, 'rows.jsonl')
  rows = [{'inputs': 'Größe', 'n': 1}, {'inputs': 'b'}]
  digest = fileio.write_jsonl(path, rows)
  with fileio.open(path, 'rb') as f:
    data = f.read()
  assert data == '{"inputs": "Größe", "n": 1}\n{"inputs": "b"}\n'.encode('utf-8')
  assert data == fileio.jsonl_bytes(rows)
  assert digest == fileio.sha256_hex(data)
  assert fileio.read_jsonl(path) == rows
  fileio.write_jsonl(path, [])
  assert fileio.read_jsonl(path) == []
  with pytest.raises(FileNotFoundError):
    fileio.read_jsonl(fileio.join(base, 'missing.jsonl'))


@pytest.mark.parametrize('line, message', [
    (b'{"inputs": "caf\xe9"}', r'not UTF-8 \(invalid continuation byte at byte 15'),
    (b'{"inputs": ', 'not valid JSON'),
    (b'[1, 2]', r'a JSON list, expected an object'),
])
def test_jsonl_rows_name_the_bad_line(base, line, message):
  path = fileio.join(base, 'rows.jsonl')
  fileio.atomic_write(path, b'{"inputs": "a"}\n\n' + line + b'\n')
  with pytest.raises(ValueError, match=f'^{path}:3: {message}'):
    fileio.read_jsonl(path)
  with pytest.raises(ValueError, match=f'^x.jsonl:3: {message}'):
    fileio.count_jsonl_rows([b'{"inputs": "a"}\n', b'\n', line], 'x.jsonl')
  assert fileio.count_jsonl_rows([b'{"inputs": "a"}\n', b'\n', b'{}'], 'x.jsonl') == 2
  assert list(fileio.iter_jsonl_rows([b'{"a": 1}', b' \n'], 'x')) == [{'a': 1}]


@pytest.mark.parametrize('bad_line, problem', [
    (b'{"inputs": "caf\xe9"}', r'not UTF-8 \(invalid continuation byte at byte 15'),
    (b'{"inputs": "a", ', 'not valid JSON'),
    (b'["a", "b"]', 'a JSON list, expected an object'),
])
def test_bad_jsonl_line_names_file_and_line(tmp_path, bad_line, problem):
  path = tmp_path / 'train.jsonl'
  path.write_bytes(b'{"inputs": "a"}\n\n{"inputs": "b"}\n' + bad_line + b'\n')
  with pytest.raises(ValueError, match=f'^{path}:4: {problem}'):
    fileio.read_jsonl(str(path))
  with pytest.raises(ValueError, match=f'^x.jsonl:4: {problem}'):
    fileio.count_jsonl_rows(path.read_bytes().splitlines(True), 'x.jsonl')


def test_jsonl_rows_skip_blank_lines(tmp_path):
  path = tmp_path / 'ok.jsonl'
  path.write_bytes('{"inputs": "Größe"}\n\n  \n{"inputs": "b"}'.encode('utf-8'))
  assert fileio.read_jsonl(str(path)) == [{'inputs': 'Größe'}, {'inputs': 'b'}]
  assert fileio.count_jsonl_rows(path.read_bytes().splitlines(True), 'ok') == 2


def test_replace_and_rename_a_file(base):
  src, dst = fileio.join(base, 'src.txt'), fileio.join(base, 'dst.txt')
  fileio.atomic_write(src, b'new')
  fileio.atomic_write(dst, b'old')
  fileio.replace(src, dst)
  assert not fileio.exists(src)
  with fileio.open(dst, 'rb') as f:
    assert f.read() == b'new'
  fileio.atomic_write(src, b'again')
  with pytest.raises(FileExistsError):
    fileio.rename(src, dst)
  fileio.rename(src, fileio.join(base, 'other.txt'))
  assert sorted(fileio.listdir(base)) == ['dst.txt', 'other.txt']
  with pytest.raises(FileNotFoundError):
    fileio.replace(fileio.join(base, 'missing'), dst)


def test_replace_a_directory(base):
  """How a damaged checkpoint step is moved aside: a tree with nested files."""
  src = fileio.join(base, 'checkpoints', '7')
  fileio.atomic_write(fileio.join(src, 'default', '_METADATA'), b'm')
  fileio.atomic_write(fileio.join(src, 'default', 'd', 'chunk'), b'c')
  fileio.atomic_write(fileio.join(src, '_CHECKPOINT_METADATA'), b't')
  dst = fileio.join(base, 'damaged_checkpoints', '7-123')
  fileio.makedirs(fileio.dirname(dst))
  fileio.replace(src, dst)
  assert not fileio.exists(src)
  assert fileio.listdir(fileio.join(base, 'checkpoints')) == []
  assert sorted(fileio.listdir(dst)) == ['_CHECKPOINT_METADATA', 'default']
  with fileio.open(fileio.join(dst, 'default', 'd', 'chunk'), 'rb') as f:
    assert f.read() == b'c'


def test_url_modes_and_encodings_refused(ram_dir):
  path = fileio.join(ram_dir, 'x.txt')
  for mode in ('a', 'ab', 'r+', 'w+'):
    with pytest.raises(ValueError, match='not supported for URLs'):
      fileio.open(path, mode)
  with pytest.raises(ValueError, match='UTF-8'):
    fileio.open(path, 'w', encoding='latin-1')


def test_url_errors_are_builtin(ram_dir):
  with pytest.raises(FileNotFoundError):
    fileio.replace(fileio.join(ram_dir, 'nope'), fileio.join(ram_dir, 'x'))
  fileio.atomic_write(fileio.join(ram_dir, 'dir', 'f'), b'1')
  fileio.atomic_write(fileio.join(ram_dir, 'other', 'g'), b'2')
  with pytest.raises(FileExistsError, match='non-empty'):
    fileio.replace(fileio.join(ram_dir, 'dir'), fileio.join(ram_dir, 'other'))


def test_local_replace_is_os_replace(tmp_path, monkeypatch):
  """Local paths keep their atomic rename (nothing changes for local users)."""
  calls = []
  real = os.replace
  monkeypatch.setattr(os, 'replace', lambda a, b: (calls.append((a, b)), real(a, b)))
  (tmp_path / 'a').write_bytes(b'x')
  fileio.replace(str(tmp_path / 'a'), str(tmp_path / 'b'))
  assert calls == [(str(tmp_path / 'a'), str(tmp_path / 'b'))]


# -----------------------------------------------------------------------------
# train.py's files on a URL model_dir.
# -----------------------------------------------------------------------------


def test_train_log_on_url(ram_dir):
  path = fileio.join(ram_dir, 'train_log.jsonl')
  fileio.makedirs(ram_dir)
  assert train.drop_log_after(path, 3) == 0 and not fileio.exists(path)
  for step in range(1, 7):
    train.append_log(path, {'step': step, 'kind': 'train'})
  train.append_log(path, {'step': 4, 'kind': 'eval'})
  assert len(fileio.read_jsonl(path)) == 7
  assert train.drop_log_after(path, 4) == 2
  with tf.io.gfile.GFile(path) as f:
    assert [json.loads(line)['step'] for line in f] == [1, 2, 3, 4, 4]
  assert train.drop_log_after(path, 4) == 0


def test_run_records_on_url(ram_dir):
  path = fileio.join(ram_dir, 'runs.jsonl')
  train.put_run_record(path, {'run_id': 'a', 'to_step': 7, 'status': 'running'})
  train.put_run_record(path, {'run_id': 'a', 'to_step': 9, 'status': 'running'})
  train.put_run_record(path, {'run_id': 'b', 'to_step': 9, 'status': 'running'})
  assert [(r['run_id'], r['status'], r['to_step']) for r in fileio.read_jsonl(path)] == [
      ('a', 'interrupted', 9), ('b', 'running', 9)]
  assert _on_gfile(path)


class _FakeManager:
  """An Orbax manager's surface that restore_latest_good uses: step 2 fails to restore."""

  def __init__(self, directory):
    self.directory = directory

  def all_steps(self):
    return [1, 2]

  def restore(self, step, args):
    del args
    if step == 2:
      raise ValueError('truncated chunk')
    return {'step': step}


def test_damaged_checkpoint_moved_on_url(ram_dir, capsys):
  checkpoint_dir = fileio.join(ram_dir, 'checkpoints')
  for step in (1, 2):
    fileio.atomic_write(fileio.join(checkpoint_dir, str(step), 'default', '_METADATA'), b'{}')
  damaged_dir = fileio.join(ram_dir, 'damaged_checkpoints')
  step, state = train.restore_latest_good(_FakeManager(checkpoint_dir), None, damaged_dir)
  assert (step, state) == (1, {'step': 1})
  assert fileio.listdir(checkpoint_dir) == ['1']
  [moved] = fileio.listdir(damaged_dir)
  assert moved.startswith('2-')
  assert fileio.isfile(fileio.join(damaged_dir, moved, 'default', '_METADATA'))
  assert 'Moved damaged checkpoint step 2' in capsys.readouterr().out


# -----------------------------------------------------------------------------
# checkpoints.py (and the loaders on top of it) on URLs.
# -----------------------------------------------------------------------------


def test_compact_round_trip_on_url(ram_dir, params):
  directory = fileio.join(ram_dir, 'export')
  checkpoints.save_compact(directory, CFG, params, extra={'train': {'step': 3}})
  assert sorted(tf.io.gfile.listdir(directory)) == [checkpoints.CONFIG_FILE,
                                                    checkpoints.PARAMS_FILE]
  assert checkpoints.detect_format(directory) == 'compact'
  assert checkpoints.load_config_for(directory) == CFG
  assert fileio.read_json_object(fileio.join(directory, 'config.json'))['train'] == {'step': 3}
  config, loaded = checkpoints.load_compact(directory)
  assert config == CFG
  expected = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      lambda x: np.asarray(x.astype('bfloat16').astype('float32')), params))
  for got, want in zip(jax.tree_util.tree_leaves(loaded), expected):
    np.testing.assert_array_equal(np.asarray(got), want)
  restored = checkpoints.restore_params(directory, CFG)
  for got, want in zip(jax.tree_util.tree_leaves(restored), expected):
    np.testing.assert_array_equal(np.asarray(got), want)
  module, _ = loading.load_module_and_params(directory)
  assert module.config == CFG


def test_compact_hash_checked_on_url(ram_dir, params):
  directory = fileio.join(ram_dir, 'export')
  checkpoints.save_compact(directory, CFG, params)
  path = fileio.join(directory, checkpoints.PARAMS_FILE)
  with tf.io.gfile.GFile(path, 'rb') as f:
    data = f.read()
  with fileio.open(path, 'wb') as f:  # truncates (a bare ram:// GFile would append)
    f.write(data[:-1] + bytes([data[-1] ^ 1]))
  with pytest.raises(ValueError, match='damaged, truncated or modified'):
    checkpoints.load_compact(directory)
  checkpoints.record_file_hashes(directory, [checkpoints.PARAMS_FILE])  # accepts the edit
  meta = fileio.read_json_object(fileio.join(directory, checkpoints.CONFIG_FILE))
  assert meta['files'][checkpoints.PARAMS_FILE] == fileio.sha256_hex(
      data[:-1] + bytes([data[-1] ^ 1]))


def test_detect_format_on_url(ram_dir):
  with pytest.raises(FileNotFoundError):
    checkpoints.detect_format(fileio.join(ram_dir, 'nothing'))
  # Orbax, recognised by listing: a manager directory, its newest step with an item.
  manager_dir = fileio.join(ram_dir, 'checkpoints')
  fileio.atomic_write(fileio.join(manager_dir, '4', 'default', '_METADATA'), b'{}')
  fileio.atomic_write(fileio.join(manager_dir, '12', 'default', 'manifest.ocdbt'), b'')
  fileio.makedirs(fileio.join(manager_dir, '20', 'default'))  # a step being written
  assert checkpoints.detect_format(manager_dir) == 'orbax'
  assert checkpoints._orbax_item_dir(manager_dir) == fileio.join(manager_dir, '12', 'default')
  assert checkpoints.detect_format(fileio.join(manager_dir, '4')) == 'orbax'
  # T5X: by its name, or a model directory holding checkpoint_<step>/.
  t5x_dir = fileio.join(ram_dir, 't5x')
  for step in (100, 2000):
    fileio.atomic_write(fileio.join(t5x_dir, f'checkpoint_{step}', 'checkpoint'), b'\x82')
  assert checkpoints.detect_format(t5x_dir) == 't5x'
  assert t5x_checkpoint.checkpoint_dir_of(t5x_dir) == fileio.join(t5x_dir, 'checkpoint_2000')
  assert checkpoints.detect_format('ram://nowhere/checkpoint_5') == 't5x'  # by name, no I/O
  # Hugging Face directories are read locally only.
  hf_dir = fileio.join(ram_dir, 'hf')
  fileio.atomic_write(fileio.join(hf_dir, 'config.json'), b'{}')
  fileio.atomic_write(fileio.join(hf_dir, 'model.safetensors'), b'')
  with pytest.raises(ValueError, match='remote storage.*local disk only'):
    checkpoints.detect_format(hf_dir)


def test_loaders_on_url(ram_dir, params):
  target = fileio.join(ram_dir, 'family', 'target')
  checkpoints.save_compact(target, CFG, params)
  restored = loading.restore(target)
  module, loaded = restored.module, restored.params
  assert module.config == CFG and jax.tree_util.tree_structure(loaded) == (
      jax.tree_util.tree_structure(params))
  bigram = fileio.join(ram_dir, 'family', 'bigram')
  config = ngram.NgramConfig(vocab_size=CFG.vocab_size)
  ngram.save(bigram, config, np.ones(CFG.vocab_size, np.float32),
             np.zeros((0, 3), np.int64))
  assert ngram.is_ngram_dir(bigram)
  assert isinstance(loading.restore(bigram).module, ngram.NgramLM)
  with pytest.raises(FileNotFoundError, match='Checkpoint not found'):
    loading.restore(fileio.join(ram_dir, 'family', 'missing'))
