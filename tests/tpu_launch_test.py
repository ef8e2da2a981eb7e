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
        '--gin=decoding.speculative_sample.gamma=7',
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
         '--gin.decoding.speculative_sample.gamma=7',
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
