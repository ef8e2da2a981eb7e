"""Tests of specdec/draft_vocab.py (choosing trimmed draft vocabularies) and of scripts/draft_vocab.py."""

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

from specdec import draft_vocab

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE_CORPUS = os.path.join(REPO, 'tests', 'testdata', 'tasks', 'corpus')


# -----------------------------------------------------------------------------
# token_counts
# -----------------------------------------------------------------------------


def test_token_counts_skips_padding_and_takes_ragged_or_2d_input():
  ragged = [[5, 3, 3, 1], [3, 1], []]
  counts = draft_vocab.token_counts(ragged, 8)
  assert counts.dtype == np.int64 and counts.shape == (8,)
  assert counts.tolist() == [0, 2, 0, 3, 0, 1, 0, 0]
  padded = np.array([[5, 3, 3, 1], [3, 1, 0, 0]])
  np.testing.assert_array_equal(draft_vocab.token_counts(padded, 8), counts)
  assert draft_vocab.token_counts([], 4).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize('bad', [[[1, 8]], [[-1, 2]]])
def test_token_counts_refuses_ids_outside_the_vocabulary(bad):
  with pytest.raises(ValueError, match=r'outside \[0, 8\)'):
    draft_vocab.token_counts(bad, 8)


# -----------------------------------------------------------------------------
# top_ids
# -----------------------------------------------------------------------------


def test_top_ids_takes_the_most_frequent_sorted_int32():
  counts = np.array([0, 0, 9, 1, 7, 0, 8, 2])
  ids = draft_vocab.top_ids(counts, 3, always=())
  assert ids.dtype == np.int32
  assert ids.tolist() == [2, 4, 6]


def test_top_ids_breaks_ties_by_the_smaller_id():
  counts = np.array([0, 0, 5, 3, 5, 3, 5, 0])
  assert draft_vocab.top_ids(counts, 2, always=()).tolist() == [2, 4]
  assert draft_vocab.top_ids(counts, 4, always=()).tolist() == [2, 3, 4, 6]
  # Unseen ids fill up, smallest first (padding 0 among them when nothing else is left).
  assert draft_vocab.top_ids(np.array([0, 0, 0, 4]), 2, always=()).tolist() == [0, 3]


def test_top_ids_always_keeps_eos_and_counts_it_within_k():
  counts = np.array([0, 0, 9, 1, 7, 0, 8, 2])  # EOS (1) is rare
  assert draft_vocab.top_ids(counts, 3).tolist() == [1, 2, 6]  # default always=(1,)
  assert draft_vocab.top_ids(counts, 1).tolist() == [1]
  assert draft_vocab.top_ids(counts, 3, always=(7, 1, 7)).tolist() == [1, 2, 7]
  # EOS frequent anyway: not taken twice.
  assert draft_vocab.top_ids(np.array([0, 9, 5, 1]), 2).tolist() == [1, 2]


@pytest.mark.parametrize('k, always, match', [
    (0, (1,), r'k must be in \[1, 8\]'),
    (-2, (), r'k must be in \[1, 8\]'),
    (9, (1,), r'k must be in \[1, 8\]'),
    (1, (1, 2), 'smaller than the 2 ids always kept'),
    (2, (8,), r'outside \[0, 8\)'),
])
def test_top_ids_refuses_bad_k_and_always(k, always, match):
  with pytest.raises(ValueError, match=match):
    draft_vocab.top_ids(np.ones(8), k, always=always)


def test_top_ids_of_the_whole_vocabulary_is_every_id():
  assert draft_vocab.top_ids(np.array([0, 1, 0, 3]), 4).tolist() == [0, 1, 2, 3]


# -----------------------------------------------------------------------------
# coverage
# -----------------------------------------------------------------------------


def test_coverage_is_the_share_of_non_padding_tokens_in_ids():
  seqs = [[5, 3, 3, 1], [3, 1, 0, 0], [7]]
  assert draft_vocab.coverage([1, 3], seqs) == pytest.approx(5 / 7)
  assert draft_vocab.coverage(np.array([5, 7]), np.array([[5, 7, 0], [2, 0, 0]])) == pytest.approx(2 / 3)
  assert draft_vocab.coverage([0, 2], [[1, 0]]) == 0.0  # padding in ids does not count
  with pytest.raises(ValueError, match='no tokens'):
    draft_vocab.coverage([1], [[0, 0], []])


def test_coverage_of_top_ids_on_their_own_counts_grows_with_k():
  rng = np.random.default_rng(0)
  seqs = [rng.zipf(1.5, size=20) % 50 for _ in range(30)]
  counts = draft_vocab.token_counts(seqs, 50)
  covs = [draft_vocab.coverage(draft_vocab.top_ids(counts, k), seqs) for k in (1, 5, 10, 25, 50)]
  assert covs == sorted(covs) and covs[-1] == 1.0
  ids = draft_vocab.top_ids(counts, 10)
  assert covs[2] == pytest.approx(counts[ids].sum() / counts.sum())


# -----------------------------------------------------------------------------
# save_ids / load_ids
# -----------------------------------------------------------------------------


def test_ids_round_trip_as_a_json_list(tmp_path):
  path = str(tmp_path / 'sub' / 'top3.json')  # the folder is made
  draft_vocab.save_ids(path, np.array([1, 4, 9], np.int32))
  with open(path) as f:
    assert json.load(f) == [1, 4, 9]
  assert not [name for name in os.listdir(tmp_path / 'sub') if name != 'top3.json']  # no temp file left
  ids = draft_vocab.load_ids(path)
  assert ids.dtype == np.int32 and ids.tolist() == [1, 4, 9]
  assert draft_vocab.load_ids(path, vocab_size=10).tolist() == [1, 4, 9]
  draft_vocab.save_ids(path, [2, 3])  # a list too; overwrites
  assert draft_vocab.load_ids(path).tolist() == [2, 3]


def test_load_ids_matches_what_feature_training_reads(tmp_path):
  from specdec.training import feature_training  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'top4.json')
  draft_vocab.save_ids(path, draft_vocab.top_ids(np.array([0, 1, 5, 0, 2, 7]), 4))
  np.testing.assert_array_equal(feature_training.read_draft_vocab(path, 6), draft_vocab.load_ids(path, 6))


@pytest.mark.parametrize('ids', [[3, 1], [1, 1, 2], [], [-1, 2], [1.0, 2.0], [True, 2]])
def test_save_ids_refuses_what_a_drafter_would_refuse(tmp_path, ids):
  with pytest.raises(ValueError):
    draft_vocab.save_ids(str(tmp_path / 'x.json'), ids)
  assert not os.path.exists(tmp_path / 'x.json')


@pytest.mark.parametrize('text, vocab_size, match', [
    ('[3, 1, 2]', None, 'sorted ascending and unique'),
    ('[1, 2, 2]', 10, 'sorted ascending and unique'),
    ('[1, 2, 10]', 10, r'outside \[0, 10\)'),
    ('[1, 2.5]', None, 'list of int token ids'),
    ('[]', None, 'list of int token ids'),
    ('{"ids": [1, 2]}', None, 'not a JSON list'),
    ('[1, 2', None, 'not a JSON list'),
])
def test_load_ids_refuses_bad_files_naming_them(tmp_path, text, vocab_size, match):
  path = tmp_path / 'bad.json'
  path.write_text(text)
  with pytest.raises(ValueError, match=match) as e:
    draft_vocab.load_ids(str(path), vocab_size=vocab_size)
  assert str(path) in str(e.value)


def test_load_ids_without_a_file(tmp_path):
  with pytest.raises(FileNotFoundError, match='No draft vocabulary file'):
    draft_vocab.load_ids(str(tmp_path / 'missing.json'))


# -----------------------------------------------------------------------------
# scripts/draft_vocab.py
# -----------------------------------------------------------------------------


def _script():
  spec = importlib.util.spec_from_file_location('draft_vocab_script',
                                                os.path.join(REPO, 'scripts', 'draft_vocab.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_script_helpers():
  script = _script()
  assert script.decode_ids(np.array([4, 7, 1, 0, 0])).tolist() == [4, 7, 1]
  assert script.decode_ids(np.array([4, 0, 7, 1, 5, 1])).tolist() == [4, 7, 1]  # to the first EOS
  assert script.decode_ids(np.array([4, 7, 9])).tolist() == [4, 7, 9]  # no EOS: the whole row
  seqs = script.corpus_sequences(['ab', ''], lambda t: [ord(c) - 90 for c in t])
  assert [s.tolist() for s in seqs] == [[7, 8, 1], [1]]
  counts = {'a': draft_vocab.token_counts([[2, 2, 3, 1]], 6), 'b': draft_vocab.token_counts([[4, 1]], 6)}
  (ids, row), = script.measure([2], counts, {'a': [np.array([2, 5, 1])], 'b': [np.array([4, 1])]})
  assert ids.tolist() == [1, 2]
  assert row['corpus_coverage'] == {'a': 0.75, 'b': 0.5} and row['corpus_coverage_all'] == pytest.approx(4 / 6)
  assert row['coverage'] == {'a': pytest.approx(2 / 3), 'b': 0.5} and row['coverage_all'] == pytest.approx(3 / 5)
  inside = os.path.join(script.ROOT, 'models', 'x')
  assert script.relative(inside) == os.path.join('models', 'x')
  assert script.relative('/elsewhere/y') == '/elsewhere/y'
  assert script.command_line(['--model', inside, f'--out_dir={inside}', '--k', '4']) == (
      'python scripts/draft_vocab.py --model models/x --out_dir=models/x --k 4')


def test_script_on_the_fixture_corpus_with_a_tiny_random_target(tmp_path, capsys):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec import checkpoints, network, tasks  # pylint: disable=g-import-not-at-top
  config = network.T5Config(vocab_size=8192, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                            num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0, dtype=jnp.float32)
  model_dir = str(tmp_path / 'target')
  checkpoints.save_compact(model_dir, config, network.init_params(config, jax.random.PRNGKey(0)),
                           storage_dtype=jnp.float32)
  out_dir, ids_dir = tmp_path / 'results', tmp_path / 'ids'
  default_corpus = tasks.DEFAULT_CORPUS_DIR
  try:
    record = _script().main(['--corpus', FIXTURE_CORPUS, '--model', model_dir, '--k', '16', '4', '8192',
                             '--heldout', '2', '--batch_size', '2', '--inputs_length', '32',
                             '--targets_length', '8', '--out_dir', str(out_dir), '--ids_dir', str(ids_dir)])
  finally:
    tasks.register_local_tasks(corpus_dir=default_corpus)
  printed = capsys.readouterr().out
  assert 'no distillation manifest' in printed and 'held-out inputs decoded' in printed

  # The id files: K ids, EOS among them, sorted; the most frequent tokens of the corpus's targets.
  ids4, ids16 = draft_vocab.load_ids(str(ids_dir / 'top4.json'), 8192), draft_vocab.load_ids(
      str(ids_dir / 'top16.json'), 8192)
  assert len(ids4) == 4 and len(ids16) == 16 and 1 in ids4 and set(ids4) <= set(ids16)
  assert len(draft_vocab.load_ids(str(ids_dir / 'top8192.json'))) == 8192
  vocab = tasks.get_vocabulary()
  seqs = []
  for task_dir in ('translate_en_de', 'summarize_ddtp'):
    with open(os.path.join(FIXTURE_CORPUS, task_dir, 'train.jsonl'), encoding='utf-8') as f:
      seqs += [vocab.encode(json.loads(line)['targets']) + [1] for line in f]
  counts = draft_vocab.token_counts(seqs, 8192)
  np.testing.assert_array_equal(ids16, draft_vocab.top_ids(counts, 16))
  assert record['counts']['decodes_all'] == len(seqs) == 12
  assert record['counts']['tokens_all'] == sum(len(s) for s in seqs)

  # The records and the table.
  with open(out_dir / 'draft_vocab.json') as f:
    assert json.load(f) == record
  assert [row['k'] for row in record['rows']] == [4, 16, 8192]
  for task_dir in ('translate_en_de', 'summarize_ddtp'):
    assert record['heldout'][task_dir]['decodes'] == 2 and 0 < record['heldout'][task_dir]['tokens'] <= 16
    covs = [row['coverage'][task_dir] for row in record['rows']]
    assert covs == sorted(covs) and covs[-1] == 1.0
  assert record['rows'][1]['corpus_coverage_all'] == pytest.approx(draft_vocab.coverage(ids16, seqs))
  assert record['command'].startswith('python scripts/draft_vocab.py --corpus tests/testdata/tasks/corpus ')
  assert record['corpus'] == os.path.join('tests', 'testdata', 'tasks', 'corpus')
  table = (out_dir / 'draft_vocab.md').read_text()
  assert '| K | held-out En→De |' in table and '| 8192 | 100.0% | 100.0% | 100.0% |' in table
  assert 'exceeds the' in table  # K = 8192 > the ids seen


def test_script_says_what_the_corpus_holds(tmp_path):
  script = _script()
  said = []
  assert script.corpus_decoding(str(tmp_path), 'models/t', said.append) == 'not a distillation corpus'
  assert 'no distillation manifest' in said.pop()
  (tmp_path / 'manifest.json').write_text(json.dumps(
      {'model': 'models/t', 'decoding': 'greedy', 'fingerprint': {}}))
  assert script.corpus_decoding(str(tmp_path), 'models/t', said.append) == 'greedy of models/t'
  assert not said
  script.corpus_decoding(str(tmp_path), 'models/other', said.append)
  assert 'holds decodes of models/t, not of --model models/other' in said.pop()


def test_script_counts_only_the_tasks_asked_for(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec import checkpoints, network, tasks  # pylint: disable=g-import-not-at-top
  config = network.T5Config(vocab_size=8192, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                            num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0, dtype=jnp.float32)
  model_dir = str(tmp_path / 'target')
  checkpoints.save_compact(model_dir, config, network.init_params(config, jax.random.PRNGKey(0)),
                           storage_dtype=jnp.float32)
  # A corpus holding only the En->De task's decodes: the other task's folder is absent.
  corpus = tmp_path / 'corpus'
  shutil.copytree(os.path.join(FIXTURE_CORPUS, 'translate_en_de'), corpus / 'translate_en_de')
  default_corpus = tasks.DEFAULT_CORPUS_DIR
  args = ['--corpus', str(corpus), '--model', model_dir, '--k', '4', '--heldout', '0',
          '--out_dir', str(tmp_path / 'results'), '--ids_dir', str(tmp_path / 'ids')]
  try:
    with pytest.raises(SystemExit, match='summarize_ddtp/train.jsonl'):
      _script().main(args)
    record = _script().main(args + ['--tasks', 'translate_en_de'])
  finally:
    tasks.register_local_tasks(corpus_dir=default_corpus)
  vocab = tasks.get_vocabulary()
  with open(corpus / 'translate_en_de' / 'train.jsonl', encoding='utf-8') as f:
    seqs = [vocab.encode(json.loads(line)['targets']) + [1] for line in f]
  assert list(record['counts']['decodes']) == ['translate_en_de']
  assert record['counts']['decodes_all'] == len(seqs)
  np.testing.assert_array_equal(draft_vocab.load_ids(str(tmp_path / 'ids' / 'top4.json'), 8192),
                                draft_vocab.top_ids(draft_vocab.token_counts(seqs, 8192), 4))
  table = (tmp_path / 'results' / 'draft_vocab.md').read_text()
  assert 'En→De decodes only' in table and 'both' not in table
