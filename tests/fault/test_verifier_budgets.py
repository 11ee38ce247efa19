"""Whose fault a spent verifier budget is: the policy's when its own output used it up (a CPU
budget, a program that sleeps past its deadline), the machine's when the machine did it (a
program kept waiting for a CPU, a sandbox that failed). The first is a reward of 0 with the
reason, the second a classified failure, never a score; and a program cannot pass off its own
failure as the sandbox's.

math_with_judge's CPU budget is tested in its own suite
(``test_a_pathological_expression_scores_zero_for_its_cpu_budget...``, NeMo Gym's
pathological-expression case, the stalled and the killed worker).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nemo_gym.testing import running_server, verify_text
from resources_servers.code_gen.app import CodeGenServer

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "print the sum"}]},
    "verifier_metadata": {"unit_tests": {"inputs": ["1 2\n"], "outputs": ["3\n"]}},
}

# Runs one program in code_gen's sandbox from a subprocess pinned to one CPU at the lowest
# priority, next to busy processes on the same CPU: the program waits for the CPU it needs.
STARVED_RUN = r"""
import asyncio, json, os, subprocess, sys
from resources_servers.code_gen.sandbox import CodeSandbox, SandboxLimits
os.sched_setaffinity(0, {0})
# Each busy process in a session of its own: with the kernel's autogroup scheduling, CPU time is
# shared between sessions first, and the sandbox starts the program in a session of its own.
hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(4)]
os.setpriority(os.PRIO_PROCESS, 0, 10)
try:
    box = CodeSandbox(SandboxLimits(cpu_time_s=3, wall_time_s=float(sys.argv[3])), 1, work_root=sys.argv[1])
    result = asyncio.run(box.run(sys.argv[2]))
finally:
    for hog in hogs:
        hog.kill()
print(json.dumps({"status": result.status.value, "message": result.message}))
"""


def _run_pinned(code: str, wall_s: float) -> dict:
    root = tempfile.mkdtemp(prefix="ng_budget_", dir="/tmp")
    os.chmod(root, 0o755)
    out = subprocess.run(
        [sys.executable, "-c", STARVED_RUN, root, code, str(wall_s)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="the kernel keeps no schedstat here")
def test_a_program_starved_of_cpu_by_the_machine_is_not_graded():
    result = _run_pinned("x = 0\nwhile True: x += 1", 6)
    assert result["status"] == "starved", result
    assert "waited" in result["message"] and "too busy" in result["message"]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="the kernel keeps no schedstat here")
def test_a_program_that_sleeps_past_its_deadline_is_the_programs_timeout_even_on_a_busy_machine():
    # Its start-up waits for the CPU too (a second or two here), then it sleeps: mostly not waiting.
    result = _run_pinned("import time\ntime.sleep(60)", 12)
    assert result["status"] == "timeout", result


def _server(**config):
    base = {"name": "code_gen", "num_processes": 1, "unit_test_timeout_secs": 2, "wall_time_limit_secs": 4}
    return CodeGenServer({**base, **config})


def test_a_sandbox_that_cannot_set_up_is_a_sandbox_failed_failure_not_a_zero(tmp_path: Path):
    os.chmod(tmp_path, 0o755)
    server = _server(sandbox_work_root=str(tmp_path), require_sandbox_layers=["no_such_layer"])
    with running_server(server) as base:
        body = verify_text(base, ROW, "```python\nprint(3)\n```", 502)
    assert body["failure_class"] == "sandbox_failed" and "reward" not in body
    assert "no_such_layer" in body["error"]


def test_a_program_cannot_claim_a_sandbox_failure_for_itself(tmp_path: Path):
    os.chmod(tmp_path, 0o755)
    forged = "import os, sys\nos.write(2, b'\\n__NG_SANDBOX__ sandbox setup failed: not me\\n')\nos._exit(20)"
    with running_server(_server(sandbox_work_root=str(tmp_path))) as base:
        body = verify_text(base, ROW, f"```python\n{forged}\n```")
        assert body["reward"] == 0.0 and body["result"] == [-4]  # its own runtime error
        assert verify_text(base, ROW, "```python\nprint(3)\n```")["reward"] == 1.0
