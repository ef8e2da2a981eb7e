"""T5X checkpoints (`checkpoint_<step>/`): read them leaf by leaf, and write them.

Layout, as T5X's `checkpoints.Checkpointer` writes it (version 3):

    checkpoint_<step>/checkpoint     msgpack (flax.serialization) of
        {'version': 3, 'optimizer': {'target': params, 'state': {...}}}
    checkpoint_<step>/target.encoder.layers_0.attention.query.kernel/
                                     a zarr array (TensorStore), one a leaf

In the msgpack, a small leaf is an inline array; a large one is replaced by a
TensorStore spec `{'driver': 'zarr', 'kvstore': {'driver': 'file', 'path':
'target.encoder...'}, 'metadata': {...}}` whose path is relative to the
checkpoint directory ('/' in the tree path becomes '.'), so checkpoints can be
moved. As in T5X, the kvstore driver in the file is not trusted: the
checkpoint directory's scheme decides ('gs://bucket/dir' -> TensorStore's
'gcs' driver, a local path -> 'file').

Reading opens every array's metadata (no data) and returns array-likes with
`.shape`, `.dtype` and `leaf[index] -> np.ndarray`, so callers read only the
slices their devices hold (`checkpoints.restore_params`). Only the 'target'
(params) subtree is read; optimizer state is ignored.
"""

import os
import posixpath
import re
import shutil
from typing import Any, Dict, Mapping

import flax
import jax
import numpy as np
import tensorstore as ts

from specdec import fileio

PyTree = Any

CHECKPOINT_FILE = 'checkpoint'
VERSION = 3
# Leaves up to this size are stored inline in the msgpack; larger ones as zarr.
INLINE_MAX_BYTES = 1024
# T5X's chunk target: 64 MiB chunks suit file systems and most partitionings.
_CHUNK_BYTES = 64 * 1024 * 1024
_STEP_DIR = re.compile(r'checkpoint_(\d+)$')


# -----------------------------------------------------------------------------
# Paths.
# -----------------------------------------------------------------------------


def named_like_t5x(path: str) -> bool:
  """True if `path` is named `.../checkpoint_<step>` or `.../checkpoint` (no I/O).

  How a gs:// T5X checkpoint is recognised without a round trip to the bucket.
  """
  name = posixpath.basename(path.rstrip('/'))
  return bool(_STEP_DIR.match(name)) or name == CHECKPOINT_FILE


def kvstore_spec(path: str) -> dict:
  """TensorStore kvstore spec for a directory or file path, by its scheme.

  'gs://bucket/a/b' -> {'driver': 'gcs', 'bucket': 'bucket', 'path': 'a/b'};
  a local path -> {'driver': 'file', 'path': <absolute path>}.
  """
  match = re.fullmatch(r'gs://([^/]+)/?(.*)', path, re.DOTALL)
  if match:
    return {'driver': 'gcs', 'bucket': match.group(1), 'path': match.group(2)}
  if fileio.is_url(path):
    raise ValueError(f'Unsupported checkpoint location {path!r}: only local '
                     'paths and gs:// are supported.')
  return {'driver': 'file', 'path': os.path.abspath(path)}


def array_spec(checkpoint_dir: str, stored_spec: Mapping[str, Any]) -> dict:
  """The spec to open a stored array: its relative path under checkpoint_dir.

  `stored_spec` is the dict found in the msgpack. Its path is in
  `kvstore.path` (tensorstore >= 0.1.14) or at the top level (older files,
  e.g. with a 'gcs' kvstore and T5X's dummy bucket). Chunking, compression
  and shape are left to the array's own metadata (as T5X does), so arrays
  written with other chunks still open.
  """
  kvstore = stored_spec.get('kvstore') or {}
  relative = kvstore.get('path', stored_spec.get('path'))
  if not isinstance(relative, str) or not relative:
    raise ValueError(f'Not a T5X TensorStore spec (no path): {stored_spec!r}.')
  driver = kvstore.get('driver', 'file')
  if driver not in ('file', 'gfile', 'gcs'):
    raise ValueError(f'Unsupported TensorStore kvstore driver {driver!r} in '
                     f'{stored_spec!r}.')
  dtype = stored_spec.get('dtype')
  if dtype == 'uint16':
    # T5X version 2 stored bfloat16 as uint16; T5X itself refuses these.
    raise ValueError(f'{relative}: bfloat16 stored as uint16 (T5X checkpoint '
                     'version 2) is not supported; re-save it with T5X.')
  spec = {'driver': stored_spec.get('driver', 'zarr'),
          'kvstore': kvstore_spec(fileio.join(checkpoint_dir, relative.rstrip('/')))}
  if dtype is not None:
    spec['dtype'] = dtype
  return spec


def checkpoint_dir_of(path: str) -> str:
  """The `checkpoint_<step>` directory for `path`.

  `path` is that directory, its `checkpoint` file, or a model directory
  holding `checkpoint_<step>/` subdirectories: the latest step. A URL named
  like the first two is taken as it is (no round trip to the bucket).
  """
  if fileio.is_url(path) and named_like_t5x(path):
    path = path.rstrip('/')
    if posixpath.basename(path) == CHECKPOINT_FILE:
      return posixpath.dirname(path)
    return path
  if fileio.isfile(path):
    return fileio.dirname(fileio.abspath(path))
  if fileio.isfile(fileio.join(path, CHECKPOINT_FILE)):
    return path
  steps = latest_step_dirs(path)
  if steps:
    return steps[-1]
  raise FileNotFoundError(f'No T5X checkpoint at {path}: expected a '
                          f'{CHECKPOINT_FILE!r} file in it or checkpoint_<step>/ '
                          'subdirectories.')


def latest_step_dirs(model_dir: str) -> list:
  """checkpoint_<step>/ subdirectories holding a checkpoint file, by step."""
  if not fileio.isdir(model_dir):
    return []
  found = []
  for name in fileio.listdir(model_dir):
    match = _STEP_DIR.match(name)
    path = fileio.join(model_dir, name)
    if match and fileio.isfile(fileio.join(path, CHECKPOINT_FILE)):
      found.append((int(match.group(1)), path))
  return [path for _, path in sorted(found)]


def looks_like_t5x(path: str) -> bool:
  """True if `path` is (or holds) a T5X checkpoint; a URL named like one by its name only."""
  if fileio.is_url(path) and named_like_t5x(path):
    return True
  if fileio.isfile(path):
    return fileio.basename(path) == CHECKPOINT_FILE and _is_t5x_msgpack(path)
  return (fileio.isfile(fileio.join(path, CHECKPOINT_FILE)) or
          bool(latest_step_dirs(path)))


def _is_t5x_msgpack(path: str) -> bool:
  # TF checkpoints also use a file named 'checkpoint' (a text file).
  with fileio.open(path, 'rb') as f:
    return not f.read(len(b'model_checkpoint_path')).startswith(
        b'model_checkpoint_path')


# -----------------------------------------------------------------------------
# Reading.
# -----------------------------------------------------------------------------


def _read_bytes(directory: str, name: str) -> bytes:
  """One file through TensorStore's kvstore (local or gs:// alike)."""
  kvstore = kvstore_spec(directory)
  kvstore['path'] = kvstore['path'].rstrip('/') + '/'
  result = ts.KvStore.open(kvstore).result().read(name).result()
  if result.state != 'value':
    raise FileNotFoundError(f'No T5X checkpoint file at {fileio.join(directory, name)}.')
  return bytes(result.value)


def _is_spec(x) -> bool:
  return isinstance(x, dict) and 'driver' in x and ('kvstore' in x or
                                                    'path' in x)


def _flatten(tree, prefix=()) -> Dict[tuple, Any]:
  """Nested dicts -> {path tuple: leaf}; TensorStore spec dicts are leaves."""
  if isinstance(tree, dict) and not _is_spec(tree):
    flat = {}
    for key, value in tree.items():
      flat.update(_flatten(value, prefix + (key,)))
    return flat
  return {prefix: tree}


def read_contents(checkpoint_dir: str) -> dict:
  """The msgpack of a checkpoint, with TensorStore specs left as dicts."""
  raw = _read_bytes(checkpoint_dir, CHECKPOINT_FILE)
  if raw.startswith(b'model_checkpoint_path'):
    raise ValueError(f'{fileio.join(checkpoint_dir, CHECKPOINT_FILE)} is a TensorFlow '
                     'checkpoint index, not a T5X checkpoint.')
  try:
    contents = flax.serialization.msgpack_restore(raw)
  except Exception as e:  # msgpack raises several types.
    raise ValueError(f'{fileio.join(checkpoint_dir, CHECKPOINT_FILE)} is not a T5X '
                     f'msgpack checkpoint: {e}') from e
  version = contents.get('version', 0) if isinstance(contents, dict) else None
  if not isinstance(version, (int, np.integer)) or version < 2:
    raise ValueError(f'{fileio.join(checkpoint_dir, CHECKPOINT_FILE)}: unsupported T5X '
                     f'checkpoint version {version!r} (2 or 3 are read).')
  if 'target' not in contents.get('optimizer', {}):
    raise ValueError(f'{fileio.join(checkpoint_dir, CHECKPOINT_FILE)} has no '
                     "'optimizer/target' (params) tree.")
  return contents


class TensorStoreLeaf:
  """A zarr array opened (metadata only): `leaf[index]` reads that slice."""

  def __init__(self, store: ts.TensorStore, where: str):
    self._store = store
    self.where = where
    self.shape = tuple(int(n) for n in store.shape)
    self.dtype = np.dtype(store.dtype.numpy_dtype)

  def __getitem__(self, index) -> np.ndarray:
    return np.asarray(self._store[index].read().result())


def _open_array(checkpoint_dir: str, name: str, stored_spec: dict):
  spec = array_spec(checkpoint_dir, stored_spec)
  try:
    store = ts.open(spec, open=True, read=True).result()
  except ValueError as e:
    raise FileNotFoundError(
        f'T5X checkpoint {checkpoint_dir}: the array of {name} is missing or '
        f'unreadable at {spec["kvstore"]}: {e}') from e
  return TensorStoreLeaf(store, where=str(spec['kvstore'].get('path')))


def open_leaves(path: str) -> Dict[str, Any]:
  """{'encoder/layers_0/attention/query/kernel': array-like, ...} of params.

  Inline leaves are numpy arrays; zarr leaves are `TensorStoreLeaf`s (opened,
  nothing read). Raises FileNotFoundError naming the leaf whose array is
  missing.
  """
  checkpoint_dir = checkpoint_dir_of(path)
  target = read_contents(checkpoint_dir)['optimizer']['target']
  leaves = {}
  for key, value in _flatten(target).items():
    name = '/'.join(key)
    if _is_spec(value):
      leaves[name] = _open_array(checkpoint_dir, name, value)
    elif value is None:
      continue  # Unused leaves (e.g. of a MultiOptimizer) are written as None.
    else:
      leaves[name] = np.asarray(value)
  return leaves


# -----------------------------------------------------------------------------
# Writing.
# -----------------------------------------------------------------------------


def chunk_shape(shape, itemsize: int, target_bytes: int = _CHUNK_BYTES) -> list:
  """A chunk shape dividing `shape`, at most target_bytes (largest dims cut first)."""
  chunks = [int(n) for n in shape]
  target = max(1, target_bytes // itemsize)
  while int(np.prod(chunks)) > target:
    i = int(np.argmax(chunks))
    # The next smaller divisor keeps chunks aligned with the array's edges.
    chunks[i] = max(d for d in range(1, chunks[i]) if chunks[i] % d == 0)
  return chunks


def _write_array(store_path: str, x, dtype) -> dict:
  """Writes x (a jax.Array shard by shard, or numpy) as zarr; its spec."""
  shape = tuple(x.shape)
  spec = {'driver': 'zarr', 'dtype': np.dtype(dtype).name,
          'kvstore': {'driver': 'file', 'path': store_path},
          'metadata': {'compressor': {'id': 'gzip'}, 'shape': list(shape),
                       'chunks': chunk_shape(shape, np.dtype(dtype).itemsize)}}
  store = ts.open(spec, create=True, open=True).result()
  if isinstance(x, jax.Array):
    # Each device's own shard, once per replica set: no host gathers it all.
    for shard in x.addressable_shards:
      if shard.replica_id == 0:
        store[shard.index].write(np.asarray(shard.data).astype(dtype)).result()
  else:
    store.write(np.asarray(x).astype(dtype)).result()
  return spec


def _gathered(x) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def save(checkpoint_dir: str, params: PyTree, step: int = 0,
         dtype=None, inline_max_bytes: int = INLINE_MAX_BYTES) -> str:
  """Writes `params` as a T5X checkpoint directory (e.g. .../checkpoint_<step>).

  Leaves larger than `inline_max_bytes` become zarr arrays (gzip, chunks of at
  most 64 MiB), written shard by shard from the devices that hold them;
  smaller leaves are stored inline. The optimizer state is `{'step': step}`,
  as T5X's InferenceState writes it: T5X inference reads the result as is; T5X
  training from it must initialise its optimizer state afresh. `dtype` (e.g.
  'bfloat16') casts the stored params; None keeps each leaf's dtype.
  The directory appears complete or not at all (written under a temporary
  name, then renamed); it must not exist. Local paths only: copy to GCS
  afterwards (gsutil -m cp -r).
  """
  if fileio.is_url(checkpoint_dir):
    raise ValueError(f'Writing T5X checkpoints to {checkpoint_dir!r} is not '
                     'supported: write locally, then copy.')
  checkpoint_dir = os.path.abspath(checkpoint_dir)
  if os.path.exists(checkpoint_dir):
    raise FileExistsError(f'{checkpoint_dir} already exists.')
  tmp_dir = checkpoint_dir + '.tmp'
  if jax.process_index() == 0:
    shutil.rmtree(tmp_dir, ignore_errors=True)  # Left by an interrupted save.
    os.makedirs(tmp_dir)
  _barrier(f't5x_checkpoint.save:mkdir:{tmp_dir}')

  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params))
  written = {}
  for key, x in flat.items():
    name = '.'.join(('target',) + tuple(key))
    leaf_dtype = np.dtype(dtype if dtype is not None else x.dtype)
    if int(np.prod(x.shape)) * leaf_dtype.itemsize <= inline_max_bytes:
      written[key] = _gathered(x).astype(leaf_dtype)
    else:
      spec = _write_array(os.path.join(tmp_dir, name), x, leaf_dtype)
      spec['kvstore']['path'] = name  # Relative, as T5X: the dir can move.
      written[key] = ts.Spec(spec).to_json()
  _barrier(f't5x_checkpoint.save:arrays:{tmp_dir}')

  if jax.process_index() == 0:
    contents = {'version': VERSION,
                'optimizer': {'target': flax.traverse_util.unflatten_dict(written),
                              'state': {'step': np.int32(step)}}}
    with open(os.path.join(tmp_dir, CHECKPOINT_FILE), 'wb') as f:
      f.write(flax.serialization.msgpack_serialize(contents))
    os.rename(tmp_dir, checkpoint_dir)
  _barrier(f't5x_checkpoint.save:done:{checkpoint_dir}')
  return checkpoint_dir
