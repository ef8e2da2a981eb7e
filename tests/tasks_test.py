"""Tests for specdec/tasks.py (seqio tasks; CPU, a small fixture corpus)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import seqio
import tensorflow_datasets as tfds

from specdec import tasks

TESTDATA = os.path.join(os.path.dirname(__file__), "testdata", "tasks")
FIXTURE_CORPUS = os.path.join(TESTDATA, "corpus")
LENGTHS = {"inputs": 64, "targets": 32}
VOCAB_SIZE = 8100
EOS = 1

# Rows per split in the fixture corpus (both corpora).
FIXTURE_ROWS = {"train": 6, "validation": 3, "test": 3}


@pytest.fixture(scope="module")
def local_tasks():
  """Registers the local tasks on the fixture corpus; restores the defaults."""
  names = tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS)
  yield names
  tasks.register_local_tasks()


@pytest.fixture
def default_registration():
  """Restores the default local tasks after a test re-registers them."""
  default_corpus = tasks.DEFAULT_CORPUS_DIR  # before the test patches it
  yield
  tasks.register_local_tasks(corpus_dir=default_corpus)


@pytest.fixture
def vocab():
  return tasks.get_vocabulary()


def _decode(vocab, ids):
  ids = [int(i) for i in ids if int(i) not in (0, EOS)]
  return vocab.decode(ids)


# --------------------------------------------------------------------------
# Vocabulary and registration.
# --------------------------------------------------------------------------


def test_vocabulary_is_cached_and_has_t5_ids(vocab):
  assert tasks.DEFAULT_VOCAB_PATH.endswith(
      os.path.join("specdec", "assets", "spm_ende_8k.model"))
  assert os.path.isfile(tasks.DEFAULT_VOCAB_PATH)
  assert vocab is tasks.get_vocabulary(tasks.DEFAULT_VOCAB_PATH)
  assert vocab.vocab_size == VOCAB_SIZE
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert vocab.extra_ids == 100


def test_missing_vocabulary_names_the_path(tmp_path):
  missing = str(tmp_path / "no_such_spm.model")
  with pytest.raises(FileNotFoundError, match="no_such_spm.model") as e:
    tasks.get_vocabulary(missing)
  assert missing in str(e.value)
  with pytest.raises(FileNotFoundError, match="no_such_spm.model"):
    tasks.register_local_tasks(corpus_dir=FIXTURE_CORPUS, vocab_path=missing)


def test_names_and_constants_registered_on_import():
  assert tasks.T5_DEFAULT_VOCAB_PATH == (
      "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model")
  for name in ("specdec_ende_local", "specdec_summarize_local",
               "specdec_wmt_ende", "specdec_cnn_dailymail"):
    assert name in seqio.TaskRegistry.names()
  assert "specdec_local_mix" in seqio.MixtureRegistry.names()
  mix = seqio.get_mixture_or_task("specdec_local_mix")
  assert sorted(t.name for t in mix.tasks) == sorted(tasks.LOCAL_TASKS)
  # The paper's tasks keep T5's vocabulary (not opened at registration).
  for name in tasks.PAPER_TASKS:
    task = seqio.get_mixture_or_task(name)
    for feature in task.output_features.values():
      assert (feature.vocabulary.sentencepiece_model_file
              == tasks.T5_DEFAULT_VOCAB_PATH)
      assert feature.add_eos
    assert tuple(task.splits) == tasks.SPLITS
  ende = seqio.get_mixture_or_task("specdec_ende_local")
  assert ende.metric_fns == [tasks.bleu]
  assert seqio.get_mixture_or_task("specdec_summarize_local").metric_fns == [
      tasks.rouge]
  assert ende.postprocess_fn(b"  Hallo Welt \n") == "Hallo Welt"


def test_import_with_missing_corpus_dir_and_env_override(tmp_path):
  """Import must work without a corpus; the env var picks the directory."""
  missing = str(tmp_path / "no_corpus")
  code = (
      "from specdec import tasks; import seqio\n"
      f"assert tasks.DEFAULT_CORPUS_DIR == {missing!r}\n"
      "t = seqio.get_mixture_or_task('specdec_ende_local')\n"
      f"assert t.source.corpus_dir == {missing!r}\n"
      "print('OK')\n")
  env = dict(os.environ, SPECDEC_CORPUS_DIR=missing, TF_CPP_MIN_LOG_LEVEL="3")
  out = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().endswith("OK")


# --------------------------------------------------------------------------
# Local tasks on the fixture corpus.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name,corpus,prefix", [
    ("specdec_ende_local", "translate_en_de", "translate English to German: "),
    ("specdec_summarize_local", "summarize_ddtp", "summarize: "),
])
def test_local_task_examples(local_tasks, vocab, name, corpus, prefix):
  del local_tasks
  task = seqio.get_mixture_or_task(name)
  assert task.num_input_examples("validation") == FIXTURE_ROWS["validation"]
  assert task.num_input_examples("train") == FIXTURE_ROWS["train"]
  with open(os.path.join(FIXTURE_CORPUS, corpus, "validation.jsonl"),
            encoding="utf-8") as f:
    raw = [json.loads(line) for line in f]
  exs = list(task.get_dataset(None, split="validation",
                              shuffle=False).as_numpy_iterator())
  assert len(exs) == len(raw)
  for ex, row in zip(exs, raw):
    assert ex["inputs_pretokenized"].decode() == prefix + row["inputs"]
    assert ex["targets_pretokenized"].decode() == row["targets"]
    for key in tasks.PROVENANCE_FIELDS:
      assert ex[key].decode() == row[key]
    for key in ("inputs", "targets"):
      assert ex[key].dtype == np.int32
      assert ex[key][-1] == EOS and EOS not in ex[key][:-1]
      assert ex[key].max() < VOCAB_SIZE
    assert vocab.decode(ex["inputs"].tolist()) == prefix + row["inputs"]
    assert vocab.decode(ex["targets"].tolist()) == row["targets"]


@pytest.mark.parametrize("pack", [False, True])
def test_local_tasks_through_feature_converter(local_tasks, vocab, pack):
  del local_tasks
  for name, prefix in (("specdec_ende_local", tasks.TRANSLATE_PREFIX),
                       ("specdec_summarize_local", tasks.SUMMARIZE_PREFIX)):
    ds = seqio.get_dataset(
        name, task_feature_lengths=LENGTHS, dataset_split="train",
        shuffle=False,
        feature_converter=seqio.EncDecFeatureConverter(pack=pack),
        batch_size=2)
    batches = list(ds.as_numpy_iterator())
    assert batches
    expected = {"encoder_input_tokens", "decoder_input_tokens",
                "decoder_target_tokens", "decoder_loss_weights"}
    if pack:
      expected |= {"encoder_segment_ids", "encoder_positions",
                   "decoder_segment_ids", "decoder_positions"}
    n_rows = 0
    for b in batches:
      assert set(b) == expected
      assert b["encoder_input_tokens"].shape[1:] == (64,)
      assert b["decoder_target_tokens"].shape[1:] == (32,)
      for k, v in b.items():
        assert v.min() >= 0
        if k.endswith("tokens"):
          assert v.max() < VOCAB_SIZE
      for row in range(b["encoder_input_tokens"].shape[0]):
        enc = b["encoder_input_tokens"][row]
        tgt = b["decoder_target_tokens"][row]
        assert EOS in enc and EOS in tgt
        # The decoder input is the target shifted right (BOS = 0).
        assert b["decoder_input_tokens"][row][0] == 0
        if pack:
          first = enc[b["encoder_segment_ids"][row] == 1]
          n_rows += int(b["encoder_segment_ids"][row].max())
        else:
          first = enc[enc != 0]
          n_rows += 1
          np.testing.assert_array_equal(b["decoder_input_tokens"][row][1:],
                                        tgt[:-1])
        assert first[-1] == EOS
        assert _decode(vocab, first).startswith(prefix)
    assert n_rows == FIXTURE_ROWS["train"]


def test_mixture_yields_both_tasks(local_tasks, vocab):
  del local_tasks
  mix = seqio.get_mixture_or_task("specdec_local_mix")
  for task in mix.tasks:
    assert mix.get_rate(task) == FIXTURE_ROWS["train"]
  ds = seqio.get_dataset(
      "specdec_local_mix", task_feature_lengths=LENGTHS,
      dataset_split="train", shuffle=True, seed=0, num_epochs=None,
      feature_converter=seqio.EncDecFeatureConverter(pack=False))
  prefixes = set()
  for ex in ds.take(24).as_numpy_iterator():
    assert ex["encoder_input_tokens"].max() < VOCAB_SIZE
    text = _decode(vocab, ex["encoder_input_tokens"])
    assert text.startswith((tasks.TRANSLATE_PREFIX, tasks.SUMMARIZE_PREFIX))
    prefixes.add(text.split(":")[0])
  assert prefixes == {"translate English to German", "summarize"}


def test_missing_corpus_raises_with_build_hint(tmp_path):
  missing = str(tmp_path / "no_corpus")
  try:
    # Registration itself must not fail.
    tasks.register_local_tasks(corpus_dir=missing)
    for name in tasks.LOCAL_TASKS:
      task = seqio.get_mixture_or_task(name)
      with pytest.raises(FileNotFoundError) as e:
        task.get_dataset(LENGTHS, split="train", shuffle=False)
      msg = str(e.value)
      assert "python scripts/build_corpus.py --out data/corpus" in msg
      assert missing in msg
      with pytest.raises(FileNotFoundError, match="build_corpus"):
        task.num_input_examples("train")
    with pytest.raises(FileNotFoundError, match="build_corpus"):
      seqio.get_mixture_or_task("specdec_local_mix").get_dataset(
          LENGTHS, split="train", shuffle=False)
  finally:
    tasks.register_local_tasks()


def _corpus_with_bad_line(tmp_path, line_no=3):
  """A copy of the fixture corpus whose translation train split has a
  non-UTF-8 byte on line `line_no`."""
  corpus = tmp_path / "corpus"
  shutil.copytree(FIXTURE_CORPUS, corpus)
  path = corpus / "translate_en_de" / "train.jsonl"
  lines = path.read_bytes().split(b"\n")
  lines[line_no - 1] = lines[line_no - 1].replace(b"e", b"\xe9", 1)
  path.write_bytes(b"\n".join(lines))
  return str(corpus), str(path)


def test_non_utf8_line_names_file_and_line(tmp_path):
  corpus, path = _corpus_with_bad_line(tmp_path)
  want = f"^{path}:3: not UTF-8"
  try:
    tasks.register_local_tasks(corpus_dir=corpus)
    task = seqio.get_mixture_or_task(tasks.ENDE_LOCAL_TASK)
    # Raised when the dataset is built, not from inside TensorFlow's iterator.
    with pytest.raises(ValueError, match=want):
      task.get_dataset(LENGTHS, split="train", shuffle=False)
    with pytest.raises(ValueError, match=want):
      task.num_input_examples("train")
    with pytest.raises(ValueError, match=want):
      seqio.get_dataset(tasks.LOCAL_MIXTURE, LENGTHS, dataset_split="train", shuffle=False,
                        feature_converter=seqio.EncDecFeatureConverter(pack=False))
    # The other splits and the other corpus are fine.
    assert task.num_input_examples("validation") == FIXTURE_ROWS["validation"]
    other = seqio.get_mixture_or_task(tasks.SUMMARIZE_LOCAL_TASK)
    assert other.num_input_examples("train") == FIXTURE_ROWS["train"]
  finally:
    tasks.register_local_tasks()


def test_jsonl_check_is_cached_per_file_version(tmp_path, monkeypatch):
  corpus, path = _corpus_with_bad_line(tmp_path)
  os.remove(path)
  shutil.copy(os.path.join(FIXTURE_CORPUS, "translate_en_de", "train.jsonl"), path)
  calls = []
  real = tasks.fileio.count_jsonl_rows
  monkeypatch.setattr(tasks.fileio, "count_jsonl_rows",
                      lambda lines, where: calls.append(where) or real(lines, where))
  assert tasks.count_jsonl_rows(path) == FIXTURE_ROWS["train"]
  assert tasks.count_jsonl_rows(path) == FIXTURE_ROWS["train"]
  assert calls == [path]
  # A rewritten file (new size / mtime) is checked again.
  with open(path, "ab") as f:
    f.write(b'{"inputs": "x", "targets": "\xff"}\n')
  with pytest.raises(ValueError, match=f"^{path}:{FIXTURE_ROWS['train'] + 1}: not UTF-8"):
    tasks.count_jsonl_rows(path)


# --------------------------------------------------------------------------
# Metrics.
# --------------------------------------------------------------------------


def test_bleu():
  refs = ["Dieses Paket enthält die Hilfsprogramme der Bibliothek.",
          "Britisch-englisches Wörterbuch für /usr/share/dict",
          "Echtzeit-Strategiespiel über antike Kriegsführung"]
  assert tasks.bleu(refs, refs)["bleu"] == pytest.approx(100.0)
  # bytes (as seqio hands over raw targets) work too.
  assert tasks.bleu([r.encode() for r in refs], refs)["bleu"] == (
      pytest.approx(100.0))
  unrelated = ["The quick brown fox jumps over the lazy dog today.",
               "Copy websites to your computer please",
               "Nothing in common with anything here at all"]
  low = tasks.bleu(refs, unrelated)["bleu"]
  assert 0.0 <= low < 5.0
  partial = ["Dieses Paket enthält die Programme der Bibliothek.",
             "Britisch-englisches Wörterbuch für /usr/share/dict",
             "Echtzeit-Strategiespiel über Kriegsführung"]
  assert low < tasks.bleu(refs, partial)["bleu"] < 100.0
  assert set(tasks.bleu(refs, refs)) == {"bleu"}
  with pytest.raises(ValueError):
    tasks.bleu(refs, refs[:2])


def test_rouge():
  refs = ["European Portuguese wordlist",
          "Common Gateway Interface for Octave. It parses CGI queries."]
  same = tasks.rouge(refs, refs)
  assert set(same) == {"rouge1", "rouge2", "rougeLsum"}
  for v in same.values():
    assert v == pytest.approx(100.0)
  unrelated = tasks.rouge(refs, ["chase action game", "a password checker"])
  for v in unrelated.values():
    assert v < 5.0
  half = tasks.rouge(["bindings for socket services in Ada"],
                     ["socket services library"])
  assert 0.0 < half["rouge1"] < 100.0
  assert (tasks.prepare_summary_for_rouge("First one. Second one! third . x")
          == "First one.\nSecond one!\nthird .\nx")


# --------------------------------------------------------------------------
# The paper's TFDS tasks under mock data.
# --------------------------------------------------------------------------


def test_paper_tasks_with_mock_tfds(vocab):
  try:
    tasks.register_paper_tasks(vocab_path=tasks.DEFAULT_VOCAB_PATH)
    specs = (("specdec_wmt_ende", tasks.TRANSLATE_PREFIX, "validation"),
             ("specdec_cnn_dailymail", tasks.SUMMARIZE_PREFIX, "test"))
    with tfds.testing.mock_data(num_examples=3):
      for name, prefix, split in specs:
        task = seqio.get_mixture_or_task(name)
        assert task.output_features["inputs"].vocabulary is vocab
        ds = task.get_dataset(LENGTHS, split=split, shuffle=False,
                              try_in_mem_cache=False)
        exs = list(ds.as_numpy_iterator())
        assert len(exs) == 3
        for ex in exs:
          assert ex["inputs_pretokenized"].decode().startswith(prefix)
          assert ex["inputs"][-1] == EOS and ex["targets"][-1] == EOS
          assert _decode(vocab, ex["inputs"]).startswith(prefix)
        converted = seqio.EncDecFeatureConverter(pack=False)(ds, LENGTHS)
        for ex in converted.as_numpy_iterator():
          assert ex["encoder_input_tokens"].shape == (64,)
          assert ex["decoder_target_tokens"].shape == (32,)
          assert ex["encoder_input_tokens"].max() < VOCAB_SIZE
          assert EOS in ex["encoder_input_tokens"]
          assert EOS in ex["decoder_target_tokens"]
  finally:
    tasks.register_paper_tasks()
  assert (seqio.get_mixture_or_task("specdec_wmt_ende").output_features[
      "targets"].vocabulary.sentencepiece_model_file
          == tasks.T5_DEFAULT_VOCAB_PATH)


_REFS = ['Das ist ein Haus.', 'Ich bin hier.', 'Der Hund bellt laut.', 'Es regnet heute.'] * 30
_WORSE = ['Das ist ein Haus.', 'Ich bin da.', 'Der Hund bellt.', 'Es regnet.'] * 30


def test_paired_bleu_scores_each_system_as_bleu_does():
  better = ['Das ist Haus.', 'Ich bin hier.', 'Der Hund bellt laut.', 'Es regnet heute.'] * 30
  result = tasks.paired_bleu(_REFS, _WORSE, better, n_samples=200)
  assert result['baseline'] == tasks.bleu(_REFS, _WORSE)['bleu']
  assert result['candidate'] == tasks.bleu(_REFS, better)['bleu']
  assert result['delta'] == result['candidate'] - result['baseline'] > 0
  low, high = result['delta_ci95']
  assert 0 < low < result['delta'] < high  # better on 90 of 120 examples, worse on 30
  assert result['share_candidate_not_worse'] > 0.975


def test_paired_bleu_of_a_system_against_itself_is_no_difference():
  result = tasks.paired_bleu(_REFS, _WORSE, list(_WORSE), n_samples=200)
  assert result['delta'] == 0.0
  assert result['delta_ci95'] == [0.0, 0.0]
  assert result['share_candidate_not_worse'] == 1.0


def test_paired_bleu_needs_one_prediction_per_reference():
  with pytest.raises(ValueError, match='one of each per example'):
    tasks.paired_bleu(_REFS, _WORSE[:-1], _WORSE)


# --------------------------------------------------------------------------
# register_tasks: the launcher's registration.
# --------------------------------------------------------------------------


def _source_dir(task_name):
  return seqio.get_mixture_or_task(task_name).source.corpus_dir


def test_register_tasks_falls_back_to_the_embedded_slices(
    default_registration, monkeypatch, tmp_path, capsys):
  monkeypatch.setattr(tasks, "DEFAULT_CORPUS_DIR", str(tmp_path / "no_corpus"))
  tasks.register_tasks()
  assert "embedded test slices" in capsys.readouterr().out
  for name in tasks.LOCAL_TASKS:
    assert _source_dir(name) == tasks.EMBEDDED_TEST_SLICES
  from specdec import evaluation  # pylint: disable=g-import-not-at-top
  examples = evaluation.task_examples(
      tasks.ENDE_LOCAL_TASK, "test", {"inputs": 16, "targets": 8}, 2)
  with open(os.path.join(tasks.EMBEDDED_TEST_SLICES, "translate_en_de",
                         "test.jsonl"), encoding="utf-8") as f:
    first = json.loads(f.readline())
  assert examples[0]["targets_pretokenized"].decode("utf-8") == first["targets"]


def test_register_tasks_prefers_a_given_or_existing_corpus(
    default_registration, monkeypatch, tmp_path):
  tasks.register_tasks(FIXTURE_CORPUS)
  assert _source_dir(tasks.ENDE_LOCAL_TASK) == FIXTURE_CORPUS
  # An existing default corpus is used, with no fallback.
  monkeypatch.setattr(tasks, "DEFAULT_CORPUS_DIR", str(tmp_path))
  tasks.register_tasks()
  assert _source_dir(tasks.SUMMARIZE_LOCAL_TASK) == str(tmp_path)
