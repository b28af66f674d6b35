"""Atomic file writes: the bytes go to a temporary file in the same directory, which then
replaces the target in one rename, so a reader (or the next run after a crash) sees the old
file or the new one, never half of one."""
from __future__ import annotations

import contextlib
import os
import pathlib
import uuid


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
        tmp.unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> pathlib.Path:
    with replacing(path, "w") as f:
        f.write(text)
    return pathlib.Path(path)


def write_bytes(path, data: bytes) -> pathlib.Path:
    with replacing(path, "wb") as f:
        f.write(data)
    return pathlib.Path(path)
