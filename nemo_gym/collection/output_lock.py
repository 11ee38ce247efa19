"""An exclusive lock on a collection's output, so two collectors never write the same file.

The lock is ``flock`` on a sidecar ``<output>.lock`` (the results file itself is appended to and
rewritten, so it is not the lock). The kernel releases it when the holder exits, however it
exits (kill -9 included), so a stale lock never blocks a resume. The holder removes the sidecar
before it lets go, so a finished run leaves nothing to clean; a process that opened the old file
meanwhile sees, once it holds the lock, that the path no longer names that file, and opens the
path again (otherwise two processes could each lock a different file under the same name).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from nemo_gym.launch.config import ConfigError


class OutputLockedError(ConfigError):
    """Another collector holds the lock on this output."""


class OutputPathError(ConfigError):
    """The output path cannot be written (its parent is a file, a directory is not writable, ...)."""


def lock_path(output: Path) -> Path:
    """The sidecar lock file of ``output``."""
    return output.with_name(output.name + ".lock")


def check_output_path(output: Path, argument: str = "+output_jsonl_fpath") -> None:
    """Make ``output``'s directory (if missing) and check that a file can be created there.

    Raises :class:`OutputPathError`, one line naming the path and what is wrong with it.
    """
    if output.is_dir():
        raise OutputPathError(
            f"{argument}={output} is a directory; name a file, e.g. {output / 'rollouts.jsonl'}"
        )
    for ancestor in output.parents:
        if ancestor.exists() or ancestor.is_symlink():
            if not ancestor.is_dir():
                raise OutputPathError(
                    f"{argument}={output}: {ancestor} is a file, not a directory; choose another path"
                )
            break
    parent = output.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(
            f"{argument}={output}: cannot create the directory {parent} ({exc.strerror or exc})"
        ) from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{argument}={output}: the directory {parent} is not writable by this user")


@contextlib.contextmanager
def output_lock(output: Path) -> Iterator[Path]:
    """Hold the exclusive lock on ``output`` for the block; :class:`OutputLockedError` names the
    holder's pid when another process holds it, :class:`OutputPathError` a path that cannot be
    written. The lock file is removed when the block ends."""
    check_output_path(output)
    path = lock_path(output)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OutputPathError(
                f"+output_jsonl_fpath={output}: cannot create its lock file {path} ({exc.strerror or exc})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OutputLockedError(
                f"{output} is being written by another collector (pid {holder}, lock {path}); "
                "wait for it to finish, or choose another +output_jsonl_fpath"
            ) from None
        if _names_same_file(fd, path):
            break
        os.close(fd)  # the previous holder removed this file after we opened it: open the path again
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        # Removed while still locked: whoever opened it meanwhile re-checks the path and retries.
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)  # closing the descriptor releases the lock


def _names_same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)
