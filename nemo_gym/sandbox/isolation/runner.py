"""The parent side of a confined run: start ``child.py``, feed it the job, watch it, end it.

:func:`run_confined` starts one child (``python -I -B child.py``) in a new session, as the chosen
user, with the job on its stdin; reads at most ``max_output_bytes`` of its stdout (and stderr);
and kills its whole process group at the wall-clock deadline and after every run, whatever
happened. The child confines itself before anything
untrusted runs (see ``child.py``) and says so on a status pipe of its own, which is how a
failure of the sandbox is told from the command's exit status.

Disk: where the working tree is a sized file system (:mod:`kernel_limits`), the kernel holds the
quota and nothing is polled (``ProcessLimits.disk_bytes`` is None). Otherwise the tree is
walked every 20 ms in a worker thread (bytes and entries against the quota and the file count),
and once more when the command ends: a fallback that a burst of writes can overshoot between two
walks, but that never lets a command leave its tree over the quota unreported. Nothing here
blocks the event loop.

Used by the ``local`` sandbox provider (shell commands, processes allowed) and by code_gen
(Python code that may not start processes): one implementation of the confinement.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import shutil
import signal
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("nemo_gym.sandbox")

CHILD_SCRIPT = Path(__file__).with_name("child.py")
MARKER = "__NG_SANDBOX__"
EXIT_SANDBOX_FAILURE = 20
DISK_POLL_S = 0.02
_READ_CHUNK = 65536

# Paths confined code may read (besides its working tree and the interpreter's own prefixes):
# enough for the standard library, compiled extensions, the dynamic loader and the usual
# command-line tools, and nothing that holds the server's data, other processes' details, or
# secrets such as /etc/shadow.
DEFAULT_READ_ROOTS = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/sys/devices/system/cpu",
)
# What shell commands need on top: tool alternatives (awk, editor), locale data, and, for a
# sandbox with network, name resolution and CA certificates.
SHELL_READ_ROOTS = (
    "/etc/alternatives",
    "/etc/bash.bashrc",
    "/etc/profile",
    "/etc/inputrc",
    "/etc/mime.types",
    "/etc/protocols",
    "/etc/services",
)
NETWORK_READ_ROOTS = ("/etc/hosts", "/etc/resolv.conf", "/etc/host.conf", "/etc/gai.conf", "/etc/ssl")


@dataclass(frozen=True)
class Confinement:
    """What a confined process may do beyond computing in its working tree.

    ``network``: keep the host's network (no namespace, sockets allowed). ``allow_processes``:
    fork/exec and signals inside the sandbox (shell commands); without it only threads.
    ``allow_chmod``: mode changes (granted only to an unprivileged user, whose ownership already
    limits them to its own files). ``use_*`` switch a layer off for machines where it misbehaves;
    ``require`` names layers whose absence must fail the run (``netns``, ``landlock_abi``,
    ``seccomp``). ``private_tmp``: the run sees ``<workdir>/.tmp`` as ``/tmp`` (a mount namespace;
    the runner must be root).
    """

    network: bool = False
    allow_processes: bool = False
    allow_chmod: bool = False
    use_netns: bool = True
    use_landlock: bool = True
    use_seccomp: bool = True
    require: tuple[str, ...] = ()
    read_roots: tuple[str, ...] = ()
    private_tmp: bool = False


@dataclass(frozen=True)
class ProcessLimits:
    """Limits of one confined run. CPU seconds, address space, file size and open files are
    rlimits (per process); ``processes`` is ``RLIMIT_NPROC`` (per user: None when a pids cgroup
    counts the sandbox's processes instead); ``disk_bytes``/``disk_files`` are polled over the
    working tree (None when a sized file system enforces them); ``wall_time_s`` is the deadline
    of the whole group."""

    cpu_time_s: float = 6.0
    wall_time_s: float = 20.0
    memory_bytes: int = 1024 * 1024 * 1024
    file_size_bytes: int = 16 * 1024 * 1024
    open_files: int = 256
    processes: int | None = 64
    max_output_bytes: int = 16 * 1024 * 1024
    disk_bytes: int | None = 64 * 1024 * 1024
    stderr_tail_bytes: int | None = None
    disk_files: int | None = None

    def as_child_limits(self) -> dict[str, Any]:
        """The rlimits in the form the child applies them."""
        return {
            "cpu_time_s": self.cpu_time_s,
            "memory_bytes": self.memory_bytes,
            "file_size_bytes": self.file_size_bytes,
            "open_files": self.open_files,
            "processes": self.processes,
        }


@dataclass
class ConfinedOutcome:
    """How a confined run ended: exit status (negative: killed by that signal), output, flags."""

    returncode: int
    stdout: bytes = b""
    stderr: bytes = field(default=b"", repr=False)
    timed_out: bool = False
    output_overflow: bool = False
    disk_full: bool = False
    wall_s: float = 0.0
    sandbox_failure: str | None = None
    # At a wall-clock timeout: seconds the child's main thread spent runnable but waiting for a
    # CPU (the kernel's schedstat run_delay), and seconds since it started; None when unknown.
    waited_for_cpu_s: float | None = None
    deadline_s: float | None = None

    @property
    def starved(self) -> bool:
        """Whether a wall-clock timeout is the machine's doing: the child spent at least half its
        time to the deadline waiting for a CPU it was ready to use (a program that sleeps or
        blocks does not wait on a run queue, and one that computes meets its CPU limit first)."""
        if not self.timed_out or self.waited_for_cpu_s is None or not self.deadline_s:
            return False
        return self.waited_for_cpu_s >= self.deadline_s / 2

    @property
    def setup_failure(self) -> str | None:
        """Why the sandbox itself failed (it could not confine itself or start the command),
        else None. Told by the child's status pipe only, never by what the command printed."""
        return self.sandbox_failure


def read_roots(
    python: str, extra: Sequence[str] = (), *, shell: bool = False, network: bool = False
) -> list[str]:
    """The read roots of a confined run: system paths, the interpreter's prefixes, ``extra``."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    prefixes.add(str(Path(os.path.realpath(python)).parent.parent))
    roots = [
        *DEFAULT_READ_ROOTS,
        *(SHELL_READ_ROOTS if shell else ()),
        *(NETWORK_READ_ROOTS if network else ()),
    ]
    return list(dict.fromkeys([*roots, *sorted(prefixes), *extra]))


async def run_confined(
    run: dict[str, Any],
    *,
    workdir: str,
    confinement: Confinement,
    limits: ProcessLimits,
    python: str | None = None,
    run_as: tuple[int, int] | None = None,
    stdin_path: str | None = None,
    on_spawn: Callable[[int], None] | None = None,
    on_exit: Callable[[int], None] | None = None,
    cgroup: str | None = None,
) -> ConfinedOutcome:
    """Run ``run`` (see ``child.py`` for the kinds) confined to ``workdir``; never raises for
    anything the confined code does. ``on_spawn``/``on_exit`` get the process group id (to
    record it where a crashed owner's groups can be found and killed). ``cgroup``: a pids
    cgroup directory the child joins before it drops privileges (the caller empties it when
    none of its runs is left: several may share it)."""
    status_read, status_write = os.pipe()
    os.set_blocking(status_read, False)
    job = {
        "workdir": workdir,
        "read_roots": [*confinement.read_roots, workdir],
        "limits": limits.as_child_limits(),
        "network": confinement.network,
        "allow_processes": confinement.allow_processes,
        "allow_chmod": confinement.allow_chmod,
        "use_netns": confinement.use_netns,
        "use_landlock": confinement.use_landlock,
        "use_seccomp": confinement.use_seccomp,
        "require": list(confinement.require),
        "stdin_path": stdin_path,
        "parent_pid": os.getpid(),
        # The child switches user itself: uvloop's subprocess_exec has no user/group arguments.
        "run_as": list(run_as) if run_as is not None else None,
        "run": run,
        "status_fd": status_write,
        "cgroup": cgroup,
    }
    if confinement.private_tmp:
        private = os.path.join(workdir, ".tmp")
        job["private_tmp"], job["write_roots"] = private, [private]
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            python or sys.executable,
            "-I",
            "-B",
            str(CHILD_SCRIPT),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env={},
            start_new_session=True,
            limit=_READ_CHUNK,
            pass_fds=(status_write,),
        )
    except OSError as exc:
        os.close(status_read)
        return ConfinedOutcome(
            EXIT_SANDBOX_FAILURE, sandbox_failure=f"could not start the sandbox process: {exc}"
        )
    finally:
        os.close(status_write)
    if on_spawn is not None:
        on_spawn(proc.pid)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    overflow = asyncio.Event()
    out_task = asyncio.create_task(_read_capped(proc.stdout, limits.max_output_bytes, overflow))
    if limits.stderr_tail_bytes is not None:
        err_task = asyncio.create_task(_read_tail(proc.stderr, limits.stderr_tail_bytes))
    else:
        err_task = asyncio.create_task(_read_capped(proc.stderr, limits.max_output_bytes, asyncio.Event()))
    feed_task = asyncio.create_task(_feed(proc.stdin, json.dumps(job).encode()))
    overflow_task = asyncio.create_task(overflow.wait())
    disk_full = asyncio.Event()
    disk_task = asyncio.create_task(_watch_disk(workdir, limits.disk_bytes, limits.disk_files, disk_full))
    wait_task = asyncio.create_task(proc.wait())
    timed_out = False
    done: set[asyncio.Task[Any]] = set()
    waited: float | None = None
    at_deadline: float | None = None
    try:
        done, _ = await asyncio.wait(
            {wait_task, overflow_task, disk_task},
            timeout=limits.wall_time_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        timed_out = not done
        if timed_out:
            waited, at_deadline = _waited_for_cpu_s(proc.pid), time.monotonic() - started
    finally:
        # Kill the whole group: the child and anything it managed to start. On cancellation too.
        kill_group(proc.pid)
        for task in (overflow_task, disk_task, feed_task):
            task.cancel()
        # Some event loops finish wait() only once the pipes close; an escaped holder must not
        # keep us waiting (the status is known from the exit itself).
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(wait_task), 5.0)
        if not wait_task.done():
            wait_task.cancel()
        if on_exit is not None:
            on_exit(proc.pid)
    if wait_task in done and not disk_full.is_set() and not overflow.is_set():
        # The command ended between two walks (a starved server can miss every one): what it
        # left over the quota is still a disk-quota failure, never a success.
        if await asyncio.to_thread(_over_quota, workdir, limits.disk_bytes, limits.disk_files):
            disk_full.set()
    returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    failure = _sandbox_failure(status_read, returncode, timed_out, disk_full.is_set() or overflow.is_set())
    stdout, stderr = await _finish_readers(out_task, err_task)
    # A reader that stopped at the output cap left its pipe open; close it here, on this loop.
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
    return ConfinedOutcome(
        returncode,
        stdout,
        stderr,
        timed_out,
        overflow.is_set(),
        disk_full.is_set(),
        time.monotonic() - started,
        failure,
        waited,
        at_deadline,
    )


def _waited_for_cpu_s(pid: int) -> float | None:
    """Seconds process ``pid``'s main thread has been runnable but not running (``run_delay``
    of ``/proc/<pid>/schedstat``); None where the kernel does not say."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _sandbox_failure(
    status_read: int, returncode: int, timed_out: bool, stopped_by_limit: bool
) -> str | None:
    """The child's own account of a failure (from its status pipe, which untrusted code never
    holds), or why it never said it was ready; None once it said so, or when a limit of the run
    (disk, output) had it killed before it could say anything."""
    try:
        message = os.read(status_read, 4096).decode("utf-8", errors="replace")
    except BlockingIOError:
        message = ""  # a writer is still open: the child was killed before it said anything
    except OSError as exc:
        message = f"E(status pipe unreadable: {exc})"
    finally:
        os.close(status_read)
    if message.startswith("R"):
        return None
    if message.startswith("E"):
        return message[1:] or "the sandbox failed"
    if stopped_by_limit:
        return None
    if timed_out:
        return "the sandbox did not confine itself and start the command before the deadline"
    return f"the sandbox process ended before confining itself (exit status {returncode})"


def resolve_run_as(uid: int | str, paths: Sequence[str], work_root: str) -> tuple[int, int] | None:
    """The (uid, gid) confined code runs as, or None for this process's own.

    ``"auto"``: when this process is root, the ``nobody`` user if it can reach every path in
    ``paths`` (the interpreter, the scripts it runs) and ``work_root`` (every directory on the
    way traversable by others), else this process's user (with a warning); ``"keep"``: always
    this process's user; an int: that id (its primary group from the password database, else
    the same number).
    """
    if uid == "keep":
        return None
    if isinstance(uid, int) and not isinstance(uid, bool):
        try:
            return uid, pwd.getpwuid(uid).pw_gid
        except KeyError:
            return uid, uid
    if uid != "auto":
        raise ValueError(f"sandbox uid must be 'auto', 'keep' or an integer, got {uid!r}")
    if os.geteuid() != 0:
        return None  # already unprivileged
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        logger.warning("sandbox: running confined code as root: there is no 'nobody' user")
        return None
    blocked = [
        p for p in (*(os.path.realpath(p) for p in paths), str(CHILD_SCRIPT)) if not _reachable_by_others(p)
    ]
    if not _reachable_by_others(os.path.join(os.path.realpath(work_root), ".")):
        blocked.append(work_root)
    if blocked:
        logger.warning(
            "sandbox: running confined code as root: user 'nobody' cannot reach %s "
            "(make the path traversable by others, or set the sandbox uid)",
            blocked[0],
        )
        return None
    return nobody.pw_uid, nobody.pw_gid


def _reachable_by_others(path: str) -> bool:
    """Whether a user with no relation to the owner can read (and traverse to) ``path``."""
    target = Path(path)
    try:
        if not target.stat().st_mode & stat.S_IROTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in target.parents)
    except OSError:
        return False


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        stream.write(data)
        await stream.drain()
        stream.close()


async def _watch_disk(
    workdir: str, limit_bytes: int | None, limit_files: int | None, full: asyncio.Event
) -> None:
    """Return (setting ``full``) once the files under ``workdir`` use more than ``limit_bytes``
    or number more than ``limit_files``; each walk runs in a worker thread. With neither limit
    (a sized file system holds them) there is nothing to watch."""
    if limit_bytes is None and limit_files is None:
        await asyncio.Event().wait()  # until cancelled
    while True:
        await asyncio.sleep(DISK_POLL_S)
        if await asyncio.to_thread(_over_quota, workdir, limit_bytes, limit_files):
            full.set()
            return


def _over_quota(workdir: str, limit_bytes: int | None, limit_files: int | None) -> bool:
    """Whether the files under ``workdir`` use more than ``limit_bytes`` or number more than
    ``limit_files`` (a limit of None is not checked; with neither, nothing is walked)."""
    if limit_bytes is None and limit_files is None:
        return False
    used, files = tree_usage(workdir)
    return (limit_bytes is not None and used > limit_bytes) or (
        limit_files is not None and files > limit_files
    )


def disk_usage(root: str) -> int:
    """Bytes used by the files under ``root`` (sizes or allocated blocks, whichever is larger)."""
    return tree_usage(root)[0]


def tree_usage(root: str) -> tuple[int, int]:
    """``(bytes, entries)`` under ``root``: sizes or allocated blocks, whichever is larger, and
    how many files, directories and links there are (an empty file still costs an inode)."""
    total = 0
    count = 0
    stack = [root]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += max(info.st_size, info.st_blocks * 512)
                count += 1
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total, count


async def _read_capped(stream: asyncio.StreamReader, cap: int, overflow: asyncio.Event) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await stream.read(_READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > cap:
            overflow.set()
            keep = cap - (size - len(chunk))
            chunks.append(chunk[: max(keep, 0)])
            return b"".join(chunks)
        chunks.append(chunk)


async def _read_tail(stream: asyncio.StreamReader, keep: int) -> bytes:
    tail = b""
    while True:
        chunk = await stream.read(_READ_CHUNK)
        if not chunk:
            return tail
        tail = (tail + chunk)[-keep:]


async def _finish_readers(
    out_task: asyncio.Task[bytes], err_task: asyncio.Task[bytes]
) -> tuple[bytes, bytes]:
    # The pipes close when every holder is dead; a holder that escaped the group must not hang us.
    done, pending = await asyncio.wait({out_task, err_task}, timeout=2.0)
    for task in pending:
        task.cancel()
    stdout = out_task.result() if out_task in done else b""
    stderr = err_task.result() if err_task in done else b""
    return stdout, stderr


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; gone or not ours is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def marker_message(stderr: str) -> str:
    """The child's last ``__NG_SANDBOX__`` line (why the run or the setup failed), or ``""``."""
    for line in reversed(stderr.splitlines()):
        if line.startswith(MARKER):
            return line[len(MARKER) :].strip()
    return ""


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 99`` for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def remove_tree(path: str) -> None:
    """Delete a working tree, including read-only directories the code left behind."""

    def make_writable_and_retry(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), stat.S_IRWXU)
            os.chmod(target, stat.S_IRWXU)
            func(target)

    shutil.rmtree(path, onerror=make_writable_and_retry)
    if os.path.exists(path):
        logger.warning("could not fully remove sandbox directory %s", path)
