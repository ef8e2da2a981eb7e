"""Our T5 networks as Hugging Face `transformers` T5 directories (the inverse of hf_checkpoint.py).

`save_hf(directory, config, params)` writes what `T5ForConditionalGeneration.from_pretrained` reads:

  config.json             T5Config fields (d_model, d_kv, d_ff, num_layers, num_decoder_layers, num_heads, the
                          relative-attention buckets, feed_forward_proj, vocab_size, dropout_rate, ...)
  generation_config.json  decoder_start_token_id 0 (our BOS), pad 0, eos 1
  model.safetensors       every param under its HF name (`hf_checkpoint.name_map`): kernels transposed to
                          nn.Linear's [out, in], relative bias tables back to [buckets, heads]

The output layer, both `transformers` generations. T5 1.1 (our `logits_via_embedding=False`) is written with
`tie_word_embeddings: false` and `scale_decoder_outputs: false` and its own `lm_head.weight`: transformers 4 reads
an untied, unscaled head; transformers 5 (which forces tie_word_embeddings to true and takes the scaling from
`scale_decoder_outputs`, or from the tie flag when that is absent) keeps an lm_head that differs from
`shared.weight` untied. A scaled, tied head (`logits_via_embedding=True`, original T5) is written without
`lm_head.weight`, tied and scaled in both.

transformers 5.24 reads any export, but its `generate` with a cache needs as many decoder as encoder layers
(its decoder cache is sized by `num_layers`; IndexError otherwise): a limitation of transformers, not of the file.

No torch needed: config files are JSON, tensors go through `safetensors.numpy`. Files are written atomically,
weights first, so a directory with a config.json is complete.

Command line (any model directory `checkpoints.load_config_for` reads a config from: compact or HF):

  python -m specdec.hf_export --model models/cpu/target --out runs/target_hf
"""

import argparse
import os
import sys
from typing import Any, Dict, Optional, Sequence

import flax
import jax
import ml_dtypes  # pylint: disable=unused-import  (registers bfloat16 with numpy)
import numpy as np
import safetensors.numpy

from specdec import checkpoints
from specdec import fileio
from specdec import hf_checkpoint
from specdec import network
from specdec import ngram

PyTree = Any
GENERATION_CONFIG_FILE = 'generation_config.json'
# Our token ids (seqio / T5 conventions): pad 0 doubles as the decoder's start token; eos 1.
PAD_ID, EOS_ID, DECODER_START_ID = 0, 1, 0
# Our mlp_activations -> HF feed_forward_proj: only the pairs both compute identically (the inverse of the
# importer's table, so export and import accept the same networks).
_FEED_FORWARD_PROJ = {tuple(ours): theirs for theirs, ours in
                      hf_checkpoint._ACTIVATIONS.items()}  # pylint: disable=protected-access
STORAGE_DTYPES = ('float32', 'bfloat16', 'float16')


def feed_forward_proj(config: network.T5Config) -> str:
  """HF's feed_forward_proj for our mlp_activations; ValueError when transformers computes no such MLP."""
  activations = tuple(config.mlp_activations)
  if activations not in _FEED_FORWARD_PROJ:
    raise ValueError(
        f'mlp_activations={activations!r} has no Hugging Face T5 equivalent: exportable are '
        + ', '.join(f'{list(k)} ({v!r})' for k, v in _FEED_FORWARD_PROJ.items()) + '.')
  return _FEED_FORWARD_PROJ[activations]


def hf_config_dict(config: network.T5Config) -> Dict[str, Any]:
  """config.json of the `T5ForConditionalGeneration` computing what `network.Transformer(config)` does."""
  proj = feed_forward_proj(config)
  scaled = bool(config.logits_via_embedding)
  return {
      'architectures': ['T5ForConditionalGeneration'],
      'model_type': 't5',
      'is_encoder_decoder': True,
      'vocab_size': int(config.vocab_size),
      'd_model': int(config.emb_dim),
      'd_kv': int(config.head_dim),
      'd_ff': int(config.mlp_dim),
      'num_layers': int(config.num_encoder_layers),
      'num_decoder_layers': int(config.num_decoder_layers),
      'num_heads': int(config.num_heads),
      'relative_attention_num_buckets': int(config.relative_attention_num_buckets),
      'relative_attention_max_distance': int(config.relative_attention_max_distance),
      'feed_forward_proj': proj,
      # transformers' derived fields, as its own save_pretrained writes them ('gated-gelu' is gelu_new, the
      # tanh GELU that flax's nn.gelu computes).
      'dense_act_fn': 'gelu_new' if proj == 'gated-gelu' else proj.split('-')[-1],
      'is_gated_act': proj.startswith('gated-'),
      'dropout_rate': float(config.dropout_rate),
      'layer_norm_epsilon': 1e-6,
      'initializer_factor': 1.0,
      # See the module docstring: both flags, so transformers 4 and 5 read the same output layer.
      'tie_word_embeddings': scaled,
      'scale_decoder_outputs': scaled,
      'decoder_start_token_id': DECODER_START_ID,
      'pad_token_id': PAD_ID,
      'eos_token_id': EOS_ID,
      'use_cache': True,
  }


def generation_config_dict() -> Dict[str, Any]:
  return {'decoder_start_token_id': DECODER_START_ID, 'pad_token_id': PAD_ID, 'eos_token_id': EOS_ID}


def hf_tensors(config: network.T5Config, params: PyTree, dtype: str = 'float32') -> Dict[str, np.ndarray]:
  """{HF tensor name: contiguous numpy array} for every param of `config` (checked against its shapes)."""
  if dtype not in STORAGE_DTYPES:
    raise ValueError(f'dtype must be one of {STORAGE_DTYPES}, got {dtype!r}.')
  checkpoints.check_param_shapes(params, checkpoints.expected_params(config), where='the params to export')
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep='/')
  tensors = {}
  for ours, (theirs, transposed) in hf_checkpoint.name_map(config, has_lm_head=True).items():
    value = np.asarray(jax.device_get(flat[ours]), np.float32)
    value = value.T if transposed else value
    tensors[theirs] = np.ascontiguousarray(value.astype(np.dtype(ml_dtypes.bfloat16) if dtype == 'bfloat16'
                                                        else np.dtype(dtype)))
  return tensors


def save_hf(directory: str, config: network.T5Config, params: PyTree, dtype: str = 'float32') -> str:
  """Writes `params` of `config` as a transformers T5 directory; returns `directory`.

  `dtype` is the stored tensor dtype (float32 by default: what our networks compute in).
  """
  hf_config = hf_config_dict(config)  # refuses inexpressible configs before anything is written
  tensors = hf_tensors(config, params, dtype)
  data = safetensors.numpy.save(tensors, metadata={'format': 'pt'})  # 'pt': transformers refuses others
  os.makedirs(directory, exist_ok=True)
  fileio.atomic_write(os.path.join(directory, hf_checkpoint.WEIGHTS_FILE), data)
  fileio.write_json(os.path.join(directory, GENERATION_CONFIG_FILE), generation_config_dict(), sort_keys=False)
  fileio.write_json(os.path.join(directory, hf_checkpoint.CONFIG_FILE), dict(hf_config, torch_dtype=dtype))
  return directory


def load_for_export(model_dir: str):
  """(config, float32 params) of a model directory; clear errors for what cannot be exported."""
  if not os.path.isdir(model_dir):
    raise FileNotFoundError(f'No model directory at {model_dir}.')
  if ngram.is_ngram_dir(model_dir):
    raise ValueError(f'{model_dir} is an n-gram drafter ({ngram.COUNTS_FILE}): it has no Hugging Face T5 '
                     'equivalent; only T5 networks can be exported.')
  config = checkpoints.load_config_for(model_dir)
  if config is None:
    raise ValueError(f'{model_dir} ({checkpoints.detect_format(model_dir)}) records no network config: '
                     'export from a compact or Hugging Face directory.')
  feed_forward_proj(config)  # before reading the params
  return config, checkpoints.restore_params(model_dir, config)


def export(model_dir: str, out_dir: str, dtype: str = 'float32') -> str:
  """A model directory (compact or HF) written as a transformers T5 directory at `out_dir`."""
  config, params = load_for_export(model_dir)
  return save_hf(out_dir, config, params, dtype)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--model', required=True, help='model directory (compact, e.g. models/cpu/target)')
  parser.add_argument('--out', required=True, help='output directory (transformers T5)')
  parser.add_argument('--dtype', default='float32', choices=STORAGE_DTYPES, help='stored tensor dtype')
  args = parser.parse_args(argv)
  try:
    out = export(args.model, args.out, args.dtype)
  except (FileNotFoundError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  print(f'Wrote {out} (T5ForConditionalGeneration.from_pretrained({out!r})).')
  return 0


if __name__ == '__main__':
  sys.exit(main())
