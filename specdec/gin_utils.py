"""T5X-style command-line flags for gin: `--gin_file=PATH` and `--gin.NAME=VALUE`."""

import importlib.util
import os
from typing import List, Sequence, Tuple

import gin

REPO_GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'gin')


def split_gin_args(argv: Sequence[str]) -> Tuple[List[str], List[str], List[str]]:
  """Separates (gin files, gin bindings, other args) from a command line.

  Accepts `--gin_file=PATH` / `--gin_file PATH` (repeatable, also comma
  lists), `--gin.NAME=VALUE` (T5X's form, becomes `NAME = VALUE`) and
  `--gin_bindings=NAME=VALUE`.
  """
  files, bindings, rest = [], [], []
  args = list(argv)
  i = 0
  while i < len(args):
    arg = args[i]
    if arg == '--gin_file' and i + 1 < len(args):
      files.extend(args[i + 1].split(','))
      i += 2
      continue
    if arg.startswith('--gin_file='):
      files.extend(arg.split('=', 1)[1].split(','))
    elif arg.startswith('--gin_bindings='):
      bindings.append(arg.split('=', 1)[1])
    elif arg.startswith('--gin.'):
      name, sep, value = arg[len('--gin.'):].partition('=')
      if not sep:
        raise ValueError(f'Expected --gin.NAME=VALUE, got {arg!r}.')
      bindings.append(f'{name} = {value}')
    else:
      rest.append(arg)
    i += 1
  return files, bindings, rest


def _package_file_exists(config_path: str) -> bool:
  """gin's package-resource existence check, without its failure modes.

  gin reads `a/b/c.gin` as file c.gin of Python package `a.b`. From the repo root `models/` (model
  checkpoints) is importable as a namespace package with no origin, where gin's own check raises TypeError;
  elsewhere it logs a spurious "ERROR: Path not found" for every include it then finds on the search path.
  """
  head, filename = os.path.split(config_path)
  if not head or os.path.isabs(head):
    return False
  try:
    spec = importlib.util.find_spec(head.replace('/', '.'))
  except (ImportError, ValueError):
    return False
  if spec is None or not spec.origin or spec.origin in ('namespace', 'built-in'):
    return False
  return os.path.isfile(os.path.join(os.path.dirname(spec.origin), filename))


def _patch_gin_package_reader() -> None:
  try:
    from gin import resource_reader  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  readers = gin.config._FILE_READERS  # pylint: disable=protected-access
  for i, (reader, check) in enumerate(readers):
    if check is resource_reader.system_path_file_exists:
      readers[i] = (reader, _package_file_exists)


def parse(files: Sequence[str], bindings: Sequence[str]) -> None:
  """Parses gin files (looked up as given, then under the repo's gin/)."""
  _patch_gin_package_reader()
  gin.add_config_file_search_path(REPO_GIN_DIR)
  resolved = []
  for f in files:
    if os.path.exists(f):
      resolved.append(f)
    elif os.path.exists(os.path.join(REPO_GIN_DIR, f)):
      resolved.append(os.path.join(REPO_GIN_DIR, f))
    else:
      raise FileNotFoundError(f'gin file not found: {f} (also looked in {REPO_GIN_DIR}).')
  gin.parse_config_files_and_bindings(resolved, list(bindings))
