"""Tests for specdec/cloud_tpu/tpu_plan_check.py: planned vs compiled GiB per chip, only for the rows both describe."""

import json
import os

from specdec.cloud_tpu import tpu_plan_check

GIB = 2 ** 30


def _memory(arguments, temporaries, code, outputs=0, aliases=0):
  return {'arguments': arguments, 'outputs': outputs, 'aliases': aliases, 'temporaries': temporaries,
          'code': code}


def _decode(drafter, mesh='1 x 4', inputs=256, batch=1, memory=None):
  return {'kind': 'decode', 'settings': {'drafter': drafter, 'mesh': mesh, 'inputs': inputs, 'targets': 256,
                                         'batch': batch},
          'memory': memory or _memory(5 * GIB, GIB, GIB // 4)}


COMPILED_V4_8 = {
    'slice': {'name': 'v4-8'},
    'programs': {
        'xxl_ende_small_t0': _decode('small'),
        'xxl_ende_base_t0': _decode('base'),  # the plan assumes T5-small: not shared
        'xxl_cnndm_small_t0': _decode('small', inputs=512, batch=8),  # the plan has batch 1 and 32: not shared
        'xxl_ende_small_t1': {'kind': 'decode', 'error': 'ValueError: x', 'settings': {'drafter': 'small'}},
    }}
MEMORY_PLAN = {'rows': [
    {'slice': 'v4-8', 'data': 1, 'model': 4, 'inputs': 256, 'targets': 256, 'batch': 1,
     'target': {'params': 5 * GIB}, 'drafter': {'params': GIB // 8}, 'total': 5 * GIB + GIB // 4},
    {'slice': 'v4-8', 'data': 2, 'model': 2, 'inputs': 256, 'targets': 256, 'batch': 1,
     'target': {'params': 10 * GIB}, 'drafter': {'params': GIB // 8}, 'total': 11 * GIB},
]}
COMPILED_V4_128 = {
    'slice': {'name': 'v4-128'},
    'programs': {'small_ende': {'kind': 'train_step', 'settings': {'mesh': '64 x 1'},
                                'memory': _memory(GIB, GIB // 2, 0, outputs=GIB, aliases=GIB)}}}
TRAINING_PLAN = {'runs': [
    {'name': 'small_ende', 'configured': {'slice': 'v4-128', 'data': 64, 'model': 1, 'params': GIB // 2,
                                          'optimizer': GIB // 2, 'grads': GIB // 4, 'bf16_kernels': GIB // 8,
                                          'accumulator': 0, 'activations': GIB // 4, 'code': GIB // 4,
                                          'total': GIB + GIB // 2}},
    {'name': 'xxl_ende', 'configured': {'slice': 'v4-128', 'data': 16, 'model': 4}},  # not compiled
]}


def test_only_shared_rows_are_compared():
  rows = tpu_plan_check.memory_plan_rows(MEMORY_PLAN, COMPILED_V4_8)
  assert [r['program'] for r in rows] == ['xxl_ende_small_t0']
  row = rows[0]
  assert row['planned_total'] == 5 * GIB + GIB // 4
  assert row['compiled_total'] == 5 * GIB + GIB + GIB // 4
  assert not row['within'] and round(row['difference'], 3) == round(-1 / 6.25, 3)
  # The temporaries (1 GiB against the plan's 0.125 of caches and activations) make the gap.
  assert tpu_plan_check.largest_gap(row) == 'caches and activations: planned 0.12, compiled 1.00 GiB'


def test_training_rows_follow_the_gin_mesh_and_count_aliased_outputs_once():
  rows = tpu_plan_check.training_plan_rows(TRAINING_PLAN, COMPILED_V4_128)
  assert [r['program'] for r in rows] == ['small_ende']
  assert rows[0]['planned_total'] == rows[0]['compiled_total'] == GIB + GIB // 2
  assert rows[0]['within']
  # Parts: state (params + Adafactor), working (the rest of the plan's peak, here activations), code.
  assert rows[0]['planned'] == {'state': GIB, 'working': GIB // 4, 'code': GIB // 4}
  assert rows[0]['compiled'] == {'state': GIB, 'working': GIB // 2, 'code': 0}
  assert tpu_plan_check.training_plan_rows(TRAINING_PLAN, COMPILED_V4_8) == []


def test_write_comparison_reads_every_slice_and_writes_md_and_json(tmp_path):
  repo = tmp_path / 'repo'
  (repo / 'results' / 'tpu_compile').mkdir(parents=True)
  (repo / 'results' / 'xxl_memory_plan.json').write_text(json.dumps(MEMORY_PLAN))
  (repo / 'results' / 'xxl_training_plan.json').write_text(json.dumps(TRAINING_PLAN))
  compiled_dir = repo / 'results' / 'tpu_compile'
  (compiled_dir / 'v4-8.json').write_text(json.dumps(COMPILED_V4_8))
  (compiled_dir / 'v4-128.json').write_text(json.dumps(COMPILED_V4_128))
  md_path = tpu_plan_check.write_comparison(str(repo), str(compiled_dir), 'python scripts/tpu_compile.py '
                                            '--compare_plans')
  md = open(md_path, encoding='utf-8').read()
  assert '`python scripts/tpu_compile.py --compare_plans`' in md
  assert '| xxl_training_plan | small_ende | v4-128 | 64 x 1 | 1.50 | 1.50 | +0% | yes |' in md
  assert '| xxl_memory_plan | xxl_ende_small_t0 | v4-8 | 1 x 4 | 5.25 | 6.25 | -16% | **no** |' in md
  written = json.load(open(os.path.join(compiled_dir, 'plans_vs_compiled.json'), encoding='utf-8'))
  assert len(written['rows']) == 2
