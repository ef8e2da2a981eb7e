"""Paths that may be local or URLs (gs://...): one set of file helpers for both.

A local path goes through `os` and the builtin `open`, exactly as plain code
would. A path with a scheme (`gs://bucket/dir`, `ram://...` in tests, any
scheme tf.io.gfile has a filesystem for) goes through `tensorflow.io.gfile`,
imported on first use (TensorFlow comes with seqio; a local-only run never
imports it here). Orbax and TensorStore take gs:// paths as they are, so
`abspath` leaves URLs unchanged.

Object stores are not disks, and callers must know where they differ:
- No rename: `replace` / `rename` of a URL copy, then delete the source (a
  kill in between leaves both; nothing is lost). A directory is copied file
  by file.
- No append: `append_text` to a URL reads the object and writes it back
  whole: O(size) per call (fine for small logs) and for one writer at a time.
- `atomic_write` of a URL uploads a temporary object beside the target,
  then renames it over the target (on GCS a server-side copy, which
  replaces the object atomically). Writing the target directly would be
  atomic on GCS too, but not on every gfile filesystem: TensorFlow's ram://
  appends to an existing file opened for writing.
- Directories are name prefixes: `listdir` drops the '/' that GCS appends to
  subdirectory names.
gfile's errors are raised as the builtin ones (FileNotFoundError,
FileExistsError, PermissionError), as for local paths.

Besides the path helpers: content hashes (`sha256_hex`), hash-checked reads
(`read_verified`), and JSON / JSON Lines files read and written whole. This
module imports nothing from specdec, so every other module may use it.
"""

import builtins
import contextlib
import hashlib
import json
import os
import posixpath
import re
import tempfile
import uuid
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Union

PathLike = Union[str, os.PathLike]

_URL = re.compile(r'[A-Za-z][A-Za-z0-9+.-]*://')


def is_url(path: PathLike) -> bool:
  """True for 'scheme://...' (gs://, ram://, ...); False for a local path."""
  return bool(_URL.match(os.fspath(path)))


def _tf():
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (slow; only for URLs)
  except ImportError as e:
    raise ImportError('Paths with a scheme (gs://...) are read and written through '
                      'tensorflow.io.gfile: install tensorflow.') from e
  return tf


@contextlib.contextmanager
def _builtin_errors(path: str):
  """Raises gfile's errors as the builtin ones callers already catch for local paths."""
  tf = _tf()
  try:
    yield tf.io.gfile
  except tf.errors.NotFoundError as e:
    raise FileNotFoundError(f'{path}: not found ({e.message})') from e
  except tf.errors.AlreadyExistsError as e:
    raise FileExistsError(f'{path}: already exists ({e.message})') from e
  except tf.errors.PermissionDeniedError as e:
    raise PermissionError(f'{path}: permission denied ({e.message})') from e


# -----------------------------------------------------------------------------
# Path names (no I/O).
# -----------------------------------------------------------------------------


def join(path: PathLike, *parts: str) -> str:
  """os.path.join; '/'-joined for a URL."""
  path = os.fspath(path)
  return posixpath.join(path, *parts) if is_url(path) else os.path.join(path, *parts)


def abspath(path: PathLike) -> str:
  """os.path.abspath for a local path; a URL unchanged (it is absolute already)."""
  path = os.fspath(path)
  return path if is_url(path) else os.path.abspath(path)


def _split_url(path: str):
  scheme, rest = path.split('://', 1)
  return scheme + '://', rest


def normpath(path: PathLike) -> str:
  """os.path.normpath; for a URL, of the part after 'scheme://' (which it keeps).

  (os.path.normpath would turn 'gs://b/x' into 'gs:/b/x'.)
  """
  path = os.fspath(path)
  if not is_url(path):
    return os.path.normpath(path)
  prefix, rest = _split_url(path)
  return prefix + (posixpath.normpath(rest) if rest else '')


def dirname(path: PathLike) -> str:
  """os.path.dirname; never above a URL's 'scheme://bucket'."""
  path = os.fspath(path)
  if not is_url(path):
    return os.path.dirname(path)
  prefix, rest = _split_url(path)
  return prefix + posixpath.dirname(rest)


def basename(path: PathLike) -> str:
  path = os.fspath(path)
  return posixpath.basename(path) if is_url(path) else os.path.basename(path)


# -----------------------------------------------------------------------------
# Queries.
# -----------------------------------------------------------------------------


def exists(path: PathLike) -> bool:
  path = os.fspath(path)
  if not is_url(path):
    return os.path.exists(path)
  with _builtin_errors(path) as gfile:
    return gfile.exists(path)


def isdir(path: PathLike) -> bool:
  path = os.fspath(path)
  if not is_url(path):
    return os.path.isdir(path)
  with _builtin_errors(path) as gfile:
    return gfile.isdir(path)


def isfile(path: PathLike) -> bool:
  path = os.fspath(path)
  if not is_url(path):
    return os.path.isfile(path)
  with _builtin_errors(path) as gfile:
    return gfile.exists(path) and not gfile.isdir(path)


def listdir(path: PathLike) -> List[str]:
  """Entry names of a directory (FileNotFoundError if there is none)."""
  path = os.fspath(path)
  if not is_url(path):
    return os.listdir(path)
  with _builtin_errors(path) as gfile:
    if not gfile.isdir(path):  # gfile lists some missing prefixes as empty
      raise FileNotFoundError(f'No directory at {path}.')
    return [name.rstrip('/') for name in gfile.listdir(path)]


# -----------------------------------------------------------------------------
# Reading and writing.
# -----------------------------------------------------------------------------


def makedirs(path: PathLike, exist_ok: bool = True) -> None:
  """os.makedirs (parents too). Object stores have no empty directories to
  make: there it only checks that no file is in the way."""
  path = os.fspath(path)
  if not is_url(path):
    os.makedirs(path, exist_ok=exist_ok)
    return
  with _builtin_errors(path) as gfile:
    if gfile.exists(path) and (not exist_ok or not gfile.isdir(path)):
      raise FileExistsError(f'{path} already exists'
                            + ('' if gfile.isdir(path) else ' (a file)') + '.')
    gfile.makedirs(path)


def open(path: PathLike, mode: str = 'r', encoding=None):  # pylint: disable=redefined-builtin
  """A file object: the builtin open for a local path, a gfile.GFile for a URL.

  URLs: text is UTF-8 ('r', 'w'; binary 'rb', 'wb'); no appending ('a':
  use `append_text`) nor '+' modes, which object stores do not have.
  """
  path = os.fspath(path)
  if not is_url(path):
    return builtins.open(path, mode, encoding=encoding)
  if mode.replace('b', '').replace('t', '') not in ('r', 'w'):
    raise ValueError(f'{path}: mode {mode!r} is not supported for URLs (only r, w, rb, '
                     'wb; append with fileio.append_text).')
  if encoding not in (None, 'utf-8', 'utf8', 'UTF-8'):
    raise ValueError(f'{path}: URLs are read and written as UTF-8, not {encoding!r}.')
  with _builtin_errors(path) as gfile:
    # GFile opens lazily: a missing file would only fail at the first read.
    if mode.startswith('r') and not gfile.exists(path):
      raise FileNotFoundError(f'No file at {path}.')
    if mode.startswith('w') and gfile.exists(path):
      if gfile.isdir(path):
        raise IsADirectoryError(f'{path} is a directory.')
      gfile.remove(path)  # truncate, as builtin open: some filesystems (ram://) would append
    return gfile.GFile(path, mode)


def append_text(path: PathLike, text: str) -> None:
  """Appends `text` (UTF-8) to a file, creating it if missing.

  Local: an ordinary append. URL: objects cannot be appended to, so the
  object is read and written back whole with `text` at its end (an atomic
  replacement: a kill leaves the old or the new object). One writer at a
  time: concurrent appends to one URL can lose each other's text.
  """
  path = os.fspath(path)
  if not is_url(path):
    with builtins.open(path, 'a', encoding='utf-8') as f:
      f.write(text)
    return
  with _builtin_errors(path) as gfile:
    old = b''
    if gfile.exists(path):
      with gfile.GFile(path, 'rb') as f:
        old = f.read()
  atomic_write(path, old + text.encode('utf-8'))


def atomic_write(path: PathLike, data: bytes) -> None:
  """Writes `data` to `path` so that readers see the old or the new contents, never part.

  Local: a temp file in the same directory (readable by all), synced to
  disk, then os.replace (a failed write removes it). URL: a temporary
  object beside it, renamed over it (see the module docstring; a kill can
  leave the '.tmp-' object behind). The parent directory is made if missing.
  """
  path = os.fspath(path)
  if is_url(path):
    makedirs(dirname(path))
    tmp = f'{path}.tmp-{uuid.uuid4().hex}'
    with _builtin_errors(path) as gfile:
      try:
        with gfile.GFile(tmp, 'wb') as f:
          f.write(data)
        gfile.rename(tmp, path, overwrite=True)
      finally:
        if gfile.exists(tmp):
          gfile.remove(tmp)
    return
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f'.{os.path.basename(path)}.',
                             suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())  # on disk before the rename makes it visible
    os.chmod(tmp, 0o644)  # mkstemp makes files private
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


# -----------------------------------------------------------------------------
# Hashes and hash-checked reads.
# -----------------------------------------------------------------------------


def sha256_hex(data: bytes) -> str:
  """The sha256 of `data` as 64 hex digits."""
  return hashlib.sha256(data).hexdigest()


def file_sha256(path: PathLike) -> str:
  """The sha256 of a file's bytes as 64 hex digits, read in 1 MiB blocks (large files fit)."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


# The field of a JSON metadata object (a model directory's config.json) that
# records {file name: sha256 hex of its bytes}.
FILES_FIELD = 'files'


def recorded_sha256(meta: Mapping[str, Any], name: str) -> Optional[str]:
  """The sha256 that `meta` records for the file `name`; None if none is recorded."""
  return (meta.get(FILES_FIELD) or {}).get(name)


def read_verified(path: PathLike, sha256: Optional[str], recorded_in: str) -> bytes:
  """The bytes of `path`, checked against `sha256` (hex) that `recorded_in` records.

  `sha256` None (a file written before hashes were recorded) reads it
  unchecked. FileNotFoundError if there is no file; ValueError naming the
  file if its bytes hash to something else (damaged, truncated or modified).
  """
  path = os.fspath(path)
  if not exists(path):
    raise FileNotFoundError(f'No {basename(path)} at {path}.')
  with open(path, 'rb') as f:
    data = f.read()
  if sha256 is not None and sha256_hex(data) != sha256:
    raise ValueError(
        f'{path}: damaged, truncated or modified file (sha256 '
        f'{sha256_hex(data)[:16]}..., {recorded_in} records {sha256[:16]}...).')
  return data


# -----------------------------------------------------------------------------
# JSON and JSON Lines files.
# -----------------------------------------------------------------------------


def read_json_object(path: PathLike, kind: str = 'JSON file') -> Dict[str, Any]:
  """The JSON object in `path` (UTF-8).

  FileNotFoundError if there is no file; ValueError naming the file (as a
  `kind`) if it is not UTF-8, not JSON, or holds something else than an object.
  """
  path = os.fspath(path)
  if not exists(path):
    raise FileNotFoundError(f'No {kind} at {path}.')
  try:
    with open(path, 'rb') as f:
      value = json.loads(f.read().decode('utf-8'))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f'{path}: damaged or incomplete {kind} ({e}).') from e
  if not isinstance(value, dict):
    raise ValueError(f'{path}: damaged {kind} (a JSON {type(value).__name__}, '
                     'expected an object).')
  return value


def write_json(path: PathLike, value: Any, indent: int = 2, sort_keys: bool = True) -> None:
  """Writes `value` as JSON (ASCII, `indent`, keys sorted unless told), atomically."""
  atomic_write(path, json.dumps(value, indent=indent, sort_keys=sort_keys).encode())


def jsonl_bytes(rows: Iterable[Mapping[str, Any]]) -> bytes:
  """JSON Lines: one object per line, UTF-8 (non-ASCII kept as it is), each line ending in a newline."""
  return b''.join(
      (json.dumps(row, ensure_ascii=False, separators=(', ', ': ')) + '\n').encode('utf-8')
      for row in rows)


def write_jsonl(path: PathLike, rows: Iterable[Mapping[str, Any]]) -> str:
  """Writes `rows` as JSON Lines (`jsonl_bytes`), atomically; returns the file's sha256 hex."""
  data = jsonl_bytes(rows)
  atomic_write(path, data)
  return sha256_hex(data)


def iter_jsonl_rows(lines: Iterable[bytes], where: str) -> Iterator[Dict[str, Any]]:
  """The JSON objects of JSON Lines given as raw byte lines; blank lines skipped.

  A line that is not UTF-8, not JSON or not an object raises ValueError
  naming `where` and the 1-based line number.
  """
  for line_no, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line.decode('utf-8'))
    except UnicodeDecodeError as e:
      raise ValueError(f'{where}:{line_no}: not UTF-8 ({e.reason} at byte '
                       f'{e.start} of the line): the file is damaged or was '
                       'not written as JSON Lines') from None
    except json.JSONDecodeError as e:
      raise ValueError(f'{where}:{line_no}: not valid JSON ({e})') from None
    if not isinstance(row, dict):
      raise ValueError(f'{where}:{line_no}: a JSON {type(row).__name__}, '
                       'expected an object (one row per line)')
    yield row


def count_jsonl_rows(lines: Iterable[bytes], where: str) -> int:
  """Checks every line (see `iter_jsonl_rows`); returns the number of rows."""
  return sum(1 for _ in iter_jsonl_rows(lines, where))


def read_jsonl(path: PathLike) -> List[Dict[str, Any]]:
  """The rows of a JSON Lines file (`iter_jsonl_rows`: every line checked).

  FileNotFoundError if there is no file.
  """
  path = os.fspath(path)
  if not exists(path):
    raise FileNotFoundError(f'No JSON Lines file at {path}.')
  with open(path, 'rb') as f:
    return list(iter_jsonl_rows(f.read().split(b'\n'), path))


# -----------------------------------------------------------------------------
# Moving.
# -----------------------------------------------------------------------------


def replace(src: PathLike, dst: PathLike) -> None:
  """Moves a file or directory to `dst`, replacing a file (or an empty directory) there.

  Two local paths: os.replace (atomic, same filesystem). Otherwise (a URL on
  either side): copy, then delete the source; not atomic (see the module
  docstring).
  """
  src, dst = os.fspath(src), os.fspath(dst)
  if not is_url(src) and not is_url(dst):
    os.replace(src, dst)
    return
  _copy_then_delete(src, dst)


def rename(src: PathLike, dst: PathLike) -> None:
  """As `replace`, but FileExistsError if anything is at `dst` already."""
  if exists(dst):
    raise FileExistsError(f'Cannot move {os.fspath(src)} to {os.fspath(dst)}: it exists.')
  replace(src, dst)


def _copy_then_delete(src: str, dst: str) -> None:
  with _builtin_errors(src) as gfile:
    if not gfile.exists(src):
      raise FileNotFoundError(f'No file or directory at {src}.')
    if not gfile.isdir(src):
      if gfile.isdir(dst):
        raise IsADirectoryError(f'Cannot replace the directory {dst} by the file {src}.')
      gfile.makedirs(dirname(dst))
      # gfile's rename of a URL object is a copy, then a delete (GCS has no rename).
      gfile.rename(src, dst, overwrite=True)
      return
    if gfile.exists(dst) and (not gfile.isdir(dst) or gfile.listdir(dst)):
      raise FileExistsError(f'Cannot move the directory {src} to {dst}: a file or a '
                            'non-empty directory is there.')
    # Each file copied by its path relative to src (gfile itself has no
    # directory move that works on every filesystem).
    top = src.rstrip('/')
    for root, _, files in gfile.walk(top):
      relative = root[len(top):].lstrip('/\\')
      target = join(dst, relative) if relative else dst
      gfile.makedirs(target)
      for name in files:
        gfile.copy(join(root, name), join(target, name), overwrite=True)
    gfile.rmtree(top)
