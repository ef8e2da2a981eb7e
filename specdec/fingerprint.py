"""Fingerprints of resumable outputs: what determines their content, recorded beside them, checked on resume.

A resumable output (main's predictions.jsonl, a benchmark's examples.jsonl, a table's rows, an ablation's runs)
is extended by a rerun into the same directory. That is only right when the rerun would write the same records:
same task split, checkpoints (paths and the contents of their files), decoding settings, lengths, seed, batch
size, kind of output and record format. Each such directory holds `fingerprint.json`, written before the first
record; `prepare` compares it with the rerun's and refuses a mismatch with one line naming the differing fields
(old -> new), or with `overwrite` discards the old outputs and starts afresh.

`max_examples` may grow (a run extended from 16 to 32 examples decodes its first 16 exactly as before: examples
are taken in file order and each batch's RNG key depends only on its position), never shrink (the directory holds
more examples than asked for, and its summary would mix them in). Outputs written before fingerprints existed
are refused too: nothing says what made them.
"""

import json
import os
import re
import shutil
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from specdec import fileio

FILE_NAME = 'fingerprint.json'
# The files that hold a checkpoint's content in the project's compact format and the n-gram drafters.
CHECKPOINT_FILES = ('params.msgpack', 'counts.npz', 'config.json')
# The one field that may differ on resume, upwards only (None: the whole split).
GROWABLE = 'max_examples'
MAIN_REMEDY = "use a new OUTPUT_DIR, or --gin.run_config.RunConfig.overwrite=True to discard them and start afresh"


class ResumeRefused(ValueError):
  """An output directory holds outputs another configuration made (or made before fingerprints existed)."""


# sha256 by (real path, mtime, size): a table's rows and a sweep's runs hash each checkpoint once per process.
_SHA256_CACHE: Dict[Tuple[str, int, int], str] = {}


def file_sha256(path: str) -> str:
  """Hex sha256 of a file's bytes, cached per (real path, mtime, size)."""
  stat = os.stat(path)
  key = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
  if key not in _SHA256_CACHE:
    _SHA256_CACHE[key] = fileio.file_sha256(path)
  return _SHA256_CACHE[key]


def checkpoint_digest(path: str) -> Optional[str]:
  """A digest of a checkpoint's content.

  Compact and n-gram checkpoints: sha256 over their model files (`CHECKPOINT_FILES`). Other local formats (T5X,
  Hugging Face, Orbax; far larger): over the names and sizes of their files, which any re-export changes. None
  for a remote or missing path (its path alone identifies it).
  """
  if '://' in path or not os.path.exists(path):
    return None
  if os.path.isfile(path):
    return 'files:' + _text_sha256(f'{os.path.basename(path)} {os.path.getsize(path)}')
  present = [name for name in CHECKPOINT_FILES if os.path.isfile(os.path.join(path, name))]
  if present:
    return 'sha256:' + _text_sha256('\n'.join(f'{name} {file_sha256(os.path.join(path, name))}'
                                              for name in present))
  listing = sorted(f'{os.path.relpath(os.path.join(root, name), path)} {os.path.getsize(os.path.join(root, name))}'
                   for root, _, names in os.walk(path) for name in names)
  return 'files:' + _text_sha256('\n'.join(listing))


def checkpoint_fields(role: str, path: Optional[str]) -> Dict[str, Optional[str]]:
  """`{role}_checkpoint` (the path, normalised) and `{role}_content` (`checkpoint_digest`); None without one."""
  if not path:
    return {f'{role}_checkpoint': None, f'{role}_content': None}
  return {f'{role}_checkpoint': path if '://' in path else os.path.normpath(path),
          f'{role}_content': checkpoint_digest(path)}


def models_fields(target_checkpoint: str, drafter_checkpoint: Optional[str], target_config=None,
                  drafter_config=None, dtype: Optional[str] = None) -> Dict[str, Any]:
  """The fingerprint fields that identify the models: checkpoint paths and contents, gin-given configs, dtype."""
  return {**checkpoint_fields('target', target_checkpoint),
          **checkpoint_fields('drafter', drafter_checkpoint),
          'target_config': short_digest(target_config),
          'drafter_config': short_digest(drafter_config), 'dtype': dtype}


def short_digest(value: Any) -> Optional[str]:
  """A short digest of a value's repr (e.g. a network config given in gin); None for None."""
  return None if value is None else _text_sha256(repr(value))[:16]


def _text_sha256(text: str) -> str:
  return fileio.sha256_hex(text.encode())


def normalised(fields: Mapping[str, Any]) -> Dict[str, Any]:
  """`fields` as read back from JSON (tuples become lists, keys strings), so they compare with a recorded one."""
  return json.loads(json.dumps(dict(fields)))


def read(output_dir: str) -> Optional[Dict[str, Any]]:
  """The fingerprint recorded in `output_dir`, or None."""
  path = os.path.join(output_dir, FILE_NAME)
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def _grows(old: Any, new: Any) -> bool:
  """max_examples old -> new takes at least the examples `old` took (None: all of them)."""
  if new is None:
    return True
  return old is not None and isinstance(old, int) and isinstance(new, int) and new >= old


def differences(recorded: Mapping[str, Any], expected: Mapping[str, Any]) -> List[Tuple[str, Any, Any]]:
  """(field, recorded value, expected value) for every field that forbids resuming, in `expected`'s order; a
  growing max_examples is allowed. A field missing on one side reads as None. Outputs of another kind (another
  mode) differ in that alone: their other fields are not comparable."""
  if recorded.get('outputs') != expected.get('outputs'):
    return [('outputs', recorded.get('outputs'), expected.get('outputs'))]
  diffs = []
  for field in list(expected) + [f for f in recorded if f not in expected]:
    old, new = recorded.get(field), expected.get(field)
    if old == new or (field == GROWABLE and _grows(old, new)):
      continue
    diffs.append((field, old, new))
  return diffs


def _describe(field: str, old: Any, new: Any) -> str:
  text = f'{field} {_short(old)} -> {_short(new)}'
  if field == GROWABLE:
    text += f' (it holds up to {old} examples: max_examples may grow, not shrink)'
  return text


def _short(value: Any, limit: int = 60) -> str:
  """repr(value), content digests cut to 12 hex digits and anything else to `limit` characters."""
  if isinstance(value, str) and re.fullmatch(r'(sha256|files):[0-9a-f]{13,}', value):
    value = value[:value.index(':') + 13] + '...'
  text = repr(value)
  return text if len(text) <= limit else text[:limit - 3] + '...'


def problem(output_dir: str, expected: Mapping[str, Any], owned: Sequence[str],
            remedy: str = MAIN_REMEDY) -> Optional[str]:
  """Why `output_dir` cannot be resumed with fingerprint `expected` (one line), or None if it can.

  `owned`: the names of the outputs a run writes there (files or directories).
  """
  recorded = read(output_dir)
  if recorded is None:
    found = [name for name in owned if os.path.exists(os.path.join(output_dir, name))]
    if not found:
      return None  # a fresh directory
    return (f'{output_dir} holds {", ".join(found)} written without a {FILE_NAME} (before fingerprints were '
            f'recorded), so nothing says which settings made them; {remedy}.')
  diffs = differences(recorded, normalised(expected))
  if not diffs:
    return None
  return f'{output_dir} holds outputs of another configuration: {", ".join(_describe(*d) for d in diffs)}; {remedy}.'


def discard(output_dir: str, owned: Sequence[str]) -> None:
  """Removes the outputs named in `owned` and the fingerprint from `output_dir` (nothing else in it)."""
  for name in list(owned) + [FILE_NAME]:
    path = os.path.join(output_dir, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)


def prepare(output_dir: str, expected: Mapping[str, Any], owned: Sequence[str], overwrite: bool = False,
            remedy: str = MAIN_REMEDY) -> Dict[str, Any]:
  """Readies `output_dir` for outputs fingerprinted `expected`; returns the fingerprint now recorded there.

  Raises ResumeRefused (one line) when it holds outputs of another configuration, unless `overwrite`, which
  discards them first. The fingerprint is written before any output, so an interrupted run resumes checked.
  """
  if overwrite:
    discard(output_dir, owned)
  reason = problem(output_dir, expected, owned, remedy)
  if reason:
    raise ResumeRefused(reason)
  expected = normalised(expected)
  if read(output_dir) != expected:  # new, or max_examples grew
    fileio.write_json(os.path.join(output_dir, FILE_NAME), expected, sort_keys=False)
  return expected
