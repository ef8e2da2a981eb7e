"""Tests for specdec.data.parallel_sources and the corpus build with extra EN->DE pairs.

Fixtures: tests/testdata/extra (a documentation package pair, unpacked) and
gettext catalogs written here (`write_mo`); the DDTP lists of corpora_test.
"""

import os
import shutil
import struct
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from specdec.data import corpora  # pylint: disable=g-import-not-at-top
from specdec import fileio  # pylint: disable=g-import-not-at-top
from specdec.data import parallel_sources as ps  # pylint: disable=g-import-not-at-top

LISTS = os.path.join(REPO, "tests", "testdata", "lists")
EXTRA = os.path.join(REPO, "tests", "testdata", "extra")
RATIOS = (0.5, 0.25, 0.25)  # as corpora_test: luola/aumix validation, tinytool test
DOCS = (("tinydoc-en", "tinydoc-de"),)
GETTEXT = ("tinyapp-l10n", "luola-data")  # luola-data: source luola, held out


def write_mo(path, entries):
  """A little-endian .mo file of (msgid, msgstr) byte-string entries."""
  entries = sorted(entries)
  n = len(entries)
  ids_at, strs_at = 28, 28 + 8 * n
  data_at = strs_at + 8 * n
  ids = strs = b""
  id_table, str_table = [], []
  for msgid, _ in entries:
    id_table.append((len(msgid), data_at + len(ids)))
    ids += msgid + b"\0"
  for _, msgstr in entries:
    str_table.append((len(msgstr), data_at + len(ids) + len(strs)))
    strs += msgstr + b"\0"
  head = struct.pack("<7I", 0x950412de, 0, n, ids_at, strs_at, 0, 0)
  body = b"".join(struct.pack("<2I", *t) for t in id_table + str_table)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(head + body + ids + strs)


TINYAPP = [
    (b"", b"Content-Type: text/plain; charset=UTF-8\n"),
    (b"_Open the file", b"Die Datei _\xc3\xb6ffnen"),
    (b"&Save all documents", b"Alle Dokumente &speichern"),
    (b"~Insert a new table", b"Neue Tabelle ~einf\xc3\xbcgen"),
    (b"Could not open %s for reading", b"%s konnte nicht gelesen werden"),
    (b"menu\x04Quit the program now", b"Programm jetzt beenden"),
    (b"One file was deleted\x00%d files were deleted",
     b"Eine Datei wurde gel\xc3\xb6scht\x00%d Dateien wurden gel\xc3\xb6scht"),
    (b"Show <b>all</b> hidden files", b"<b>Alle</b> versteckten Dateien anzeigen"),
    (b"Usage: tinyapp <file> [options]", b"Aufruf: tinyapp <Datei> [Optionen]"),
    (b"Not yet translated string", b""),
    (b"Same words both sides", b"Same words both sides"),
    (b"Quit", b"Beenden"),
    (b"Your names", b"Max Mustermann"),
    (b"It runs on every free operating system.",
     b"Es l\xc3\xa4uft auf allen freien Systemen."),
    # A validation input of the DDTP fixture: kept out of train.
    (b"multiplayer cave-flying game", b"ein Spiel f\xc3\xbcr mehrere Spieler"),
]
LUOLA = [(b"Press fire to start the game", b"Feuer dr\xc3\xbccken, um zu starten")]


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("packages"))
  for name in os.listdir(EXTRA):
    if os.path.isdir(os.path.join(EXTRA, name)):
      shutil.copytree(os.path.join(EXTRA, name), os.path.join(root, name))
  write_mo(os.path.join(root, "tinyapp-l10n", "usr", "share", "locale", "de",
                        "LC_MESSAGES", "tinyapp.mo"), TINYAPP)
  write_mo(os.path.join(root, "tinyapp-l10n", "usr", "share", "locale", "fr",
                        "LC_MESSAGES", "tinyapp.mo"),
           [(b"Save all documents", b"Enregistrer tous les documents")])
  write_mo(os.path.join(root, "luola-data", "usr", "share", "locale", "de",
                        "LC_MESSAGES", "luola.mo"), LUOLA)
  return root


@pytest.fixture(scope="module")
def builds(packages, tmp_path_factory):
  """The fixture corpus built without and with the extra sources."""
  plain = str(tmp_path_factory.mktemp("plain"))
  extra = str(tmp_path_factory.mktemp("extra"))
  pairs, report = ps.collect_pairs(packages, DOCS, GETTEXT)
  m_plain = corpora.build_corpora(LISTS, plain, ratios=RATIOS)
  m_extra = corpora.build_corpora(
      LISTS, extra, ratios=RATIOS, extra_pairs=[p.__dict__ for p in pairs],
      extra_report=report)
  return (plain, m_plain), (extra, m_extra), pairs


def _rows(out, split, name=corpora.TRANSLATION_CORPUS):
  return fileio.read_jsonl(corpora.corpus_path(out, name, split))


# ------------------------------------------------------------------ cleaning


@pytest.mark.parametrize("text,expected", [
    ("_Open the file", "Open the file"),
    ("Datei _öffnen jetzt", "Datei öffnen jetzt"),
    ("Seitenverh&ältnis ist gut", "Seitenverhältnis ist gut"),
    ("~Insert a table", "Insert a table"),
    ("Drag &amp; drop works &lt;here&gt; too", "Drag & drop works <here> too"),
    ("Show <b>all</b> hidden  files", "Show all hidden files"),
    ("Tom &amp; Jerry &#8211; friends", "Tom & Jerry – friends"),
])
def test_clean_text_keeps(text, expected):
  assert ps.clean_text(text) == (expected, "")


@pytest.mark.parametrize("text,reason", [
    ("Could not open %s now", "placeholder"),
    ("Could not open %(name)s now", "placeholder"),
    ("Copied %1 of %2 files", "placeholder"),
    ("Deleted {0} files today", "placeholder"),
    ("Deleted {count} files today", "placeholder"),
    ("Set $HOME to a folder", "placeholder"),
    ("Set ${HOME} to a folder", "placeholder"),
    ("Installed into @prefix@ folder", "placeholder"),
    ("Usage: tool <file> [options]", "placeholder"),
    ("  -v       be verbose always", "table"),
    ("Set the max_size option please", "identifier"),
    ("Quit", "length"),
    ("", "empty"),
    ("1 2 3 4", "length"),
    (" ".join(["word"] * 61), "length"),
])
def test_clean_text_drops(text, reason):
  assert ps.clean_text(text) == (None, reason)


def test_clean_text_html_side_has_no_mnemonics():
  assert ps.clean_text("Calls AT&T and R&D now", mnemonics=False) == (
      "Calls AT&T and R&D now", "")
  assert ps.clean_text("Calls AT&T and R&D now") == ("Calls ATT and RD now", "")


def test_clean_pair():
  assert ps.clean_pair("_Save the file", "Datei _speichern jetzt") == (
      ("Save the file", "Datei speichern jetzt"), "")
  assert ps.clean_pair("Same text here", "same Text here") == (
      None, "untranslated")
  assert ps.clean_pair("Print %d pages now", "Drucke Seiten jetzt") == (
      None, "placeholder")
  assert ps.clean_pair("Print all pages now", "Drucke %d Seiten") == (
      None, "placeholder")


# ------------------------------------------------------------------ gettext


def test_read_mo_skips_header_plural_and_context(packages):
  path = os.path.join(packages, "tinyapp-l10n", "usr", "share", "locale", "de",
                      "LC_MESSAGES", "tinyapp.mo")
  with open(path, "rb") as f:
    entries = dict(ps.read_mo(f.read()))
  assert "" not in entries
  assert not [k for k in entries if "deleted" in k]  # plural entry
  assert entries["Quit the program now"] == "Programm jetzt beenden"
  assert entries["_Open the file"] == "Die Datei _öffnen"
  big_endian = struct.pack(">7I", 0x950412de, 0, 0, 28, 28, 0, 0)
  assert ps.read_mo(big_endian) == []


@pytest.mark.parametrize("data,match", [
    (b"short", "too short"),
    (b"\0" * 40, "bad magic"),
    (struct.pack("<7I", 0x950412de, 0, 5, 28, 68, 0, 0), "truncated"),
])
def test_read_mo_bad_input(data, match):
  with pytest.raises(ValueError, match=match):
    ps.read_mo(data, where="x.mo")


@pytest.mark.parametrize("path,german", [
    ("usr/share/locale/de/LC_MESSAGES/vlc.mo", True),
    ("usr/lib/libreoffice/program/resource/de/LC_MESSAGES/acc.mo", True),
    ("usr/share/wordpress/wp-content/languages/admin-de_DE.mo", True),
    ("usr/share/wordpress/wp-content/languages/de_DE.mo", True),
    ("usr/share/locale/de_AT/LC_MESSAGES/vlc.mo", False),
    ("usr/share/locale/fr/LC_MESSAGES/vlc.mo", False),
    ("usr/share/wordpress/wp-content/languages/admin-de_DE.po", False),
    ("usr/share/locale/de/LC_MESSAGES/code.mo", True),
    ("usr/share/locale/ru/LC_MESSAGES/node.mo", False),
])
def test_is_german_catalog(path, german):
  assert ps.is_german_catalog(path) == german


def test_gettext_pairs(packages):
  pairs, stats, catalogs = ps.gettext_pairs(
      os.path.join(packages, "tinyapp-l10n"), "tinyapp-l10n")
  assert catalogs == ["usr/share/locale/de/LC_MESSAGES/tinyapp.mo"]
  got = {(p.inputs, p.targets) for p in pairs}
  assert got == {
      ("Open the file", "Die Datei öffnen"),
      ("Save all documents", "Alle Dokumente speichern"),
      ("Insert a new table", "Neue Tabelle einfügen"),
      ("Quit the program now", "Programm jetzt beenden"),
      ("Show all hidden files", "Alle versteckten Dateien anzeigen"),
      ("It runs on every free operating system.",
       "Es läuft auf allen freien Systemen."),
      ("multiplayer cave-flying game", "ein Spiel für mehrere Spieler"),
  }
  assert {p.origin for p in pairs} == {"gettext:tinyapp-l10n"}
  assert {p.kind for p in pairs} == {"message"}
  assert [p.segment for p in pairs] == list(range(len(pairs)))
  assert stats["candidates"] == 13  # header and plural entry never count
  assert stats["dropped_placeholder"] == 2
  assert stats["dropped_credits"] == 1
  assert stats["dropped_untranslated"] == 1
  assert stats["dropped_empty"] == 1
  assert stats["dropped_length"] == 1  # "Quit"
  assert stats["pairs"] == 7


def _write_wheel(path, project, entries):
  """A wheel (zip) holding a German and a French catalog of `project`."""

  import zipfile  # pylint: disable=g-import-not-at-top
  tmp = os.path.join(os.path.dirname(path), "tmp.mo")
  write_mo(tmp, entries)
  with open(tmp, "rb") as f:
    mo = f.read()
  os.remove(tmp)
  with zipfile.ZipFile(path, "w") as z:
    z.writestr(f"{project}/locale/de/LC_MESSAGES/django.mo", mo)
    z.writestr(f"{project}/locale/fr/LC_MESSAGES/django.mo", mo)
    z.writestr(f"{project}/__init__.py", "")



WEB = [(b"Delete the selected ticket now", b"Das ausgew\xc3\xa4hlte Ticket jetzt l\xc3\xb6schen"),
       (b"Sold %(count)s tickets", b"%(count)s Tickets verkauft")]


def test_wheel_pairs(tmp_path):
  assert ps.wheel_project("plone_app_locales-7.0.4-py3-none-any.whl") == (
      "plone-app-locales")
  with pytest.raises(ValueError, match="not a wheel"):
    ps.wheel_project("x.zip")
  wheel = str(tmp_path / "tiny_shop-1.0-py3-none-any.whl")
  _write_wheel(wheel, "tiny_shop", WEB)
  pairs, stats, catalogs = ps.wheel_pairs(wheel)
  assert catalogs == ["tiny_shop/locale/de/LC_MESSAGES/django.mo"]
  assert [(p.inputs, p.package, p.origin) for p in pairs] == [
      ("Delete the selected ticket now", "pypi-tiny-shop", "pypi:tiny-shop")]
  assert stats["dropped_placeholder"] == 1
  pairs, _, _ = ps.wheel_pairs(wheel, debian_package="luola-data")
  assert pairs[0].package == "luola-data"  # held out like that package


def test_download_wheels_offline(tmp_path):
  _write_wheel(str(tmp_path / "tiny_shop-1.0-py3-none-any.whl"), "tiny_shop", WEB)
  assert ps.download_wheels(["tiny.shop==1.0"], str(tmp_path), download=False) == [
      str(tmp_path / "tiny_shop-1.0-py3-none-any.whl")]
  with pytest.raises(RuntimeError, match="not downloaded: tiny-shop==2.0"):
    ps.download_wheels(["tiny-shop==2.0"], str(tmp_path), download=False)
  with pytest.raises(ValueError, match="pinned"):
    ps.download_wheels(["tiny-shop"], str(tmp_path), download=False)


# ------------------------------------------------------------------ docs


def test_html_blocks():
  page = ("<html><head><title>T</title><style>p{}</style></head><body>"
          "<h1>Head line</h1><p>A <b>bold</b> &amp; <code>x</code> word.</p>"
          "<ul><li>one<p>nested para</p>tail</li></ul><pre>skip me</pre>"
          "<p>line<br>break</p></body></html>")
  assert ps.html_blocks(page) == [
      ("h1", "Head line"), ("p", "A bold & x word."), ("li", "one"),
      ("p", "nested para"), ("li", "tail"), ("p", "line break")]
  # A switch's cases: the classed hidden ones go, the default stays; a
  # footer (build details) goes.
  switch = ('<p>Press <span class="switchinline"><span hidden="true" '
            'class="MAC">Command</span><span hidden="true" id="d">Ctrl'
            '</span></span> + F now.</p><footer><p>Title is: X</p></footer>')
  assert ps.html_blocks(switch) == [("p", "Press Ctrl + F now.")]


def test_align_blocks_needs_same_structure():
  en = [("h1", "Title"), ("p", "Text")]
  assert ps.align_blocks(en, [("h1", "Titel"), ("p", "Text DE")]) == [
      ("Title", "Titel"), ("Text", "Text DE")]
  assert ps.align_blocks(en, [("h1", "Titel"), ("li", "Text DE")]) is None
  assert ps.align_blocks(en, [("h1", "Titel")]) is None


def test_block_segments_split_long_blocks():
  short = ps.block_segments("A short block here.", "Ein kurzer Block.")
  assert short == [("block", "A short block here.", "Ein kurzer Block.")]
  long_en = " ".join(["word"] * 40) + ". " + " ".join(["Next"] * 30) + "."
  long_de = " ".join(["wort"] * 40) + ". " + " ".join(["Weiter"] * 30) + "."
  assert [k for k, _, _ in ps.block_segments(long_en, long_de)] == [
      "sentence", "sentence"]
  assert ps.block_segments(long_en, " ".join(["wort"] * 70) + ".") == []


@pytest.mark.parametrize("path,names,expected", [
    ("usr/share/debian-reference/ch01.en.html", (), (
        "usr/share/debian-reference/ch01.html", "en")),
    ("usr/share/debian-reference/ch01.de.html", (), (
        "usr/share/debian-reference/ch01.html", "de")),
    ("usr/share/doc/debian/FAQ/de/basic.de.html", (), (
        "usr/share/doc/debian/FAQ/basic.html", "de")),
    ("usr/share/developers-reference/l10n.html", (), (
        "usr/share/developers-reference/l10n.html", "")),
    ("usr/share/doc/h/html/en-US/ch1.html", (), ("usr/share/doc/h/html/ch1.html", "en")),
    ("usr/share/doc/h/html/de-DE/ch1.html", (), ("usr/share/doc/h/html/ch1.html", "de")),
    ("usr/share/doc/h/html/fr-FR/ch1.html", (), ("usr/share/doc/h/html/ch1.html", "fr-fr")),
    ("usr/share/doc/m-de/html/a.de.html", ("m", "m-de"), (
        "usr/share/doc/<package>/html/a.html", "de")),
    ("usr/share/doc/x/de/a.en.html", (), None),  # two languages
    ("usr/share/doc/x/readme.txt", (), None),
])
def test_doc_file_key(path, names, expected):
  assert ps.doc_file_key(path, names) == expected


def test_match_doc_files():
  en = ["d/a.en.html", "d/a.html", "d/b.html", "d/c.html", "d/de/y.html",
        "d/only.en.html"]
  de = ["d/de/a.html", "d/b.de.html", "d/c.html", "d/x.de.html"]
  assert ps.match_doc_files(en, de, separate_packages=False) == [
      ("d/a.html", "d/a.en.html", "d/de/a.html"),
      ("d/b.html", "d/b.html", "d/b.de.html")]
  # A German package of its own: its untagged files are German.
  assert ps.match_doc_files(en, de)[-1] == ("d/c.html", "d/c.html", "d/c.html")


def test_doc_pairs_fixture():
  pairs, stats, used = ps.doc_pairs(os.path.join(EXTRA, "tinydoc-en"),
                                    os.path.join(EXTRA, "tinydoc-de"),
                                    "tinydoc-de")
  assert used == [("usr/share/doc/tinydoc-en/html/intro.en.html",
                   "usr/share/doc/tinydoc-de/html/intro.de.html")]
  assert stats["files_matched"] == 2
  assert stats["files_block_structure_differs"] == 1  # changes.*.html
  assert stats["dropped_placeholder"] == 1 and stats["dropped_untranslated"] == 1
  got = [(p.kind, p.inputs, p.targets) for p in pairs]
  assert got[1] == ("block", "Tinydoc keeps your notes in plain text files & "
                    "folders.", "Tinydoc speichert Ihre Notizen in reinen "
                    "Textdateien & Ordnern.")
  assert [k for k, _, _ in got].count("sentence") == 2  # the long block
  assert not [g for g in got if "apt-get" in g[1] or "not prose" in g[1]]
  assert {p.origin for p in pairs} == {"doc:tinydoc-de"}


def test_collect_pairs_missing_package(packages):
  with pytest.raises(ValueError, match="missing.*nonexistent-l10n"):
    ps.collect_pairs(packages, DOCS, GETTEXT + ("nonexistent-l10n",))


def test_deb_package():
  assert ps.deb_package("vlc-l10n_3.0.24-0+deb12u1_all.deb") == "vlc-l10n"
  with pytest.raises(ValueError, match="not a name_version_arch.deb"):
    ps.deb_package("vlc-l10n.deb")


# ------------------------------------------------------------------ the build


def test_validation_and_test_unchanged(builds):
  (plain, m_plain), (extra, m_extra), _ = builds
  for name in corpora.CORPORA:
    for split in ("validation", "test"):
      path = os.path.join(name, f"{split}.jsonl")
      with open(os.path.join(plain, path), "rb") as a, \
          open(os.path.join(extra, path), "rb") as b:
        assert a.read() == b.read(), path
      assert (m_plain["corpora"][name]["splits"][split] ==
              m_extra["corpora"][name]["splits"][split])
  # Summarization is untouched; translation train keeps its DDTP rows first.
  assert _rows(plain, "train", corpora.SUMMARIZATION_CORPUS) == _rows(
      extra, "train", corpora.SUMMARIZATION_CORPUS)
  plain_train, extra_train = _rows(plain, "train"), _rows(extra, "train")
  assert extra_train[:len(plain_train)] == plain_train


def test_extra_rows_filtered_and_provenanced(builds):
  (plain, _), (extra, manifest), pairs = builds
  added = _rows(extra, "train")[len(_rows(plain, "train")):]
  inputs = [r["inputs"] for r in added]
  # Held-out package (luola-data -> source luola, validation): none of it.
  assert "Press fire to start the game" not in inputs
  # A validation input's text ("multiplayer cave-flying game"), from a train
  # package, and the doc's copy of a validation sentence: dropped.
  assert "multiplayer cave-flying game" not in inputs
  assert ("It runs in text mode with a curses interface or on the command "
          "line.") not in inputs
  # A DDTP train input, and a doc block repeated by the catalog: once.
  assert "This package contains the main program." not in inputs
  assert inputs.count("It runs on every free operating system.") == 1
  assert len(set(i.lower() for i in inputs)) == len(inputs)
  by_origin = {r["origin"] for r in added}
  assert by_origin == {"doc:tinydoc-de", "gettext:tinyapp-l10n"}
  row = next(r for r in added if r["inputs"] == "Save all documents")
  assert row == {"inputs": "Save all documents",
                 "targets": "Alle Dokumente speichern",
                 "source_package": "tinyapp-l10n", "package": "tinyapp-l10n",
                 "kind": "message", "origin": "gettext:tinyapp-l10n",
                 "description_md5": "", "segment": row["segment"]}
  # The doc's pair comes first (docs before catalogs): it keeps the sentence.
  first = next(r for r in added
               if r["inputs"] == "It runs on every free operating system.")
  assert first["origin"] == "doc:tinydoc-de"
  extra_info = manifest["extra_sources"]
  assert extra_info["enabled"]
  f = extra_info["filter"]
  assert f["candidates"] == len(pairs)
  assert f["added"] == len(added)
  assert f["dropped_held_out_package"] == 1
  assert f["dropped_leak_opening_words"] == 2
  assert f["dropped_duplicate_english"] == 2
  assert extra_info["by_origin"]["gettext:luola-data"] == {
      "candidates": 1, "dropped_held_out_package": 1}


def test_manifest_counts_origins(builds):
  (plain, m_plain), (extra, m_extra), _ = builds
  t = m_extra["corpora"][corpora.TRANSLATION_CORPUS]
  train = _rows(extra, "train")
  counts = {}
  for r in train:
    counts[r["origin"]] = counts.get(r["origin"], 0) + 1
  assert t["origins"]["train"] == dict(sorted(counts.items()))
  assert t["origins"]["validation"] == {"ddtp": t["splits"]["validation"]["count"]}
  assert t["splits"]["train"]["count"] == len(train)
  assert corpora.verify_manifest(extra) == m_extra
  sources = m_extra["extra_sources"]["sources"]
  assert set(sources) == {"doc:tinydoc-de", "gettext:tinyapp-l10n",
                          "gettext:luola-data"}
  assert len(sources["gettext:tinyapp-l10n"]["files_sha256"]) == 64
  assert m_plain["extra_sources"] == {"enabled": False}
  assert m_plain["format_version"] == m_extra["format_version"] == 1


def test_extra_train_rows_rules():
  ddtp = {"inputs": "A kept train sentence here", "targets": "x",
          "source_package": "src", "package": "pkg"}
  held = {"inputs": " ".join(f"w{i}" for i in range(30)), "targets": "Ziel eins zwei",
          "source_package": "heldsrc", "package": "heldpkg"}
  splits = {corpora.TRANSLATION_CORPUS: {"train": [ddtp], "validation": [held],
                                         "test": []},
            corpora.SUMMARIZATION_CORPUS: {"train": [], "validation": [],
                                           "test": []}}

  def pair(en, de="Deutsch hier drei", package="fine"):
    return {"inputs": en, "targets": de, "package": package,
            "origin": f"gettext:{package}", "kind": "message", "segment": 0}

  pairs = [
      pair("a kept TRAIN sentence here"),  # duplicate of a DDTP input
      pair("Some good new pair"),
      pair("some good new  pair".replace("  ", " ")),  # duplicate, case
      pair("Another fine pair", package="heldpkg"),  # held-out package
      pair("Another fine pair", package="bin-of-held"),  # held-out source
      pair(" ".join(f"W{i}" for i in range(25)) + " and more"),  # opening words
      pair("A different english text", de="ziel EINS zwei"),  # target leak
  ]
  rows, report = corpora.extra_train_rows(
      pairs, splits, {"bin-of-held": "heldsrc"}, ratios=(1.0, 0.0, 0.0))
  assert [r["inputs"] for r in rows] == ["Some good new pair"]
  assert report["filter"] == {
      "added": 1, "candidates": 7, "dropped_duplicate_english": 2,
      "dropped_held_out_package": 2, "dropped_leak_opening_words": 1,
      "dropped_leak_target": 1}
  with pytest.raises(ValueError, match="without kind"):
    corpora.extra_train_rows([{"inputs": "a", "targets": "b", "package": "p",
                               "origin": "o", "segment": 0}], splits, {})


def test_build_corpus_script_with_extras(packages, tmp_path):
  out, summary = tmp_path / "c", tmp_path / "summary"
  os.makedirs(tmp_path / "extra" / "wheels")
  _write_wheel(str(tmp_path / "extra" / "wheels" / "tiny_shop-1.0-py3-none-any.whl"),
               "tiny_shop", WEB)
  cmd = [sys.executable, os.path.join(REPO, "scripts", "build_corpus.py"),
         "--lists_dir", LISTS, "--out", str(out), "--ratios", "0.5,0.25,0.25",
         "--extra_packages_dir", packages,
         "--doc_packages", "tinydoc-en:tinydoc-de",
         "--gettext_packages", ",".join(GETTEXT), "--summary", str(summary),
         "--extra_dir", str(tmp_path / "extra"), "--pypi_packages", "tiny-shop==1.0"]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=True,
                        cwd=str(tmp_path))
  assert "gettext:tinyapp-l10n" in proc.stdout
  manifest = corpora.verify_manifest(str(out))
  origins = manifest["corpora"][corpora.TRANSLATION_CORPUS]["origins"]["train"]
  assert origins["ddtp"] == 22 and origins["doc:tinydoc-de"] > 0
  assert origins["pypi:tiny-shop"] == 1
  assert [i["name"] for i in manifest["extra_sources"]["inputs"]] == [
      "tiny_shop-1.0-py3-none-any.whl"]
  text = (summary / "summary.md").read_text()
  assert "| gettext:tinyapp-l10n |" in text and "Command: `python scripts/" in text
  assert fileio.read_json_object(str(summary / "manifest.json")) == manifest
  # Offline without unpacked packages: a clear error, not a silent DDTP-only build.
  proc = subprocess.run(cmd[:8], capture_output=True, text=True,
                        cwd=str(tmp_path))
  assert proc.returncode == 2 and "--no_extra" in proc.stderr
