"""Child servers for fault tests and benchmarks: started, waited for, measured, or killed."""

from __future__ import annotations

import os
import sys

import psutil
import pytest

from nemo_gym.launch.launcher import free_port
from nemo_gym.testing import SyncClient
from nemo_gym.testing.child_servers import HEAD_SERVER_SCRIPT, peak_rss_kib, start_child_server


def test_a_head_server_child_answers_and_its_peak_rss_is_read() -> None:
    port = free_port()
    proc = start_child_server([sys.executable, "-c", HEAD_SERVER_SCRIPT, str(port)], {}, port)
    try:
        with SyncClient() as client:
            assert client.get(f"http://127.0.0.1:{port}/")[0] == 200
        assert 10 * 1024 < peak_rss_kib(proc.pid) < 2 * 1024 * 1024  # a Python server: 10 MiB-2 GiB
    finally:
        proc.terminate()
        proc.wait(10)
    with pytest.raises(RuntimeError, match=f"process {proc.pid}"):
        peak_rss_kib(proc.pid)  # reaped: no /proc entry


def test_a_child_that_never_listens_is_killed_and_named() -> None:
    port = free_port()
    before = {p.pid for p in psutil.Process(os.getpid()).children()}
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port} did not become healthy"):
        start_child_server([sys.executable, "-c", "import time; time.sleep(60)"], {}, port, timeout_s=1)
    left = [p for p in psutil.Process(os.getpid()).children() if p.pid not in before]
    assert left == []
