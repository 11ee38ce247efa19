"""A full disk named as such: the file that could not be written and what to do, not a traceback.

Writes of the collector's files go through :func:`disk_writes`, which turns ``ENOSPC`` (no space
left) and ``EDQUOT`` (quota exceeded) into :class:`DiskFullError` naming the file; the console
commands print its message and exit 1. Everything written before stays, so a resume
(``+resume_from_cache=true``) finishes the run once there is space.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFullError(OSError):
    """No space (or quota) left on the disk of ``filename``; the message says what to do."""


def disk_full_error(exc: OSError, path: str | os.PathLike[str]) -> DiskFullError:
    """The :class:`DiskFullError` for an ``ENOSPC``/``EDQUOT`` raised while writing ``path``."""
    return DiskFullError(
        exc.errno,
        f"disk full: cannot write {os.fspath(path)} ({exc.strerror or 'no space left on device'}); "
        "free space on its disk, then run the same command with +resume_from_cache=true "
        "(every row already written is kept)",
        os.fspath(path),
    )


@contextlib.contextmanager
def disk_writes(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a disk-full error raised in the block into :class:`DiskFullError` naming ``path``."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise disk_full_error(exc, path) from None
        raise
