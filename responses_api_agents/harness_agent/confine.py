"""Running one untrusted harness program so that nothing of it outlives its rollout.

- **Its own PID namespace** with its own ``/proc`` (``unshare --pid --fork --kill-child
  --mount-proc``; as root, else inside a user namespace where the kernel allows one): the
  program is PID 1's child there, sees only its own processes in ``/proc`` (it cannot read
  another process's ``environ`` or ``cmdline``), and when the supervisor is killed the kernel
  kills every process in the namespace, ``setsid`` or not. Where neither is allowed, the program
  runs in its own session and process group, every descendant still in its process tree is
  killed too, and a warning says that processes which left both may survive and ``/proc`` is
  not hidden.
- **None of the stack's files in sight**: inside that namespace's private mounts, each directory in
  ``hide`` (the stack's Unix socket directories) is covered by an empty read-only tmpfs, and
  ``private_root`` (the directory holding every rollout's working directory) by an empty tmpfs
  with only this program's own working directory bound back: it cannot replace a server's socket
  file with a listener of its own, nor read another rollout's files. Mounts need the namespace;
  without one (see above) nothing is hidden, and the clients' check of who listens on a socket
  file (``SO_PEERCRED``, :mod:`nemo_gym.serving.hop_client`) is what stops an impostor.
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
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger("nemo_gym")

# How long the pipes may stay open after the program ended (a descendant that kept a copy).
PIPE_GRACE_S = 1.0
_NAMESPACE_FLAGS = ["--pid", "--fork", "--kill-child", "--mount-proc"]
# Run inside the namespace before the program: ``sh -c _MOUNTS sh ROOT WORKDIR HIDE... -- ARGV...``.
# ``--no-canonicalize`` makes ``.`` the working directory itself (the path now names the tmpfs).
_MOUNTS = r"""
fail() { echo "nemo_gym: cannot hide $1 from the program" >&2; exit 125; }
root=$1; work=$2; shift 2
while [ "$1" != "--" ]; do
  if [ -d "$1" ]; then
    mount -t tmpfs -o ro,size=4k,mode=0 nemo_gym_hidden "$1" || fail "$1"
  fi
  shift
done
shift
if [ -n "$root" ]; then
  mount -t tmpfs -o size=64k,mode=0755 nemo_gym_private "$root" || fail "$root"
  { mkdir -p "$work" && mount --no-canonicalize --bind . "$work" && cd "$work"; } || fail "$root"
fi
exec "$@"
"""
# The exit status of the mount step when a mount failed (the program never ran).
MOUNT_FAILED = 125


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


@functools.cache
def can_mount() -> bool:
    """Whether tmpfs and bind mounts work inside the namespace :func:`confinement` gives."""
    prefix, _ = confinement()
    sh, mount = shutil.which("sh"), shutil.which("mount")
    if not prefix or sh is None or mount is None:
        return False
    probe = [*prefix, sh, "-c", "mount -t tmpfs -o ro,size=4k,mode=0 nemo_gym_probe /tmp"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


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
    hide: Sequence[str] = (),
    private_root: str | None = None,
    uid: int | None = None,
) -> dict[str, Any]:
    """Run ``argv`` confined (see the module doc) until it exits or ``wall_time_s`` passes.

    ``hide``: directories the program sees empty and read-only; ``private_root``: a directory
    (holding ``cwd``) the program sees holding only ``cwd``. Both where mounts work
    (:func:`can_mount`). ``uid``: the program runs as this uid and gid with no supplementary
    groups (``setpriv``, after the mounts; the caller must be root).

    Returns ``status`` (``ok``/``failed``/``timeout``/``output_limit``), ``returncode``,
    ``wall_s``, ``stdout`` / ``stderr`` (the last bytes) and ``confined`` (how). Raises
    ``OSError`` when the program cannot be started, and when the directories could not be
    hidden (the program then never ran).
    """
    prefix, how = confinement()
    if not prefix and not _warned:
        _warned.append(True)
        _warn_unconfined(how)
    mounts: list[str] = []
    if prefix and (hide or private_root) and can_mount():
        sh = shutil.which("sh") or "/bin/sh"
        mounts = [sh, "-c", _MOUNTS, "sh", private_root or "", cwd, *hide, "--"]
        how = f"{how}, stack files hidden"
    drop: list[str] = []
    if uid is not None:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise OSError("program_uid needs setpriv (util-linux)")
        drop = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        how = f"{how}, uid {uid}"
    limits = {
        "cpu_s": cpu_time_s,
        "memory_bytes": memory_bytes,
        "file_size_bytes": file_size_bytes,
        "open_files": open_files,
    }
    started = time.monotonic()
    deadline = started + wall_time_s
    proc = subprocess.Popen(
        [*prefix, *mounts, *drop, *argv],
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
            # A transport owns its pipe and closes it on a later loop turn (uvloop's libuv closes
            # the fd number then): closing the pipe here too would free that number early, and
            # the late close would take whatever another thread opened under it.
            for transport in transports:
                transport.close()
            for pipe in (proc.stdout, proc.stderr)[len(transports) :]:
                if pipe is not None:
                    pipe.close()
    if mounts and proc.returncode == MOUNT_FAILED and b"nemo_gym: cannot hide" in err.kept:
        raise OSError(
            f"cannot hide the stack's files from the program: {err.kept[-500:].decode(errors='replace')}"
        )
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
