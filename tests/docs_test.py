"""README.md and docs/*.md cannot rot: their links, code blocks and quoted numbers are checked.

* Every relative link (and image) resolves to a file of this repository; a link with an anchor into a Markdown
  file names one of its headings (GitHub's heading ids).
* Every ```python block runs. The blocks of one page run in order in one namespace, as a reader would run them.
  Substitutions, so that they run in seconds on a CPU:
  - `network.t5_1_1_config` gives tiny networks for the named T5 1.1 sizes: 'small' is a tiny drafter, 'base',
    'large', 'xl' and 'xxl' a tiny target (both of the tiny configs tests/models_test.py uses, vocabulary 48);
  - names a block uses but defines elsewhere (`target_params`, `enc`, `tokens_to_logits`, `rng`, `path`, ...)
    come from `_factories` below, made on first use from what the block has built so far (params of its own
    networks, toy models of tests/toy.py for the direct `speculative_sample` call, checkpoints written to a
    temporary directory for the checkpoint formats);
  - `_SOURCE_SUBSTITUTIONS`: the few literals that name what only a real deployment has (a `gs://` checkpoint,
    a local Hugging Face snapshot, a 4-way model-parallel mesh) are replaced in the block's text, each
    replacement asserted to apply.
* Every shell command in a ``` block is checked to parse, doing no work: a script's own argparse parser is
  called on the flags shown (the parser's `parse_args` is intercepted the moment it returns);
  `python -m specdec.main` (and the `specdec` console script), `specdec.training.train` and `specdec.training.feature_training`
  lines are parsed with `gin_utils` as their `main` parses them (files looked up under gin/, every binding
  checked); `bash scripts/*.sh`, `pip` and `pytest` lines are checked for the files they name. docs/cloud_tpu.md
  is left to tests/tpu_launch_test.py, which runs each of its commands as a dry run.
* Every figure in README.md (a decimal such as 0.56, a ratio such as 1.95×, a percentage) is found in a results
  file that the same paragraph or table row links to (a table row without links: the paragraph just above the
  table).
"""

import argparse
import contextlib
import functools
import glob
import importlib.util
import os
import re
import shlex
import sys

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import checkpoints
from specdec import decoding
from specdec.training import feature_training  # pylint: disable=unused-import  (its gin configurables)
from specdec import gin_utils
from specdec import hf_export
from specdec import main as specdec_main
from specdec import models
from specdec import network
from specdec import run_config
from specdec.training import train  # pylint: disable=unused-import  (its gin configurables)
from specdec.training import train_config
from tests import toy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ['README.md'] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, 'docs', '*.md')))
# Its commands are executed, as dry runs, by tests/tpu_launch_test.py (TestDocs).
COMMANDS_CHECKED_ELSEWHERE = {'docs/cloud_tpu.md'}

VOCAB = 48
TINY_TARGET = dict(vocab_size=VOCAB)
TINY_DRAFTER = dict(vocab_size=VOCAB, emb_dim=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                    mlp_dim=32)


def _read(page):
  with open(os.path.join(REPO, page), encoding='utf-8') as f:
    return f.read()


def _split(text):
  """(prose lines with code blocks blanked, [(language, code, first line number)])."""
  prose, blocks, block, lang, start = [], [], None, '', 0
  for number, line in enumerate(text.split('\n'), 1):
    if line.startswith('```'):
      if block is None:
        block, lang, start = [], line[3:].strip(), number + 1
      else:
        blocks.append((lang, '\n'.join(block), start))
        block = None
      prose.append('')
    elif block is not None:
      block.append(line)
      prose.append('')
    else:
      prose.append(line)
  assert block is None, 'an unclosed ``` block'
  return prose, blocks


# ---------------------------------------------------------------------------------------------------------------
# Links
# ---------------------------------------------------------------------------------------------------------------

LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)')


def _links(page):
  prose, _ = _split(_read(page))
  text = '\n'.join(re.sub(r'`[^`]*`', lambda m: ' ' * len(m.group()), line) if '](' not in line else line
                   for line in prose)
  return [m.group(1) for m in LINK.finditer(text)]


def _slug(heading):
  """GitHub's id of a heading: lower case, punctuation dropped, spaces as hyphens."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def _anchors(path):
  prose, _ = _split(open(path, encoding='utf-8').read())
  return {_slug(line.lstrip('#')) for line in prose if re.match(r'#{1,6} ', line)}


def _broken_links(page):
  broken = []
  for target in _links(page):
    if re.match(r'[a-z]+:', target):  # http(s):, mailto:
      continue
    path, _, anchor = target.partition('#')
    resolved = os.path.normpath(os.path.join(REPO, os.path.dirname(page), path)) if path else os.path.join(REPO, page)
    if not resolved.startswith(REPO + os.sep) or not os.path.exists(resolved):
      broken.append(f'{target} (no such file)')
    elif anchor and resolved.endswith('.md') and anchor not in _anchors(resolved):
      broken.append(f'{target} (no heading #{anchor})')
  return broken


@pytest.mark.parametrize('page', PAGES + ['results/README.md'])  # the results map links back into them
def test_every_relative_link_resolves(page):
  assert _links(page) or page in ('docs/cloud_tpu.md', 'docs/checkpoints.md', 'docs/partitioning.md')
  assert _broken_links(page) == []


def test_the_link_check_catches_a_broken_link(tmp_path, monkeypatch):
  page = tmp_path / 'docs' / 'page.md'
  page.parent.mkdir()
  (tmp_path / 'results').mkdir()
  (tmp_path / 'results' / 'x.md').write_text('# A heading\n')
  page.write_text('[ok](../results/x.md#a-heading) [gone](../results/y.md) [bad anchor](../results/x.md#nope)\n'
                  '```\n[in code](nowhere.md)\n```\n')
  monkeypatch.setattr(sys.modules[__name__], 'REPO', str(tmp_path))
  assert _broken_links('docs/page.md') == ['../results/y.md (no such file)',
                                           '../results/x.md#nope (no heading #nope)']


def test_the_readme_is_short_and_the_docs_index_lists_every_page():
  assert len(_read('README.md').splitlines()) <= 150
  index = _read('docs/README.md')
  for page in PAGES:
    if page.startswith('docs/') and page != 'docs/README.md':
      assert f'({os.path.basename(page)})' in index, page


def _modules():
  """Every module of the package as its path under specdec/ without '.py' ('tasks', 'data/corpora')."""
  paths = glob.glob(os.path.join(REPO, 'specdec', '**', '*.py'), recursive=True)
  return sorted(os.path.relpath(p, os.path.join(REPO, 'specdec'))[:-3] for p in paths
                if os.path.basename(p) != '__init__.py')


def _imported_modules(module, known):
  """The specdec modules `module` imports, as `_modules` names them (`known`: their set)."""
  found = set()
  for dotted, names in re.findall(r'^ *from specdec(?:\.([\w.]+))? import ([\w, ]+)', _read(f'specdec/{module}.py'),
                                  re.M):
    base = dotted.replace('.', '/') if dotted else ''
    for name in (n.strip() for n in names.split(',')):
      inner = f'{base}/{name}' if base else name
      found.add(inner if inner in known else base)
  return found - {''}


def test_the_layout_names_every_module():
  layout = _read('docs/layout.md')
  assert [m for m in _modules() if f'`specdec/{m}.py`' not in layout] == []


# Tested beside the module that produces its input: the module, and the test file that imports it.
_TESTED_WITH = {'bench/accelerator_report': 'bench/accelerator_test.py'}


def test_each_module_has_its_test_file_at_the_same_place():
  missing = [m for m in _modules() if m not in _TESTED_WITH
             if not os.path.exists(os.path.join(REPO, 'tests', f'{m}_test.py'))]
  assert missing == [], 'modules without tests/<module>_test.py'
  for module, test_file in _TESTED_WITH.items():
    assert f'import {os.path.basename(module)}\n' in _read(f'tests/{test_file}'), (module, test_file)


def test_the_layout_says_who_imports_whom():
  """docs/layout.md: a module imports only from its own layer (a `## ` section) or the ones listed before it."""
  layer, level = -1, {}
  for line in _read('docs/layout.md').split('\n'):
    layer += line.startswith('## ')
    match = re.match(r'\| `specdec/([\w/]+)\.py`', line)
    if match:
      level[match.group(1)] = layer
  known = set(_modules())
  upward = [f'{module} imports {name}' for module, own in level.items()
            for name in sorted(_imported_modules(module, known)) if level.get(name, -1) > own]
  assert upward == []


# The launcher dispatches to the benchmark and the ceiling (its 'benchmark' mode, the main job); every other
# module at the top level is the library, which needs none of the repository's tooling.
_LAUNCHERS = ('main',)


# Folders from the bottom: each imports only from itself and the ones before it ('' is the library, 'main' the
# launcher at the top level).
_FOLDERS_UPWARD = ('', 'data', 'training', 'bench', 'main', 'cloud_tpu')


def _folder(module: str) -> str:
  return module if module in _LAUNCHERS else module.rpartition('/')[0]


def test_the_folders_import_one_way():
  known = set(_modules())
  assert sorted({_folder(m) for m in known}) == sorted(_FOLDERS_UPWARD)
  rank = {folder: i for i, folder in enumerate(_FOLDERS_UPWARD)}
  upward = [f'{m} imports {name}' for m in sorted(known) for name in sorted(_imported_modules(m, known))
            if rank[_folder(name)] > rank[_folder(m)]]
  assert upward == []


def test_the_library_imports_nothing_from_the_tooling():
  known = set(_modules())
  library = [m for m in sorted(known) if '/' not in m and m not in _LAUNCHERS]
  reaching = [f'{m} imports {name}' for m in library for name in sorted(_imported_modules(m, known)) if '/' in name]
  assert reaching == []


@pytest.mark.parametrize('page', [p for p in PAGES if p.startswith('docs/') and p != 'docs/README.md'])
def test_each_docs_page_opens_with_a_summary(page):
  lines = _read(page).split('\n')
  assert lines[0].startswith('# ') and lines[1] == '' and lines[2] and lines[3], page


# ---------------------------------------------------------------------------------------------------------------
# Python blocks
# ---------------------------------------------------------------------------------------------------------------

_SOURCE_SUBSTITUTIONS = {
    'docs/checkpoints.md': [
        ("'gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000'", 't5x_checkpoint'),
        ("'/models/t5-v1_1-xl'", 'hf_snapshot'),
    ],
    'docs/partitioning.md': [('num_partitions=4', 'num_partitions=1')],  # one CPU device here: a 1×1 mesh
}


def _tiny_t5_1_1_config(original, name, **overrides):
  """The T5 1.1 preset `name`, shrunk: 'small' to a tiny drafter, larger sizes to a tiny target."""
  if name == 'tiny':
    return original(name, **overrides)
  return original('tiny', **{**overrides, **(TINY_DRAFTER if name == 'small' else TINY_TARGET)})


def _factories(tmp_path):
  """What a block may use without defining it, made from the namespace `ns` the block has built so far."""
  key = jax.random.PRNGKey(0)

  def params_of(module_name):
    return lambda ns: network.init_params(ns[module_name].config, key)

  def tiny_model(ns):
    return models.SpeculativeEncoderDecoderModel(
        network.Transformer(network.t5_1_1_config('xxl')), network.Transformer(network.t5_1_1_config('small')))

  def toy_target(ns):
    return toy.ToyModel(10, vocab=9, cache_len=16, eos_bias=0.5)

  def toy_drafter(ns):
    return toy.ToyModel(11, vocab=9, cache_len=16)

  def t5x_checkpoint(ns):
    return checkpoints.save_t5x(str(tmp_path / 't5x'), network.init_params(ns['config'], key), step=1000000)

  def hf_snapshot(ns):
    config = network.t5_1_1_config('xl', dtype='float32')
    return hf_export.save_hf(str(tmp_path / 'hf'), config, network.init_params(config, key))

  def compact_checkpoint(ns):
    directory = str(tmp_path / 'compact')
    checkpoints.save_compact(directory, ns['config'], network.init_params(ns['config'], key))
    return directory

  batch = lambda ns: {'encoder_input_tokens': ns['enc'], 'decoder_input_tokens': ns['dec']}
  return {
      # README.md, docs/decoding.md: the model's predict, then the loop called directly.
      'target_params': params_of('target'),
      'drafter_params': params_of('drafter'),
      'enc': lambda ns: jnp.asarray(np.random.RandomState(0).randint(2, VOCAB, (2, 6)), jnp.int32),
      'dec': lambda ns: jnp.zeros((2, 8), jnp.int32),
      'inputs': lambda ns: jnp.zeros((2, 16), jnp.int32),
      '_toy_target': toy_target,
      '_toy_drafter': toy_drafter,
      'cache': lambda ns: ns['_toy_target'].init_cache(2),
      'tokens_to_logits': lambda ns: ns['_toy_target'].tokens_to_logits,
      'draft_cache': lambda ns: ns['_toy_drafter'].init_cache(2),
      'draft_tokens_to_logits': lambda ns: ns['_toy_drafter'].tokens_to_logits,
      'rng': lambda ns: jax.random.PRNGKey(1),
      # docs/checkpoints.md
      'path': compact_checkpoint,
      'shardings': lambda ns: None,
      't5x_checkpoint': t5x_checkpoint,
      'hf_snapshot': hf_snapshot,
      # docs/partitioning.md
      'model': tiny_model,
      'params': lambda ns: {'target': network.init_params(ns['model'].module.config, key),
                            'drafter': network.init_params(ns['model'].drafter_module.config, key)},
      'batch': batch,
  }


class _Namespace(dict):
  """A block's names; a name it uses but never defined is made by its factory on first use."""

  def __init__(self, factories):
    super().__init__()
    self._factories = factories

  def __missing__(self, name):
    if name not in self._factories:
      raise KeyError(name)
    self[name] = self._factories[name](self)
    return self[name]


def _python_blocks(page):
  _, blocks = _split(_read(page))
  code = [(text, line) for lang, text, line in blocks if lang == 'python']
  for old, new in _SOURCE_SUBSTITUTIONS.get(page, ()):
    assert sum(old in text for text, _ in code) == 1, f'{page}: the substitution of {old} no longer applies'
    code = [(text.replace(old, new), line) for text, line in code]
  return code


def _pages_with_python():
  """Pages with Python blocks; pages whose blocks are the same text run once."""
  seen = {}
  for page in PAGES:
    blocks = tuple(text for text, _ in _python_blocks(page))
    if blocks:
      seen.setdefault(blocks, []).append(page)
  return [pytest.param(pages[0], id='+'.join(pages)) for pages in seen.values()]


@pytest.mark.parametrize('page', _pages_with_python())
def test_every_python_block_runs(page, tmp_path, monkeypatch):
  monkeypatch.setattr(network, 't5_1_1_config',
                      functools.partial(_tiny_t5_1_1_config, network.t5_1_1_config))
  namespace = _Namespace(_factories(tmp_path))
  for text, line in _python_blocks(page):
    code = compile('\n' * (line - 1) + text, os.path.join(REPO, page), 'exec')
    exec(code, {'__builtins__': __builtins__}, namespace)  # pylint: disable=exec-used
  outputs = [v for k, v in namespace.items() if k in ('decodes', 'params')]
  assert outputs, 'the page computes nothing this test looks at'
  for value in outputs:
    jax.block_until_ready(value)


# ---------------------------------------------------------------------------------------------------------------
# Shell commands
# ---------------------------------------------------------------------------------------------------------------


def _commands(page):
  """[(words, where)] of every shell command in the page's non-Python blocks: continuation lines joined,
  comments and `[OPTIONAL ...]` placeholders dropped, `VAR=value` lines and prefixes applied, `&&` split."""
  _, blocks = _split(_read(page))
  commands = []
  for lang, text, start in blocks:
    if lang == 'python':
      continue
    variables = {}
    for offset, line in enumerate(text.replace('\\\n', ' ').split('\n')):
      words = shlex.split(re.sub(r'\[[A-Z_]+ \.\.\.\]', '', line), comments=True)
      words = [re.sub(r'\$(\w+)', lambda m: variables.get(m.group(1), m.group()), w) for w in words]
      if len(words) == 1 and re.match(r'\w+=', words[0]):
        name, _, value = words[0].partition('=')
        variables[name] = value
        continue
      command = []
      for word in words + ['&&']:
        if word != '&&':
          command.append(word)
          continue
        while command and re.match(r'[A-Z_]+=', command[0]):
          command.pop(0)
        if command:
          commands.append((command, f'{page}, block at line {start}: {shlex.join(command)}'))
        command = []
  return commands


class _Parsed(Exception):
  pass


_SCRIPTS = {}


def _load_script(path):
  if path not in _SCRIPTS:
    spec = importlib.util.spec_from_file_location(
        'docs_test_' + re.sub(r'\W', '_', os.path.relpath(path, REPO)), path)
    module = importlib.util.module_from_spec(spec)
    environ, argv, sys_path = dict(os.environ), sys.argv, list(sys.path)
    sys.argv = [path]  # scripts that read flags at import (accelerator_check.py) see none
    sys.path.insert(0, os.path.dirname(path))  # as `python scripts/x.py` has it: scripts import their siblings
    try:
      spec.loader.exec_module(module)
    finally:
      sys.argv, sys.path[:] = argv, sys_path
      os.environ.clear()
      os.environ.update(environ)
    _SCRIPTS[path] = module
  return _SCRIPTS[path]


def _check_script_flags(path, args, monkeypatch):
  """Calls the script's main() with `args`; its argparse parser parses them, then the call stops."""
  module = _load_script(path)
  original = argparse.ArgumentParser.parse_args

  def parse_args(self, args=None, namespace=None):
    raise _Parsed(original(self, args, namespace))

  monkeypatch.setattr(argparse.ArgumentParser, 'parse_args', parse_args)
  monkeypatch.setattr(sys, 'argv', [path] + list(args))
  monkeypatch.syspath_prepend(os.path.dirname(path))
  try:
    module.main()
  except _Parsed as parsed:
    return parsed.args[0]
  except SystemExit as e:
    raise AssertionError(f'{os.path.relpath(path, REPO)} refuses {args}: exit {e.code}') from None
  raise AssertionError(f'{os.path.relpath(path, REPO)} never parsed its flags')


@contextlib.contextmanager
def _clean_gin():
  gin.clear_config()
  try:
    yield
  finally:
    gin.clear_config()


def _check_gin_command(module, args):
  """Parses a gin command line as the module's main does, and stops before building anything."""
  args = [a for a in args if a not in ('--help', '-h', '--debug')]
  files, bindings, rest = gin_utils.split_gin_args(args)
  assert [a for a in rest if a != '--multihost'] == [], f'{module} takes no {rest}'
  if module == 'specdec.main':
    files, renamed = files or [specdec_main.DEFAULT_GIN_FILE], run_config.FORMER_RUN_PARAMETERS
  else:
    assert files, f'{module} needs --gin_file'
    renamed = train_config.FORMER_TRAIN_PARAMETERS
  with _clean_gin():
    gin_utils.parse(files, bindings, renamed=renamed)


def _check_command(words, monkeypatch):
  exists = lambda p: os.path.exists(os.path.join(REPO, p))
  if words[0] == 'specdec':  # the console script: specdec.main:main (setup.py)
    words = ['python', '-m', 'specdec.main'] + words[1:]
  if words[:2] == ['pip', 'install']:
    assert words[2] == '-e' and exists('setup.py')
    extras = re.findall(r'\[(\w+)\]', words[3])
    setup = _read('setup.py')
    assert all(f"'{extra}':" in setup for extra in extras), extras
  elif words[:3] == ['python', '-m', 'pytest']:
    assert all(exists(w) for w in words[3:] if not w.startswith('-') and not w.isdigit()), words
  elif words[:2] == ['python', '-m'] and words[2] in ('specdec.main', 'specdec.training.train', 'specdec.training.feature_training'):
    _check_gin_command(words[2], words[3:])
  elif words[0] == 'python' and words[1].startswith('scripts/') and words[1].endswith('.py'):
    assert exists(words[1]), words[1]
    _check_script_flags(os.path.join(REPO, words[1]), words[2:], monkeypatch)
  elif words[0] == 'bash' and words[1].startswith('scripts/'):
    assert exists(words[1]), words[1]
  else:
    raise AssertionError(f'a command this test does not know how to check: {shlex.join(words)}')


def _all_commands():
  return [pytest.param(words, id=where) for page in PAGES if page not in COMMANDS_CHECKED_ELSEWHERE
          for words, where in _commands(page)]


@pytest.mark.parametrize('words', _all_commands())
def test_every_shell_command_parses(words, monkeypatch):
  _check_command(words, monkeypatch)


def test_the_command_check_catches_a_bad_flag_and_a_bad_binding(monkeypatch):
  with pytest.raises(AssertionError, match='refuses'):
    _check_command(['python', 'scripts/ceiling.py', '--no_such_flag'], monkeypatch)
  with pytest.raises(gin_utils.GinConfigError):
    _check_command(['python', '-m', 'specdec.main', '--gin.GAMA=4'], monkeypatch)
  with pytest.raises(AssertionError):
    _check_command(['bash', 'scripts/no_such_script.sh'], monkeypatch)


def test_the_readme_commands_are_found():
  commands = [' '.join(w) for w, _ in _commands('README.md')]
  assert 'pip install -e .' in commands and 'python -m specdec.main' in commands
  assert "pip install -e .[test]" in commands and 'python -m pytest -q -n 2 tests' in commands


# ---------------------------------------------------------------------------------------------------------------
# Numbers in README.md
# ---------------------------------------------------------------------------------------------------------------

FIGURE = re.compile(r'(?<![\w.])\d+(?:\.\d+)?(?:×|%)|(?<![\w.])\d+\.\d+(?![\d.])')
# Names with digits in them, not measurements.
NOT_FIGURES = re.compile(r'T5 1\.1|Thm \d+\.\d+|Python ≥ \d+\.\d+|Def\. \d+\.\d+')


def _units(text):
  """(text, [linked results files]) of each paragraph and each table row, outside code blocks and inline code."""
  prose, _ = _split(text)
  prose = [re.sub(r'`[^`]*`', '', line) for line in prose]
  units, paragraph, caption_links = [], [], []
  for line in prose + ['']:
    if line.startswith('|'):
      if paragraph:
        units.append(('\n'.join(paragraph), _result_links(paragraph)))
        caption_links, paragraph = _result_links(paragraph), []
      units.append((line, _result_links([line]) or caption_links))
    elif line.strip():
      paragraph.append(line)
    elif paragraph:  # the last paragraph before a table is its caption
      units.append(('\n'.join(paragraph), _result_links(paragraph)))
      caption_links, paragraph = _result_links(paragraph), []
  return units


def _result_links(lines):
  return [m.group(1).partition('#')[0] for m in LINK.finditer('\n'.join(lines))
          if m.group(1).startswith('results/') and m.group(1).endswith(('.md', '.json', '.csv'))]


def _unfound_figures(text, read=lambda p: _read(p)):
  unfound = []
  for unit, links in _units(text):
    figures = FIGURE.findall(NOT_FIGURES.sub('', unit))
    if not figures:
      continue
    sources = ''.join(read(p) for p in links)
    for figure in figures:
      if not re.search(r'(?<![\d.])' + re.escape(figure) + r'(?!\d)', sources):
        unfound.append(f'{figure} in {unit.strip()[:80]!r} (links {links})')
  return unfound


def test_every_number_in_the_readme_is_in_the_file_it_links_to():
  text = _read('README.md')
  assert len(FIGURE.findall(text)) > 20  # the check sees the table's numbers
  assert _unfound_figures(text) == []


def test_the_number_check_catches_a_wrong_or_an_unsourced_number():
  files = {'results/a.md': '| 0.8 | **1.95×** | 100% |'}
  read = files.__getitem__
  good = '| what | measured | file |\n|---|---|---|\n| α* 0.8 | 1.95×, 100% | [a](results/a.md) |\n'
  assert _unfound_figures(good, read) == []
  assert len(_unfound_figures(good.replace('1.95×', '1.96×'), read)) == 1
  assert len(_unfound_figures('It gives 2.40× here.\n', read)) == 1  # a figure with no link
  caption = 'The table of [a](results/a.md):\n\n| x | y |\n|---|---|\n| 0.8 | 1.95× |\n'
  assert _unfound_figures(caption, read) == []
  assert _unfound_figures('T5 1.1 and Thm 3.8, `--gamma 0.5`.\n', read) == []
