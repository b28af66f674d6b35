"""An integrity record per checkpoint: the size and sha256 of every file of a committed step,
written when the save is known to have finished (hashed in a thread while training goes on:
switchzoo.checkpoints), and checked before the step is restored.

Orbax notices a file cut short only sometimes (a bare Exception from deep in TensorStore) and
bytes overwritten inside an array's data never: such a checkpoint restores, and the run trains
on corrupt weights. The record turns both into one line naming the file.

    CHECKPOINTS-integrity/<step>.json     {"files": {relative path: [bytes, sha256]}}

beside Orbax's own directory (CHECKPOINTS), so Orbax neither lists nor removes it; records of
steps Orbax no longer keeps are pruned as new ones are written. A step saved before records
existed (or whose record a crash prevented: the save committed, the record not yet) has none
and restores unchecked. Every process checks the whole step it restores (the files are read
once more); process 0 writes the records.
"""
from __future__ import annotations

import hashlib
import json
import pathlib

from switchzoo import atomic


class DamagedCheckpoint(ValueError):
    """A step whose files are not the ones its record describes."""


def record_dir(directory: pathlib.Path) -> pathlib.Path:
    return directory.with_name(directory.name + "-integrity")


def _digest(path: pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(step_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    return {str(p.relative_to(step_dir)): p for p in sorted(step_dir.rglob("*")) if p.is_file()}


def forget(directory: pathlib.Path, step: int) -> None:
    """Removes the record of ``step`` (a step about to be saved again: a stale record of the
    step set aside before must never describe the new one)."""
    (record_dir(directory) / f"{step}.json").unlink(missing_ok=True)


def write(directory: pathlib.Path, step: int) -> None:
    """Records committed step ``step`` of Orbax directory ``directory``; prunes the records of
    steps no longer there."""
    step_dir = directory / str(step)
    if not step_dir.is_dir():
        return
    try:
        files = {name: [p.stat().st_size, _digest(p)] for name, p in _files(step_dir).items()}
    except FileNotFoundError:       # the step was removed meanwhile: nothing to record
        return
    out = record_dir(directory)
    out.mkdir(exist_ok=True)
    atomic.write_text(out / f"{step}.json", json.dumps({"step": step, "files": files}) + "\n")
    for old in out.glob("*.json"):
        if old.stem.isdigit() and not (directory / old.stem).is_dir():
            old.unlink(missing_ok=True)


def verify(directory: pathlib.Path, step: int) -> bool:
    """Checks step ``step`` against its record (False: it has none); DamagedCheckpoint naming
    the first file that differs, is missing, or is not in the record."""
    path = record_dir(directory) / f"{step}.json"
    if not path.is_file():
        return False
    try:
        recorded = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        raise DamagedCheckpoint(f"its integrity record {path} is damaged") from None
    present = _files(directory / str(step))
    for name, (size, digest) in recorded.items():
        p = present.get(name)
        if p is None:
            raise DamagedCheckpoint(f"{step}/{name} is missing")
        if p.stat().st_size != size:
            raise DamagedCheckpoint(f"{step}/{name} has {p.stat().st_size:,} bytes where "
                                    f"{size:,} were saved")
        if _digest(p) != digest:
            raise DamagedCheckpoint(f"{step}/{name}: its bytes differ from those saved "
                                    "(sha256)")
    extra = sorted(set(present) - set(recorded))
    if extra:
        raise DamagedCheckpoint(f"{step}/{extra[0]} was not part of the saved step")
    return True
