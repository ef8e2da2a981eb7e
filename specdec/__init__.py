"""specdec: exact speculative decoding for T5X-style encoder-decoder models in JAX/Flax."""

# Before anything can load TensorFlow: a triton loaded after it crashes the process (see import_order).
from specdec import import_order as _import_order

_import_order.load_triton_first()
