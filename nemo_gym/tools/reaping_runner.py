"""Run a test command as the parent of every process it leaves behind: ``gym env test``'s pytest.

Run by path (``python -I reaping_runner.py -- COMMAND...``; it imports only the standard library).
On Linux it becomes a child subreaper that ignores ``SIGCHLD``, so a process the tests orphan (a
grandchild whose parent they killed) is re-parented here and released by the kernel the moment
it exits, before its parent's exit can be waited for. A container's PID 1 often never reaps:
there a killed orphan stays a zombie, which ``psutil.pid_exists`` and ``/proc`` still show, and a
test checking that it killed a process tree fails on the machine rather than on the code (and
one that reaps does it a moment later, racing the test's check). The command itself runs under
a reporter (this file again, ``--report-fd``), which waits for it and tells its exit status over
a pipe: a child of a parent ignoring ``SIGCHLD`` leaves no status to wait for. When the command
exits, what it left running is killed (a test's stray server no longer holds the output pipes
open or outlives the run). SIGTERM is passed on to the command; the exit status is the
command's. Elsewhere (no ``PR_SET_CHILD_SUBREAPER``) the command just runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE_S = 5.0


def _become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _children() -> list[int]:
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:  # a thread that ended while we looked
            continue
    return pids


def _kill_leftovers(grace_s: float) -> None:
    """SIGKILL every remaining child (orphans are children here; the kernel releases them)."""
    deadline = time.monotonic() + grace_s
    while (pids := _children()) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def report(command: list[str], fd: int) -> int:
    """The reporter: run ``command``, pass SIGTERM on to it, write its exit status to ``fd``."""
    worker = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: worker.terminate())
    code = worker.wait()
    os.write(fd, str(code).encode())
    return 0


def run(command: list[str]) -> int:
    """Run ``command`` as described above; its exit status (negative: the signal that ended it)."""
    if not _become_subreaper():
        return subprocess.call(command)
    read_end, write_end = os.pipe()
    reporter = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), "--report-fd", str(write_end), "--", *command],
        pass_fds=(write_end,),
    )
    os.close(write_end)
    # From here on this process's children (the reporter, orphans) leave no zombie behind.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(reporter.pid, signal.SIGTERM))
    told = b""
    while chunk := os.read(read_end, 64):  # EOF: the reporter has exited
        told += chunk
    os.close(read_end)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    reporter.returncode = 0  # released by the kernel: nothing to wait for
    _kill_leftovers(LEFTOVER_GRACE_S)
    return int(told) if told.strip() else 1


def main(argv: list[str] | None = None) -> int:
    """``reaping_runner.py -- COMMAND...`` (``--report-fd FD``: the reporter, see above)."""
    args = list(sys.argv[1:] if argv is None else argv)
    fd = None
    if args[:1] == ["--report-fd"] and len(args) > 1:
        fd, args = int(args[1]), args[2:]
    command = args[1:] if args[:1] == ["--"] else args
    if not command:
        print("usage: reaping_runner.py -- COMMAND...", file=sys.stderr)
        return 2
    if fd is not None:
        return report(command, fd)
    code = run(command)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    raise SystemExit(main())
