"""Run untrusted Python in a confined child process, from asyncio, without blocking the loop.

:class:`CodeSandbox` runs each program through :func:`nemo_gym.sandbox.isolation.runner.run_confined`
(the same confinement as the ``local`` sandbox provider: rlimits, network namespace, Landlock,
seccomp, an unprivileged user), with no new processes allowed, an empty environment and a
fresh temporary working directory (deleted afterwards). The child runs ``solution_runner.py``
once confined. A semaphore bounds how many children run at once across every caller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.isolation import kernel_limits
from nemo_gym.sandbox.isolation.runner import (
    DEFAULT_READ_ROOTS,
    Confinement,
    ProcessLimits,
    marker_message,
    read_roots,
    remove_tree,
    resolve_run_as,
    run_confined,
    signal_name,
)

logger = logging.getLogger("nemo_gym.code_gen")

HARNESS = Path(__file__).with_name("solution_runner.py")
_STDERR_TAIL_BYTES = 4096

__all__ = [
    "DEFAULT_READ_ROOTS",
    "INFRASTRUCTURE_STATUSES",
    "CodeSandbox",
    "RunResult",
    "RunStatus",
    "SandboxLimits",
]


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
    STARVED = "starved"
    SKIPPED = "skipped"


# Ends that say nothing about the code: the sandbox failed, or the machine kept the program
# waiting for a CPU until its wall-clock deadline passed. Never graded.
INFRASTRUCTURE_STATUSES = frozenset({RunStatus.SANDBOX_FAILURE, RunStatus.STARVED})


_EXIT_STATUS = {
    0: RunStatus.OK,
    10: RunStatus.COMPILE_ERROR,
    11: RunStatus.RUNTIME_ERROR,
    12: RunStatus.MISSING_FUNCTION,
    13: RunStatus.BAD_RETURN,
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
    files: int = 4096  # files and directories of one run together

    @property
    def wall_deadline_s(self) -> float:
        """The wall-clock deadline of one run."""
        return self.wall_time_s if self.wall_time_s is not None else 3 * self.cpu_time_s + 2.0

    def process_limits(self) -> ProcessLimits:
        """The limits in the form the confined runner applies them."""
        mib = 1024 * 1024
        return ProcessLimits(
            cpu_time_s=self.cpu_time_s,
            wall_time_s=self.wall_deadline_s,
            memory_bytes=self.memory_mb * mib,
            file_size_bytes=self.file_size_mb * mib,
            open_files=self.open_files,
            processes=self.processes,
            max_output_bytes=self.max_output_bytes,
            disk_bytes=self.disk_mb * mib,
            disk_files=self.files,
            stderr_tail_bytes=_STDERR_TAIL_BYTES,
        )


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
    The files a run writes count against ``limits.disk_mb`` and ``limits.files`` together: where
    the machine allows (``kernel_tmpfs`` and a root server), each run's directory is a tmpfs of
    that size, so a write past it fails inside the program; otherwise the directory is polled
    and the run is killed (status ``output_limit``) within a few milliseconds of passing it.
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
        kernel_tmpfs: bool = True,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.limits = limits or SandboxLimits()
        self.max_concurrency = max_concurrency
        self.python = python or sys.executable
        self.work_root = work_root
        self.confinement = Confinement(
            use_netns=use_netns,
            use_landlock=use_landlock,
            use_seccomp=use_seccomp,
            require=tuple(require),
            read_roots=tuple(read_roots(self.python, extra_read_roots)),
        )
        self._semaphore = asyncio.Semaphore(max_concurrency)
        # Each run's directory a sized tmpfs where the machine allows (a root server on Linux),
        # else its files are polled every 20 ms against the quota.
        self._tmpfs = kernel_tmpfs and kernel_limits.machine_support().tmpfs
        self.run_as = resolve_run_as(uid, [self.python, str(HARNESS)], work_root or tempfile.gettempdir())

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
            workdir = await asyncio.to_thread(self._prepare, code, stdin)
            try:
                return await self._run_child(workdir, mode, fn_name, args)
            finally:
                await asyncio.to_thread(self._remove, workdir)

    async def probe(self) -> dict[str, Any]:
        """Which confinement layers a child gets on this machine (runs one tiny child)."""
        result = await self.run("", mode="probe")
        if not result.ok:
            return {"error": result.message}
        parsed: dict[str, Any] = json.loads(result.stdout)
        return parsed

    # ---- machinery -------------------------------------------------------------------------
    def _prepare(self, code: str, stdin: str) -> str:
        workdir = tempfile.mkdtemp(prefix="ng_code_", dir=self.work_root)
        if self._tmpfs:
            # The quota is the kernel's: a tmpfs of disk_mb and `files` inodes for this run.
            try:
                kernel_limits.mount_tmpfs(workdir, self.limits.disk_mb << 20, self.limits.files, self.run_as)
            except OSError:
                remove_tree(workdir)
                raise
        Path(workdir, "solution.py").write_text(code, encoding="utf-8")
        Path(workdir, ".stdin").write_text(stdin, encoding="utf-8")
        if self.run_as is not None:
            uid, gid = self.run_as
            for name in ("", "solution.py", ".stdin"):
                os.chown(os.path.join(workdir, name), uid, gid)
        return workdir

    def _remove(self, workdir: str) -> None:
        if self._tmpfs:
            kernel_limits.unmount(workdir)
        remove_tree(workdir)

    async def _run_child(
        self, workdir: str, mode: str, fn_name: str | None, args: list[Any] | None
    ) -> RunResult:
        if mode == "probe":
            run: dict[str, Any] = {"kind": "probe"}
        else:
            run = {
                "kind": "python",
                "harness": str(HARNESS),
                "mode": mode,
                "fn_name": fn_name,
                "args": args or [],
            }
        limits = self.limits.process_limits()
        if self._tmpfs:
            limits = dataclasses.replace(limits, disk_bytes=None, disk_files=None)
        outcome = await run_confined(
            run,
            workdir=workdir,
            confinement=self.confinement,
            limits=limits,
            python=self.python,
            run_as=self.run_as,
            stdin_path=os.path.join(workdir, ".stdin"),
        )
        if outcome.sandbox_failure is not None:
            # The sandbox's own failure (told on its status pipe, which the code never holds).
            message = f"sandbox failure: {outcome.sandbox_failure}"
            return RunResult(RunStatus.SANDBOX_FAILURE, "", message, outcome.returncode, outcome.wall_s, "")
        if outcome.disk_full:
            message = f"disk quota exceeded ({self.limits.disk_mb} MB written in total)"
            return RunResult(RunStatus.OUTPUT_LIMIT, "", message, outcome.returncode, outcome.wall_s, "")
        if outcome.starved:
            message = (
                f"wall time limit exceeded ({self.limits.wall_deadline_s:g} s) while the program waited "
                f"{outcome.waited_for_cpu_s:.1f} s for a CPU: the machine was too busy"
            )
            return RunResult(RunStatus.STARVED, "", message, outcome.returncode, outcome.wall_s, "")
        return self._classify(
            outcome.returncode,
            outcome.stdout,
            outcome.stderr,
            outcome.timed_out,
            outcome.output_overflow,
            outcome.wall_s,
        )

    def _classify(
        self, returncode: int, stdout: bytes, stderr: bytes, timed_out: bool, overflowed: bool, wall_s: float
    ) -> RunResult:
        out_text = stdout.decode("utf-8", errors="replace")
        err_text = stderr.decode("utf-8", errors="replace")
        reported = marker_message(err_text)
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
            name = signal_name(-returncode)
            hint = " (stack overflow or crash)" if -returncode == signal.SIGSEGV else ""
            return result(RunStatus.RUNTIME_ERROR, f"killed by {name}{hint}")
        return result(RunStatus.RUNTIME_ERROR, reported or f"exited with status {returncode}")
