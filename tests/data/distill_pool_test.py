"""Tests for specdec.data.distill_pool on the small DDTP fixtures (and a second, hand-written release)."""

import json
import os
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from specdec.data import corpora  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec.data import distill_pool  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec import fileio  # pylint: disable=g-import-not-at-top,wrong-import-position

LISTS = os.path.join(REPO, "tests", "testdata", "lists")
RATIOS = (0.5, 0.25, 0.25)  # luola/aumix -> validation, gizmo/qux/tinytool -> test (see corpora_test)
RELEASES = ("stable", "newer")
EN, DE = corpora.TRANSLATION_CORPUS, corpora.SUMMARIZATION_CORPUS

QUX_DOC_25 = ("The qux utilities help administrators of qux servers to inspect queues, rotate logs, check the "
              "configuration for mistakes and print statistics about connected clients. All")


def _entry(package, md5, short, *long_lines):
  lines = [f"Package: {package}", f"Description-md5: {md5}", f"Description-en: {short}"]
  lines += [f" {line}" for line in long_lines]
  return "\n".join(lines) + "\n"


# A later release: an updated description, a renamed binary of a held-out source (luola), a sentence that is a
# validation input in other case and spacing, a document that opens like a test document, a brand-new package.
NEWER_EN = "\n".join([
    _entry("evince", "e" * 32, "Document (PostScript, PDF) viewer",
           "Evince is a simple viewer for documents in many formats. Evince now supports XPS files too."),
    _entry("luola-ng", "1" * 32, "next generation cave-flying game",
           "Luola NG adds online play for up to eight players. It keeps the split screen mode."),
    _entry("copycat", "2" * 32, "copies of things",
           "this package contains  sound and image files for Luola. Copycat also ships a copy of stuff."),
    _entry("prefixcat", "3" * 32, "assorted utilities for prefix servers",
           QUX_DOC_25 + " about servers of another kind entirely, with a new ending that differs from the one "
           "the test document has."),
    _entry("newpkg", "4" * 32, "a brand new package for tests",
           "Newpkg is new in this release and nowhere else. It has a second sentence as well."),
])
NEWER_PACKAGES = "\n".join([
    "Package: evince\n", "Package: luola-ng\nSource: luola\n", "Package: copycat\n", "Package: prefixcat\n",
    "Package: newpkg\n"])
STABLE_CONTRIB_EN = _entry("newpkg-contrib", "5" * 32, "a contrib package for tests",
                           "Newpkg is new in this release and nowhere else.")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
  root = tmp_path_factory.mktemp("pool")
  corpus = str(root / "corpus")
  corpora.build_corpora(LISTS, corpus, ratios=RATIOS)
  other = root / "other"
  other.mkdir()
  (other / "x_dists_newer_main_i18n_Translation-en").write_text(NEWER_EN)
  (other / "x_dists_newer_main_binary-amd64_Packages").write_text(NEWER_PACKAGES)
  (other / "x_dists_stable_contrib_i18n_Translation-en").write_text(STABLE_CONTRIB_EN)
  out = str(root / "out")
  manifest = distill_pool.build_pool(corpus, [LISTS, str(other)], out, releases=RELEASES,
                                     command="python scripts/build_distill_pool.py --out out")
  rows = {name: {split: fileio.read_jsonl(corpora.corpus_path(out, name, split)) for split in corpora.SPLITS}
          for name in corpora.CORPORA}
  corpus_rows = distill_pool.read_corpus(corpus)
  return dict(root=root, corpus=corpus, other=str(other), out=out, manifest=manifest, rows=rows,
              corpus_rows=corpus_rows)


def _inputs(pool, name):
  return [r["inputs"] for r in pool["rows"][name]["train"]]


# ------------------------------------------------------------------ what the pool holds


def test_layout_matches_the_corpus_and_eval_splits_are_copies(pool):
  out, corpus = pool["out"], pool["corpus"]
  manifest = corpora.verify_manifest(out)  # counts and sha256 of every split
  assert manifest == pool["manifest"]
  for name in corpora.CORPORA:
    for split in ("validation", "test"):
      with open(corpora.corpus_path(out, name, split), "rb") as a, \
          open(corpora.corpus_path(corpus, name, split), "rb") as b:
        assert a.read() == b.read()
  assert manifest["command"] == "python scripts/build_distill_pool.py --out out"
  assert not [f for _, _, fs in os.walk(out) for f in fs if f.endswith(".tmp")]
  names = [i["name"] for i in manifest["inputs"]]
  assert names[0] == "stable_main_i18n_Translation-en" and "newer_main_i18n_Translation-en" in names
  assert not any("_dists_" in n or "x_" in n[:2] for n in names)


def test_superset_of_the_train_split_with_references(pool):
  for name in corpora.CORPORA:
    by_input = {r["inputs"]: r for r in pool["rows"][name]["train"]}
    for row in pool["corpus_rows"][name]["train"]:
      got = by_input[row["inputs"]]
      assert got["origin"] == distill_pool.CORPUS_TRAIN_ORIGIN
      assert got["targets"] == row["targets"] and got["targets"]
      assert got["source_package"] == row["source_package"]
    others = [r for r in pool["rows"][name]["train"] if r["origin"] != distill_pool.CORPUS_TRAIN_ORIGIN]
    assert others and all(r["targets"] == "" for r in others)
    assert all(r["origin"].startswith(distill_pool.LIST_ORIGIN_PREFIX) for r in others)


def test_inputs_of_descriptions_without_german(pool):
  en = _inputs(pool, EN)
  # stellarium's first paragraph has no aligned German sentence: not in the corpus, in the pool.
  assert ("Stellarium renders a realistic sky in 3D, just like what you see with the naked eye or a telescope."
          in en)
  assert "Evince now supports XPS files too." in en
  assert "a brand new package for tests" in en  # a short description
  assert "Features include:" not in en  # 2 words
  assert not any(i.startswith("The default catalogue") for i in en)  # > 60 words
  for r in pool["rows"][EN]["train"]:
    assert 3 <= len(r["inputs"].split()) <= 60 and r["kind"] in ("short", "sentence")
  for r in pool["rows"][DE]["train"]:
    assert len(r["inputs"].split()) >= 30 and r["kind"] == "long"


def test_exact_dedupe_and_first_origin_wins(pool):
  for name in corpora.CORPORA:
    inputs = _inputs(pool, name)
    assert len(inputs) == len(set(inputs))
  by_input = {r["inputs"]: r for r in pool["rows"][EN]["train"]}
  # In stable/contrib and newer/main: the contrib list of the first release comes first.
  assert by_input["Newpkg is new in this release and nowhere else."]["origin"] == "ddtp:stable/contrib"
  assert by_input["It has a second sentence as well."]["origin"] == "ddtp:newer/main"
  stellarium = "Stellarium renders a realistic sky in 3D, just like what you see with the naked eye or a telescope."
  assert by_input[stellarium]["origin"] == "ddtp:stable/main"
  sources = pool["manifest"]["corpora"][EN]["sources"]
  assert sources["ddtp:newer/main"]["duplicates"] >= 1
  assert sum(s["kept"] for s in sources.values()) == len(pool["rows"][EN]["train"])


def test_order_is_the_hash_of_a_stable_key_and_builds_are_identical(pool, tmp_path):
  for name in corpora.CORPORA:
    keys = [distill_pool.order_key(name, i) for i in _inputs(pool, name)]
    assert keys == sorted(keys)
  out = str(tmp_path / "again")
  distill_pool.build_pool(pool["corpus"], [LISTS, pool["other"]], out, releases=RELEASES,
                          command="python scripts/build_distill_pool.py --out out")
  for d, _, files in os.walk(pool["out"]):
    for f in files:
      rel = os.path.relpath(os.path.join(d, f), pool["out"])
      with open(os.path.join(d, f), "rb") as a, open(os.path.join(out, rel), "rb") as b:
        assert a.read() == b.read(), rel


# ------------------------------------------------------------------ leakage


def test_no_pool_input_from_a_held_out_source_or_text(pool):
  held_rows = [r for name in corpora.CORPORA for split in ("validation", "test")
               for r in pool["corpus_rows"][name][split]]
  held_sources = {r["source_package"] for r in held_rows}
  assert {"luola", "qux"} <= held_sources
  held = distill_pool.held_out_from_rows(held_rows, {"luola-ng": {"luola"}})
  train = {name: pool["rows"][name]["train"] for name in corpora.CORPORA}
  assert distill_pool.leakage_overlaps(train, held) == {"source": 0, "package": 0, "text": 0, "prefix": 0}
  assert pool["manifest"]["leakage_overlaps_after_filtering"] == {"source": 0, "package": 0, "text": 0,
                                                                   "prefix": 0}
  en, summ = _inputs(pool, EN), _inputs(pool, DE)
  # luola-ng is a binary of the held-out source luola (in the newer release's Packages only).
  assert not any("Luola NG" in i or "split screen" in i for i in en + summ)
  # A validation input in other case and spacing.
  assert not any(i.lower().startswith("this package contains sound and image files for luola") for i in en)
  assert "Copycat also ships a copy of stuff." in en  # the rest of that description stays
  # A document opening with a test document's first 25 words.
  assert not any(i.startswith(QUX_DOC_25) for i in summ)
  dropped = pool["manifest"]["corpora"]
  assert dropped[EN]["leakage_dropped"]["held_out_package_only"] >= 2
  assert dropped[EN]["leakage_dropped"]["text"] >= 1
  assert dropped[DE]["leakage_dropped"]["prefix"] >= 1


def test_text_leak_rules_unit():
  long_doc = " ".join(f"w{i}" for i in range(40))
  held = distill_pool.held_out_from_rows([
      {"inputs": "Exact Match here", "source_package": "s", "package": "p"},
      {"inputs": long_doc, "source_package": "s", "package": "p-doc"}],
      sources_of={"p-extra": {"s"}, "other": {"o"}})
  assert held.text_leak("exact  match HERE") == "text"
  assert held.text_leak(" ".join(f"w{i}" for i in range(25)) + " other end") == "prefix"
  assert held.text_leak(" ".join(f"w{i}" for i in range(24)) + " other end") is None
  assert held.text_leak("Exact Match here too") is None
  assert held.packages == {"p", "p-doc", "p-extra"}
  assert held.package_held_out("p-extra", {}) and held.package_held_out("x", {"x": {"o", "s"}})
  assert not held.package_held_out("other", {"other": {"o"}})
  assert held.package_held_out("s", {})  # not in any Packages list: its own source


def test_collector_counts_and_drops(tmp_path):
  held = distill_pool.held_out_from_rows([{"inputs": "held out text here", "source_package": "bad",
                                           "package": "bad"}])
  c = distill_pool.PoolCollector(held, sources_of={"bad-bin": {"bad"}}, source_of={"good-bin": "good"})
  c.add_corpus_rows(EN, [{"inputs": "A corpus train input", "targets": "Ein Eingang", "source_package": "good",
                          "package": "good-bin", "kind": "short", "origin": "ddtp", "description_md5": "m",
                          "segment": 0}])
  descs = [corpora.Description("good-bin", "a" * 32, "en", "A corpus train input", ("One new sentence here.",)),
           corpora.Description("bad-bin", "b" * 32, "en", "only the held out package", ("held out text here",)),
           corpora.Description("good-bin", "c" * 32, "en", "held out text here", ())]
  c.add_descriptions(descs, "ddtp:r/main")
  rows, report = c.finish()
  assert sorted(r["inputs"] for r in rows[EN]) == ["A corpus train input", "One new sentence here."]
  new = next(r for r in rows[EN] if r["inputs"] == "One new sentence here.")
  assert (new["source_package"], new["package"], new["targets"], new["kind"]) == ("good", "good-bin", "",
                                                                                  "sentence")
  assert report[EN]["leakage_dropped"] == {"held_out_package_only": 1, "text": 1, "prefix": 0}
  assert report[EN]["sources"]["ddtp:r/main"]["held_out_occurrences"] == 2
  assert report[EN]["sources"]["corpus:train"]["kept"] == 1 and report[EN]["with_reference"] == 1


def test_description_inputs():
  d = corpora.Description("p", "m", "en", "short   description here",
                          ("First sentence is here. Second one follows.", ".", "  * a bullet item here", ".",
                           "Two words."))
  assert distill_pool.translation_inputs(d) == [
      ("short", 0, "short description here"), ("sentence", 1, "First sentence is here."),
      ("sentence", 2, "Second one follows."), ("sentence", 3, "a bullet item here")]
  assert distill_pool.summarization_input(d) is None
  d30 = corpora.Description("p", "m", "en", "s", tuple(["word " * 10] * 3))
  assert distill_pool.summarization_input(d30) == ("word " * 30).strip()


def test_tasks_read_the_pool(pool):
  pytest.importorskip("seqio")
  from specdec import evaluation, tasks  # pylint: disable=g-import-not-at-top
  try:
    tasks.register_local_tasks(pool["out"])
    for task in tasks.LOCAL_TASKS:
      examples = evaluation.task_examples(task, "train", {"inputs": 96, "targets": 48}, 4)
      assert len(examples) == 4
      name = EN if task == tasks.ENDE_LOCAL_TASK else DE
      for ex, row in zip(examples, pool["rows"][name]["train"]):
        assert row["inputs"] in ex["inputs_pretokenized"].decode()
        assert ex["origin"].decode() == row["origin"]
  finally:
    tasks.register_local_tasks()


# ------------------------------------------------------------------ lists and apt sources


def test_list_names_and_priority():
  f = distill_pool.parse_list_name("/x/h_debian_dists_trixie-security_non-free_i18n_Translation-en")
  assert (f.kind, f.suite, f.component, f.origin) == ("Translation-en", "trixie-security", "non-free",
                                                       "ddtp:trixie-security/non-free")
  assert distill_pool.parse_list_name("/x/h_dists_sid_main_binary-amd64_Packages.xz").kind == "Packages"
  assert distill_pool.parse_list_name("/x/h_dists_sid_main_i18n_Translation-de") is None
  names = ["a_dists_sid_main_i18n_Translation-en", "a_dists_bookworm-security_main_i18n_Translation-en",
           "a_dists_bookworm_contrib_i18n_Translation-en", "a_dists_bookworm_main_i18n_Translation-en",
           "a_dists_bookworm-updates_main_i18n_Translation-en", "a_dists_other_main_i18n_Translation-en"]
  files = sorted((distill_pool.parse_list_name(n) for n in names),
                 key=distill_pool.priority_key(("bookworm", "sid")))
  assert [f.origin for f in files] == ["ddtp:bookworm/main", "ddtp:bookworm/contrib", "ddtp:bookworm-updates/main",
                                       "ddtp:bookworm-security/main", "ddtp:sid/main", "ddtp:other/main"]


SYSTEM_SOURCES = """\
Types: deb
# a comment
URIs: http://mirror.invalid/debian
Suites: stable stable-updates
Components: main
Signed-By: /usr/share/keyrings/k.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: stable-security
Components: main
Signed-By: /usr/share/keyrings/k.gpg

Types: deb-src
URIs: http://mirror.invalid/debian
Suites: stable
Components: main

Types: deb
URIs: http://other.invalid/x
Suites: nodistro
Components: main
Enabled: no
"""


def test_parse_and_derive_sources():
  system = distill_pool.parse_sources_deb822(SYSTEM_SOURCES)
  assert [s.suites for s in system] == [("stable", "stable-updates"), ("stable-security",)]
  lines = distill_pool.parse_sources_lines(
      "deb [arch=amd64 signed-by=/k.gpg] http://m.invalid/debian stable main contrib\n"
      "# deb http://m.invalid/debian old main\ndeb-src http://m.invalid/debian stable main\n")
  assert lines == [distill_pool.AptSource(("http://m.invalid/debian",), ("stable",), ("main", "contrib"),
                                          "/k.gpg")]
  have = {("stable", "main"), ("stable-updates", "main"), ("stable-security", "main")}
  derived = distill_pool.derive_sources(system, ("stable", "newer", "sid"), ("main", "contrib"), have)
  assert [(d.uris[0].rsplit("/", 1)[1], d.suites, d.components) for d in derived] == [
      ("debian", ("stable",), ("contrib",)), ("debian", ("stable-updates",), ("contrib",)),
      ("debian-security", ("stable-security",), ("contrib",)),
      ("debian", ("newer",), ("main", "contrib")), ("debian", ("newer-updates",), ("main", "contrib")),
      ("debian-security", ("newer-security",), ("main", "contrib")),
      ("debian", ("sid",), ("main", "contrib"))]
  assert all(d.signed_by == "/usr/share/keyrings/k.gpg" for d in derived)
  text = distill_pool.render_sources(derived[:1])
  assert distill_pool.parse_sources_deb822(text) == derived[:1]
  with pytest.raises(RuntimeError, match="no Debian archive"):
    distill_pool.derive_sources(system[1:], ("newer",))
  assert distill_pool._without_hosts(  # pylint: disable=protected-access
      "W: Skipping http://mirror.invalid/debian x_dists_newer_main_i18n_Translation-en") == (
          "W: Skipping <archive> newer_main_i18n_Translation-en")


def _fake_apt(tmp_path):
  """apt-config and apt-get stand-ins: the system's sources in tmp_path/etc; update copies a fixture list."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  etc = tmp_path / "etc"
  (etc / "sources.list.d").mkdir(parents=True)
  (etc / "sources.list.d" / "debian.sources").write_text(SYSTEM_SOURCES)
  (etc / "sources.list.d" / "ignored.sources.disabled").write_text("Types: deb\nURIs: x\nSuites: y\n")
  seen = tmp_path / "seen.sources"
  config = bin_dir / "apt-config"
  config.write_text(f"""#!/bin/sh
echo 'Dir "/";'
echo 'Dir::Etc "{etc}";'
echo 'Dir::Etc::sourcelist "sources.list";'
echo 'Dir::Etc::sourceparts "sources.list.d";'
""")
  get = bin_dir / "apt-get"
  get.write_text(f"""#!{sys.executable}
import os, re, shutil, sys
conf = open(os.environ["APT_CONFIG"]).read()
assert 'Acquire::Languages {{ "en"; }};' in conf, conf
opts = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
parts = opts["Dir::Etc::SourceParts"]
shutil.copy(os.path.join(parts, "pool.sources"), {str(seen)!r})
with open({str(seen)!r} + ".dir", "w") as f:
  f.write(parts)
lists = re.search(r'Dir::State::Lists "([^"]+)";', conf).group(1)
with open(os.path.join(lists, "h_dists_newer_main_i18n_Translation-en"), "w") as f:
  f.write("")
print("W: Skipping http://mirror.invalid/debian x_dists_newer_non-free_i18n_Translation-en", file=sys.stderr)
""")
  for script in (config, get):
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
  return str(get), seen


def test_fetch_pool_lists_with_fake_apt(tmp_path, monkeypatch):
  monkeypatch.setattr(os, "geteuid", lambda: 0)
  apt_get, seen = _fake_apt(tmp_path)
  logs = []
  lists = distill_pool.fetch_pool_lists(str(tmp_path / "apt"), releases=("stable", "newer"),
                                        components=("main",), have={("stable", "main"),
                                                                    ("stable-updates", "main"),
                                                                    ("stable-security", "main")},
                                        apt_get=apt_get, log=logs.append)
  assert "h_dists_newer_main_i18n_Translation-en" in os.listdir(lists)
  sources = distill_pool.parse_sources_deb822(seen.read_text())
  assert [s.suites for s in sources] == [("newer",), ("newer-updates",), ("newer-security",)]
  assert not os.path.exists(open(str(seen) + ".dir").read())  # the temporary sources are gone
  assert not any("mirror.invalid" in line for line in logs)
  assert any("Skipping <archive> newer_non-free" in line for line in logs)


def test_fetch_pool_lists_needs_root(tmp_path, monkeypatch):
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  apt_get, _ = _fake_apt(tmp_path)
  with pytest.raises(RuntimeError, match="needs root"):
    distill_pool.fetch_pool_lists(str(tmp_path / "apt"), apt_get=apt_get)


def test_build_distill_pool_script(pool, tmp_path):
  out = tmp_path / "p"
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "build_distill_pool.py"), "--skip_fetch",
       "--corpus", pool["corpus"], "--lists_dir", LISTS, "--apt_dir", str(tmp_path / "none"),
       "--releases", *RELEASES, "--out", str(out)],
      capture_output=True, text=True, check=True, cwd=str(tmp_path))
  assert "translate_en_de: train" in proc.stdout
  manifest = corpora.verify_manifest(str(out))
  assert manifest["command"].startswith("python scripts/build_distill_pool.py --skip_fetch --corpus ")
  assert str(tmp_path) not in json.dumps(manifest)  # relative paths only
  assert manifest["corpora"][EN]["splits"]["train"]["count"] > len(pool["corpus_rows"][EN]["train"])
