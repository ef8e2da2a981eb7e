"""Multi-host JAX for real: two local processes of 4 CPU devices each, one global 2 x 4 ('data', 'model') mesh.

Each pair of processes is started as multi-host JAX is started by hand on several machines:
JAX_COORDINATOR_ADDRESS (process 0's address, a free local port), JAX_NUM_PROCESSES=2 and each one's
JAX_PROCESS_ID, read by `partitioning.initialize_multihost`; gloo carries the collectives between them
(JAX's CPU default). Two pairs run side by side:

- tests/multihost_worker.py: the sharded speculative decode of the tiny T5 pair, each process loading only
  its rows of the batch, greedy and at t = 1 with one key; then two steps of the project's trainer on two
  fixed batches (again each process its rows), its sharded checkpoint written by both processes, restored.
  Compared here with one process (this one, one device) decoding the whole batch and training on the whole
  batches: decodes and statistics identical; params equal to atol 2e-6 (float32 sums are reduced in another
  order across 8 devices, as in train_sharded_test; the restored params are the trained ones exactly);
- `python -m specdec.main --multihost` of a tiny 'infer' run: both processes exit 0, print the same summary,
  and only process 0 writes into the output directory (shared, as a bucket is on a pod slice), as
  tests/testdata/write_audit records from Python's audit events: every file each process opens for
  writing, renames, makes or removes there.

Each process has a time limit; a crash or hang fails the tests with both processes' stderr tails. XLA's
quick-compile flags and the suite's compilation cache (tests/conftest.py) reach the processes through
their environment.
"""

import dataclasses
import fcntl
import itertools
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import multihost_worker as worker
from specdec import checkpoints
from specdec import network
from specdec import tasks
from specdec.training import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A sitecustomize that records what a process writes under a directory.
WRITE_AUDIT_DIR = os.path.join(REPO, 'tests', 'testdata', 'write_audit')
NUM_PROCESSES = 2
DEVICES_PER_PROCESS = 4
DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'
PROCESS_TIMEOUT_S = 300
STDERR_TAIL = 3000
PARAM_ATOL = 2e-6
LOSS_RTOL = 1e-5
# The launcher's run: the fixture's 3 En->De test examples, 2 per batch (one row per data position, then a
# last, short batch), the drafter a copy of the target (every greedy draft accepted).
MAIN_EXAMPLES = 3
MAIN_CONFIG = network.T5Config(vocab_size=8192, emb_dim=16, num_heads=4, head_dim=4, num_encoder_layers=1,
                               num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0, dtype=jnp.float32)


# -----------------------------------------------------------------------------
# Starting a pair of processes.
# -----------------------------------------------------------------------------


@dataclasses.dataclass
class Finished:
  """What one process of a pair did."""
  returncode: int
  stdout: str
  stderr: str


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _process_env(port: int, process_id: int, name: str = 'worker') -> dict:
  """This process's environment, made multi-host: 4 CPU devices, the coordinator, the process id."""
  env = dict(os.environ)
  kept = [f for f in env.get('XLA_FLAGS', '').split() if not f.startswith(DEVICE_COUNT_FLAG)]
  env['XLA_FLAGS'] = ' '.join(kept + [f'{DEVICE_COUNT_FLAG}={DEVICES_PER_PROCESS}'])
  env['JAX_PLATFORMS'] = 'cpu'  # libtpu is installed: without this JAX would look for a TPU
  env['JAX_COORDINATOR_ADDRESS'] = f'127.0.0.1:{port}'
  env['JAX_NUM_PROCESSES'] = str(NUM_PROCESSES)
  env['JAX_PROCESS_ID'] = str(process_id)
  cache_dir = jax.config.jax_compilation_cache_dir  # the suite's (tests/conftest.py), if any
  if cache_dir:
    # A folder of the suite's cache for each process of each pair: these processes compile the same programs as
    # each other, under a distributed runtime, at the same time, and JAX writes an entry in place; kept apart, no
    # process reads an entry another is writing or one made under another runtime. Reused by the next run.
    env['JAX_COMPILATION_CACHE_DIR'] = os.path.join(cache_dir, f'multihost-{name}-{process_id}')
    env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
    env['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'
  env['PYTHONPATH'] = os.pathsep.join([REPO] + [p for p in [env.get('PYTHONPATH')] if p])
  return env


class Pair:
  """Two processes of one multi-host run, started now; `finish()` waits for both within the time limit."""

  def __init__(self, name: str, command, log_dir: str, extra_env=lambda process_id: {}):
    self.name = name
    port = _free_port()
    self.logs = [(os.path.join(log_dir, f'{name}_{i}.out'), os.path.join(log_dir, f'{name}_{i}.err'))
                 for i in range(NUM_PROCESSES)]
    self.processes = []
    for i, (out, err) in enumerate(self.logs):
      with open(out, 'w') as stdout, open(err, 'w') as stderr:
        env = _process_env(port, i, name)
        env.update(extra_env(i))
        self.processes.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=stdout, stderr=stderr))
    self.deadline = time.monotonic() + PROCESS_TIMEOUT_S

  def finish(self):
    """[Finished] of both; a process still running at the deadline, or after its partner failed, is killed."""
    partner_failed_at = None
    while any(p.poll() is None for p in self.processes):
      failed = any(p.poll() not in (None, 0) for p in self.processes)
      if failed and partner_failed_at is None:
        partner_failed_at = time.monotonic()
      # A process whose partner died waits in a collective that never completes.
      if time.monotonic() > self.deadline or (failed and time.monotonic() > partner_failed_at + 10):
        for p in self.processes:
          if p.poll() is None:
            p.kill()
            p.wait()
        break
      time.sleep(0.2)
    finished = []
    for p, (out, err) in zip(self.processes, self.logs):
      with open(out) as f_out, open(err) as f_err:
        finished.append(Finished(p.returncode, f_out.read(), f_err.read()))
    return finished


def _require_success(name, finished):
  """Fails with both processes' exit statuses and stderr tails unless both exited 0."""
  if all(f.returncode == 0 for f in finished):
    return
  report = '\n'.join(
      f'--- {name} process {i}: exit status {f.returncode} '
      f'({"killed: time limit or partner failed" if f.returncode == -9 else "exited"}); stderr tail:\n'
      f'{f.stderr[-STDERR_TAIL:]}' for i, f in enumerate(finished))
  pytest.fail(f'{name}: a process failed or hung (limit {PROCESS_TIMEOUT_S} s)\n{report}', pytrace=False)


# -----------------------------------------------------------------------------
# The runs (module-scoped: each pair runs once), and the one-process references.
# -----------------------------------------------------------------------------


def _train_batches():
  """The two global batches of the fixture corpus both runs train on (numpy)."""
  tasks.register_local_tasks(corpus_dir=worker.FIXTURE_CORPUS)
  return list(itertools.islice(
      train.train_batches(worker.TRAIN_TASK, worker.TRAIN_LENGTHS, worker.TRAIN_BATCH, seed=0),
      worker.TRAIN_STEPS))


def _write_audit_env(root):
  """process id -> the variables with which tests/testdata/write_audit records what it writes under root/infer."""
  def env(process_id):
    paths = [WRITE_AUDIT_DIR] + [p for p in [os.environ.get('PYTHONPATH')] if p]
    return {'PYTHONPATH': os.pathsep.join([REPO] + paths),
            'SPECDEC_TEST_WRITE_AUDIT': os.path.join(root, f'main_{process_id}_writes.json'),
            'SPECDEC_TEST_WRITE_AUDIT_UNDER': os.path.join(root, 'infer')}
  return env


def _main_command(root):
  models = os.path.join(root, 'models')
  params = network.init_params(MAIN_CONFIG, jax.random.PRNGKey(0))
  for name in ('target', 'd1'):
    checkpoints.save_compact(os.path.join(models, name), MAIN_CONFIG, params, storage_dtype=jnp.float32)
  return [sys.executable, '-m', 'specdec.main', '--multihost',
          '--gin_file=experiments/cpu/table2/ende_d1_t0.gin',
          f"--gin.OUTPUT_DIR='{os.path.join(root, 'infer')}'",
          f"--gin.TARGET_CHECKPOINT='{os.path.join(models, 'target')}'",
          f"--gin.DRAFTER_CHECKPOINT='{os.path.join(models, 'd1')}'",
          f"--gin.run_config.DataConfig.corpus_dir='{worker.FIXTURE_CORPUS}'",
          "--gin.run_config.DataConfig.feature_lengths={'inputs': 16, 'targets': 8}",
          f'--gin.run_config.DataConfig.max_examples={MAIN_EXAMPLES}',
          "--gin.run_config.RunConfig.mode='infer'",
          f'--gin.run_config.RunConfig.num_partitions={worker.NUM_PARTITIONS}',
          '--gin.settings.Setting.batch_size=2', '--gin.settings.Setting.length_buckets=False',
          '--gin.GAMMA=2']


def _one_process_decodes():
  """{f't{t}...': array} of this process decoding the whole batch on one device, as the worker flattens."""
  model, params, batch = worker.speculative_model(), worker.decode_params(), worker.decode_batch()
  out = {}
  for temperature in (0.0, 1.0):
    # A sharded batch keeps its shape (no shrinking), so the reference does too: seeded draws depend on it.
    predict = model.compile_predict(dict(worker.decoder_params(), temperature=temperature, shrink_batch=False))
    decodes, aux = jax.device_get(predict(params, batch, jax.random.PRNGKey(worker.DECODE_SEED)))
    out.update(worker.flat({'decodes': decodes, 'aux': aux}, f't{temperature:g}'))
  return out


def _one_process_training(root, batches):
  """The trainer on one device, whole batches: its final params and losses."""
  model_dir = os.path.join(root, 'one_process_train')
  trainer = worker.trainer_on_fixed_batches(model_dir, batches, lambda mesh, rows: (0, rows), 1)
  trainer.run()
  return dict(params=worker.flat(jax.device_get(trainer.state['params']), 'trained'),
              log=_jsonl(os.path.join(model_dir, 'train_log.jsonl')))


def _jsonl(path):
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """`_run_all`, once per test session: pytest-xdist workers share one run (each would otherwise start its own)."""
  if os.environ.get('PYTEST_XDIST_WORKER') is None:
    return _run_all(str(tmp_path_factory.mktemp('multihost')))
  # The folder above a worker's base temp folder belongs to this session and is shared by its workers.
  shared = tmp_path_factory.getbasetemp().parent / 'multihost'
  shared.mkdir(exist_ok=True)
  with open(shared / 'lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker waits here for the first one's run
    saved = shared / 'runs.pickle'
    if not saved.exists():
      # A worker that dies here leaves no runs.pickle: the next one runs it again, in a folder of its own (the
      # dead run's half-written outputs, appended records among them, would otherwise be read as this run's).
      runs = _run_all(tempfile.mkdtemp(prefix='run-', dir=shared))
      partial = shared / 'runs.pickle.partial'
      with open(partial, 'wb') as f:
        pickle.dump(runs, f)
      os.replace(partial, saved)
    with open(saved, 'rb') as f:
      return pickle.load(f)


def _run_all(root):
  """Both pairs run while this process computes the one-process references; what they did and wrote."""
  batches = _train_batches()
  inputs = os.path.join(root, 'train_batches.npz')
  np.savez(inputs, **{f'{i}/{k}': v for i, batch in enumerate(batches) for k, v in batch.items()})
  start = time.perf_counter()
  pairs = {'worker': Pair('worker', [sys.executable, '-m', 'tests.multihost_worker', root, inputs], root),
           'main': Pair('main', _main_command(root), root, _write_audit_env(root))}
  try:
    reference = dict(decodes=_one_process_decodes(), training=_one_process_training(root, batches))
  finally:  # also when the references fail: no process is left running
    finished = {name: pair.finish() for name, pair in pairs.items()}
  seconds = time.perf_counter() - start
  return dict(root=root, finished=finished, reference=reference, seconds=seconds,
              outputs=[dict(np.load(os.path.join(root, f'process_{i}.npz')))
                       if os.path.exists(os.path.join(root, f'process_{i}.npz')) else None
                       for i in range(NUM_PROCESSES)])


@pytest.fixture(scope='module')
def outputs(runs):
  """Each worker process's gathered outputs, once both exited 0."""
  _require_success('tests.multihost_worker', runs['finished']['worker'])
  return runs['outputs']


# -----------------------------------------------------------------------------
# Checks.
# -----------------------------------------------------------------------------


def test_two_processes_one_global_mesh(outputs):
  for i, out in enumerate(outputs):
    assert out['started'] and out['process_index'] == i
    assert (out['process_count'], out['device_count'], out['local_device_count']) == (2, 8, 4)
    # 'data' across the processes, 'model' inside each.
    np.testing.assert_array_equal(out['mesh_processes'], [[0] * 4, [1] * 4])
    # Each process loaded only its data position's rows (host_batch_shard).
    np.testing.assert_array_equal(out['decode_rows'], [4 * i, 4 * i + 4])
    np.testing.assert_array_equal(out['train_rows'], [4 * i, 4 * i + 4])


@pytest.mark.parametrize('temperature', ['0', '1'])
def test_decodes_identical_to_one_process(runs, outputs, temperature):
  reference = {k: v for k, v in runs['reference']['decodes'].items() if k.startswith(f't{temperature}')}
  assert reference
  for i, out in enumerate(outputs):  # to_host gave every process the whole batch
    for key, want in reference.items():
      if np.issubdtype(want.dtype, np.floating):  # scores; sums of min(p, q)
        np.testing.assert_allclose(out[key], want, rtol=1e-5, atol=1e-5, err_msg=f'process {i} {key}')
      else:  # tokens, calls, drafts, acceptances
        np.testing.assert_array_equal(out[key], want, err_msg=f'process {i} {key}')


def test_the_decodes_compare_something(runs):
  """Rows decode tokens, and sampling differs from argmax somewhere: the comparisons above are not vacuous."""
  decodes = runs['reference']['decodes']
  greedy, sampled = decodes["t0['decodes']"], decodes["t1['decodes']"]
  assert np.count_nonzero(greedy) > greedy.shape[0]
  assert np.any(greedy != sampled)


def test_trained_params_equal_one_process(runs, outputs):
  want = runs['reference']['training']['params']
  for i, out in enumerate(outputs):
    assert out['restored_step'] == worker.TRAIN_STEPS
    for key, value in want.items():
      np.testing.assert_allclose(out[key], value, atol=PARAM_ATOL, rtol=0, err_msg=f'process {i} {key}')
      restored = 'restored' + key[len('trained'):]
      np.testing.assert_array_equal(out[restored], out[key], err_msg=f'process {i} {restored}')


def test_training_moved_the_params_further_than_the_tolerance(runs):
  initial = worker.flat(jax.device_get(network.init_params(worker.configs()[2], jax.random.PRNGKey(0))),
                        'trained')
  trained = runs['reference']['training']['params']
  moved = max(float(np.max(np.abs(trained[k] - initial[k]))) for k in trained)
  assert moved > 10 * PARAM_ATOL, moved


def test_losses_and_one_writer_of_the_run_records(runs, outputs):
  model_dir = os.path.join(runs['root'], 'train')
  log = _jsonl(os.path.join(model_dir, 'train_log.jsonl'))
  want = runs['reference']['training']['log']
  # One writer: each step's record once.
  assert [r['step'] for r in log if r['kind'] == 'train'] == [1, 2]
  np.testing.assert_allclose([r['loss'] for r in log if r['kind'] == 'train'],
                             [r['loss'] for r in want if r['kind'] == 'train'], rtol=LOSS_RTOL)
  assert len(_jsonl(os.path.join(model_dir, 'runs.jsonl'))) == 1


def test_checkpoint_written_by_both_processes(runs, outputs):
  item = os.path.join(runs['root'], 'train', 'checkpoints', str(worker.TRAIN_STEPS), 'default')
  for i in range(NUM_PROCESSES):
    written = os.path.join(item, f'ocdbt.process_{i}', 'd')
    assert os.path.isdir(written) and os.listdir(written), f'process {i} wrote no shard into {item}'


class TestLauncher:
  """`python -m specdec.main --multihost` on two processes."""

  @pytest.fixture(scope='class')
  def launched(self, runs):
    finished = runs['finished']['main']
    _require_success('python -m specdec.main --multihost', finished)
    return finished

  def test_both_processes_ran_on_the_global_mesh(self, launched):
    for f in launched:
      assert "mesh {'data': 2, 'model': 4}" in f.stdout, f.stdout[-STDERR_TAIL:]

  def test_only_process_0_wrote_into_the_output_directory(self, runs, launched):
    writes = []
    for i in range(NUM_PROCESSES):
      with open(os.path.join(runs['root'], f'main_{i}_writes.json')) as f:
        writes.append({os.path.basename(path) for _, path in json.load(f)})
    assert {'predictions.jsonl', 'statistics.json', 'fingerprint.json'} <= writes[0]
    assert writes[1] == set()

  def test_the_results(self, runs, launched):
    out = os.path.join(runs['root'], 'infer')
    preds = _jsonl(os.path.join(out, 'predictions.jsonl'))
    assert [p['index'] for p in preds] == list(range(MAIN_EXAMPLES))
    assert all(1 <= p['tokens'] <= 8 and p['accepted'] == p['judged'] for p in preds)
    with open(os.path.join(out, 'statistics.json')) as f:
      written = f.read()
    assert json.loads(written)['statistics']['examples'] == MAIN_EXAMPLES
    assert not os.path.exists(os.path.join(out, 'metrics.json'))
    # Process 1 decoded everything too, into a private copy it discarded: it printed the same summary.
    assert written in launched[1].stdout


def test_timing(runs):
  """Not asserted (timing is for benchmarks): printed for the record."""
  print(f"both pairs and the references: {runs['seconds']:.1f} s")
