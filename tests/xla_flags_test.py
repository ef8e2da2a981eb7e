"""Tests for specdec/xla_flags.py: the quicker XLA:CPU settings are added only where not set, and only if XLA
takes them."""

from specdec import xla_flags


def test_the_optimisation_level_is_added_unless_set(monkeypatch):
  monkeypatch.setattr(xla_flags, 'accepted', lambda flags: False)
  assert xla_flags.fast_compile('') == xla_flags.OPT_LEVEL_FLAG
  assert xla_flags.fast_compile('--xla_backend_optimization_level=2') == '--xla_backend_optimization_level=2'


def test_the_code_generation_flags_are_added_only_where_xla_takes_them(monkeypatch):
  monkeypatch.setattr(xla_flags, 'accepted', lambda flags: True)
  assert xla_flags.fast_compile('--a=1').split() == ['--a=1', xla_flags.OPT_LEVEL_FLAG, *xla_flags.FAST_CODEGEN_FLAGS]
  monkeypatch.setattr(xla_flags, 'accepted', lambda flags: False)
  assert xla_flags.fast_compile('--a=1').split() == ['--a=1', xla_flags.OPT_LEVEL_FLAG]


def test_a_flag_already_set_is_kept_as_given(monkeypatch):
  monkeypatch.setattr(xla_flags, 'accepted', lambda flags: True)
  given = '--xla_cpu_use_fusion_emitters=true'
  assert xla_flags.fast_compile(given) == f'{given} {xla_flags.OPT_LEVEL_FLAG}'


def test_xla_refuses_a_flag_it_does_not_know():
  assert not xla_flags.accepted('--xla_no_such_flag_anywhere=1')
