"""Open files inside a sandbox's working tree from the (privileged) host side, safely.

The tree is writable by the code inside it, which may have planted symlinks (``out.txt ->
/etc/shadow``, ``dir -> /etc/cron.d``) to make the host read or write elsewhere. Every path
component is therefore opened relative to its parent directory's descriptor with
``O_NOFOLLOW``: a symlink anywhere on the way is refused, and swapping a directory for a
symlink while we walk cannot redirect us either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat


class TreeEscapeError(PermissionError):
    """A path leaves the tree, or runs through a symlink inside it."""


def split_inside(path: str) -> list[str]:
    """The components of a path relative to the tree; ``..`` that climbs out is refused."""
    normalized = posixpath.normpath("/" + path).lstrip("/")
    if path and posixpath.normpath(path).startswith(".."):
        raise TreeEscapeError(errno.EACCES, f"path {path!r} leaves the sandbox's working tree")
    return [part for part in normalized.split("/") if part and part != "."]


def open_in_tree(
    root: str,
    parts: list[str],
    flags: int,
    *,
    mode: int = 0o644,
    make_parents: bool = False,
    owner: tuple[int, int] | None = None,
) -> int:
    """A descriptor for ``root/parts...`` opened with ``flags``, never following a symlink.

    ``make_parents`` creates missing directories on the way (owned by ``owner`` when given).
    """
    if not parts:
        raise TreeEscapeError(errno.EISDIR, "a file path inside the tree is needed")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except FileNotFoundError:
                if not make_parents:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, owner[0], owner[1], dir_fd=fd, follow_symlinks=False)
                next_fd = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise TreeEscapeError(
                        errno.EACCES, f"{part!r} in the sandbox path is a symlink or not a directory"
                    ) from None
                raise
            os.close(fd)
            fd = next_fd
        try:
            file_fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise TreeEscapeError(errno.EACCES, f"{parts[-1]!r} in the sandbox is a symlink") from None
            raise
        if owner is not None and flags & os.O_CREAT:
            os.fchown(file_fd, owner[0], owner[1])
        return file_fd
    finally:
        os.close(fd)


def copy_into_tree(root: str, parts: list[str], source: str, owner: tuple[int, int] | None = None) -> None:
    """Copy host file ``source`` to ``root/parts...`` (parents created, no symlink followed)."""
    out = open_in_tree(root, parts, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, make_parents=True, owner=owner)
    with os.fdopen(out, "wb") as dst, open(source, "rb") as src:
        while chunk := src.read(1 << 20):
            dst.write(chunk)


def copy_out_of_tree(root: str, parts: list[str], target: str) -> None:
    """Copy ``root/parts...`` (a regular file, reached without symlinks) to host file ``target``."""
    src_fd = open_in_tree(root, parts, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(src_fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise TreeEscapeError(errno.EACCES, f"{'/'.join(parts)!r} in the sandbox is not a regular file")
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        with open(target, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
