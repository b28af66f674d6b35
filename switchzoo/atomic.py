"""Atomic file writes: the bytes go to a temporary file in the same directory, which then
replaces the target in one rename, so a reader (or the next run after a crash) sees the old
file or the new one, never half of one."""
from __future__ import annotations

import contextlib
import os
import pathlib
import uuid

from switchzoo import workdir


@contextlib.contextmanager
def replacing(path, mode: str = "w"):
    """``with replacing(path, "wb") as f: ...`` writes ``path`` atomically; on an error the
    target is left as it was and the temporary file removed."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):     # a read-only mount refuses even this
            tmp.unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> pathlib.Path:
    return write_bytes(path, text.encode("utf-8"))


def write_bytes(path, data: bytes) -> pathlib.Path:
    """``data`` to ``path`` atomically; a full disk or a read-only directory is a one-line
    error (switchzoo.workdir.Refused) naming the path, with the old file left as it was."""
    try:
        with replacing(path, "wb") as f:
            f.write(data)
    except OSError as e:
        raise workdir.explain(e, path, len(data)) or e from e
    return pathlib.Path(path)


def append(path, text: str) -> None:
    """Appends ``text`` (a whole line) to ``path``: all of it or, when the disk is full,
    none (the file is cut back to where it was, so no half line is left behind)."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise workdir.explain(e, path, len(data)) or e from e
    finally:
        os.close(fd)
