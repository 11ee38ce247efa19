"""Run one worker command inside a sandbox under a deadline, and prove its processes are gone.

This file is uploaded into sandboxes and run there by path (``python -I process_supervisor.py
--timeout S --receipt R [--cleanup-timeout C] [--stop-file F] -- COMMAND...``), so it imports
nothing but the standard library. It becomes a child subreaper (every process the worker
leaves behind, even one that called ``setsid``, is re-parented to it), runs the worker in a
session of its own until it exits, the deadline passes or SIGTERM arrives; then asks it to stop
(SIGTERM, ``cleanup_timeout`` seconds of grace), kills its session, and kills and reaps every
remaining descendant. Only then does it write the receipt ``R`` (atomically):
``{"cleanup_confirmed", "return_code", "error", "timed_out"}``. A caller must see
``cleanup_confirmed: true`` and ``error: null`` before it treats the sandbox as quiet.

``--stop-file``: when that file exists at start, no worker is launched (a close that raced the
launch wins) and the receipt confirms there is nothing to clean. Linux only (``/proc`` and
``PR_SET_CHILD_SUBREAPER``); elsewhere the receipt carries the error.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TypedDict

DEFAULT_CLEANUP_TIMEOUT = 10.0
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.05


class CleanupReceipt(TypedDict):
    """What the supervisor writes once it is done: whether every process is confirmed gone,
    the worker's exit status, the first error, and whether the deadline stopped the worker."""

    cleanup_confirmed: bool
    return_code: int | None
    error: str | None
    timed_out: bool


def exec_timeout(*, timeout: float, cleanup_timeout: float = DEFAULT_CLEANUP_TIMEOUT) -> float:
    """The deadline to give the sandbox ``exec`` that runs the supervisor: the worker's
    ``timeout`` plus room for the stop grace, the kill, the reaping and the receipt."""
    return timeout + 3 * cleanup_timeout + 30


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(errno)}")


def _child_pids() -> list[int]:
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that ended while we looked
            continue
    return pids


def _kill_and_reap_descendants(timeout: float) -> None:
    """SIGKILL every child (orphans arrive as children: we are their subreaper) and reap them
    until none is left; ``TimeoutError`` when some still live after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in _child_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return  # no child at all: everything is reaped
        if time.monotonic() >= deadline:
            raise TimeoutError(f"processes still alive {timeout:g} s after being killed: {_child_pids()}")
        time.sleep(0.01)


def supervise(
    command: list[str],
    *,
    timeout: float,
    cleanup_timeout: float = DEFAULT_CLEANUP_TIMEOUT,
    stop_path: Path | None = None,
) -> CleanupReceipt:
    """Run ``command`` as described in the module docstring and return its receipt."""
    receipt: CleanupReceipt = {
        "cleanup_confirmed": False,
        "return_code": None,
        "error": None,
        "timed_out": False,
    }
    stop_requested = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_term)
    worker: subprocess.Popen[bytes] | None = None
    reaping = False
    try:
        if stop_requested or (stop_path is not None and stop_path.exists()):
            receipt["cleanup_confirmed"] = True
            return receipt
        if sys.platform != "linux":
            raise RuntimeError("process supervision needs Linux (/proc and PR_SET_CHILD_SUBREAPER)")
        # Out of the launcher's process group, so that a kill of that group reaches the worker
        # through us (we clean up) rather than killing us first.
        if os.getpgrp() != os.getpid():
            os.setsid()
        _become_subreaper()
        reaping = True
        worker = subprocess.Popen(command, start_new_session=True)
        deadline = time.monotonic() + timeout
        while worker.poll() is None and not stop_requested and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if worker.poll() is None:
            receipt["timed_out"] = not stop_requested
            # SIGTERM first: the worker may save its progress before the hard kill.
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=cleanup_timeout)
            except subprocess.TimeoutExpired:
                pass
    except Exception as exc:
        receipt["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        # From here on a second SIGTERM must not interrupt the cleanup it asked for.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if worker is not None:
                try:
                    os.killpg(worker.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                receipt["return_code"] = worker.wait(timeout=cleanup_timeout)
            if reaping:
                _kill_and_reap_descendants(cleanup_timeout)
            receipt["cleanup_confirmed"] = True
        except Exception as exc:
            receipt["error"] = f"cleanup: {type(exc).__name__}: {exc}"
    return receipt


def write_receipt(path: Path, receipt: CleanupReceipt) -> None:
    """Write ``receipt`` to ``path`` atomically (a reader sees the whole receipt or none)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(receipt))
    os.replace(partial, path)


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """The command line: supervise, write the receipt, exit 0 only when cleanup is confirmed."""
    parser = argparse.ArgumentParser(
        description="Run a command under a deadline; confirm its processes are gone."
    )
    parser.add_argument("--timeout", type=_seconds, required=True, help="seconds the worker may run")
    parser.add_argument("--cleanup-timeout", type=_seconds, default=DEFAULT_CLEANUP_TIMEOUT)
    parser.add_argument("--receipt", type=Path, required=True, help="where the JSON receipt is written")
    parser.add_argument("--stop-file", type=Path, help="launch nothing when this file exists")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the worker command goes after --")
    receipt = supervise(
        command, timeout=args.timeout, cleanup_timeout=args.cleanup_timeout, stop_path=args.stop_file
    )
    write_receipt(args.receipt, receipt)
    return 0 if receipt["cleanup_confirmed"] and receipt["error"] is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
