"""Tests for scripts/tpu/launch.py and scripts/tpu/reproduce_table2_tpu.sh.

No TPU or Cloud project is reachable from the test machine, so:
* the dry run's printed commands are parsed back with shlex and checked word
  for word;
* the real execution path runs against a fake `gcloud` (a script on PATH)
  that logs its argv, runs `ssh --command` lines with bash in a fake worker
  home directory and copies `scp` sources there, with fake `python` / `pip`
  in the worker's virtualenv that record what they were called with.
"""

import importlib.util
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, 'scripts', 'tpu', 'launch.py')
REPRODUCE = os.path.join(REPO, 'scripts', 'tpu', 'reproduce_table2_tpu.sh')
EXPERIMENT = 'experiments/table2/xxl_ende_small_t0.gin'
BASE_FLAGS = ['--tpu_name=specdec-v4', '--zone=us-central2-b',
              f'--gin_file={EXPERIMENT}',
              '--output_dir=gs://bucket/table2/xxl_ende_small_t0']


def _load_launch():
  spec = importlib.util.spec_from_file_location('tpu_launch', LAUNCH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


launch = _load_launch()


def _executable(path, text):
  with open(path, 'w') as f:
    f.write(text)
  os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def _run(args, path_dirs=(), env=None, script=LAUNCH):
  """Runs the launcher with PATH limited to `path_dirs` (plus bash's dir)."""
  full_env = {'PATH': os.pathsep.join(path_dirs), 'HOME': os.environ.get('HOME', '/')}
  full_env.update(env or {})
  cmd = ([sys.executable, script] if script.endswith('.py')
         else [shutil.which('bash'), script])
  return subprocess.run(cmd + list(args), capture_output=True, text=True,
                        env=full_env, timeout=60, check=False)


def _dry_run(args, **kw):
  result = _run(['--dry_run', *args], **kw)
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines()]


def _flag(argv, name):
  """The value of `--name=VALUE` in argv (exactly one occurrence)."""
  values = [a.split('=', 1)[1] for a in argv if a.startswith(f'--{name}=')]
  assert len(values) == 1, (name, argv)
  return values[0]


def _kind(argv):
  """Which stage a printed command belongs to."""
  if argv[0] == 'tar':
    return 'tar'
  assert argv[:4] == ['gcloud', 'compute', 'tpus', 'tpu-vm'], argv
  return argv[4]


def _remote(argv):
  """The remote command of an ssh line, split into its `&&` commands."""
  words = shlex.split(_flag(argv, 'command'))
  commands, current = [], []
  for word in words:
    if word == '&&':
      commands.append(current)
      current = []
    else:
      current.append(word)
  return commands + [current]


@pytest.fixture
def gin_dir(tmp_path):
  """A gin directory holding the experiment file the flags name."""
  root = tmp_path / 'gin'
  (root / 'experiments' / 'table2').mkdir(parents=True)
  (root / EXPERIMENT).write_text("include 'models/speculative.gin'\n")
  (root / 'models').mkdir()
  (root / 'models' / 'speculative.gin').write_text('VOCAB_SIZE = 32128\n')
  return str(root)


class TestDryRun:

  def test_commands_in_order_with_worker_flags(self, gin_dir):
    lines = _dry_run(BASE_FLAGS + [f'--gin_dir={gin_dir}', '--delete_after',
                                   '--project=my-proj'])
    assert [_kind(a) for a in lines] == [
        'create', 'tar', 'scp', 'ssh', 'ssh', 'scp', 'ssh', 'delete']
    create = lines[0]
    assert create[5] == 'specdec-v4'
    assert _flag(create, 'accelerator-type') == 'v4-32'
    assert _flag(create, 'version') == 'tpu-ubuntu2204-base'
    for argv in lines:
      if argv[0] == 'gcloud':
        assert _flag(argv, 'zone') == 'us-central2-b'
        assert _flag(argv, 'project') == 'my-proj'
      if _kind(argv) in ('ssh', 'scp'):
        assert _flag(argv, 'worker') == 'all'
    assert lines[-1][5] == 'specdec-v4' and '--quiet' in lines[-1]

  def test_install_copies_tarball_and_pip_installs_it(self, gin_dir):
    lines = _dry_run(BASE_FLAGS + [f'--gin_dir={gin_dir}'])
    tar, scp, ssh = lines[1:4]
    tarball = tar[tar.index('-czf') + 1]
    assert tar[tar.index('-C') + 1] == REPO
    assert tar[-3:] == ['setup.py', 'README.md', 'specdec']
    assert scp[5:7] == [tarball, 'specdec-v4:specdec_src.tar.gz']
    remote = _remote(ssh)
    assert ['python3.11', '-m', 'venv', 'specdec_venv'] in remote
    assert remote[-1] == ['specdec_venv/bin/pip', 'install', '-U', 'jax[tpu]',
                          './specdec_src']
    assert any(c[-2:] == ['install', '-y'] or 'python3.11-venv' in c
               for c in remote)

  def test_git_url_installs_from_git_without_tarball(self, gin_dir):
    lines = _dry_run(BASE_FLAGS + [f'--gin_dir={gin_dir}', '--skip_create',
                                   '--apt_packages=',
                                   '--git_url=https://example.org/specdec@v1'])
    assert [_kind(a) for a in lines] == ['ssh', 'ssh', 'scp', 'ssh']
    remote = _remote(lines[0])
    assert remote[0] == ['python3.11', '-m', 'venv', 'specdec_venv']
    assert remote[-1][-1] == 'git+https://example.org/specdec@v1'

  def test_copy_replaces_gin_dir_on_workers(self, gin_dir):
    lines = _dry_run(BASE_FLAGS + [f'--gin_dir={gin_dir}', '--skip_create',
                                   '--skip_install'])
    prepare, scp = lines[0], lines[1]
    assert _remote(prepare) == [['rm', '-rf', 'specdec_run/gin'],
                                ['mkdir', '-p', 'specdec_run']]
    assert scp[5:8] == ['--recurse', gin_dir, 'specdec-v4:specdec_run/']

  def test_run_command_argv_with_quoted_gin_values(self, gin_dir):
    lines = _dry_run(BASE_FLAGS + [
        f'--gin_dir={gin_dir}', '--skip_create', '--skip_install',
        f'--gin_file={gin_dir}/models/speculative.gin',
        '--gin=settings.Setting.gamma=7',
        "--gin=TASK='specdec_wmt_ende'",
        '--gin=NOTE="it\'s $HOME `x` \\ done"',
        '--env=TFDS_DATA_DIR=gs://bucket/tfds data'])
    run = lines[-1]
    assert _kind(run) == 'ssh' and run[5] == 'specdec-v4'
    assert _remote(run) == [
        ['.', 'specdec_venv/bin/activate'],
        ['cd', 'specdec_run/gin'],
        ['env', 'TFDS_DATA_DIR=gs://bucket/tfds data',
         'python', '-m', 'specdec.main', '--multihost',
         f'--gin_file={EXPERIMENT}',
         '--gin_file=models/speculative.gin',
         "--gin.OUTPUT_DIR='gs://bucket/table2/xxl_ende_small_t0'",
         '--gin.settings.Setting.gamma=7',
         "--gin.TASK='specdec_wmt_ende'",
         '--gin.NOTE="it\'s $HOME `x` \\ done"']]

  def test_printed_lines_mean_the_same_to_bash(self, gin_dir, tmp_path):
    # shlex and bash must agree on the quoting: replay each printed line in
    # bash with a `gcloud` function that prints its arguments.
    lines = _run(['--dry_run', *BASE_FLAGS, f'--gin_dir={gin_dir}',
                  "--gin=TASK='x y'", '--gin=S="a\\"b"']).stdout.splitlines()
    for line in lines:
      script = ('gcloud() { printf "%s\\0" "$@"; }; '
                'tar() { printf "%s\\0" tar "$@"; }; ' + line)
      out = subprocess.run(['bash', '-c', script], capture_output=True,
                           text=True, check=True).stdout
      words = out.split('\0')[:-1]
      if words[0] != 'tar':
        words = ['gcloud'] + words
      assert words == shlex.split(line)

  def test_skip_create_and_skip_install(self, gin_dir):
    lines = _dry_run(BASE_FLAGS + [f'--gin_dir={gin_dir}', '--skip_create'])
    assert [_kind(a) for a in lines] == ['tar', 'scp', 'ssh', 'ssh', 'scp', 'ssh']
    lines = _dry_run(BASE_FLAGS + [f'--gin_dir={gin_dir}', '--skip_install'])
    assert [_kind(a) for a in lines] == ['create', 'ssh', 'scp', 'ssh']

  def test_flags_reach_create(self, gin_dir):
    lines = _dry_run(BASE_FLAGS + [f'--gin_dir={gin_dir}', '--spot',
                                   '--accelerator_type=v4-8',
                                   '--version=tpu-vm-v4-base'])
    assert _flag(lines[0], 'accelerator-type') == 'v4-8'
    assert _flag(lines[0], 'version') == 'tpu-vm-v4-base'
    assert '--spot' in lines[0]

  def test_gin_file_forms(self, gin_dir):
    assert launch.gin_file_on_worker(EXPERIMENT, gin_dir) == EXPERIMENT
    assert launch.gin_file_on_worker(
        os.path.join(gin_dir, EXPERIMENT), gin_dir) == EXPERIMENT
    with pytest.raises(launch.LaunchError, match='outside'):
      launch.gin_file_on_worker('/etc/x.gin', gin_dir)
    with pytest.raises(launch.LaunchError, match='leaves'):
      launch.gin_file_on_worker('../x.gin', gin_dir)

  def test_missing_gin_file_only_warns(self, gin_dir):
    result = _run(['--dry_run', *BASE_FLAGS, f'--gin_dir={gin_dir}',
                   '--gin_file=experiments/nope.gin'])
    assert result.returncode == 0
    assert 'experiments/nope.gin' in result.stderr


class TestErrors:

  @pytest.mark.parametrize('drop', ['--tpu_name', '--zone', '--gin_file',
                                    '--output_dir'])
  def test_missing_required_flag_is_named(self, drop):
    args = [a for a in BASE_FLAGS if not a.startswith(drop + '=')]
    result = _run(['--dry_run', *args])
    assert result.returncode == 2
    assert 'required' in result.stderr and drop in result.stderr
    assert result.stdout == ''

  @pytest.mark.parametrize('flag, message', [
      ('--output_dir=/local/out', 'gs://'),
      ('--tpu_name=Bad_Name', 'lowercase'),
      ('--gin=no_equals_sign', 'NAME=VALUE'),
      ("--gin=OUTPUT_DIR='gs://x'", '--output_dir'),
      ('--env=1BAD=x', 'NAME=VALUE'),
      ('--gin_dir=/nonexistent/gin', 'not a directory'),
  ])
  def test_bad_values(self, flag, message):
    result = _run(['--dry_run', *BASE_FLAGS, flag])
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ''

  def test_no_abbreviated_flags(self, gin_dir):
    # With `--gin` next to `--gin_file`/`--gin_dir`, prefixes must not match.
    result = _run(['--dry_run', *BASE_FLAGS, f'--gin_dir={gin_dir}',
                   '--gin_fil=x.gin'])
    assert result.returncode == 2 and 'unrecognized' in result.stderr

  def test_missing_gcloud_is_reported_before_anything_runs(self, gin_dir,
                                                           tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    marker = tmp_path / 'tar_ran'
    _executable(str(bin_dir / 'tar'), f'#!/bin/sh\ntouch {marker}\n')
    result = _run([*BASE_FLAGS, f'--gin_dir={gin_dir}'], path_dirs=[str(bin_dir)])
    assert result.returncode == 2
    assert 'gcloud not found' in result.stderr
    assert not marker.exists()

  def test_missing_gin_file_is_an_error_for_real(self, gin_dir, tmp_path):
    result = _run([*BASE_FLAGS, f'--gin_dir={gin_dir}',
                   '--gin_file=experiments/nope.gin'])
    assert result.returncode == 2 and 'experiments/nope.gin' in result.stderr


# A fake gcloud: logs its argv; `ssh --command=X` runs X with bash in the fake
# worker home; `scp` copies like scp (a directory goes *into* an existing
# destination directory); `describe` succeeds iff FAKE_TPU_EXISTS=1; a verb
# listed in FAKE_FAIL (or an ssh whose command contains FAKE_FAIL_SSH) fails.
FAKE_GCLOUD = '''#!{python}
import json, os, shutil, subprocess, sys
argv = sys.argv[1:]
with open(os.environ['FAKE_LOG'], 'a') as f:
  f.write(json.dumps(['gcloud'] + argv) + '\\n')
verb = argv[3]
home = os.environ['FAKE_HOME']
if verb in os.environ.get('FAKE_FAIL', '').split(','):
  sys.exit(5)
if verb == 'describe':
  sys.exit(0 if os.environ.get('FAKE_TPU_EXISTS') == '1' else 1)
if verb == 'ssh':
  command = [a for a in argv if a.startswith('--command=')][0][10:]
  if os.environ.get('FAKE_FAIL_SSH') and os.environ['FAKE_FAIL_SSH'] in command:
    sys.exit(7)
  sys.exit(subprocess.run(['bash', '-c', command], cwd=home).returncode)
if verb == 'scp':
  src, dest = [a for a in argv[4:] if not a.startswith('--')]
  dest = os.path.join(home, dest.split(':', 1)[1])
  if os.path.isdir(src):
    assert os.path.isdir(dest), dest
    shutil.copytree(src, os.path.join(dest, os.path.basename(src)))
  else:
    shutil.copy(src, dest)
'''

# `python3.11 -m venv DIR` on the fake worker: a virtualenv whose activate
# puts fake `python` and `pip` first on PATH; both record their calls.
FAKE_WORKER_PYTHON = '''#!{python}
import os, sys, textwrap
assert sys.argv[1:3] == ['-m', 'venv'], sys.argv
bin_dir = os.path.abspath(os.path.join(sys.argv[3], 'bin'))
os.makedirs(bin_dir, exist_ok=True)
recorder = textwrap.dedent(\'\'\'\\
    #!{python}
    import json, os, sys
    with open(os.environ['FAKE_CALLS'], 'a') as f:
      f.write(json.dumps({{'prog': os.path.basename(sys.argv[0]),
                          'argv': sys.argv[1:], 'cwd': os.getcwd(),
                          'tfds': os.environ.get('TFDS_DATA_DIR')}}) + '\\\\n')
    \'\'\')
for name in ('python', 'pip'):
  with open(os.path.join(bin_dir, name), 'w') as f:
    f.write(recorder)
  os.chmod(os.path.join(bin_dir, name), 0o755)
with open(os.path.join(bin_dir, 'activate'), 'w') as f:
  f.write('export PATH=%s:$PATH\\n' % bin_dir)
'''


class FakeCloud:
  """Paths and readers for one fake-gcloud session."""

  def __init__(self, tmp_path):
    self.tmp = tmp_path
    self.bin = tmp_path / 'bin'
    self.home = tmp_path / 'worker_home'
    self.log = tmp_path / 'gcloud.jsonl'
    self.calls = tmp_path / 'worker_calls.jsonl'
    self.bin.mkdir()
    self.home.mkdir()
    _executable(str(self.bin / 'gcloud'),
                FAKE_GCLOUD.format(python=sys.executable))
    _executable(str(self.bin / 'fake-python3.11'),
                FAKE_WORKER_PYTHON.format(python=sys.executable))

  def run(self, args, **env):
    path = [str(self.bin), os.path.dirname(shutil.which('bash')),
            os.path.dirname(shutil.which('tar'))]
    # TMPDIR: the launcher's local tarball goes under the test's directory.
    base = {'FAKE_LOG': str(self.log), 'FAKE_HOME': str(self.home),
            'FAKE_CALLS': str(self.calls), 'TMPDIR': str(self.tmp)}
    return _run(args, path_dirs=path, env={**base, **env})

  def gcloud_calls(self):
    if not self.log.exists():
      return []
    return [json.loads(l) for l in self.log.read_text().splitlines()]

  def worker_calls(self):
    return [json.loads(l) for l in self.calls.read_text().splitlines()]


class TestExecution:

  def test_dry_run_never_spawns_gcloud(self, gin_dir, tmp_path):
    cloud = FakeCloud(tmp_path)
    result = cloud.run(['--dry_run', *BASE_FLAGS, f'--gin_dir={gin_dir}',
                        '--delete_after'])
    assert result.returncode == 0 and 'tpu-vm create' in result.stdout
    assert cloud.gcloud_calls() == []
    assert not any(cloud.home.iterdir())

  def test_full_launch_on_a_fake_worker(self, gin_dir, tmp_path):
    cloud = FakeCloud(tmp_path)
    args = [*BASE_FLAGS, f'--gin_dir={gin_dir}', '--delete_after',
            '--apt_packages=', f'--worker_python={cloud.bin}/fake-python3.11',
            "--gin=TASK='specdec_wmt_ende'",
            '--env=TFDS_DATA_DIR=gs://bucket/tfds']
    planned = [shlex.split(l) for l in
               cloud.run(['--dry_run', *args]).stdout.splitlines()]
    result = cloud.run(args)
    assert result.returncode == 0, result.stderr
    calls = cloud.gcloud_calls()
    # Exactly the dry run's commands ran (tar ran locally), plus the describe
    # that checks for an existing TPU before creating one.
    assert calls[0][4] == 'describe'
    assert calls[1:] == [a for a in planned if a[0] == 'gcloud']
    # The tarball unpacked on the worker is an installable package.
    src = cloud.home / 'specdec_src'
    assert (src / 'setup.py').is_file() and (src / 'specdec' / '__init__.py').is_file()
    assert not list(src.rglob('__pycache__'))
    pip, python = cloud.worker_calls()[-2:]
    assert pip['prog'] == 'pip' and pip['argv'][-2:] == ['jax[tpu]', './specdec_src']
    # The run started in the copied gin directory, where the gin files (and
    # what they include) resolve.
    assert python['prog'] == 'python'
    assert python['cwd'] == str(cloud.home / 'specdec_run' / 'gin')
    assert python['tfds'] == 'gs://bucket/tfds'
    assert python['argv'] == [
        '-m', 'specdec.main', '--multihost', f'--gin_file={EXPERIMENT}',
        "--gin.OUTPUT_DIR='gs://bucket/table2/xxl_ende_small_t0'",
        "--gin.TASK='specdec_wmt_ende'"]
    assert os.path.isfile(os.path.join(python['cwd'], EXPERIMENT))
    assert os.path.isfile(os.path.join(python['cwd'], 'models/speculative.gin'))

  def test_existing_tpu_is_reused(self, gin_dir, tmp_path):
    cloud = FakeCloud(tmp_path)
    result = cloud.run([*BASE_FLAGS, f'--gin_dir={gin_dir}', '--skip_install'],
                       FAKE_TPU_EXISTS='1', FAKE_FAIL_SSH='specdec.main')
    assert result.returncode == 7
    verbs = [c[4] for c in cloud.gcloud_calls()]
    assert verbs == ['describe', 'ssh', 'scp', 'ssh']
    assert 'reusing' in result.stderr

  def test_failed_run_stops_and_still_deletes(self, gin_dir, tmp_path):
    cloud = FakeCloud(tmp_path)
    result = cloud.run([*BASE_FLAGS, f'--gin_dir={gin_dir}', '--skip_create',
                        '--skip_install', '--delete_after'],
                       FAKE_FAIL_SSH='rm -rf')
    assert result.returncode == 7
    assert [c[4] for c in cloud.gcloud_calls()] == ['ssh', 'delete']

  def test_failed_create_deletes_nothing(self, gin_dir, tmp_path):
    cloud = FakeCloud(tmp_path)
    result = cloud.run([*BASE_FLAGS, f'--gin_dir={gin_dir}', '--delete_after'],
                       FAKE_FAIL='create')
    assert result.returncode == 5
    assert [c[4] for c in cloud.gcloud_calls()] == ['describe', 'create']


def _script_path():
  # The script needs bash and coreutils, and no gcloud in its dry run.
  return [os.path.dirname(shutil.which('bash')),
          os.path.dirname(shutil.which('dirname'))]


class TestReproduceTable2:

  def test_dry_run_covers_the_twelve_experiments(self, tmp_path):
    result = _run(['gs://bucket/table2', '--tpu_name=specdec-v4',
                   '--zone=us-central2-b', '--dry_run', '--delete_after'],
                  path_dirs=_script_path(), script=REPRODUCE,
                  env={'PYTHON': sys.executable})
    assert result.returncode == 0, result.stderr
    lines = [shlex.split(l) for l in result.stdout.splitlines()]
    runs = [_remote(a)[-1] for a in lines
            if _kind(a) == 'ssh' and 'specdec.main' in _flag(a, 'command')]
    names = [f'xxl_{task}_{size}_t{t}' for task in ('ende', 'cnndm')
             for size in ('small', 'base', 'large') for t in (0, 1)]
    assert len(runs) == 12
    assert {r[4] for r in runs} == {
        f'--gin_file=experiments/table2/{n}.gin' for n in names}
    for run in runs:
      name = run[4][len('--gin_file=experiments/table2/'):-len('.gin')]
      assert run[5] == f"--gin.OUTPUT_DIR='gs://bucket/table2/{name}'"
    # One TPU for all twelve: created and installed once, deleted at the end.
    kinds = [_kind(a) for a in lines]
    assert kinds.count('create') == 1 and kinds[0] == 'create'
    assert kinds.count('tar') == 1
    assert kinds.count('delete') == 1 and kinds[-1] == 'delete'

  def test_needs_output_root(self):
    result = _run(['--dry_run'], path_dirs=_script_path(), script=REPRODUCE)
    assert result.returncode != 0 and 'gs://' in result.stderr


# -----------------------------------------------------------------------------
# --entry=train: the trainer instead of specdec.main
# -----------------------------------------------------------------------------

TRAIN_FLAGS = ['--tpu_name=specdec-v4', '--zone=us-central2-b', '--entry=train',
               '--gin_file=train/table2/xxl_ende.gin',
               '--output_dir=gs://bucket/finetune/xxl_ende']


class TestTrainEntry:

  def test_runs_the_trainer_with_model_dir(self, gin_dir):
    lines = _dry_run(TRAIN_FLAGS + [f'--gin_dir={gin_dir}', '--skip_create', '--skip_install',
                                    '--env=TFDS_DATA_DIR=gs://bucket/tfds'])
    assert _remote(lines[-1])[-1] == [
        'env', 'TFDS_DATA_DIR=gs://bucket/tfds', 'python', '-m', 'specdec.training.train', '--multihost',
        '--gin_file=train/table2/xxl_ende.gin', "--gin.MODEL_DIR='gs://bucket/finetune/xxl_ende'"]

  def test_main_stays_the_default(self, gin_dir):
    lines = _dry_run(BASE_FLAGS + [f'--gin_dir={gin_dir}', '--skip_create', '--skip_install'])
    assert _remote(lines[-1])[-1][:4] == ['python', '-m', 'specdec.main', '--multihost']

  def test_model_dir_comes_from_output_dir(self):
    result = _run(['--dry_run', *TRAIN_FLAGS, "--gin=MODEL_DIR='gs://x'"])
    assert result.returncode == 2 and 'Set MODEL_DIR with --output_dir' in result.stderr

  def test_unknown_entry(self):
    result = _run(['--dry_run', *BASE_FLAGS, '--entry=serve'])
    assert result.returncode == 2 and 'invalid choice' in result.stderr

  def test_training_launch_on_a_fake_worker(self, gin_dir, tmp_path):
    train_gin = os.path.join(gin_dir, 'train', 'table2', 'xxl_ende.gin')
    os.makedirs(os.path.dirname(train_gin))
    with open(train_gin, 'w') as f:
      f.write("include 'models/speculative.gin'\n")
    cloud = FakeCloud(tmp_path)
    result = cloud.run([*TRAIN_FLAGS, f'--gin_dir={gin_dir}', '--apt_packages=',
                        f'--worker_python={cloud.bin}/fake-python3.11'])
    assert result.returncode == 0, result.stderr
    python = cloud.worker_calls()[-1]
    assert python['prog'] == 'python'
    assert python['argv'] == ['-m', 'specdec.training.train', '--multihost',
                              '--gin_file=train/table2/xxl_ende.gin',
                              "--gin.MODEL_DIR='gs://bucket/finetune/xxl_ende'"]


# -----------------------------------------------------------------------------
# scripts/tpu/finetune_table2.sh
# -----------------------------------------------------------------------------

FINETUNE = os.path.join(REPO, 'scripts', 'tpu', 'finetune_table2.sh')
FINETUNE_RUNS = [f'{size}_{task}' for size in ('small', 'base', 'large', 'xxl')
                 for task in ('ende', 'cnndm')]


def _script_dry_run(script, args):
  """(exit code, parsed stdout lines, stderr) of a script's dry run, without gcloud on PATH."""
  result = _run([*args, '--dry_run'], path_dirs=_script_path(), script=script,
                env={'PYTHON': sys.executable})
  return result.returncode, [shlex.split(l) for l in result.stdout.splitlines()], result.stderr


def _trainer_runs(lines):
  return [_remote(a)[-1] for a in lines
          if _kind(a) == 'ssh' and 'specdec.training.train' in _flag(a, 'command')]


class TestFinetuneTable2:

  def test_dry_run_covers_the_eight_runs_smallest_first(self):
    code, lines, stderr = _script_dry_run(FINETUNE, [
        'gs://bucket/finetune/', '--tpu_name=specdec-ft', '--zone=us-central2-b', '--delete_after',
        '--env=TFDS_DATA_DIR=gs://bucket/tfds'])
    assert code == 0, stderr
    runs = _trainer_runs(lines)
    assert [r[6] for r in runs] == [f'--gin_file=train/table2/{n}.gin' for n in FINETUNE_RUNS]
    for run, name in zip(runs, FINETUNE_RUNS):
      assert run[:5] == ['env', 'TFDS_DATA_DIR=gs://bucket/tfds', 'python', '-m', 'specdec.training.train']
      assert run[7] == f"--gin.MODEL_DIR='gs://bucket/finetune/{name}'"
    # One slice for all eight, a v4-128 by default: created and installed once, deleted at the end.
    kinds = [_kind(a) for a in lines]
    assert kinds[0] == 'create' and kinds.count('create') == 1
    assert _flag(lines[0], 'accelerator-type') == 'v4-128'
    assert kinds.count('tar') == 1
    assert kinds[-1] == 'delete' and kinds.count('delete') == 1

  def test_accelerator_type_can_be_changed(self):
    code, lines, _ = _script_dry_run(FINETUNE, [
        'gs://bucket/finetune', '--tpu_name=specdec-ft', '--zone=us-central2-b',
        '--accelerator_type=v4-256'])
    assert code == 0 and _flag(lines[0], 'accelerator-type') == 'v4-256'

  def test_only_runs_a_subset(self):
    code, lines, _ = _script_dry_run(FINETUNE, [
        'gs://bucket/finetune', '--tpu_name=specdec-ft', '--zone=us-central2-b',
        '--only=xxl_cnndm,small_ende', '--skip_create'])
    assert code == 0
    assert [r[4] for r in _trainer_runs(lines)] == ['--gin_file=train/table2/xxl_cnndm.gin',
                                                    '--gin_file=train/table2/small_ende.gin']
    assert 'create' not in [_kind(a) for a in lines]

  def test_unknown_run_is_named(self):
    code, lines, stderr = _script_dry_run(FINETUNE, [
        'gs://bucket/finetune', '--tpu_name=specdec-ft', '--zone=us-central2-b', '--only=xxl_xsum'])
    assert code == 2 and lines == [] and "unknown run 'xxl_xsum'" in stderr

  def test_needs_output_root(self):
    result = _run(['--dry_run'], path_dirs=_script_path(), script=FINETUNE)
    assert result.returncode != 0 and 'gs://' in result.stderr

  def test_every_run_has_its_gin_file(self):
    for name in FINETUNE_RUNS:
      assert os.path.isfile(os.path.join(REPO, 'gin', 'train', 'table2', f'{name}.gin')), name


# -----------------------------------------------------------------------------
# reproduce_table2_tpu.sh --checkpoints (the fine-tunes) and --table (the table)
# -----------------------------------------------------------------------------

REPRODUCE_FLAGS = ['gs://bucket/table2', '--tpu_name=specdec-v4', '--zone=us-central2-b']


class TestReproduceWithFinetunes:

  def test_checkpoints_bind_both_macros_per_row(self):
    code, lines, stderr = _script_dry_run(REPRODUCE, REPRODUCE_FLAGS + [
        '--checkpoints=gs://bucket/finetune/'])
    assert code == 0, stderr
    runs = [_remote(a)[-1] for a in lines
            if _kind(a) == 'ssh' and 'specdec.main' in _flag(a, 'command')]
    assert len(runs) == 12
    for run in runs:
      name = run[4][len('--gin_file=experiments/table2/'):-len('.gin')]
      _, task, size, _ = name.split('_')
      assert run[6:] == [f"--gin.TARGET_CHECKPOINT='gs://bucket/finetune/xxl_{task}/checkpoints'",
                         f"--gin.DRAFTER_CHECKPOINT='gs://bucket/finetune/{size}_{task}/checkpoints'"]

  def test_without_checkpoints_the_gin_files_decide(self):
    _, lines, _ = _script_dry_run(REPRODUCE, REPRODUCE_FLAGS)
    assert not any('CHECKPOINT' in _flag(a, 'command') for a in lines if _kind(a) == 'ssh')

  def test_checkpoints_must_be_on_gcs(self):
    code, lines, stderr = _script_dry_run(REPRODUCE, REPRODUCE_FLAGS + ['--checkpoints=/local/ft'])
    assert code == 2 and lines == [] and 'gs://' in stderr

  def test_table_copies_the_rows_down_and_makes_the_table(self):
    code, lines, stderr = _script_dry_run(REPRODUCE, REPRODUCE_FLAGS + [
        '--table=results/table2_tpu', '--delete_after'])
    assert code == 0, stderr
    mkdir, copy, make = lines[-3:]
    assert _kind(lines[-4]) == 'delete'  # the slice goes first: copying needs none
    assert mkdir == ['mkdir', '-p', 'results/table2_tpu/rows']
    assert copy == ['gcloud', 'storage', 'cp', '-r', 'gs://bucket/table2/*', 'results/table2_tpu/rows/']
    assert make[:6] == [sys.executable, 'scripts/make_table2.py', '--rows', 'results/table2_tpu/rows',
                        '--out', 'results/table2_tpu']
    recorded = _flag(make, 'command')
    assert recorded.startswith('bash scripts/tpu/reproduce_table2_tpu.sh gs://bucket/table2 ')
    assert '--dry_run' not in recorded and '--delete_after' in recorded


# -----------------------------------------------------------------------------
# scripts/tpu/setup_cloud.sh
# -----------------------------------------------------------------------------

SETUP = os.path.join(REPO, 'scripts', 'tpu', 'setup_cloud.sh')


class TestSetupCloud:

  def test_dry_run_commands_in_order(self):
    code, lines, stderr = _script_dry_run(SETUP, ['--project=my-proj', '--bucket=gs://my-bucket/'])
    assert code == 0, stderr
    assert [a[:4] for a in lines] == [
        ['gcloud', 'config', 'set', 'project'],
        ['gcloud', 'services', 'enable', 'tpu.googleapis.com'],
        ['gcloud', 'beta', 'services', 'identity'],
        ['gcloud', 'storage', 'buckets', 'create'],
        ['gcloud', 'storage', 'buckets', 'add-iam-policy-binding'],
        ['tfds', 'build', 'wmt_t2t_translate/de-en', '--data_dir=gs://my-bucket/tfds'],
        ['tfds', 'build', 'cnn_dailymail', '--data_dir=gs://my-bucket/tfds'],
        ['gcloud', 'storage', 'ls', 'gs://my-bucket/tfds/wmt_t2t_translate/de-en/1.0.0/']]
    # The versions specdec/tasks.py pins are the ones checked.
    from specdec import tasks  # pylint: disable=g-import-not-at-top
    for name in (tasks.WMT_ENDE_TFDS_NAME, tasks.CNN_DAILYMAIL_TFDS_NAME):
      dataset, version = name.split(':')
      assert f'gs://my-bucket/tfds/{dataset}/{version}/' in lines[-1]
    assert _flag(lines[3], 'location') == 'us-central2'
    assert _flag(lines[4], 'member') == (
        'serviceAccount:PROJECT_NUMBER-compute@developer.gserviceaccount.com')

  def test_create_project_needs_billing_and_links_it(self):
    code, _, stderr = _script_dry_run(SETUP, ['--project=p', '--bucket=gs://b', '--create_project'])
    assert code == 2 and '--billing_account' in stderr
    code, lines, _ = _script_dry_run(SETUP, ['--project=p', '--bucket=gs://b', '--create_project',
                                             '--billing_account=0A-1B', '--skip_data'])
    assert code == 0
    assert lines[:2] == [['gcloud', 'projects', 'create', 'p'],
                         ['gcloud', 'billing', 'projects', 'link', 'p', '--billing-account=0A-1B']]
    assert not any(a[0] == 'tfds' for a in lines)

  @pytest.mark.parametrize('args, message', [
      (['--bucket=gs://b'], '--project is required'),
      (['--project=p', '--bucket=b'], '--bucket must be gs://'),
      (['--project=p', '--bucket=gs://b', '--zone=x'], 'unknown flag'),
  ])
  def test_bad_flags(self, args, message):
    code, lines, stderr = _script_dry_run(SETUP, args)
    assert code == 2 and lines == [] and message in stderr

  def test_missing_gcloud_is_reported_before_anything_runs(self, tmp_path):
    # A PATH with bash and dirname only (the machine's own bin directory may hold a real gcloud).
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    for tool in ('bash', 'dirname'):
      os.symlink(shutil.which(tool), bin_dir / tool)
    result = _run(['--project=p', '--bucket=gs://b'], path_dirs=[str(bin_dir)], script=SETUP)
    assert result.returncode == 2 and 'gcloud not found' in result.stderr and result.stdout == ''


# -----------------------------------------------------------------------------
# docs/cloud_tpu.md: every command shown is one the dry runs execute
# -----------------------------------------------------------------------------

DOC = os.path.join(REPO, 'docs', 'cloud_tpu.md')


def _doc_commands():
  """The commands in the doc's fenced code blocks, continuation lines joined."""
  commands, in_block, current = [], False, ''
  with open(DOC, encoding='utf-8') as f:
    for line in f:
      if line.startswith('```'):
        in_block = not in_block
        continue
      if not in_block or not line.strip():
        continue
      current += line.strip()
      if current.endswith('\\'):
        current = current[:-1] + ' '
        continue
      commands.append(current)
      current = ''
  return commands


def _is_script(words):
  return ((words[0] == 'bash' and words[1].startswith('scripts/tpu/'))
          or words[:2] == ['python', 'scripts/tpu/launch.py'])


def _executed(line):
  """The commands a printed line runs: itself, and for an ssh line each remote command (with and without env)."""
  words = shlex.split(line)
  words = ['python' if w == sys.executable else w for w in words]
  out = [words]
  if words[:5] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh']:
    for remote in _remote(words):
      out.append(remote)
      if remote[0] == 'env':
        out.append(remote[next(i for i, w in enumerate(remote[1:], 1) if '=' not in w):])
  return out


class TestDocs:

  def test_every_command_shown_is_run_by_a_dry_run(self):
    commands = [shlex.split(c) for c in _doc_commands()]
    scripts = [c for c in commands if _is_script(c)]
    assert len(scripts) >= 7  # setup, fine-tune (+ a relaunch), reproduce: each as a dry run and for real
    executed = []
    for words in scripts:
      path = os.path.join(REPO, words[1])
      args = words[2:] + ([] if '--dry_run' in words else ['--dry_run'])
      result = subprocess.run(
          ([sys.executable] if path.endswith('.py') else [shutil.which('bash')]) + [path, *args],
          capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
          env={'PATH': os.pathsep.join(_script_path()), 'HOME': os.environ.get('HOME', '/'),
               'PYTHON': sys.executable})
      assert result.returncode == 0, (words, result.stderr)
      for line in result.stdout.splitlines():
        executed += _executed(line)
    shown = [c for c in commands if not _is_script(c)]
    assert shown  # the doc shows what the scripts run, not only how to call them
    for words in shown:
      assert words in executed, f'docs/cloud_tpu.md shows a command no dry run executes: {shlex.join(words)}'

  def test_the_doc_names_the_gin_files_and_results_that_exist(self):
    with open(DOC, encoding='utf-8') as f:
      text = f.read()
    named = re.findall(r'`((?:gin|scripts|results|docs|tests|specdec)/[\w./{},-]+)`', text)
    assert len(named) > 10
    for path in named:
      if '{' in path or path.startswith('results/table2_tpu'):  # patterns; what the path makes
        continue
      assert os.path.exists(os.path.join(REPO, path)), path
