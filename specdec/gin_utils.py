"""T5X-style command-line flags for gin: `--gin_file=PATH` and `--gin.NAME=VALUE`."""

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


def parse(files: Sequence[str], bindings: Sequence[str]) -> None:
  """Parses gin files (looked up as given, then under the repo's gin/)."""
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
