"""Loading a shipped model directory as a network and its params, whichever kind it holds.

Two kinds of directory hold a model this project decodes with:
  a compact T5 model   config.json + params.msgpack (`checkpoints.load_compact`)
  an n-gram drafter    config.json + counts.npz (`ngram.load`)
Both are hash-checked as they are read; paths may be local or gs://.
"""

from typing import Any, Tuple

from specdec import checkpoints
from specdec import fileio
from specdec import network
from specdec import ngram


def load_module_and_params(directory: str) -> Tuple[Any, Any]:
  """(flax module, float32 params) for any shipped model directory.

  A compact T5 model gives a `network.Transformer`; an n-gram drafter (its
  counts.npz present) gives an `ngram.NgramLM`. FileNotFoundError if
  `directory` is not a directory; ValueError naming the file if one is damaged.
  """
  if not fileio.isdir(directory):
    raise FileNotFoundError(f'No model directory at {directory}.')
  if ngram.is_ngram_dir(directory):
    return ngram.load(directory)
  config, params = checkpoints.load_compact(directory)
  return network.Transformer(config), params
