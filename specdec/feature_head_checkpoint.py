"""A feature head's directory: config.json, params.msgpack and an optional draft_vocab.json, hash-checked.

`save` writes a head (feature_drafter.py) with the sha256 of the target
params it reads (`params_sha256`) and its draft vocabulary if any; `load`
reads them back as (config, float32 params, draft vocabulary ids, config.json),
`check_made_for` refuses a head trained for another target, and `is_head_dir`
tells a head's directory from a model's. The file names are the compact
format's (checkpoints.py); config.json says `kind: feature_head`.
"""

import json
from typing import Any, Dict, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec import checkpoints
from specdec import feature_drafter
from specdec import fileio

PyTree = Any

CONFIG_FILE = checkpoints.CONFIG_FILE  # the compact format's file names
PARAMS_FILE = checkpoints.PARAMS_FILE
DRAFT_VOCAB_FILE = 'draft_vocab.json'
KIND = 'feature_head'


def is_head_dir(directory: str) -> bool:
  """Whether `directory` holds a feature head (its config.json says so)."""
  path = fileio.join(directory, CONFIG_FILE)
  if not fileio.isfile(path):
    return False
  return fileio.read_json_object(path, kind='config file').get('kind') == KIND


def params_sha256(params: PyTree) -> str:
  """A fingerprint of a param tree's float32 values (which target a head was made for)."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep='/')
  digest = ''.join(f'{k}:{fileio.sha256_hex(np.asarray(flat[k], np.float32).tobytes())};'
                   for k in sorted(flat))
  return fileio.sha256_hex(digest.encode())


def save(directory: str, config: feature_drafter.FeatureHeadConfig, params: PyTree, *, target_sha256: str,
         draft_vocab_ids: Optional[Sequence[int]] = None, storage_dtype=jnp.bfloat16,
         extra: Optional[Dict[str, Any]] = None) -> None:
  """Writes params.msgpack (+ draft_vocab.json), then config.json with their sha256.

  `target_sha256` (`params_sha256` of the target's params) names the target
  the head reads; loading it with another target is refused.
  """
  data = checkpoints.params_bytes(params, storage_dtype)
  files = {PARAMS_FILE: fileio.sha256_hex(data)}
  meta = {'kind': KIND, 'head_config': config.to_dict(),
          'storage_dtype': jnp.dtype(storage_dtype).name, 'target_params_sha256': target_sha256}
  vocab_bytes = None
  if draft_vocab_ids is not None:
    vocab_bytes = json.dumps([int(i) for i in draft_vocab_ids]).encode()
    files[DRAFT_VOCAB_FILE] = fileio.sha256_hex(vocab_bytes)
  meta[fileio.FILES_FIELD] = files
  clash = set(extra or {}) & set(meta)
  if clash:
    raise ValueError(f'extra metadata may not replace {sorted(clash)}.')
  meta.update(extra or {})
  fileio.makedirs(directory)
  fileio.atomic_write(fileio.join(directory, PARAMS_FILE), data)
  if vocab_bytes is not None:
    fileio.atomic_write(fileio.join(directory, DRAFT_VOCAB_FILE), vocab_bytes)
  fileio.write_json(fileio.join(directory, CONFIG_FILE), meta)


def load(directory: str) -> Tuple[feature_drafter.FeatureHeadConfig, PyTree, Optional[np.ndarray], Dict[str, Any]]:
  """(config, float32 params, draft vocab ids or None, config.json) of a head, hash-checked."""
  config_path = fileio.join(directory, CONFIG_FILE)
  if not fileio.isfile(config_path):
    raise FileNotFoundError(f'No feature head at {directory} (no {CONFIG_FILE}).')
  meta = fileio.read_json_object(config_path, kind='config file')
  if meta.get('kind') != KIND:
    raise ValueError(f'{config_path}: not a feature head (kind {meta.get("kind")!r}).')
  try:
    config = feature_drafter.FeatureHeadConfig.from_dict(meta['head_config'])
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f'{config_path}: bad head_config ({e}).') from e
  path = fileio.join(directory, PARAMS_FILE)
  stored = checkpoints.read_params_file(directory, meta)
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), stored)
  expected = jax.eval_shape(lambda: feature_drafter.init_params(config, jax.random.PRNGKey(0)))
  checkpoints.check_param_shapes(params, expected, where=path)
  vocab_ids, _ = load_vocab_ids(directory)
  return config, params, vocab_ids, meta


def load_vocab_ids(directory: str) -> Tuple[Optional[np.ndarray], Dict[str, Any]]:
  """(draft vocabulary ids or None, config.json) of a head directory, without reading its params."""
  meta = fileio.read_json_object(fileio.join(directory, CONFIG_FILE), kind='config file')
  if DRAFT_VOCAB_FILE not in meta.get(fileio.FILES_FIELD, {}):
    return None, meta
  data = fileio.read_verified(fileio.join(directory, DRAFT_VOCAB_FILE),
                              fileio.recorded_sha256(meta, DRAFT_VOCAB_FILE), CONFIG_FILE)
  return np.asarray(json.loads(data), np.int32), meta


def check_made_for(meta: Dict[str, Any], target_params: PyTree, where: str) -> None:
  """ValueError unless the head in `where` was trained on these target params."""
  want = meta.get('target_params_sha256')
  if want is not None and want != params_sha256(target_params):
    raise ValueError(f'The feature head in {where} was trained for another target (params '
                     f'sha256 {want[:12]}..., this target {params_sha256(target_params)[:12]}...): '
                     "a head reads its own target's features.")
