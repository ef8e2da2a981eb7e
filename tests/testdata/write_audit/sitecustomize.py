"""Records what a Python process writes under one directory (tests/multihost_test.py's check of who writes).

Python imports `sitecustomize` at start-up from the first folder of PYTHONPATH that has one; this one acts only
when SPECDEC_TEST_WRITE_AUDIT names the JSON file to record into and SPECDEC_TEST_WRITE_AUDIT_UNDER the
directory to watch. Every audited event that creates, changes, moves or removes a file or folder there
(`sys.addaudithook`: open for writing, rename, remove, mkdir, rmtree, ...) is recorded as [event, path] and
the list is written at exit.
"""

import atexit
import json
import os
import sys

_RECORD_TO = os.environ.get('SPECDEC_TEST_WRITE_AUDIT')
_WATCHED = os.environ.get('SPECDEC_TEST_WRITE_AUDIT_UNDER')
# Events whose first argument is a path they change (CPython's audit events table).
_CHANGING = ('os.rename', 'os.remove', 'os.rmdir', 'os.mkdir', 'os.truncate', 'os.link', 'os.symlink',
             'os.chmod', 'os.utime', 'shutil.rmtree', 'shutil.move', 'shutil.copyfile')
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _watched(path) -> bool:
  if isinstance(path, bytes):
    path = os.fsdecode(path)
  if not isinstance(path, str):
    return False  # a file descriptor: its opening was seen
  path = os.path.abspath(path)
  return path == _WATCHED or path.startswith(_WATCHED + os.sep)


def _writes(event, args) -> bool:
  if event == 'open':
    path, mode, flags = args
    writing = (isinstance(mode, str) and any(c in mode for c in 'wax+')) or (
        isinstance(flags, int) and flags > 0 and flags & _WRITE_FLAGS)
    return bool(writing) and _watched(path)
  if event in ('os.rename', 'shutil.move', 'shutil.copyfile'):
    return _watched(args[1])  # the destination
  return event in _CHANGING and bool(args) and _watched(args[0])


def _install():
  seen = []

  def hook(event, args):
    if _writes(event, args):
      seen.append([event, os.fsdecode(args[1] if event in ('os.rename', 'shutil.move', 'shutil.copyfile')
                                      else args[0])])

  def dump():
    with open(_RECORD_TO, 'w', encoding='utf-8') as f:
      json.dump(seen, f)

  sys.addaudithook(hook)
  atexit.register(dump)


if _RECORD_TO and _WATCHED:
  _WATCHED = os.path.abspath(_WATCHED)
  _install()
