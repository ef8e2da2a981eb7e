"""XLA:CPU settings that compile small programs faster, for runs where compiling is most of the time.

Set before JAX starts its backend (`XLA_FLAGS` is read once). XLA's backend at optimisation level 0 generates
code faster; so does the CPU backend's older elementwise code generator (`xla_cpu_use_fusion_emitters=false`)
with each program's LLVM module compiled in one piece (`xla_cpu_parallel_codegen_split_count=1`). Tiny models
run no slower for it. XLA aborts on a flag it does not know, so those two are first tried in a child process
and left out if refused (a later jaxlib may drop them). No JAX import here: this runs before JAX starts.
"""

import os
import subprocess
import sys

OPT_LEVEL_FLAG = '--xla_backend_optimization_level=0'
FAST_CODEGEN_FLAGS = ('--xla_cpu_use_fusion_emitters=false', '--xla_cpu_parallel_codegen_split_count=1')


def accepted(flags: str) -> bool:
  """Whether a JAX process with XLA_FLAGS=flags compiles and runs a program (unknown flags abort it)."""
  probe = 'import jax; jax.jit(lambda x: x + 1)(1).block_until_ready()'
  try:
    return subprocess.run([sys.executable, '-c', probe], env={**os.environ, 'XLA_FLAGS': flags},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=120, check=False).returncode == 0
  except subprocess.TimeoutExpired:
    return False


def fast_compile(flags: str) -> str:
  """`flags` with the quicker settings added, each only where `flags` does not set it already."""
  if 'xla_backend_optimization_level' not in flags:
    flags = (flags + ' ' + OPT_LEVEL_FLAG).strip()
  if not any(flag.split('=')[0] in flags for flag in FAST_CODEGEN_FLAGS):
    faster = (flags + ' ' + ' '.join(FAST_CODEGEN_FLAGS)).strip()
    if accepted(faster):
      flags = faster
  return flags
