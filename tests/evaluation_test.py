"""Tests for specdec/evaluation.py on the fixture corpus (no model needed).

`decode_and_score` is driven by fake `predict` functions: one that returns
the reference target ids of each input row (perfect scores), one that returns
garbage (low scores).
"""

import json
import os

import jax
import numpy as np
import pytest

from specdec.data import corpora
from specdec import evaluation
from specdec import settings
from specdec import tasks

TESTDATA = os.path.join(os.path.dirname(__file__), 'testdata', 'tasks')
FIXTURE_CORPUS = os.path.join(TESTDATA, 'corpus')
# The fixture rows fit these lengths untrimmed (see testdata/tasks/README.md).
LENGTHS = {'inputs': 64, 'targets': 32}
# Long enough for every row of every split untrimmed.
WIDE = {'inputs': 128, 'targets': 64}
EOS = 1

TASKS = {
    tasks.ENDE_LOCAL_TASK: (corpora.TRANSLATION_CORPUS, corpora.TRANSLATE_PREFIX),
    tasks.SUMMARIZE_LOCAL_TASK: (corpora.SUMMARIZATION_CORPUS,
                                 corpora.SUMMARIZE_PREFIX),
}


@pytest.fixture(scope='module', autouse=True)
def local_tasks():
  """Registers the local tasks on the fixture corpus; restores the defaults."""
  names = tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS)
  yield names
  tasks.register_local_tasks()


def _rows(corpus, split):
  with open(os.path.join(FIXTURE_CORPUS, corpus, f'{split}.jsonl')) as f:
    return [json.loads(line) for line in f if line.strip()]


def _strip(ids):
  return [int(i) for i in ids if int(i) not in (0,)]


# -----------------------------------------------------------------------------
# task_examples
# -----------------------------------------------------------------------------


class TestTaskExamples:

  @pytest.mark.parametrize('task_name', sorted(TASKS))
  @pytest.mark.parametrize('split', ['train', 'validation', 'test'])
  def test_rows_in_file_order(self, task_name, split):
    corpus, prefix = TASKS[task_name]
    rows = _rows(corpus, split)
    examples = evaluation.task_examples(task_name, split, WIDE)
    assert len(examples) == len(rows)
    vocab = tasks.get_vocabulary()
    for ex, row in zip(examples, rows):
      assert {'inputs', 'targets', 'inputs_pretokenized',
              'targets_pretokenized'} <= set(ex)
      assert ex['inputs_pretokenized'].decode('utf-8') == prefix + row['inputs']
      assert ex['targets_pretokenized'].decode('utf-8') == row['targets']
      # Tokenized, EOS-terminated, within the feature lengths.
      for key in ('inputs', 'targets'):
        ids = np.asarray(ex[key])
        assert ids.dtype == np.int32
        assert 1 < len(ids) < WIDE[key]
        assert ids[-1] == EOS and EOS not in ids[:-1]
      assert vocab.decode(ex['inputs'].tolist()) == prefix + row['inputs']
      assert vocab.decode(ex['targets'].tolist()) == row['targets']
      np.testing.assert_array_equal(
          ex['targets'][:-1], vocab.encode(row['targets']))

  def test_max_examples(self):
    all_examples = evaluation.task_examples(tasks.ENDE_LOCAL_TASK, 'train', LENGTHS)
    first = evaluation.task_examples(tasks.ENDE_LOCAL_TASK, 'train', LENGTHS,
                                     max_examples=2)
    assert len(all_examples) == 6 and len(first) == 2
    for a, b in zip(first, all_examples[:2]):
      assert a['inputs_pretokenized'] == b['inputs_pretokenized']
      np.testing.assert_array_equal(a['targets'], b['targets'])
    more = evaluation.task_examples(tasks.ENDE_LOCAL_TASK, 'train', LENGTHS,
                                    max_examples=100)
    assert len(more) == 6

  def test_order_is_deterministic(self):
    a = evaluation.task_examples(tasks.SUMMARIZE_LOCAL_TASK, 'train', LENGTHS)
    b = evaluation.task_examples(tasks.SUMMARIZE_LOCAL_TASK, 'train', LENGTHS)
    assert [x['inputs_pretokenized'] for x in a] == [
        x['inputs_pretokenized'] for x in b]

  def test_short_lengths_trim_with_eos(self):
    examples = evaluation.task_examples(
        tasks.SUMMARIZE_LOCAL_TASK, 'validation', {'inputs': 8, 'targets': 4})
    for ex in examples:
      assert len(ex['inputs']) <= 8 and ex['inputs'][-1] == EOS
      assert len(ex['targets']) <= 4 and ex['targets'][-1] == EOS


# -----------------------------------------------------------------------------
# bucket_length, batches, num_tokens
# -----------------------------------------------------------------------------


@pytest.mark.parametrize('length, max_length, expected', [
    (1, 96, 8), (8, 96, 8), (9, 96, 16), (17, 96, 32), (33, 96, 64), (65, 96, 96), (96, 96, 96),
    (20, 16, 16),  # the bucket (32) is capped at the configured length
    (97, 128, 128), (129, 512, 192), (5000, 8192, 8192),  # past the last bucket: the configured length
])
def test_bucket_length(length, max_length, expected):
  assert evaluation.bucket_length(length, max_length) == expected


def test_bucket_length_without_buckets_is_the_configured_length():
  assert evaluation.bucket_length(3, 96, use_buckets=False) == 96
  assert evaluation.bucket_length(96, 96, use_buckets=False) == 96


def _fake_examples(lengths):
  return [{'inputs': np.arange(2, 2 + n, dtype=np.int32) + 10 * i, 'id': i}
          for i, n in enumerate(lengths)]


class TestBatches:

  def test_groups_pads_and_buckets(self):
    examples = _fake_examples([3, 12, 5, 40, 7])
    batches = evaluation.batches(examples, {'inputs': 32, 'targets': 6}, 2, use_buckets=True)
    assert [idx for idx, _ in batches] == [[0, 1], [2, 3], [4]]
    # Padded to the bucket of the longest input of each batch: 12 -> 16; 40 -> 64 capped at 32; 7 -> 8.
    assert [b['encoder_input_tokens'].shape for _, b in batches] == [(2, 16), (2, 32), (2, 8)]
    for idx, batch in batches:
      assert set(batch) == {'encoder_input_tokens', 'decoder_input_tokens'}
      assert batch['encoder_input_tokens'].dtype == np.int32
      np.testing.assert_array_equal(batch['decoder_input_tokens'], np.zeros((2, 6), np.int32))
      enc = batch['encoder_input_tokens']
      for row, i in enumerate(idx):
        tokens = examples[i]['inputs'][:enc.shape[1]]
        np.testing.assert_array_equal(enc[row, :len(tokens)], tokens)
        assert not enc[row, len(tokens):].any()  # zero padding
    # The long input is cut at the configured length.
    np.testing.assert_array_equal(batches[1][1]['encoder_input_tokens'][1], examples[3]['inputs'][:32])
    # The last, partial batch keeps the batch shape: its missing row is all zeros.
    assert not batches[2][1]['encoder_input_tokens'][1].any()

  def test_without_buckets_and_batch_one(self):
    batches = evaluation.batches(_fake_examples([3, 12, 5]), {'inputs': 20, 'targets': 4}, 1, use_buckets=False)
    assert [idx for idx, _ in batches] == [[0], [1], [2]]
    assert all(b['encoder_input_tokens'].shape == (1, 20) for _, b in batches)
    assert all(b['decoder_input_tokens'].shape == (1, 4) for _, b in batches)

  def test_unbucketed_pads_last_batch_with_empty_rows(self):
    out = evaluation.batches(_fake_examples([3, 5, 1, 4, 2]), {'inputs': 6, 'targets': 4}, 2, use_buckets=False)
    assert len(out) == 3
    for _, batch in out:
      assert batch['encoder_input_tokens'].shape == (2, 6)
      assert batch['decoder_input_tokens'].shape == (2, 4)
      assert batch['decoder_input_tokens'].dtype == np.int32
      assert not batch['decoder_input_tokens'].any()
    assert [idx for idx, _ in out] == [[0, 1], [2, 3], [4]]
    last = out[-1][1]['encoder_input_tokens']
    np.testing.assert_array_equal(last[0], [42, 43, 0, 0, 0, 0])
    np.testing.assert_array_equal(last[1], np.zeros(6))

  def test_rows_are_left_aligned_and_zero_padded(self):
    (idx, batch), = evaluation.batches(_fake_examples([3, 6]), {'inputs': 6, 'targets': 2}, 4, use_buckets=False)
    enc = batch['encoder_input_tokens']
    assert enc.shape == (4, 6)
    np.testing.assert_array_equal(enc[0], [2, 3, 4, 0, 0, 0])
    np.testing.assert_array_equal(enc[1], [12, 13, 14, 15, 16, 17])
    assert not enc[2:].any()
    assert idx == [0, 1]

  def test_long_inputs_are_cut(self):
    (_, batch), = evaluation.batches(_fake_examples([9]), {'inputs': 4, 'targets': 2}, 1, use_buckets=False)
    np.testing.assert_array_equal(batch['encoder_input_tokens'], [[2, 3, 4, 5]])

  def test_exact_multiple_has_no_padding_batch(self):
    out = evaluation.batches(_fake_examples([1, 2, 3, 4]), {'inputs': 4, 'targets': 2}, 2, use_buckets=False)
    assert [idx for idx, _ in out] == [[0, 1], [2, 3]]

  def test_no_examples(self):
    assert evaluation.batches([], {'inputs': 4, 'targets': 2}, 2, use_buckets=True) == []


@pytest.mark.parametrize('decode, expected', [
    ([5, 6, EOS, 0, 0], 3),    # up to and including EOS
    ([EOS, 0, 0, 0], 1),       # EOS first
    ([4, EOS, 5, EOS], 2),     # the first EOS counts
    ([5, 6, 7], 3),            # no EOS: every token of a full-length decode
    ([5, 6, 0, 0], 2),         # no EOS: the nonzero tokens
])
def test_num_tokens(decode, expected):
  assert evaluation.num_tokens(np.asarray(decode), EOS) == expected


def test_num_tokens_other_eos_id():
  assert evaluation.num_tokens(np.asarray([3, 9, 9, 4]), eos_id=9) == 2


def test_resume_records_keeps_intact_records_and_drops_a_torn_last_line(tmp_path):
  path = tmp_path / 'predictions.jsonl'
  assert evaluation.resume_records(str(path)) == {}
  path.write_text('{"index": 0, "x": 1}\n{"index": 2, "x": 3}\n{"index": 1, "x"')
  assert evaluation.resume_records(str(path)) == {0: {'index': 0, 'x': 1}, 2: {'index': 2, 'x': 3}}
  assert [json.loads(line)['index'] for line in path.read_text().splitlines()] == [0, 2]


def test_decode_statistics():
  assert evaluation.decode_statistics([{'tokens': 3}, {'tokens': 4}]) == {'examples': 2, 'tokens': 7}
  spec = [{'tokens': 4, 'accepted': 3, 'judged': 4, 'overlap_sum': 3.0, 'overlap_count': 4, 'emitted': 4,
           'target_calls': 2}] * 2
  stats = evaluation.decode_statistics(spec)
  assert stats['examples'] == 2 and stats['tokens'] == 8
  assert stats['alpha_accept'] == pytest.approx(0.75) and stats['alpha_overlap'] == pytest.approx(0.75)
  assert stats['tokens_per_target_call'] == pytest.approx(2.0)


# -----------------------------------------------------------------------------
# decode_split
# -----------------------------------------------------------------------------


class _FakeModel:
  """A baseline model whose decode of every row is [7, EOS, 0, ...]; records the key of each call."""
  drafter_module = None
  eos_id = EOS

  def __init__(self):
    self.keys = []

  def compile_predict(self, decoder_params):
    del decoder_params

    def predict(params, batch, rng):
      del params
      self.keys.append(np.asarray(jax.random.key_data(rng)).tolist())
      decodes = np.zeros_like(batch['decoder_input_tokens'])
      decodes[:, :2] = [7, EOS]
      return decodes, {}
    return predict


def test_decode_split_writes_records_and_resumes_a_torn_log(tmp_path):
  setting = settings.Setting(batch_size=2, seed=5)
  model = _FakeModel()
  task, examples, records = evaluation.decode_split(model, {}, tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, setting,
                                                    str(tmp_path), max_examples=3)
  assert task.name == tasks.ENDE_LOCAL_TASK and len(examples) == 3
  assert [r['index'] for r in records] == [0, 1, 2]
  assert all(r['tokens'] == 2 for r in records)
  assert [r['reference'] for r in records] == [ex['targets_pretokenized'].decode() for ex in examples]
  keys = [np.asarray(jax.random.key_data(jax.random.PRNGKey(5 + b))).tolist() for b in range(2)]
  assert model.keys == keys  # batch b decodes with PRNGKey(seed + b)
  path = tmp_path / 'predictions.jsonl'
  lines = path.read_text().splitlines(keepends=True)
  path.write_text(''.join(lines[:2]) + lines[2][:10])  # killed while writing example 2's record (batch 1)
  again = _FakeModel()
  _, _, resumed = evaluation.decode_split(again, {}, tasks.ENDE_LOCAL_TASK, 'test', LENGTHS, setting,
                                          str(tmp_path), max_examples=3)
  assert again.keys == keys[1:]  # batch 0 was whole; batch 1 is redone with its own key
  assert resumed == records


# -----------------------------------------------------------------------------
# decode_and_score
# -----------------------------------------------------------------------------


class _ReferencePredict:
  """predict(params, batch, rng) -> the reference target ids of each input row."""

  def __init__(self, task_name, split, garbage=False, lengths=LENGTHS):
    examples = evaluation.task_examples(task_name, split, lengths)
    self.by_input = {tuple(_strip(ex['inputs'])): np.asarray(ex['targets'])
                     for ex in examples}
    assert len(self.by_input) == len(examples)  # Inputs are distinct.
    self.garbage = garbage
    self.calls = []

  def __call__(self, params, batch, rng=None):
    self.calls.append((params, rng))
    enc = np.asarray(batch['encoder_input_tokens'])
    out_len = batch['decoder_input_tokens'].shape[1]
    decodes = np.zeros((enc.shape[0], out_len), np.int32)
    for row in range(enc.shape[0]):
      key = tuple(_strip(enc[row]))
      if not key:  # A padding row.
        continue
      ids = self.by_input[key]
      if self.garbage:
        # Other, unrelated pieces (the ids of the reversed sequence shifted).
        ids = np.concatenate([(ids[:-1][::-1] * 7 + 1000) % 7900 + 100, [EOS]])
      decodes[row, :len(ids)] = ids
      # Garbage after EOS must be ignored.
      decodes[row, len(ids):] = 5
    return decodes, {'scores': np.zeros(enc.shape[0])}


class TestDecodeAndScore:

  @pytest.mark.parametrize('batch_size', [1, 2, 4])
  def test_translation_perfect(self, batch_size):
    predict = _ReferencePredict(tasks.ENDE_LOCAL_TASK, 'validation')
    params = {'target': 'PARAMS'}
    result = evaluation.decode_and_score(
        predict, params, tasks.ENDE_LOCAL_TASK, 'validation', LENGTHS,
        batch_size=batch_size)
    assert set(result) == {'metrics', 'predictions', 'targets', 'seconds'}
    assert set(result['metrics']) == {'bleu'}
    assert result['metrics']['bleu'] == pytest.approx(100.0, abs=1e-6)
    rows = _rows(corpora.TRANSLATION_CORPUS, 'validation')
    assert result['targets'] == [r['targets'] for r in rows]
    assert result['predictions'] == result['targets']
    assert len(predict.calls) == -(-len(rows) // batch_size)
    assert all(p is params for p, _ in predict.calls)
    assert result['seconds'] >= 0
    assert isinstance(result['metrics']['bleu'], float)

  def test_summarization_perfect(self):
    predict = _ReferencePredict(tasks.SUMMARIZE_LOCAL_TASK, 'validation')
    result = evaluation.decode_and_score(
        predict, None, tasks.SUMMARIZE_LOCAL_TASK, 'validation', LENGTHS,
        batch_size=2)
    assert set(result['metrics']) == {'rouge1', 'rouge2', 'rougeLsum'}
    for v in result['metrics'].values():
      assert v == pytest.approx(100.0)
    rows = _rows(corpora.SUMMARIZATION_CORPUS, 'validation')
    assert result['targets'] == [r['targets'] for r in rows]
    assert result['predictions'] == result['targets']

  def test_translation_garbage(self):
    predict = _ReferencePredict(tasks.ENDE_LOCAL_TASK, 'validation', garbage=True)
    result = evaluation.decode_and_score(
        predict, None, tasks.ENDE_LOCAL_TASK, 'validation', LENGTHS, batch_size=2)
    assert result['metrics']['bleu'] < 5.0
    rows = _rows(corpora.TRANSLATION_CORPUS, 'validation')
    assert result['targets'] == [r['targets'] for r in rows]
    assert len(result['predictions']) == len(rows)
    assert all(p != t for p, t in zip(result['predictions'], result['targets']))

  def test_summarization_garbage(self):
    predict = _ReferencePredict(tasks.SUMMARIZE_LOCAL_TASK, 'validation',
                                garbage=True)
    result = evaluation.decode_and_score(
        predict, None, tasks.SUMMARIZE_LOCAL_TASK, 'validation', LENGTHS,
        batch_size=2)
    for v in result['metrics'].values():
      assert v < 30.0

  def test_half_right(self):
    """One right row out of three: predictions stay aligned with targets."""
    right = _ReferencePredict(tasks.SUMMARIZE_LOCAL_TASK, 'validation')
    wrong = _ReferencePredict(tasks.SUMMARIZE_LOCAL_TASK, 'validation',
                              garbage=True)
    first_input = tuple(_strip(evaluation.task_examples(
        tasks.SUMMARIZE_LOCAL_TASK, 'validation', LENGTHS)[0]['inputs']))

    def predict(params, batch, rng=None):
      good, aux = right(params, batch, rng)
      bad, _ = wrong(params, batch, rng)
      enc = np.asarray(batch['encoder_input_tokens'])
      keep = np.array([tuple(_strip(r)) == first_input for r in enc])
      return np.where(keep[:, None], good, bad), aux

    result = evaluation.decode_and_score(
        predict, None, tasks.SUMMARIZE_LOCAL_TASK, 'validation', LENGTHS,
        batch_size=2)
    assert result['predictions'][0] == result['targets'][0]
    assert all(p != t for p, t in zip(result['predictions'][1:],
                                      result['targets'][1:]))
    assert 100.0 / 3 - 1e-6 <= result['metrics']['rouge1'] < 60.0

  def test_max_examples_and_rng(self):
    predict = _ReferencePredict(tasks.ENDE_LOCAL_TASK, 'train', lengths=WIDE)
    rng = object()
    result = evaluation.decode_and_score(
        predict, None, tasks.ENDE_LOCAL_TASK, 'train', WIDE, batch_size=4,
        max_examples=5, rng=rng)
    rows = _rows(corpora.TRANSLATION_CORPUS, 'train')[:5]
    assert result['targets'] == [r['targets'] for r in rows]
    assert result['predictions'] == result['targets']
    assert len(predict.calls) == 2
    assert all(r is rng for _, r in predict.calls)

  def test_batches_have_fixed_shapes(self):
    shapes = []

    def predict(params, batch, rng=None):
      shapes.append((batch['encoder_input_tokens'].shape,
                     batch['decoder_input_tokens'].shape))
      return np.zeros(batch['decoder_input_tokens'].shape, np.int32), {}

    result = evaluation.decode_and_score(
        predict, None, tasks.ENDE_LOCAL_TASK, 'train', LENGTHS, batch_size=4)
    assert shapes == [((4, 64), (4, 32))] * 2
    assert len(result['predictions']) == 6
    assert result['predictions'] == [''] * 6
    assert result['metrics']['bleu'] == pytest.approx(0.0)


def _tiny_greedy_case(param_seed, example_seed, vocab=48):
  """A tiny random T5 target and 5 short inputs: (config, module, params, examples, lengths)."""
  import jax  # pylint: disable=g-import-not-at-top
  from specdec import network  # pylint: disable=g-import-not-at-top
  config = network.t5_1_1_config('tiny', vocab_size=vocab)
  module, params = network.Transformer(config), network.init_params(config, jax.random.PRNGKey(param_seed))
  rng = np.random.RandomState(example_seed)
  examples = [{'inputs': rng.randint(2, vocab, size=rng.randint(3, 8))} for _ in range(5)]
  return config, module, params, examples, {'inputs': 8, 'targets': 12}


def test_target_confidence_reads_the_targets_own_greedy_decodes():
  vocab = 48
  _, module, params, examples, lengths = _tiny_greedy_case(3, 0, vocab)
  conf = evaluation.target_confidence(module, params, examples, lengths, batch_size=2)
  assert conf['examples'] == 5
  assert 5 <= conf['positions'] <= 5 * 12
  # The greedy tokens are the teacher-forced argmax at every position: the decode is fed shifted right by one,
  # as the loop fed it (a misaligned shift would agree at about 1/V of them).
  assert conf['argmax_agreement'] == 1.0
  assert 1.0 / vocab <= conf['top1_median'] <= 1.0 and 1.0 / vocab <= conf['top1_mean'] <= 1.0
  assert 0.0 <= conf['share_top1_at_least_0.9'] <= conf['share_top1_at_least_0.5'] <= 1.0
  assert 0.0 <= conf['entropy_mean_nats'] <= np.log(vocab) + 1e-5


def test_token_loss_is_the_mean_teacher_forced_cross_entropy():
  import jax  # pylint: disable=g-import-not-at-top
  from specdec import network  # pylint: disable=g-import-not-at-top
  vocab = 48
  config = network.t5_1_1_config('tiny', vocab_size=vocab)
  module, params = network.Transformer(config), network.init_params(config, jax.random.PRNGKey(4))
  rng = np.random.RandomState(1)
  examples = [{'inputs': rng.randint(2, vocab, size=rng.randint(3, 8)),
               'targets': np.append(rng.randint(2, vocab, size=rng.randint(2, 6)), 1)} for _ in range(3)]
  lengths = {'inputs': 8, 'targets': 6}
  got = evaluation.token_loss(module, params, examples, lengths, batch_size=2)  # a padded last batch
  # By hand, one example at a time: -log p(target_t | target_<t) from the full-sequence logits.
  total, count = 0.0, 0
  for ex in examples:
    tgt = np.asarray(ex['targets'])[:lengths['targets']]
    enc = np.zeros((1, lengths['inputs']), np.int32)
    enc[0, :len(ex['inputs'])] = ex['inputs']
    dec_in = np.zeros((1, len(tgt)), np.int32)
    dec_in[0, 1:] = tgt[:-1]
    logits = np.asarray(module.apply({'params': params}, enc, dec_in, tgt[None], enable_dropout=False))[0]
    logp = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    total -= sum(logp[t, tok] for t, tok in enumerate(tgt))
    count += len(tgt)
  assert got['tokens'] == count
  # float32 sums of a few dozen terms of size ~log(48): a relative error of a few 1e-6.
  assert got['loss'] == pytest.approx(total / count, rel=1e-5)
  with pytest.raises(ValueError, match='no target tokens'):
    evaluation.token_loss(module, params, [{'inputs': np.asarray([3]), 'targets': np.asarray([], np.int32)}],
                          lengths)


def test_draft_rank_probabilities_rank_the_targets_greedy_tokens_in_the_drafters_logits():
  import jax  # pylint: disable=g-import-not-at-top
  from specdec import network  # pylint: disable=g-import-not-at-top
  config, module, params, examples, lengths = _tiny_greedy_case(5, 1)
  same = evaluation.draft_rank_probabilities(module, params, module, params, examples, lengths, max_rank=3,
                                             batch_size=2)
  assert same['rank_probs'] == [1.0, 0.0, 0.0] and 5 <= same['positions'] <= 5 * 12
  # The same network with its logits negated ranks every greedy token last: never within the first 3.
  flipped = jax.tree_util.tree_map(lambda x: x, params)
  flipped['decoder']['logits_dense']['kernel'] = -params['decoder']['logits_dense']['kernel']
  last = evaluation.draft_rank_probabilities(module, params, module, flipped, examples, lengths, max_rank=3,
                                             batch_size=2)
  assert last['rank_probs'] == [0.0, 0.0, 0.0] and last['positions'] == same['positions']
  other = evaluation.draft_rank_probabilities(module, params, module, network.init_params(
      config, jax.random.PRNGKey(6)), examples, lengths, max_rank=3, batch_size=2)
  assert 0 < sum(other['rank_probs']) <= 1
  with pytest.raises(ValueError, match='max_rank'):
    evaluation.draft_rank_probabilities(module, params, module, params, examples, lengths, max_rank=0)


def test_draft_rank_probabilities_of_a_trimmed_vocabulary_and_of_a_feature_head():
  import jax  # pylint: disable=g-import-not-at-top
  from specdec import feature_drafter  # pylint: disable=g-import-not-at-top
  vocab = 48
  config, module, params, examples, lengths = _tiny_greedy_case(5, 1, vocab)
  ids = np.arange(0, vocab, 2)
  # The target as its own drafter over the even ids: rank 1 exactly where its greedy token is even.
  trimmed = evaluation.draft_rank_probabilities(module, params, module, params, examples, lengths, max_rank=2,
                                                batch_size=2, draft_vocab_ids=ids)
  conf = evaluation.target_confidence(module, params, examples, lengths, batch_size=2)
  assert trimmed['positions'] == conf['positions']
  full = evaluation.draft_rank_probabilities(module, params, module, params, examples, lengths, max_rank=2,
                                             batch_size=2)
  assert full['rank_probs'][0] == 1.0 and 0.0 < trimmed['rank_probs'][0] < 1.0
  assert trimmed['rank_probs'][1] == 0.0  # an odd token is never ranked, an even one is first
  head_cfg = feature_drafter.FeatureHeadConfig(feature_dim=config.emb_dim, vocab_size=vocab, width=16,
                                               num_layers=1, num_heads=2, head_dim=8, mlp_dim=32)
  head = feature_drafter.FeatureHead(head_cfg)
  head_params = feature_drafter.init_params(head_cfg, jax.random.PRNGKey(7))
  by_head = evaluation.draft_rank_probabilities(module, params, head, head_params, examples, lengths, max_rank=3,
                                                batch_size=2)
  assert by_head['positions'] == conf['positions'] and 0.0 <= sum(by_head['rank_probs']) <= 1.0
