"""``nemo_gym.sandbox.process_supervisor`` run as sandboxes run it: a script by path, with
``python -I``, over real worker processes (including one that escapes with ``setsid``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_gym.sandbox import process_supervisor

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the supervisor needs Linux")

# Leaves a grandchild behind in a session of its own (what a tool call's background job does),
# records its pid, then exits or hangs.
WORKER = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os.setsid()
    time.sleep(60)
    os._exit(0)
open(sys.argv[1], "w").write(str(pid))
if sys.argv[2] == "hang":
    time.sleep(60)
sys.exit(int(sys.argv[2]) if sys.argv[2] != "hang" else 0)
"""


def _supervise(tmp_path: Path, *args: str, timeout: float = 20) -> tuple[int, dict, float]:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    receipt = tmp_path / "cleanup.json"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-I", process_supervisor.__file__, "--receipt", str(receipt), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, json.loads(receipt.read_text()), time.monotonic() - started


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_worker_exit_status_and_escaped_descendant_killed(tmp_path: Path) -> None:
    code, receipt, _ = _supervise(
        tmp_path, "--timeout", "30", "--", sys.executable, str(tmp_path / "worker.py"), "pid", "3"
    )
    assert receipt == {"cleanup_confirmed": True, "return_code": 3, "error": None, "timed_out": False}
    assert code == 0
    grandchild = int((tmp_path / "pid").read_text())
    assert not _alive(grandchild), "a process that left the worker's session survived the supervisor"
    assert not (tmp_path / "cleanup.json.partial").exists()


def test_deadline_stops_a_hung_worker(tmp_path: Path) -> None:
    code, receipt, elapsed = _supervise(
        tmp_path,
        "--timeout",
        "0.5",
        "--cleanup-timeout",
        "2",
        "--",
        sys.executable,
        str(tmp_path / "worker.py"),
        "pid",
        "hang",
    )
    assert receipt["timed_out"] is True and receipt["cleanup_confirmed"] is True and receipt["error"] is None
    assert receipt["return_code"] is not None and receipt["return_code"] < 0  # killed by a signal
    assert code == 0 and elapsed < 10
    assert not _alive(int((tmp_path / "pid").read_text()))


def test_stop_file_fences_the_launch(tmp_path: Path) -> None:
    (tmp_path / "runner.stop").touch()
    code, receipt, _ = _supervise(
        tmp_path,
        "--timeout",
        "30",
        "--stop-file",
        str(tmp_path / "runner.stop"),
        "--",
        sys.executable,
        str(tmp_path / "worker.py"),
        "pid",
        "0",
    )
    assert code == 0 and receipt == {
        "cleanup_confirmed": True,
        "return_code": None,
        "error": None,
        "timed_out": False,
    }
    assert not (tmp_path / "pid").exists()  # the worker never ran


def test_sigterm_stops_the_worker_without_timing_out(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    receipt_path = tmp_path / "cleanup.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-I",
            process_supervisor.__file__,
            "--timeout",
            "30",
            "--receipt",
            str(receipt_path),
            "--",
        ]
        + [sys.executable, str(worker), "pid", "hang"],
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    receipt = json.loads(receipt_path.read_text())
    assert receipt["timed_out"] is False and receipt["cleanup_confirmed"] is True
    assert not _alive(int((tmp_path / "pid").read_text()))


def test_bad_arguments_and_exec_timeout() -> None:
    assert (
        process_supervisor.exec_timeout(timeout=100)
        == 100 + 3 * process_supervisor.DEFAULT_CLEANUP_TIMEOUT + 30
    )
    assert process_supervisor.exec_timeout(timeout=10, cleanup_timeout=1) == 43
    for argv in (["--timeout", "0", "--receipt", "r", "--", "true"], ["--timeout", "5", "--receipt", "r"]):
        proc = subprocess.run(
            [sys.executable, "-I", process_supervisor.__file__, *argv],
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert proc.returncode == 2 and ("seconds" in proc.stderr or "after --" in proc.stderr)
    # The script must run alone inside a sandbox: nothing of nemo_gym may be imported.
    source = Path(process_supervisor.__file__).read_text()
    assert "import nemo_gym" not in source and "from nemo_gym" not in source
    assert os.path.basename(process_supervisor.__file__) == "process_supervisor.py"
