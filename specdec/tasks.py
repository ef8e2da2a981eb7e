"""seqio Tasks and Mixtures for the speculative-decoding experiments.

Importing this module registers (T5 / T5X conventions throughout):

Local tasks on the Debian DDTP corpora built by ``specdec/data/corpora.py``
(``python scripts/build_corpus.py --out data/corpus``), tokenized with the
shipped 8k SentencePiece vocabulary (``DEFAULT_VOCAB_PATH``):

* ``specdec_ende_local``: ``translate English to German: <en>`` -> ``<de>``,
  metric corpus BLEU (sacrebleu, T5's settings).
* ``specdec_summarize_local``: ``summarize: <document>`` -> ``<summary>``,
  metric ROUGE-1/2/Lsum F-measure x 100 (rouge_score).
* ``specdec_local_mix``: a Mixture of both, mixed in proportion to their
  numbers of train examples (``rate_num_train_examples``; 35,916 vs. 40,711 rows
  in the 2026-11 build, i.e. close to equal). Pass ``mixture_rate=1.0`` to
  ``register_local_tasks`` for equal rates.

The paper's tasks (TFDS; need the prepared TFDS data, which cannot be
downloaded on machines without general internet), with T5's default
vocabulary (``T5_DEFAULT_VOCAB_PATH``, on GCS):

* ``specdec_wmt_ende``: TFDS ``wmt_t2t_translate/de-en:1.0.0``, ``en`` with the
  translate prefix -> ``de``, BLEU.
* ``specdec_cnn_dailymail``: TFDS ``cnn_dailymail:3.4.0``, ``article`` with
  ``summarize: `` -> ``highlights``, ROUGE.

Every path and knob is a module-level constant or a keyword argument of
``register_local_tasks`` / ``register_paper_tasks`` so that gin (or a script)
can re-register the tasks with other values; re-registering replaces the
existing tasks of the same names.

Import never touches the corpus files nor the (possibly remote) T5
vocabulary: a missing corpus only surfaces, as a ``FileNotFoundError`` that
explains how to build it, when a local task's dataset is requested.

Features: ``inputs`` and ``targets`` (int32 token ids, EOS appended after
trimming, ``*_pretokenized`` copies of the raw strings kept by
``seqio.preprocessors.tokenize``). Local tasks also pass through the string
provenance fields of the corpus rows (``PROVENANCE_FIELDS``); Mixtures and
feature converters drop them.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

import numpy as np
import seqio
import tensorflow as tf

from specdec import fileio
from specdec.task_names import SUMMARIZE_PREFIX
from specdec.task_names import SUMMARIZATION_CORPUS
from specdec.task_names import TRANSLATE_PREFIX
from specdec.task_names import TRANSLATION_CORPUS
from specdec.task_names import CNN_DAILYMAIL_TASK
from specdec.task_names import ENDE_LOCAL_TASK
from specdec.task_names import LOCAL_MIXTURE
from specdec.task_names import LOCAL_TASKS
from specdec.task_names import PAPER_TASKS
from specdec.task_names import SUMMARIZE_LOCAL_TASK
from specdec.task_names import WMT_ENDE_TASK

# --------------------------------------------------------------------------
# Paths and names.
# --------------------------------------------------------------------------

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(PACKAGE_DIR)

# The shipped SentencePiece model (8000 pieces; + EXTRA_IDS sentinels = 8100).
DEFAULT_VOCAB_PATH = os.path.join(PACKAGE_DIR, "assets", "spm_ende_8k.model")
EXTRA_IDS = 100
# T5's default vocabulary (32000 pieces + 100 extra ids), used by the paper's
# tasks and the public T5 1.1 checkpoints.
T5_DEFAULT_VOCAB_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"

CORPUS_DIR_ENV = "SPECDEC_CORPUS_DIR"
DEFAULT_CORPUS_DIR = (os.environ.get(CORPUS_DIR_ENV)
                      or os.path.join(REPO_DIR, "data", "corpus"))
BUILD_CORPUS_COMMAND = "python scripts/build_corpus.py --out data/corpus"

SPLITS = ("train", "validation", "test")
# String columns of the corpus rows passed through as extra features.
PROVENANCE_FIELDS = ("source_package", "package", "kind", "origin",
                     "description_md5")

WMT_ENDE_TFDS_NAME = "wmt_t2t_translate/de-en:1.0.0"
CNN_DAILYMAIL_TFDS_NAME = "cnn_dailymail:3.4.0"
TFDS_DATA_DIR = None  # None: TFDS's default (or $TFDS_DATA_DIR).

ROUGE_KEYS = ("rouge1", "rouge2", "rougeLsum")
BLEU_TOKENIZER = "intl"  # as T5's `t5.evaluation.metrics.bleu`

# --------------------------------------------------------------------------
# Vocabulary.
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _cached_vocabulary(path: str, extra_ids: int) -> seqio.SentencePieceVocabulary:
  return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)


def get_vocabulary(path: Optional[str] = None,
                   extra_ids: int = EXTRA_IDS) -> seqio.SentencePieceVocabulary:
  """Returns a cached ``seqio.SentencePieceVocabulary(path, extra_ids)``.

  ``path`` defaults to ``DEFAULT_VOCAB_PATH``. Local paths are checked at
  once (``FileNotFoundError`` naming the path); remote ones (``gs://...``) are
  only opened, lazily, by seqio on first use.
  """
  path = os.fspath(path) if path is not None else DEFAULT_VOCAB_PATH
  if not fileio.is_url(path):
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
      raise FileNotFoundError(
          f"SentencePiece vocabulary not found: {path} (the shipped one is "
          f"{DEFAULT_VOCAB_PATH}; see specdec/assets/README.md and "
          "scripts/train_vocab.py to rebuild it).")
  return _cached_vocabulary(path, int(extra_ids))


def get_output_features(
    vocabulary: seqio.Vocabulary) -> Dict[str, seqio.Feature]:
  """``inputs`` and ``targets`` with EOS, sharing one vocabulary."""
  return {
      "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True),
      "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
  }


# --------------------------------------------------------------------------
# Local JSON Lines source.
# --------------------------------------------------------------------------


def corpus_split_path(corpus_dir: str, corpus_name: str, split: str) -> str:
  """``<corpus_dir>/<corpus_name>/<split>.jsonl``."""
  return os.path.join(corpus_dir, corpus_name, f"{split}.jsonl")


def _missing_corpus_error(path: str, corpus_name: str) -> FileNotFoundError:
  return FileNotFoundError(
      f"Corpus file not found: {path} (corpus {corpus_name!r}). Build the "
      f"local corpora with `{BUILD_CORPUS_COMMAND}` from the repository root, "
      f"or point ${CORPUS_DIR_ENV} / register_local_tasks(corpus_dir=...) at "
      "an existing corpus directory.")


def _check_exists(path: str, corpus_name: str) -> None:
  if not tf.io.gfile.exists(path):
    raise _missing_corpus_error(path, corpus_name)


def _row_to_example(row: Mapping[str, Any],
                    fields: Sequence[str]) -> Dict[str, str]:
  out = {}
  for key in fields:
    value = row.get(key, "")
    out[key] = "" if value is None else str(value)
  return out


def read_jsonl_dataset(split: str,
                       shuffle_files: bool,
                       seed: Optional[int] = None,
                       *,
                       corpus_dir: str,
                       corpus_name: str,
                       extra_fields: Sequence[str] = PROVENANCE_FIELDS,
                       ) -> tf.data.Dataset:
  """A ``seqio.FunctionDataSource`` dataset_fn over one JSONL split file.

  Yields string features ``inputs``, ``targets`` and ``extra_fields``
  (missing keys become ""). With ``shuffle_files`` the rows are read in a
  random permutation (seeded by ``seed``), since a split is a single file
  sorted by package.

  Raises:
    FileNotFoundError: when the split file does not exist (at call time).
    ValueError: `<file>:<line>: ...` for a line that is not UTF-8 or not a
      JSON object (all lines are checked once per file version, at call time).
  """
  path = corpus_split_path(corpus_dir, corpus_name, split)
  _check_exists(path, corpus_name)
  count_jsonl_rows(path)  # checks every line, cached
  fields = ("inputs", "targets") + tuple(
      f for f in extra_fields if f not in ("inputs", "targets"))

  def generator() -> Iterator[Dict[str, str]]:
    with tf.io.gfile.GFile(path, "r") as f:
      if shuffle_files:
        rows = [line for line in f if line.strip()]
        order = np.random.default_rng(seed).permutation(len(rows))
        lines = (rows[i] for i in order)
      else:
        lines = (line for line in f if line.strip())
      for line in lines:
        yield _row_to_example(json.loads(line), fields)

  signature = {k: tf.TensorSpec(shape=(), dtype=tf.string) for k in fields}
  return tf.data.Dataset.from_generator(generator, output_signature=signature)


_LINE_COUNTS: Dict[Tuple[str, int, float], int] = {}
_LINE_COUNTS_LOCK = threading.Lock()


def count_jsonl_rows(path: str) -> int:
  """Number of rows of a JSONL file, every line checked (cached on path/size/mtime).

  Raises ValueError naming the file and line of the first line that is not
  UTF-8 or not a JSON object (fileio.iter_jsonl_rows): TensorFlow would
  report it from inside the input pipeline, without either.
  """
  stat = tf.io.gfile.stat(path)
  key = (path, stat.length, stat.mtime_nsec)
  with _LINE_COUNTS_LOCK:
    if key in _LINE_COUNTS:
      return _LINE_COUNTS[key]
  with tf.io.gfile.GFile(path, "rb") as f:
    n = fileio.count_jsonl_rows(f, path)
  with _LINE_COUNTS_LOCK:
    _LINE_COUNTS[key] = n
  return n


class JsonlDataSource(seqio.FunctionDataSource):
  """The JSONL split files of one corpus as a seqio source.

  Unlike a plain FunctionDataSource it knows its split sizes (counted lazily
  from the files, so a missing corpus does not break task registration).
  """

  def __init__(self,
               corpus_dir: str,
               corpus_name: str,
               splits: Sequence[str] = SPLITS,
               extra_fields: Sequence[str] = PROVENANCE_FIELDS,
               caching_permitted: bool = True):
    self.corpus_dir = corpus_dir
    self.corpus_name = corpus_name
    dataset_fn = functools.partial(
        read_jsonl_dataset, corpus_dir=corpus_dir, corpus_name=corpus_name,
        extra_fields=tuple(extra_fields))
    super().__init__(dataset_fn=dataset_fn, splits=splits,
                     caching_permitted=caching_permitted)

  def get_dataset(self, split: str = "train", shuffle: bool = True,
                  seed: Optional[int] = None, shard_info=None,
                  **unused_kwargs) -> tf.data.Dataset:
    """Like FunctionDataSource's, without its warning about shuffling.

    The warning does not apply: with ``shuffle`` every pass reads the rows of
    the split in a full (seeded) permutation.
    """
    if shard_info and shard_info.num_shards > 1:
      raise ValueError("JsonlDataSource has one shard per split; let the Task "
                       "shard the examples.")
    return self._dataset_fn(split=split, shuffle_files=shuffle, seed=seed)

  def split_path(self, split: str) -> str:
    return corpus_split_path(self.corpus_dir, self.corpus_name, split)

  def num_input_examples(self, split: str) -> int:
    path = self.split_path(split)
    _check_exists(path, self.corpus_name)
    return count_jsonl_rows(path)

  def __repr__(self):
    return (f"{self.__class__.__name__}(corpus_dir={self.corpus_dir!r}, "
            f"corpus_name={self.corpus_name!r}, splits={self.splits})")


# --------------------------------------------------------------------------
# Preprocessing, postprocessing and metrics.
# --------------------------------------------------------------------------


def prefix_and_rekey(dataset: tf.data.Dataset,
                     key_map: Mapping[str, str],
                     prefix: str = "",
                     prefix_key: str = "inputs",
                     passthrough: Sequence[str] = ()) -> tf.data.Dataset:
  """Renames features (``new: old``) and prepends ``prefix`` to ``prefix_key``.

  Features not named in ``key_map`` values or ``passthrough`` are dropped
  (like T5's ``rekey``).
  """
  key_map = dict(key_map)
  passthrough = tuple(k for k in passthrough if k not in key_map)

  @seqio.map_over_dataset
  def fn(ex):
    out = {new: ex[old] for new, old in key_map.items()}
    if prefix:
      out[prefix_key] = tf.strings.join([prefix, out[prefix_key]])
    for k in passthrough:
      out[k] = ex[k]
    return out

  return fn(dataset)


def _text(x: Any) -> str:
  if isinstance(x, (bytes, bytearray)):
    return bytes(x).decode("utf-8", errors="replace")
  if isinstance(x, np.ndarray) and x.ndim == 0:
    return _text(x.item())
  return str(x)


def postprocess_text(output_or_target: Any,
                     example: Optional[Mapping[str, Any]] = None,
                     is_target: bool = False) -> str:
  """seqio postprocess_fn: decoded output / raw target -> stripped ``str``."""
  del example, is_target
  return _text(output_or_target).strip()


def bleu(targets: Sequence[Any],
         predictions: Sequence[Any],
         tokenize: str = BLEU_TOKENIZER) -> Dict[str, float]:
  """Corpus BLEU of detokenized strings (sacrebleu, T5's settings).

  ``targets`` is one reference per prediction (or a list of references per
  prediction). Returns ``{'bleu': score}`` on the 0-100 scale.
  """
  import sacrebleu  # pylint: disable=g-import-not-at-top

  predictions = [_text(p) for p in predictions]
  if targets and isinstance(targets[0], (list, tuple)):
    n_refs = len(targets[0])
    references = [[_text(t[i]) for t in targets] for i in range(n_refs)]
  else:
    references = [[_text(t) for t in targets]]
  for ref in references:
    if len(ref) != len(predictions):
      raise ValueError(f"{len(predictions)} predictions but {len(ref)} "
                       "references")
  score = sacrebleu.corpus_bleu(
      predictions, references, smooth_method="exp", smooth_value=0.0,
      force=False, lowercase=False, tokenize=tokenize,
      use_effective_order=False)
  return {"bleu": float(score.score)}


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def paired_bleu(references: Sequence[Any], baseline: Sequence[Any], candidate: Sequence[Any],
                n_samples: int = 1000, seed: int = 0) -> Dict[str, float]:
  """Two systems' corpus BLEU on the same references, and how much of their difference is noise.

  Paired bootstrap resampling (Koehn 2004): the examples are drawn with
  replacement ``n_samples`` times and both systems scored on each draw, from
  sacrebleu's per-sentence sufficient statistics (so each draw's BLEU is what
  ``bleu`` gives on it). Returns {'baseline', 'candidate', 'delta' (candidate
  - baseline), 'delta_ci95' ([low, high], the draws' 2.5th and 97.5th
  percentiles), 'share_candidate_not_worse' (of the draws), 'n_samples'}.
  """
  from sacrebleu import metrics  # pylint: disable=g-import-not-at-top

  if not len(references) == len(baseline) == len(candidate):
    raise ValueError(f"{len(references)} references, {len(baseline)} and {len(candidate)} predictions: "
                     "a paired test needs one of each per example.")
  metric = metrics.BLEU(smooth_method="exp", lowercase=False, tokenize=BLEU_TOKENIZER,
                        effective_order=False)
  refs = [[_text(t) for t in references]]
  stats = [np.asarray(metric._extract_corpus_statistics([_text(p) for p in system], refs), dtype=np.float64)  # pylint: disable=protected-access
           for system in (baseline, candidate)]
  score = lambda s: float(metric._compute_score_from_stats(list(s)).score)  # pylint: disable=protected-access
  idx = np.random.default_rng(seed).integers(0, len(references), size=(n_samples, len(references)))
  draws = np.asarray([[score(st[row].sum(0)) for st in stats] for row in idx])
  deltas = draws[:, 1] - draws[:, 0]
  base, cand = score(stats[0].sum(0)), score(stats[1].sum(0))
  return {"baseline": base, "candidate": cand, "delta": cand - base,
          "delta_ci95": [float(np.percentile(deltas, 2.5)), float(np.percentile(deltas, 97.5))],
          "share_candidate_not_worse": float(np.mean(deltas >= 0)), "n_samples": n_samples}


def prepare_summary_for_rouge(summary: str) -> str:
  """Puts one sentence per line (``rougeLsum`` splits on newlines).

  T5 replaces " . " by " .\\n" (for tokenized CNN/DailyMail text); raw text
  is split after sentence-final punctuation followed by whitespace, too.
  Existing newlines are kept.
  """
  summary = summary.replace(" . ", " .\n")
  return "\n".join(_SENTENCE_END.sub("\n", line).strip()
                   for line in summary.splitlines() if line.strip())


def rouge(targets: Sequence[Any],
          predictions: Sequence[Any],
          score_keys: Sequence[str] = ROUGE_KEYS,
          use_stemmer: bool = False) -> Dict[str, float]:
  """Mean ROUGE F-measures x 100 (rouge_score; T5's keys and settings).

  T5 reports the median of a bootstrap of the mean (``BootstrapAggregator``),
  which is random; this reports the plain mean, the same up to that noise.
  rouge_score's tokenizer keeps only ``[a-z0-9]`` (it is meant for English).
  """
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top

  if len(targets) != len(predictions):
    raise ValueError(f"{len(predictions)} predictions but {len(targets)} "
                     "targets")
  scorer = rouge_scorer.RougeScorer(rouge_types=list(score_keys),
                                    use_stemmer=use_stemmer)
  totals = {k: 0.0 for k in score_keys}
  for target, prediction in zip(targets, predictions):
    scores = scorer.score(target=prepare_summary_for_rouge(_text(target)),
                          prediction=prepare_summary_for_rouge(
                              _text(prediction)))
    for k in score_keys:
      totals[k] += scores[k].fmeasure
  n = max(len(targets), 1)
  return {k: 100.0 * v / n for k, v in totals.items()}


def _preprocessors(key_map: Mapping[str, str], prefix: str,
                   passthrough: Sequence[str] = ()) -> List[Any]:
  return [
      functools.partial(prefix_and_rekey, key_map=dict(key_map),
                        prefix=prefix, passthrough=tuple(passthrough)),
      seqio.preprocessors.tokenize,
      seqio.CacheDatasetPlaceholder(),
      seqio.preprocessors.append_eos_after_trim,
  ]


def _replace_task(name: str, **kwargs) -> seqio.Task:
  seqio.TaskRegistry.remove(name)
  return seqio.TaskRegistry.add(name, **kwargs)


# --------------------------------------------------------------------------
# Registration.
# --------------------------------------------------------------------------


def rate_num_train_examples(task: seqio.Task,
                            maximum: Optional[float] = None) -> float:
  """Mixing rate = number of train examples (optionally capped), lazily."""
  n = float(task.num_input_examples("train"))
  return min(n, maximum) if maximum is not None else n


MixtureRate = Union[float, Callable[[seqio.Task], float]]


def register_local_tasks(corpus_dir: Optional[str] = None,
                         vocab_path: Optional[str] = None,
                         mixture_rate: MixtureRate = rate_num_train_examples,
                         extra_fields: Sequence[str] = PROVENANCE_FIELDS,
                         ) -> Tuple[str, ...]:
  """(Re)registers the DDTP tasks and their mixture; returns their names.

  Args:
    corpus_dir: the directory written by ``scripts/build_corpus.py``
      (default ``DEFAULT_CORPUS_DIR``: ``$SPECDEC_CORPUS_DIR`` or
      ``<repo>/data/corpus``). Need not exist yet.
    vocab_path: SentencePiece model (default ``DEFAULT_VOCAB_PATH``).
    mixture_rate: rate of each task in ``specdec_local_mix``: a callable of
      the Task (default: its number of train examples) or a number (equal
      rates).
    extra_fields: string columns of the rows passed through as features.
  """
  corpus_dir = os.fspath(corpus_dir) if corpus_dir is not None else (
      DEFAULT_CORPUS_DIR)
  output_features = get_output_features(get_vocabulary(vocab_path))
  key_map = {"inputs": "inputs", "targets": "targets"}
  specs = (
      (ENDE_LOCAL_TASK, TRANSLATION_CORPUS, TRANSLATE_PREFIX, [bleu]),
      (SUMMARIZE_LOCAL_TASK, SUMMARIZATION_CORPUS, SUMMARIZE_PREFIX, [rouge]),
  )
  seqio.MixtureRegistry.remove(LOCAL_MIXTURE)
  for name, corpus_name, prefix, metric_fns in specs:
    _replace_task(
        name,
        source=JsonlDataSource(corpus_dir, corpus_name,
                               extra_fields=extra_fields),
        preprocessors=_preprocessors(key_map, prefix, extra_fields),
        output_features=output_features,
        postprocess_fn=postprocess_text,
        metric_fns=metric_fns)
  seqio.MixtureRegistry.add(
      LOCAL_MIXTURE, [(name, mixture_rate) for name in LOCAL_TASKS])
  return LOCAL_TASKS + (LOCAL_MIXTURE,)


# The first 64 test examples per local task, shipped (specdec/assets/test_slices/README.md).
EMBEDDED_TEST_SLICES = os.path.join(PACKAGE_DIR, "assets", "test_slices")


def register_tasks(corpus_dir: Optional[str] = None,
                   vocab_path: Optional[str] = None) -> None:
  """Registers the local tasks (from `corpus_dir`) and the paper's TFDS tasks.

  Without `corpus_dir` and without a built corpus at the default place, the
  local tasks read the embedded test slices (``EMBEDDED_TEST_SLICES``).
  """
  if corpus_dir is None and not os.path.exists(DEFAULT_CORPUS_DIR):
    print(f"No corpus at {DEFAULT_CORPUS_DIR} (build it: "
          f"{BUILD_CORPUS_COMMAND}); using the embedded test slices in "
          f"{EMBEDDED_TEST_SLICES}.", flush=True)
    corpus_dir = EMBEDDED_TEST_SLICES
  register_local_tasks(corpus_dir)
  register_paper_tasks(vocab_path) if vocab_path else register_paper_tasks()


def register_paper_tasks(vocab_path: Optional[str] = T5_DEFAULT_VOCAB_PATH,
                         tfds_data_dir: Optional[str] = TFDS_DATA_DIR,
                         wmt_tfds_name: str = WMT_ENDE_TFDS_NAME,
                         cnn_dailymail_tfds_name: str = CNN_DAILYMAIL_TFDS_NAME,
                         splits: Sequence[str] = SPLITS,
                         ) -> Tuple[str, ...]:
  """(Re)registers the TFDS tasks of the paper; returns their names.

  ``vocab_path=None`` means the shipped local vocabulary. Registration does
  not open the vocabulary nor the TFDS data. Split sizes come from the
  prepared TFDS data, so under ``tfds.testing.mock_data`` call
  ``get_dataset(..., try_in_mem_cache=False)``.
  """
  output_features = get_output_features(get_vocabulary(vocab_path))
  specs = (
      (WMT_ENDE_TASK, wmt_tfds_name, {"inputs": "en", "targets": "de"},
       TRANSLATE_PREFIX, [bleu]),
      (CNN_DAILYMAIL_TASK, cnn_dailymail_tfds_name,
       {"inputs": "article", "targets": "highlights"}, SUMMARIZE_PREFIX,
       [rouge]),
  )
  for name, tfds_name, key_map, prefix, metric_fns in specs:
    _replace_task(
        name,
        source=seqio.TfdsDataSource(tfds_name=tfds_name,
                                    tfds_data_dir=tfds_data_dir,
                                    splits=tuple(splits)),
        preprocessors=_preprocessors(key_map, prefix),
        output_features=output_features,
        postprocess_fn=postprocess_text,
        metric_fns=metric_fns)
  return PAPER_TASKS


register_local_tasks()
register_paper_tasks()
