"""The ``docker`` and ``podman`` providers against a real engine: Debian's podman serving the
Docker Engine API on a private socket (``nemo_gym.testing.podman_engine``), with a busybox image
built offline. Skips, naming what is missing, where podman, runc or busybox-static are not
installed (``scripts/test.sh`` installs them as root).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import pytest

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, SandboxStatus
from nemo_gym.sandbox.lifecycle import LEDGER
from nemo_gym.sandbox.providers.docker.engine import request_sync
from nemo_gym.testing.podman_engine import podman_engine, why_no_podman

pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_no_podman() is not None, reason=str(why_no_podman()))]


@pytest.fixture(scope="module")
def engine():
    directory = tempfile.mkdtemp(prefix="ng_podman_", dir="/var/tmp")
    try:
        with podman_engine(directory) as running:
            yield running
    except RuntimeError as exc:  # the machine has podman but cannot run it (say, no overlay)
        pytest.skip(f"podman engine could not start here: {exc}")


def _containers(socket: str, label: str) -> list[dict]:
    query = urllib.parse.quote(json.dumps({"label": [label]}))
    status, body = request_sync(socket, "GET", f"/containers/json?all=true&filters={query}", timeout_s=10)
    assert status == 200
    return json.loads(body)


@pytest.mark.parametrize("provider", ["docker", "podman"])
async def test_the_api_contract_against_a_real_engine(engine, provider: str, tmp_path: Path):
    config = {provider: {"socket": engine.socket, "pull": "never", "default_timeout_s": 30}}
    spec = SandboxSpec(
        image=engine.image,
        workdir="/work",
        files={"in.txt": "hello"},
        resources={"memory_mib": 256},
        metadata={"case": provider},
    )
    async with AsyncSandbox(config, spec) as box:
        await box.start()
        assert await box.status() is SandboxStatus.RUNNING
        (container,) = _containers(engine.socket, f"case={provider}")
        assert container["Labels"]["nemo_gym.sandbox.owner"] == LEDGER.owner_id
        result = await box.exec("cat in.txt; echo err >&2; exit 4")
        assert (result.stdout, result.stderr, result.return_code) == ("hello", "err\n", 4)
        started = time.monotonic()
        slow = await box.exec("sleep 30; echo never", timeout_s=1)
        assert slow.error_type == "timeout" and time.monotonic() - started < 15
        after = await box.exec("ps -o pid,args | grep -c '[s]leep 30' || true")
        assert after.stdout == "0\n"  # the timed-out command's shell and sleep were killed
        await box.upload(str(_file(tmp_path, "up.txt", "uploaded")), "/work/sub/up.txt")
        assert (await box.exec("cat /work/sub/up.txt")).stdout == "uploaded"
        await box.download("/work/in.txt", tmp_path / "out.txt")
        assert (tmp_path / "out.txt").read_text() == "hello"
        await box.pause()
        assert await box.status() is SandboxStatus.PAUSED
        await box.resume()
        assert (await box.exec("echo back")).stdout == "back\n"
    assert await box.status() is SandboxStatus.STOPPED
    assert _containers(engine.socket, f"case={provider}") == []


async def test_a_container_is_isolated_and_limited_by_the_engine(engine):
    config = {"podman": {"socket": engine.socket, "pull": "never", "pids_limit": 64}}
    spec = SandboxSpec(image=engine.image, resources={"memory_mib": 64})
    async with AsyncSandbox(config, spec) as box:
        await box.start()
        # No network: only loopback is there.
        net = await box.exec("ls /sys/class/net")
        assert net.stdout is not None and net.stdout.split() == ["lo"]
        # A fork storm stops at the pids limit, inside the container.
        storm = await box.exec(
            "for i in $(seq 200); do sleep 5 & done 2>&1 | tail -1; ps | wc -l", timeout_s=20
        )
        assert "can't fork" in (storm.stdout or "") and int((storm.stdout or "0").split()[-1]) <= 64 + 2
        # The memory limit is the container's cgroup's (the kernel's), seen from inside.
        limit = "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"
        memory = await box.exec(limit)
        assert (memory.stdout or "").strip() == str(64 * 1024 * 1024)


def test_containers_of_a_killed_server_are_swept_by_the_next_process(engine, tmp_path: Path):
    state = tmp_path / "state"
    script = (
        "import asyncio, os, sys\n"
        "from nemo_gym.sandbox import AsyncSandbox, SandboxSpec\n"
        "async def main():\n"
        f"    box = AsyncSandbox({{'podman': {{'socket': {engine.socket!r}, 'pull': 'never'}}}},"
        f" SandboxSpec(image={engine.image!r}, metadata={{'case': 'swept'}}))\n"
        "    await box.start()\n"
        "    print('started', flush=True)\n"
        "    os.kill(os.getpid(), 9)\n"
        "asyncio.run(main())\n"
    )
    env = {"NEMO_GYM_SANDBOX_STATE_DIR": str(state), "PATH": "/usr/bin:/bin"}
    killed = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert killed.returncode == -9 and "started" in killed.stdout, killed.stderr[-1000:]
    assert len(_containers(engine.socket, "case=swept")) == 1
    sweep = (
        "from nemo_gym.sandbox.providers.docker import PodmanProvider\n"
        f"print(PodmanProvider(socket={engine.socket!r}, pull='never').sweep())\n"
    )
    swept = subprocess.run(
        [sys.executable, "-c", sweep], env=env, capture_output=True, text=True, timeout=120
    )
    assert swept.returncode == 0 and swept.stdout.strip() == "1", swept.stderr[-1000:]
    assert _containers(engine.socket, "case=swept") == []


def _file(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_nothing_is_left_running_after_the_module(engine):
    # The engine's own processes are stopped by the fixture; here: every sandbox container of
    # this process was removed by the tests above.
    assert asyncio.run(asyncio.sleep(0, result=True))
    leftover = [c for c in _containers(engine.socket, "nemo_gym.sandbox") if c["State"] == "running"]
    assert leftover == []
