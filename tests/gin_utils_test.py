"""Tests for specdec/gin_utils.py: T5X-style gin flags and file lookup."""

import os

import gin
import pytest

from specdec import gin_utils

REPO_GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'gin')


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


class TestSplitGinArgs:

  def test_empty(self):
    assert gin_utils.split_gin_args([]) == ([], [], [])

  def test_gin_file_equals_with_comma_list(self):
    files, bindings, rest = gin_utils.split_gin_args(['--gin_file=a.gin,b/c.gin'])
    assert files == ['a.gin', 'b/c.gin']
    assert bindings == [] and rest == []

  def test_gin_file_space_separated(self):
    assert gin_utils.split_gin_args(['--gin_file', 'a.gin']) == (['a.gin'], [], [])
    assert gin_utils.split_gin_args(['--gin_file', 'a.gin,b.gin']) == (
        ['a.gin', 'b.gin'], [], [])

  def test_gin_file_repeated_keeps_order(self):
    files, _, _ = gin_utils.split_gin_args(
        ['--gin_file=a.gin', '--gin_file', 'b.gin', '--gin_file=c.gin,d.gin'])
    assert files == ['a.gin', 'b.gin', 'c.gin', 'd.gin']

  def test_gin_dot_binding(self):
    _, bindings, _ = gin_utils.split_gin_args(
        ["--gin.MODEL_DIR='runs/target'", '--gin.train.train.num_steps=10'])
    assert bindings == ["MODEL_DIR = 'runs/target'", 'train.train.num_steps = 10']

  def test_gin_dot_value_may_contain_equals(self):
    _, bindings, _ = gin_utils.split_gin_args(["--gin.NAME='a=b'"])
    assert bindings == ["NAME = 'a=b'"]

  def test_gin_dot_empty_value(self):
    _, bindings, _ = gin_utils.split_gin_args(['--gin.NAME='])
    assert bindings == ['NAME = ']

  def test_gin_bindings(self):
    _, bindings, _ = gin_utils.split_gin_args(
        ['--gin_bindings=GAMMA = 3', '--gin_bindings=x.y=4'])
    assert bindings == ['GAMMA = 3', 'x.y=4']

  def test_other_args_pass_through_in_order(self):
    argv = ['--foo=1', 'positional', '--gin_file=a.gin', '-v',
            '--gin.X=1', '--gin_filex=2', '--bar']
    files, bindings, rest = gin_utils.split_gin_args(argv)
    assert files == ['a.gin']
    assert bindings == ['X = 1']
    assert rest == ['--foo=1', 'positional', '-v', '--gin_filex=2', '--bar']

  def test_mixed_order_of_bindings(self):
    _, bindings, _ = gin_utils.split_gin_args(
        ['--gin.A=1', '--gin_bindings=B = 2', '--gin.C=3'])
    assert bindings == ['A = 1', 'B = 2', 'C = 3']

  def test_trailing_gin_file_without_value_is_not_swallowed(self):
    files, _, rest = gin_utils.split_gin_args(['x', '--gin_file'])
    assert files == []
    assert rest == ['x', '--gin_file']

  def test_gin_dot_without_equals_raises(self):
    with pytest.raises(ValueError, match='--gin.MODEL_DIR'):
      gin_utils.split_gin_args(['--gin.MODEL_DIR'])

  def test_accepts_a_tuple(self):
    assert gin_utils.split_gin_args(('--gin.A=1',)) == ([], ['A = 1'], [])


class TestLaunchArgs:

  def test_gin_flags_and_multihost(self):
    assert gin_utils.launch_args(['--gin_file=a.gin', '--multihost', '--gin.X=1']) == (['a.gin'], ['X = 1'], True)
    assert gin_utils.launch_args(['--gin_file=a.gin']) == (['a.gin'], [], False)

  def test_anything_else_is_one_line_naming_what_is_taken(self):
    with pytest.raises(ValueError, match=r"^unknown arguments \['--bogus'\] \(use --gin_file=PATH, --gin.NAME=VALUE, "
                                         r"--multihost, --debug\)\.$"):
      gin_utils.launch_args(['--multihost', '--bogus'], other_flags=('--debug',))


class TestParse:

  def test_repo_gin_dir(self):
    assert os.path.samefile(gin_utils.REPO_GIN_DIR, REPO_GIN_DIR)

  def test_finds_files_under_repo_gin_dir(self):
    gin_utils.parse(['models/speculative.gin'], ['VOCAB_SIZE = 3'])
    assert gin.query_parameter('%VOCAB_SIZE') == 3
    assert gin.query_parameter('target/network.T5Config.dropout_rate') == 0.0

  def test_includes_resolve_through_the_search_path(self):
    # cpu_target.gin includes 'train/cpu_family.gin' (relative to gin/).
    gin_utils.parse(['train/cpu_target.gin'],
                    ["MODEL_DIR = 'runs/m'", 'train_config.TrainConfig.num_steps = 7'])
    assert gin.query_parameter('%MODEL_DIR') == 'runs/m'
    assert gin.query_parameter('train_config.TrainConfig.num_steps') == 7
    assert gin.query_parameter('train_config.DataConfig.batch_size') == 32
    assert gin.query_parameter('network.T5Config.vocab_size') == 8192

  def test_files_as_given_take_precedence(self, tmp_path, monkeypatch):
    local = tmp_path / 'models' / 'speculative.gin'
    local.parent.mkdir()
    local.write_text('VOCAB_SIZE = 11\n')
    monkeypatch.chdir(tmp_path)
    gin_utils.parse(['models/speculative.gin'], [])
    assert gin.query_parameter('%VOCAB_SIZE') == 11
    with pytest.raises(ValueError):
      gin.query_parameter('target/network.T5Config.dropout_rate')

  def test_absolute_path(self, tmp_path):
    path = tmp_path / 'x.gin'
    path.write_text('VALUE = 5\nUSES_OTHER = %OTHER\n')
    gin_utils.parse([str(path)], ['OTHER = 6'])
    assert gin.query_parameter('%VALUE') == 5
    assert gin.query_parameter('%OTHER') == 6

  def test_bindings_override_files(self):
    gin_utils.parse(['models/speculative.gin'], ['VOCAB_SIZE = 2'])
    assert gin.query_parameter('%VOCAB_SIZE') == 2

  def test_missing_file_raises(self):
    with pytest.raises(FileNotFoundError, match='no/such.gin') as e:
      gin_utils.parse(['models/speculative.gin', 'no/such.gin'], [])
    assert REPO_GIN_DIR in str(e.value) or gin_utils.REPO_GIN_DIR in str(e.value)

  def test_bindings_only_macro_changes_nothing(self):
    with pytest.raises(gin_utils.GinConfigError, match='no gin file uses macro A,'):
      gin_utils.parse([], ['A = 1'])

  def test_command_line_round_trip(self):
    files, bindings, rest = gin_utils.split_gin_args(
        ['--gin_file=models/speculative.gin', '--gin.VOCAB_SIZE=4'])
    assert rest == []
    gin_utils.parse(files, bindings)
    assert gin.query_parameter('%VOCAB_SIZE') == 4


class TestBindingsThatWouldChangeNothing:
  """A command-line binding that cannot take effect is one line naming it and the closest known name."""

  FILE = 'experiments/cpu/table2/ende_d1_t0.gin'  # uses GAMMA, OUTPUT_DIR, DRAFTER_CHECKPOINT, ...

  def _error(self, *bindings, files=None):
    with pytest.raises(gin_utils.GinConfigError) as e:
      gin_utils.parse(files or [self.FILE], ["OUTPUT_DIR = 'runs/x'"] + list(bindings))
    message = str(e.value)
    assert '\n' not in message  # one line: no config dump, no gin location trailer
    return message

  def test_a_misspelt_macro_names_the_one_meant(self):
    message = self._error('GAMA = 3')
    assert "binding 'GAMA = 3'" in message and 'no gin file uses macro GAMA' in message
    assert message.endswith('(did you mean GAMMA?).')

  def test_an_unused_macro_without_a_close_name(self):
    message = self._error('ZZZ_UNRELATED = 3')
    assert 'macro ZZZ_UNRELATED' in message and 'did you mean' not in message

  def test_a_used_macro_binds(self):
    gin_utils.parse([self.FILE], ["OUTPUT_DIR = 'runs/x'", 'GAMMA = 3'])
    assert gin.query_parameter('%GAMMA') == 3

  def test_a_macro_used_only_by_another_binding_binds(self):
    gin_utils.parse([self.FILE], ["OUTPUT_DIR = 'runs/x'", 'MY_GAMMA = 6', 'settings.Setting.gamma = %MY_GAMMA'])
    assert gin.query_parameter('%MY_GAMMA') == 6

  def test_a_misspelt_parameter(self):
    message = self._error('run_config.DataConfig.max_exampels = 3')
    assert 'run_config.DataConfig has no parameter max_exampels' in message
    assert message.endswith('(did you mean max_examples?).')

  def test_a_misspelt_configurable(self):
    message = self._error('mian.run.gamma = 3')
    assert 'no configurable mian.run' in message and message.endswith('(did you mean main.run?).')

  def test_an_unknown_configurable_without_a_close_name(self):
    message = self._error('nothing_like_it.fn.gamma = 3')
    assert message == ("binding 'nothing_like_it.fn.gamma = 3': no configurable nothing_like_it.fn in these gin "
                       'files.')

  def test_a_value_that_does_not_parse(self):
    assert 'is not a gin value' in self._error('settings.Setting.gamma = [1')
    assert 'is not a gin value' in self._error('settings.Setting.gamma = ')

  def test_a_macro_used_but_never_set_is_one_line(self):
    with pytest.raises(gin_utils.GinConfigError) as e:
      gin_utils.parse([self.FILE], [])  # OUTPUT_DIR unset
    assert str(e.value) == 'macro OUTPUT_DIR is used but never set: bind it, e.g. --gin.OUTPUT_DIR=VALUE.'

  def test_a_misspelt_macro_reference(self):
    message = self._error('settings.Setting.gamma = %GAMMMA')
    assert message.startswith('macro GAMMMA is used but never set') and message.endswith('(did you mean GAMMA?).')

  def test_a_renamed_parameter_names_its_new_name(self):
    with pytest.raises(gin_utils.GinConfigError) as e:
      gin_utils.parse([self.FILE], ["OUTPUT_DIR = 'runs/x'", 'old.fn.n = 3'], renamed={'old.fn.n': 'new.Config.n'})
    assert str(e.value) == "binding 'old.fn.n = 3': old.fn.n is now new.Config.n (--gin.new.Config.n=3)."

  @pytest.mark.parametrize('binding, now', [
      ('benchmark.Setting.gamma = 3', "benchmark.Setting.gamma is now settings.Setting.gamma "
                                      '(--gin.settings.Setting.gamma=3).'),
      ('scope/benchmark.Setting.seed = 1', 'scope/benchmark.Setting.seed is now scope/settings.Setting.seed '
                                           '(--gin.scope/settings.Setting.seed=1).'),
      ('run_config.RunConfig.decoding = @benchmark.Setting()',
       'benchmark.Setting is now settings.Setting (from specdec import settings; then settings.Setting.NAME = '
       'VALUE, @settings.Setting()).')])
  def test_a_moved_configurable_on_the_command_line_names_its_new_name(self, binding, now):
    assert self._error(binding) == f"binding '{binding}': {now}"

  @pytest.mark.parametrize('text, line', [
      ('benchmark.Setting.gamma = 3\n', 4),
      ('benchmark.Setting:\n  gamma = 3\n', 4),
      ('run_config.RunConfig.decoding = @benchmark.Setting()\n', 4)])
  def test_a_moved_configurable_in_a_gin_file_names_its_new_name(self, tmp_path, text, line):
    path = tmp_path / 'old.gin'
    path.write_text("include 'experiments/cpu/base.gin'\nfrom __gin__ import dynamic_registration\n"
                    'from specdec.bench import benchmark\n' + text)
    message = self._error(files=[str(path)])
    assert message == (f'{path}, line {line}: benchmark.Setting is now settings.Setting (from specdec import '
                       'settings; then settings.Setting.NAME = VALUE, @settings.Setting()).')

  def test_a_moved_configurable_in_an_included_file_names_the_file_it_is_in(self, tmp_path):
    (tmp_path / 'old.gin').write_text('from __gin__ import dynamic_registration\nfrom specdec.bench import benchmark\n'
                                      'benchmark.Setting.gamma = 3\n')
    (tmp_path / 'row.gin').write_text(f"include '{tmp_path / 'old.gin'}'\n")
    assert self._error(files=[str(tmp_path / 'row.gin')]).startswith(f"{tmp_path / 'old.gin'}, line 3: ")

  @pytest.mark.parametrize('name, package', [('train_config', 'specdec.training'), ('corpora', 'specdec.data'),
                                             ('tpu_programs', 'specdec.cloud_tpu')])
  def test_a_gin_file_importing_a_moved_module_names_its_new_path(self, tmp_path, name, package):
    path = tmp_path / 'old.gin'
    path.write_text(f'from __gin__ import dynamic_registration\nfrom specdec import {name}\n')
    assert self._error(files=[str(path)]) == (f'{path}, line 2: specdec.{name} is now {package}.{name} '
                                              f'(from {package} import {name}).')

  def test_every_moved_module_names_a_module_that_exists(self):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    missing = [now for now in gin_utils.MOVED_MODULES.values()
               if not os.path.isfile(os.path.join(repo, *now.split('.')) + '.py')]
    assert missing == []

  def test_a_missing_module_that_did_not_move_is_gins_own_error(self, tmp_path):
    path = tmp_path / 'typo.gin'
    path.write_text('from __gin__ import dynamic_registration\nfrom specdec import no_such_module\n')
    with pytest.raises(ModuleNotFoundError, match='no_such_module'):
      gin_utils.parse([str(path)], [])

  def test_train_bindings_are_checked_too(self):
    message = self._error('train_config.TrainConfig.num_stepz = 3', files=['train/cpu_target.gin'])
    assert message.endswith('(did you mean num_steps?).')

  def test_command_line_form(self):
    _, bindings, _ = gin_utils.split_gin_args(['--gin.GAMA=3'])
    assert 'GAMMA' in self._error(*bindings)


class TestMacroValues:

  def teardown_method(self):
    gin.clear_config()

  def test_the_macros_a_file_uses_with_their_values(self, tmp_path):
    path = tmp_path / 'x.gin'
    path.write_text('A = 5\nB = %A\nC = 7\nUSES = [%B, %UNSET]\n')
    values = gin_utils.macro_values([str(path)])
    assert set(values) == {'A', 'B', 'UNSET'}  # C is set but used nowhere
    assert values['A'] == 5 and repr(values['B']) == '%A' and values['UNSET'] is gin.REQUIRED
    assert not gin.config_str().strip()  # the config is left clear

  def test_the_main_job(self):
    values = gin_utils.macro_values(['experiments/cpu/main_job.gin'])
    assert {'GAMMA', 'ENDE_DRAFTER', 'SUMMARIZE_DRAFTER', 'OUTPUT_DIR', 'TARGET_CHECKPOINT', 'DRAFT_CONFIDENCE'} <= set(values)
