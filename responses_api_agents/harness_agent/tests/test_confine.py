"""confine.run_confined directly: the deadline holds even without a PID namespace (the fallback),
and with one nothing survives."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import psutil
import pytest

from responses_api_agents.harness_agent import confine

LIMITS = {
    "cpu_time_s": 30,
    "memory_bytes": 2 * 1024**3,
    "file_size_bytes": 1 << 20,
    "open_files": 64,
    "max_output_bytes": 1 << 16,
    "stderr_bytes": 4096,
}
# The program exits at once, leaving a setsid'd child that keeps its stdout and stderr open.
LEAVER = (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', sys.argv[1]], start_new_session=True)\n"
    "print('left one behind')\n"
)


def marked(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]


def run(marker: str, tmp: str, wall_time_s: float) -> dict:
    argv = [sys.executable, "-c", LEAVER, marker]
    return asyncio.run(
        confine.run_confined(argv, cwd=tmp, env=dict(os.environ), wall_time_s=wall_time_s, **LIMITS)
    )


def test_without_a_namespace_the_pipe_reads_still_end_at_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(confine, "confinement", lambda: ([], "disabled by the test"))
    marker = f"ng-confine-fallback-{time.monotonic_ns()}"
    started = time.monotonic()
    try:
        result = run(marker, str(tmp_path), wall_time_s=1.5)
        elapsed = time.monotonic() - started
        # The escaped child held the pipes open: the read ended at the deadline (+1 s grace), not
        # when the child would have exited (30 s), and the rollout says it overran.
        assert elapsed < 6 and result["status"] == "timeout", (elapsed, result)
        assert result["stdout"] == b"left one behind\n" and result["confined"].startswith(
            "process group only"
        )
    finally:
        for proc in marked(marker):
            proc.kill()


def test_with_a_namespace_nothing_survives_the_program(tmp_path):
    prefix, how = confine.confinement()
    if not prefix:
        pytest.skip(f"no PID namespace here ({how})")
    marker = f"ng-confine-ns-{time.monotonic_ns()}"
    started = time.monotonic()
    result = run(marker, str(tmp_path), wall_time_s=10)
    assert result["status"] == "ok" and time.monotonic() - started < 5, result
    assert result["stdout"] == b"left one behind\n" and result["confined"] == how
    deadline = time.monotonic() + 5
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not marked(marker)


def test_an_fd_opened_after_a_run_is_not_closed_by_the_runs_pipes_under_uvloop(tmp_path):
    # The agent serves on uvloop, where a pipe transport's fd is closed by libuv a loop turn after
    # close(): a run that also closed the pipe itself freed the number early, and libuv's late
    # close then took the next file opened under it (a concurrent rollout's rmtree got EBADF).
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> tuple[dict, bool]:
        result = await confine.run_confined(
            ["true"], cwd=str(tmp_path), env=dict(os.environ), wall_time_s=10, **LIMITS
        )
        fd = os.open(str(tmp_path), os.O_RDONLY)  # takes the lowest free number
        try:
            await asyncio.sleep(0.1)  # let every deferred close run
            try:
                os.fstat(fd)
                alive = True
            except OSError:
                alive = False
        finally:
            if alive:
                os.close(fd)
        return result, alive

    result, alive = uvloop.run(scenario())
    assert result["status"] == "ok", result
    assert alive, "a file opened after the run was closed under it by the run's pipe transports"
