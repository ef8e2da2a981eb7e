"""Tests for specdec/bench/xxl_memory_plan.py on small networks and meshes."""

import dataclasses
import functools
import json

from specdec import network
from specdec import partitioning
from specdec.bench import xxl_memory_plan as plan

_SMALL = dict(num_encoder_layers=1, num_decoder_layers=1, head_dim=4,
              relative_attention_num_buckets=8,
              relative_attention_max_distance=16, dropout_rate=0.0)
TARGET_CFG = network.T5Config(vocab_size=64, emb_dim=16, num_heads=4,
                              mlp_dim=32, **_SMALL)
DRAFTER_CFG = network.T5Config(vocab_size=64, emb_dim=8, num_heads=2,
                               mlp_dim=16, **_SMALL)
RULES_1D = partitioning.standard_logical_axis_rules()


def test_plan_rows_small():
  plan_small = functools.partial(
      plan.plan_rows, TARGET_CFG, DRAFTER_CFG, {'tiny-8': 8}, {'t': (6, 5)},
      (1, 8), 2, RULES_1D, 'bfloat16', headroom=1.2)
  totals = [r['total'] for r in plan_small(hbm_gib=1.0)]
  # An HBM size between the smallest and largest layout's needs.
  hbm_gib = 1.2 * (min(totals) + max(totals)) / 2 / 2 ** 30
  rows = plan_small(hbm_gib=hbm_gib)
  assert [(r['data'], r['model'], r['batch']) for r in rows] == [
      (8, 1, 1), (8, 1, 8), (4, 2, 1), (4, 2, 8), (2, 4, 1), (2, 4, 8),
      (1, 8, 1), (1, 8, 8)]
  for r in rows:
    parts = [r['target'][k] + r['drafter'][k]
             for k in ('params', 'self_cache', 'cross_cache')]
    assert r['code'] == int(plan.CODE_GIB * plan.GIB)
    assert r['loop_kernels'] == (plan.loop_kernel_bytes(TARGET_CFG, {'data': r['data'], 'model': r['model']},
                                                        RULES_1D, 'bfloat16')
                                 + plan.loop_kernel_bytes(DRAFTER_CFG, {'data': r['data'], 'model': r['model']},
                                                          RULES_1D, 'bfloat16'))
    assert r['total'] == sum(parts) + r['activations'] + r['loop_kernels'] + r['code']
    for net in ('target', 'drafter'):
      for k in ('params', 'self_cache', 'cross_cache'):
        assert r[net][k] * 8 >= r[net][f'{k}_total']
    assert r['fits'] == (r['total'] * 1.2 <= hbm_gib * 2 ** 30)
  # Batch 1 on data = 8: the cache is replicated, every chip holds it all.
  one = rows[0]
  assert one['target']['self_cache'] == one['target']['self_cache_total']
  # More model parallelism, fewer param bytes per chip.
  by_model = {r['model']: r['target']['params'] for r in rows}
  assert by_model[8] < by_model[4] < by_model[2] < by_model[1]
  assert not all(r['fits'] for r in rows) and any(r['fits'] for r in rows)

  best = plan.smallest_fits(rows)
  assert set(best) <= {('t', 1), ('t', 8)} and best
  for (task, batch), r in best.items():
    assert r['fits'] and (r['task'], r['batch']) == (task, batch)
    assert r['total'] == min(x['total'] for x in rows
                             if x['fits'] and x['batch'] == batch)


def test_loop_kernels_by_hand():
  # One decoder layer: self-attention q, k, v and the cross-attention q, each (embed 16, joined_kv 4 x 4), bf16.
  one = plan.loop_kernel_bytes(TARGET_CFG, {'data': 1, 'model': 1}, RULES_1D, 'bfloat16')
  assert one == 4 * 16 * 16 * 2
  # joined_kv shards over 'model'; 'data' holds a whole copy each.
  assert plan.loop_kernel_bytes(TARGET_CFG, {'data': 2, 'model': 2}, RULES_1D, 'bfloat16') == one // 2
  two_layers = dataclasses.replace(TARGET_CFG, num_decoder_layers=2)
  assert plan.loop_kernel_bytes(two_layers, {'data': 1, 'model': 1}, RULES_1D, 'bfloat16') == 2 * one


def test_encoder_activations_shard_over_model():
  one = plan.encoder_activation_bytes(TARGET_CFG, {'data': 1, 'model': 1},
                                      RULES_1D, 2, 6)
  four = plan.encoder_activation_bytes(TARGET_CFG, {'data': 1, 'model': 4},
                                       RULES_1D, 2, 6)
  # Attention scores [2, 4, 6, 6]: f32 logits + f32 weights (config dtype).
  attention = 2 * 4 * 6 * 6 * (4 + 4) + 3 * 2 * 6 * 16 * 4
  residual = 2 * 2 * 6 * 16 * 4
  mlp = (len(TARGET_CFG.mlp_activations) + 1) * 2 * 6 * 32 * 4
  assert one == max(attention, mlp) + residual
  assert four < one


def test_report_and_markdown(tmp_path):
  report = plan.build_report(
      TARGET_CFG, DRAFTER_CFG, 'python scripts/xxl_memory_plan.py --x',
      slices={'v4-8': 4}, tasks={'ende': (16, 8)}, batches=(1,))
  assert report['command'] == 'python scripts/xxl_memory_plan.py --x'
  assert report['settings']['rules'] == '1-D parameter / 1-D activation'
  assert len(report['rows']) == 3 and report['target_params_total'] > 0
  json.dumps(report)  # The report is JSON as it is.
  text = plan.render_markdown(report)
  assert '`python scripts/xxl_memory_plan.py --x`' in text
  assert report['date'] in text and 'jax ' in text
  assert '| v4-8 | 1 x 4 |' in text
  assert '## WMT EnDe, inputs 16, targets 8, batch 1' in text
