"""An exclusive lock on a collection's output, so two collectors never write the same file.

The lock is ``flock`` on a sidecar ``<output>.lock`` (the results file itself is appended to and
rewritten, so it is not the lock). The kernel releases it when the holder exits, however it
exits (kill -9 included), so a stale lock never blocks a resume. The sidecar is left in place:
removing it while another process has it open would let two processes lock two different files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from nemo_gym.config import ConfigError


class OutputLockedError(ConfigError):
    """Another collector holds the lock on this output."""


def lock_path(output: Path) -> Path:
    """The sidecar lock file of ``output``."""
    return output.with_name(output.name + ".lock")


@contextlib.contextmanager
def output_lock(output: Path) -> Iterator[Path]:
    """Hold the exclusive lock on ``output`` for the block; :class:`OutputLockedError` names the
    holder's pid when another process holds it."""
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise OutputLockedError(
                f"{output} is being written by another collector (pid {holder}, lock {path}); "
                "wait for it to finish, or choose another +output_jsonl_fpath"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock
