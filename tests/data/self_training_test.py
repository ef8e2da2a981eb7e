"""Tests of specdec/data/self_training.py (the mix of real rows and pseudo-pairs) and of
scripts/build_self_training_corpus.py on a fixture corpus."""

import json
import random
import os
import shutil
import sys

import pytest

from specdec import fileio
from specdec.data import self_training

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'scripts'))
import build_self_training_corpus  # pylint: disable=g-import-not-at-top,wrong-import-position

FIXTURE_CORPUS = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'testdata', 'tasks', 'corpus')
MODEL = 'models/cpu_v3/target'


def _row(text, decode, origin='ddtp:bookworm/main', package='pkg', **extra):
  return dict(inputs=text, targets=decode, source_package=package, package=package, kind='sentence',
              origin=origin, description_md5='0', **extra)


def test_pseudo_pairs_keep_only_new_inputs_with_a_decode():
  real = [_row('An old sentence here.', 'Ein alter Satz.', origin='ddtp')]
  decodes = [_row('An old  sentence here.', 'Alter Satz.', origin='corpus:train', gold_targets='Ein alter Satz.'),
             _row('An old sentence here.', 'Alter Satz.'),  # the real input again, from another list
             _row('A new sentence.', 'Ein neuer Satz.'),
             _row('A new  sentence.', 'Noch ein Satz.'),
             _row('No decode.', '  ')]
  pairs, dropped = self_training.pseudo_pairs(decodes, real, MODEL)
  assert [(p['inputs'], p['targets'], p['provenance']) for p in pairs] == [
      ('A new sentence.', 'Ein neuer Satz.', 'decode:' + MODEL)]
  assert dropped == {'real_train_input': 2, 'empty_decode': 1, 'repeated_input': 1}
  assert 'gold_targets' not in pairs[0]


def test_an_input_that_differs_from_a_real_one_only_in_case_is_not_a_pseudo_pair():
  # The held-out checks' key (distill_pool.leak_keys); matching up to whitespace alone would keep both of these.
  real = [_row('An old sentence here.', 'Ein alter Satz.', origin='ddtp')]
  decodes = [_row('AN OLD sentence  Here.', 'Alter Satz.'),
             _row('A new sentence.', 'Ein neuer Satz.'),
             _row('a NEW sentence.', 'Noch ein Satz.')]
  pairs, dropped = self_training.pseudo_pairs(decodes, real, MODEL)
  assert [p['inputs'] for p in pairs] == ['A new sentence.']
  assert dropped == {'real_train_input': 1, 'empty_decode': 0, 'repeated_input': 1}


def test_mix_adds_a_seeded_sample_and_keeps_every_real_row():
  real = [_row(f'real {i}', f'echt {i}') for i in range(20)]
  pairs = [dict(_row(f'new {i}', f'neu {i}'), provenance='decode:' + MODEL) for i in range(30)]
  rows = self_training.mix_train_rows(real, pairs, max_decodes=10, seed=3)
  assert self_training.provenance_counts(rows) == {'decode:' + MODEL: 10, 'real': 20}
  assert sorted(r['inputs'] for r in rows if r['provenance'] == 'real') == sorted(r['inputs'] for r in real)
  assert rows == self_training.mix_train_rows(real, pairs, max_decodes=10, seed=3)
  other = self_training.mix_train_rows(real, pairs, max_decodes=10, seed=4)
  assert {r['inputs'] for r in other} != {r['inputs'] for r in rows}
  assert [r['inputs'] for r in rows[:20]] != [r['inputs'] for r in real]  # shuffled in, not appended
  assert len(self_training.mix_train_rows(real, pairs, max_decodes=100, seed=0)) == 50
  with pytest.raises(ValueError, match='max_decodes must be >= 0'):
    self_training.mix_train_rows(real, pairs, max_decodes=-1, seed=0)


def test_a_pseudo_pair_of_a_held_out_package_or_text_is_refused():
  held = [_row('A held-out sentence of a package.', 'x', package='held')]
  self_training.check_no_leak([_row('Another sentence.', 'y')], held)
  for leak in (_row('Another sentence.', 'y', package='held'), _row('a held-out  SENTENCE of a package.', 'y')):
    with pytest.raises(ValueError, match='leak into the validation/test splits'):
      self_training.check_no_leak([leak], held)


def _decodes_dir(tmp_path, rows, model=MODEL):
  out = tmp_path / 'decodes'
  (out / 'translate_en_de').mkdir(parents=True)
  fileio.write_jsonl(str(out / 'translate_en_de' / 'train.jsonl'), rows)
  (out / 'manifest.json').write_text(json.dumps({'model': model}))
  return out


def test_the_script_writes_the_mix_and_copies_everything_else(tmp_path):
  real = tmp_path / 'real'
  shutil.copytree(FIXTURE_CORPUS, real)
  (real / 'manifest.json').write_text('{}')
  first_real = fileio.read_jsonl(str(real / 'translate_en_de' / 'train.jsonl'))[0]
  decodes = _decodes_dir(tmp_path, [_row(f'Fresh pool sentence number {i}.', f'Satz {i}.') for i in range(5)]
                         + [_row(first_real['inputs'], 'Anders.', origin='corpus:train')])
  out = tmp_path / 'self'
  build_self_training_corpus.main(['--real', str(real), '--decodes', str(decodes), '--out', str(out),
                                   '--max_decodes', '3'])
  manifest = json.loads((out / 'manifest.json').read_text())
  assert manifest['train_rows'] == {'decode:' + MODEL: 3, 'real': 6}
  assert manifest['pseudo_pairs_available'] == 5 and manifest['left_out']['real_train_input'] == 1
  assert manifest['command'].startswith('python scripts/build_self_training_corpus.py --real ')
  for rel, sha in manifest['files'].items():
    assert fileio.file_sha256(str(out / rel)) == sha
    if rel != 'translate_en_de/train.jsonl':
      assert (out / rel).read_bytes() == (real / rel).read_bytes()
  assert not (tmp_path / 'self.partial').exists()
  assert manifest['input_noise'] == {'drop': 0.0, 'shuffle_k': 0}
  noisy = tmp_path / 'noisy'
  build_self_training_corpus.main(['--real', str(real), '--decodes', str(decodes), '--out', str(noisy),
                                   '--max_decodes', '3', '--noise_drop', '0.2', '--noise_shuffle_k', '2'])
  rows = fileio.read_jsonl(str(noisy / 'translate_en_de' / 'train.jsonl'))
  assert all(('clean_inputs' in r) == (r['provenance'] != 'real') for r in rows)
  assert json.loads((noisy / 'manifest.json').read_text())['input_noise'] == {'drop': 0.2, 'shuffle_k': 2}
  with pytest.raises(SystemExit):  # exists: refused without --overwrite
    build_self_training_corpus.main(['--real', str(real), '--decodes', str(decodes), '--out', str(out),
                                     '--max_decodes', '3'])


def test_the_script_refuses_decodes_that_name_no_model_before_writing(tmp_path):
  real = tmp_path / 'real'
  shutil.copytree(FIXTURE_CORPUS, real)
  (real / 'manifest.json').write_text('{}')
  decodes = _decodes_dir(tmp_path, [_row('Fresh.', 'Frisch.')], model=None)
  with pytest.raises(ValueError, match='names no model'):
    build_self_training_corpus.main(['--real', str(real), '--decodes', str(decodes), '--out',
                                     str(tmp_path / 'self'), '--max_decodes', '3'])
  assert not (tmp_path / 'self').exists()


def test_noise_drops_words_and_moves_none_more_than_k_places():
  rng = random.Random(0)
  words = [f'w{i}' for i in range(40)]
  dropped = 0
  for _ in range(200):
    out = self_training.noised(' '.join(words), rng, drop=0.1, shuffle_k=3).split()
    kept = [w for w in words if w in out]
    dropped += len(words) - len(out)
    assert sorted(out, key=words.index) == kept  # a subset, each word once
    assert all(abs(out.index(w) - kept.index(w)) <= 3 for w in out)
  assert 0.08 < dropped / (200 * 40) < 0.12  # 8,000 draws of p = 0.1: sd 0.0034
  assert self_training.noised('a b c d', rng, drop=0.0, shuffle_k=0) == 'a b c d'
  assert self_training.noised('alone', rng, drop=0.99, shuffle_k=3) == 'alone'  # one word is always kept
  with pytest.raises(ValueError, match='noise needs'):
    self_training.noised('a b', rng, drop=1.0)


def test_noised_pairs_keep_their_clean_input_and_are_seeded():
  pairs = [dict(_row(f'one two three four five six {i}', f'eins {i}'), provenance='decode:' + MODEL)
           for i in range(10)]
  noisy = self_training.noise_inputs(pairs, seed=1)
  assert [p['clean_inputs'] for p in noisy] == [p['inputs'] for p in pairs]
  assert [p['targets'] for p in noisy] == [p['targets'] for p in pairs]
  assert noisy == self_training.noise_inputs(pairs, seed=1)
  assert [p['inputs'] for p in noisy] != [p['inputs'] for p in pairs]
