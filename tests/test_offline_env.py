"""``gym env test`` and a launch give what they start the offline switches (``launch/offline_env.py``).

The litellm case is the attack: a child that imports litellm under ``gym env test``'s environment,
with every outbound connection routed to a listener of ours on loopback (``HTTPS_PROXY``), opens
no connection; without the switch it asks that listener for GitHub. It needs litellm, which the
project does not depend on: without it the test skips and says so.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nemo_gym.launch.config import ServerInstance
from nemo_gym.launch.offline_env import OFFLINE_SWITCHES
from nemo_gym.launch.server_processes import launch_spec
from nemo_gym.tools.authoring import check_server, pytest_command
from nemo_gym.tools.scaffold import init_resources_server

SEES_THE_SWITCHES = """
import os
import subprocess
import sys


def test_the_switches_reach_the_tests_and_their_children():
    wanted = {wanted!r}
    assert {{k: os.environ.get(k) for k in wanted}} == wanted
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('LITELLM_LOCAL_MODEL_COST_MAP'))"],
        capture_output=True, text=True, check=True,
    )
    assert child.stdout.strip() == wanted["LITELLM_LOCAL_MODEL_COST_MAP"]
"""


def test_gym_env_test_runs_the_tests_with_the_offline_switches(tmp_path: Path, monkeypatch) -> None:
    for name in OFFLINE_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    folder = init_resources_server("resources_servers/offline_env", cwd=tmp_path)
    (folder / "tests" / "test_app.py").write_text(SEES_THE_SWITCHES.format(wanted=dict(OFFLINE_SWITCHES)))
    check = check_server(folder, timeout_s=120)
    assert check.ok, check.problems + [check.pytest_output]
    assert check.pytest_counts.get("passed") == 1


def test_a_value_the_user_set_wins(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "False")
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    _, env = pytest_command(tmp_path / "resources_servers" / "x", tmp_path / "pytest.ini")
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "False"
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"


def test_a_launched_server_gets_the_switches_too(monkeypatch) -> None:
    monkeypatch.delenv("LITELLM_LOCAL_MODEL_COST_MAP", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "0")
    instance = ServerInstance("rs", "resources_servers", "example_single_tool_call")
    env = launch_spec(instance, "http://127.0.0.1:1").env
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["HF_HUB_DISABLE_TELEMETRY"] == "0"


class _Listener:
    """A loopback socket that records the first bytes of every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.recv(200))


def _import_litellm(env: dict[str, str], listener: _Listener) -> None:
    env = {k: v for k, v in env.items() if k.lower() not in ("no_proxy", "all_proxy")}
    proxy = f"http://127.0.0.1:{listener.port}"
    env.update(HTTPS_PROXY=proxy, HTTP_PROXY=proxy, https_proxy=proxy, http_proxy=proxy)
    done = subprocess.run([sys.executable, "-c", "import litellm"], env=env, capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("litellm") is None, reason="litellm is not installed here")
def test_litellm_under_gym_env_test_opens_no_connection(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("LITELLM_LOCAL_MODEL_COST_MAP", raising=False)
    listener = _Listener()
    try:
        _, env = pytest_command(tmp_path / "resources_servers" / "x", tmp_path / "pytest.ini")
        _import_litellm(env, listener)
        assert listener.requests == []
        # The same import without the switch: litellm goes for its cost map on GitHub.
        _import_litellm(dict(os.environ), listener)
        assert any(b"githubusercontent" in r for r in listener.requests), listener.requests
    finally:
        listener.sock.close()
