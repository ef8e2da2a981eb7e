"""Tests for specdec/fingerprint.py: recording what made an output directory, and refusing to resume another."""

import json
import os

import pytest

from specdec import fingerprint

OWNED = ('records.jsonl', 'summary.json')
BASE = {'outputs': 'predictions', 'task': 'ende', 'gamma': 4, 'temperature': 0.0, 'max_examples': 16,
        'feature_lengths': {'inputs': 96, 'targets': 48}}


def _with(**changes):
  return dict(BASE, **changes)


# -----------------------------------------------------------------------------
# differences
# -----------------------------------------------------------------------------


def test_same_fields_have_no_differences():
  assert fingerprint.differences(fingerprint.normalised(BASE), BASE) == []


@pytest.mark.parametrize('old, new', [(16, 32), (16, 16), (16, None), (None, None)])
def test_max_examples_may_grow(old, new):
  assert fingerprint.differences(_with(max_examples=old), _with(max_examples=new)) == []


@pytest.mark.parametrize('old, new', [(16, 4), (None, 16)])  # None: the whole split, more than any number
def test_max_examples_may_not_shrink(old, new):
  assert fingerprint.differences(_with(max_examples=old), _with(max_examples=new)) == [('max_examples', old, new)]


def test_differences_in_the_new_fingerprints_order_and_missing_fields_read_as_none():
  recorded = _with(gamma=2, temperature=1.0, extra_old='x')
  got = fingerprint.differences(recorded, _with(drafter='d1'))
  assert got == [('gamma', 2, 4), ('temperature', 1.0, 0.0), ('drafter', None, 'd1'), ('extra_old', 'x', None)]


def test_another_kind_of_output_differs_in_that_alone():
  assert fingerprint.differences(_with(outputs='benchmark', gamma=7), BASE) == [
      ('outputs', 'benchmark', 'predictions')]


def test_normalised_compares_tuples_and_int_keys_as_json_reads_them():
  fields = {'lengths': (('inputs', 8),), 'by_id': {1: 'a'}}
  assert fingerprint.normalised(fields) == {'lengths': [['inputs', 8]], 'by_id': {'1': 'a'}}


# -----------------------------------------------------------------------------
# problem, prepare, discard
# -----------------------------------------------------------------------------


def test_a_fresh_directory_is_prepared_and_records_the_fingerprint(tmp_path):
  out = tmp_path / 'out'
  assert fingerprint.problem(str(out), BASE, OWNED) is None
  recorded = fingerprint.prepare(str(out), BASE, OWNED)
  assert recorded == fingerprint.normalised(BASE) == fingerprint.read(str(out))
  assert json.loads((out / fingerprint.FILE_NAME).read_text()) == recorded


def test_a_mismatch_is_refused_in_one_line_naming_old_and_new_values(tmp_path):
  out = str(tmp_path)
  fingerprint.prepare(out, BASE, OWNED)
  with pytest.raises(fingerprint.ResumeRefused) as e:
    fingerprint.prepare(out, _with(gamma=2, task='summarize'), OWNED)
  message = str(e.value)
  assert message == (f"{out} holds outputs of another configuration: task 'ende' -> 'summarize', gamma 4 -> 2; "
                     f'{fingerprint.MAIN_REMEDY}.')
  assert fingerprint.read(out) == fingerprint.normalised(BASE)  # the record is left as it was


def test_shrinking_max_examples_says_it_may_only_grow(tmp_path):
  fingerprint.prepare(str(tmp_path), BASE, OWNED)
  with pytest.raises(fingerprint.ResumeRefused,
                     match=r'max_examples 16 -> 4 \(it holds up to 16 examples: max_examples may grow, not shrink\)'):
    fingerprint.prepare(str(tmp_path), _with(max_examples=4), OWNED)


def test_growing_max_examples_resumes_and_records_the_larger_number(tmp_path):
  fingerprint.prepare(str(tmp_path), BASE, OWNED)
  assert fingerprint.prepare(str(tmp_path), _with(max_examples=32), OWNED)['max_examples'] == 32
  assert fingerprint.read(str(tmp_path))['max_examples'] == 32
  with pytest.raises(fingerprint.ResumeRefused, match='max_examples 32 -> 16'):  # back down: it holds 32 now
    fingerprint.prepare(str(tmp_path), BASE, OWNED)


def test_outputs_without_a_fingerprint_are_refused_with_the_remedy(tmp_path):
  (tmp_path / 'records.jsonl').write_text('{"index": 0}\n')
  with pytest.raises(fingerprint.ResumeRefused) as e:
    fingerprint.prepare(str(tmp_path), BASE, OWNED, remedy='do X')
  assert str(e.value) == (f'{tmp_path} holds records.jsonl written without a fingerprint.json (before '
                          'fingerprints were recorded), so nothing says which settings made them; do X.')


def test_unowned_files_do_not_make_a_directory_an_old_output(tmp_path):
  (tmp_path / 'notes.txt').write_text('mine')
  assert fingerprint.problem(str(tmp_path), BASE, OWNED) is None


def test_overwrite_discards_only_the_owned_outputs_and_starts_afresh(tmp_path):
  fingerprint.prepare(str(tmp_path), BASE, OWNED)
  (tmp_path / 'records.jsonl').write_text('{"index": 0}\n')
  (tmp_path / 'summary.json').mkdir()  # an owned directory goes too
  (tmp_path / 'notes.txt').write_text('mine')
  recorded = fingerprint.prepare(str(tmp_path), _with(gamma=2), OWNED, overwrite=True)
  assert recorded['gamma'] == 2 and fingerprint.read(str(tmp_path))['gamma'] == 2
  assert sorted(os.listdir(tmp_path)) == ['fingerprint.json', 'notes.txt']


def test_long_digests_are_cut_in_messages(tmp_path):
  fingerprint.prepare(str(tmp_path), _with(target_content='sha256:' + 'a' * 64), OWNED)
  with pytest.raises(fingerprint.ResumeRefused) as e:
    fingerprint.prepare(str(tmp_path), _with(target_content='sha256:' + 'b' * 64), OWNED)
  assert f"target_content 'sha256:{'a' * 12}...' -> 'sha256:{'b' * 12}...'" in str(e.value)


# -----------------------------------------------------------------------------
# Checkpoint contents
# -----------------------------------------------------------------------------


def _compact(path, params=b'params', config='{"emb_dim": 16}'):
  path.mkdir(parents=True, exist_ok=True)
  (path / 'params.msgpack').write_bytes(params)
  (path / 'config.json').write_text(config)
  return str(path)


def test_file_sha256_is_the_sha256_of_the_bytes_and_follows_changes(tmp_path):
  path = tmp_path / 'f'
  path.write_bytes(b'abc')
  assert fingerprint.file_sha256(str(path)) == (
      'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad')  # sha256('abc')
  path.write_bytes(b'abcd')  # another size: the cache entry no longer applies
  assert fingerprint.file_sha256(str(path)) == (
      '88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589')


def test_checkpoint_digest_follows_the_model_files_not_the_path(tmp_path):
  a = _compact(tmp_path / 'a')
  b = _compact(tmp_path / 'b')  # same bytes elsewhere
  assert fingerprint.checkpoint_digest(a) == fingerprint.checkpoint_digest(b)
  assert fingerprint.checkpoint_digest(a).startswith('sha256:')
  changed = _compact(tmp_path / 'c', params=b'other params')
  assert fingerprint.checkpoint_digest(changed) != fingerprint.checkpoint_digest(a)
  (tmp_path / 'a' / 'MODEL_CARD.md').write_text('notes')  # not a model file
  assert fingerprint.checkpoint_digest(a) == fingerprint.checkpoint_digest(b)


def test_ngram_checkpoint_digest_uses_its_counts(tmp_path):
  d = tmp_path / 'bigram'
  d.mkdir()
  (d / 'counts.npz').write_bytes(b'1')
  first = fingerprint.checkpoint_digest(str(d))
  (d / 'counts.npz').write_bytes(b'22')
  assert fingerprint.checkpoint_digest(str(d)) != first


def test_other_formats_are_identified_by_file_names_and_sizes(tmp_path):
  d = tmp_path / 'checkpoint_7'
  (d / 'target').mkdir(parents=True)
  (d / 'checkpoint').write_bytes(b'x' * 10)
  (d / 'target' / '0.0').write_bytes(b'y' * 5)
  first = fingerprint.checkpoint_digest(str(d))
  assert first.startswith('files:')
  (d / 'target' / '0.0').write_bytes(b'y' * 6)
  assert fingerprint.checkpoint_digest(str(d)) != first


def test_remote_and_missing_checkpoints_have_no_digest(tmp_path):
  assert fingerprint.checkpoint_digest('gs://bucket/t5_1_1_xxl/checkpoint_1000000') is None
  assert fingerprint.checkpoint_digest(str(tmp_path / 'nothing')) is None


def test_models_fields_name_both_checkpoints_their_configs_and_dtype(tmp_path):
  target, drafter = _compact(tmp_path / 'target'), _compact(tmp_path / 'd1', params=b'drafter')
  fields = fingerprint.models_fields(target, drafter, target_config={'emb_dim': 16}, dtype='bfloat16')
  assert fields == {**fingerprint.checkpoint_fields('target', target),
                    **fingerprint.checkpoint_fields('drafter', drafter),
                    'target_config': fingerprint.short_digest({'emb_dim': 16}), 'drafter_config': None,
                    'dtype': 'bfloat16'}
  assert fingerprint.models_fields(target, None)['drafter_checkpoint'] is None


def test_checkpoint_fields(tmp_path):
  path = _compact(tmp_path / 'models' / 'd1')
  fields = fingerprint.checkpoint_fields('drafter', path + '/')
  assert fields == {'drafter_checkpoint': path, 'drafter_content': fingerprint.checkpoint_digest(path)}
  assert fingerprint.checkpoint_fields('drafter', None) == {'drafter_checkpoint': None, 'drafter_content': None}
  assert fingerprint.checkpoint_fields('target', 'gs://b/x')['target_checkpoint'] == 'gs://b/x'
