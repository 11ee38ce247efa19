"""Limits the kernel enforces per sandbox: a sized file system for its tree, a pids cgroup.

A sandbox's disk and process limits must hold however fast its code acts, so they are not
polled: its working tree is a ``tmpfs`` mounted with ``size=`` and ``nr_inodes=`` (a write past
either fails with ``ENOSPC`` inside the sandbox, ``fallocate`` included), and its processes live
in a cgroup of their own whose ``pids.max`` refuses the next ``fork`` (counted per sandbox, not
per user, so one sandbox cannot use up another's processes).

Both need privileges: mounting needs ``CAP_SYS_ADMIN`` (a root server), the cgroup a writable
pids hierarchy (cgroup v1's ``pids`` controller, or a v2 cgroup whose ``cgroup.subtree_control``
holds ``pids``). :func:`probe` says which this machine offers and why not; callers fall back to
polling the tree and to ``RLIMIT_NPROC`` (per user) where they are missing, and say so.

Everything here is synchronous (a few system calls each): call it from a worker thread, never
from an event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field

CGROUP_DIR_NAME = "nemo_gym_sandboxes"
FALLBACKS = {
    "tmpfs": "each tree's size and file count are polled every 20 ms instead (a burst of writes can overshoot)",
    "pids_cgroup": "processes are counted by RLIMIT_NPROC per user instead (sandboxes sharing a user share it)",
}
MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 0x2, 0x4


@dataclass(frozen=True)
class KernelSupport:
    """What this process can ask of the kernel: ``tmpfs`` (sized mounts), ``pids_root`` (a
    directory to create per-sandbox pids cgroups in, or None); ``why_not``: the reason for
    each missing one."""

    tmpfs: bool
    pids_root: str | None
    why_not: dict[str, str] = field(default_factory=dict)


def probe(cgroup_root: str | None = None) -> KernelSupport:
    """Find out (cheaply, creating at most one directory) what this machine allows."""
    why: dict[str, str] = {}
    tmpfs = sys.platform.startswith("linux") and os.geteuid() == 0
    if not tmpfs:
        why["tmpfs"] = "mounting a sized tmpfs per sandbox needs a root server on Linux"
    pids_root: str | None = None
    if sys.platform.startswith("linux"):
        candidate = cgroup_root or _pids_parent()
        if candidate is None:
            why["pids_cgroup"] = (
                "no pids cgroup hierarchy is mounted (cgroup v1 'pids', or v2 with 'pids' delegated)"
            )
        else:
            target = os.path.join(candidate, CGROUP_DIR_NAME) if cgroup_root is None else candidate
            try:
                os.makedirs(target, exist_ok=True)
                if not os.access(target, os.W_OK):
                    raise PermissionError(errno.EACCES, "not writable")
                _enable_v2_pids(target)
                pids_root = target
            except OSError as exc:
                why["pids_cgroup"] = f"cannot create pids cgroups under {candidate}: {exc.strerror or exc}"
    else:
        why["pids_cgroup"] = "cgroups are Linux only"
    return KernelSupport(tmpfs, pids_root, why)


@functools.cache
def machine_support() -> KernelSupport:
    """:func:`probe` once per process (providers are often built once per sandbox); what is
    missing is logged once, with the fallback used instead."""
    support = probe()
    for name, why in support.why_not.items():
        fallback = FALLBACKS.get(name, "")
        logging.getLogger("nemo_gym.sandbox").warning("sandbox %s unavailable (%s): %s", name, why, fallback)
    return support


def _pids_parent() -> str | None:
    """This process's own pids cgroup directory (v1), or its v2 cgroup when ``pids`` is
    delegated there; None when neither is available."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [line.split() for line in f]
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            own = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    v1_mount = v2_mount = None
    for parts in mounts:
        dash = parts.index("-")
        fstype, options = parts[dash + 1], parts[dash + 3] if len(parts) > dash + 3 else ""
        if fstype == "cgroup" and "pids" in options.split(","):
            v1_mount = parts[4]
        elif fstype == "cgroup2" and v2_mount is None:
            v2_mount = parts[4]
    for entry in own:
        if len(entry) != 3:
            continue
        _, controllers, path = entry
        if v1_mount and "pids" in controllers.split(","):
            return os.path.join(v1_mount, path.lstrip("/"))
    if v2_mount:
        # This process's own cgroup when pids is delegated there, else (root) the hierarchy's
        # root, where systemd and container runtimes usually enable it.
        own_v2 = [os.path.join(v2_mount, e[2].lstrip("/")) for e in own if len(e) == 3 and e[0] == "0"]
        for here in (*own_v2, v2_mount):
            with contextlib.suppress(OSError):
                with open(os.path.join(here, "cgroup.subtree_control"), encoding="utf-8") as f:
                    if "pids" in f.read().split():
                        return here
    return None


def _enable_v2_pids(directory: str) -> None:
    """On cgroup v2, let the children of ``directory`` have a pids controller (no-op on v1)."""
    control = os.path.join(directory, "cgroup.subtree_control")
    if os.path.exists(control):
        with open(control, "w", encoding="utf-8") as f:
            f.write("+pids")


# --- the sized file system -------------------------------------------------------------------
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def mount_tmpfs(path: str, size_bytes: int, inodes: int, owner: tuple[int, int] | None) -> None:
    """Mount a tmpfs of ``size_bytes`` and ``inodes`` at ``path`` (mode 0700, owned by
    ``owner``); ``OSError`` naming the path when the kernel refuses."""
    uid, gid = owner if owner is not None else (os.geteuid(), os.getegid())
    options = f"size={max(size_bytes, 4096)},nr_inodes={max(inodes, 2)},mode=0700,uid={uid},gid={gid}"
    if _libc().mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting the sandbox's tmpfs at {path} failed: {os.strerror(err)}")


def unmount(path: str) -> None:
    """Detach the file system mounted at ``path`` (nothing mounted there is fine)."""
    if not os.path.ismount(path):
        return
    if _libc().umount2(path.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, f"unmounting the sandbox's tmpfs at {path} failed: {os.strerror(err)}")


def usage(path: str) -> tuple[int, int]:
    """``(bytes, inodes)`` in use on the file system mounted at ``path``."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree


# --- the pids cgroup -------------------------------------------------------------------------
def create_pids_cgroup(root: str, name: str, max_pids: int) -> str:
    """A new cgroup ``root/name`` allowing at most ``max_pids`` processes; its directory."""
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "pids.max"), "w", encoding="utf-8") as f:
        f.write(str(max(1, max_pids)))
    return path


def cgroup_pids(path: str) -> list[int]:
    """The processes in cgroup ``path`` (empty when it is gone)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), encoding="utf-8") as f:
            return [int(line) for line in f if line.strip()]
    except OSError:
        return []


def kill_cgroup(path: str, wait_s: float = 2.0) -> bool:
    """SIGKILL every process in cgroup ``path`` until it is empty (``wait_s`` at most); whether
    it emptied. Kills what escaped its process group too."""
    deadline = time.monotonic() + wait_s
    kill_file = os.path.join(path, "cgroup.kill")  # cgroup v2: one write kills them all
    while True:
        pids = cgroup_pids(path)
        if not pids:
            return True
        if os.path.exists(kill_file):
            with contextlib.suppress(OSError), open(kill_file, "w", encoding="utf-8") as f:
                f.write("1")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def remove_cgroup(path: str) -> None:
    """Kill what is left in cgroup ``path`` and remove it (gone already is fine)."""
    if not os.path.isdir(path):
        return
    kill_cgroup(path)
    for _ in range(200):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            time.sleep(0.01)  # the last killed processes are still being freed
    os.rmdir(path)
