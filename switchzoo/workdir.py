"""What a shared cluster does to a workdir, as one-line errors: a second writer (train.py holds
an ``flock``ed lock file while it runs), a full disk and a read-only mount.

The lock is the kernel's: it goes with the process that holds it, however that process ends, so
a killed run leaves no stale lock (its file, if left, is taken over by the next run). The holder
writes who it is (host, pid, since when) into the file, for the refusal to name. A leaf module:
it imports nothing of switchzoo.

What the lock guarantees on a shared filesystem: flock excludes every other train.py whose
kernel sees the same lock, so on a local disk, and on NFS v4 (locks held by the server) and
Lustre mounted with ``-o flock`` across hosts, one run writes a workdir at a time. Lustre with
``localflock`` excludes only the processes of one host; where the filesystem refuses locks
altogether (NFS without its lock manager, Lustre without either option, many FUSE mounts:
ENOLCK, ENOSYS, EOPNOTSUPP) nothing is guaranteed, and train.py refuses to start unless told
``--nolock`` (then it is the user's to run one train.py per workdir)."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import pathlib
import socket
import time

LOCK_NAME = "train.lock"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP)


class Refused(ValueError):
    """A run that cannot start (or go on) here; a one-line message for the user."""


class Busy(Refused):
    """Another train.py holds the workdir; nothing was changed."""


class NoSpace(Refused):
    """A write failed for want of space."""


class Lock:
    """``lock.take()`` ... ``lock.release()``: the one writer of ``workdir``. ``take`` creates
    the workdir if needed and refuses (Busy) when another process holds it, or (Refused) when
    the workdir cannot be written; ``release`` removes the lock file (still holding it, so no
    one can take a file about to vanish) and the directories ``take`` created, where empty."""

    def __init__(self, workdir, enabled: bool = True):
        self.workdir = pathlib.Path(workdir).absolute()
        self.path = self.workdir / LOCK_NAME
        self.fd: int | None = None
        self.created: list[pathlib.Path] = []
        self.enabled = enabled          # False: --nolock, on a filesystem without locks

    def take(self) -> None:
        if not self.enabled:
            why = not_writable(self.workdir)
            if why:
                raise Refused(f"{why}: train.py cannot write --workdir={self.workdir}")
            return
        self._take()

    def _take(self) -> None:
        why = not_writable(self.workdir)
        if why:
            raise Refused(f"{why}: train.py writes checkpoints, metrics and config.json in "
                          f"--workdir={self.workdir} and cannot run there (nothing was changed); "
                          "give a writable --workdir, or evaluate the run where it is with "
                          "eval.py --output=DIR")
        missing = self.workdir
        while not missing.exists() and missing.parent != missing:
            self.created.append(missing)
            missing = missing.parent
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            while True:
                existed = self.path.exists()
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read(fd)
                    os.close(fd)
                    raise Busy(f"{self.workdir} is in use: train.py {holder} holds "
                               f"{self.path}; wait for that run to end (or stop it), or use "
                               "another --workdir (nothing was changed)") from None
                except OSError as e:
                    os.close(fd)
                    if e.errno not in NO_LOCKS:
                        raise
                    if not existed:               # the workdir as it was
                        self.path.unlink(missing_ok=True)
                    raise Refused(
                        f"{self.workdir}: its filesystem does not support file locks (flock: "
                        f"{e.strerror}), so train.py cannot make sure it is the workdir's only "
                        "writer (nothing was changed); use a workdir on a filesystem with "
                        "locks (a local disk, NFS v4, Lustre with -o flock), or add --nolock "
                        "and run one train.py per workdir yourself") from None
                try:                      # the file we locked may have been removed meanwhile
                    same = os.path.samestat(os.fstat(fd), os.stat(self.path))
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
            self.fd = fd
            record = {"host": socket.gethostname(), "pid": os.getpid(),
                      "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        except Refused:
            self.release()              # the directories it created, where empty
            raise
        except OSError as e:
            self.release()
            raise explain(e, self.path) or e from e

    def release(self) -> None:
        if self.fd is not None:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None
        for directory in self.created:       # innermost first; only the empty ones
            try:
                directory.rmdir()
            except OSError:
                break
        self.created = []


def _read(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode())
        return f"pid {record['pid']} on host {record['host']} since {record['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "(a process that has not yet written its name)"


def not_writable(path) -> str | None:
    """Why ``path`` (a directory, or where it would be created) cannot be written, or None.
    The kernel's answer (access(2)): a read-only mount says so for root too."""
    path = pathlib.Path(path).absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    if os.access(path, os.W_OK):
        return None
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return f"{path} is on a read-only file system"
    except OSError:
        pass
    return f"{path} is not writable (permission denied)"


def free_bytes(path) -> int | None:
    path = pathlib.Path(path).absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def size(n: float | None) -> str:
    if n is None:
        return "an unknown amount"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def is_no_space(e: BaseException) -> bool:
    """An OSError of a full disk or quota, or an error that carries one in its words (Orbax's
    TensorStore errors: 'RESOURCE_EXHAUSTED ... No space left on device [os_error_code=28]')."""
    if isinstance(e, OSError) and e.errno in NO_SPACE:
        return True
    text = str(e)
    return any(s in text for s in ("No space left on device", "Disk quota exceeded",
                                   f"os_error_code='{errno.ENOSPC}'"))


def no_space(path, needed: int | None = None, what: str = "") -> NoSpace:
    """The one-line error of a write to ``path`` that found the disk full."""
    need = f"it needs ~{size(needed)}, " if needed else ""
    return NoSpace(f"no space left on device writing {what or path}: {need}"
                   f"{size(free_bytes(path))} free there; free some and run the same command "
                   "again")


def explain(e: BaseException, path=None, needed: int | None = None) -> Refused | None:
    """The one-line error of a filesystem fault (a full disk, a read-only or unwritable
    directory), or None for any other error."""
    path = path or getattr(e, "filename", None)
    if is_no_space(e):
        return no_space(path or ".", needed)
    if isinstance(e, OSError) and e.errno in NOT_WRITABLE and path:
        why = not_writable(pathlib.Path(path).parent) or f"{path}: {e.strerror}"
        return Refused(f"cannot write {path}: {why}")
    return None
