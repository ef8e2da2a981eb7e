"""Tests for specdec/data/apt_lists.py: apt-get run under a private configuration, with stand-in binaries."""

import json
import os
import stat
import sys

import pytest

from specdec.data import apt_lists

# What a system's `apt-config dump` prints: settings to forward, ones to keep out, a repeated key.
_DUMP = '''Acquire::http::Proxy "http://proxy.example:3128";
Acquire::Retries "3";
Acquire::Languages "none";
Dir "/";
Dir::Etc "etc/apt";
DIR::ETC "ignored/second";
APT::Architecture "amd64";
'''


def _executable(path, text):
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return str(path)


@pytest.fixture
def bin_dir(tmp_path):
  """apt-config printing _DUMP, and an apt-get recording its arguments and APT_CONFIG."""
  folder = tmp_path / 'bin'
  folder.mkdir()
  _executable(folder / 'apt-config', f'#!{sys.executable}\nimport sys\nsys.stdout.write({_DUMP!r})\n')
  _executable(folder / 'apt-get', f'''#!{sys.executable}
import json, os, sys
with open(os.path.join(os.path.dirname(sys.argv[0]), 'called.json'), 'w') as f:
  json.dump({{'argv': sys.argv[1:], 'conf': os.environ['APT_CONFIG'], 'lc_all': os.environ['LC_ALL']}}, f)
print('W: a warning', file=sys.stderr)
''')
  return folder


def test_the_binary_from_the_argument_the_environment_or_the_path(tmp_path, bin_dir, monkeypatch):
  apt_get = str(bin_dir / 'apt-get')
  assert apt_lists.resolve_apt_get(apt_get) == apt_get
  monkeypatch.setenv(apt_lists.APT_GET_ENV, apt_get)
  assert apt_lists.resolve_apt_get() == apt_get
  monkeypatch.delenv(apt_lists.APT_GET_ENV)
  monkeypatch.setenv('PATH', str(bin_dir))
  assert apt_lists.resolve_apt_get() == apt_get
  monkeypatch.setenv('PATH', str(tmp_path))
  with pytest.raises(RuntimeError, match=r"^apt-get not found \(looked for 'apt-get'\)\. Use lists\.$"):
    apt_lists.resolve_apt_get(remedy='Use lists.')
  with pytest.raises(RuntimeError, match=r"^apt-get not found \(looked for '/nonexistent/apt-get'\)\.$"):
    apt_lists.resolve_apt_get('/nonexistent/apt-get')


def test_root_is_required(monkeypatch):
  monkeypatch.setattr(os, 'geteuid', lambda: 1000)
  with pytest.raises(RuntimeError, match=r'needs root \(running as uid 1000\)\. Pass lists\.$'):
    apt_lists.require_root('Pass lists.')
  monkeypatch.setattr(os, 'geteuid', lambda: 0)
  apt_lists.require_root('Pass lists.')


def test_the_private_configuration_reads_no_system_parts(tmp_path):
  (tmp_path / 'apt' / 'parts').mkdir(parents=True)
  (tmp_path / 'apt' / 'parts' / 'leftover.conf').write_text('x')
  path = apt_lists.write_config(str(tmp_path / 'apt'), languages=('en',))
  conf = open(path, encoding='utf-8').read()
  assert os.listdir(tmp_path / 'apt' / 'parts') == []
  assert f'Dir::State::Lists "{apt_lists.lists_dir(str(tmp_path / "apt"))}";' in conf
  assert 'Acquire::Languages { "en"; };' in conf and 'Acquire::GzipIndexes "false";' in conf


def test_only_network_settings_are_forwarded(bin_dir):
  assert apt_lists.forwarded_options(str(bin_dir / 'apt-get')) == [
      '-o', 'Acquire::http::Proxy=http://proxy.example:3128', '-o', 'Acquire::Retries=3']


def test_no_apt_config_forwards_nothing_and_the_system_config_is_an_error(tmp_path):
  apt_get = _executable(tmp_path / 'apt-get', '#!/bin/sh\n')
  assert apt_lists.forwarded_options(apt_get) == []
  with pytest.raises(RuntimeError, match="could not read the system's apt configuration"):
    apt_lists.system_config(apt_get)


def test_the_system_config_keys_are_lower_case_and_the_first_value_wins(bin_dir):
  config = apt_lists.system_config(str(bin_dir / 'apt-get'))
  assert config['dir::etc'] == 'etc/apt' and config['dir'] == '/'


def test_update_runs_with_the_private_config_its_options_and_the_forwarded_ones(tmp_path, bin_dir):
  conf = apt_lists.write_config(str(tmp_path / 'apt'))
  proc = apt_lists.run_update(str(bin_dir / 'apt-get'), conf, ['-o', 'Dir::Etc::SourceList=/dev/null'])
  called = json.loads((bin_dir / 'called.json').read_text())
  assert called == {'argv': ['update', '-o', 'Dir::Etc::SourceList=/dev/null',
                             '-o', 'Acquire::http::Proxy=http://proxy.example:3128', '-o', 'Acquire::Retries=3'],
                    'conf': conf, 'lc_all': 'C'}
  assert 'W: a warning' in proc.stderr


def test_a_failed_update_says_how_it_ended_and_the_remedy(tmp_path):
  apt_get = _executable(tmp_path / 'apt-get', "#!/bin/sh\necho 'E: could not resolve' >&2\nexit 100\n")
  with pytest.raises(RuntimeError, match=r'(?s)^apt-get update exited with 100:\nE: could not resolve\n\nUse lists\.$'):
    apt_lists.run_update(apt_get, str(tmp_path / 'apt.conf'), remedy='Use lists.')
