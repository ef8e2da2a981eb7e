"""Loading a checkpoint or a shipped model directory as a network and its params, whichever kind it holds.

`load_network` reads any checkpoint the launcher takes: a shipped model directory (below), or a T5X, Hugging Face
or Orbax checkpoint into a given config, straight into a mesh's shards where one is given.

Three kinds of directory hold a model this project decodes with:
  a compact T5 model   config.json + params.msgpack (`checkpoints.load_compact`)
  an n-gram drafter    config.json + counts.npz (`ngram.load`)
  a feature head       config.json (kind feature_head) + params.msgpack
                       [+ draft_vocab.json] (`feature_drafter.load`)
All are hash-checked as they are read; paths may be local or gs://.
"""

from typing import Any, Optional, Tuple

import numpy as np

from specdec import checkpoints
from specdec import decoding
from specdec import feature_drafter
from specdec import fileio
from specdec import models
from specdec import network
from specdec import ngram
from specdec import sharded_decoding


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


def load_module_and_params(directory: str) -> Tuple[Any, Any]:
  """(flax module, float32 params) for any shipped model directory.

  A compact T5 model gives a `network.Transformer`; an n-gram drafter (its
  counts.npz present) gives an `ngram.NgramLM`; a feature head a
  `feature_drafter.FeatureHead` (its draft vocabulary: `load_drafter`).
  FileNotFoundError if `directory` is not a directory; ValueError naming the
  file if one is damaged.
  """
  module, params, _ = load_drafter(directory)
  return module, params


def load_drafter(directory: str, target_params: Any = None
                 ) -> Tuple[Any, Any, Optional[np.ndarray]]:
  """(flax module, float32 params, draft vocabulary ids or None) of any model directory.

  With `target_params`, a feature head made for another target is refused.
  """
  if not fileio.isdir(directory):
    raise FileNotFoundError(f'No model directory at {directory}.')
  if ngram.is_ngram_dir(directory):
    module, params = ngram.load(directory)
    return module, params, None
  if feature_drafter.is_head_dir(directory):
    config, params, vocab_ids, meta = feature_drafter.load(directory)
    if target_params is not None:
      feature_drafter.check_made_for(meta, target_params, directory)
    return feature_drafter.FeatureHead(config), params, vocab_ids
  config, params = checkpoints.load_compact(directory)
  return network.Transformer(config), params, None


def draft_vocab_ids(directory: str, target_params: Any = None) -> Optional[np.ndarray]:
  """The draft vocabulary a model directory ships (a feature head's), or None; with `target_params`, a head made
  for another target is refused. Reads no params."""
  if not directory or not fileio.isdir(directory) or not feature_drafter.is_head_dir(directory):
    return None
  ids, meta = feature_drafter.load_vocab_ids(directory)
  if target_params is not None:
    feature_drafter.check_made_for(meta, target_params, directory)
  return ids


def load_network(checkpoint: str, config: Optional[network.T5Config] = None, dtype: Optional[str] = None,
                 mesh=None):
  """(module, params) from a checkpoint directory.

  The project's compact format and n-gram drafters carry their own config. T5X, Hugging Face and Orbax
  checkpoints are read into `config` (from gin: e.g. gin/models/target_t5_1_1_xxl.gin), or into the
  config a Hugging Face directory describes; with a `mesh`, each array is read straight into its shards
  (T5X's rules), so a large model is never materialised whole on one host.
  """
  if not checkpoint:
    raise ValueError('No checkpoint given (set TARGET_CHECKPOINT / DRAFTER_CHECKPOINT in gin).')
  if not fileio.exists(checkpoint):  # local or gs:// (tf.io.gfile)
    raise FileNotFoundError(f'Checkpoint not found: {checkpoint}')
  if ngram.is_ngram_dir(checkpoint) or (fileio.isdir(checkpoint) and
                                        fileio.exists(fileio.join(checkpoint, 'params.msgpack'))):
    return load_module_and_params(checkpoint)
  if config is None:
    config = checkpoints.load_config_for(checkpoint)
  if config is None:
    raise ValueError(f'{checkpoint} ({checkpoints.detect_format(checkpoint)} format) carries no network '
                     'config: give one in gin (include a gin/models/*_t5_1_1_*.gin file).')
  module = network.Transformer(config)
  shardings = None
  if mesh is not None:
    layout = sharded_decoding.compile_predict_sharded(
        models.SpeculativeEncoderDecoderModel(module, None, decode_fn=decoding.temperature_sample), mesh)
    shardings = layout.param_shardings({'target': checkpoints.expected_params(config)})['target']
  params = checkpoints.restore_params(checkpoint, config, shardings=shardings, dtype=dtype)
  return module, params
