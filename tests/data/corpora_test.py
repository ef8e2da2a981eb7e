"""Tests for specdec.data.corpora on small hand-written DDTP fixtures."""

import gzip
import json
import lzma
import os
import shutil
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from specdec.data import apt_lists  # pylint: disable=g-import-not-at-top
from specdec.data import corpora  # pylint: disable=g-import-not-at-top
from specdec import fileio  # pylint: disable=g-import-not-at-top

LISTS = os.path.join(REPO, "tests", "testdata", "lists")
EN = os.path.join(LISTS, "fixture_dists_stable_main_i18n_Translation-en")
DE = os.path.join(LISTS, "fixture_dists_stable_main_i18n_Translation-de")
PACKAGES = os.path.join(LISTS, "fixture_dists_stable_main_binary-amd64_Packages")
SPM_MODEL = os.path.join(REPO, "specdec", "assets", "spm_ende_8k.model")

# With these ratios the fixture's sources spread over all three splits:
# evince/foo/stellarium/... -> train, luola/aumix -> validation,
# gizmo/qux/tinytool -> test.
RATIOS = (0.5, 0.25, 0.25)


def _read(path):
  return list(corpora.read_list_lines(path))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("corpus"))
  manifest = corpora.build_corpora(LISTS, out, ratios=RATIOS)
  rows = {name: {split: fileio.read_jsonl(corpora.corpus_path(out, name, split))
                 for split in corpora.SPLITS} for name in corpora.CORPORA}
  return out, manifest, rows


def _all_rows(rows, name):
  return [(split, r) for split in corpora.SPLITS for r in rows[name][split]]


# ------------------------------------------------------------------ parsing


def test_parse_deb822_continuations_and_filter():
  text = ["Package: a", "Depends: x,", " y", "", "", "# comment",
          "Package: b", "Source: c (1.0)", ""]
  stanzas = list(corpora.parse_deb822(text))
  assert stanzas == [{"Package": "a", "Depends": "x,\n y"},
                     {"Package": "b", "Source": "c (1.0)"}]
  assert list(corpora.parse_deb822(text, keep=("Package",))) == [
      {"Package": "a"}, {"Package": "b"}]


def test_parse_translation_fixture():
  en = list(corpora.parse_translation(_read(EN)))
  de = list(corpora.parse_translation(_read(DE)))
  assert len(en) == 18 and len(de) == 14
  assert {d.lang for d in en} == {"en"} and {d.lang for d in de} == {"de"}
  evince = next(d for d in en if d.package == "evince")
  assert evince.short == "Document (PostScript, PDF) viewer"
  pars = corpora.paragraphs(evince.long_lines)
  assert len(pars) == 3
  assert pars[1][1] == "  * searching for text in the document"  # verbatim
  assert corpora.paragraph_units(pars[1]) == [
      "Features include:", "searching for text in the document",
      "bookmarks from the table of contents"]
  assert corpora.paragraph_text(pars[2]) == (
      "This package contains the main program.")
  # Two packages share one description (same md5).
  md5s = [d.md5 for d in en if d.package in ("evince-gtk", "a-viewer-dummy")]
  assert len(md5s) == 2 and md5s[0] == md5s[1]


def test_parse_packages_sources():
  sources = corpora.parse_packages(_read(PACKAGES))
  assert sources["evince"] == "evince"  # no Source field
  assert sources["libevince-dev"] == "evince"
  assert sources["libevview3-3"] == "evince"  # "(version)" stripped
  assert sources["luola-data"] == "luola"
  assert sources["a-viewer-dummy"] == "zzz-dummy"
  assert "archonly-tool" not in sources
  assert len(sources) == 17


def test_compressed_lists(tmp_path):
  plain = _read(EN)
  with open(EN, "rb") as f:
    data = f.read()
  gz = tmp_path / "x_dists_s_main_i18n_Translation-en.gz"
  gz.write_bytes(gzip.compress(data))
  xz = tmp_path / "x_dists_s_main_i18n_Translation-de.xz"
  xz.write_bytes(lzma.compress(data))
  assert _read(str(gz)) == plain
  assert _read(str(xz)) == plain
  lz4 = tmp_path / "x_dists_s_main_binary-amd64_Packages.lz4"
  lz4.write_bytes(b"\x04\x22\x4d\x18")
  found = corpora.find_lists(str(tmp_path))
  assert found == {"Translation-en": [str(gz)], "Translation-de": [str(xz)],
                   "Packages": [str(lz4)]}
  with pytest.raises(RuntimeError, match="lz4"):
    _read(str(lz4))


def test_find_lists_missing_kind(tmp_path):
  shutil.copy(EN, tmp_path)
  with pytest.raises(RuntimeError, match="Translation-de, Packages"):
    corpora.find_lists(str(tmp_path))


def test_list_display_name_has_no_repository_prefix():
  assert corpora.list_display_name(
      "/x/some.host_debian_dists_bookworm_main_i18n_Translation-en") == (
          "bookworm_main_i18n_Translation-en")


# ------------------------------------------------------------------ text


@pytest.mark.parametrize("text,expected", [
    ("One sentence. Another one! A third? yes.",
     ["One sentence.", "Another one!", "A third? yes."]),
    ("Use e.g. GNOME or KDE. Then stop.",
     ["Use e.g. GNOME or KDE.", "Then stop."]),
    ("Es kann z. B. ALSA steuern. Es ist gut.",
     ["Es kann z. B. ALSA steuern.", "Es ist gut."]),
    ("0 A.D. ist ein Spiel. Es ist frei.", ["0 A.D. ist ein Spiel.",
                                            "Es ist frei."]),
    ("Version 2.0 is out (see Dr. Who). \"Quoted\" text.",
     ["Version 2.0 is out (see Dr. Who).", "\"Quoted\" text."]),
    ("bzw. Foo bleibt.", ["bzw. Foo bleibt."]),
])
def test_split_sentences(text, expected):
  assert corpora.split_sentences(text) == expected


# ------------------------------------------------------------------ corpora


def test_md5_join_and_sentence_pairing(built):
  _, manifest, rows = built
  stats = manifest["corpora"][corpora.TRANSLATION_CORPUS]["stats"]
  # 13 German descriptions; the stale one (md5 000...) joins nothing.
  assert stats["joined_descriptions"] == 12
  assert stats["paragraph_count_mismatch"] == 1  # tinytool
  assert stats["paragraphs_sentence_count_mismatch"] == 1  # stellarium p1
  pairs = {r["inputs"]: r["targets"]
           for _, r in _all_rows(rows, corpora.TRANSLATION_CORPUS)}
  assert pairs["This package contains sound and image files for luola."] == (
      "Dieses Paket beinhaltet Sound- und Bilddateien für Luola.")
  assert pairs["searching for text in the document"] == (
      "Suche nach Text im Dokument")
  assert pairs["It can save and restore mixer settings, e.g. ALSA levels, "
               "and it is scriptable."].startswith("Es kann Mixer-Einstellungen")
  # stellarium: paragraph 1 has 2 EN vs 1 DE sentences -> skipped; p2 kept.
  assert not any(k.startswith("Stellarium renders") for k in pairs)
  assert "It shows stars, planets and nebulae with fast and smooth rendering." \
      in pairs
  # tinytool: paragraph count differs -> only the short description.
  assert pairs["tiny tool for testing things"] == (
      "kleines Werkzeug zum Testen von Dingen")
  assert not any(k.startswith("Tinytool") for k in pairs)


def test_translation_filters(built):
  _, manifest, rows = built
  stats = manifest["corpora"][corpora.TRANSLATION_CORPUS]["stats"]
  all_rows = [r for _, r in _all_rows(rows, corpora.TRANSLATION_CORPUS)]
  for r in all_rows:
    assert 3 <= len(r["inputs"].split()) <= 60
    assert 3 <= len(r["targets"].split()) <= 60
    assert r["inputs"] != r["targets"]
  inputs = [r["inputs"] for r in all_rows]
  assert len(inputs) == len(set(inputs))  # de-duplicated on the English side
  # "Features include:" (2 words) and the 60+ word catalogue sentence.
  assert stats["dropped_length_sentence"] == 2
  assert "Features include:" not in inputs
  assert not any(i.startswith("The default catalogue") for i in inputs)
  assert stats["dropped_untranslated_sentence"] == 1  # fonts-sample
  assert not any(i.startswith("Its glyphs") for i in inputs)
  # Shared sentences are kept once (first by source, package).
  dev = [r for r in all_rows
         if r["inputs"] == "This package contains the development files."]
  assert len(dev) == 1 and dev[0]["package"] == "libevince-dev"
  assert stats["dropped_duplicate_english"] == 7
  assert len(all_rows) == stats["pairs"] == 33


def test_summarization(built):
  _, manifest, rows = built
  stats = manifest["corpora"][corpora.SUMMARIZATION_CORPUS]["stats"]
  all_rows = [r for _, r in _all_rows(rows, corpora.SUMMARIZATION_CORPUS)]
  for r in all_rows:
    assert len(r["inputs"].split()) >= 30
    assert r["kind"] == "long"
  by_pkg = {r["package"]: r for r in all_rows}
  assert by_pkg["luola-data"]["targets"] == (
      "multiplayer cave-flying game - data files")
  assert by_pkg["evince"]["inputs"].startswith(
      "Evince is a simple viewer for documents in many formats. It can show")
  assert "* searching for text" in by_pkg["evince"]["inputs"]
  assert "stellarium-data" not in by_pkg and "tinytool" not in by_pkg
  assert stats["dropped_short_document"] == 7
  assert len({r["inputs"] for r in all_rows}) == len(all_rows)


def test_provenance(built):
  _, _, rows = built
  for name in corpora.CORPORA:
    for _, r in _all_rows(rows, name):
      assert r["origin"] == "ddtp"
      assert r["kind"] in ("short", "sentence", "long")
      assert r["source_package"] and r["package"]
      assert len(r["description_md5"]) == 32
      assert list(r)[:2] == ["inputs", "targets"]
  tr = {(r["package"], r["kind"]): r["source_package"]
        for _, r in _all_rows(rows, corpora.TRANSLATION_CORPUS)}
  assert tr[("libevince-dev", "short")] == "evince"
  # Shared description: the alphabetically first (source, package) wins.
  assert tr[("evince-gtk", "short")] == "evince"
  summ = {r["package"]: r["source_package"]
          for _, r in _all_rows(rows, corpora.SUMMARIZATION_CORPUS)}
  assert summ["libevview3-3"] == "evince"
  assert summ["archonly-tool"] == "archonly-tool"  # not in Packages


def test_splits_by_source_package(built):
  _, _, rows = built
  for name in corpora.CORPORA:
    split_of_source = {}
    for split, r in _all_rows(rows, name):
      assert split == corpora.split_of(r["source_package"], RATIOS)
      assert split_of_source.setdefault(r["source_package"], split) == split
  tr = {r["package"]: split
        for split, r in _all_rows(rows, corpora.TRANSLATION_CORPUS)}
  # Sister binaries share their split.
  assert tr["luola"] == tr["luola-data"] == "validation"
  assert tr["evince"] == tr["evince-common"] == tr["libevince-dev"] == "train"
  assert tr["foo-tools"] == tr["libfoo-dev"] == "train"
  assert all(rows[n][s] for n in corpora.CORPORA for s in ("train",
                                                           "validation"))


def test_split_of_is_stable():
  assert corpora.split_of("evince") == "train"
  assert corpora.split_of("qux") == "validation"
  counts = {s: 0 for s in corpora.SPLITS}
  for i in range(20000):
    counts[corpora.split_of(f"pkg{i}")] += 1
  assert 17700 < counts["train"] < 18300
  assert 850 < counts["validation"] < 1150 and 850 < counts["test"] < 1150
  with pytest.raises(ValueError):
    corpora.split_of("x", (0.5, 0.5))


def test_leakage_filter_build(built):
  _, manifest, rows = built
  # gizmo-tools (test) opens with the same 25+ words as foo-tools (train).
  assert manifest["corpora"][corpora.SUMMARIZATION_CORPUS][
      "leakage_dropped"] == {"validation": 0, "test": 1}
  test_pkgs = [r["package"] for r in rows[corpora.SUMMARIZATION_CORPUS]["test"]]
  assert test_pkgs == ["qux-utils"]


def test_filter_leakage_unit():
  def row(text):
    return {"inputs": text, "targets": "t"}
  long_train = " ".join(f"w{i}" for i in range(40))
  splits = {
      "train": [row("Exact Match here"), row(long_train)],
      "validation": [row("exact   match HERE"), row("fresh text here"),
                     row(" ".join(f"w{i}" for i in range(25)) + " other end")],
      "test": [row(" ".join(f"w{i}" for i in range(24)) + " other end")],
  }
  out, dropped = corpora.filter_leakage(splits)
  assert dropped == {"validation": 2, "test": 0}
  assert [r["inputs"] for r in out["validation"]] == ["fresh text here"]
  assert out["train"] == splits["train"] and len(out["test"]) == 1


# ------------------------------------------------------------------ output


def test_manifest_and_checksums(built):
  out, manifest, rows = built
  assert corpora.verify_manifest(out) == manifest
  assert manifest["split"]["ratios"] == dict(zip(corpora.SPLITS, RATIOS))
  for name in corpora.CORPORA:
    for split in corpora.SPLITS:
      info = manifest["corpora"][name]["splits"][split]
      assert info["count"] == len(rows[name][split])
      assert info["file"] == f"{name}/{split}.jsonl"
  assert [i["name"] for i in manifest["inputs"]] == [
      "stable_main_i18n_Translation-en", "stable_main_i18n_Translation-de",
      "stable_main_binary-amd64_Packages"]
  assert not [f for _, _, fs in os.walk(out) for f in fs if f.endswith(".tmp")]
  with open(os.path.join(out, corpora.MANIFEST_NAME), "rb") as f:
    data = f.read()
  corrupt = corpora.corpus_path(out, corpora.TRANSLATION_CORPUS, "test")
  original = open(corrupt, "rb").read()
  try:
    with open(corrupt, "ab") as f:
      f.write(b"\n")
    with pytest.raises(ValueError, match="sha256"):
      corpora.verify_manifest(out)
  finally:
    with open(corrupt, "wb") as f:
      f.write(original)
  assert json.loads(data) == manifest


def test_build_is_deterministic(built, tmp_path):
  out, _, _ = built
  corpora.build_corpora(LISTS, str(tmp_path), ratios=RATIOS)
  files = sorted(os.path.relpath(os.path.join(d, f), out)
                 for d, _, fs in os.walk(out) for f in fs)
  assert files == sorted(os.path.relpath(os.path.join(d, f), str(tmp_path))
                         for d, _, fs in os.walk(str(tmp_path)) for f in fs)
  assert len(files) == 7
  for rel in files:
    with open(os.path.join(out, rel), "rb") as a, \
        open(os.path.join(str(tmp_path), rel), "rb") as b:
      assert a.read() == b.read(), rel


def test_build_corpus_script(tmp_path):
  out = tmp_path / "c"
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "build_corpus.py"),
       "--lists_dir", LISTS, "--out", str(out), "--ratios", "0.5,0.25,0.25",
       "--no_extra"],
      capture_output=True, text=True, check=True, cwd=str(tmp_path))
  assert "translate_en_de/train.jsonl" in proc.stdout
  manifest = corpora.verify_manifest(str(out))
  assert manifest["corpora"][corpora.TRANSLATION_CORPUS]["splits"]["train"][
      "count"] == 22


# ------------------------------------------------------------------ apt


def test_missing_apt_get_is_a_clear_error(tmp_path, monkeypatch):
  with pytest.raises(RuntimeError, match=r"apt-get not found.*--lists_dir"):
    corpora.fetch_lists(str(tmp_path), apt_get="/nonexistent/bin/apt-get")
  monkeypatch.setenv(apt_lists.APT_GET_ENV, "/nonexistent/bin/apt-get")
  with pytest.raises(RuntimeError, match="apt-get not found"):
    corpora.fetch_lists(str(tmp_path))
  monkeypatch.setenv("PATH", str(tmp_path))
  monkeypatch.delenv(apt_lists.APT_GET_ENV)
  with pytest.raises(RuntimeError, match="apt-get not found"):
    corpora.fetch_lists(str(tmp_path))


def _fake_apt_get(tmp_path):
  """An apt-get stand-in that checks the private config and copies fixtures."""
  script = tmp_path / "apt-get"
  script.write_text(f"""#!{sys.executable}
import os, re, shutil, sys
conf = open(os.environ["APT_CONFIG"]).read()
get = lambda k: re.search(k + r' "([^"]+)";', conf).group(1)
assert sys.argv[1:2] == ["update"], sys.argv
assert 'Acquire::Languages {{ "en"; "de"; }};' in conf, conf
assert os.listdir(get("Dir::Etc::Parts")) == []
lists = get("Dir::State::Lists")
for name in os.listdir({LISTS!r}):
  shutil.copy(os.path.join({LISTS!r}, name), lists)
print("Reading package lists... Done")
""")
  script.chmod(script.stat().st_mode | stat.S_IXUSR)
  return str(script)


def test_fetch_lists_with_fake_apt(tmp_path, monkeypatch):
  monkeypatch.setattr(os, "geteuid", lambda: 0)
  apt_dir = tmp_path / "apt"
  (apt_dir / "parts").mkdir(parents=True)
  (apt_dir / "parts" / "leftover.conf").write_text("x")
  lists = corpora.fetch_lists(str(apt_dir), apt_get=_fake_apt_get(tmp_path))
  assert lists == str(apt_dir / "lists")
  assert sorted(corpora.find_lists(lists)) == sorted(corpora.LIST_KINDS)
  conf = (apt_dir / "apt.conf").read_text()
  assert f'Dir::Cache "{apt_dir / "cache"}";' in conf


def test_fetch_lists_needs_root(tmp_path, monkeypatch):
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  with pytest.raises(RuntimeError, match="needs root"):
    corpora.fetch_lists(str(tmp_path), apt_get=_fake_apt_get(tmp_path))


def test_apt_get_failure_is_reported(tmp_path, monkeypatch):
  monkeypatch.setattr(os, "geteuid", lambda: 0)
  script = tmp_path / "apt-get"
  script.write_text("#!/bin/sh\necho 'E: could not resolve' >&2\nexit 100\n")
  script.chmod(0o755)
  with pytest.raises(RuntimeError, match="(?s)exited with 100.*could not resolve"):
    corpora.fetch_lists(str(tmp_path / "apt"), apt_get=str(script))


# ------------------------------------------------------------------ vocab


def test_shipped_vocabulary():
  seqio = pytest.importorskip("seqio")
  vocab = seqio.SentencePieceVocabulary(SPM_MODEL, extra_ids=100)
  assert vocab.vocab_size == 8100
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  for text in ["This package contains sound and image files for luola.",
               "Dieses Paket beinhaltet Sound- und Bilddateien für Luola."]:
    ids = vocab.encode(text)
    assert 2 not in ids and 0 < len(ids) < 20
    assert vocab.decode(ids) == text
  ids = vocab.encode(corpora.TRANSLATE_PREFIX + "Grüße aus Köln")
  assert vocab.decode(ids) == "translate English to German: Grüße aus Köln"
