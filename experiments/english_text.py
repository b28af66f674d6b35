"""Real English text this machine carries, one document per line, for span-corruption runs.

    python experiments/english_text.py --out docs.txt [--info-dir /usr/share/info]

Two sources, both human-written English:
  * the English side of the shipped embedded corpus (switchzoo/data/corpus: the messages of
    Debian's GNU gettext catalogues, short: a median of ~5 words);
  * the GNU Texinfo manuals installed in --info-dir (coreutils, grep, sed, gettext, gnupg, ...:
    GFDL prose, ~4.6 MB on this machine), cut into paragraphs by switchzoo.data.manuals (what
    span corruption on the embedded corpus reads too).
Documents are deduplicated and written in a fixed pseudo-random order (by a hash of the text),
so that the 2% the trainer holds out of --config.data.train_files mixes both sources.
"""
from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from switchzoo.data import embedded, manuals  # noqa: E402


def messages() -> list[str]:
    return [english for english, _ in embedded.shipped("de")]


def documents(info_dir: pathlib.Path) -> tuple[list[str], dict]:
    msgs, paras = messages(), manuals.paragraphs(info_dir)
    docs = sorted(dict.fromkeys(d for d in msgs + paras if d.strip()),
                  key=lambda d: hashlib.sha1(d.encode()).hexdigest())
    stats = {"messages": len(set(msgs)), "info_paragraphs": len(set(paras)),
             "documents": len(docs), "characters": sum(map(len, docs)),
             "info_files": sorted(p.name for p in info_dir.glob("*.info*.gz"))}
    return docs, stats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--info-dir", default="/usr/share/info", type=pathlib.Path)
    args = p.parse_args(argv)
    docs, stats = documents(args.info_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(d.replace("\n", " ") + "\n" for d in docs), encoding="utf-8")
    print(stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
