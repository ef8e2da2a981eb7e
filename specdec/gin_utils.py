"""T5X-style command-line flags for gin: `--gin_file=PATH` and `--gin.NAME=VALUE`.

A command-line binding that would change nothing is an error, not a silent no-op: a macro no gin file references
(`--gin.GAMA=3` for GAMMA), an unknown configurable or parameter. Each such error, and a macro left unset, is one
line (`GinConfigError`) naming the binding and the closest known name, or, for a renamed parameter, its new name.
A configurable that moved (`MOVED_CONFIGURABLES`), named in a gin file or a binding, is one line naming its new name;
so is a module that moved into a sub-package (`MOVED_MODULES`), imported by a gin file.
`macro_values` reads the macros gin files use, with their values (the launcher's --help).
"""

import difflib
import importlib.util
import inspect
import os
import re
import tokenize
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import gin

REPO_GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'gin')
# Configurables that moved to another module, {former selector: selector now}. gin alone says only that it cannot
# resolve the former name (with a traceback); configs written before the move are told where it went.
MOVED_CONFIGURABLES = {'benchmark.Setting': 'settings.Setting'}
# Modules that moved into a sub-package: a gin file importing the old path is one line naming the new one.
MOVED_MODULES = {f'specdec.{name}': f'specdec.{package}.{name}'
                 for package, names in (('data', ('corpora', 'parallel_sources', 'distill_pool', 'self_training')),
                                        ('training', ('train', 'train_config', 'feature_training', 'distill')),
                                        ('bench', ('benchmark', 'profiling', 'auto_gamma', 'machine_load', 'oracle',
                                                   'ceiling', 'ceiling_report', 'peers', 'peers_report',
                                                   'accelerator', 'accelerator_report', 'reporting', 'tables', 'plots',
                                                   'xxl_plan', 'xxl_memory_plan', 'xxl_training_plan')),
                                        ('cloud_tpu', ('tpu_compile', 'tpu_plan_check', 'tpu_programs', 'tpu_slices',
                                                       'tpu_verify_curve')))
                 for name in names}


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


def configured(fn):
  """The gin-configured version of `fn` (a function or class) when gin knows it, else `fn` itself.

  Gin files register functions and classes dynamically, which binds their configurable versions, not the module
  attributes a caller names.
  """
  try:
    return gin.get_configurable(fn)
  except ValueError:
    return fn


def launch_args(argv: Sequence[str], other_flags: Sequence[str] = ()) -> Tuple[List[str], List[str], bool]:
  """(gin files, gin bindings, --multihost given) of a launcher's command line (`split_gin_args`).

  ValueError (one line, listing what is taken: the gin flags, --multihost and `other_flags`) for anything else.
  """
  files, bindings, rest = split_gin_args(argv)
  multihost = '--multihost' in rest
  rest = [a for a in rest if a != '--multihost']
  if rest:
    taken = ', '.join(['--gin_file=PATH', '--gin.NAME=VALUE', '--multihost', *other_flags])
    raise ValueError(f'unknown arguments {rest} (use {taken}).')
  return files, bindings, multihost


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


class GinConfigError(ValueError):
  """A gin binding or config that cannot take effect (one line, naming it and the closest known name)."""


def _did_you_mean(name: str, known: Iterable[str]) -> str:
  close = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
  return f' (did you mean {close[0]}?)' if close else ''


def _binding_name(binding: str) -> Optional[str]:
  """The bound name of `NAME = value` / `scope/a.b.param = value`; None for other statements (include, import)."""
  head, sep, _ = binding.partition('=')
  name = head.strip()
  return name if sep and re.fullmatch(r'[\w./]+', name) else None


def _is_macro(name: str) -> bool:
  return re.fullmatch(r'[A-Za-z_]\w*', name) is not None


# gin keeps the parsed bindings in gin.config._CONFIG: {(scope, selector): {parameter: value}}; a macro NAME is
# bound as (NAME, 'gin.macro') and referenced as `%NAME`, a reference to scope NAME of gin.macro.
def _referenced_macros() -> Set[str]:
  """The macros the parsed config refers to (`%NAME` anywhere in a binding's value)."""
  config = gin.config._CONFIG  # pylint: disable=protected-access
  macro_refs = gin.config.iterate_references(config, to=gin.get_configurable(gin.config.macro))
  return {ref.scoped_selector.rsplit('/', 1)[0] for ref in macro_refs}


def _bound_macros() -> Set[str]:
  config = gin.config._CONFIG  # pylint: disable=protected-access
  return {scope for scope, selector in config if selector == 'gin.macro'}


def _known_configurables() -> Set[str]:
  """Every registered configurable's selector and its dotted suffixes ('specdec.main.run', 'main.run', 'run')."""
  names = set()
  for selector, _ in gin.config._REGISTRY.items():  # pylint: disable=protected-access
    parts = selector.split('.')
    names.update('.'.join(parts[i:]) for i in range(len(parts)))
  return names


def _known_parameters(selector: str) -> List[str]:
  try:
    configurable = gin.config._REGISTRY.get_match(selector)  # pylint: disable=protected-access
    return list(inspect.signature(configurable.wrapped).parameters) if configurable else []
  except (TypeError, ValueError):
    return []


def _moved(selector: str) -> Optional[Tuple[str, str]]:
  """(former, now) when `selector` (optionally scoped, optionally with a parameter) names a moved configurable."""
  selector = selector.rsplit('/', 1)[-1]
  for former, now in MOVED_CONFIGURABLES.items():
    if re.search(rf'(^|\.){re.escape(former)}($|\.)', selector):
      return former, now
  return None


def _where(error_text: str) -> str:
  """'FILE, line N: ' from gin's error text, or '' when it names no place."""
  where = re.search(r'In file "([^"]+)", line (\d+)', error_text)
  return f'{where.group(1)}, line {where.group(2)}: ' if where else ''


def _moved_message(error_text: str) -> Optional[str]:
  """gin's error about an unresolvable selector, as one line naming the new name, if the selector moved."""
  unresolved = re.search(r"Couldn't resolve selector ([\w./]+)|No configurable matching (?:reference )?'@?([\w./]+)",
                         error_text)
  moved = unresolved and _moved(unresolved.group(1) or unresolved.group(2))
  if not moved:
    return None
  where = _where(error_text)
  former, now = moved
  module = now.rsplit('.', 1)[0]
  return f'{where}{former} is now {now} (from specdec import {module}; then {now}.NAME = VALUE, @{now}()).'


def _moved_module_message(error_text: str) -> Optional[str]:
  """gin's error about a module it could not import, as one line naming the new path, if the module moved."""
  missing = re.search(r"No module named '([\w.]+)'", error_text)
  now = missing and MOVED_MODULES.get(missing.group(1))
  if not now:
    return None
  where = _where(error_text)
  package, name = now.rsplit('.', 1)
  return f'{where}{missing.group(1)} is now {now} (from {package} import {name}).'


def _explain_binding_error(binding: str, error: Exception) -> str:
  """gin's error for one command-line binding, as one line with the closest known name."""
  text = error.args[0] if isinstance(error, tokenize.TokenError) and error.args else str(error)
  moved = _moved_message(text)
  if moved:
    return f"binding '{binding}': {moved}"
  first = text.splitlines()[0] if text else type(error).__name__
  unknown = re.match(r"No configurable matching '([^']+)'", first)
  if unknown:
    return (f"binding '{binding}': no configurable {unknown.group(1)} in these gin files"
            f'{_did_you_mean(unknown.group(1), _known_configurables())}.')
  no_param = re.match(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'", first)
  if no_param:
    selector, param = no_param.groups()
    return (f"binding '{binding}': {selector} has no parameter {param}"
            f'{_did_you_mean(param, _known_parameters(selector))}.')
  if isinstance(error, (SyntaxError, tokenize.TokenError)):
    return f"binding '{binding}': its value is not a gin value ({first})."
  return f"binding '{binding}': {first}"


def _check_macros_used(bindings: Sequence[str]) -> None:
  """Refuses a macro binding no parsed gin file references: it would change nothing (typically a typo)."""
  referenced = _referenced_macros()
  for binding in bindings:
    name = _binding_name(binding)
    if name and _is_macro(name) and name not in referenced:
      raise GinConfigError(f"binding '{binding}': no gin file uses macro {name}, so it would change nothing"
                           f'{_did_you_mean(name, referenced)}.')


def _finalize() -> None:
  """gin.finalize, with an unset macro said in one line (gin appends the whole config)."""
  try:
    gin.finalize()
  except ValueError as e:
    unset = re.match(r"No bindings specified for '([^']+)/gin\.macro'", str(e))
    if not unset:
      raise
    name = unset.group(1)
    raise GinConfigError(f'macro {name} is used but never set: bind it, e.g. --gin.{name}=VALUE'
                         f'{_did_you_mean(name, _bound_macros())}.') from None


def _parse_files(files: Sequence[str]) -> None:
  """Parses gin files (looked up as given, then under the repo's gin/); FileNotFoundError names a missing one."""
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
  try:
    gin.parse_config_files_and_bindings(resolved, [], finalize_config=False)
  except ModuleNotFoundError as e:
    moved = _moved_module_message(str(e))
    if not moved:
      raise
    raise GinConfigError(moved) from None
  except (AttributeError, ValueError) as e:
    moved = _moved_message(str(e))
    if not moved:
      raise
    raise GinConfigError(moved) from None


def parse(files: Sequence[str], bindings: Sequence[str], renamed: Optional[Mapping[str, str]] = None) -> None:
  """Parses gin files (looked up as given, then under the repo's gin/), then the command line's bindings.

  Raises GinConfigError for a binding that cannot take effect or a macro left unset (see the module docstring),
  for a binding of a name in `renamed` ({former name: its name now}), naming the new one, and for a gin file or
  binding naming a configurable in `MOVED_CONFIGURABLES`, naming where it went.
  """
  _parse_files(files)
  for binding in bindings:  # one at a time, so an error names its binding
    name = _binding_name(binding)
    moved = _moved(name) if name else None
    now = (renamed or {}).get(name) or (moved and name.replace(moved[0], moved[1], 1))
    if now:
      raise GinConfigError(f"binding '{binding}': {name} is now {now} "
                           f'(--gin.{now}={binding.partition("=")[2].strip()}).')
    try:
      gin.parse_config(binding)
    except (ValueError, SyntaxError, tokenize.TokenError) as e:
      raise GinConfigError(_explain_binding_error(binding, e)) from None
  _check_macros_used(bindings)
  _finalize()


def macro_values(files: Sequence[str]) -> Dict[str, Any]:
  """{macro: value} for the macros `files` use (what a command line may rebind); gin's config is cleared.

  A macro the files use but leave unset (OUTPUT_DIR of most experiment files) has the value gin.REQUIRED.
  """
  gin.clear_config()
  try:
    _parse_files(files)
    bound = _bound_macros()
    return {name: (gin.query_parameter(f'%{name}') if name in bound else gin.REQUIRED)
            for name in _referenced_macros()}
  finally:
    gin.clear_config()
