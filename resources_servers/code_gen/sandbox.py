"""Run untrusted Python in a confined child process, from asyncio, without blocking the loop.

:class:`CodeSandbox` starts one child per run (``sandbox_child.py``), in a fresh session with
an empty environment and a fresh temporary working directory (deleted afterwards), feeds it
stdin from a file, reads at most ``max_output_bytes`` of its stdout, and kills its whole
process group at the wall-clock deadline. The child confines itself before running the code
(rlimits, network namespace, Landlock, seccomp: see ``sandbox_child.py``). A semaphore bounds
how many children run at once across every caller of one sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("nemo_gym.code_gen")

CHILD_SCRIPT = Path(__file__).with_name("sandbox_child.py")
MARKER = "__NG_SANDBOX__"
_STDERR_TAIL_BYTES = 4096
DISK_POLL_S = 0.02
_READ_CHUNK = 65536

# Paths the code may read (besides its working directory and the interpreter's own prefixes):
# enough for the standard library, compiled extensions and the dynamic loader, and nothing
# that holds the server's data, other processes' details, or secrets such as /etc/shadow.
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


class RunStatus(enum.StrEnum):
    """How one run ended."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    OUTPUT_LIMIT = "output_limit"
    MISSING_FUNCTION = "missing_function"
    BAD_RETURN = "bad_return"
    SANDBOX_FAILURE = "sandbox_failure"
    SKIPPED = "skipped"


_EXIT_STATUS = {
    0: RunStatus.OK,
    10: RunStatus.COMPILE_ERROR,
    11: RunStatus.RUNTIME_ERROR,
    12: RunStatus.MISSING_FUNCTION,
    13: RunStatus.BAD_RETURN,
    20: RunStatus.SANDBOX_FAILURE,
}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. ``wall_time_s`` defaults to three times the CPU limit plus two seconds,
    because on a busy machine a child waits for a core as well as using one."""

    cpu_time_s: float = 6.0
    wall_time_s: float | None = None
    memory_mb: int = 1024
    file_size_mb: int = 16
    open_files: int = 256
    processes: int = 64
    max_output_bytes: int = 16 * 1024 * 1024
    disk_mb: int = 64  # all files of one run together (each file is also capped by file_size_mb)

    @property
    def wall_deadline_s(self) -> float:
        """The wall-clock deadline of one run."""
        return self.wall_time_s if self.wall_time_s is not None else 3 * self.cpu_time_s + 2.0

    def as_child_limits(self) -> dict[str, Any]:
        """The limits in the form the child applies them."""
        return {
            "cpu_time_s": self.cpu_time_s,
            "memory_bytes": self.memory_mb * 1024 * 1024,
            "file_size_bytes": self.file_size_mb * 1024 * 1024,
            "open_files": self.open_files,
            "processes": self.processes,
        }


@dataclass
class RunResult:
    """The outcome of one run: status, captured stdout (text), a one-line reason, timings."""

    status: RunStatus
    stdout: str = ""
    message: str = ""
    returncode: int | None = None
    wall_s: float = 0.0
    stderr_tail: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        """Whether the code ran to the end."""
        return self.status is RunStatus.OK


class CodeSandbox:
    """Runs code in confined child processes; at most ``max_concurrency`` at a time.

    ``use_netns``/``use_landlock``/``use_seccomp`` switch layers off (for machines where one
    misbehaves); ``require`` lists layers whose absence must fail every run instead of running
    with less confinement (names: ``netns``, ``landlock_abi``, ``seccomp``).

    ``uid``: the user id the code runs as. ``"auto"`` (default): when this process is root, the
    ``nobody`` user if it can reach the interpreter and the work root (every directory on the
    way traversable by others), else the current user (with a warning); ``"keep"``: always the current user; an int:
    that id (its primary group from the password database, else the same number).
    The files a run writes count against ``limits.disk_mb`` together: the run is killed (status
    ``output_limit``) within a few milliseconds of passing it.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        max_concurrency: int = 4,
        *,
        python: str | None = None,
        work_root: str | None = None,
        extra_read_roots: Sequence[str] = (),
        use_netns: bool = True,
        use_landlock: bool = True,
        use_seccomp: bool = True,
        require: Sequence[str] = (),
        uid: int | str = "auto",
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.limits = limits or SandboxLimits()
        self.max_concurrency = max_concurrency
        self.python = python or sys.executable
        self.work_root = work_root
        self.read_roots = _read_roots(self.python, extra_read_roots)
        self.switches = {"use_netns": use_netns, "use_landlock": use_landlock, "use_seccomp": use_seccomp}
        self.require = list(require)
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self.run_as = resolve_run_as(uid, self.python, work_root or tempfile.gettempdir())

    async def run(
        self,
        code: str,
        *,
        stdin: str = "",
        mode: str = "stdio",
        fn_name: str | None = None,
        args: list[Any] | None = None,
        skip: asyncio.Event | None = None,
    ) -> RunResult:
        """Run ``code`` once. ``mode``: ``stdio`` (stdin → stdout) or ``call`` (``fn_name(*args)``,
        its JSON-encoded return value as stdout). If ``skip`` is set by the time a slot frees
        up, nothing runs and the result is ``SKIPPED``."""
        if mode not in ("stdio", "call", "probe"):
            raise ValueError(f"mode must be 'stdio', 'call' or 'probe', got {mode!r}")
        async with self._semaphore:
            if skip is not None and skip.is_set():
                return RunResult(RunStatus.SKIPPED, message="not run: an earlier test failed")
            workdir = await asyncio.to_thread(self._prepare, code, stdin, mode, fn_name, args)
            try:
                return await self._run_child(workdir)
            finally:
                await asyncio.to_thread(_remove_tree, workdir)

    async def probe(self) -> dict[str, Any]:
        """Which confinement layers a child gets on this machine (runs one tiny child)."""
        result = await self.run("", mode="probe")
        if not result.ok:
            return {"error": result.message}
        parsed: dict[str, Any] = json.loads(result.stdout)
        return parsed

    # ---- machinery -------------------------------------------------------------------------
    def _prepare(self, code: str, stdin: str, mode: str, fn_name: str | None, args: list[Any] | None) -> str:
        workdir = tempfile.mkdtemp(prefix="ng_code_", dir=self.work_root)
        Path(workdir, "solution.py").write_text(code, encoding="utf-8")
        Path(workdir, ".stdin").write_text(stdin, encoding="utf-8")
        job = {
            "mode": mode,
            "workdir": workdir,
            "fn_name": fn_name,
            "args": args or [],
            "limits": self.limits.as_child_limits(),
            "read_roots": [*self.read_roots, workdir],
            "require": self.require,
            **self.switches,
        }
        Path(workdir, ".job.json").write_text(json.dumps(job), encoding="utf-8")
        if self.run_as is not None:
            uid, gid = self.run_as
            for name in ("", "solution.py", ".stdin", ".job.json"):
                os.chown(os.path.join(workdir, name), uid, gid)
        return workdir

    async def _run_child(self, workdir: str) -> RunResult:
        started = time.monotonic()
        stdin_fd = os.open(os.path.join(workdir, ".stdin"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python,
                "-I",
                "-B",
                str(CHILD_SCRIPT),
                os.path.join(workdir, ".job.json"),
                stdin=stdin_fd,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=workdir,
                env={},
                start_new_session=True,
                limit=_READ_CHUNK,
                **(
                    {"user": self.run_as[0], "group": self.run_as[1], "extra_groups": []}
                    if self.run_as is not None
                    else {}
                ),
            )
        finally:
            os.close(stdin_fd)
        assert proc.stdout is not None and proc.stderr is not None
        overflow = asyncio.Event()
        out_task = asyncio.create_task(_read_capped(proc.stdout, self.limits.max_output_bytes, overflow))
        err_task = asyncio.create_task(_read_tail(proc.stderr, _STDERR_TAIL_BYTES))
        overflow_task = asyncio.create_task(overflow.wait())
        disk_full = asyncio.Event()
        disk_task = asyncio.create_task(_watch_disk(workdir, self.limits.disk_mb * 1024 * 1024, disk_full))
        wait_task = asyncio.create_task(proc.wait())
        timed_out = False
        try:
            done, _ = await asyncio.wait(
                {wait_task, overflow_task, disk_task},
                timeout=self.limits.wall_deadline_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            timed_out = not done
        finally:
            # Kill the whole group: the child and anything it managed to start.
            _kill_group(proc.pid)
            overflow_task.cancel()
            disk_task.cancel()
            # Some event loops finish wait() only once the pipes close; an escaped holder must
            # not keep us waiting (the status is known from the exit itself).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(wait_task), 5.0)
            if not wait_task.done():
                wait_task.cancel()
            returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
            stdout, stderr = await _finish_readers(out_task, err_task)
        wall_s = time.monotonic() - started
        if disk_full.is_set():
            message = f"disk quota exceeded ({self.limits.disk_mb} MB written in total)"
            return RunResult(RunStatus.OUTPUT_LIMIT, "", message, returncode, wall_s, "")
        return self._classify(returncode, stdout, stderr, timed_out, overflow.is_set(), wall_s)

    def _classify(
        self, returncode: int, stdout: bytes, stderr: bytes, timed_out: bool, overflowed: bool, wall_s: float
    ) -> RunResult:
        out_text = stdout.decode("utf-8", errors="replace")
        err_text = stderr.decode("utf-8", errors="replace")
        reported = _marker_message(err_text)
        limits = self.limits

        def result(status: RunStatus, message: str) -> RunResult:
            return RunResult(status, out_text, message, returncode, wall_s, err_text)

        if overflowed:
            return result(RunStatus.OUTPUT_LIMIT, f"output exceeded {limits.max_output_bytes} bytes")
        if timed_out:
            return result(RunStatus.TIMEOUT, f"wall time limit exceeded ({limits.wall_deadline_s:g} s)")
        if returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and wall_s >= limits.cpu_time_s):
            return result(RunStatus.TIMEOUT, f"CPU time limit exceeded ({limits.cpu_time_s:g} s)")
        if returncode in _EXIT_STATUS:
            status = _EXIT_STATUS[returncode]
            return result(status, reported or ("" if status is RunStatus.OK else status.value))
        if returncode < 0:
            name = _signal_name(-returncode)
            hint = " (stack overflow or crash)" if -returncode == signal.SIGSEGV else ""
            return result(RunStatus.RUNTIME_ERROR, f"killed by {name}{hint}")
        return result(RunStatus.RUNTIME_ERROR, reported or f"exited with status {returncode}")


def resolve_run_as(uid: int | str, python: str, work_root: str) -> tuple[int, int] | None:
    """The (uid, gid) a child runs as, or None for this process's own (see :class:`CodeSandbox`)."""
    import pwd

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
        logger.warning("code_gen: running sandboxed code as root: there is no 'nobody' user")
        return None
    blocked = [p for p in (os.path.realpath(python), str(CHILD_SCRIPT)) if not _reachable_by_others(p)]
    if not _reachable_by_others(os.path.join(os.path.realpath(work_root), ".")):
        blocked.append(work_root)
    if blocked:
        logger.warning(
            "code_gen: running sandboxed code as root: user 'nobody' cannot reach %s "
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


async def _watch_disk(workdir: str, limit_bytes: int, full: asyncio.Event) -> None:
    """Return (setting ``full``) once the files under ``workdir`` use more than ``limit_bytes``."""
    while True:
        await asyncio.sleep(DISK_POLL_S)
        if _disk_usage(workdir) > limit_bytes:
            full.set()
            return


def _disk_usage(root: str) -> int:
    total = 0
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
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


def _read_roots(python: str, extra: Sequence[str]) -> list[str]:
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    prefixes.add(str(Path(os.path.realpath(python)).parent.parent))
    roots = [*DEFAULT_READ_ROOTS, *sorted(prefixes), *extra]
    return list(dict.fromkeys(roots))


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


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _marker_message(stderr: str) -> str:
    for line in reversed(stderr.splitlines()):
        if line.startswith(MARKER):
            return line[len(MARKER) :].strip()
    return ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), stat.S_IRWXU)
            os.chmod(target, stat.S_IRWXU)
            func(target)

    shutil.rmtree(path, onerror=make_writable_and_retry)
    if os.path.exists(path):
        logger.warning("could not fully remove sandbox directory %s", path)
