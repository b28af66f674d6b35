"""The English prose corpus (switchzoo.data.english): markup to paragraphs, a real .deb built
here read with provenance, held-out by file, sha1s of what is written; .mo files via polib."""
import gzip
import hashlib
import json
import pathlib
import subprocess
import sys

import polib
import pytest

from switchzoo.data import embedded, english

RST = """\
.. SPDX-License-Identifier: GPL-2.0

=================
A Title Is Skipped
=================

The scheduler keeps a list of runnable tasks and picks the next one by its
virtual runtime, see :ref:`the design notes <sched-design>` and ``sched_yield``.

Here is an example::

    while (true) { schedule(); }  and this literal block is skipped entirely here

.. code-block:: c

   int skipped_because_it_is_code_in_a_code_block_with_many_words_in_it = 1;

.. note::

   A note's body is prose: the kernel never sleeps while holding a spinlock,
   because another processor could spin forever waiting for it.

- the first item of a list has enough words to count as running text here
- the second item of the list also has enough words to count as running text

+-------+-------+
| a     | table |
+-------+-------+

Short line.
"""


def test_rst_paragraphs_keep_prose_and_drop_markup():
    got = english.rst_paragraphs(RST)
    assert got == [
        "The scheduler keeps a list of runnable tasks and picks the next one by its virtual "
        "runtime, see the design notes and sched_yield.",
        "A note's body is prose: the kernel never sleeps while holding a spinlock, because "
        "another processor could spin forever waiting for it.",
        "the first item of a list has enough words to count as running text here",
        "the second item of the list also has enough words to count as running text"]


def _deb(tmp: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """A real Debian package zz-doc 1.2-3 holding ``files`` under usr/share/doc/zz (gzipped)."""
    root = tmp / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: zz-doc\nVersion: 1.2-3\nArchitecture: all\nMaintainer: t <t@example.org>\n"
        "Description: test documentation\n")
    for name, text in files.items():
        path = root / "usr/share/doc/zz" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(text.encode()))
    debs = tmp / "debs"
    debs.mkdir()
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root),
                    str(debs / "zz-doc_1.2-3_all.deb")], check=True, capture_output=True)
    return debs


PARA = "Paragraph {} of page {} says enough words about memory barriers to be kept here."


def test_build_records_provenance_splits_by_file_and_dedupes(tmp_path, monkeypatch):
    pages = {f"p{i}.rst.gz": "\n\n".join(PARA.format(j, i) for j in range(3)) +
             "\n\nThe same shared paragraph appears on every single page of this package.\n"
             for i in range(6)}
    pages["translations/x.rst.gz"] = PARA.format(0, "qqtranslatedqq")
    debs = _deb(tmp_path, pages)
    info = tmp_path / "info"
    info.mkdir()
    pkg = english.Package("zz-doc", "GPL-2.0-only", "usr/share/doc/zz", "**/*.rst.gz",
                          ("translations/",))
    monkeypatch.setattr(english, "held_out", lambda name: name.endswith(("p1.rst.gz",
                                                                          "p4.rst.gz")))
    out = tmp_path / "corpus"
    r = english.build(out, debs, info, packages=(pkg,), log=lambda *_: None)
    train = (out / "train.txt").read_text().splitlines()
    held = (out / "eval.txt").read_text().splitlines()
    zz = r["sources"][0]
    assert (zz["package"], zz["version"], zz["licence"], zz["files"]) == (
        "zz-doc", "1.2-3", "GPL-2.0-only", 6)                      # translations left out
    assert zz["deb_sha1"] == hashlib.sha1(
        (debs / "zz-doc_1.2-3_all.deb").read_bytes()).hexdigest()
    assert zz["documents"] == 6 * 3 + 1                            # the shared one once
    assert sum("shared paragraph" in t for t in train + held) == 1
    assert not any("qqtranslatedqq" in t for t in train + held)
    assert {t for t in held if "memory" in t} == {PARA.format(j, i) for i in (1, 4)
                                                   for j in range(3)}
    assert not set(train) & set(held)
    assert len(train) == len(set(train))
    for split, lines in (("train", train), ("eval", held)):
        text = "".join(t + "\n" for t in lines)
        assert r[split]["sha1"] == hashlib.sha1(text.encode()).hexdigest()
        assert r[split]["documents"] == len(lines)
    assert json.loads((out / "corpus.json").read_text())["sha1"] == r["sha1"]
    gettext = r["sources"][-1]
    assert gettext["documents"] > 1000 and "en-de" in gettext["package"]


def test_a_package_that_cannot_be_fetched_is_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from switchzoo.data import english as e;"
         "e.PACKAGES = (e.Package('zz-no-such-package-doc', 'x', 'usr', '*'),);"
         "sys.exit(e.main(['--out', sys.argv[1]]))", str(tmp_path / "c")],
        capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "zz-no-such-package-doc" in done.stderr
    assert "--debs=" in done.stderr
    assert not (tmp_path / "c" / "train.txt").exists()


def test_parse_mo_skips_plurals_headers_and_untranslated(tmp_path):
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8"}
    po.append(polib.POEntry(msgid="File not found", msgstr="Datei nicht gefunden"))
    po.append(polib.POEntry(msgid="Open", msgstr="Öffnen", msgctxt="menu"))
    po.append(polib.POEntry(msgid="Untranslated", msgstr=""))
    po.append(polib.POEntry(msgid="%d file", msgid_plural="%d files",
                            msgstr_plural={0: "%d Datei", 1: "%d Dateien"}))
    path = tmp_path / "de.mo"
    po.save_as_mofile(str(path))
    assert sorted(embedded.parse_mo(path)) == [("File not found", "Datei nicht gefunden"),
                                               ("Open", "Öffnen")]
    (tmp_path / "junk.mo").write_bytes(b"not a catalogue at all, just some bytes")
    assert embedded.parse_mo(tmp_path / "junk.mo") == []
