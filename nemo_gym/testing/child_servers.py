"""Servers started as child processes of a test or a benchmark, and their peak memory.

A fault test and a benchmark that stream bodies at a server, or hold connections open, need the
server in its own process (its memory measured alone, its sockets its own): started from this
project with ``PYTHONPATH`` reaching it, waited for until ``GET /`` answers, its high-water RSS
read from ``/proc``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from nemo_gym.launch.config import project_root
from nemo_gym.testing.http_clients import SyncClient

HEAD_SERVER_SCRIPT = """
import asyncio, sys
from nemo_gym.launch.head_server import HeadServer
from nemo_gym.serving.server import bind_socket, make_uvicorn_server
sock = bind_socket("127.0.0.1", int(sys.argv[1]))
asyncio.run(make_uvicorn_server(HeadServer({}).build_app()).serve(sockets=[sock]))
"""
"""``python -c HEAD_SERVER_SCRIPT PORT``: an empty head server alone on 127.0.0.1:PORT."""


def start_child_server(
    argv: list[str], env: dict[str, str], port: int, timeout_s: float = 60.0
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in this project (``env`` added to this environment) and return once
    127.0.0.1:``port`` answers ``GET /`` with 200; killed, and ``TimeoutError`` raised, if it
    does not within ``timeout_s``."""
    root = project_root()
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(root), **env}, cwd=root)
    with SyncClient() as client:
        try:
            client.wait_healthy(f"http://127.0.0.1:{port}", timeout_s=timeout_s)
        except BaseException:
            proc.kill()
            proc.wait(10)
            raise
    return proc


def peak_rss_kib(pid: int) -> int:
    """Process ``pid``'s high-water resident set size (``VmHWM``) in KiB; ``RuntimeError`` naming
    the process when ``/proc`` does not report it (not Linux, or the process is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:
        raise RuntimeError(f"cannot read the peak RSS of process {pid}: {exc}") from exc
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM line (a kernel thread or a zombie?)")


__all__ = ["HEAD_SERVER_SCRIPT", "peak_rss_kib", "start_child_server"]
