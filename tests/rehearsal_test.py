"""A CPU rehearsal of the Table-2 path on Cloud TPU, on 8 simulated devices.

The steps the TPU run takes, at toy scale, in one spawned process with
8 CPU devices (see tests/sharded_decoding_test.py for why a helper process):

1. "Pre-trained" T5X checkpoints: a tiny T5 1.1 target (2 + 2 layers) and
   drafter (1 + 1 layers), random init, written in T5X's layout (msgpack +
   zarr) as gs://t5-data/pretrained_models/t5x/t5_1_1_*/checkpoint_1000000
   are.
2. Fine-tuning each on `specdec_wmt_ende` (TFDS wmt_t2t_translate, here
   `tfds.testing.mock_data`) on a 2x4 ('data', 'model') mesh: init_from_t5x
   read into the shards, T5X's fine-tuning defaults (Adafactor, constant
   learning rate 1e-3, dropout 0.1), greedy-decode BLEU on validation,
   sharded Orbax checkpoints.
3. The Table-2 row: `main.run` of a 'table' `run_config.RunConfig` loads both fine-tuned
   checkpoints into the shards of a 4x2 mesh and benchmarks greedy
   speculative decoding (gamma 3) against the greedy baseline on the test
   split.

Checks: the row's greedy speculative decodes are the baseline's, which are
the fine-tuned target's own greedy decodes on one device; the row's fields
are present and in range; the checkpoints were read into 4x2 shards.

T5's vocabulary (gs://t5-data/vocabs/cc_all.32000) cannot be read here: the
shipped 8100-id SentencePiece model stands in (vocab_size 8192). It takes
about a minute on 2 idle cores.
"""

import contextlib
import functools
import io
import json
import os
import time

import jax
import numpy as np
import pytest

from tests import device_pool
from specdec import checkpoints
from specdec import network
from specdec import t5x_checkpoint
from specdec import tasks
from specdec.training import train

NUM_DEVICES = 8
CHILD_XLA_FLAGS = (f'--xla_force_host_platform_device_count={NUM_DEVICES} '
                   '--xla_backend_optimization_level=0')
FIXTURE_CORPUS = os.path.join(os.path.dirname(__file__), 'testdata', 'tasks', 'corpus')

_TINY = dict(vocab_size=8192, head_dim=8, relative_attention_num_buckets=8,
             relative_attention_max_distance=16, dropout_rate=0.1)
TARGET_CFG = network.T5Config(emb_dim=32, num_heads=4, num_encoder_layers=2,
                              num_decoder_layers=2, mlp_dim=64, **_TINY)
DRAFTER_CFG = network.T5Config(emb_dim=16, num_heads=4, num_encoder_layers=1,
                               num_decoder_layers=1, mlp_dim=32, **_TINY)
TASK = tasks.WMT_ENDE_TASK
LENGTHS = {'inputs': 24, 'targets': 16}  # mock examples: <= 19 input and 16 target tokens
MOCK_EXAMPLES = 16
STEPS = 3
EXAMPLES = 8
GAMMA = 3


@pytest.fixture(scope='module')
def devices8():
  with device_pool.spawned(CHILD_XLA_FLAGS) as pool:
    yield pool


# -----------------------------------------------------------------------------
# The rehearsal, run in the helper process.
# -----------------------------------------------------------------------------


def _pretrained(root, name, config, seed):
  """A T5X checkpoint of a random init, as the public T5 1.1 ones are laid out."""
  params = network.init_params(config, jax.random.PRNGKey(seed))
  return t5x_checkpoint.save(os.path.join(root, 'pretrained', name, 'checkpoint_1000000'),
                             jax.device_get(params), step=1_000_000)


def _finetune(root, name, config, pretrained):
  """Fine-tunes on the 2x4 mesh with T5X's fine-tuning optimizer; (record, log, printed)."""
  model_dir = os.path.join(root, 'finetune', name)
  out = io.StringIO()
  with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
    mp.setattr(train, 'make_optimizer',
               functools.partial(train.make_optimizer, schedule='constant', clip_norm=None))
    record = train.train(model_dir, config, mixture_or_task_name=TASK,
                         feature_lengths=LENGTHS, batch_size=8, num_steps=STEPS,
                         checkpoint_every=STEPS, log_every=1, eval_every=STEPS,
                         eval_batches=1, eval_decode_tasks=(TASK,), eval_decode_examples=4,
                         num_partitions=4, init_from_t5x=pretrained,
                         export_dir=os.path.join(root, 'export', name))
  with open(os.path.join(model_dir, 'train_log.jsonl')) as f:
    log = [json.loads(line) for line in f]
  return dict(record=record, log=log, printed=out.getvalue(),
              checkpoint=os.path.join(model_dir, 'checkpoints'),
              export=os.path.join(root, 'export', name))


def _one_device_greedy(checkpoint, examples):
  """The fine-tuned target's greedy decodes on one device (no mesh), as texts."""
  from specdec import decoding  # pylint: disable=g-import-not-at-top
  from specdec import evaluation  # pylint: disable=g-import-not-at-top
  from specdec import models  # pylint: disable=g-import-not-at-top
  import seqio  # pylint: disable=g-import-not-at-top
  params = checkpoints.restore_params(checkpoint, TARGET_CFG)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET_CFG), None, decode_fn=decoding.temperature_sample)
  predict = model.compile_predict({'temperature': 0.0})
  vocab = seqio.get_mixture_or_task(TASK).output_features['targets'].vocabulary
  texts = []
  for idx, batch in evaluation.batches(examples, LENGTHS, 4, use_buckets=False):
    decodes = np.asarray(predict({'target': params}, batch)[0])
    texts += [vocab.decode(decodes[row].tolist()) for row in range(len(idx))]
  return texts


def _case_rehearsal(root):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from specdec import evaluation  # pylint: disable=g-import-not-at-top
  from specdec import main  # pylint: disable=g-import-not-at-top
  from specdec import run_config  # pylint: disable=g-import-not-at-top
  from specdec import settings  # pylint: disable=g-import-not-at-top
  assert jax.device_count() == NUM_DEVICES, jax.devices()
  seconds = {}
  start = time.perf_counter()
  tasks.register_paper_tasks(vocab_path=tasks.DEFAULT_VOCAB_PATH)
  pretrained = {'target': _pretrained(root, 'target', TARGET_CFG, 0),
                'small': _pretrained(root, 'small', DRAFTER_CFG, 1)}
  restored = []
  real_restore = checkpoints.restore_params

  def spy(path, config, shardings=None, dtype=None, fmt=None):
    params = real_restore(path, config, shardings, dtype, fmt)
    leaf = params['encoder']['layers_0']['mlp']['wi_0']['kernel']
    restored.append((path, dict(leaf.sharding.mesh.shape), leaf.sharding.spec))
    return params

  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES), \
      pytest.MonkeyPatch.context() as mp:
    mp.setattr(checkpoints, 'restore_params', spy)
    # tfds's mock swaps the process's file functions for ones rooted in its temp dir while it builds a
    # dataset (evaluation does, right after a save): a save finishing in the background then would write
    # there and fail. Saves finish before training goes on here.
    mp.setattr(checkpoints, 'training_checkpoint_manager',
               functools.partial(checkpoints.training_checkpoint_manager, enable_async=False))
    finetuned = {}
    for name, config in (('target', TARGET_CFG), ('small', DRAFTER_CFG)):
      finetuned[name] = _finetune(root, name, config, pretrained[name])
      seconds[f'finetune_{name}'] = time.perf_counter() - start - sum(seconds.values())
    # The fine-tuned drafter (its Orbax checkpoint, config from gin), and the target drafting
    # for itself (a compact copy, which carries its config): greedy alpha must be 1. The copy
    # is float32: the trainer's bfloat16 export is another network, whose greedy choices
    # differ from the target's wherever this barely trained target's top logits nearly tie.
    self_dir = os.path.join(root, 'self_float32')
    checkpoints.save_compact(self_dir, TARGET_CFG,
                             jax.device_get(real_restore(finetuned['target']['checkpoint'],
                                                         TARGET_CFG)),
                             storage_dtype=np.float32)
    drafters = [('small', finetuned['small']['checkpoint']), ('self', self_dir)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      table = main.run(run_config.RunConfig(
          output_dir=os.path.join(root, 'table2'), mode='table',
          data=run_config.DataConfig(task=TASK, split='test', feature_lengths=LENGTHS, max_examples=EXAMPLES,
                                     corpus_dir=FIXTURE_CORPUS, vocab_path=tasks.DEFAULT_VOCAB_PATH),
          models=run_config.ModelsConfig(target_checkpoint=finetuned['target']['checkpoint'],
                                         target_config=TARGET_CFG, drafter_config=DRAFTER_CFG),
          decoding=settings.Setting(batch_size=4, repeats=1, length_buckets=False),
          rows=[main.Row(task=TASK, drafter=name, temperature=0.0, gamma=GAMMA,
                         drafter_checkpoint=checkpoint) for name, checkpoint in drafters],
          num_partitions=2, table_name='Rehearsal'))
    seconds['table_row'] = time.perf_counter() - start - sum(seconds.values())
    examples = evaluation.task_examples(TASK, 'test', LENGTHS, EXAMPLES)
  one_device = _one_device_greedy(finetuned['target']['checkpoint'], examples)
  seconds['one_device_check'] = time.perf_counter() - start - sum(seconds.values())
  rows, records = {}, {}
  for row in table['rows']:
    rows[row['drafter']] = row
    row_dir = main._table_row_name(main.Row(  # pylint: disable=protected-access
        task=TASK, drafter=row['drafter'], temperature=0.0, gamma=GAMMA))
    with open(os.path.join(root, 'table2', row_dir, 'examples.jsonl')) as f:
      records[row['drafter']] = sorted(map(json.loads, f), key=lambda r: r['index'])
  with open(os.path.join(root, 'table2', 'table.md')) as f:
    table_md = f.read()
  return dict(finetuned=finetuned, rows=rows, records=records, table_md=table_md,
              one_device=one_device, restored=restored, seconds=seconds,
              printed=out.getvalue())


@pytest.fixture(scope='module')
def rehearsal(devices8, tmp_path_factory):
  return devices8.submit(_case_rehearsal, str(tmp_path_factory.mktemp('rehearsal'))).result()


# -----------------------------------------------------------------------------
# Checks.
# -----------------------------------------------------------------------------


class TestFineTuning:

  @pytest.mark.parametrize('name', ['target', 'small'])
  def test_trained_from_the_t5x_checkpoint_on_2x4(self, rehearsal, name):
    run = rehearsal['finetuned'][name]
    assert 'Initialising params from the T5X checkpoint' in run['printed']
    assert "Mesh {'data': 2, 'model': 4}" in run['printed']
    losses = [r['loss'] for r in run['log'] if r['kind'] == 'train']
    assert len(losses) == STEPS and all(np.isfinite(losses))

  @pytest.mark.parametrize('name', ['target', 'small'])
  def test_bleu_on_validation(self, rehearsal, name):
    record = rehearsal['finetuned'][name]['record']
    assert record['step'] == STEPS
    assert 0.0 <= record[f'{TASK}/bleu'] <= 100.0
    assert np.isfinite(record['eval_loss'])


class TestTable2Row:

  def test_checkpoints_read_into_their_shards(self, rehearsal):
    """T5X inits read into the 2x4 training mesh's shards, fine-tuned ones into the 4x2 one's."""
    reads = {('pretrained' if f'{os.sep}pretrained{os.sep}' in p else 'finetuned',
              os.path.basename(os.path.dirname(p.rstrip(os.sep))), mesh['data'], mesh['model'],
              tuple(spec)) for p, mesh, spec in rehearsal['restored']}
    wi_spec = (None, 'model')  # encoder/layers_0/mlp/wi_0/kernel: (embed, mlp)
    assert reads == {('pretrained', 'target', 2, 4, wi_spec), ('pretrained', 'small', 2, 4, wi_spec),
                     ('finetuned', 'target', 4, 2, wi_spec), ('finetuned', 'small', 4, 2, wi_spec)}

  @pytest.mark.parametrize('drafter', ['small', 'self'])
  def test_speculative_equals_baseline_equals_one_device(self, rehearsal, drafter):
    records = rehearsal['records'][drafter]
    assert [r['index'] for r in records] == list(range(EXAMPLES))
    assert all(r['identical'] for r in records)
    assert [r['baseline_text'] for r in records] == rehearsal['one_device']
    assert [r['speculative_text'] for r in records] == rehearsal['one_device']
    assert all(r['drafted'] > 0 and r['target_calls'] > 0 for r in records)

  @pytest.mark.parametrize('drafter', ['small', 'self'])
  def test_row_fields(self, rehearsal, drafter):
    row = rehearsal['rows'][drafter]
    assert row['task'] == TASK and row['drafter'] == drafter
    assert row['setting']['gamma'] == GAMMA and row['setting']['temperature'] == 0.0
    assert row['examples'] == EXAMPLES and row['identical_rate'] == 1.0
    assert 0.0 <= row['alpha_accept'] <= 1.0 and 0.0 <= row['alpha_overlap'] <= 1.0
    assert 1.0 <= row['tokens_per_target_call'] <= GAMMA + 1
    assert row['speedup'] > 0 and row['costs']['c'] > 0
    assert set(row['quality']['baseline']) == {'bleu'}
    assert row['quality']['speculative'] == row['quality']['baseline']
    assert "mesh {'data': 4, 'model': 2}" in row['fingerprint']['devices']

  def test_the_target_drafting_for_itself_is_always_accepted(self, rehearsal):
    row = rehearsal['rows']['self']
    assert row['alpha_accept'] == 1.0
    assert row['alpha_overlap'] == pytest.approx(1.0, abs=1e-5)
    assert row['tokens_per_target_call'] > 1.0

  def test_table_beside_the_paper(self, rehearsal):
    text = rehearsal['table_md']
    assert text.startswith('## Rehearsal')
    line = [l for l in text.splitlines() if l.startswith('| EnDe (WMT) | small | 0 | 3 |')]
    assert len(line) == 1, text
    assert 'T5-small: 7, 0.75, 3.4×' in line[0]  # the paper's row for this drafter
    assert '| 100% |' in line[0]

  def test_timing(self, rehearsal):
    """Not asserted (timing is for benchmarks): printed for the record."""
    print({k: round(v, 1) for k, v in rehearsal['seconds'].items()})
