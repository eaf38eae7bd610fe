"""One `vips up` per store: an exclusive flock on $VIPS_HOME/up.lock, holding the pid and URL of its holder.

The lock is the kernel's (fcntl.flock), not the file's existence: it is released when the descriptor is
closed, which the kernel does when the process exits however it dies (even SIGKILL), so a lock file left
behind by a dead `vips up` is stale by construction and the next one takes it over; no pid is probed.
The descriptor is not inherited by child processes (the worker, the migration), so they never hold it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from vips.errors import RuntimeFailure

#: The lock file, in VIPS_HOME.
LOCK_NAME = "up.lock"


class StoreLock:
    """The held lock of one store; `release()` (or this process's exit) frees it."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    def release(self) -> None:
        """Unlock and close the lock file (the file stays: its content means nothing without the lock)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def lock_store(home: Path, url: str) -> StoreLock:
    """Take the store's lock for this process serving `url`, or raise RuntimeFailure naming the pid and
    URL of the `vips up` that holds it."""
    path = home / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RuntimeFailure(
            f"the store {home} is already served by another `vips up` ({holder}); stop it first, or point "
            "VIPS_HOME at another store"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\nurl {url}\n".encode(), 0)
    return StoreLock(fd, path)


def _holder(fd: int) -> str:
    """ "pid P serving URL" from the holder's lock file (or what is known of it while it starts)."""
    fields = dict(
        line.partition(" ")[::2] for line in os.pread(fd, 4096, 0).decode(errors="replace").splitlines()
    )
    pid, url = fields.get("pid"), fields.get("url")
    if pid is None or url is None:
        return "it is starting"
    return f"pid {pid}, serving on {url}"
