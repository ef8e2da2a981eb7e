#!/usr/bin/env python3
"""Fetches the Debian DDTP lists with apt and builds the EN->DE and
summarization corpora (see specdec/corpora.py).

  python scripts/build_corpus.py --out data/corpus
  python scripts/build_corpus.py --out data/corpus --lists_dir data/apt/lists

Without --lists_dir the lists are downloaded with `apt-get update` into a
private folder (--apt_dir, default data/apt; needs root and apt-get).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))

from specdec import corpora  # pylint: disable=g-import-not-at-top


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="data/corpus",
                      help="output folder for the JSONL splits + manifest")
  parser.add_argument("--lists_dir", default=None,
                      help="build from already-downloaded apt lists "
                           "(Translation-en/-de, Packages); skips apt")
  parser.add_argument("--apt_dir", default="data/apt",
                      help="private apt folder (config, lists, cache)")
  parser.add_argument("--apt_get", default=None,
                      help=f"apt-get binary (default ${corpora.APT_GET_ENV} "
                           "or apt-get on PATH)")
  parser.add_argument("--ratios", default=",".join(
      str(r) for r in corpora.DEFAULT_RATIOS),
                      help="train,validation,test fractions")
  args = parser.parse_args(argv)
  ratios = tuple(float(x) for x in args.ratios.split(","))

  def log(msg):
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

  t0 = time.time()
  lists_dir = args.lists_dir
  if lists_dir is None:
    try:
      lists_dir = corpora.fetch_lists(args.apt_dir, apt_get=args.apt_get,
                                      log=log)
    except RuntimeError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
  manifest = corpora.build_corpora(lists_dir, args.out, ratios=ratios, log=log)
  print(f"\nWrote {os.path.abspath(args.out)} in {time.time() - t0:.1f}s")
  for name, corpus in manifest["corpora"].items():
    for split, info in corpus["splits"].items():
      print(f"  {info['file']:34s} {info['count']:7,d}  {info['sha256']}")
    d = corpus["leakage_dropped"]
    print(f"  {name}: leakage drops validation={d['validation']} "
          f"test={d['test']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
