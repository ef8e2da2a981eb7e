"""Tests for specdec/task_names.py: the registered task names, importable without seqio."""

import ast
import os
import re
import subprocess
import sys

from specdec import task_names


def test_names_are_the_registered_ones():
  from specdec import tasks  # pylint: disable=g-import-not-at-top  (registers the tasks: seqio, TensorFlow)
  import seqio  # pylint: disable=g-import-not-at-top
  for name in task_names.LOCAL_TASKS + task_names.PAPER_TASKS:
    assert name in seqio.TaskRegistry.names()
  assert task_names.LOCAL_MIXTURE in seqio.MixtureRegistry.names()
  # tasks.py keeps the names as its own attributes.
  assert (tasks.ENDE_LOCAL_TASK, tasks.SUMMARIZE_LOCAL_TASK, tasks.LOCAL_MIXTURE) == (
      task_names.ENDE_LOCAL_TASK, task_names.SUMMARIZE_LOCAL_TASK, task_names.LOCAL_MIXTURE)
  assert (tasks.LOCAL_TASKS, tasks.PAPER_TASKS) == (task_names.LOCAL_TASKS, task_names.PAPER_TASKS)


def test_tables_need_neither_seqio_nor_tensorflow():
  code = ('import sys; import specdec.bench.tables; '
          'print(sorted(m for m in ("seqio", "tensorflow") if m in sys.modules))')
  out = subprocess.run([sys.executable, '-c', code], check=True, capture_output=True, text=True).stdout
  assert out.strip() == '[]'


def test_the_scripts_lengths_and_short_names_are_the_gin_files():
  """The CPU family's lengths and tasks as gin/tasks/<short name>_local.gin binds them."""
  gin_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'gin', 'tasks')
  assert sorted(task_names.LOCAL_TASK_BY_NAME.values()) == sorted(task_names.LOCAL_TASKS)
  for short, task in task_names.LOCAL_TASK_BY_NAME.items():
    with open(os.path.join(gin_dir, f'{short}_local.gin'), encoding='utf-8') as f:
      text = f.read()
    assert re.search(r"^\s*task = '([\w.]+)'$", text, re.M).group(1) == task
    lengths = ast.literal_eval(re.search(r'^\s*feature_lengths = (\{.*\})$', text, re.M).group(1))
    assert lengths == task_names.LOCAL_FEATURE_LENGTHS
