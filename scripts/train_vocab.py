#!/usr/bin/env python3
"""Trains the shipped SentencePiece vocabulary on the DDTP train splits.

  python scripts/build_corpus.py --out data/corpus
  python scripts/train_vocab.py --corpus data/corpus

Writes specdec/assets/spm_ende_8k.model and .vocab. The training text is the
TRAIN split of both corpora, in file order: for each translation row
"translate English to German: <en>" then "<de>", then for each summarization
row "summarize: <document>" then "<summary>". It is also written to
data/vocab/spm_train.txt so its sha256 can be recorded.

T5 conventions: unigram, 8000 pieces, pad=0, eos=1, unk=2, no bos, byte
fallback (no unknown characters), NMT-NFKC normalization. Deterministic: fixed
input order, all sentences used (input_sentence_size=0), no shuffling, a fixed
thread count, and the model is serialized in memory so no local paths end up
in it. --check_determinism trains twice and compares bytes.
"""

import argparse
import hashlib
import io
import json
import os
import sys
import time

import sentencepiece as spm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))

from specdec.data import corpora  # pylint: disable=g-import-not-at-top
from specdec import fileio  # pylint: disable=g-import-not-at-top

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(REPO, "specdec", "assets", "spm_ende_8k.model")

TRAINER_OPTIONS = dict(
    model_type="unigram",
    vocab_size=8000,
    pad_id=0,
    eos_id=1,
    unk_id=2,
    bos_id=-1,
    byte_fallback=True,
    character_coverage=0.9995,
    normalization_rule_name="nmt_nfkc",
    input_sentence_size=0,
    shuffle_input_sentence=False,
    max_sentence_length=16384,
    num_threads=8,
    minloglevel=1,
)


def training_lines(corpus_dir):
  """Training sentences from the train splits, in a fixed order."""
  lines = []
  prefixes = {corpora.TRANSLATION_CORPUS: corpora.TRANSLATE_PREFIX,
              corpora.SUMMARIZATION_CORPUS: corpora.SUMMARIZE_PREFIX}
  for name in corpora.CORPORA:
    path = corpora.corpus_path(corpus_dir, name, "train")
    for row in fileio.read_jsonl(path):
      lines.append(prefixes[name] + row["inputs"])
      lines.append(row["targets"])
  return lines


def train(lines):
  """Trains and returns the serialized model proto (bytes)."""
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines),
                                 model_writer=buf, **TRAINER_OPTIONS)
  return buf.getvalue()


def vocab_text(model_bytes):
  """The .vocab file: piece<TAB>score per line, like spm_train writes."""
  sp = spm.SentencePieceProcessor(model_proto=model_bytes)
  return "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n"
                 for i in range(sp.get_piece_size()))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--corpus", default="data/corpus")
  parser.add_argument("--model", default=DEFAULT_MODEL,
                      help="output .model path (.vocab is written next to it)")
  parser.add_argument("--text_out", default="data/vocab/spm_train.txt",
                      help="where the training text is written (for its sha256)")
  parser.add_argument("--check_determinism", action="store_true",
                      help="train twice and require identical bytes")
  args = parser.parse_args(argv)

  t0 = time.time()
  corpora.verify_manifest(args.corpus)
  lines = training_lines(args.corpus)
  text = "".join(line + "\n" for line in lines).encode("utf-8")
  text_sha = hashlib.sha256(text).hexdigest()
  fileio.atomic_write(args.text_out, text)
  print(f"training text: {len(lines):,} lines, {len(text):,} bytes, "
        f"sha256 {text_sha} -> {args.text_out}", flush=True)

  model = train(lines)
  print(f"trained in {time.time() - t0:.1f}s", flush=True)
  if args.check_determinism:
    again = train(lines)
    same = again == model
    print(f"determinism check: second training "
          f"{'identical' if same else 'DIFFERENT'} "
          f"(sha256 {hashlib.sha256(again).hexdigest()})", flush=True)
    if not same:
      return 1
  fileio.atomic_write(args.model, model)
  model_sha = fileio.sha256_hex(model)
  fileio.atomic_write(
      os.path.splitext(args.model)[0] + ".vocab",
      vocab_text(model).encode("utf-8"))
  manifest_sha = hashlib.sha256(
      open(os.path.join(args.corpus, corpora.MANIFEST_NAME), "rb").read()
  ).hexdigest()
  print(json.dumps({"model": os.path.relpath(args.model, REPO),
                    "model_sha256": model_sha,
                    "training_text_sha256": text_sha,
                    "training_lines": len(lines),
                    "corpus_manifest_sha256": manifest_sha,
                    "sentencepiece": spm.__version__}, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
