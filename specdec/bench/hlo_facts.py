"""What compiled programs and profiler traces say: the facts that explain a loop costing more than its calls.

* A compiled program's optimized HLO text (`compiled_predict_text`): instructions per `while` body by kind
  (fusions, dots, copies, scatters, ...: `loop_body_ops`, `hlo_summary`, `loop_facts`), the decode loop's kernels
  by the round's phase and the layer part they compute (`kernel_origin`, `loop_kernels_by_origin`), and each
  instruction's opcode, shape and operands (`instruction_facts`, `shape_bytes`).
* A `jax.profiler` trace of a compiled call (`trace_kernel_breakdown`): exclusive time per kind of kernel
  (matmuls, copies, the runtime's own cost of running loop bodies and branches) and of the costliest kernels.

Works on any backend (CPU, GPU, TPU).
"""

import collections
import glob
import os
import re
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np

from specdec import models


# ----------------------------------------------------------------------------------------------------------
# HLO facts.
# ----------------------------------------------------------------------------------------------------------

_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][\w\-]*)\(', re.M)


def _computations(hlo_text: str) -> Dict[str, str]:
  """{computation name: body text} of an HLO module's text."""
  out, name, lines = {}, None, []
  for line in hlo_text.splitlines():
    header = re.match(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$', line)
    if header and not line.startswith(' '):
      name, lines = header.group(1), []
    elif line.startswith('}') and name is not None:
      out[name] = '\n'.join(lines)
      name = None
    elif name is not None:
      lines.append(line)
  return out


_CALL = re.compile(r'\scall\(.*?\bto_apply=%?([\w.\-]+)')


def _is_scatter_expansion(line: str) -> bool:
  op_name = re.search(r'op_name="([^"]*)"', line)
  return op_name is not None and op_name.group(1).endswith('/scatter')


def _inlined_lines(computation: str, comps: Mapping[str, str], skip_scatter_loops: bool = False,
                   depth: int = 0) -> List[str]:
  """A computation's instruction lines with each `call` replaced by its callee's lines, recursively.

  A call runs its callee inline, so what it holds belongs to the caller's body: newer XLA (jax 0.12) wraps a
  nested `while` in a computation of its own that the loop body calls, where older XLA left the `while` in the
  body itself. Fusions stay one line each (one kernel). `skip_scatter_loops` keeps a call of an expanded scatter
  (see `loop_body_ops`) as one line: the program wrote one scatter there, not a loop.
  """
  out = []
  for line in comps.get(computation, '').splitlines():
    called = _CALL.search(line) if depth < 16 else None
    if called is not None and called.group(1) in comps and not (skip_scatter_loops
                                                                 and _is_scatter_expansion(line)):
      out.extend(_inlined_lines(called.group(1), comps, skip_scatter_loops, depth + 1))
    else:
      out.append(line)
  return out


def loop_body_ops(hlo_text: str, skip_scatter_loops: bool = False) -> Dict[str, Dict[str, int]]:
  """Per `while` loop of a compiled module: instruction counts by opcode in its body (calls expanded into
  their callees' instructions; fusion bodies not expanded: each fusion is one kernel), largest body first.

  `skip_scatter_loops` leaves out the loops XLA made of a single scatter (its op_name ends in `/scatter`): a
  backend without a native scatter kernel for it (e.g. XLA:CPU with its older elementwise code generator)
  expands each scatter into a loop that the program did not write.
  """
  comps = _computations(hlo_text)
  bodies = []
  for line in hlo_text.splitlines():
    found = re.search(r'\bwhile\(.*?body=%?([\w.\-]+)', line)
    if found is None:
      continue
    if skip_scatter_loops and _is_scatter_expansion(line):
      continue
    bodies.append(found.group(1))
  out = {}
  for body in dict.fromkeys(bodies):
    ops = collections.Counter(_INSTRUCTION.findall('\n'.join(_inlined_lines(body, comps, skip_scatter_loops))))
    out[body] = dict(ops.most_common())
  return dict(sorted(out.items(), key=lambda kv: -sum(kv[1].values())))


def hlo_summary(ops: Mapping[str, int]) -> Dict[str, int]:
  """The counts that matter for a loop body's fixed cost."""
  total = sum(v for k, v in ops.items() if k not in ('parameter', 'get-tuple-element', 'tuple', 'constant',
                                                     'bitcast'))
  pick = lambda *names: sum(ops.get(n, 0) for n in names)
  return {'kernels': total, 'fusion': pick('fusion'), 'dot/custom-call': pick('dot', 'custom-call'),
          'copy': pick('copy', 'copy-start'), 'scatter': pick('scatter'), 'gather': pick('gather'),
          'dynamic-update-slice': pick('dynamic-update-slice'), 'while': pick('while'),
          'conditional': pick('conditional'), 'sort': pick('sort')}


PHASES = ('draft_phase', 'verify_phase', 'accept_phase', 'commit_phase')
# What a kernel computes, read from its op_name (first match wins): the layer parts of a T5 decoder step.
_PARTS = (('norms', ('layer_norm', 'decoder_norm', 'head_norm')),
          ('cross-attention', ('encoder_decoder_attention',)),
          ('self-attention', ('self_attention',)),
          ('MLP', ('/mlp/', 'mlp_layer')),
          ('relative position bias', ('relpos_bias', 'relative_attention')),
          ('embedding', ('embed',)),
          ('input fusion / output map', ('._fused', '._out')))
_TRIVIAL = ('parameter', 'get-tuple-element', 'tuple', 'constant', 'bitcast')


def kernel_origin(op_name: str) -> Tuple[str, str]:
  """(phase, part) of a kernel from its op_name: phase one of PHASES (`decoding.speculative_step`'s named
  scopes) or 'loop' (the loop's own bookkeeping), part one of `_PARTS`' labels or 'logits, sampling, other'."""
  phase = next((ph for ph in PHASES if f'/{ph}/' in op_name or op_name.startswith(f'{ph}/')), 'loop')
  part = next((label for label, keys in _PARTS if any(k in op_name for k in keys)),
              'logits, sampling, other')
  return phase, part


def _op_name(line: str, comps: Mapping[str, str]) -> str:
  """An instruction line's op_name; for a fusion XLA made without one (e.g. a split reduction), its fused
  ops' name; '' when neither has one."""
  found = re.search(r'op_name="([^"]*)"', line)
  called = re.search(r'calls=%?([\w.\-]+)', line)
  if found is None and called is not None:
    found = re.search(r'op_name="([^"]*)"', comps.get(called.group(1), ''))
  return found.group(1) if found else ''


def loop_kernels_by_origin(hlo_text: str) -> Dict[str, Dict[str, int]]:
  """Kernels per iteration of the largest `while` body (scatter expansions left out), by phase and part:
  {phase: {part: count}}; see `kernel_origin`. A fusion counts once, under its root's op_name."""
  loops = loop_body_ops(hlo_text, skip_scatter_loops=True)
  if not loops:
    return {}
  comps = _computations(hlo_text)
  out: Dict[str, Dict[str, int]] = {}
  for line in _inlined_lines(next(iter(loops)), comps, skip_scatter_loops=True):
    found = _INSTRUCTION.match(line)
    if found is None or found.group(1) in _TRIVIAL:
      continue
    phase, part = kernel_origin(_op_name(line, comps))
    out.setdefault(phase, {})
    out[phase][part] = out[phase].get(part, 0) + 1
  return out


def compiled_predict_text(model: models.SpeculativeEncoderDecoderModel, params, batch,
                          decoder_params: Mapping[str, Any]) -> str:
  """The optimized HLO text of the jitted predict function (compiled once; read it with `loop_facts` and
  `loop_kernels_by_origin`)."""
  fn = jax.jit(lambda p, b: model.predict_batch_with_aux(p, b, decoder_params=dict(decoder_params)))
  return fn.lower(params, {k: batch[k] for k in ('encoder_input_tokens', 'decoder_input_tokens')}
                  ).compile().as_text()


def loop_facts(hlo_text: str) -> Dict[str, Dict[str, int]]:
  """`hlo_summary` of every while loop of a compiled program (`loop_body_ops`, scatter expansions left out),
  largest first."""
  return {name: hlo_summary(ops)
          for name, ops in loop_body_ops(hlo_text, skip_scatter_loops=True).items()}


def compiled_loop_facts(model: models.SpeculativeEncoderDecoderModel, params, batch,
                        decoder_params: Mapping[str, Any]) -> Dict[str, Dict[str, int]]:
  """`loop_facts` of the predict function's program."""
  return loop_facts(compiled_predict_text(model, params, batch, decoder_params))


def compiled_loop_kernels(model: models.SpeculativeEncoderDecoderModel, params, batch,
                          decoder_params: Mapping[str, Any]) -> Dict[str, Dict[str, int]]:
  """`loop_kernels_by_origin` of the predict function's decode loop."""
  return loop_kernels_by_origin(compiled_predict_text(model, params, batch, decoder_params))


# ----------------------------------------------------------------------------------------------------------
# Kernels of a profiler trace (jax.profiler), and the instructions they are named after.
# ----------------------------------------------------------------------------------------------------------


def _kernel_family(name: str) -> str:
  """`ynn_fusion.135` -> `ynn_fusion`: one row per kind of kernel XLA emitted."""
  return re.sub(r'(\.\d+)+$', '', name)


def _is_op_line(plane_name: str, line_name: str, has_device: bool) -> bool:
  if has_device:  # GPU/TPU: the device planes' op lines
    return plane_name.startswith('/device:') and 'op' in line_name.lower()
  # The runtime's threads: small programs run on the client thread, larger ones on the Eigen pool too.
  return plane_name.startswith('/host:CPU') and line_name.startswith('tf_XLA')


def trace_kernel_breakdown(fn: Callable[[], Any], calls: int = 3, logdir: Optional[str] = None,
                           top: int = 15) -> Dict[str, Any]:
  """Runs `fn()` (already compiled) `calls` times under `jax.profiler` and sums each kernel's exclusive
  time (its own, less the kernels it launched), per kernel family (`ynn_fusion`, `dot`, `copy`, the
  executor's own overhead, ...) and for the `top` costliest kernels. Milliseconds per call. On CPU the
  kernels are the XLA thunks on the compute threads; on GPU/TPU the device planes' op lines.
  """
  jax.block_until_ready(fn())
  logdir = logdir or tempfile.mkdtemp(prefix='specdec_trace_')
  jax.profiler.start_trace(logdir)
  try:
    start = time.perf_counter()
    for _ in range(calls):
      jax.block_until_ready(fn())
    wall = (time.perf_counter() - start) / calls
  finally:
    jax.profiler.stop_trace()
  paths = sorted(glob.glob(os.path.join(logdir, 'plugins', 'profile', '*', '*.xplane.pb')))
  if not paths:
    raise RuntimeError(f'jax.profiler wrote no trace under {logdir}.')
  data = jax.profiler.ProfileData.from_file(paths[-1])
  planes = list(data.planes)
  # A device plane counts only with op events: libtpu, once loaded (the TPU compile check), adds an empty
  # '/device:CUSTOM:Megascale Trace' plane to every trace, CPU runs included.
  has_device = any(_is_op_line(p.name, line.name, True) and any(True for _ in line.events)
                   for p in planes for line in p.lines)
  exclusive, counts = collections.defaultdict(float), collections.Counter()
  for plane in planes:
    for line in plane.lines:
      if not _is_op_line(plane.name, line.name, has_device):
        continue
      stack = []
      for begin, duration, name in sorted((e.start_ns, e.duration_ns, e.name) for e in line.events):
        if name.startswith('end: '):  # zero-length markers
          continue
        while stack and stack[-1][0] + stack[-1][1] <= begin:
          stack.pop()
        if stack:
          exclusive[stack[-1][2]] -= duration
        exclusive[name] += duration
        counts[name] += 1
        stack.append((begin, duration, name))
  families, family_counts = collections.defaultdict(float), collections.Counter()
  for name, ns in exclusive.items():
    if 'wait for completion' in name:  # the client thread idling while the pool works
      continue
    families[_kernel_family(name)] += ns
    family_counts[_kernel_family(name)] += counts[name]
  total = sum(families.values())
  rows = [{'kernel': k, 'ms_per_call': v / 1e6 / calls, 'share': v / total if total else 0.0,
           'launches_per_call': family_counts[k] / calls}
          for k, v in sorted(families.items(), key=lambda kv: -kv[1])]
  top = [{'kernel': k, 'ms_per_call': v / 1e6 / calls, 'launches_per_call': counts[k] / calls}
         for k, v in sorted(exclusive.items(), key=lambda kv: -kv[1])
         if 'wait for completion' not in k][:top]
  return {'wall_ms_per_call': 1000 * wall, 'busy_ms_per_call': total / 1e6 / calls,
          'families': rows, 'top_kernels': top, 'device': has_device}


def instruction_facts(hlo_text: str) -> Dict[str, Dict[str, Any]]:
  """{instruction name: {'opcode', 'shape', 'op_name', 'part', 'operands', 'product'}} of every instruction of
  a compiled module's text. The runtime names its kernels after these instructions (`dot.99`, `ynn_fusion.3`),
  so a trace's kernels can be told apart by what they compute; a fusion XLA made without a name is named by its
  ops. `product`: the instruction is a matrix product, or a fusion of one."""
  comps = _computations(hlo_text)
  out = {}
  for line in hlo_text.splitlines():
    found = re.match(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\(', line)
    if found is None:
      continue
    name, shape, opcode = found.groups()
    op_name = _op_name(line, comps)
    called = re.search(r'calls=%?([\w.\-]+)', line)
    operands = re.findall(r'%([\w.\-]+)', line[found.end():].split(')', 1)[0])
    fused = comps.get(called.group(1), '') if called is not None else ''
    out[name] = {'opcode': opcode, 'shape': re.sub(r'\{[^{}]*\}', '', shape).strip(), 'op_name': op_name,
                 'part': kernel_origin(op_name)[1], 'operands': operands,
                 'product': opcode == 'dot' or re.search(r'\sdot\(', fused) is not None}
  return out


_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 'bf16': 2, 'f16': 2, 's16': 2, 'u16': 2, 'f32': 4, 's32': 4,
                'u32': 4, 'f64': 8, 's64': 8, 'u64': 8}


def shape_bytes(shape: str) -> int:
  """Bytes of an array shape's text (`f32[384,2048]` -> 3145728); 0 for a tuple or an unknown type."""
  found = re.fullmatch(r'([a-z]\w*)\[([\d,]*)\]', shape)
  if found is None or found.group(1) not in _DTYPE_BYTES:
    return 0
  dims = [int(d) for d in found.group(2).split(',') if d]
  return int(np.prod(dims, dtype=np.int64)) * _DTYPE_BYTES[found.group(1)]
