"""Restoring a checkpoint or a shipped model directory as a network, its params and its draft vocabulary.

`restore` is the one entry point: it detects the format once (`checkpoint_format`) and returns what every caller
needs (`Restored`: module, params, draft vocabulary, format), reading a T5X, Hugging Face or Orbax checkpoint into a
given config, straight into a mesh's shards where one is given (each param's sharding from its logical axes:
`partitioning.param_shardings`, no model or predictor built for it).

Three kinds of directory hold a model this project decodes with:
  a compact T5 model   config.json + params.msgpack (`checkpoints.load_compact`)
  an n-gram drafter    config.json + counts.npz (`ngram.load`)
  a feature head       config.json (kind feature_head) + params.msgpack
                       [+ draft_vocab.json] (`feature_head_checkpoint.load`)
All are hash-checked as they are read; paths may be local or gs://.
"""

import dataclasses
from typing import Any, Optional, Tuple

import numpy as np

from specdec import checkpoints
from specdec import feature_drafter
from specdec import feature_head_checkpoint
from specdec import fileio
from specdec import network
from specdec import ngram
from specdec import partitioning

# The formats of this project's model directories; the others are `checkpoints.detect_format`'s.
NGRAM, FEATURE_HEAD, COMPACT = 'ngram', 'feature_head', 'compact'


def model_path(name: str, models_dir: str) -> str:
  """A model given on a command line: `name` where it is a directory, else `models_dir`/`name`.

  FileNotFoundError (one line) when neither is a directory, before anything is read.
  """
  if fileio.isdir(name):
    return name
  path = fileio.join(models_dir, name)
  if not fileio.isdir(path):
    raise FileNotFoundError(f'{name!r} is neither a model directory nor a model in {models_dir}.')
  return path


@dataclasses.dataclass(frozen=True)
class Restored:
  """A restored network: its flax module, params, draft vocabulary ids (a feature head's, or None) and the format
  it was read from ('ngram', 'feature_head', 'compact', 't5x', 'hf' or 'orbax')."""
  module: Any
  params: Any
  draft_vocab_ids: Optional[np.ndarray]
  format: str


def checkpoint_format(path: str) -> str:
  """'ngram' | 'feature_head' | 'compact' | 't5x' | 'hf' | 'orbax' for a checkpoint path (local or gs://).

  FileNotFoundError / ValueError (one line) when `path` holds none of them (`checkpoints.detect_format`).
  """
  if ngram.is_ngram_dir(path):
    return NGRAM
  if feature_head_checkpoint.is_head_dir(path):
    return FEATURE_HEAD
  return checkpoints.detect_format(path)


def restore(checkpoint: str, config: Optional[network.T5Config] = None, dtype: Optional[str] = None, mesh=None,
            target_params: Any = None) -> Restored:
  """The network, params and draft vocabulary of any checkpoint the launcher takes, its format detected once.

  A shipped model directory (compact T5, n-gram drafter, feature head) carries its own config and is read whole
  (float32). T5X, Hugging Face and Orbax checkpoints are read into `config` (from gin: e.g.
  gin/models/target_t5_1_1_xxl.gin), or into the config a Hugging Face directory describes, in `dtype`; with a
  `mesh`, each array straight into its shards (T5X's rules), so a large model is never whole on one host.
  With `target_params`, a feature head made for another target is refused.

  Raises (one line, before any array is read): ValueError for no checkpoint or a checkpoint without a config
  where none is given; FileNotFoundError for a path that does not exist.
  """
  if not checkpoint:
    raise ValueError('No checkpoint given (set TARGET_CHECKPOINT / DRAFTER_CHECKPOINT in gin).')
  if not fileio.exists(checkpoint):  # local or gs:// (tf.io.gfile)
    raise FileNotFoundError(f'Checkpoint not found: {checkpoint}')
  fmt = checkpoint_format(checkpoint)
  if fmt == NGRAM:
    module, params = ngram.load(checkpoint)
    return Restored(module, params, None, fmt)
  if fmt == FEATURE_HEAD:
    head_config, params, vocab_ids, meta = feature_head_checkpoint.load(checkpoint)
    if target_params is not None:
      feature_head_checkpoint.check_made_for(meta, target_params, checkpoint)
    return Restored(feature_drafter.FeatureHead(head_config), params, vocab_ids, fmt)
  if fmt == COMPACT:
    own_config, params = checkpoints.load_compact(checkpoint)
    return Restored(network.Transformer(own_config), params, None, fmt)
  if config is None:
    config = checkpoints.load_config_for(checkpoint, fmt)
  if config is None:
    raise ValueError(f'{checkpoint} ({fmt} format) carries no network config: give one in gin (include a '
                     'gin/models/*_t5_1_1_*.gin file).')
  module = network.Transformer(config)
  shardings = (None if mesh is None else
               partitioning.param_shardings(module, checkpoints.expected_params(config), mesh))
  params = checkpoints.restore_params(checkpoint, config, shardings=shardings, dtype=dtype, fmt=fmt)
  return Restored(module, params, None, fmt)


def load_module_and_params(directory: str) -> Tuple[Any, Any]:
  """(flax module, float32 params) of a shipped model directory (`load_drafter` without a vocabulary)."""
  module, params, _ = load_drafter(directory)
  return module, params


def load_drafter(directory: str, target_params: Any = None
                 ) -> Tuple[Any, Any, Optional[np.ndarray]]:
  """(flax module, float32 params, draft vocabulary ids or None) of a shipped model directory (`restore`).

  With `target_params`, a feature head made for another target is refused.
  """
  if not fileio.isdir(directory):
    raise FileNotFoundError(f'No model directory at {directory}.')
  restored = restore(directory, target_params=target_params)
  return restored.module, restored.params, restored.draft_vocab_ids
