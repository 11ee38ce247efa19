"""No sandbox outlives its owner: a real resources server process holding a ``local`` sandbox
with a command running in it is stopped (SIGTERM, as ``ng_run`` stops it) or killed (SIGKILL),
and nothing of the sandbox is left: no process, no working tree (after the next start's sweep),
and the counts say what happened."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nemo_gym.sandbox.isolation import kernel_limits

ROOT = Path(__file__).resolve().parents[2]

SERVER = """
import asyncio, sys
from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer, tool
from nemo_gym.sandbox import AsyncSandbox, SandboxSpec

MARKER = sys.argv[1]

class SandboxedServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    @tool
    async def start_work(self, body: dict) -> dict:
        box = AsyncSandbox({"local": {"workspace_root": sys.argv[2]}}, SandboxSpec())
        await box.start()
        self.task = asyncio.create_task(box.exec(f"sleep {MARKER} & sleep {MARKER}", timeout_s=600))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if self.task.done() or box._require_handle().raw.groups:
                break
        await asyncio.sleep(0.3)
        if self.task.done():
            return {"error": repr(self.task.result())}
        return {"tree": box._require_handle().raw.root}

    async def verify(self, body):
        raise NotImplementedError

SandboxedServer.run_webserver()
"""


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    """A private state root and a workspace root the unprivileged sandbox user can traverse."""
    base = Path(tempfile.mkdtemp(prefix="ng_lifecycle_", dir="/tmp"))
    base.chmod(0o755)
    yield base / "state", base / "trees"
    # A failed test may leave a killed server's sandbox unswept: its cgroup and mount too.
    for record in (base / "state").glob("*/sandboxes/*.json"):
        cgroup = json.loads(record.read_text()).get("cgroup")
        if cgroup:
            kernel_limits.remove_cgroup(cgroup)
    for line in Path("/proc/self/mounts").read_text().splitlines():
        if line.split()[1].startswith(str(base) + "/"):
            kernel_limits.unmount(line.split()[1])
    shutil.rmtree(base, ignore_errors=True)


SUPPORT = kernel_limits.machine_support()


def start_server(tmp: Path, state: Path, trees: Path, marker: str) -> tuple[subprocess.Popen[bytes], str]:
    script = tmp / "server.py"
    script.write_text(SERVER)
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "NEMO_GYM_SANDBOX_STATE_DIR": str(state),
        "NEMO_GYM_SERVER_CONFIG": json.dumps({"name": "sandboxed", "host": "127.0.0.1", "port": port}),
    }
    proc = subprocess.Popen([sys.executable, str(script), marker, str(trees)], env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the sandboxed server did not start")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return json.loads(urllib.request.urlopen(request, timeout=30).read())


def get(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url + "/", timeout=5).read())


def sandbox_processes(marker: str) -> list[psutil.Process]:
    return [
        p for p in psutil.process_iter(["cmdline"]) if f"sleep {marker}" in " ".join(p.info["cmdline"] or [])
    ]


def wait_until(check, seconds: float = 5.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


@pytest.mark.slow
def test_kill_9_of_the_server_mid_exec_leaves_nothing_after_a_restart(
    tmp_path: Path, dirs: tuple[Path, Path]
):
    state, trees = dirs
    marker = f"{uuid.uuid4().int % 1000 + 1000}.5"
    proc, url = start_server(tmp_path, state, trees, marker)
    try:
        tree = post(url, "/start_work", {})["tree"]
        assert wait_until(lambda: len(sandbox_processes(marker)) == 3) and os.path.isdir(
            tree
        )  # bash and its two sleeps
        assert get(url)["sandboxes"] == {"started": 1, "stopped": 0, "swept": 0, "active": 1}
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # The confined group dies with its owner (parent-death signal), before any restart.
        assert wait_until(lambda: not sandbox_processes(marker)), sandbox_processes(marker)
        assert os.path.isdir(tree)  # the tree waits for the sweep
        sandbox_id = Path(tree).name
        if SUPPORT.tmpfs:  # its tmpfs stays mounted (holding memory) until the sweep
            assert os.path.ismount(os.path.join(tree, "work"))
        if SUPPORT.pids_root:  # and its pids cgroup, emptied by the kill, stays until the sweep
            assert os.path.isdir(os.path.join(SUPPORT.pids_root, sandbox_id))
    finally:
        proc.kill()
    restarted, url = start_server(tmp_path, state, trees, marker)
    try:
        post(url, "/start_work", {})  # the first sandbox of the new process sweeps first
        counts = get(url)["sandboxes"]
        assert counts["swept"] == 1 and counts["started"] == 1
        assert not os.path.exists(tree)
        assert sandbox_id not in Path("/proc/self/mounts").read_text()  # unmounted by the sweep
        if SUPPORT.pids_root:
            assert not os.path.exists(os.path.join(SUPPORT.pids_root, sandbox_id))
        restarted.send_signal(signal.SIGTERM)  # as ng_run stops a server
        restarted.wait(20)
    finally:
        restarted.kill()
    assert wait_until(lambda: not sandbox_processes(marker))
    assert list(trees.iterdir()) == [] and list(state.iterdir()) == []
