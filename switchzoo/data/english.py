"""An English prose corpus built offline from Debian packages, for the CPU language-model studies.

    python -m switchzoo.data.english --out CORPUS [--debs DIR] [--info-dir /usr/share/info]

Sources (each a package this machine's registries serve; ``apt-get download`` fetches the
documentation packages without installing them):
  * linux-doc-6.1: the kernel's Documentation/ (reStructuredText; translations left out), GPL-2;
  * python3.11-doc: the Python documentation's reStructuredText sources, PSF-2.0;
  * git-doc: git's manual pages and guides (AsciiDoc, read as the same light markup), GPL-2;
  * the GNU Texinfo manuals installed in --info-dir (coreutils, grep, sed, ...; mostly GFDL),
    each credited to the package that installed it (dpkg -S) and its copyright file;
  * the English side of the shipped gettext catalogues (switchzoo/data/corpus), under the
    licences of the programs they translate (switchzoo/data/corpus/en-de.md).
Each file is cut into paragraphs of running prose: headings, directives, literal and code blocks,
tables and lists of names are dropped, inline markup is unwrapped, and a paragraph is kept when it
has at least 8 words that make up most of its characters. A paragraph is a document; duplicates
are kept once. The held-out split is by source file: every paragraph of ~2% of the files (chosen
by a hash of the file's name) is held out, so no page is in both splits.

Writes CORPUS/train.txt and CORPUS/eval.txt (one document per line, in an order fixed by a hash
of each text) and CORPUS/corpus.json: per source the package, version, licence, files, documents
and characters, and the sha1 of each split. The text stays out of the wheel (most of it is GPL
or GFDL and it is ~30 MB); this command builds it where it runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import zlib

from switchzoo import atomic
from switchzoo.data import embedded, manuals

HELD_OUT_PERCENT = 2
MIN_WORDS = 8
MAX_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class Package:
    name: str
    licence: str
    root: str              # where the text lies inside the package
    pattern: str           # which files under root are read
    exclude: tuple[str, ...] = ()


PACKAGES = (
    Package("linux-doc-6.1", "GPL-2.0-only", "usr/share/doc/linux-doc-6.1/Documentation",
            "**/*.rst.gz", ("translations/",)),
    Package("python3.11-doc", "PSF-2.0", "usr/share/doc/python3.11/html/_sources",
            "**/*.rst.txt"),
    Package("git-doc", "GPL-2.0-only", "usr/share/doc/git-doc", "*.txt"),   # AsciiDoc
)

_WORD = re.compile(r"[A-Za-z]{2,}")
_UNDERLINE = re.compile(r"^([=\-~^*+#\"'`:.])\1{2,}\s*$")
_TABLE = re.compile(r"^\s*(\+[-=+]+\+|[=\s]{5,}|\|.*\|)\s*$")
_ROLE = re.compile(r":[\w:.-]+:`([^`<]*?)\s*(?:<([^`>]*)>)?`")   # :ref:`title <target>`
_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]*>`__?")
_MARK = re.compile(r"``([^`]+)``|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|`([^`]+)`_{0,2}")
_BULLET = re.compile(r"^([-*+]|\d+\.|#\.|\(\w\))\s+")
_DIRECTIVE = re.compile(r"^\.\.\s+([\w:-]+)::")
# directives whose bodies are prose (the description of a function, a note, ...): read them
_PROSE_BODIES = {"function", "method", "class", "attribute", "data", "exception", "decorator",
                 "describe", "option", "envvar", "note", "warning", "important", "tip", "hint",
                 "attention", "caution", "seealso", "admonition", "deprecated", "versionadded",
                 "versionchanged", "index", "module", "coroutinemethod", "abstractmethod",
                 "classmethod", "staticmethod", "opcode", "cmdoption", "pdbcommand",
                 "c:function", "c:macro", "c:type", "c:member", "c:var", "py:function",
                 "py:method", "py:class", "py:attribute", "py:data", "topic", "sidebar",
                 "rubric", "glossary", "impl-detail", "availability", "audit-event"}


def is_prose(text: str) -> bool:
    """Running text: several words that make up most of the characters."""
    words = _WORD.findall(text)
    return len(words) >= MIN_WORDS and sum(map(len, words)) >= 0.6 * len(text)


def unwrap(text: str) -> str:
    """Inline reStructuredText markup -> its words."""
    text = _ROLE.sub(lambda m: (m.group(1) or m.group(2) or "").lstrip("~!"), text)
    text = _LINK.sub(r"\1", text)
    text = _MARK.sub(lambda m: next(g for g in m.groups() if g is not None), text)
    text = re.sub(r"\s+", " ", text.replace("\\ ", "")).strip()
    return text[:-1] if text.endswith("::") else text


def rst_paragraphs(text: str) -> list[str]:
    """The prose paragraphs of one reStructuredText file."""
    out, block, skip_below = [], [], None

    def flush():
        if block:
            paragraph = unwrap(" ".join(line.strip() for line in block))
            if is_prose(paragraph):
                out.append(paragraph[:MAX_CHARS])
            block.clear()

    lines = text.splitlines() + [""]
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if skip_below is not None:        # inside a literal block or a directive's body
            if not line.strip() or indent > skip_below:
                continue
            skip_below = None
        if not line.strip():
            flush()
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if _UNDERLINE.match(line) or (_UNDERLINE.match(nxt) and not block) or _TABLE.match(line):
            block.clear()                 # a heading, its over/underline, or a table row
            continue
        stripped = line.strip()
        if stripped.startswith(".. ") or stripped == "..":
            flush()             # a directive, target or comment: its body is skipped unless
            directive = _DIRECTIVE.match(stripped)          # it is prose (a note, a function)
            if directive is None or directive.group(1) not in _PROSE_BODIES:
                skip_below = indent
            continue
        if stripped.startswith(":") and re.match(r"^:[\w -]+:", stripped) and not block:
            continue                      # a field list line (:param x:, :Date:) alone
        if _BULLET.match(stripped) and block:
            flush()                       # each list item is its own paragraph
        block.append(_BULLET.sub("", stripped) if _BULLET.match(stripped) else stripped)
        if stripped.endswith("::"):       # a literal block follows
            flush()
            skip_below = indent
    return out


def _read(path: pathlib.Path) -> str:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return raw.decode("utf-8", errors="replace")


def fetch(package: str, debs: pathlib.Path) -> pathlib.Path:
    """The package's .deb in ``debs`` (apt-get download fetches it once)."""
    found = sorted(debs.glob(f"{package}_*.deb"))
    if not found:
        debs.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["apt-get", "download", package], cwd=debs, capture_output=True,
                              text=True)
        found = sorted(debs.glob(f"{package}_*.deb"))
        if done.returncode or not found:
            raise ValueError(f"cannot fetch Debian package {package} with apt-get download "
                             f"({(done.stderr or done.stdout).strip().splitlines()[-1:]}); "
                             f"put its .deb in --debs={debs} and run again")
    return found[-1]


def deb_field(deb: pathlib.Path, field: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True,
                          check=True).stdout.strip()


def package_files(pkg: Package, debs: pathlib.Path) -> tuple[dict, list[tuple[str, str]]]:
    """(provenance, [(file name, text)]) of one documentation package."""
    deb = fetch(pkg.name, debs)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        root = pathlib.Path(tmp) / pkg.root
        paths = sorted(p for p in root.glob(pkg.pattern)
                       if not any(x in str(p.relative_to(root)) for x in pkg.exclude))
        texts = [(f"{pkg.name}:{p.relative_to(root)}", _read(p)) for p in paths]
    about = {"package": pkg.name, "version": deb_field(deb, "Version"), "licence": pkg.licence,
             "deb": deb.name, "deb_sha1": hashlib.sha1(deb.read_bytes()).hexdigest(),
             "files": len(texts)}
    return about, texts


def info_owners(info_dir: pathlib.Path) -> dict[str, str]:
    """info file name -> the Debian package that installed it (dpkg -S), where dpkg knows."""
    paths = [str(p) for p in manuals.files(info_dir)]
    if not paths:
        return {}
    done = subprocess.run(["dpkg", "-S", *paths], capture_output=True, text=True)
    owners = {}
    for line in done.stdout.splitlines():
        pkg, _, path = line.partition(": ")
        owners[pathlib.Path(path.strip()).name] = pkg.split(":")[0]
    return owners


def _versions(packages: list[str]) -> dict[str, str]:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Version}\\n", *packages],
                          capture_output=True, text=True)
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def held_out(name: str) -> bool:
    return zlib.crc32(name.encode()) % 100 < HELD_OUT_PERCENT


def build(out: pathlib.Path, debs: pathlib.Path, info_dir: pathlib.Path,
          packages=None, log=print) -> dict:
    sources, split = [], {"train": {}, "eval": {}}

    def add(about: dict, files: list[tuple[str, list[str]]]):
        docs = chars = 0
        for name, paragraphs in files:
            bucket = split["eval" if held_out(name) else "train"]
            for p in paragraphs:
                if p not in split["train"] and p not in split["eval"]:
                    bucket[p] = None
                    docs, chars = docs + 1, chars + len(p)
        about.update(documents=docs, characters=chars)
        sources.append(about)
        log(f"  {about['package']} {about.get('version', '')} ({about['licence']}): "
            f"{about.get('files', '')} files, {docs:,} documents, {chars / 1e6:.1f} MB of text")

    for pkg in PACKAGES if packages is None else packages:
        about, texts = package_files(pkg, debs)
        add(about, [(name, rst_paragraphs(text)) for name, text in texts])
    owners = info_owners(info_dir)
    versions = _versions(sorted(set(owners.values())))
    by_owner: dict[str, list] = {}
    for path in manuals.files(info_dir):
        owner = owners.get(path.name, "unknown")
        by_owner.setdefault(owner, []).append((f"info:{path.name}",
                                               manuals.file_paragraphs(path)))
    for owner, files in sorted(by_owner.items()):
        add({"package": owner, "version": versions.get(owner, ""),
             "licence": f"the manual's, in /usr/share/doc/{owner}/copyright (GNU manuals: "
                        "mostly GFDL)", "files": len(files), "from": str(info_dir)}, files)
    english = [e for e, _ in embedded.shipped("de") if is_prose(e)]
    add({"package": "switchzoo/data/corpus/en-de.tsv.xz (English side)",
         "licence": "the translated programs' licences (switchzoo/data/corpus/en-de.md)",
         "files": 1}, [("gettext:en-de", english)])

    result = {"command": "python -m switchzoo.data.english --out " + str(out),
              "held_out": f"by source file: crc32(name) % 100 < {HELD_OUT_PERCENT}",
              "sources": sources}
    out.mkdir(parents=True, exist_ok=True)
    for name, docs in split.items():
        ordered = sorted(docs, key=lambda d: hashlib.sha1(d.encode()).hexdigest())
        text = "".join(d + "\n" for d in ordered)
        atomic.write_text(out / f"{name}.txt", text)
        result[name] = {"documents": len(ordered), "characters": len(text),
                        "bytes": len(text.encode()), "sha1": hashlib.sha1(text.encode()).hexdigest()}
    result["sha1"] = hashlib.sha1((result["train"]["sha1"] + result["eval"]["sha1"])
                                  .encode()).hexdigest()
    atomic.write_text(out / "corpus.json", json.dumps(result, indent=1) + "\n")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchzoo.data.english",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--debs", type=pathlib.Path, default=None,
                   help="where the .deb files are kept (default: OUT/debs)")
    p.add_argument("--info-dir", type=pathlib.Path, default=manuals.INFO_DIR)
    args = p.parse_args(argv)
    try:
        r = build(args.out, args.debs or args.out / "debs", args.info_dir)
    except (ValueError, OSError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}/train.txt: {r['train']['documents']:,} documents, "
          f"{r['train']['bytes'] / 1e6:.1f} MB; eval.txt: {r['eval']['documents']:,} documents "
          f"({100 * r['eval']['documents'] / (r['eval']['documents'] + r['train']['documents']):.1f}"
          f"%); corpus sha1 {r['sha1']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
