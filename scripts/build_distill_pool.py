#!/usr/bin/env python3
"""Builds the distillation pool: English inputs of both local tasks, from all English Debian package descriptions.

  python scripts/build_distill_pool.py --out data/pool
  python scripts/build_distill_pool.py --out data/pool --skip_fetch   # lists already in --apt_dir

The pool (specdec/data/distill_pool.py) has the local corpus's layout, so
`python scripts/build_distill_corpus.py --corpus data/pool ...` decodes it with
the target. Its train split holds the corpus's train rows (with references) and
every other English input of the same kind from the corpus's lists (--lists_dir)
and from the lists of other releases and components, which are fetched with
apt into a private folder (--apt_dir; needs root and apt-get; the archives are
derived from the system's own apt sources). validation/test are the corpus's.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))

from specdec.data import apt_lists  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.data import distill_pool  # pylint: disable=g-import-not-at-top,wrong-import-position


def relative_command(argv, script="scripts/build_distill_pool.py"):
  """The command line with absolute paths made relative to the working folder."""
  out = []
  for arg in argv:
    key, sep, value = arg.partition("=")
    if sep and key.startswith("--") and os.path.isabs(value):
      arg = f"{key}={os.path.relpath(value)}"
    elif os.path.isabs(arg):
      arg = os.path.relpath(arg)
    out.append(arg)
  return " ".join(["python", script] + out)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="data/pool",
                      help="output folder (the corpus layout + manifest.json)")
  parser.add_argument("--corpus", default="data/corpus",
                      help="the local corpus (train rows join the pool; "
                           "validation/test are copied and held out)")
  parser.add_argument("--lists_dir", default="data/apt/lists",
                      help="the corpus's apt lists (read first)")
  parser.add_argument("--apt_dir", default="data/apt_pool",
                      help="private apt folder for the other releases' lists")
  parser.add_argument("--releases", nargs="+",
                      default=list(distill_pool.DEFAULT_RELEASES),
                      help="releases to read, in priority order")
  parser.add_argument("--components", nargs="+",
                      default=list(distill_pool.DEFAULT_COMPONENTS))
  parser.add_argument("--skip_fetch", action="store_true",
                      help="use the lists already in --apt_dir (no apt-get)")
  parser.add_argument("--apt_get", default=None,
                      help=f"apt-get binary (default ${apt_lists.APT_GET_ENV} "
                           "or apt-get on PATH)")
  args = parser.parse_args(argv)

  t0 = time.time()

  def log(msg):
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

  pool_lists = os.path.join(args.apt_dir, "lists")
  if not args.skip_fetch:
    try:
      pool_lists = distill_pool.fetch_pool_lists(
          args.apt_dir, args.releases, args.components,
          have=distill_pool.suite_components(args.lists_dir),
          apt_get=args.apt_get, log=log)
    except RuntimeError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
  lists_dirs = [args.lists_dir] + ([pool_lists] if os.path.isdir(pool_lists)
                                   else [])
  command = relative_command(sys.argv[1:] if argv is None else argv)
  manifest = distill_pool.build_pool(args.corpus, lists_dirs, args.out,
                                     releases=args.releases, command=command,
                                     log=log)
  print(f"\nWrote {args.out} in {time.time() - t0:.1f}s")
  for name, corpus in manifest["corpora"].items():
    train = corpus["splits"]["train"]
    print(f"  {name}: train {train['count']:,} ({corpus['with_reference']:,} "
          f"with a reference), leakage drops {corpus['leakage_dropped']}")
    for origin, st in corpus["sources"].items():
      print(f"    {origin:36s} new {st.get('new_unique', 0):8,d}  kept "
            f"{st['kept']:8,d}  (occurrences {st.get('occurrences', 0):,}, "
            f"held out {st.get('held_out_occurrences', 0):,})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
