"""The offline demo corpus: human translations of English interface strings (GNU gettext).

A compiled catalogue, <locale_dir>/<lang>/LC_MESSAGES/*.mo, pairs each English message (msgid) of
a program (coreutils, glib, iso_3166 country names, ...) with its translation (msgstr). The
package ships such a harvest, ~53k English-German pairs with their provenance and licences
(switchzoo/data/corpus/, rebuilt by ``python -m switchzoo.data.ship_corpus``), so the demo needs
no download and no system catalogues; the catalogues of the machine it runs on, where it has
some, only add pairs. The corpus is cached in the workdir so that a resumed run reads exactly the
corpus it started with, whatever the machine.
"""
from __future__ import annotations

import importlib.resources
import json
import lzma
import pathlib
import re
import struct
import zlib

import polib

from switchzoo.data import files, memo

LOCALE_DIR = pathlib.Path("/usr/share/locale")
MAX_CHARS = 200          # longer strings are help texts: many lines, option tables
_PLACEHOLDER = re.compile(r"%(\d+\$)?[-+ #0']*\d*(\.\d+)?(hh|h|ll|l|L|q|j|z|t|I)?[a-zA-Z%]"
                          r"|%<PRI\w+>|\{[^{}]*\}|\$\{?\w+\}?|<[^<>]*>")
_MNEMONIC = re.compile(r"(?<![\w_])[_&](?=\w)")


def parse_mo(path: pathlib.Path) -> list[tuple[str, str]]:
    """(msgid, msgstr) of one compiled catalogue (read by polib, which follows the header's
    charset); plural entries, untranslated ones and the header are left out, a msgctxt dropped.
    A file that is no catalogue gives none."""
    try:
        catalogue = polib.mofile(str(path))
    except (OSError, ValueError, UnicodeDecodeError, LookupError, struct.error):
        return []
    return [(e.msgid, e.msgstr) for e in catalogue
            if e.msgid and e.msgstr and not e.msgid_plural]


def clean(text: str) -> str | None:
    """One line of natural text, or None for what is no sentence to learn from."""
    text = " ".join(_MNEMONIC.sub("", text).split())
    if not text or len(text) > MAX_CHARS:
        return None
    if not re.search(r"[^\W\d_]{2}", _PLACEHOLDER.sub(" ", text)):   # placeholders, symbols only
        return None
    return text


def catalogues(lang: str, locale_dir: pathlib.Path = LOCALE_DIR) -> list[pathlib.Path]:
    """Every compiled catalogue of ``lang`` (and its regional variants) under ``locale_dir``."""
    locale_dir = pathlib.Path(locale_dir)
    return (sorted(locale_dir.glob(f"{lang}/LC_MESSAGES/*.mo"))
            + sorted(locale_dir.glob(f"{lang}_*/LC_MESSAGES/*.mo")))


def harvest(lang: str, locale_dir: pathlib.Path = LOCALE_DIR) -> list[tuple[str, str]]:
    """Sorted, distinct (english, translation) pairs from this machine's catalogues of ``lang``
    (none where it has none). Kept by the catalogues' paths, sizes and times
    (switchzoo.data.memo)."""
    paths = catalogues(lang, locale_dir)
    stats = [(str(p), *_stat(p)) for p in paths]
    key = memo.key_of([polib.__version__, MAX_CHARS, _PLACEHOLDER.pattern, _MNEMONIC.pattern, lang,
                       *(x for s in stats for x in s)])
    data = memo.bytes_of("catalogues", key, lambda: json.dumps(_harvest(paths)).encode())
    return [tuple(pair) for pair in json.loads(data)]


def _stat(path: pathlib.Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (-1, -1)
    return st.st_size, st.st_mtime_ns


def _harvest(paths: list[pathlib.Path]) -> list[tuple[str, str]]:
    pairs = set()
    for path in paths:
        for english, translated in parse_mo(path):
            english, translated = clean(english), clean(translated)
            if english and translated:
                pairs.add((english, translated))
    return sorted(pairs)


def shipped(lang: str) -> list[tuple[str, str]]:
    """The (english, translation) pairs the package ships for ``lang`` (none if it ships none)."""
    path = importlib.resources.files("switchzoo.data") / "corpus" / f"en-{lang}.tsv.xz"
    if not path.is_file():
        return []
    lines = lzma.decompress(path.read_bytes()).decode("utf-8").splitlines()
    return [tuple(line.split("\t")[:2]) for line in lines]


def shipped_langs() -> list[str]:
    folder = importlib.resources.files("switchzoo.data") / "corpus"
    return sorted(p.name[3:-len(".tsv.xz")] for p in folder.iterdir()
                  if p.name.startswith("en-") and p.name.endswith(".tsv.xz"))


def corpus(lang: str, locale_dir: pathlib.Path = LOCALE_DIR) -> tuple[list, str]:
    """(sorted distinct pairs, description): the shipped pairs and this machine's."""
    ours, host = shipped(lang), harvest(lang, locale_dir)
    pairs = sorted(set(ours) | set(host))
    if not pairs:
        raise FileNotFoundError(
            f"no English-'{lang}' pairs for the embedded corpus: the package ships "
            f"{', '.join('en-' + x for x in shipped_langs()) or 'none'} and {locale_dir} has no "
            f"'{lang}' gettext catalogues; use --config.data.pair=en-de, install translations "
            f"(apt-get install language-pack-{lang}), or train on local files with "
            "--config.data.source=files --config.data.train_files=train.tsv")
    added = len(pairs) - len(set(ours))
    return pairs, (f"embedded corpus en-{lang}: {len(ours):,} shipped pairs + {added:,} from "
                   f"the catalogues in {locale_dir}")


def _pair_langs(pair: str) -> tuple[str, str]:
    langs = pair.split("-")
    if len(langs) != 2 or "en" not in langs or langs[0] == langs[1]:
        raise ValueError(f"data.pair '{pair}': the embedded corpus pairs English with one other "
                         "language, write it source-target as en-XX or XX-en (e.g. en-de)")
    return langs[0], langs[1]


def load(pair: str, task: str, cache_dir: str | pathlib.Path | None, max_pairs: int = 0,
         locale_dir: pathlib.Path = LOCALE_DIR) -> tuple[list, list, str]:
    """(train, eval, description): (source, target) pairs, or for ``lm`` texts of the target
    side.

    ``max_pairs`` > 0 keeps that many training pairs, a hash-chosen (not alphabetical) subset.
    """
    source, target = _pair_langs(pair)
    lang = target if source == "en" else source
    cache = pathlib.Path(cache_dir) / f"embedded-en-{lang}.tsv" if cache_dir else None
    if cache is not None and cache.is_file():
        pairs = files.read_tsv(cache)
        description = f"embedded corpus en-{lang}: {len(pairs):,} pairs cached in {cache}"
    else:
        pairs, description = corpus(lang, locale_dir)
        if cache is not None:
            files.write_tsv(cache, pairs)
    # Split on the English string: its several translations all land on the same side.
    train, held_out = files.hold_out(pairs, key=lambda p: p[0])
    if max_pairs > 0:
        keep = set(sorted(range(len(train)), key=lambda i: zlib.crc32(
            "\t".join(train[i]).encode("utf-8")))[:max_pairs])
        train = [p for i, p in enumerate(train) if i in keep]
    if source != "en":
        train, held_out = [(t, e) for e, t in train], [(t, e) for e, t in held_out]
    if task != "translation":   # distinct target-side texts, none held out in training
        held_out = list(dict.fromkeys(t for _, t in held_out))
        seen = set(held_out)
        train = [t for t in dict.fromkeys(t for _, t in train) if t not in seen]
    return train, held_out, description
