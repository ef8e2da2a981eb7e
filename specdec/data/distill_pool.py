"""The distillation pool's text: English inputs for both local tasks, most without references.

A drafter for speculative decoding only has to imitate the target model, so
the inputs it is distilled on need no reference outputs: the target decodes
them (``scripts/build_distill_corpus.py --corpus data/pool``). This module
builds that pool of inputs, of the same kind as the local corpus
(``specdec/data/corpora.py``, ``data/corpus``), from *all* English Debian package
descriptions (``Translation-en``), not only those with a German translation:

* ``translate_en_de`` inputs: the short description (kind ``short``) and the
  sentences of the long description (kind ``sentence``: the corpus's paragraph,
  bullet and sentence splitting), 3-60 words.
* ``summarize_ddtp`` inputs: the long description as one line (kind ``long``,
  ``corpora.long_text``), >= 30 words.

Sources, in priority order (the first that holds an input is its ``origin``;
the manifest counts the new unique inputs each one adds): the corpus's own train
split (origin ``corpus:train``, the only rows that keep a reference in
``targets``; the pool is a superset of the train split's inputs), then each
``Translation-en`` list as ``ddtp:<suite>/<component>`` (e.g.
``ddtp:bookworm/main``, ``ddtp:trixie-security/main``), releases in the order
given, then suite (release, -updates, -security), then component. Lists of
other releases and components are fetched with apt into a private folder
(``fetch_pool_lists``), from archives derived at run time from the system's own
apt sources (no host name is written anywhere but into a temporary sources file
that apt reads and that is deleted when apt is done).

Leakage (the validation/test splits of the corpus are what drafters are
measured on): an occurrence of an input in a description of a *held-out*
package (a binary package of a validation/test row of either task, or one whose
source package, in any release's ``Packages`` list, has a validation/test row)
does not count; an input only held-out packages have is dropped. Then every
input whose text, or whose first 25 words (lower-cased, whitespace-normalised:
``corpora``'s leakage keys), equals those of a validation/test input of either
task is dropped. ``leakage_overlaps`` re-checks the written pool.

Rows are de-duplicated exactly (whitespace-normalised text, per task) and
ordered by sha256(salt:task:input), so any prefix of a split is a uniform
sample (``--max_examples`` of a decode is representative). Rows have the
corpus's fields (``inputs``, ``targets`` ("" without a reference),
``source_package``, ``package``, ``kind``, ``origin``, ``description_md5``,
``segment``). validation/test are copies of the corpus's. ``manifest.json``
has the corpus manifest's layout (``corpora.<name>.splits.<split>`` count and
sha256), so ``tasks.register_local_tasks(pool_dir)`` reads the pool like
``data/corpus``, plus per-source counts, leakage numbers and the command.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from typing import (AbstractSet, Callable, Dict, Iterable, List, Mapping, Optional,
                    Sequence, Set, Tuple)

from specdec import fileio
from specdec.data import apt_lists
from specdec.data import corpora

POOL_ORIGIN = "ddtp-pool"
FORMAT_VERSION = 1
CORPUS_TRAIN_ORIGIN = "corpus:train"
LIST_ORIGIN_PREFIX = "ddtp:"
ORDER_SALT = "specdec-distill-pool-v1"

# What the pool fetches besides the corpus's lists, by default. Chosen by
# measuring the new unique inputs each adds (see the build's manifest).
DEFAULT_RELEASES = ("bookworm", "trixie", "forky", "sid", "bullseye")
DEFAULT_COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
SUITE_SUFFIXES = ("", "-updates", "-security")
UNSTABLE_RELEASES = frozenset({"sid", "unstable", "experimental"})

Row = Dict[str, object]
Log = Callable[[str], None]


def _no_log(_: str) -> None:
  pass


# --------------------------------------------------------------------------
# The system's apt sources, and the archives of other releases derived from them.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AptSource:
  """One `deb` source: archive URIs, suites, components, keyring."""
  uris: Tuple[str, ...]
  suites: Tuple[str, ...]
  components: Tuple[str, ...]
  signed_by: str = ""


def parse_sources_deb822(text: str) -> List[AptSource]:
  """The enabled `deb` entries of a deb822 `.sources` file."""
  out = []
  for stanza in corpora.parse_deb822(text.splitlines()):
    fields = {k.lower(): v for k, v in stanza.items()}
    if "deb" not in fields.get("types", "").split():
      continue
    if fields.get("enabled", "yes").strip().lower() in ("no", "false", "0"):
      continue
    signed_by = fields.get("signed-by", "").strip()
    if "\n" in signed_by:  # an inline key block, not a path
      signed_by = ""
    out.append(AptSource(uris=tuple(fields.get("uris", "").split()),
                         suites=tuple(fields.get("suites", "").split()),
                         components=tuple(fields.get("components", "").split()),
                         signed_by=signed_by))
  return [s for s in out if s.uris and s.suites]


_ONE_LINE_RE = re.compile(r"^\s*deb\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<rest>.*)$")


def parse_sources_lines(text: str) -> List[AptSource]:
  """The `deb` lines of a one-line-style `sources.list` file."""
  out = []
  for line in text.splitlines():
    line = line.split("#", 1)[0]
    m = _ONE_LINE_RE.match(line)
    if not m:
      continue
    words = m.group("rest").split()
    if len(words) < 2:
      continue
    opts = dict(o.split("=", 1) for o in (m.group("opts") or "").split()
                if "=" in o)
    out.append(AptSource(uris=(words[0],), suites=(words[1],),
                         components=tuple(words[2:]),
                         signed_by=opts.get("signed-by", "")))
  return out


def read_system_sources(apt_get: Optional[str] = None) -> List[AptSource]:
  """The `deb` entries of the system's apt sources (read at run time).

  Reads the files apt reads: Dir::Etc::SourceList and the `*.list` /
  `*.sources` files of Dir::Etc::SourceParts (as `apt-config dump` names them).
  """
  apt_get = apt_lists.resolve_apt_get(apt_get)
  conf = apt_lists.system_config(apt_get)
  root = conf.get("dir", "/")
  etc = os.path.join(root, conf.get("dir::etc", "etc/apt"))
  source_list = os.path.join(etc, conf.get("dir::etc::sourcelist",
                                           "sources.list"))
  parts = os.path.join(etc, conf.get("dir::etc::sourceparts",
                                     "sources.list.d"))
  files = [source_list] if os.path.isfile(source_list) else []
  if os.path.isdir(parts):
    files += [os.path.join(parts, n) for n in sorted(os.listdir(parts))
              if n.endswith((".list", ".sources"))]
  entries = []
  for path in files:
    with open(path, encoding="utf-8", errors="replace") as f:
      text = f.read()
    entries += (parse_sources_deb822(text) if path.endswith(".sources")
                else parse_sources_lines(text))
  return entries


def split_suite(suite: str) -> Tuple[str, str]:
  """'bookworm-security' -> ('bookworm', '-security'); 'sid' -> ('sid', '')."""
  for suffix in SUITE_SUFFIXES[1:]:
    if suite.endswith(suffix):
      return suite[:-len(suffix)], suffix
  return suite, ""


def derive_sources(system: Sequence[AptSource],
                   releases: Sequence[str],
                   components: Sequence[str] = DEFAULT_COMPONENTS,
                   have: AbstractSet[Tuple[str, str]] = frozenset()) -> List[AptSource]:
  """Sources of other releases and components, derived from the system's own.

  The system's archive entries are recognised by their suites: an entry with a
  plain release suite (e.g. `bookworm`) or `-updates` is the main archive, one
  with `-security` the security archive. Each release gets `<release>` and
  `<release>-updates` from the main archive's URIs and `<release>-security`
  from the security archive's (unstable releases only the first), with the
  given components, less the (suite, component) pairs in `have` (lists
  already at hand). The system's keyring (Signed-By) is kept.

  Raises:
    RuntimeError: the system's sources have no recognisable main archive.
  """
  main = security = None
  for entry in system:
    kinds = {split_suite(s)[1] for s in entry.suites}
    if "-security" in kinds and security is None:
      security = entry
    elif kinds & {"", "-updates"} and main is None:
      main = entry
  if main is None:
    raise RuntimeError(
        "the system's apt sources have no Debian archive entry with a release "
        f"suite (found suites: {[s.suites for s in system]}); pass lists "
        "already downloaded instead.")
  out = []
  for release in releases:
    for suffix in SUITE_SUFFIXES:
      if suffix and release in UNSTABLE_RELEASES:
        continue
      template = security if suffix == "-security" else main
      if template is None:
        continue
      suite = release + suffix
      comps = tuple(c for c in components if (suite, c) not in have)
      if comps:
        out.append(AptSource(uris=template.uris, suites=(suite,),
                             components=comps, signed_by=template.signed_by))
  return out


def render_sources(entries: Sequence[AptSource]) -> str:
  """deb822 text of `entries` (for a temporary sources file only)."""
  stanzas = []
  for e in entries:
    lines = ["Types: deb", f"URIs: {' '.join(e.uris)}",
             f"Suites: {' '.join(e.suites)}",
             f"Components: {' '.join(e.components)}"]
    if e.signed_by:
      lines.append(f"Signed-By: {e.signed_by}")
    stanzas.append("\n".join(lines))
  return "\n\n".join(stanzas) + "\n"


def fetch_pool_lists(apt_dir: str,
                     releases: Sequence[str] = DEFAULT_RELEASES,
                     components: Sequence[str] = DEFAULT_COMPONENTS,
                     have: AbstractSet[Tuple[str, str]] = frozenset(),
                     apt_get: Optional[str] = None,
                     timeout: float = 900,
                     log: Log = _no_log) -> str:
  """Fetches Translation-en and Packages lists of other releases/components.

  Like `corpora.fetch_lists` (a private APT_CONFIG: its own lists and cache
  folders, no apt.conf.d, Acquire::Languages en), but with a private source
  list derived from the system's (`derive_sources`), written to a temporary
  folder that is removed when apt-get is done. Returns the lists folder.
  Missing components of a release (apt warns) are skipped.

  Raises:
    RuntimeError: apt-get is missing, we are not root, or the update failed.
  """
  apt_get = apt_lists.resolve_apt_get(apt_get)
  apt_lists.require_root(remedy="Pass lists already downloaded (--skip_fetch) instead.")
  entries = derive_sources(read_system_sources(apt_get), releases, components,
                           have)
  for e in entries:
    log(f"  fetch {e.suites[0]}: {' '.join(e.components)}")
  conf = apt_lists.write_config(apt_dir, languages=("en",))
  lists_dir = apt_lists.lists_dir(apt_dir)
  if not entries:
    return lists_dir
  with tempfile.TemporaryDirectory(prefix="specdec-pool-sources-") as tmp:
    sources = os.path.join(tmp, "pool.sources")
    parts = os.path.join(tmp, "parts")
    os.makedirs(parts)
    with open(sources, "w", encoding="utf-8") as f:
      f.write(render_sources(entries))
    # A deb822 file must be named *.sources and sit in SourceParts.
    os.replace(sources, os.path.join(parts, "pool.sources"))
    proc = apt_lists.run_update(
        apt_get, conf, ["-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={parts}"],
        timeout=timeout, log=log)
  for line in proc.stderr.splitlines():
    if line.startswith(("W:", "E:")):
      log(f"  apt: {_without_hosts(line)}")
  return lists_dir


def _without_hosts(line: str) -> str:
  """An apt message with URIs and host-prefixed list names cut out."""
  line = re.sub(r"\b[a-z][a-z0-9+.-]*://\S+", "<archive>", line)
  return re.sub(r"\S+_dists_", "", line)


# --------------------------------------------------------------------------
# Lists: which release/component each one is, in priority order.
# --------------------------------------------------------------------------

_NAME_RE = re.compile(
    r"^(?P<suite>[^_]+)_(?P<component>.+?)_"
    r"(?:i18n_(?P<tr>Translation-en)|binary-[^_]+_(?P<pk>Packages))"
    r"(?:\.[a-z0-9]+)?$")


@dataclasses.dataclass(frozen=True)
class ListFile:
  path: str
  name: str  # corpora.list_display_name (no host)
  kind: str  # 'Translation-en' or 'Packages'
  suite: str
  component: str

  @property
  def origin(self) -> str:
    return f"{LIST_ORIGIN_PREFIX}{self.suite}/{self.component}"


def parse_list_name(path: str) -> Optional[ListFile]:
  """A list file's kind, suite and component from its name; None if neither kind."""
  name = corpora.list_display_name(path)
  m = _NAME_RE.match(name)
  if not m:
    return None
  return ListFile(path=path, name=name,
                  kind="Translation-en" if m.group("tr") else "Packages",
                  suite=m.group("suite"), component=m.group("component"))


def priority_key(releases: Sequence[str]):
  """Sort key of lists: release (in `releases`' order), suite suffix, component."""
  def key(f: ListFile):
    release, suffix = split_suite(f.suite)
    r = releases.index(release) if release in releases else len(releases)
    c = (DEFAULT_COMPONENTS.index(f.component)
         if f.component in DEFAULT_COMPONENTS else len(DEFAULT_COMPONENTS))
    return (r, release, SUITE_SUFFIXES.index(suffix), c, f.component, f.name)
  return key


def find_pool_lists(lists_dirs: Sequence[str],
                    releases: Sequence[str] = DEFAULT_RELEASES
                    ) -> Dict[str, List[ListFile]]:
  """{kind: lists in priority order} over several folders (first folder wins a name)."""
  found: Dict[str, Dict[str, ListFile]] = {"Translation-en": {}, "Packages": {}}
  for d in lists_dirs:
    if not os.path.isdir(d):
      raise RuntimeError(f"lists folder {d!r} does not exist")
    for n in sorted(os.listdir(d)):
      f = parse_list_name(os.path.join(d, n))
      if f is not None and os.path.isfile(f.path):
        found[f.kind].setdefault(f.name, f)
  return {kind: sorted(files.values(), key=priority_key(releases))
          for kind, files in found.items()}


def suite_components(lists_dir: str) -> Set[Tuple[str, str]]:
  """(suite, component) pairs that have a Translation-en list in a folder."""
  if not os.path.isdir(lists_dir):
    return set()
  out = set()
  for n in os.listdir(lists_dir):
    f = parse_list_name(os.path.join(lists_dir, n))
    if f is not None and f.kind == "Translation-en":
      out.add((f.suite, f.component))
  return out


# --------------------------------------------------------------------------
# Inputs of one description (pure).
# --------------------------------------------------------------------------


def _row(inputs: str, source: str, package: str, kind: str, origin: str,
         md5: str, segment: int, targets: str = "") -> Row:
  return {"inputs": inputs, "targets": targets, "source_package": source,
          "package": package, "kind": kind, "origin": origin,
          "description_md5": md5, "segment": segment}


def translation_inputs(desc: corpora.Description) -> List[Tuple[str, int, str]]:
  """(kind, segment, text) En->De inputs of a description: the short description
  and every sentence of the long one, 3-60 words (the corpus's rules)."""
  out = []
  short = corpora.normalize_ws(desc.short)
  if corpora.MIN_WORDS <= corpora.word_count(short) <= corpora.MAX_WORDS:
    out.append(("short", 0, short))
  segment = 0
  for par in corpora.paragraphs(desc.long_lines):
    for sentence in corpora.description_sentences(par):
      segment += 1
      sentence = corpora.normalize_ws(sentence)
      if corpora.MIN_WORDS <= corpora.word_count(sentence) <= corpora.MAX_WORDS:
        out.append(("sentence", segment, sentence))
  return out


def summarization_input(desc: corpora.Description) -> Optional[str]:
  """The long description as a summarization input, or None if < 30 words."""
  doc = corpora.long_text(desc.long_lines)
  if corpora.word_count(doc) < corpora.MIN_DOC_WORDS:
    return None
  return doc


# --------------------------------------------------------------------------
# Leakage (pure).
# --------------------------------------------------------------------------


def leak_keys(text: str) -> Tuple[str, str]:
  """(whole text, first 25 words), lower-cased and whitespace-normalised."""
  words = text.lower().split()
  return " ".join(words), " ".join(words[:corpora.LEAK_PREFIX_WORDS])


@dataclasses.dataclass
class HeldOut:
  """What validation/test items the pool must not share."""
  sources: Set[str]  # source packages with a validation/test row
  packages: Set[str]  # their binary packages (rows', and from Packages lists)
  full: Set[str]  # leak_keys()[0] of every validation/test input (both tasks)
  prefix: Set[str]  # leak_keys()[1] of the same

  def text_leak(self, text: str) -> Optional[str]:
    """'text' or 'prefix' if `text` leaks that way, else None."""
    full, prefix = leak_keys(text)
    if full in self.full:
      return "text"
    if prefix in self.prefix:
      return "prefix"
    return None

  def package_held_out(self, package: str,
                       sources_of: Mapping[str, Set[str]]) -> bool:
    if package in self.packages:
      return True
    return any(s in self.sources for s in sources_of.get(package, (package,)))


def held_out_from_rows(rows: Iterable[Mapping[str, object]],
                       sources_of: Optional[Mapping[str, Set[str]]] = None
                       ) -> HeldOut:
  """HeldOut of validation/test rows (both tasks); `sources_of` maps binary
  packages to their sources in every Packages list, to add all binaries of a
  held-out source."""
  held = HeldOut(set(), set(), set(), set())
  for row in rows:
    held.sources.add(str(row["source_package"]))
    held.packages.add(str(row["package"]))
    full, prefix = leak_keys(str(row["inputs"]))
    held.full.add(full)
    held.prefix.add(prefix)
  for package, sources in (sources_of or {}).items():
    if sources & held.sources:
      held.packages.add(package)
  return held


def leakage_overlaps(train: Mapping[str, Sequence[Mapping[str, object]]],
                     held: HeldOut) -> Dict[str, int]:
  """How many pool rows (all tasks) share a held-out source or package, text,
  or first 25 words: all 0 for a clean pool."""
  counts = collections.Counter(source=0, package=0, text=0, prefix=0)
  for rows in train.values():
    for row in rows:
      counts["source"] += row["source_package"] in held.sources
      counts["package"] += row["package"] in held.packages
      full, prefix = leak_keys(str(row["inputs"]))
      counts["text"] += full in held.full
      counts["prefix"] += prefix in held.prefix
  return dict(counts)


# --------------------------------------------------------------------------
# Collecting the pool.
# --------------------------------------------------------------------------


def order_key(corpus: str, inputs: str) -> str:
  """The pool's deterministic row order: sha256(salt:corpus:input)."""
  return hashlib.sha256(
      f"{ORDER_SALT}:{corpus}:{inputs}".encode("utf-8")).hexdigest()


class PoolCollector:
  """Adds inputs in priority order: the first non-held-out occurrence wins.

  Pure bookkeeping (no files): `add_corpus_rows`, then `add_descriptions` for
  each list in priority order, then `finish` (text leakage filter, order).
  """

  def __init__(self, held: HeldOut, sources_of: Mapping[str, Set[str]],
               source_of: Mapping[str, str]):
    self.held = held
    self.sources_of = sources_of
    self.source_of = source_of
    self.rows: Dict[str, Dict[str, Row]] = {c: {} for c in corpora.CORPORA}
    self.held_out_texts: Dict[str, Set[str]] = {c: set() for c in corpora.CORPORA}
    self.stats: Dict[str, Dict[str, collections.Counter]] = {
        c: collections.defaultdict(collections.Counter) for c in corpora.CORPORA}

  def _add(self, corpus: str, row: Row) -> None:
    text = row["inputs"]
    st = self.stats[corpus][row["origin"]]
    st["occurrences"] += 1
    if text in self.rows[corpus]:
      st["duplicates"] += 1
      return
    st["new_unique"] += 1
    self.rows[corpus][text] = row

  def add_corpus_rows(self, corpus: str, rows: Iterable[Mapping[str, object]]):
    """The corpus's train rows (kept with their reference and provenance)."""
    for row in rows:
      text = corpora.normalize_ws(str(row["inputs"]))
      new = dict(row, inputs=text, origin=CORPUS_TRAIN_ORIGIN)
      new.setdefault("segment", 0)
      if self.held.package_held_out(str(row["package"]), self.sources_of) or (
          row["source_package"] in self.held.sources):
        self.stats[corpus][CORPUS_TRAIN_ORIGIN]["held_out_occurrences"] += 1
        self.held_out_texts[corpus].add(text)
        continue
      self._add(corpus, new)

  def add_descriptions(self, descriptions: Iterable[corpora.Description],
                       origin: str) -> None:
    """One Translation-en list's entries (md5s in sorted order, each with the
    alphabetically first (source, package) of its non-held-out packages)."""
    first: Dict[str, corpora.Description] = {}
    packages: Dict[str, Set[str]] = collections.defaultdict(set)
    for d in descriptions:
      if d.lang != "en":
        continue
      first.setdefault(d.md5, d)
      packages[d.md5].add(d.package)
    for md5 in sorted(first):
      desc = first[md5]
      kept = [p for p in sorted(packages[md5])
              if not self.held.package_held_out(p, self.sources_of)]
      candidates = [(corpora.TRANSLATION_CORPUS, kind, seg, text)
                    for kind, seg, text in translation_inputs(desc)]
      doc = summarization_input(desc)
      if doc is not None:
        candidates.append((corpora.SUMMARIZATION_CORPUS, "long", 0, doc))
      if not kept:
        for corpus, _, _, text in candidates:
          self.stats[corpus][origin]["held_out_occurrences"] += 1
          self.held_out_texts[corpus].add(text)
        continue
      source, package = min((self.source_of.get(p, p), p) for p in kept)
      for corpus, kind, seg, text in candidates:
        self._add(corpus, _row(text, source, package, kind, origin, md5, seg))

  def finish(self) -> Tuple[Dict[str, List[Row]], Dict[str, Dict[str, object]]]:
    """Drops text leaks; returns ({corpus: rows in pool order}, {corpus: stats})."""
    out, report = {}, {}
    for corpus in corpora.CORPORA:
      kept = []
      dropped = collections.Counter()
      dropped_by_origin = collections.defaultdict(collections.Counter)
      for text, row in self.rows[corpus].items():
        leak = self.held.text_leak(text)
        if leak:
          dropped[leak] += 1
          dropped_by_origin[row["origin"]][leak] += 1
          continue
        kept.append(row)
      kept.sort(key=lambda r: order_key(corpus, r["inputs"]))
      by_origin = collections.Counter(r["origin"] for r in kept)
      sources = {}
      for origin, st in self.stats[corpus].items():
        sources[origin] = dict(sorted(st.items()))
        sources[origin]["dropped_text_leak"] = dropped_by_origin[origin]["text"]
        sources[origin]["dropped_prefix_leak"] = dropped_by_origin[origin]["prefix"]
        sources[origin]["kept"] = by_origin[origin]
      held_only = self.held_out_texts[corpus] - self.rows[corpus].keys()
      report[corpus] = {
          "sources": sources,
          "kinds": dict(sorted(collections.Counter(r["kind"] for r in kept).items())),
          "with_reference": sum(1 for r in kept if r["targets"]),
          "leakage_dropped": {
              "held_out_package_only": len(held_only),
              "text": dropped["text"],
              "prefix": dropped["prefix"],
          },
      }
      out[corpus] = kept
    return out, report


# --------------------------------------------------------------------------
# Building the pool directory.
# --------------------------------------------------------------------------


def load_sources(packages_lists: Sequence[ListFile]
                 ) -> Tuple[Dict[str, str], Dict[str, Set[str]]]:
  """(binary -> source of the first Packages list that has it, binary -> every source)."""
  source_of: Dict[str, str] = {}
  sources_of: Dict[str, Set[str]] = collections.defaultdict(set)
  for f in packages_lists:
    for package, source in corpora.parse_packages(
        corpora.read_list_lines(f.path)).items():
      source_of.setdefault(package, source)
      sources_of[package].add(source)
  return source_of, dict(sources_of)


def read_corpus(corpus_dir: str) -> Dict[str, Dict[str, List[Row]]]:
  return {name: {split: fileio.read_jsonl(corpora.corpus_path(corpus_dir, name, split))
                 for split in corpora.SPLITS} for name in corpora.CORPORA}


def build_pool(corpus_dir: str,
               lists_dirs: Sequence[str],
               out_dir: str,
               releases: Sequence[str] = DEFAULT_RELEASES,
               command: str = "",
               log: Log = _no_log) -> Dict[str, object]:
  """Writes the pool directory (corpus layout) and returns its manifest.

  Args:
    corpus_dir: the local corpus (its train rows join the pool; its
      validation/test splits are copied and held out).
    lists_dirs: apt lists folders, the corpus's first (a list name found in
      several is read from the first).
    out_dir: the pool directory.
    releases: release priority order of the lists.
    command: the command line to record (relative paths).
  """
  t0 = time.time()
  corpora.verify_manifest(corpus_dir)
  corpus = read_corpus(corpus_dir)
  found = find_pool_lists(lists_dirs, releases)
  if not found["Translation-en"]:
    raise RuntimeError(f"no Translation-en list in {list(lists_dirs)}")
  source_of, sources_of = load_sources(found["Packages"])
  log(f"Packages: {len(found['Packages'])} lists, {len(source_of):,} binary "
      f"packages ({time.time() - t0:.1f}s)")
  held = held_out_from_rows(
      (r for name in corpora.CORPORA for split in corpora.SPLITS[1:]
       for r in corpus[name][split]), sources_of)
  log(f"held out: {len(held.sources):,} source packages, {len(held.packages):,} "
      f"binary packages, {len(held.full):,} validation/test inputs")
  collector = PoolCollector(held, sources_of, source_of)
  for name in corpora.CORPORA:
    collector.add_corpus_rows(name, corpus[name]["train"])
  for f in found["Translation-en"]:
    collector.add_descriptions(
        corpora.parse_translation(corpora.read_list_lines(f.path)), f.origin)
    log(f"{f.name}: pool now {len(collector.rows[corpora.TRANSLATION_CORPUS]):,} "
        f"En->De, {len(collector.rows[corpora.SUMMARIZATION_CORPUS]):,} "
        f"summarization inputs ({time.time() - t0:.1f}s)")
  train, report = collector.finish()
  overlaps = leakage_overlaps(train, held)
  if any(overlaps.values()):
    raise RuntimeError(f"the pool still overlaps validation/test: {overlaps}")

  corpora_manifest = {}
  corpus_manifest = fileio.read_json_object(
      os.path.join(corpus_dir, corpora.MANIFEST_NAME), "corpus manifest")
  for name in corpora.CORPORA:
    files = {}
    rel = f"{name}/train.jsonl"
    digest = fileio.write_jsonl(os.path.join(out_dir, rel), train[name])
    files["train"] = {"file": rel, "count": len(train[name]), "sha256": digest}
    for split in corpora.SPLITS[1:]:
      rel = f"{name}/{split}.jsonl"
      src, dst = os.path.join(corpus_dir, rel), os.path.join(out_dir, rel)
      tmp = dst + ".tmp"
      shutil.copyfile(src, tmp)
      os.replace(tmp, dst)
      files[split] = dict(corpus_manifest["corpora"][name]["splits"][split])
    corpora_manifest[name] = dict(report[name], splits=files)
    log(f"{name:16s} train {len(train[name]):8,d} rows  sha256 {digest}")

  list_inputs = [{"name": f.name, "origin": f.origin, "bytes": os.path.getsize(f.path),
                  "sha256": fileio.file_sha256(f.path)}
                 for kind in ("Translation-en", "Packages") for f in found[kind]]
  manifest = {
      "format_version": FORMAT_VERSION,
      "origin": POOL_ORIGIN,
      "command": command,
      "corpus": {"manifest_sha256": fileio.file_sha256(
          os.path.join(corpus_dir, corpora.MANIFEST_NAME)),
                 "train_rows": {n: len(corpus[n]["train"]) for n in corpora.CORPORA}},
      "order": {"salt": ORDER_SALT,
                "key": "sha256(salt + ':' + corpus + ':' + inputs), hex"},
      "releases": list(releases),
      "filters": {"translation_words": [corpora.MIN_WORDS, corpora.MAX_WORDS],
                  "summarization_min_document_words": corpora.MIN_DOC_WORDS,
                  "leakage_prefix_words": corpora.LEAK_PREFIX_WORDS,
                  "dedupe": "exact, whitespace-normalised input, per task"},
      "held_out": {"source_packages": len(held.sources),
                   "binary_packages": len(held.packages),
                   "inputs": len(held.full)},
      "leakage_overlaps_after_filtering": overlaps,
      "prefixes": {corpora.TRANSLATION_CORPUS: corpora.TRANSLATE_PREFIX,
                   corpora.SUMMARIZATION_CORPUS: corpora.SUMMARIZE_PREFIX},
      "inputs": list_inputs,
      "corpora": corpora_manifest,
  }
  data = (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False)
          + "\n").encode("utf-8")
  fileio.atomic_write(os.path.join(out_dir, corpora.MANIFEST_NAME), data)
  log(f"manifest.json sha256 {fileio.sha256_hex(data)}; built in "
      f"{time.time() - t0:.1f}s")
  return manifest
