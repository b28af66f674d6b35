"""Rebuilds the shipped demo corpus (switchzoo/data/corpus/) from a Debian machine's catalogues.

    python -m switchzoo.data.ship_corpus --lang de [--locale_dir /usr/share/locale]

Writes corpus/en-<lang>.tsv.xz (english<TAB>translation<TAB>catalogue, one pair per line, each
pair under the first catalogue, in sorted order, that has it) and corpus/en-<lang>.md, the
provenance: for each catalogue the Debian package that installed it, its version and the licence
its copyright file states. Needs dpkg; run it where the catalogues are, not at training time.
"""
from __future__ import annotations

import argparse
import lzma
import pathlib
import re
import subprocess

from switchzoo.data import embedded

CORPUS_DIR = pathlib.Path(__file__).parent / "corpus"
_LICENCE_WORDS = (("GNU Lesser General Public License", "LGPL"),
                  ("GNU Library General Public License", "LGPL"),
                  ("GNU General Public License", "GPL"), ("BSD", "BSD"), ("MIT", "MIT"))


def _dpkg(path: pathlib.Path) -> tuple[str, str]:
    """(package, version) of the Debian package that owns ``path``."""
    out = subprocess.run(["dpkg", "-S", str(path)], capture_output=True, text=True)
    package = out.stdout.split(":", 1)[0].strip() if out.returncode == 0 else "unknown"
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                             capture_output=True, text=True).stdout.strip()
    return package, version or "unknown"


def _licence(package: str) -> str:
    copyright_file = pathlib.Path("/usr/share/doc") / package / "copyright"
    if not copyright_file.is_file():
        return "unknown (no copyright file)"
    text = copyright_file.read_text(errors="replace")
    found = re.search(r"^License:\s*(.+)$", text, re.M)     # machine-readable DEP-5
    if found:
        return found.group(1).strip()
    for words, name in _LICENCE_WORDS:
        if words in text:
            return f"{name} (named in its copyright file)"
    return "see its copyright file"


def ship(lang: str, locale_dir: pathlib.Path, out_dir: pathlib.Path = CORPUS_DIR) -> int:
    catalogues = embedded.catalogues(lang, locale_dir)
    seen, lines, rows = set(), [], []
    for path in catalogues:
        domain = f"{path.parent.parent.name}/{path.stem}"
        kept = 0
        for english, translated in embedded.parse_mo(path):
            pair = embedded.clean(english), embedded.clean(translated)
            if all(pair) and pair not in seen:
                seen.add(pair)
                lines.append((*pair, domain))
                kept += 1
        if kept:
            package, version = _dpkg(path)
            rows.append(f"| {domain} | {package} {version} | {_licence(package)} | {kept} |")
    lines.sort()
    out_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{e}\t{t}\t{d}\n" for e, t, d in lines)
    (out_dir / f"en-{lang}.tsv.xz").write_bytes(lzma.compress(text.encode("utf-8"), preset=9))
    (out_dir / f"en-{lang}.md").write_text(
        f"# en-{lang}.tsv.xz: provenance\n\n"
        f"{len(lines):,} distinct English-{lang} pairs of interface strings and their human "
        "translations, harvested by `python -m switchzoo.data.ship_corpus` from the GNU gettext "
        f"catalogues under {locale_dir}/{lang}*/LC_MESSAGES of a Debian machine and cleaned by "
        "`switchzoo.data.embedded.clean` (no placeholders-only strings, at most "
        f"{embedded.MAX_CHARS} characters, mnemonics dropped). Each line is "
        "`english<TAB>translation<TAB>catalogue`.\n\n"
        "The translations belong to their projects' translators and stay under the licence of the "
        "package each catalogue came from (below, as that package's Debian copyright file states "
        "it): switchzoo's own licence does not cover this file. Drop the lines of any catalogue "
        "with `xzcat en-" + lang + ".tsv.xz | grep -v $'\\tCATALOGUE$' | xz > ...`.\n\n"
        "| catalogue | Debian package | licence | pairs |\n|---|---|---|---|\n"
        + "\n".join(rows) + "\n")
    return len(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lang", default="de")
    parser.add_argument("--locale_dir", type=pathlib.Path, default=embedded.LOCALE_DIR)
    args = parser.parse_args()
    print(f"{ship(args.lang, args.locale_dir):,} pairs -> {CORPUS_DIR}")


if __name__ == "__main__":
    main()
