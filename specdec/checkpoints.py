"""Model files: the compact format, Orbax, T5X and Hugging Face checkpoints.

Compact format (one directory per model, the shipped CPU models):
  config.json      the `network.T5Config` fields (dtype by name), and
                   "files": {"params.msgpack": "<sha256>"}
  params.msgpack   the T5X-shaped param tree, stored in `storage_dtype`
                   (bfloat16 by default) with flax.serialization
Loading casts back to float32 and checks the recorded sha256 (a directory
saved before hashes existed has no "files" and loads unchecked); a damaged,
truncated or modified file raises ValueError naming it. Writes are atomic
(temp file, then rename: `fileio.atomic_write`, local or gs://).

Paths may be local or gs:// (any tf.io.gfile URL): files go through
specdec/fileio.py, and Orbax / TensorStore take the URL as it is. Hugging
Face directories are read from local disk only.

One entry point reads params of any format onto devices, each device reading
only its shard (`restore_params`; see docs/checkpoints.md):
  'compact'  the format above (read whole: small models only)
  'orbax'    a params-only Orbax checkpoint (`save_params_orbax`), or a
             training state ({'step', 'params', 'opt_state'}) of
             `training_checkpoint_manager`: its step, item or manager directory
  't5x'      a T5X `checkpoint_<step>/` directory (t5x_checkpoint.py)
  'hf'       a Hugging Face T5 directory, config.json + safetensors
             (hf_checkpoint.py)
"""

import dataclasses
import functools
import os
import re
import shutil
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from specdec import fileio
from specdec import hf_checkpoint
from specdec import network
from specdec import t5x_checkpoint

PyTree = Any
CONFIG_FILE = 'config.json'
PARAMS_FILE = 'params.msgpack'
# config.json field {file name: sha256 hex of its bytes}, checked on load.
FILES_FIELD = fileio.FILES_FIELD


def config_to_dict(config: network.T5Config) -> dict:
  fields = dataclasses.asdict(config)
  fields['dtype'] = jnp.dtype(config.dtype).name
  fields['mlp_activations'] = list(config.mlp_activations)
  return fields


def config_from_dict(fields: dict) -> network.T5Config:
  known = {f.name for f in dataclasses.fields(network.T5Config)}
  unknown = set(fields) - known
  if unknown:
    raise ValueError(f'Unknown T5Config fields in config: {sorted(unknown)}.')
  return network.T5Config(**fields)


def _read_meta(directory: str) -> dict:
  """A model directory's config.json as a dict; ValueError naming the file if damaged."""
  return fileio.read_json_object(fileio.join(directory, CONFIG_FILE), kind='config file')


def record_file_hashes(directory: str, names: Sequence[str]) -> dict:
  """Writes the sha256 of each `names` file into directory/config.json.

  For models saved before hashes were recorded (and after a deliberate edit
  of a model file). Returns the updated metadata.
  """
  meta = _read_meta(directory)
  files = dict(meta.get(FILES_FIELD) or {})
  for name in names:
    with fileio.open(fileio.join(directory, name), 'rb') as f:
      files[name] = fileio.sha256_hex(f.read())
  meta[FILES_FIELD] = files
  fileio.write_json(fileio.join(directory, CONFIG_FILE), meta)
  return meta


def save_compact(directory: str, config: network.T5Config, params: PyTree,
                 storage_dtype=jnp.bfloat16, extra: Optional[dict] = None) -> None:
  """Writes params.msgpack, then config.json (+ `extra` metadata, its sha256)."""
  data = params_bytes(params, storage_dtype)
  meta = {'config': config_to_dict(config),
          'storage_dtype': jnp.dtype(storage_dtype).name,
          FILES_FIELD: {PARAMS_FILE: fileio.sha256_hex(data)}}
  if extra:
    clash = set(extra) & set(meta)
    if clash:
      raise ValueError(f'extra metadata may not replace {sorted(clash)}.')
    meta.update(extra)
  fileio.atomic_write(fileio.join(directory, PARAMS_FILE), data)
  fileio.write_json(fileio.join(directory, CONFIG_FILE), meta)


def training_record(directory: str) -> Optional[dict]:
  """The `train` block a trainer exported with a compact model (its runs, steps, minutes, and under
  `init_train` the record of the model it continued), or None for a model with none."""
  train = _read_meta(directory).get('train')
  return dict(train) if isinstance(train, dict) else None


def training_runs(record: Optional[Mapping[str, Any]]) -> list:
  """Every run behind a compact model, the earliest first: its `init_train` chain's runs, then its own. Each is
  the trainer's run record with `init_from_dir` (the model its trainer started from) added, its steps counted from
  the first run's start."""
  if not record:
    return []
  parent = record.get('init_train')
  earlier = training_runs(parent)
  # Each trainer counts steps from 0 in its own model directory; count on from where the model it continued ended
  # (its own step count is only its last trainer's).
  offset = earlier[-1]['to_step'] if earlier else (parent or {}).get('step') or 0
  own = [dict(r, init_from_dir=record.get('init_from_dir'), from_step=offset + r['from_step'],
              to_step=offset + r['to_step']) for r in record.get('runs') or []]
  return earlier + own


def replace_with_continuation(continuation_dir: str, target_dir: str) -> dict:
  """Puts a continued model in its starting model's place, keeping what made the replaced one.

  `continuation_dir` was trained from `target_dir` (its `train.init_from_dir`); the replaced model's training
  record goes into the continuation's `train.init_train` (where a trainer that read it has not already put it),
  then `target_dir` is swapped for `continuation_dir`. Local directories. Returns the new training record.
  """
  record = training_record(continuation_dir)
  if record is None:
    raise ValueError(f'{continuation_dir}: no training record in its {CONFIG_FILE}; not a trainer\'s export.')
  if os.path.normpath(record.get('init_from_dir') or '') != os.path.normpath(target_dir):
    raise ValueError(f"{continuation_dir} was initialised from {record.get('init_from_dir')!r}, not {target_dir}: "
                     'it is not a continuation of it.')
  continued = load_config(continuation_dir)
  if dataclasses.replace(load_config(target_dir), dropout_rate=continued.dropout_rate) != continued:
    raise ValueError(f'{continuation_dir} and {target_dir} hold different network configs.')
  if record.get('init_train') is None:
    record['init_train'] = training_record(target_dir)
    meta = _read_meta(continuation_dir)
    meta['train'] = record
    fileio.write_json(fileio.join(continuation_dir, CONFIG_FILE), meta)
  replaced = target_dir.rstrip('/') + '.replaced'
  if os.path.exists(replaced):
    raise ValueError(f'{replaced} exists (an earlier swap that did not finish?); remove it first.')
  os.rename(target_dir, replaced)
  os.rename(continuation_dir, target_dir)
  shutil.rmtree(replaced)
  return record


def _config_of(meta: Mapping[str, Any], path: str) -> network.T5Config:
  if not isinstance(meta.get('config'), dict):
    raise ValueError(f"{path}: no 'config' object (has {sorted(meta)}): not a "
                     "compact model's config.json, or a damaged one.")
  try:
    return config_from_dict(meta['config'])
  except (TypeError, ValueError) as e:  # missing / unknown / invalid fields
    raise ValueError(f'{path}: {e}') from e


def load_config(directory: str) -> network.T5Config:
  return _config_of(_read_meta(directory), fileio.join(directory, CONFIG_FILE))


def params_bytes(params: PyTree, storage_dtype=jnp.bfloat16) -> bytes:
  """A param tree as the compact format's params.msgpack bytes, each array stored as `storage_dtype`."""
  stored = jax.tree_util.tree_map(lambda x: np.asarray(jnp.asarray(x, storage_dtype)), params)
  return flax.serialization.msgpack_serialize(flax.core.unfreeze(stored))


def read_params_file(directory: str, meta: Mapping[str, Any]) -> PyTree:
  """The stored param tree of `directory`'s params.msgpack, checked against the sha256 its config.json
  (`meta`) records; ValueError naming the file if it is damaged."""
  path = fileio.join(directory, PARAMS_FILE)
  data = fileio.read_verified(path, fileio.recorded_sha256(meta, PARAMS_FILE), CONFIG_FILE)
  try:
    stored = flax.serialization.msgpack_restore(data)
  except Exception as e:  # pylint: disable=broad-except  (msgpack's many errors)
    raise ValueError(f'{path}: damaged or truncated params file ({e}).') from e
  if not isinstance(stored, dict):
    raise ValueError(f'{path}: damaged params file (holds a '
                     f'{type(stored).__name__}, not a param tree).')
  return stored


def _read_compact(directory: str) -> Tuple[network.T5Config, PyTree]:
  """(config, stored params tree) of a compact model, hash-checked."""
  meta = _read_meta(directory)
  config = _config_of(meta, fileio.join(directory, CONFIG_FILE))
  return config, read_params_file(directory, meta)


def load_compact(directory: str) -> Tuple[network.T5Config, PyTree]:
  """Reads a compact model: (config, float32 params), checking the tree."""
  config, stored = _read_compact(directory)
  path = fileio.join(directory, PARAMS_FILE)
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), stored)
  expected = jax.eval_shape(
      lambda: network.init_params(config, jax.random.PRNGKey(0)))
  check_param_shapes(params, expected, where=path)
  return config, params


def check_param_shapes(params: PyTree, expected: PyTree, where: str) -> None:
  """Raises ValueError listing missing, unexpected and mis-shaped leaves."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep='/')
  want = flax.traverse_util.flatten_dict(flax.core.unfreeze(expected), sep='/')
  problems = [f'missing {k}' for k in sorted(set(want) - set(flat))]
  problems += [f'unexpected {k}' for k in sorted(set(flat) - set(want))]
  problems += [f'{k}: shape {tuple(flat[k].shape)}, expected {tuple(want[k].shape)}'
               for k in sorted(set(flat) & set(want))
               if tuple(flat[k].shape) != tuple(want[k].shape)]
  if problems:
    raise ValueError(f'Params in {where} do not match the config: '
                     + '; '.join(problems[:10])
                     + (f' (and {len(problems) - 10} more)' if len(problems) > 10 else ''))


def training_checkpoint_manager(directory: str, max_to_keep: int = 2, enable_async: bool = True
                                ) -> ocp.CheckpointManager:
  """An Orbax manager for {'step', 'params', 'opt_state'} training states.

  With `enable_async` (the default) a save finishes in a background thread while training goes on.
  """
  return ocp.CheckpointManager(
      fileio.abspath(directory),  # gs:// as it is: Orbax writes there itself
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=enable_async))


# -----------------------------------------------------------------------------
# Any format: detection and sharded restore.
# -----------------------------------------------------------------------------

FORMATS = ('compact', 'orbax', 't5x', 'hf')
# Files of an Orbax item (a manager's step directory has neither).
_ORBAX_MARKERS = ('_METADATA', 'manifest.ocdbt')
# Fields that change what the network computes but no param shape.
_FUNCTION_FIELDS = ('mlp_activations', 'logits_via_embedding',
                    'relative_attention_max_distance')


def _is_orbax_item(path: str) -> bool:
  return any(fileio.isfile(fileio.join(path, m)) for m in _ORBAX_MARKERS)


def _orbax_item_dir(path: str) -> Optional[str]:
  """The Orbax item directory for `path`, or None if it is not Orbax.

  `path` may be the item itself (`save_params_orbax`), a step directory of a
  CheckpointManager (its 'default' item) or the manager's directory (the
  latest step).
  """
  if not fileio.isdir(path):
    return None
  if _is_orbax_item(path):
    return path
  if _is_orbax_item(fileio.join(path, 'default')):
    return fileio.join(path, 'default')
  # Newest first, so that on GCS (one round trip per check) only one step is checked.
  steps = sorted((int(n), n) for n in fileio.listdir(path) if re.fullmatch(r'\d+', n))
  for _, name in reversed(steps):
    if _is_orbax_item(fileio.join(path, name, 'default')):
      return fileio.join(path, name, 'default')
  return None


def detect_format(path: str) -> str:
  """'compact' | 'orbax' | 't5x' | 'hf' for a checkpoint path.

  Local paths and URLs (gs://...) alike, but Hugging Face directories are
  read from local disk only. A URL named like a T5X checkpoint
  (`.../checkpoint_<step>` or its `checkpoint` file) is taken to be one
  without a round trip to the bucket. Raises FileNotFoundError / ValueError
  when `path` is none of them.
  """
  remote = fileio.is_url(path)
  if remote and t5x_checkpoint.named_like_t5x(path):
    return 't5x'
  if not fileio.exists(path):
    raise FileNotFoundError(f'No checkpoint at {path}.')
  if (fileio.isfile(fileio.join(path, PARAMS_FILE)) and
      fileio.isfile(fileio.join(path, CONFIG_FILE))):
    return 'compact'
  if _orbax_item_dir(path):
    return 'orbax'
  if t5x_checkpoint.looks_like_t5x(path):
    return 't5x'
  if remote:
    raise ValueError(
        f'{path} is not a checkpoint this project reads from remote storage: expected '
        f'{CONFIG_FILE} + {PARAMS_FILE} (compact), an Orbax checkpoint or a T5X '
        'checkpoint_<step> directory (Hugging Face directories are read from local '
        'disk only: copy it there first).')
  if hf_checkpoint.looks_like_hf(path):
    return 'hf'
  raise ValueError(
      f'{path} is not a checkpoint this project reads: expected {CONFIG_FILE} + '
      f'{PARAMS_FILE} (compact), an Orbax checkpoint, a T5X checkpoint_<step> '
      f'directory (with a {t5x_checkpoint.CHECKPOINT_FILE!r} file) or a '
      f'Hugging Face directory ({hf_checkpoint.CONFIG_FILE} + '
      f'{hf_checkpoint.WEIGHTS_FILE} or {hf_checkpoint.INDEX_FILE}).')


@functools.lru_cache(maxsize=8)
def expected_params(config: network.T5Config) -> PyTree:
  """The params tree of `config` as ShapeDtypeStructs (nothing allocated).

  Cached per config (tracing the init costs about a second); do not mutate.
  """
  return jax.eval_shape(
      lambda: network.init_params(config, jax.random.PRNGKey(0)))


def _flat(tree: PyTree) -> Dict[str, Any]:
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(tree), sep='/')


def _validate(leaves: Mapping[str, Any], config: network.T5Config,
              where: str) -> None:
  """Raises ValueError if `leaves` ({path: .shape/.dtype}) do not fit config."""
  embedding = leaves.get('token_embedder/embedding')
  if embedding is not None and len(embedding.shape) == 2 and (
      embedding.shape[0] != config.vocab_size):
    raise ValueError(
        f'Vocabulary size mismatch: {where} has {embedding.shape[0]} token '
        f'embeddings (token_embedder/embedding {tuple(embedding.shape)}) but '
        f'config.vocab_size={config.vocab_size}.')
  check_param_shapes(flax.traverse_util.unflatten_dict(dict(leaves), sep='/'),
                     expected_params(config), where=where)
  for name, leaf in sorted(leaves.items()):
    if not jnp.issubdtype(np.dtype(leaf.dtype), jnp.floating):
      raise ValueError(f'{name} in {where} has dtype {np.dtype(leaf.dtype).name}; '
                       'params must be floating point.')


def _flat_shardings(shardings, names) -> Dict[str, jax.sharding.Sharding]:
  """One Sharding per leaf: None (first local device), one for all, or a tree."""
  if shardings is None:
    shardings = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  if isinstance(shardings, jax.sharding.Sharding):
    return {name: shardings for name in names}
  flat = _flat(shardings)
  missing = sorted(set(names) - set(flat))
  if missing:
    raise ValueError(f'shardings has no entry for {missing[:10]}'
                     + (f' (and {len(missing) - 10} more)' if len(missing) > 10 else '')
                     + ': pass a tree matching the params, or one Sharding.')
  return {name: flat[name] for name in names}


def _param_dtype(dtype) -> np.dtype:
  dtype = np.dtype(jnp.float32 if dtype is None else jnp.dtype(dtype))
  if not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(f'dtype must be a floating dtype, got {dtype.name}.')
  return dtype


def _make_array(name: str, leaf, sharding: jax.sharding.Sharding,
                dtype: np.dtype, where: str) -> jax.Array:
  """A global jax.Array whose devices each read only their slice of `leaf`."""
  read = {}  # Replicated shards are read once per host.

  def shard(index):
    key = tuple((s.start, s.stop, s.step) if isinstance(s, slice) else s
                for s in index)
    if key not in read:
      try:
        read[key] = np.asarray(leaf[index]).astype(dtype, copy=False)
      except Exception as e:  # TensorStore / safetensors / OS errors.
        raise OSError(f'Reading {name} from {where} failed: {e}') from e
    return read[key]

  return jax.make_array_from_callback(tuple(leaf.shape), sharding, shard)


def _compact_leaves(directory: str, config: network.T5Config) -> Dict[str, Any]:
  stored = load_config(directory)
  diff = [f'{k}: {getattr(stored, k)!r} in the file, {getattr(config, k)!r} '
          'requested' for k in _FUNCTION_FIELDS
          if getattr(stored, k) != getattr(config, k)]
  if diff:
    raise ValueError(f'Config does not match {directory}: ' + '; '.join(diff))
  _, stored = _read_compact(directory)
  return {k: np.asarray(v) for k, v in _flat(stored).items()}


def _orbax_metadata_tree(item_dir: str) -> PyTree:
  # Orbax versions differ: a tree, or StepMetadata.item_metadata(.tree).
  meta = ocp.PyTreeCheckpointer().metadata(item_dir)
  meta = getattr(meta, 'item_metadata', meta)
  return getattr(meta, 'tree', meta)


def _restore_orbax(path: str, config: network.T5Config, shardings,
                   dtype: np.dtype) -> PyTree:
  """Params from an Orbax item: params-only, or a training state's 'params'."""
  item_dir = _orbax_item_dir(path)
  tree = _orbax_metadata_tree(item_dir)
  prefix = ('params',) if 'params' in tree and 'token_embedder' not in tree else ()
  params_meta = tree['params'] if prefix else tree
  leaves = _flat(params_meta)
  _validate(leaves, config, where=item_dir)
  flat_shardings = _flat_shardings(shardings, leaves)
  unflat = lambda f: flax.traverse_util.unflatten_dict(f, sep='/')
  item = unflat({k: jax.ShapeDtypeStruct(tuple(v.shape), dtype,
                                         sharding=flat_shardings[k])
                 for k, v in leaves.items()})
  restore_args = jax.tree_util.tree_map(
      lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype,
                                     global_shape=x.shape), item)
  if prefix:
    item, restore_args = {'params': item}, {'params': restore_args}
  restored = ocp.PyTreeCheckpointer().restore(
      item_dir, args=ocp.args.PyTreeRestore(
          item=item, restore_args=restore_args, partial_restore=bool(prefix)))
  return restored['params'] if prefix else restored


def restore_params(path: str, config: network.T5Config, shardings=None,
                   dtype=None, fmt: Optional[str] = None) -> PyTree:
  """Params of `config` from a checkpoint of any format, placed by `shardings`.

  Args:
    path: a compact model directory, an Orbax checkpoint or a T5X
      `checkpoint_<step>` directory (each local or gs://), or a local Hugging
      Face T5 directory (`detect_format`).
    config: the network the params are for; every leaf is checked against
      `jax.eval_shape` of its init before anything is read.
    shardings: None (all on the first local device), one
      `jax.sharding.Sharding` for every leaf, or a tree of them matching the
      params. Each device reads only its own slice of each array
      (`jax.make_array_from_callback`), so no host holds a whole large model.
    dtype: the params' dtype (default float32), cast as they are read.
    fmt: the format, where the caller detected it already (`detect_format`).

  Returns:
    The params tree {'token_embedder', 'encoder', 'decoder'} of jax.Arrays.

  Raises:
    FileNotFoundError: the checkpoint, or a file one of its leaves is in, is
      missing (the leaf is named).
    ValueError: vocabulary size mismatch; missing, unexpected or mis-shaped
      leaves; non-float leaves; a config that would compute something else
      than the checkpoint's model.
  """
  dtype = _param_dtype(dtype)
  fmt = fmt or detect_format(path)
  if fmt == 'orbax':
    return _restore_orbax(path, config, shardings, dtype)
  if fmt == 'compact':
    leaves = _compact_leaves(path, config)
  elif fmt == 't5x':
    leaves = t5x_checkpoint.open_leaves(path)
  else:
    leaves = hf_checkpoint.open_leaves(path, config)
  _validate(leaves, config, where=path)
  flat_shardings = _flat_shardings(shardings, leaves)
  arrays = {name: _make_array(name, leaf, flat_shardings[name], dtype, path)
            for name, leaf in leaves.items()}
  return flax.traverse_util.unflatten_dict(arrays, sep='/')


def check_t5x_checkpoint(path: str, config: network.T5Config) -> str:
  """The T5X checkpoint directory of `path`, checked against `config` (no array data read).

  Opens the msgpack and every array's metadata, so a missing file, a
  vocabulary size that differs from config.vocab_size, or a missing or
  mis-shaped leaf fails here, before a trainer builds anything.

  Raises:
    FileNotFoundError: no checkpoint at `path`, or a leaf's array is missing.
    ValueError: `path` is not a T5X checkpoint, or its params do not fit `config`.
  """
  fmt = detect_format(path)
  if fmt != 't5x':
    raise ValueError(f'{path} is a {fmt} checkpoint, not a T5X one (a checkpoint_<step>/ '
                     f'directory holding a {t5x_checkpoint.CHECKPOINT_FILE!r} file).')
  checkpoint_dir = t5x_checkpoint.checkpoint_dir_of(path)
  _validate(t5x_checkpoint.open_leaves(checkpoint_dir), config, where=checkpoint_dir)
  return checkpoint_dir


def save_params_orbax(path: str, params: PyTree, force: bool = False) -> None:
  """Writes a params-only Orbax checkpoint (sharded arrays written per shard).

  `restore_params(path, config, shardings)` reads it back onto any sharding.
  An existing `path` raises unless `force`.
  """
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(fileio.abspath(path), params, force=force)  # gs:// as it is
  checkpointer.wait_until_finished()
  checkpointer.close()


def save_t5x(checkpoint_dir: str, params: PyTree, step: int = 0,
             dtype=None) -> str:
  """Exports params as a T5X checkpoint (see t5x_checkpoint.save)."""
  return t5x_checkpoint.save(checkpoint_dir, params, step=step, dtype=dtype)


def load_config_for(path: str, fmt: Optional[str] = None) -> Optional[network.T5Config]:
  """The config a checkpoint records: compact and HF do; T5X and Orbax don't (None). `fmt`: the format, where the
  caller detected it already."""
  fmt = fmt or detect_format(path)
  if fmt == 'compact':
    return load_config(path)
  if fmt == 'hf':
    return hf_checkpoint.config_from_hf(path)
  return None
