"""Model files: the compact format the shipped CPU models use, and Orbax training state.

Compact format (one directory per model):
  config.json      the `network.T5Config` fields (dtype by name)
  params.msgpack   the T5X-shaped param tree, stored in `storage_dtype`
                   (bfloat16 by default) with flax.serialization
Loading casts back to float32. Writes are atomic (temp file, then rename).
"""

import dataclasses
import json
import os
import tempfile
from typing import Any, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from specdec import network

PyTree = Any
CONFIG_FILE = 'config.json'
PARAMS_FILE = 'params.msgpack'


def atomic_write(path: str, data: bytes) -> None:
  """Writes `data` to `path` via a temp file and a rename (readable by all)."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  with tempfile.NamedTemporaryFile('wb', dir=directory, delete=False) as f:
    f.write(data)
  os.chmod(f.name, 0o644)  # tempfile makes files private
  os.replace(f.name, path)


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


def save_compact(directory: str, config: network.T5Config, params: PyTree,
                 storage_dtype=jnp.bfloat16, extra: Optional[dict] = None) -> None:
  """Writes config.json (+ `extra` metadata) and params.msgpack."""
  stored = jax.tree_util.tree_map(
      lambda x: np.asarray(jnp.asarray(x, storage_dtype)), params)
  meta = {'config': config_to_dict(config),
          'storage_dtype': jnp.dtype(storage_dtype).name}
  if extra:
    clash = set(extra) & set(meta)
    if clash:
      raise ValueError(f'extra metadata may not replace {sorted(clash)}.')
    meta.update(extra)
  atomic_write(os.path.join(directory, PARAMS_FILE),
                flax.serialization.msgpack_serialize(flax.core.unfreeze(stored)))
  atomic_write(os.path.join(directory, CONFIG_FILE),
                json.dumps(meta, indent=2, sort_keys=True).encode())


def load_config(directory: str) -> network.T5Config:
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'No model config at {path}.')
  with open(path) as f:
    return config_from_dict(json.load(f)['config'])


def load_compact(directory: str) -> Tuple[network.T5Config, PyTree]:
  """Reads a compact model: (config, float32 params), checking the tree."""
  config = load_config(directory)
  path = os.path.join(directory, PARAMS_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'No params at {path}.')
  with open(path, 'rb') as f:
    stored = flax.serialization.msgpack_restore(f.read())
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


def training_checkpoint_manager(directory: str, max_to_keep: int = 2
                                ) -> ocp.CheckpointManager:
  """An Orbax manager for {'step', 'params', 'opt_state'} training states."""
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def load_module_and_params(directory: str):
  """(flax module, float32 params) for any shipped model directory.

  A compact T5 model (config.json + params.msgpack) or an n-gram drafter
  (config.json + counts.npz).
  """
  from specdec import ngram  # pylint: disable=g-import-not-at-top  (ngram imports this module)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'No model directory at {directory}.')
  if ngram.is_ngram_dir(directory):
    return ngram.load(directory)
  config, params = load_compact(directory)
  return network.Transformer(config), params
