"""Servers ``ng_run`` starts run under Linux's ``SCHED_BATCH`` (a hop's answer does not preempt
the server that sent it; docs/PERFORMANCE.md), every thread of them; ``NEMO_GYM_SCHED_BATCH=0``
keeps the default policy. Checked on the real server processes, from the kernel's view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from nemo_gym.testing import ng_run_process

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not hasattr(os, "SCHED_BATCH") or not os.path.isdir("/proc/self/task"),
    reason="SCHED_BATCH is a Linux scheduling policy; this system has none",
)

APP = """
from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer


class SchedProbe(SimpleResourcesServer):
    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


if __name__ == "__main__":
    SchedProbe.run_webserver()
"""

CONFIG = """
sched_probe:
  resources_servers:
    sched_probe:
      entrypoint: app.py
"""


def server_thread_policies(tmp_path: Path, env_value: str | None) -> tuple[list[int], int]:
    """The scheduling policy of every thread of the server ``ng_run`` starts, and ng_run's own."""
    app_dir = tmp_path / "resources_servers" / "sched_probe"
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "app.py").write_text(APP)
    (tmp_path / "probe.yaml").write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("NEMO_GYM_SCHED_BATCH", None)
    if env_value is not None:
        env["NEMO_GYM_SCHED_BATCH"] = env_value
    with ng_run_process(["probe.yaml"], env=env, timeout_s=60, cwd=tmp_path) as (ng_run, head_url):
        with urllib.request.urlopen(head_url + "/server_instances", timeout=10) as resp:
            pid = next(i["pid"] for i in json.load(resp) if i["name"] == "sched_probe")
        policies = [os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]
        return policies, os.sched_getscheduler(ng_run.pid)


@pytest.mark.slow
def test_every_thread_of_a_server_is_batch_scheduled_and_the_launcher_is_not(tmp_path: Path) -> None:
    policies, launcher = server_thread_policies(tmp_path, None)
    assert policies and set(policies) == {os.SCHED_BATCH}, policies
    assert launcher == os.SCHED_OTHER  # only servers change: ng_run and its callers keep theirs


@pytest.mark.slow
def test_the_environment_variable_keeps_the_default_policy(tmp_path: Path) -> None:
    policies, _ = server_thread_policies(tmp_path, "0")
    assert set(policies) == {os.SCHED_OTHER}, policies


CHILD_PROBE = """
import os, subprocess, sys
from nemo_gym.serving.cpu_scheduling import batch_scheduling_for_serving
from responses_api_models.local_vllm_model.app import _die_with_parent

assert batch_scheduling_for_serving()
probe = [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"]
inherited = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
engine = subprocess.run(probe, capture_output=True, text=True, check=True, preexec_fn=_die_with_parent).stdout.strip()
print(inherited, engine)
"""


def test_children_inherit_batch_but_the_local_vllm_engine_gets_the_default_policy() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NEMO_GYM_SCHED_BATCH", None)
    result = subprocess.run(
        [sys.executable, "-c", CHILD_PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    inherited, engine = (int(v) for v in result.stdout.split())
    assert inherited == os.SCHED_BATCH  # sandboxed code and harness programs: batch work too
    assert engine == os.SCHED_OTHER  # the inference engine local_vllm_model starts is not
