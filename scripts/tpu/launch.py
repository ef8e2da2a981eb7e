"""Runs one gin experiment of specdec on a Cloud TPU VM slice, on all workers.

  python scripts/tpu/launch.py --dry_run \
    --tpu_name=specdec-v4 --zone=us-central2-b --accelerator_type=v4-32 \
    --gin_file=experiments/table2/xxl_ende_small_t0.gin \
    --output_dir=gs://my-bucket/table2/xxl_ende_small_t0 \
    --env=TFDS_DATA_DIR=gs://my-bucket/tfds

  python scripts/tpu/launch.py --dry_run --entry=train \
    --tpu_name=specdec-v4 --zone=us-central2-b --accelerator_type=v4-128 \
    --gin_file=train/table2/xxl_ende.gin \
    --output_dir=gs://my-bucket/finetune/xxl_ende \
    --env=TFDS_DATA_DIR=gs://my-bucket/tfds

Steps, in order (each one a command; `--dry_run` prints them, one per line,
and runs nothing):

  1. create the TPU VM (`gcloud compute tpus tpu-vm create`); at run time an
     existing TPU of that name is reused instead. `--skip_create` drops it.
  2. install on every worker: pack this checkout's package into a tarball
     (`tar`), copy it to the workers (`tpu-vm scp --worker=all`), then make a
     virtualenv there and `pip install 'jax[tpu]'` and the package. With
     `--git_url` the package comes from git instead of the tarball.
     `--skip_install` drops the whole step.
  3. copy the gin configs (`--gin_dir`, default this checkout's gin/) to
     ~/specdec_run/ on every worker, replacing the previous copy.
  4. run `python -m specdec.main --multihost ...` on all workers at once
     (a multi-host slice runs one JAX process per worker; `--multihost` makes
     specdec.main call `jax.distributed.initialize()`), with `--output_dir`
     bound to the gin macro OUTPUT_DIR. `--entry=train` runs the trainer
     instead, `python -m specdec.training.train --multihost ...`, with `--output_dir`
     bound to MODEL_DIR (its checkpoints, logs and evaluations).
  5. with `--delete_after`: delete the TPU VM, also when an earlier step failed
     (an idle slice still costs money).

Gin files are named relative to the gin directory, as everywhere in specdec
(`--gin_file=experiments/table2/...`); a path under the local gin directory
(`gin/experiments/...`) is accepted too. Gin values are passed through
verbatim, so string values keep their inner quotes: `--gin "TASK='x'"`.

Runtime versions (`--version`): `tpu-ubuntu2204-base` is the JAX/PyTorch
software version for TPU v4 and older; v5e uses `v2-alpha-tpuv5-lite`, v5p
`v2-alpha-tpuv5`, v6e `v2-alpha-tpuv6e`. Ubuntu 22.04 ships Python 3.10 and
specdec needs >= 3.11, hence the apt step (`--apt_packages`, `--worker_python`).

Only the Python standard library is used, so the launcher runs anywhere the
Google Cloud CLI (`gcloud`) does.
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import List, NamedTuple, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# What pip needs to build the package (setup.py reads README.md).
PACKAGE_FILES = ('setup.py', 'README.md', 'specdec')
# Paths on the workers, relative to the login user's home: relative paths need
# no `~`, which quoting would stop the remote shell from expanding.
REMOTE_DIR = 'specdec_run'
REMOTE_VENV = 'specdec_venv'
REMOTE_TARBALL = 'specdec_src.tar.gz'
REMOTE_SRC = 'specdec_src'
# Freshly booted VMs often run unattended upgrades: wait for the dpkg lock
# instead of failing on it.
APT_GET = ['sudo', 'apt-get', '-o', 'DPkg::Lock::Timeout=600', '-q']
# Cloud TPU names: lowercase letter first, then lowercase letters, digits, '-'.
TPU_NAME_RE = re.compile(r'^[a-z]([-a-z0-9]*[a-z0-9])?$')
GIN_NAME_RE = re.compile(r'^[A-Za-z_][\w./]*$')
# --entry: the module every worker runs, and the gin macro --output_dir binds.
ENTRIES = {'main': ('specdec.main', 'OUTPUT_DIR'),
           'train': ('specdec.training.train', 'MODEL_DIR')}
ENV_NAME_RE = re.compile(r'^[A-Za-z_]\w*$')


class Step(NamedTuple):
  """One command of the plan; `kind` names the stage it belongs to."""
  kind: str  # create | install | copy | run | delete
  argv: List[str]


class LaunchError(Exception):
  """A problem with the flags or the environment, reported without a trace."""


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog='See docs/cloud_tpu.md for the path from a fresh Cloud project.',
      # `--gin` must never be read as an abbreviation of `--gin_file`/`--gin_dir`.
      allow_abbrev=False)
  where = parser.add_argument_group('where')
  where.add_argument('--tpu_name', required=True,
                     help='TPU VM name (created, or reused if it exists).')
  where.add_argument('--zone', required=True,
                     help='e.g. us-central2-b, where v4 slices are offered.')
  where.add_argument('--project', help='Cloud project (default: gcloud config).')
  where.add_argument('--accelerator_type', default='v4-32',
                     help='Slice type; v4-N has N/2 chips, N/8 workers.')
  where.add_argument('--version', default='tpu-ubuntu2204-base',
                     help='TPU software (runtime) version; see the docstring.')
  where.add_argument('--spot', action='store_true',
                     help='Create a Spot TPU (cheaper, can be preempted).')

  what = parser.add_argument_group('what')
  what.add_argument('--entry', choices=sorted(ENTRIES), default='main',
                    help='main: python -m specdec.main (decoding, benchmarks); '
                         'train: python -m specdec.training.train (fine-tuning).')
  what.add_argument('--gin_file', action='append', required=True,
                    help='Gin file relative to --gin_dir (repeatable).')
  what.add_argument('--gin', action='append', default=[], metavar='NAME=VALUE',
                    help='Gin binding, passed as --gin.NAME=VALUE (repeatable).')
  what.add_argument('--output_dir', required=True,
                    help='gs:// path, bound to OUTPUT_DIR (--entry=train: '
                         'MODEL_DIR); shared by workers.')
  what.add_argument('--env', action='append', default=[], metavar='NAME=VALUE',
                    help='Environment variable for the run (repeatable), '
                         'e.g. TFDS_DATA_DIR=gs://bucket/tfds.')
  what.add_argument('--gin_dir', default=os.path.join(REPO_ROOT, 'gin'),
                    help='Local gin directory copied to the workers.')

  how = parser.add_argument_group('how')
  how.add_argument('--git_url',
                   help='Install the package with pip from this git URL '
                        '(e.g. https://github.com/you/specdec@main) instead of '
                        'a tarball of this checkout.')
  how.add_argument('--jax_spec', default='jax[tpu]',
                   help='pip requirement for JAX on the workers.')
  how.add_argument('--worker_python', default='python3.11',
                   help='Interpreter that makes the virtualenv on the workers.')
  how.add_argument('--apt_packages', default='python3.11 python3.11-venv',
                   help="apt packages installed first ('' for none).")
  how.add_argument('--skip_create', action='store_true',
                   help='Do not create the TPU VM (it exists).')
  how.add_argument('--skip_install', action='store_true',
                   help='Do not install (an earlier launch did).')
  how.add_argument('--delete_after', action='store_true',
                   help='Delete the TPU VM at the end, even after a failure.')
  how.add_argument('--dry_run', action='store_true',
                   help='Print every command, one per line; run nothing.')
  return parser.parse_args(argv)


def validate(args: argparse.Namespace) -> None:
  """Rejects flag values that would only fail later, on a billed TPU."""
  if not TPU_NAME_RE.match(args.tpu_name):
    raise LaunchError(f'--tpu_name={args.tpu_name!r}: use lowercase letters, '
                      'digits and hyphens, starting with a letter.')
  if not args.output_dir.startswith('gs://'):
    raise LaunchError(f'--output_dir={args.output_dir!r}: must be a gs:// path '
                      '(every worker writes there; local disks are per worker).')
  for binding in args.gin:
    name, sep, _ = binding.partition('=')
    if not sep or not GIN_NAME_RE.match(name):
      raise LaunchError(f'--gin {binding!r}: expected NAME=VALUE.')
    macro = output_macro(args)
    if name == macro:
      raise LaunchError(f'Set {macro} with --output_dir, not --gin.')
  for assignment in args.env:
    name, sep, _ = assignment.partition('=')
    if not sep or not ENV_NAME_RE.match(name):
      raise LaunchError(f'--env {assignment!r}: expected NAME=VALUE.')
  if not os.path.isdir(args.gin_dir):
    raise LaunchError(f'--gin_dir={args.gin_dir!r} is not a directory.')


def output_macro(args: argparse.Namespace) -> str:
  """The gin macro that --output_dir binds: OUTPUT_DIR, or MODEL_DIR for training."""
  return ENTRIES[args.entry][1]


def gin_file_on_worker(path: str, gin_dir: str) -> str:
  """The gin file's path relative to the gin directory (the run's cwd).

  `gin/experiments/x.gin` (a path under the local gin directory) and
  `experiments/x.gin` (relative to it) both give `experiments/x.gin`.
  """
  gin_dir = os.path.abspath(gin_dir)
  as_given = os.path.abspath(path)
  if os.path.commonpath([as_given, gin_dir]) == gin_dir:
    return os.path.relpath(as_given, gin_dir)
  if os.path.isabs(path):
    raise LaunchError(f'--gin_file={path!r} is outside --gin_dir={gin_dir!r}, '
                      'which is all that is copied to the workers.')
  relative = os.path.normpath(path)
  if relative.startswith('..'):
    raise LaunchError(f'--gin_file={path!r} leaves --gin_dir={gin_dir!r}.')
  return relative


def missing_gin_files(gin_files: Sequence[str], gin_dir: str) -> List[str]:
  return [f for f in gin_files if not os.path.isfile(os.path.join(gin_dir, f))]


def gcloud_tpu(verb: str, args: argparse.Namespace, *rest: str) -> List[str]:
  """`gcloud compute tpus tpu-vm VERB ...` with the zone and project flags."""
  argv = ['gcloud', 'compute', 'tpus', 'tpu-vm', verb, *rest,
          f'--zone={args.zone}']
  if args.project:
    argv.append(f'--project={args.project}')
  return argv


def on_all_workers(args: argparse.Namespace, remote_command: str) -> List[str]:
  return gcloud_tpu('ssh', args, args.tpu_name, '--worker=all',
                    f'--command={remote_command}')


def copy_to_all_workers(args: argparse.Namespace, local: str, remote: str,
                        recurse: bool = False) -> List[str]:
  flags = ['--recurse'] if recurse else []
  return gcloud_tpu('scp', args, *flags, local, f'{args.tpu_name}:{remote}',
                    '--worker=all')


def quote(word: str) -> str:
  """shlex.quote, but double quotes for words holding single quotes.

  Gin string values carry single quotes; `"--gin.X='v'"` reads far better
  than shlex's `'--gin.X='"'"'v'"'"''`. Inside double quotes only `"` and
  `\\` are escaped; words with `$`, backquote or `!` (which would expand
  there) keep shlex's form.
  """
  if "'" not in word or re.search(r'[$`!]', word):
    return shlex.quote(word)
  return '"' + re.sub(r'(["\\])', r'\\\1', word) + '"'


def join(argv: Sequence[str]) -> str:
  return ' '.join(quote(word) for word in argv)


def shell(*commands: Sequence[str]) -> str:
  """Joins argv lists into one remote shell line, each word quoted."""
  return ' && '.join(join(c) for c in commands)


def local_tarball(tpu_name: str) -> str:
  # Named after the TPU so that launches to different TPUs do not collide.
  return os.path.join(tempfile.gettempdir(), f'specdec_src_{tpu_name}.tar.gz')


def create_steps(args: argparse.Namespace) -> List[Step]:
  argv = gcloud_tpu('create', args, args.tpu_name,
                    f'--accelerator-type={args.accelerator_type}',
                    f'--version={args.version}')
  if args.spot:
    argv.append('--spot')
  return [Step('create', argv)]


def install_steps(args: argparse.Namespace) -> List[Step]:
  steps = []
  if args.git_url:
    url = args.git_url
    package = url if url.startswith('git+') else f'git+{url}'
    unpack = []
  else:
    tarball = local_tarball(args.tpu_name)
    steps.append(Step('install', [
        'tar', '--exclude=__pycache__', '--exclude=*.pyc', '-czf', tarball,
        '-C', REPO_ROOT, *PACKAGE_FILES]))
    steps.append(Step('install', copy_to_all_workers(args, tarball,
                                                     REMOTE_TARBALL)))
    package = f'./{REMOTE_SRC}'
    unpack = [['rm', '-rf', REMOTE_SRC], ['mkdir', REMOTE_SRC],
              ['tar', '-xzf', REMOTE_TARBALL, '-C', REMOTE_SRC]]
  apt_packages = args.apt_packages.split()
  apt = ([[*APT_GET, 'update'], [*APT_GET, 'install', '-y', *apt_packages]]
         if apt_packages else [])
  pip = f'{REMOTE_VENV}/bin/pip'
  remote = shell(*apt, *unpack,
                 [args.worker_python, '-m', 'venv', REMOTE_VENV],
                 [pip, 'install', '-U', 'pip'],
                 [pip, 'install', '-U', args.jax_spec, package])
  steps.append(Step('install', on_all_workers(args, remote)))
  return steps


def copy_steps(args: argparse.Namespace) -> List[Step]:
  gin_dir = os.path.abspath(args.gin_dir)
  remote_gin = f'{REMOTE_DIR}/{os.path.basename(gin_dir)}'
  # scp puts the directory *into* an existing REMOTE_DIR, so make sure it
  # exists and holds no stale copy (a renamed gin file must not linger).
  prepare = shell(['rm', '-rf', remote_gin], ['mkdir', '-p', REMOTE_DIR])
  return [Step('copy', on_all_workers(args, prepare)),
          Step('copy', copy_to_all_workers(args, gin_dir, f'{REMOTE_DIR}/',
                                           recurse=True))]


def run_command(args: argparse.Namespace, gin_files: Sequence[str]) -> List[str]:
  """The argv every worker runs (inside the gin directory)."""
  argv = ['python', '-m', ENTRIES[args.entry][0], '--multihost']
  argv += [f'--gin_file={f}' for f in gin_files]
  argv.append(f"--gin.{output_macro(args)}='{args.output_dir}'")
  argv += [f'--gin.{binding}' for binding in args.gin]
  if args.env:
    argv = ['env', *args.env, *argv]
  return argv


def run_steps(args: argparse.Namespace, gin_files: Sequence[str]) -> List[Step]:
  remote_gin = f'{REMOTE_DIR}/{os.path.basename(os.path.abspath(args.gin_dir))}'
  remote = shell(['.', f'{REMOTE_VENV}/bin/activate'], ['cd', remote_gin],
                 run_command(args, gin_files))
  return [Step('run', on_all_workers(args, remote))]


def delete_steps(args: argparse.Namespace) -> List[Step]:
  # --quiet: no confirmation prompt, so an unattended launch really deletes.
  return [Step('delete', gcloud_tpu('delete', args, args.tpu_name, '--quiet'))]


def plan(args: argparse.Namespace, gin_files: Sequence[str]) -> List[Step]:
  steps = []
  if not args.skip_create:
    steps += create_steps(args)
  if not args.skip_install:
    steps += install_steps(args)
  steps += copy_steps(args)
  steps += run_steps(args, gin_files)
  if args.delete_after:
    steps += delete_steps(args)
  return steps


def tpu_exists(args: argparse.Namespace) -> bool:
  result = subprocess.run(gcloud_tpu('describe', args, args.tpu_name),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          check=False)
  return result.returncode == 0


def execute(steps: Sequence[Step], args: argparse.Namespace) -> None:
  """Runs the steps in order, streaming their output; stops at a failure.

  The delete step (if any) runs even when an earlier step failed, as long as
  the create step did not: a slice that was never made needs no deleting.
  """
  body = [s for s in steps if s.kind != 'delete']
  cleanup = [s for s in steps if s.kind == 'delete']
  created = False
  try:
    for step in body:
      if step.kind == 'create' and tpu_exists(args):
        print(f'# TPU {args.tpu_name} exists in {args.zone}: reusing it.',
              file=sys.stderr, flush=True)
        created = True
        continue
      print('+ ' + join(step.argv), file=sys.stderr, flush=True)
      try:
        subprocess.run(step.argv, check=True)
      except subprocess.CalledProcessError:
        print(f'# {step.kind} step failed.', file=sys.stderr, flush=True)
        raise
      if step.kind == 'create':
        created = True
  finally:
    if cleanup and (created or not any(s.kind == 'create' for s in body)):
      for step in cleanup:
        print('+ ' + join(step.argv), file=sys.stderr, flush=True)
        subprocess.run(step.argv, check=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  try:
    validate(args)
    gin_files = [gin_file_on_worker(f, args.gin_dir) for f in args.gin_file]
    missing = missing_gin_files(gin_files, args.gin_dir)
    if missing and not args.dry_run:
      raise LaunchError(f'gin files not found under {args.gin_dir}: {missing}')
    if not args.dry_run and shutil.which('gcloud') is None:
      raise LaunchError('gcloud not found on PATH: install the Google Cloud '
                        'CLI and run `gcloud auth login` (or use --dry_run).')
  except LaunchError as e:
    print(f'launch.py: error: {e}', file=sys.stderr)
    return 2
  steps = plan(args, gin_files)
  if args.dry_run:
    if missing:
      print(f'# warning: gin files not found under {args.gin_dir}: {missing}',
            file=sys.stderr)
    for step in steps:
      print(join(step.argv))
    return 0
  try:
    execute(steps, args)
  except subprocess.CalledProcessError as e:
    return e.returncode or 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
