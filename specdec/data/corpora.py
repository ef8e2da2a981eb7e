"""Real English/German text from Debian package descriptions (DDTP).

Two corpora are built from the Debian Description Translation Project lists
that apt downloads (`Translation-en`, `Translation-de`) and the `Packages`
lists (for each binary package's *source* package):

* ``translate_en_de``: English -> German pairs. English and German
  descriptions are joined on ``Description-md5`` (the md5 of the English
  original, so a German entry always translates the *current* English text).
  The short descriptions are paired (kind ``short``); long descriptions with
  the same number of paragraphs are split into sentences and paired where the
  per-paragraph sentence counts match (kind ``sentence``). Pairs must have
  3-60 words on both sides, untranslated pairs (identical text) are dropped,
  and the corpus is de-duplicated on the English side.
* ``summarize_ddtp``: English long description (the document, >= 30 words)
  -> English short description (the summary), kind ``long``, de-duplicated on
  the document.

Splits are keyed by a stable hash of the source package (sister binaries such
as ``foo``/``libfoo-dev``/``foo-doc`` share text and always land in the same
split): sha256("specdec-ddtp-split-v1:" + source) mapped to [0, 1) gives
train < 0.90 <= validation < 0.95 <= test (90/5/5). Afterwards every
validation/test row whose English input, or whose first 25 words
(case-insensitive), also occurs among the train inputs is dropped; the number
of drops is recorded in the manifest.

The translation train split may also hold pairs from other sources
(``extra_train_rows``: bilingual documentation and gettext catalogs,
``specdec/data/parallel_sources.py``), appended after its DDTP rows. They go to
train only and are dropped when their source package is held out or their
English opening words match a validation/test item, so the validation and
test splits are byte-identical with or without them.

Every row names its source in ``origin`` (``ddtp``, ``doc:<package>``,
``gettext:<package>``); the manifest counts rows per origin and split.

The JSON Lines rows hold raw text; the task prefixes (``TRANSLATE_PREFIX``,
``SUMMARIZE_PREFIX``) are added by the task definitions, not stored here.

Every build from the same lists is byte-identical (everything is sorted, no
timestamps), and ``manifest.json`` records counts and sha256 checksums of the
outputs and of the input lists.
"""

from __future__ import annotations

import bz2
import collections
import dataclasses
import gzip
import hashlib
import json
import lzma
import os
import re
import time
from typing import (Callable, Collection, Dict, Iterable, Iterator, List,
                    Mapping, Optional, Sequence, Tuple)

from specdec import fileio
from specdec.data import apt_lists
from specdec.task_names import CORPORA
from specdec.task_names import SUMMARIZATION_CORPUS
from specdec.task_names import SUMMARIZE_PREFIX
from specdec.task_names import TRANSLATE_PREFIX
from specdec.task_names import TRANSLATION_CORPUS

ORIGIN = "ddtp"

SPLITS = ("train", "validation", "test")
DEFAULT_RATIOS = (0.90, 0.05, 0.05)
SPLIT_SALT = "specdec-ddtp-split-v1"

MIN_WORDS = 3  # translation pairs: words per side, inclusive
MAX_WORDS = 60
MIN_DOC_WORDS = 30  # summarization documents
LEAK_PREFIX_WORDS = 25

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1

LIST_KINDS = ("Translation-en", "Translation-de", "Packages")
_COMPRESSIONS = ("gz", "xz", "bz2", "lz4", "zst")
_LIST_RE = re.compile(
    r"^(?:.*_)?(?P<kind>Translation-en|Translation-de|Packages)"
    r"(?:\.(?P<ext>%s))?$" % "|".join(_COMPRESSIONS))

# Kinds in output order within a description.
_KIND_ORDER = {"short": 0, "sentence": 1, "long": 2}

Log = Callable[[str], None]


def _no_log(_: str) -> None:
  pass


# --------------------------------------------------------------------------
# Fetching the lists with apt.
# --------------------------------------------------------------------------

_HELP = (
    "Building the DDTP corpora needs the Debian package lists "
    "(Translation-en, Translation-de, Packages). Either run on a Debian/Ubuntu "
    "machine with apt-get as root (the lists are fetched with `apt-get update` "
    "into a private folder; the system's own apt state is not touched), or "
    "pass lists_dir (--lists_dir) pointing at already-downloaded lists.")

def fetch_lists(apt_dir: str,
                apt_get: Optional[str] = None,
                languages: Sequence[str] = ("en", "de"),
                timeout: float = 600,
                log: Log = _no_log) -> str:
  """Downloads the package and translation lists with apt; returns lists dir.

  Uses the machine's configured sources through a private APT_CONFIG:
  an empty Dir::Etc::Parts (so apt.conf.d settings such as
  `Acquire::Languages "none"` do not apply), private Dir::State::Lists and
  Dir::Cache, and `Acquire::Languages { "en"; "de"; }`.

  Args:
    apt_dir: private folder (created) for the configuration, lists and cache.
    apt_get: apt-get binary; default $SPECDEC_APT_GET or `apt-get` on PATH.
    languages: DDTP languages to fetch.
    timeout: seconds for `apt-get update`.
    log: progress callback.

  Raises:
    RuntimeError: apt-get is missing, we are not root, or the update failed.
  """
  apt_get = apt_lists.resolve_apt_get(apt_get, remedy=_HELP)
  apt_lists.require_root(remedy=_HELP)
  conf = apt_lists.write_config(apt_dir, languages)
  apt_lists.run_update(apt_get, conf, timeout=timeout, log=log, remedy=_HELP)
  lists_dir = apt_lists.lists_dir(apt_dir)
  found = find_lists(lists_dir)  # raises if a kind is missing
  for kind in LIST_KINDS:
    for path in found[kind]:
      log(f"  {list_display_name(path)}: {os.path.getsize(path):,} bytes")
  return lists_dir


def list_display_name(path: str) -> str:
  """A list's file name without the repository prefix (no host names)."""
  name = os.path.basename(path)
  if "_dists_" in name:
    return name.split("_dists_", 1)[1]
  return name.rsplit("_", 1)[-1]


def find_lists(lists_dir: str) -> Dict[str, List[str]]:
  """Finds the Translation-en/-de and Packages lists in an apt lists folder.

  Returns {kind: sorted paths}; raises RuntimeError if a kind is missing.
  """
  if not os.path.isdir(lists_dir):
    raise RuntimeError(f"lists folder {lists_dir!r} does not exist. {_HELP}")
  found: Dict[str, List[str]] = {kind: [] for kind in LIST_KINDS}
  for name in sorted(os.listdir(lists_dir)):
    path = os.path.join(lists_dir, name)
    m = _LIST_RE.match(name)
    if m and os.path.isfile(path):
      found[m.group("kind")].append(path)
  missing = [kind for kind in LIST_KINDS if not found[kind]]
  if missing:
    raise RuntimeError(
        f"no {', '.join(missing)} list in {lists_dir!r} (found: "
        f"{sorted(os.listdir(lists_dir))[:20]}). Is Acquire::Languages set to "
        f"include en and de? {_HELP}")
  return found


def read_list_lines(path: str) -> Iterator[str]:
  """Yields the lines (without newline) of a possibly compressed list."""
  ext = path.rsplit(".", 1)[-1] if "." in os.path.basename(path) else ""
  if ext == "gz":
    f = gzip.open(path, "rt", encoding="utf-8", errors="replace")
  elif ext == "xz":
    f = lzma.open(path, "rt", encoding="utf-8", errors="replace")
  elif ext == "bz2":
    f = bz2.open(path, "rt", encoding="utf-8", errors="replace")
  elif ext in ("lz4", "zst"):
    raise RuntimeError(
        f"{path} is {ext}-compressed, which the Python standard library cannot "
        f"read; decompress it first or re-fetch with fetch_lists(), which "
        f"keeps the lists uncompressed.")
  else:
    f = open(path, "rt", encoding="utf-8", errors="replace")
  with f:
    for line in f:
      yield line.rstrip("\n")


# --------------------------------------------------------------------------
# deb822 parsing (pure functions).
# --------------------------------------------------------------------------


def parse_deb822(lines: Iterable[str],
                 keep: Optional[Collection[str]] = None
                 ) -> Iterator[Dict[str, str]]:
  """Parses deb822 stanzas (blank-line separated `Field: value` blocks).

  Continuation lines (starting with a space or tab) are appended to the value
  with '\\n' and keep their leading whitespace, so a Description's layout
  (` .` paragraph separators, verbatim lines) survives.

  Args:
    lines: text lines (a trailing newline on each is ignored).
    keep: if given, only these fields are stored (faster for big lists).
  """
  stanza: Dict[str, str] = {}
  field: Optional[str] = None
  for line in lines:
    line = line.rstrip("\r\n")
    if not line.strip():
      if stanza:
        yield stanza
      stanza, field = {}, None
      continue
    if line.startswith("#"):
      continue
    if line[0] in " \t":
      if field is not None:
        stanza[field] += "\n" + line
      continue
    name, sep, value = line.partition(":")
    if not sep:
      field = None  # malformed line; ignore it and its continuations
      continue
    name = name.strip()
    if keep is not None and name not in keep:
      field = None
      continue
    field = name
    stanza[field] = value.strip()
  if stanza:
    yield stanza


@dataclasses.dataclass(frozen=True)
class Description:
  """One entry of a Translation-<lang> list."""
  package: str
  md5: str
  lang: str
  short: str
  long_lines: Tuple[str, ...]  # extended description, one leading space removed


def parse_description(value: str) -> Tuple[str, Tuple[str, ...]]:
  """Splits a Description field value into (short, long lines)."""
  first, *rest = value.split("\n")
  long_lines = tuple(line[1:] if line[:1] in (" ", "\t") else line
                     for line in rest)
  return normalize_ws(first), long_lines


def parse_translation(lines: Iterable[str]) -> Iterator[Description]:
  """Parses a Translation-<lang> list into Description entries."""
  for stanza in parse_deb822(lines):
    package = stanza.get("Package")
    md5 = stanza.get("Description-md5")
    desc_fields = [k for k in stanza if k.startswith("Description-")
                   and k != "Description-md5"]
    if not package or not md5 or len(desc_fields) != 1:
      continue
    lang = desc_fields[0][len("Description-"):]
    short, long_lines = parse_description(stanza[desc_fields[0]])
    yield Description(package=package, md5=md5.lower(), lang=lang,
                      short=short, long_lines=long_lines)


def source_name(stanza: Mapping[str, str]) -> str:
  """The source package of a Packages stanza (version in parentheses removed)."""
  source = stanza.get("Source", "").split("(", 1)[0].strip()
  return source or stanza["Package"]


def parse_packages(lines: Iterable[str]) -> Dict[str, str]:
  """Parses a Packages list into {binary package: source package}.

  If a package appears more than once with different sources (it should not),
  the alphabetically first source is kept, for determinism.
  """
  out: Dict[str, str] = {}
  for stanza in parse_deb822(lines, keep=("Package", "Source")):
    if "Package" not in stanza:
      continue
    package, source = stanza["Package"], source_name(stanza)
    if package not in out or source < out[package]:
      out[package] = source
  return out


# --------------------------------------------------------------------------
# Description text handling.
# --------------------------------------------------------------------------


def normalize_ws(text: str) -> str:
  return " ".join(text.split())


def word_count(text: str) -> int:
  return len(text.split())


def paragraphs(long_lines: Sequence[str]) -> List[List[str]]:
  """Splits extended-description lines into paragraphs (` .` separates)."""
  pars: List[List[str]] = [[]]
  for line in long_lines:
    if line.strip() == ".":
      pars.append([])
    else:
      pars[-1].append(line)
  return [p for p in pars if any(line.strip() for line in p)]


def paragraph_text(par: Sequence[str]) -> str:
  return normalize_ws(" ".join(par))


_BULLET_RE = re.compile(r"^\s*([*+\-o•·])\s+(?=\S)")


def paragraph_units(par: Sequence[str]) -> List[str]:
  """Splits a paragraph into units: running text, and one unit per bullet."""
  units: List[List[str]] = [[]]
  for line in par:
    m = _BULLET_RE.match(line)
    if m:
      units.append([line[m.end():]])
    else:
      units[-1].append(line)
  return [t for t in (normalize_ws(" ".join(u)) for u in units) if t]


_ABBREVIATIONS = frozenset(
    a.lower() for a in (
        "vs.", "cf.", "approx.", "incl.", "esp.", "resp.", "Dr.",
        "Mr.", "Mrs.", "Ms.", "St.", "No.", "Vol.", "Inc.", "Ltd.", "Corp.",
        "bzw.", "ca.", "evtl.", "ggf.", "bspw.", "sog.", "inkl.", "vgl.",
        "Nr.", "bzgl.", "max.", "min.", "Hr.", "Fr.", "Jh."))
_INITIALS_RE = re.compile(r"^\(?([A-Za-zÄÖÜäöü]\.)+$")  # e.g. i.e. z.B. A.D. d.
_CLOSERS = "\"')]»“”’"
_OPENERS = "\"'(„“‚»«["


def _is_boundary(token: str, following: str) -> bool:
  core = token.rstrip(_CLOSERS)
  if not core or core[-1] not in ".!?":
    return False
  if core[-1] == "." and (_INITIALS_RE.match(core) or
                          core.lower() in _ABBREVIATIONS):
    return False
  first = following.lstrip(_OPENERS)[:1]
  return bool(first) and first.isupper()


def split_sentences(text: str) -> List[str]:
  """Rule-based sentence splitter for English and German description text.

  A sentence ends at a token ending in . ! or ? (optionally followed by
  quotes/brackets) when the next token starts with an uppercase letter, unless
  the token is an abbreviation (e.g., i.e., z. B., d. h., bzw., ...).
  """
  tokens = text.split()
  sentences, current = [], []
  for i, token in enumerate(tokens):
    current.append(token)
    if i + 1 < len(tokens) and _is_boundary(token, tokens[i + 1]):
      sentences.append(" ".join(current))
      current = []
  if current:
    sentences.append(" ".join(current))
  return sentences


def description_sentences(par: Sequence[str]) -> List[str]:
  return [s for unit in paragraph_units(par) for s in split_sentences(unit)]


def long_text(long_lines: Sequence[str]) -> str:
  """The long description as one line of text (paragraphs joined by a space)."""
  return " ".join(paragraph_text(p) for p in paragraphs(long_lines))


# --------------------------------------------------------------------------
# Building the corpora.
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Lists:
  """Parsed input lists."""
  en: Dict[str, Description]  # md5 -> entry (first seen)
  de: Dict[str, Description]
  packages_by_md5: Dict[str, List[str]]  # md5 -> sorted packages (English)
  source_of: Dict[str, str]  # binary package -> source package
  inputs: List[Dict[str, object]]  # name, bytes, sha256 per list file
  stats: Dict[str, int]


def load_lists(lists_dir: str, log: Log = _no_log) -> Lists:
  """Reads and parses all Translation-en/-de and Packages lists in a folder."""
  found = find_lists(lists_dir)
  inputs = []
  for kind in LIST_KINDS:
    for path in found[kind]:
      inputs.append({"name": list_display_name(path),
                     "bytes": os.path.getsize(path),
                     "sha256": fileio.file_sha256(path)})
  by_lang: Dict[str, Dict[str, Description]] = {"en": {}, "de": {}}
  packages: Dict[str, set] = collections.defaultdict(set)
  entries = {"en": 0, "de": 0}
  for lang in ("en", "de"):
    for path in found[f"Translation-{lang}"]:
      for d in parse_translation(read_list_lines(path)):
        if d.lang != lang:
          continue
        entries[lang] += 1
        by_lang[lang].setdefault(d.md5, d)
        if lang == "en":
          packages[d.md5].add(d.package)
    log(f"parsed Translation-{lang}: {entries[lang]:,} entries, "
        f"{len(by_lang[lang]):,} distinct descriptions")
  source_of: Dict[str, str] = {}
  for path in found["Packages"]:
    for package, source in parse_packages(read_list_lines(path)).items():
      if package not in source_of or source < source_of[package]:
        source_of[package] = source
  log(f"parsed Packages: {len(source_of):,} binary packages, "
      f"{len(set(source_of.values())):,} source packages")
  all_packages = {p for ps in packages.values() for p in ps}
  stats = {
      "translation_en_entries": entries["en"],
      "translation_de_entries": entries["de"],
      "descriptions_en": len(by_lang["en"]),
      "descriptions_de": len(by_lang["de"]),
      "binary_packages_in_packages_lists": len(source_of),
      "en_packages_missing_from_packages_lists": len(
          all_packages - source_of.keys()),
  }
  return Lists(en=by_lang["en"], de=by_lang["de"],
               packages_by_md5={k: sorted(v) for k, v in packages.items()},
               source_of=source_of, inputs=inputs, stats=stats)


def provenance(md5: str, lists: Lists) -> Tuple[str, str]:
  """(source_package, package) for a description shared by >= 1 packages.

  Packages missing from the Packages lists (e.g. other architectures) are
  their own source. With several packages the alphabetically first
  (source, package) is used.
  """
  pkgs = lists.packages_by_md5.get(md5) or [lists.en[md5].package]
  return min((lists.source_of.get(p, p), p) for p in pkgs)


def _row(inputs: str, targets: str, source: str, package: str, kind: str,
         md5: str, segment: int) -> Dict[str, object]:
  return {"inputs": inputs, "targets": targets, "source_package": source,
          "package": package, "kind": kind, "origin": ORIGIN,
          "description_md5": md5, "segment": segment}


def _in_range(text: str) -> bool:
  return MIN_WORDS <= word_count(text) <= MAX_WORDS


def _row_sort_key(row: Mapping[str, object]):
  return (row["source_package"], row["package"], row["description_md5"],
          _KIND_ORDER.get(row["kind"], 99), row["segment"], row["inputs"],
          row["targets"])


def dedupe(rows: Iterable[Dict[str, object]], key: str = "inputs"
           ) -> Tuple[List[Dict[str, object]], int]:
  """Keeps one row per value of `key` (the first in provenance order)."""
  seen = set()
  out = []
  rows = sorted(rows, key=_row_sort_key)
  for row in rows:
    if row[key] in seen:
      continue
    seen.add(row[key])
    out.append(row)
  return out, len(rows) - len(out)


def translation_rows(lists: Lists) -> Tuple[List[Dict[str, object]],
                                            Dict[str, int]]:
  """EN->DE pairs from descriptions present in both languages."""
  stats = collections.Counter()
  rows = []
  for md5 in sorted(lists.en.keys() & lists.de.keys()):
    en, de = lists.en[md5], lists.de[md5]
    stats["joined_descriptions"] += 1
    source, package = provenance(md5, lists)
    candidates = [("short", 0, en.short, de.short)]
    en_pars, de_pars = paragraphs(en.long_lines), paragraphs(de.long_lines)
    if len(en_pars) == len(de_pars):
      stats["same_paragraph_count"] += 1
      segment = 0
      for en_par, de_par in zip(en_pars, de_pars):
        en_sents = description_sentences(en_par)
        de_sents = description_sentences(de_par)
        if len(en_sents) != len(de_sents):
          stats["paragraphs_sentence_count_mismatch"] += 1
          continue
        stats["paragraphs_paired"] += 1
        for en_s, de_s in zip(en_sents, de_sents):
          segment += 1
          candidates.append(("sentence", segment, en_s, de_s))
    else:
      stats["paragraph_count_mismatch"] += 1
    for kind, segment, en_text, de_text in candidates:
      stats[f"candidates_{kind}"] += 1
      if not (_in_range(en_text) and _in_range(de_text)):
        stats[f"dropped_length_{kind}"] += 1
        continue
      if en_text == de_text:
        stats[f"dropped_untranslated_{kind}"] += 1
        continue
      rows.append(_row(en_text, de_text, source, package, kind, md5, segment))
  rows, dups = dedupe(rows, "inputs")
  stats["dropped_duplicate_english"] = dups
  stats["pairs"] = len(rows)
  return rows, dict(sorted(stats.items()))


def summarization_rows(lists: Lists) -> Tuple[List[Dict[str, object]],
                                              Dict[str, int]]:
  """English long description -> short description pairs."""
  stats = collections.Counter()
  rows = []
  for md5 in sorted(lists.en):
    en = lists.en[md5]
    doc = long_text(en.long_lines)
    if not doc or not en.short:
      stats["dropped_no_long_description"] += 1
      continue
    if word_count(doc) < MIN_DOC_WORDS:
      stats["dropped_short_document"] += 1
      continue
    source, package = provenance(md5, lists)
    rows.append(_row(doc, en.short, source, package, "long", md5, 0))
  rows, dups = dedupe(rows, "inputs")
  stats["dropped_duplicate_document"] = dups
  stats["pairs"] = len(rows)
  return rows, dict(sorted(stats.items()))


def split_of(source_package: str,
             ratios: Sequence[float] = DEFAULT_RATIOS,
             salt: str = SPLIT_SALT) -> str:
  """Deterministic split of a source package: sha256(salt:source) -> [0,1)."""
  if len(ratios) != len(SPLITS) or abs(sum(ratios) - 1.0) > 1e-9:
    raise ValueError(f"ratios must be 3 numbers summing to 1, got {ratios}")
  digest = hashlib.sha256(f"{salt}:{source_package}".encode("utf-8")).digest()
  x = int.from_bytes(digest[:8], "big") / 2.0**64
  cumulative = 0.0
  for split, ratio in zip(SPLITS, ratios):
    cumulative += ratio
    if x < cumulative:
      return split
  return SPLITS[-1]


def split_rows(rows: Iterable[Dict[str, object]],
               ratios: Sequence[float] = DEFAULT_RATIOS,
               salt: str = SPLIT_SALT) -> Dict[str, List[Dict[str, object]]]:
  out: Dict[str, List[Dict[str, object]]] = {s: [] for s in SPLITS}
  for row in rows:
    out[split_of(row["source_package"], ratios, salt)].append(row)
  for split in SPLITS:
    out[split].sort(key=_row_sort_key)
  return out


def _leak_keys(text: str) -> Tuple[str, str]:
  words = text.lower().split()
  return " ".join(words), " ".join(words[:LEAK_PREFIX_WORDS])


def filter_leakage(splits: Mapping[str, List[Dict[str, object]]],
                   field: str = "inputs"
                   ) -> Tuple[Dict[str, List[Dict[str, object]]],
                              Dict[str, int]]:
  """Drops validation/test rows whose `field` text or first 25 words
  (case-insensitive, whitespace-normalized) also occur in train.

  Returns (filtered splits, {split: number dropped}).
  """
  full, prefixes = set(), set()
  for row in splits["train"]:
    f, p = _leak_keys(row[field])
    full.add(f)
    prefixes.add(p)
  out = {"train": list(splits["train"])}
  dropped = {}
  for split in SPLITS[1:]:
    kept = []
    for row in splits[split]:
      f, p = _leak_keys(row[field])
      if f in full or p in prefixes:
        continue
      kept.append(row)
    out[split] = kept
    dropped[split] = len(splits[split]) - len(kept)
  return out, dropped


# --------------------------------------------------------------------------
# Extra EN->DE pairs (train only).
# --------------------------------------------------------------------------

EXTRA_FIELDS = ("inputs", "targets", "package", "origin", "kind", "segment")


def held_out(splits_by_corpus: Mapping[str, Mapping[str, Sequence[Mapping]]]
             ) -> Dict[str, set]:
  """What extra train pairs must not touch, from the written splits.

  Returns sets: ``sources`` and ``packages`` of every validation/test row of
  any corpus, ``full`` and ``prefix`` leak keys of their inputs, and
  ``targets`` (lower-cased German references of the translation corpus).
  """
  held: Dict[str, set] = {k: set() for k in
                          ("sources", "packages", "full", "prefix", "targets")}
  for name, splits in splits_by_corpus.items():
    for split in SPLITS[1:]:
      for row in splits[split]:
        held["sources"].add(row["source_package"])
        held["packages"].add(row["package"])
        full, prefix = _leak_keys(str(row["inputs"]))
        held["full"].add(full)
        held["prefix"].add(prefix)
        if name == TRANSLATION_CORPUS:
          held["targets"].add(_leak_keys(str(row["targets"]))[0])
  return held


def extra_train_rows(pairs: Iterable[Mapping[str, object]],
                     splits_by_corpus: Mapping[str, Mapping[str, Sequence[Mapping]]],
                     source_of: Mapping[str, str],
                     ratios: Sequence[float] = DEFAULT_RATIOS,
                     salt: str = SPLIT_SALT
                     ) -> Tuple[List[Dict[str, object]], Dict[str, object]]:
  """Translation train rows from extra sources, kept out of validation/test.

  A pair (``EXTRA_FIELDS``; ``package`` is the binary package that shipped
  it) is dropped when its source package (``source_of``, else the package
  itself) would not be a train source under this split, or is the source or
  package of a validation/test row (``held_out_package``); when its English
  text or first 25 words equal those of a validation/test input of either
  corpus, or its German text a translation reference
  (``leak_opening_words`` / ``leak_target``); and when its English text
  (case-insensitive) is already a translation input or an earlier pair's
  (``duplicate_english``). Input order is kept: earlier sources win.

  Returns (rows in the corpus's row format, {"filter": counts,
  "by_origin": {origin: counts}}).
  """
  held = held_out(splits_by_corpus)
  seen = {_leak_keys(str(row["inputs"]))[0]
          for split in SPLITS
          for row in splits_by_corpus[TRANSLATION_CORPUS][split]}
  totals: collections.Counter = collections.Counter()
  by_origin: Dict[str, collections.Counter] = collections.defaultdict(
      collections.Counter)
  rows = []
  for pair in pairs:
    missing = [f for f in EXTRA_FIELDS if f not in pair]
    if missing:
      raise ValueError(f"extra pair without {', '.join(missing)}: {pair!r}")
    package = str(pair["package"])
    source = source_of.get(package, package)
    full, prefix = _leak_keys(str(pair["inputs"]))
    if (split_of(source, ratios, salt) != "train" or source in held["sources"]
        or package in held["packages"]):
      reason = "dropped_held_out_package"
    elif full in held["full"] or prefix in held["prefix"]:
      reason = "dropped_leak_opening_words"
    elif _leak_keys(str(pair["targets"]))[0] in held["targets"]:
      reason = "dropped_leak_target"
    elif full in seen:
      reason = "dropped_duplicate_english"
    else:
      reason = "added"
      seen.add(full)
      rows.append({"inputs": pair["inputs"], "targets": pair["targets"],
                   "source_package": source, "package": package,
                   "kind": pair["kind"], "origin": pair["origin"],
                   "description_md5": "", "segment": int(pair["segment"])})
    for counter in (totals, by_origin[str(pair["origin"])]):
      counter["candidates"] += 1
      counter[reason] += 1
  return rows, {"filter": dict(sorted(totals.items())),
                "by_origin": {o: dict(sorted(c.items()))
                              for o, c in sorted(by_origin.items())}}


# --------------------------------------------------------------------------
# Writing.
# --------------------------------------------------------------------------


def build_corpora(lists_dir: str,
                  out_dir: str,
                  ratios: Sequence[float] = DEFAULT_RATIOS,
                  salt: str = SPLIT_SALT,
                  log: Log = _no_log,
                  extra_pairs: Optional[Sequence[Mapping[str, object]]] = None,
                  extra_report: Optional[Mapping[str, object]] = None
                  ) -> Dict[str, object]:
  """Builds both corpora from downloaded lists into `out_dir`.

  Layout: out_dir/<corpus>/<split>.jsonl and out_dir/manifest.json.
  `extra_pairs` (``EXTRA_FIELDS`` each, e.g. from
  ``parallel_sources.collect_pairs``) go to the translation train split
  only, after its DDTP rows, filtered by ``extra_train_rows``; the DDTP rows
  and the validation/test splits are the same with or without them.
  `extra_report` (its sources and input files) is stored in the manifest.
  Returns the manifest (also written).
  """
  t0 = time.time()
  lists = load_lists(lists_dir, log=log)
  log(f"lists loaded in {time.time() - t0:.1f}s")
  builders = {TRANSLATION_CORPUS: translation_rows,
              SUMMARIZATION_CORPUS: summarization_rows}
  built = {}
  for name in CORPORA:
    rows, stats = builders[name](lists)
    splits, dropped = filter_leakage(split_rows(rows, ratios, salt))
    built[name] = (splits, dropped, stats)
  extra_filter: Dict[str, object] = {}
  if extra_pairs is not None:
    extra, extra_filter = extra_train_rows(
        extra_pairs, {name: b[0] for name, b in built.items()},
        lists.source_of, ratios, salt)
    built[TRANSLATION_CORPUS][0]["train"] = (
        built[TRANSLATION_CORPUS][0]["train"] + extra)
    log(f"extra pairs: {extra_filter['filter']}")
  corpora_manifest = {}
  for name in CORPORA:
    splits, dropped, stats = built[name]
    files = {}
    for split in SPLITS:
      rel = f"{name}/{split}.jsonl"
      digest = fileio.write_jsonl(os.path.join(out_dir, rel), splits[split])
      files[split] = {"file": rel, "count": len(splits[split]),
                      "sha256": digest}
      log(f"{name:16s} {split:10s} {len(splits[split]):7,d} rows  "
          f"sha256 {digest}")
    kinds = collections.Counter(
        (split, row["kind"]) for split in SPLITS for row in splits[split])
    corpora_manifest[name] = {
        "splits": files,
        "leakage_dropped": dropped,
        "kinds": {split: {k: c for (s, k), c in sorted(kinds.items())
                          if s == split} for split in SPLITS},
        "sources": {split: len({r["source_package"] for r in splits[split]})
                    for split in SPLITS},
        "origins": {split: dict(sorted(collections.Counter(
            str(r["origin"]) for r in splits[split]).items()))
                    for split in SPLITS},
        "stats": stats,
    }
    log(f"{name:16s} leakage drops: validation {dropped['validation']:,}, "
        f"test {dropped['test']:,}")
  manifest = {
      "format_version": FORMAT_VERSION,
      "origin": ORIGIN,
      "split": {"ratios": dict(zip(SPLITS, ratios)), "salt": salt,
                "key": "sha256(salt + ':' + source_package), first 8 bytes "
                       "as a fraction of 2**64, cumulative ratios"},
      "filters": {"translation_words": [MIN_WORDS, MAX_WORDS],
                  "summarization_min_document_words": MIN_DOC_WORDS,
                  "leakage_prefix_words": LEAK_PREFIX_WORDS},
      "prefixes": {TRANSLATION_CORPUS: TRANSLATE_PREFIX,
                   SUMMARIZATION_CORPUS: SUMMARIZE_PREFIX},
      "inputs": lists.inputs,
      "input_stats": lists.stats,
      "corpora": corpora_manifest,
      "extra_sources": dict(extra_report or {}, enabled=extra_pairs is not None,
                            **extra_filter),
  }
  data = (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False)
          + "\n").encode("utf-8")
  fileio.atomic_write(os.path.join(out_dir, MANIFEST_NAME), data)
  digest = fileio.sha256_hex(data)
  log(f"manifest.json sha256 {digest}; built in {time.time() - t0:.1f}s")
  return manifest


def verify_manifest(out_dir: str) -> Dict[str, object]:
  """Re-checks counts and checksums of a built corpus; raises on mismatch."""
  with open(os.path.join(out_dir, MANIFEST_NAME), encoding="utf-8") as f:
    manifest = json.load(f)
  for name, corpus in manifest["corpora"].items():
    for split, info in corpus["splits"].items():
      path = os.path.join(out_dir, info["file"])
      digest = fileio.file_sha256(path)
      if digest != info["sha256"]:
        raise ValueError(f"{path}: sha256 {digest} != {info['sha256']}")
      with open(path, "rb") as fh:
        count = sum(1 for _ in fh)
      if count != info["count"]:
        raise ValueError(f"{path}: {count} rows != {info['count']}")
  return manifest


def corpus_path(out_dir: str, corpus: str, split: str) -> str:
  return os.path.join(out_dir, corpus, f"{split}.jsonl")
