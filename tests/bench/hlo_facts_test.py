"""Tests for specdec/bench/hlo_facts.py: HLO text parsed (hand-made and compiled), profiler traces read."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import decoding
from specdec.bench import hlo_facts
from specdec import models
from specdec.cloud_tpu import tpu_slices
# The same tiny target and drafter as the timing tests (`pair` is a module-scoped fixture).
from tests.bench.profiling_test import _batch, pair  # pylint: disable=unused-import


HLO = """HloModule m

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

%body.1 (arg: (s32[], f32[4])) -> (s32[], f32[4]) {
  %arg = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[4]{0} get-tuple-element(%arg), index=1
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused
  %c = f32[4]{0} copy(%f)
  %d = f32[4]{0} dot(%c, %c), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %d)
}

%cond.1 (arg: (s32[], f32[4])) -> pred[] {
  %arg = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %k = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %z = s32[] constant(0)
  %t = (s32[], f32[4]{0}) tuple(%z, %x)
  %w = (s32[], f32[4]{0}) while(%t), condition=%cond.1, body=%body.1
  ROOT %r = f32[4]{0} get-tuple-element(%w), index=1
}
"""


def test_loop_body_ops_parses_hlo_text():
  ops = hlo_facts.loop_body_ops(HLO)
  assert list(ops) == ['body.1']
  assert ops['body.1']['fusion'] == 1 and ops['body.1']['copy'] == 1 and ops['body.1']['dot'] == 1
  summary = hlo_facts.hlo_summary(ops['body.1'])
  assert summary['kernels'] == 3  # fusion, copy, dot (parameters, tuples and element reads are free)
  assert summary['copy'] == 1 and summary['dot/custom-call'] == 1


def test_loop_body_ops_can_leave_out_scatter_expansions():
  expanded = HLO.replace('body=%body.1', 'body=%body.1, metadata={op_name="jit(f)/while/body/scatter"}')
  assert list(hlo_facts.loop_body_ops(expanded)) == ['body.1']
  assert hlo_facts.loop_body_ops(expanded, skip_scatter_loops=True) == {}
  assert list(hlo_facts.loop_body_ops(HLO, skip_scatter_loops=True)) == ['body.1']
  written = HLO.replace('body=%body.1', 'body=%body.1, metadata={op_name="jit(f)/while"}')
  assert list(hlo_facts.loop_body_ops(written, skip_scatter_loops=True)) == ['body.1']


def test_loop_body_ops_counts_what_a_called_computation_holds():
  """Newer XLA wraps a nested `while` in a computation the loop body `call`s: its ops are the body's."""
  inner = HLO.replace('%body.1 (', '%inner_body (').replace('%cond.1 (', '%inner_cond (')
  inner = inner.split('ENTRY')[0].replace('%fused (', '%inner_fused (').replace('calls=%fused', 'calls=%inner_fused')
  wrapped = HLO.replace('ENTRY', inner + """%inner_loop (a: (s32[], f32[4])) -> (s32[], f32[4]) {
  %a = (s32[], f32[4]{0}) parameter(0)
  ROOT %w2 = (s32[], f32[4]{0}) while(%a), condition=%inner_cond, body=%inner_body
}

ENTRY""").replace('  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %d)', """  %t0 = (s32[], f32[4]{0}) tuple(%i, %d)
  %cl = (s32[], f32[4]{0}) call(%t0), to_apply=%inner_loop
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %d)""")
  ops = hlo_facts.loop_body_ops(wrapped)
  assert ops['body.1'].get('call', 0) == 0 and ops['body.1']['while'] == 1
  assert hlo_facts.hlo_summary(ops['body.1'])['kernels'] == 4  # fusion, copy, dot and the nested while
  assert ops['inner_body']['fusion'] == 1


def test_compiled_loop_facts_sees_the_decode_loops(pair):
  (tm, tp), (dm, dp) = pair
  batch = _batch()
  spec = models.SpeculativeEncoderDecoderModel(tm, dm, decode_fn=decoding.speculative_sample)
  params = {'target': tp, 'drafter': dp}
  # A fixed γ drafts in unrolled steps: the decode loop alone, with no loop inside.
  fixed = hlo_facts.compiled_loop_facts(spec, params, batch, {'temperature': 0.0, 'gamma': 3})
  assert len(fixed) == 1
  assert all(f['kernels'] > 0 and f['while'] == 0 for f in fixed.values())
  # Adaptive drafting stops when no row drafts any more: the decode loop and the drafting loop inside it.
  adaptive = hlo_facts.compiled_loop_facts(spec, params, batch,
                                           {'temperature': 0.0, 'gamma': 3, 'draft_confidence': 0.5})
  assert len(adaptive) >= 2
  assert all(f['kernels'] > 0 for f in adaptive.values())
  assert any(f['while'] >= 1 for f in adaptive.values())


def test_kernel_origin_reads_phase_and_layer_part():
  name = 'jit(f)/while/body/draft_phase/FeatureHead.decode_step/layers_0._blocks/pre_mlp_layer_norm/square'
  assert hlo_facts.kernel_origin(name) == ('draft_phase', 'norms')
  assert hlo_facts.kernel_origin(
      'jit(f)/while/body/verify_phase/Transformer.decode_step/layers_3/encoder_decoder_attention/exp'
  ) == ('verify_phase', 'cross-attention')
  assert hlo_facts.kernel_origin('jit(f)/while/body/commit_phase/scatter') == ('commit_phase',
                                                                              'logits, sampling, other')
  assert hlo_facts.kernel_origin('') == ('loop', 'logits, sampling, other')


def test_loop_kernels_by_origin_on_hand_hlo():
  named = (HLO.replace('calls=%fused', 'calls=%fused, metadata={op_name="jit(f)/while/body/draft_phase/'
                       'Head.decode_step/self_attention/exp"}')
           .replace('rhs_contracting_dims={0}', 'rhs_contracting_dims={0}, metadata={op_name="jit(f)/while/'
                    'body/verify_phase/Transformer.decode_step/mlp/wi/dot_general"}'))
  # The copy has no op_name and calls nothing: the loop's own.
  assert hlo_facts.loop_kernels_by_origin(named) == {
      'draft_phase': {'self-attention': 1}, 'loop': {'logits, sampling, other': 1}, 'verify_phase': {'MLP': 1}}
  # A fusion without a name of its own takes the name of the ops it fused.
  inner = HLO.replace('negate(%p)', 'negate(%p), metadata={op_name="jit(f)/while/body/accept_phase/neg"}')
  assert inner != HLO
  assert hlo_facts.loop_kernels_by_origin(inner) == {
      'accept_phase': {'logits, sampling, other': 1}, 'loop': {'logits, sampling, other': 2}}
  assert hlo_facts.loop_kernels_by_origin(HLO.replace('while(', 'call(')) == {}


def test_compiled_loop_kernels_attribute_the_phases(pair):
  (tm, tp), (dm, dp) = pair
  spec = models.SpeculativeEncoderDecoderModel(tm, dm, decode_fn=decoding.speculative_sample)
  kernels = hlo_facts.compiled_loop_kernels(spec, {'target': tp, 'drafter': dp}, _batch(),
                                            {'temperature': 0.0, 'gamma': 2})
  assert set(hlo_facts.PHASES) <= set(kernels)
  for phase in ('draft_phase', 'verify_phase'):  # both call a T5 decoder: its layer parts are named
    assert kernels[phase].get('self-attention', 0) > 0 and kernels[phase].get('MLP', 0) > 0
    assert kernels[phase].get('norms', 0) > 0


def test_kernel_family_strips_instance_numbers():
  assert hlo_facts._kernel_family('ynn_fusion.135') == 'ynn_fusion'
  assert hlo_facts._kernel_family('copy.1.2') == 'copy'
  assert hlo_facts._kernel_family('ThunkExecutor::Execute') == 'ThunkExecutor::Execute'


def test_trace_kernel_breakdown_sees_the_kernels(tmp_path):
  w = jnp.asarray(np.random.RandomState(0).randn(64, 64).astype(np.float32))

  @jax.jit
  def looped(x):
    return jax.lax.fori_loop(0, 20, lambda i, x: jnp.tanh(x @ w), x)

  x = jnp.ones((4, 64), jnp.float32)
  report = hlo_facts.trace_kernel_breakdown(lambda: looped(x), calls=2, logdir=str(tmp_path))
  assert report['families'], report
  assert report['busy_ms_per_call'] > 0 and math.isfinite(report['wall_ms_per_call'])
  assert sum(r['share'] for r in report['families']) == pytest.approx(1.0)
  # The 20 matmuls run as 20 launches of some kernel family per call.
  assert max(r['launches_per_call'] for r in report['families']) >= 20


def test_trace_kernel_breakdown_sees_cpu_kernels_once_libtpu_is_loaded(tmp_path):
  """libtpu, loaded by a TPU compile in the same process, adds an empty device plane to every trace after it."""
  tpu_slices.topology_devices(tpu_slices.slice_named('v4-8'))
  w = jnp.asarray(np.random.RandomState(0).randn(64, 64).astype(np.float32))
  fn = jax.jit(lambda x: jnp.tanh(x @ w))
  x = jnp.ones((4, 64), jnp.float32)
  report = hlo_facts.trace_kernel_breakdown(lambda: fn(x), calls=2, logdir=str(tmp_path))
  assert not report['device'] and report['busy_ms_per_call'] > 0, report


_HAND_HLO = """HloModule m

%fused_computation (p0: f32[1,4]) -> f32[1,4] {
  %p0 = f32[1,4]{1,0} parameter(0)
  ROOT %t = f32[1,4]{1,0} tanh(%p0), metadata={op_name="jit(f)/head/mlp/tanh"}
}

%fused_product (a: f32[1,8], b: f32[8,4]) -> f32[1,4] {
  %a = f32[1,8]{1,0} parameter(0)
  %b = f32[8,4]{1,0} parameter(1)
  ROOT %d = f32[1,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: f32[1,8], w: f32[8,4]) -> f32[1,4] {
  %x = f32[1,8]{1,0} parameter(0)
  %w = f32[8,4]{0,1} parameter(1)
  %dot.7 = f32[1,4]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ynn_fusion.2 = f32[1,4]{1,0} fusion(%x, %w), kind=kCustom, calls=%fused_product
  ROOT %tanh_fusion = f32[1,4]{1,0} fusion(%dot.7), kind=kLoop, calls=%fused_computation
}
"""


def test_instruction_facts_and_shape_bytes():
  facts = hlo_facts.instruction_facts(_HAND_HLO)
  assert facts['dot.7']['opcode'] == 'dot' and facts['dot.7']['shape'] == 'f32[1,4]'
  assert facts['dot.7']['operands'] == ['x', 'w'] and facts['w']['shape'] == 'f32[8,4]'
  # A fusion without a name of its own is named by its ops: the MLP here.
  assert facts['tanh_fusion']['part'] == 'MLP' and facts['tanh_fusion']['operands'] == ['dot.7']
  assert facts['dot.7']['product'] and facts['ynn_fusion.2']['product']
  assert not facts['tanh_fusion']['product'] and not facts['w']['product']
  assert hlo_facts.shape_bytes('f32[384,2048]') == 384 * 2048 * 4
  assert hlo_facts.shape_bytes('bf16[3,5]') == 30 and hlo_facts.shape_bytes('s32[]') == 4
  assert hlo_facts.shape_bytes('(f32[2], s32[])') == 0
