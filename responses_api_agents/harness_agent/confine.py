"""Running one untrusted harness program so that nothing of it outlives its rollout.

- **Its own PID namespace** with its own ``/proc`` (``unshare --pid --fork --kill-child
  --mount-proc``; as root, else inside a user namespace where the kernel allows one): the
  program is PID 1's child there, sees only its own processes in ``/proc`` (it cannot read
  another process's ``environ`` or ``cmdline``), and when the supervisor is killed the kernel
  kills every process in the namespace, ``setsid`` or not. Where neither is allowed, the program
  runs in its own session and process group, every descendant still in its process tree is
  killed too, and a warning says that processes which left both may survive and ``/proc`` is
  not hidden.
- **No inherited descriptors** but its stdin (``/dev/null``) and the stdout/stderr pipes
  (``close_fds``), whatever event loop the agent runs on.
- **The deadline holds**: the wall clock is checked while waiting for the exit, and the pipe
  reads end at the deadline even if something still holds a copy of the pipes.
- Resource limits (CPU time, address space, file size, open files) set before exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("nemo_gym")

# How long the pipes may stay open after the program ended (a descendant that kept a copy).
PIPE_GRACE_S = 1.0
_NAMESPACE_FLAGS = ["--pid", "--fork", "--kill-child", "--mount-proc"]


@functools.cache
def confinement() -> tuple[list[str], str]:
    """The argv prefix that puts a program in its own PID namespace and ``/proc``, and a
    description; an empty prefix (and why) where the system allows neither variant."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return [], "no unshare command (util-linux)"
    reasons = []
    for extra, what in (([], "PID namespace"), (["--user", "--map-root-user"], "user+PID namespace")):
        prefix = [unshare, *extra, *_NAMESPACE_FLAGS, "--"]
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"{what}: {exc}")
            continue
        if probe.returncode == 0:
            return prefix, what
        reasons.append(f"{what}: {probe.stderr.decode(errors='replace').strip()[:200]}")
    return [], "; ".join(reasons)


def _warn_unconfined(reason: str) -> None:
    logger.warning(
        "harness_agent: cannot give harness programs their own PID namespace (%s); they run in "
        "their own process group instead: a descendant that leaves both the group and the "
        "program's process tree may outlive its rollout, and /proc of other processes is visible",
        reason,
    )


_warned: list[bool] = []


def _preexec(limits: dict[str, int]) -> Callable[[], None]:
    def apply() -> None:
        # In the child before exec: the program cannot raise these again.
        for kind, value in (
            (resource.RLIMIT_CPU, limits["cpu_s"]),
            (resource.RLIMIT_AS, limits["memory_bytes"]),
            (resource.RLIMIT_FSIZE, limits["file_size_bytes"]),
            (resource.RLIMIT_NOFILE, limits["open_files"]),
        ):
            resource.setrlimit(kind, (value, value))

    return apply


class _Tail:
    """The last ``cap`` bytes of a stream, read to its end (the child never blocks on a full pipe)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.overflow = False

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.kept.extend(chunk)
            if len(self.kept) > self.cap:
                self.overflow = True
                del self.kept[: len(self.kept) - self.cap]


async def _exited(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait until the process exits (True) or the deadline passes (False)."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = -1
    if pidfd >= 0:
        done = loop.create_future()
        loop.add_reader(pidfd, lambda: done.done() or done.set_result(None))
        try:
            remaining = deadline - time.monotonic()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(done), remaining)
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return proc.poll() is not None
    while proc.poll() is None:  # no pidfd: poll
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _kill_everything(proc: subprocess.Popen[bytes], confined: bool) -> None:
    """SIGKILL the program's process group and every descendant still in its tree; with a PID
    namespace, killing the supervisor ends the whole namespace."""
    descendants: list[Any] = []
    if not confined:
        with contextlib.suppress(Exception):
            import psutil

            descendants = psutil.Process(proc.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        proc.kill()
    for child in descendants:
        with contextlib.suppress(Exception):
            child.kill()


async def run_confined(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    wall_time_s: float,
    cpu_time_s: int,
    memory_bytes: int,
    file_size_bytes: int,
    open_files: int,
    max_output_bytes: int,
    stderr_bytes: int,
) -> dict[str, Any]:
    """Run ``argv`` confined (see the module doc) until it exits or ``wall_time_s`` passes.

    Returns ``status`` (``ok``/``failed``/``timeout``/``output_limit``), ``returncode``,
    ``wall_s``, ``stdout`` / ``stderr`` (the last bytes) and ``confined`` (how). Raises
    ``OSError`` when the program cannot be started.
    """
    prefix, how = confinement()
    if not prefix and not _warned:
        _warned.append(True)
        _warn_unconfined(how)
    limits = {
        "cpu_s": cpu_time_s,
        "memory_bytes": memory_bytes,
        "file_size_bytes": file_size_bytes,
        "open_files": open_files,
    }
    started = time.monotonic()
    deadline = started + wall_time_s
    proc = subprocess.Popen(
        [*prefix, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        close_fds=True,  # nothing of the agent's (sockets, log copies) reaches the program
        start_new_session=True,
        preexec_fn=_preexec(limits),
    )
    loop = asyncio.get_running_loop()
    transports: list[asyncio.BaseTransport] = []
    tasks: list[asyncio.Task[None]] = []
    out, err = _Tail(max_output_bytes), _Tail(stderr_bytes)
    status = "ok"
    pending: set[asyncio.Task[None]] = set()
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for pipe, tail in ((proc.stdout, out), (proc.stderr, err)):
            reader = asyncio.StreamReader(limit=1 << 20)
            transport, _ = await loop.connect_read_pipe(
                lambda r=reader: asyncio.StreamReaderProtocol(r), pipe
            )
            transports.append(transport)
            tasks.append(asyncio.create_task(tail.read(reader)))
        if not await _exited(proc, deadline):
            status = "timeout"
    finally:
        # Also when the rollout is cancelled (its own deadline): nothing of the program survives.
        _kill_everything(proc, bool(prefix))
        try:
            await _exited(proc, time.monotonic() + 5.0)
            # The pipes end at the deadline (plus a short grace to drain what the program wrote).
            grace = max(deadline - time.monotonic(), 0.0) + PIPE_GRACE_S
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=grace)
        finally:
            for task in tasks:
                task.cancel()
            for transport in transports:
                transport.close()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    if pending and status == "ok":
        status = "timeout"  # something the program left behind held its output open past the deadline
    if status == "ok" and out.overflow:
        status = "output_limit"
    elif status == "ok" and proc.returncode != 0:
        status = "failed"
    return {
        "status": status,
        "returncode": proc.returncode,
        "wall_s": round(time.monotonic() - started, 3),
        "stdout": bytes(out.kept),
        "stderr": bytes(err.kept),
        "confined": how if prefix else f"process group only ({how})",
    }
