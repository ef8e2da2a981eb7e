"""Tests for specdec/settings.py: the decoder settings, their validation and the decode functions' arguments."""

import numpy as np
import pytest

from specdec import decoding
from specdec import settings


@pytest.mark.parametrize('setting, match', [
    (settings.Setting(gamma=0), 'gamma must be an int >= 1, got 0'),
    (settings.Setting(gamma=True), 'gamma must be an int >= 1, got True'),
    (settings.Setting(gamma=2.5), 'gamma must be an int >= 1, got 2.5'),
    (settings.Setting(gamma='Auto'), "gamma must be an int >= 1 or 'auto', got 'Auto'"),
    (settings.Setting(gamma='3'), "gamma must be an int >= 1 or 'auto', got '3'"),
    (settings.Setting(temperature=-0.5), 'temperature'),
    (settings.Setting(temperature=1.0, topk=5, topp=0.9), 'top-k or top-p'),
    (settings.Setting(draft_confidence=1.0), r'draft_confidence must be a float in \[0, 1\)'),
    (settings.Setting(repeats=0), 'batch_size and repeats must be >= 1, got 1, 0'),
    (settings.Setting(batch_size=0), 'batch_size and repeats must be >= 1, got 0, 3'),
])
def test_a_bad_setting_is_one_line_naming_it(setting, match):
  with pytest.raises(ValueError, match=match) as e:
    setting.validate()
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('kwargs', [
    dict(gamma=0), dict(gamma=2.0), dict(temperature=-0.5), dict(topk=5, topp=0.9), dict(draft_confidence=1.0)])
def test_the_words_are_the_decode_loops(kwargs):
  """A setting the loops cannot run with is refused in the loops' own words (`decoding.validate_settings`)."""
  with pytest.raises(ValueError) as loops:
    decoding.validate_settings(**kwargs)
  with pytest.raises(ValueError) as ours:
    settings.Setting(**{'gamma': 1, **kwargs}).validate()
  assert str(ours.value) == str(loops.value)


@pytest.mark.parametrize('setting', [
    settings.Setting(), settings.Setting(gamma=settings.AUTO), settings.Setting(gamma=np.int32(3)),
    settings.Setting(gamma=1, temperature=1.0, topp=0.9, draft_confidence=0.5, batch_size=8, repeats=1)])
def test_good_settings_pass(setting):
  setting.validate()


def test_auto_is_the_exact_string():
  assert settings.is_auto('auto') and settings.AUTO == 'auto'
  assert not any(settings.is_auto(g) for g in ('Auto', 'auto ', 5, None))


def test_the_decode_functions_arguments():
  setting = settings.Setting(gamma=3, temperature=1, topk=40, batch_size=4)
  assert setting.decoder_params() == {'temperature': 1.0, 'topk': 40, 'topp': 0.0}
  assert setting.speculative_params() == {'temperature': 1.0, 'topk': 40, 'topp': 0.0, 'gamma': 3,
                                          'return_stats': True}
  adaptive = settings.Setting(gamma=4, draft_confidence=0.5).speculative_params()
  assert adaptive['draft_confidence'] == 0.5 and adaptive['gamma'] == 4


def test_auto_has_no_decoder_until_chosen():
  with pytest.raises(ValueError, match="gamma='auto' is resolved by benchmark.run before any decoder is compiled"):
    settings.Setting(gamma=settings.AUTO).speculative_params()
  assert settings.Setting(gamma=settings.AUTO).decoder_params() == settings.Setting().decoder_params()
