"""Hugging Face T5 checkpoints (config.json + safetensors) onto the T5X param tree.

A directory written by `transformers`' `save_pretrained`: `config.json` and
`model.safetensors`, or shards `model-0000i-of-0000n.safetensors` listed in
`model.safetensors.index.json`. Tensors are read with the `safetensors`
library (numpy), slice by slice, so a device reads only its shard.

Name mapping (HF nn.Linear weights are [out, in]; T5X kernels [in, out], so
every kernel is the transposed weight; the relative bias table is transposed
from [buckets, heads] to [heads, buckets]):

  shared.weight                                   token_embedder/embedding
  encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight
                                                  encoder/relpos_bias/rel_embedding
  encoder.block.{i}.layer.0.layer_norm.weight     encoder/layers_{i}/pre_attention_layer_norm/scale
  encoder.block.{i}.layer.0.SelfAttention.{q,k,v,o}.weight
                                                  encoder/layers_{i}/attention/{query,key,value,out}/kernel
  encoder.block.{i}.layer.1.layer_norm.weight     encoder/layers_{i}/pre_mlp_layer_norm/scale
  encoder.block.{i}.layer.1.DenseReluDense.{wi_0,wi_1,wo}.weight
                                                  encoder/layers_{i}/mlp/{wi_0,wi_1,wo}/kernel
  encoder.final_layer_norm.weight                 encoder/encoder_norm/scale
  decoder.block.{i}.layer.{0,1,2}                 self_attention, encoder_decoder_attention
                                                  (EncDecAttention), mlp, with their norms
  decoder.final_layer_norm.weight                 decoder/decoder_norm/scale
  lm_head.weight                                  decoder/logits_dense/kernel

Numerics agree without rescaling: HF's T5 attention has no 1/sqrt(d_kv) and
neither has ours (T5 folds it into the query initialiser), both use RMS norms
with eps 1e-6, HF's 'gated-gelu' is the tanh GELU (gelu_new) = flax nn.gelu.

The output layer. HF T5 computes `lm_head(h * d_model**-0.5 if scaled else h)`.
T5 1.1 (`tie_word_embeddings: false`) is unscaled with its own lm_head;
`transformers` >= 5 always writes `tie_word_embeddings: true` and records the
scaling as `scale_decoder_outputs`. So: scaled (original T5) -> our
`logits_via_embedding=True` (the same x / sqrt(emb_dim) over the embedding);
unscaled -> `logits_dense`, from `lm_head.weight` when the file has it, else
from the (tied) `shared.weight`, which is what `transformers` does.
"""

import contextlib
import os
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import ml_dtypes  # pylint: disable=unused-import  (registers bfloat16 with numpy)
import numpy as np
import safetensors

from specdec import fileio
from specdec import network

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'

# HF feed_forward_proj -> our mlp_activations (the ones computed identically).
_ACTIVATIONS = {'gated-gelu': ('gelu', 'linear'), 'relu': ('relu',)}
_MODEL_TYPES = ('t5', 'mt5')
# Tensors HF writes that alias or duplicate others, or that it never uses.
_IGNORED = ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight',
            'decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight')
_SAFETENSORS_DTYPES = {
    'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
    'BF16': ml_dtypes.bfloat16, 'I64': np.int64, 'I32': np.int32,
    'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}


# -----------------------------------------------------------------------------
# Config.
# -----------------------------------------------------------------------------


def read_hf_config(path: str) -> dict:
  """config.json of an HF model directory (or the file itself) as a dict."""
  file = os.path.join(path, CONFIG_FILE) if os.path.isdir(path) else path
  if not os.path.isfile(file):
    raise FileNotFoundError(f'No Hugging Face config at {file}.')
  return fileio.read_json_object(file)


@contextlib.contextmanager
def _safe_open(file: str):
  """safetensors.safe_open, with a damaged file named in a ValueError."""
  try:
    handle = safetensors.safe_open(file, framework='numpy')
  except Exception as e:  # pylint: disable=broad-except  (SafetensorError, OSError)
    if isinstance(e, FileNotFoundError):
      raise
    raise ValueError(f'{file}: damaged or truncated safetensors file ({e}).') from e
  with handle as f:
    yield f


def scales_decoder_output(hf_config: Mapping[str, Any]) -> bool:
  """Whether HF multiplies the decoder output by d_model**-0.5 before lm_head.

  transformers >= 5 records it as `scale_decoder_outputs`; before, it was
  implied by `tie_word_embeddings` (default true).
  """
  if 'scale_decoder_outputs' in hf_config:
    return bool(hf_config['scale_decoder_outputs'])
  return bool(hf_config.get('tie_word_embeddings', True))


def config_from_hf(config: Union[str, Mapping[str, Any]],
                   **overrides) -> network.T5Config:
  """A `network.T5Config` computing what the HF T5 model of `config` computes.

  `config` is an HF model directory, its config.json, or the loaded dict.
  `overrides` (e.g. dtype='bfloat16') replace fields. Raises ValueError for
  configs our network cannot reproduce exactly.
  """
  cfg = read_hf_config(config) if isinstance(config, str) else dict(config)
  model_type = cfg.get('model_type')
  if model_type not in _MODEL_TYPES:
    raise ValueError(f'Unsupported Hugging Face model_type {model_type!r}: '
                     f'only {_MODEL_TYPES} (T5, T5 1.1, mT5) are supported.')
  if not cfg.get('is_encoder_decoder', True):
    raise ValueError('Unsupported Hugging Face config: is_encoder_decoder is '
                     'false (an encoder- or decoder-only T5).')
  proj = cfg.get('feed_forward_proj', 'relu')
  if proj not in _ACTIVATIONS:
    raise ValueError(
        f'Unsupported feed_forward_proj {proj!r}: supported are '
        f"{sorted(_ACTIVATIONS)} ('gated-gelu' is T5 1.1).")
  eps = cfg.get('layer_norm_epsilon', 1e-6)
  if eps != 1e-6:
    raise ValueError(f'Unsupported layer_norm_epsilon {eps!r}: the network '
                     'uses 1e-6, as T5.')
  num_layers = cfg.get('num_layers', 6)
  fields = dict(
      vocab_size=cfg.get('vocab_size', 32128),
      emb_dim=cfg.get('d_model', 512),
      num_heads=cfg.get('num_heads', 8),
      head_dim=cfg.get('d_kv', 64),
      mlp_dim=cfg.get('d_ff', 2048),
      num_encoder_layers=num_layers,
      num_decoder_layers=cfg.get('num_decoder_layers') or num_layers,
      mlp_activations=_ACTIVATIONS[proj],
      dropout_rate=cfg.get('dropout_rate', 0.1),
      logits_via_embedding=scales_decoder_output(cfg),
      relative_attention_num_buckets=cfg.get('relative_attention_num_buckets', 32),
      relative_attention_max_distance=cfg.get('relative_attention_max_distance',
                                              128))
  fields.update(overrides)
  return network.T5Config(**fields)


def check_config(hf_config: Mapping[str, Any], config: network.T5Config,
                 where: str) -> None:
  """Raises ValueError if `config` would not compute what the HF model does.

  Sizes are checked leaf by leaf elsewhere; these fields change the function
  without changing any shape.
  """
  want = config_from_hf(hf_config)
  problems = [f'{name}={getattr(config, name)!r} but the checkpoint has '
              f'{getattr(want, name)!r}'
              for name in ('mlp_activations', 'logits_via_embedding',
                           'relative_attention_num_buckets',
                           'relative_attention_max_distance')
              if getattr(config, name) != getattr(want, name)]
  if problems:
    raise ValueError(f'Config does not match the Hugging Face config in '
                     f'{where}: ' + '; '.join(problems) + '.')


# -----------------------------------------------------------------------------
# Names.
# -----------------------------------------------------------------------------


def _attention(ours: str, theirs: str) -> Dict[str, Tuple[str, bool]]:
  return {f'{ours}/{a}/kernel': (f'{theirs}.{b}.weight', True)
          for a, b in (('query', 'q'), ('key', 'k'), ('value', 'v'),
                       ('out', 'o'))}


def _mlp(ours: str, theirs: str, config: network.T5Config):
  names = (['wi'] if len(config.mlp_activations) == 1 else
           [f'wi_{i}' for i in range(len(config.mlp_activations))]) + ['wo']
  return {f'{ours}/{n}/kernel': (f'{theirs}.DenseReluDense.{n}.weight', True)
          for n in names}


def _norm(ours: str, theirs: str):
  return {f'{ours}/scale': (f'{theirs}.weight', False)}


def name_map(config: network.T5Config,
             has_lm_head: bool = True) -> Dict[str, Tuple[str, bool]]:
  """{our leaf path: (HF tensor name, transposed?)} for every param of config.

  Without `lm_head.weight` in the file (tied), `logits_dense` comes from
  `shared.weight`.
  """
  names = {'token_embedder/embedding': ('shared.weight', False)}
  for stack, num_layers in (('encoder', config.num_encoder_layers),
                            ('decoder', config.num_decoder_layers)):
    names[f'{stack}/relpos_bias/rel_embedding'] = (
        f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
        True)
    for i in range(num_layers):
      ours, theirs = f'{stack}/layers_{i}', f'{stack}.block.{i}.layer'
      if stack == 'encoder':
        names.update(_norm(f'{ours}/pre_attention_layer_norm', f'{theirs}.0.layer_norm'))
        names.update(_attention(f'{ours}/attention', f'{theirs}.0.SelfAttention'))
        names.update(_norm(f'{ours}/pre_mlp_layer_norm', f'{theirs}.1.layer_norm'))
        names.update(_mlp(f'{ours}/mlp', f'{theirs}.1', config))
      else:
        names.update(_norm(f'{ours}/pre_self_attention_layer_norm',
                           f'{theirs}.0.layer_norm'))
        names.update(_attention(f'{ours}/self_attention', f'{theirs}.0.SelfAttention'))
        names.update(_norm(f'{ours}/pre_cross_attention_layer_norm',
                           f'{theirs}.1.layer_norm'))
        names.update(_attention(f'{ours}/encoder_decoder_attention',
                                f'{theirs}.1.EncDecAttention'))
        names.update(_norm(f'{ours}/pre_mlp_layer_norm', f'{theirs}.2.layer_norm'))
        names.update(_mlp(f'{ours}/mlp', f'{theirs}.2', config))
  names['encoder/encoder_norm/scale'] = ('encoder.final_layer_norm.weight', False)
  names['decoder/decoder_norm/scale'] = ('decoder.final_layer_norm.weight', False)
  if not config.logits_via_embedding:
    names['decoder/logits_dense/kernel'] = (
        'lm_head.weight' if has_lm_head else 'shared.weight', True)
  return names


# -----------------------------------------------------------------------------
# Reading.
# -----------------------------------------------------------------------------


def weight_files(directory: str) -> Dict[str, str]:
  """{HF tensor name: safetensors file path}, single file or sharded."""
  index = os.path.join(directory, INDEX_FILE)
  single = os.path.join(directory, WEIGHTS_FILE)
  if os.path.isfile(index):
    weight_map = fileio.read_json_object(index).get('weight_map')
    if not isinstance(weight_map, dict):
      raise ValueError(f'{index} has no weight_map.')
    files = {name: os.path.join(directory, file)
             for name, file in weight_map.items()}
    missing = sorted({f for f in files.values() if not os.path.isfile(f)})
    if missing:
      raise FileNotFoundError(f'Missing safetensors shards listed in {index}: '
                              f'{missing}.')
    return files
  if os.path.isfile(single):
    with _safe_open(single) as f:
      return {name: single for name in f.keys()}
  others = [n for n in os.listdir(directory)
            if n.endswith(('.bin', '.h5', '.msgpack'))] if os.path.isdir(
                directory) else []
  hint = (f' (found {others}: re-save with save_pretrained(..., '
          'safe_serialization=True))' if others else '')
  raise FileNotFoundError(f'No {WEIGHTS_FILE} or {INDEX_FILE} in {directory}{hint}.')


def _numpy_dtype(name: str):
  if name not in _SAFETENSORS_DTYPES:
    raise ValueError(f'Unsupported safetensors dtype {name!r}.')
  return np.dtype(_SAFETENSORS_DTYPES[name])


class SafetensorsLeaf:
  """One of our params from one HF tensor: `leaf[index]` reads that slice.

  `index` is in our (T5X) layout; for transposed tensors the slice is read
  from the HF tensor with the axes swapped, then transposed.
  """

  def __init__(self, file: str, name: str, transposed: bool):
    self.file, self.name, self.transposed = file, name, transposed
    self.where = f'{file}:{name}'
    with _safe_open(file) as f:
      tensor = f.get_slice(name)
      shape = tuple(int(n) for n in tensor.get_shape())
      self.dtype = _numpy_dtype(tensor.get_dtype())
    if transposed and len(shape) != 2:
      raise ValueError(f'{self.where}: expected a 2-D weight, got shape {shape}.')
    self.shape = shape[::-1] if transposed else shape

  def __getitem__(self, index) -> np.ndarray:
    index = tuple(index) if isinstance(index, tuple) else (index,)
    index += (slice(None),) * (len(self.shape) - len(index))
    with _safe_open(self.file) as f:
      tensor = f.get_slice(self.name)
      if self.transposed:
        return np.asarray(tensor[index[1], index[0]]).T
      return np.asarray(tensor[index])


def _check_tied(files: Mapping[str, str]) -> None:
  """Scaled (original T5) logits need lm_head == shared; compares row 0.

  Older `transformers` write the tied lm_head too; a different one (possible
  with transformers >= 5) would be a scaled untied head, which the network
  cannot compute. One row tells them apart without reading the matrices.
  """
  rows = []
  for name in ('shared.weight', 'lm_head.weight'):
    with _safe_open(files[name]) as f:
      rows.append(np.asarray(f.get_slice(name)[0:1]))
  if rows[0].shape != rows[1].shape or not np.array_equal(rows[0], rows[1]):
    raise ValueError(
        'Unsupported Hugging Face checkpoint: the decoder output is scaled by '
        'd_model**-0.5 (scale_decoder_outputs / tie_word_embeddings) but '
        'lm_head.weight differs from shared.weight; only tied embeddings can '
        'be scaled (logits_via_embedding).')


def open_leaves(directory: str,
                config: Optional[network.T5Config] = None) -> Dict[str, Any]:
  """{our leaf path: SafetensorsLeaf} for `config` (default: from config.json).

  Nothing is read but headers. Raises FileNotFoundError / ValueError naming
  the HF tensor and our leaf when a tensor is missing, and ValueError listing
  tensors that map to nothing (another architecture).
  """
  hf_config = read_hf_config(directory)
  if config is None:
    config = config_from_hf(hf_config)
  else:
    check_config(hf_config, config, where=directory)
  files = weight_files(directory)
  names = name_map(config, has_lm_head='lm_head.weight' in files)
  missing = [f'{theirs} (for {ours})' for ours, (theirs, _) in names.items()
             if theirs not in files]
  if missing:
    raise ValueError(f'Hugging Face checkpoint {directory} lacks tensors: '
                     + '; '.join(missing[:10])
                     + (f' (and {len(missing) - 10} more)' if len(missing) > 10 else ''))
  used = {theirs for theirs, _ in names.values()} | set(_IGNORED)
  if config.logits_via_embedding and 'lm_head.weight' in files:
    _check_tied(files)
    used.add('lm_head.weight')
  unexpected = sorted(set(files) - used)
  if unexpected:
    raise ValueError(f'Hugging Face checkpoint {directory} has tensors that '
                     f'map to no param of the config: {unexpected[:10]}'
                     + (f' (and {len(unexpected) - 10} more)'
                        if len(unexpected) > 10 else '') + '.')
  return {ours: SafetensorsLeaf(files[theirs], theirs, transposed)
          for ours, (theirs, transposed) in names.items()}


def looks_like_hf(path: str) -> bool:
  return os.path.isdir(path) and os.path.isfile(
      os.path.join(path, CONFIG_FILE)) and (
          os.path.isfile(os.path.join(path, WEIGHTS_FILE)) or
          os.path.isfile(os.path.join(path, INDEX_FILE)))
