"""``gym env test`` runs pytest under ``nemo_gym/tools/reaping_runner.py``: real processes.

A container's PID 1 often never reaps, so a process a test orphans and kills stays a zombie that
``psutil.pid_exists`` still reports (NeMo Gym 0.6.0's and 0.7.0's openclaw_agent test that
cancelling a command kills its descendants). Under the runner it is gone the moment it dies, and
what a command leaves running is killed when it exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nemo_gym.tools import reaping_runner

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's"
)

RUNNER = [sys.executable, "-I", reaping_runner.__file__, "--"]

# Starts a child that starts a grandchild, kills both (grandchild first, as psutil-based tree
# kills do), waits for the child and prints the grandchild's state once it has finished dying.
ORPHAN = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time; "
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
         "print(p.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    grandchild = int(child.stdout.readline())
    os.kill(grandchild, signal.SIGKILL)
    os.kill(child.pid, signal.SIGKILL)
    child.communicate()
    deadline = time.monotonic() + 10
    while True:  # until it has finished dying: released ("gone") or a zombie ("Z")
        try:
            with open(f"/proc/{grandchild}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        if state in ("gone", "Z", "X") or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    print(state)
    """
)


def test_a_killed_orphan_is_gone_not_a_zombie(tmp_path: Path) -> None:
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    done = subprocess.run([*RUNNER, sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # "Z" (a zombie nobody reaps) is what the same script prints under a PID 1 that never reaps.
    assert done.stdout.strip() in ("gone", "X"), done.stdout


def test_what_the_command_leaves_running_is_killed_and_its_status_kept(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = f"setsid sleep 300 & echo $! > {pid_file}; exit 3"
    done = subprocess.run([*RUNNER, "sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "the command's leftover process still runs"


def test_sigterm_reaches_the_command_and_the_signal_is_its_status() -> None:
    process = subprocess.Popen([*RUNNER, "sleep", "300"])
    time.sleep(0.5)
    process.terminate()
    assert process.wait(timeout=30) == 128 + 15
