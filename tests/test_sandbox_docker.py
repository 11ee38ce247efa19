"""The ``docker`` provider: the API contract against a real engine when one answers here, and the
requests it sends (isolation defaults, labels, limits, the sweep) against a loopback engine on a
unix socket that speaks the part of the Docker Engine API the provider uses."""

from __future__ import annotations

import asyncio
import io
import os
import struct
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, SandboxStatus
from nemo_gym.sandbox.lifecycle import LEDGER
from nemo_gym.sandbox.providers.docker import DockerProvider
from nemo_gym.sandbox.providers.docker.engine import demultiplex, request_sync, socket_path
from nemo_gym.serving.request_context import _current_rollout_id


def _daemon() -> str | None:
    """Why no real engine can be used here, or None when one answers."""
    path = socket_path()
    if not os.path.exists(path):
        return f"no Docker or Podman daemon here: {path} does not exist (`docker info` cannot connect)"
    try:
        status, _ = request_sync(path, "GET", "/_ping", timeout_s=3)
    except OSError as exc:
        return f"the engine socket {path} does not answer: {exc}"
    return None if status == 200 else f"the engine at {path} answered /_ping with {status}"


NO_DAEMON = _daemon()


@pytest.mark.skipif(NO_DAEMON is not None, reason=str(NO_DAEMON))
async def test_the_api_contract_against_a_real_engine(tmp_path: Path):
    image = os.environ.get("NEMO_GYM_TEST_IMAGE", "busybox:latest")
    spec = SandboxSpec(image=image, workdir="/work", files={"in.txt": "hello"}, resources={"memory_mib": 256})
    async with AsyncSandbox({"docker": {}}, spec) as box:
        await box.start()
        assert await box.status() is SandboxStatus.RUNNING
        result = await box.exec("cat in.txt; echo err >&2; exit 4")
        assert (result.stdout, result.stderr, result.return_code) == ("hello", "err\n", 4)
        net = await box.exec("wget -q -T 2 -O- http://1.1.1.1 || echo no network")
        assert "no network" in (net.stdout or "")
        slow = await box.exec("sleep 30", timeout_s=1)
        assert slow.error_type == "timeout"
        await box.download("/work/in.txt", tmp_path / "out.txt")
        assert (tmp_path / "out.txt").read_text() == "hello"
        await box.pause()
        assert await box.status() is SandboxStatus.PAUSED
        await box.resume()
    assert await box.status() is SandboxStatus.STOPPED


def frames(stdout: bytes, stderr: bytes) -> bytes:
    """Docker's multiplexed attach stream."""
    out = b""
    for kind, data in ((1, stdout), (2, stderr)):
        if data:
            out += bytes([kind, 0, 0, 0]) + struct.pack(">I", len(data)) + data
    return out


class FakeEngine:
    """The endpoints the provider calls, recording every request; exec answers a fixed output."""

    def __init__(self) -> None:
        self.containers: dict[str, dict[str, Any]] = {}
        self.execs: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.archives: dict[str, bytes] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.middlewares.append(self.record)
        v = "/v1.41"
        app.router.add_get(v + "/_ping", self.ok)
        app.router.add_post(v + "/containers/create", self.create)
        app.router.add_post(v + "/containers/{id}/start", self.ok)
        app.router.add_post(v + "/containers/{id}/exec", self.exec_create)
        app.router.add_post(v + "/exec/{id}/start", self.exec_start)
        app.router.add_get(v + "/exec/{id}/json", self.exec_inspect)
        app.router.add_get(v + "/containers/{id}/json", self.inspect)
        app.router.add_get(v + "/containers/json", self.list)
        app.router.add_put(v + "/containers/{id}/archive", self.put_archive)
        app.router.add_delete(v + "/containers/{id}", self.delete)
        return app

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.calls.append((request.method, request.path_qs))
        return await handler(request)

    async def create(self, request: web.Request) -> web.Response:
        name = request.query["name"]
        self.containers[name] = await request.json()
        return web.json_response({"Id": name}, status=201)

    async def ok(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def exec_create(self, request: web.Request) -> web.Response:
        exec_id = f"e{len(self.execs)}"
        self.execs[exec_id] = await request.json()
        return web.json_response({"Id": exec_id}, status=201)

    async def exec_start(self, request: web.Request) -> web.Response:
        return web.Response(body=frames(b"out\n", b"err\n"), content_type="application/vnd.docker.raw-stream")

    async def exec_inspect(self, request: web.Request) -> web.Response:
        return web.json_response({"ExitCode": 3, "Pid": 1})

    async def inspect(self, request: web.Request) -> web.Response:
        if request.match_info["id"] not in self.containers:
            return web.json_response({"message": "No such container"}, status=404)
        return web.json_response({"State": {"Status": "running"}})

    async def list(self, request: web.Request) -> web.Response:
        return web.json_response(
            [{"Id": name, "Labels": body["Labels"]} for name, body in self.containers.items()]
        )

    async def put_archive(self, request: web.Request) -> web.Response:
        self.archives[request.query["path"]] = await request.read()
        return web.Response(status=200)

    async def delete(self, request: web.Request) -> web.Response:
        self.containers.pop(request.match_info["id"], None)
        return web.Response(status=204)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[tuple[FakeEngine, str]]:
    fake = FakeEngine()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    sock = str(tmp_path / "engine.sock")
    await web.UnixSite(runner, sock).start()
    yield fake, sock
    await runner.cleanup()


async def test_containers_start_isolated_labelled_and_limited(engine: tuple[FakeEngine, str], tmp_path: Path):
    fake, sock = engine
    spec = SandboxSpec(
        image="python:3.12-slim",
        workdir="/work",
        env={"A": "1"},
        files={"/work/a.txt": "x"},
        metadata={"rollout": "r-7"},
        resources={"cpu": 1.5, "memory_mib": 512},
    )
    async with AsyncSandbox({"docker": {"socket": sock, "stack": "my_stack"}}, spec) as box:
        token = _current_rollout_id.set("r-9")  # as while serving /ng-rollout/r-9/seed_session
        try:
            await box.start()
        finally:
            _current_rollout_id.reset(token)
        ((name, body),) = fake.containers.items()
        assert body["Image"] == "python:3.12-slim" and "A=1" in body["Env"]
        assert body["NetworkDisabled"] is True and body["HostConfig"]["NetworkMode"] == "none"
        assert (
            body["HostConfig"]["CapDrop"] == ["ALL"]
            and "no-new-privileges" in body["HostConfig"]["SecurityOpt"]
        )
        assert (body["HostConfig"]["NanoCpus"], body["HostConfig"]["Memory"]) == (1_500_000_000, 512 << 20)
        assert body["Labels"] == {
            "rollout": "r-7",
            "nemo_gym.sandbox": name,
            "nemo_gym.sandbox.owner": LEDGER.owner_id,
            "nemo_gym.stack": "my_stack",
            "nemo_gym.rollout": "r-9",
        }
        with tarfile.open(fileobj=io.BytesIO(fake.archives["/work"])) as tar:
            assert tar.getnames() == ["a.txt"]
        result = await box.exec("echo hi", cwd="/work")
        assert (result.stdout, result.stderr, result.return_code) == ("out\n", "err\n", 3)
        assert list(fake.execs.values())[-1]["WorkingDir"] == "/work"  # one exec per command
        assert await box.status() is SandboxStatus.RUNNING
    assert fake.containers == {} and ("DELETE", f"/v1.41/containers/{name}?force=1&v=1") in fake.calls


async def test_the_sweep_removes_containers_of_dead_owners_only(engine: tuple[FakeEngine, str]):
    fake, sock = engine
    import socket as socket_module

    dead = f"{socket_module.gethostname()}-999999-1"
    fake.containers["orphan"] = {"Labels": {"nemo_gym.sandbox": "orphan", "nemo_gym.sandbox.owner": dead}}
    fake.containers["live"] = {
        "Labels": {"nemo_gym.sandbox": "live", "nemo_gym.sandbox.owner": LEDGER.owner_id}
    }
    fake.containers["other_host"] = {
        "Labels": {"nemo_gym.sandbox": "x", "nemo_gym.sandbox.owner": "elsewhere-1-1"}
    }
    provider = DockerProvider(socket=sock)
    assert await asyncio.to_thread(provider.sweep) == 1
    assert set(fake.containers) == {"live", "other_host"}
    await provider.aclose()


def test_the_attach_stream_is_split_into_stdout_and_stderr():
    assert demultiplex(frames(b"a" * 70000, b"b")) == (b"a" * 70000, b"b")
    assert demultiplex(b"plain tty output") == (b"plain tty output", b"")


async def test_nemo_gym_create_config_and_run_flags_reach_the_create_body(engine: tuple[FakeEngine, str]):
    from nemo_gym.sandbox.providers.docker import DockerCreateConfig

    fake, sock = engine
    create = DockerCreateConfig(
        network="eval_net",
        read_only=True,
        security_opt=["seccomp=unconfined"],
        pids_limit=64,
        apply_resource_limits=False,
        extra_run_args=[
            "-v",
            "/data/traj:/trajectories_mount",
            "--volume=/data/code:/code:ro",
            "--mount",
            "type=bind,source=/data/v,target=/logs/verifier,readonly",
            "-e",
            "MODE=eval",
            "--shm-size",
            "2g",
            "--tmpfs",
            "/run:size=64m",
            "--add-host",
            "judge:10.0.0.5",
        ],
    )
    provider = DockerProvider(socket=sock, create=create)
    assert provider._create_config is create
    spec = SandboxSpec(image="img", env={"A": "1"}, resources={"cpu": 2, "memory_mib": 512})
    async with AsyncSandbox(provider, spec) as box:
        await box.start()
        ((_, body),) = fake.containers.items()
    host = body["HostConfig"]
    assert host["NetworkMode"] == "eval_net" and body["NetworkDisabled"] is False
    assert host["Binds"] == [
        "/data/traj:/trajectories_mount",
        "/data/code:/code:ro",
        "/data/v:/logs/verifier:ro",
    ]
    assert body["Env"] == ["A=1", "MODE=eval"]
    assert host["ShmSize"] == 2 << 30 and host["Tmpfs"] == {"/run": "size=64m"}
    assert host["ExtraHosts"] == ["judge:10.0.0.5"] and host["ReadonlyRootfs"] is True
    assert host["SecurityOpt"] == ["no-new-privileges", "seccomp=unconfined"] and host["PidsLimit"] == 64
    assert "NanoCpus" not in host and "Memory" not in host
    assert host["CapDrop"] == ["ALL"]  # the cautious defaults stay


def test_create_config_refuses_what_it_cannot_honour():
    from nemo_gym.sandbox.providers.docker import DockerCreateConfig

    with pytest.raises(ValueError, match=r"'--privileged' in create.extra_run_args is not supported"):
        DockerProvider(create={"extra_run_args": ["--privileged"]})
    with pytest.raises(ValueError, match="only type=bind"):
        DockerCreateConfig(extra_run_args=["--mount", "type=volume,source=v,target=/v"])
    with pytest.raises(ValueError, match="needs a value"):
        DockerCreateConfig(extra_run_args=["-v"])
    with pytest.raises(ValueError, match="unknown docker create option"):
        DockerProvider(create={"extra_args": []})
    with pytest.raises(ValueError, match="publish_host"):
        DockerCreateConfig(publish_host="localhost")
    # Without a named network the cautious default holds: no network.
    assert DockerProvider(create=DockerCreateConfig())._network is False
