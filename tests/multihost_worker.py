"""One process of tests/multihost_test.py's two-process JAX run (4 CPU devices each, 8 in all).

  JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=i \
  XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \
      python -m tests.multihost_worker OUT_DIR INPUTS.npz

`partitioning.initialize_multihost()` starts multi-host JAX from those variables; every array then lives on
the global 2 x 4 ('data', 'model') mesh, of which this process holds one data row. The worker

1. decodes the tiny speculative pair on that mesh, loading only this process's rows of the batch
   (`partitioning.host_batch_shard` / `global_batch`), greedy and at temperature 1, and brings the outputs
   back with `partitioning.to_host`;
2. runs the project's trainer for two steps on two fixed batches, of which it loads only its rows (the
   trainer's own `_local_batches` would read its seqio shard: other examples than one process reads), so
   the trainer writes its sharded checkpoint from both processes; then restores that checkpoint onto the mesh.

Each process writes what it saw to OUT_DIR/process_<i>.npz (the gathered outputs, so the test can check
that every process got the whole batch back). The test compares them with one process's decode and
training. The models and batches are defined here so that the test builds its one-process references from
the same definitions.
"""

import os
import sys
import time

import jax
import numpy as np

from specdec import checkpoints
from specdec import fileio
from specdec import models
from specdec import network
from specdec import partitioning
from specdec import sharded_decoding
from specdec.training import train
from specdec.training import train_config

VOCAB = 64
EOS = 1
DECODE_BATCH = 8
GAMMA = 3
DECODE_SEED = 7
NUM_PARTITIONS = 4  # a 2 x 4 mesh on 8 devices: 'model' inside a process, 'data' across the two
TRAIN_STEPS = 2
TRAIN_BATCH = 8
TRAIN_LENGTHS = {'inputs': 32, 'targets': 16}
FIXTURE_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'testdata', 'tasks', 'corpus')
TRAIN_TASK = 'specdec_local_mix'


def configs():
  """(target, drafter, trained network) configs: the tiny ones of sharded_decoding_test / train_sharded_test."""
  small = dict(num_encoder_layers=1, num_decoder_layers=1, head_dim=4, relative_attention_num_buckets=8,
               relative_attention_max_distance=16, dropout_rate=0.0)
  target = network.T5Config(vocab_size=VOCAB, emb_dim=16, num_heads=4, mlp_dim=32, **small)
  drafter = network.T5Config(vocab_size=VOCAB, emb_dim=8, num_heads=2, mlp_dim=16, **small)
  trained = network.T5Config(vocab_size=8192, emb_dim=32, num_heads=8, head_dim=4, num_encoder_layers=1,
                             num_decoder_layers=1, mlp_dim=64, relative_attention_num_buckets=8,
                             relative_attention_max_distance=16, dropout_rate=0.1)
  return target, drafter, trained


def decode_params():
  """{'target', 'drafter'} params; the target's EOS logit nudged so that rows end at different steps."""
  target_cfg, drafter_cfg, _ = configs()
  target_rng, drafter_rng = jax.random.split(jax.random.PRNGKey(0))
  target = jax.device_get(network.init_params(target_cfg, target_rng))
  kernel = np.array(target['decoder']['logits_dense']['kernel'])
  kernel[:, EOS] += 0.15 * np.sign(kernel[:, EOS])
  target['decoder']['logits_dense']['kernel'] = kernel
  return {'target': target, 'drafter': jax.device_get(network.init_params(drafter_cfg, drafter_rng))}


def decode_batch():
  """8 rows of different input lengths (numpy)."""
  rng = np.random.RandomState(1)
  enc = rng.randint(2, VOCAB, size=(DECODE_BATCH, 7)).astype(np.int32)
  for row in range(DECODE_BATCH):
    enc[row, 7 - (row % 3):] = 0
  return {'encoder_input_tokens': enc, 'decoder_input_tokens': np.zeros((DECODE_BATCH, 8), np.int32)}


def decoder_params():
  # topk=0: sample from the whole distribution (T5X's default topk=1 would make t = 1 argmax too).
  return {'temperature': 1.0, 'topk': 0, 'gamma': GAMMA, 'return_stats': True}


def speculative_model():
  target_cfg, drafter_cfg, _ = configs()
  return models.SpeculativeEncoderDecoderModel(network.Transformer(target_cfg),
                                               network.Transformer(drafter_cfg))


def train_settings(model_dir, num_partitions):
  """train.train's settings for both the two-process run and the one-process reference."""
  return dict(num_partitions=num_partitions, mixture_or_task_name=TRAIN_TASK, corpus_dir=FIXTURE_CORPUS, feature_lengths=TRAIN_LENGTHS,
              batch_size=TRAIN_BATCH, num_steps=TRAIN_STEPS, seed=0, checkpoint_every=TRAIN_STEPS,
              log_every=1, eval_every=1000, eval_batches=1, eval_decode_examples=0,
              export_dir=os.path.join(model_dir, 'export'))


def trainer_on_fixed_batches(model_dir, batches, mesh_rows, num_partitions):
  """A train.Trainer whose steps read `batches` (global numpy batches): this process's `mesh_rows` of each.

  `mesh_rows(batch_size)` -> (start, stop): the rows this host loads. Only the data source differs from a
  `train.train` run: the global batch, its sharding, the step, checkpoints and export are the trainer's.
  """
  trainer = train.Trainer(train_config.from_flat(model_dir, configs()[2], **train_settings(model_dir, num_partitions)))
  start, stop = mesh_rows(trainer.mesh, TRAIN_BATCH)
  local = [{k: v[start:stop] for k, v in batch.items()} for batch in batches]
  trainer._local_batches = lambda start_step: iter(local[start_step:])  # pylint: disable=protected-access
  return trainer


def host_rows(mesh, batch_size):
  """(start, stop) of the batch rows this process loads (`partitioning.host_batch_shard`)."""
  index, count = partitioning.host_batch_shard(mesh.devices, batch_size, jax.process_index())
  rows = batch_size // count
  return index * rows, (index + 1) * rows


def restored_params(trainer):
  """The params of the trainer's latest checkpoint, restored onto its mesh, gathered to numpy."""
  manager = checkpoints.training_checkpoint_manager(
      fileio.join(trainer.config.model_dir, 'checkpoints'), enable_async=False)
  try:
    step, state = train.restore_latest_good(
        manager, train.abstract_state(trainer.shapes, trainer.shardings),
        fileio.join(trainer.config.model_dir, 'damaged_checkpoints'))
  finally:
    manager.close()
  return step, partitioning.to_host(state['params'])


def flat(tree, prefix):
  return {prefix + jax.tree_util.keystr(path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


# -----------------------------------------------------------------------------
# The two-process run.
# -----------------------------------------------------------------------------


def _decode(out):
  """Sharded speculative decodes of this process's rows, greedy and t = 1; `out` gets the gathered results."""
  mesh = partitioning.make_mesh(NUM_PARTITIONS)
  predict = sharded_decoding.compile_predict_sharded(speculative_model(), mesh,
                                                     decoder_params=decoder_params())
  params = predict.shard_params(decode_params())
  start, stop = host_rows(mesh, DECODE_BATCH)
  out['decode_rows'] = np.asarray([start, stop])
  local = {k: v[start:stop] for k, v in decode_batch().items()}
  batch = partitioning.global_batch(local, predict.batch_shardings(decode_batch())['encoder_input_tokens'],
                                    DECODE_BATCH)
  out['mesh_processes'] = np.vectorize(lambda d: d.process_index)(mesh.devices)
  for temperature in (0.0, 1.0):
    decodes, aux = predict(params, batch, jax.random.PRNGKey(DECODE_SEED), temperature)
    decodes, aux = partitioning.to_host((decodes, aux))
    out.update(flat({'decodes': decodes, 'aux': aux}, f't{temperature:g}'))


def _train(out, root, batches):
  """Two trainer steps on the fixed batches, the checkpoint both processes wrote, restored."""
  trainer = trainer_on_fixed_batches(os.path.join(root, 'train'), batches, host_rows, NUM_PARTITIONS)
  trainer.run()
  out['train_rows'] = np.asarray(host_rows(trainer.mesh, TRAIN_BATCH))
  out.update(flat(partitioning.to_host(trainer.state['params']), 'trained'))
  step, params = restored_params(trainer)
  out['restored_step'] = np.asarray(step)
  out.update(flat(params, 'restored'))


def main(argv):
  out_dir, inputs = argv
  # Importing JAX starts no backend: initialize_multihost still comes first.
  started = partitioning.initialize_multihost()  # from the JAX_* variables the test sets
  out = {'started': np.asarray(started), 'process_index': np.asarray(jax.process_index()),
         'process_count': np.asarray(jax.process_count()), 'device_count': np.asarray(jax.device_count()),
         'local_device_count': np.asarray(jax.local_device_count())}
  with np.load(inputs) as saved:
    batches = [{k[len(f'{i}/'):]: saved[k] for k in saved.files if k.startswith(f'{i}/')}
               for i in range(TRAIN_STEPS)]
  for name, phase in (('decode', lambda: _decode(out)), ('train', lambda: _train(out, out_dir, batches))):
    start = time.perf_counter()
    phase()
    out[f'{name}_seconds'] = np.asarray(time.perf_counter() - start)
  np.savez(os.path.join(out_dir, f'process_{jax.process_index()}.npz'), **out)
  print(f'process {jax.process_index()} done:',
        {k: round(float(v), 1) for k, v in out.items() if k.endswith('_seconds')}, flush=True)


if __name__ == '__main__':
  main(sys.argv[1:])
