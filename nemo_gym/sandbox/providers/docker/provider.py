"""The ``docker`` and ``podman`` providers: one container per sandbox, through the engine's API.

Each sandbox is a container of ``SandboxSpec.image`` kept alive by a sleeping shell; commands run
with the engine's exec API. Defaults are the cautious ones: **no network** (``NetworkMode:
none``) unless the provider config or ``provider_options`` ask for it, every capability dropped
except a small set a shell needs, ``no-new-privileges``, a process limit, and the spec's CPU and
memory limits (``NanoCpus``, ``Memory``). Every container carries labels naming the sandbox, the
owning process (for the sweep after a crash), the stack (``NEMO_GYM_STACK`` or ``stack``) and
the rollout being served (``nemo_gym.rollout``, from the request's ``/ng-rollout/<id>`` prefix)
and the spec's metadata.

Config (``docker:`` block): ``socket`` (default ``DOCKER_HOST`` or the usual paths),
``network`` (false), ``default_image`` (``python:3.12-slim``), ``pull`` (``missing``),
``default_timeout_s`` (180), ``pids_limit`` (512), ``stack``, ``cap_add`` ([]), ``shell``
(``/bin/sh``). NeMo Gym's ``create:`` section is a
:class:`~nemo_gym.sandbox.providers.docker.create_config.DockerCreateConfig` (network, init,
read-only root, capabilities, security options, pids limit, resource limits, published-port host,
keep-alive command, start deadline, and ``docker run`` flags translated to the API); of ``exec:``
``default_timeout_s`` is read; ``probe:`` is accepted and ignored.
"""

from __future__ import annotations

import asyncio
import io
import os
import posixpath
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.lifecycle import LEDGER, current_rollout_id, owner_alive
from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)
from nemo_gym.sandbox.providers.docker.create_config import (
    DEFAULT_KEEPALIVE_CMD,
    DEFAULT_KEEPALIVE_SHELL,
    DockerCreateConfig,
    apply_create_config,
)
from nemo_gym.sandbox.providers.docker.engine import (
    Engine,
    EngineError,
    delete_container_sync,
    list_containers_sync,
    socket_path,
)

SANDBOX_RUNTIME_RETURN_CODE = 125
LABEL = "nemo_gym.sandbox"
OWNER_LABEL = "nemo_gym.sandbox.owner"
STACK_LABEL = "nemo_gym.stack"
ROLLOUT_LABEL = "nemo_gym.rollout"
KEEPALIVE = DEFAULT_KEEPALIVE_CMD
# What a shell and package managers inside need; everything else (net admin, mknod, raw sockets,
# ptrace of the host's tools, ...) stays dropped.
DEFAULT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETGID", "SETUID", "KILL")
_STATES = {
    "created": SandboxStatus.STARTING,
    "restarting": SandboxStatus.STARTING,
    "running": SandboxStatus.RUNNING,
    "paused": SandboxStatus.PAUSED,
    "exited": SandboxStatus.STOPPED,
    "removing": SandboxStatus.STOPPED,
    "dead": SandboxStatus.ERROR,
}


class DockerProvider:
    """Containers through the Docker Engine API (see the module docstring)."""

    name = "docker"
    podman = False

    def __init__(
        self,
        socket: str | None = None,
        *,
        network: bool = False,
        default_image: str = "python:3.12-slim",
        pull: str = "missing",
        default_timeout_s: float = 180.0,
        pids_limit: int = 512,
        stack: str | None = None,
        cap_add: list[str] | tuple[str, ...] = (),
        shell: str = "/bin/sh",
        create: DockerCreateConfig | dict[str, Any] | None = None,
        exec: dict[str, Any] | None = None,  # noqa: A002 - NeMo Gym's config key
        probe: dict[str, Any] | None = None,
    ) -> None:
        self._create_config = DockerCreateConfig.coerce(create)
        named = self._create_config.network
        if pull not in ("missing", "always", "never"):
            raise ValueError(f"docker pull must be 'missing', 'always' or 'never', got {pull!r}")
        self._socket = socket_path(socket, podman=self.podman)
        self._engine = Engine(self._socket)
        self._network = bool(network or named not in (None, "none"))
        # A named Docker network (NeMo Gym's create.network), else the default bridge.
        self._network_mode = named if named not in (None, "none") else "bridge"
        self._default_image = default_image
        self._pull = pull
        self._default_timeout_s = float((exec or {}).get("default_timeout_s", default_timeout_s))
        self._pids_limit = int(self._create_config.pids_limit or pids_limit)
        self._stack = stack or os.environ.get("NEMO_GYM_STACK") or "nemo_gym"
        self._caps = sorted({*DEFAULT_CAPS, *cap_add})
        self._shell = shell
        keepalive_shell = self._create_config.keepalive_shell
        self._keepalive = (
            shell if keepalive_shell == DEFAULT_KEEPALIVE_SHELL else keepalive_shell,
            self._create_config.keepalive_cmd,
        )
        self._swept = False
        LEDGER.register_reaper(self.name, _reap_container)

    # ---- lifecycle ---------------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Create and start a container; returns once it runs."""
        if not self._swept:
            self._swept = True
            await asyncio.to_thread(self.sweep)
            # Dead owners' records of containers (and of anything else this process can reap).
            await asyncio.to_thread(LEDGER.sweep, force=True)
        resources = spec.resources if isinstance(spec.resources, SandboxResources) else SandboxResources()
        network = bool((spec.provider_options or {}).get("network", self._network))
        image = spec.image or self._default_image
        sandbox_id = f"{self.name}-{uuid.uuid4().hex[:12]}"
        host_config: dict[str, Any] = {
            "NetworkMode": self._network_mode if network else "none",
            "Init": True,
            "CapDrop": ["ALL"],
            "CapAdd": self._caps,
            "SecurityOpt": ["no-new-privileges"],
            "PidsLimit": self._pids_limit,
        }
        if resources.cpu:
            host_config["NanoCpus"] = int(resources.cpu * 1e9)
        if resources.memory_mib:
            host_config["Memory"] = resources.memory_mib * 1024 * 1024
        if resources.gpu:
            host_config["DeviceRequests"] = [
                {"Driver": "nvidia", "Count": resources.gpu, "Capabilities": [["gpu"]]}
            ]
        if spec.ports:
            if not network:
                raise SandboxCreateError("a sandbox that serves ports needs network: true")
            host_config["PortBindings"] = {
                f"{p}/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}] for p in spec.ports
            }
        body: dict[str, Any] = {
            "Image": image,
            "Entrypoint": spec.entrypoint or [self._keepalive[0], "-c"],
            "Cmd": None if spec.entrypoint else [self._keepalive[1]],
            "Env": [f"{k}={v}" for k, v in spec.env.items()],
            "WorkingDir": spec.workdir or "",
            "Labels": {
                **{str(k): str(v) for k, v in spec.metadata.items()},
                LABEL: sandbox_id,
                OWNER_LABEL: LEDGER.owner_id,
                STACK_LABEL: self._stack,
                **({ROLLOUT_LABEL: rollout} if (rollout := current_rollout_id()) else {}),
            },
            "NetworkDisabled": not network,
            "ExposedPorts": {f"{p}/tcp": {} for p in spec.ports},
            "HostConfig": host_config,
        }
        apply_create_config(body, self._create_config)
        # A --network flag among the run args turns the network on as the flag says.
        network = host_config["NetworkMode"] != "none"
        body["NetworkDisabled"] = not network
        LEDGER.record(sandbox_id, self.name, socket=self._socket, container=sandbox_id)
        try:
            async with asyncio.timeout(self._create_config.start_timeout_s):
                await self._create_container(sandbox_id, image, body)
                await self._engine.request("POST", f"/containers/{sandbox_id}/start")
            if spec.workdir:
                await self._run(sandbox_id, ["mkdir", "-p", spec.workdir], None, None, 60)
        except BaseException as exc:
            await self._remove(sandbox_id)
            if isinstance(exc, EngineError):
                raise SandboxCreateError(
                    f"could not start a {self.name} sandbox from {image!r}: {exc}"
                ) from exc
            raise
        return SandboxHandle(sandbox_id=sandbox_id, provider_name=self.name, raw={"network": network})

    async def _create_container(self, name: str, image: str, body: dict[str, Any]) -> None:
        if self._pull == "always":
            await self._pull_image(image)
        try:
            await self._engine.request("POST", "/containers/create", params={"name": name}, body=body)
        except EngineError as exc:
            if exc.status != 404 or self._pull == "never":
                raise
            await self._pull_image(image)
            await self._engine.request("POST", "/containers/create", params={"name": name}, body=body)

    async def _pull_image(self, image: str) -> None:
        name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
        await self._engine.request(
            "POST", "/images/create", params={"fromImage": name, "tag": tag or "latest"}
        )

    async def close(self, handle: SandboxHandle) -> None:
        """Force-remove the container."""
        await self._remove(handle.sandbox_id)

    async def _remove(self, sandbox_id: str) -> None:
        await self._engine.request(
            "DELETE", f"/containers/{sandbox_id}", params={"force": 1, "v": 1}, ok=(204, 404)
        )
        LEDGER.forget(sandbox_id)

    async def aclose(self) -> None:
        """Close the engine connection."""
        await self._engine.close()

    def sweep(self) -> int:
        """Remove labelled containers whose owning process (on this host) is gone; the count."""
        try:
            containers = list_containers_sync(self._socket, LABEL)
        except (OSError, EngineError):
            return 0
        removed = 0
        for container in containers:
            owner = (container.get("Labels") or {}).get(OWNER_LABEL, "")
            if owner and not owner_alive(owner):
                delete_container_sync(self._socket, container["Id"])
                removed += 1
        LEDGER.add_swept(removed)
        return removed

    # ---- commands and files ------------------------------------------------------------------
    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        """Run ``shell -c command``; past the deadline its process group is killed."""
        timeout = float(timeout_s if timeout_s is not None else self._default_timeout_s)
        # The shell notes its pid, so that a deadline can kill it (and the group it leads).
        pid_file = f"/tmp/.nemo_gym_exec_{uuid.uuid4().hex[:12]}"
        # An image may lack /tmp (a bare root file system): made if it can be, silent otherwise.
        # The outer shell removes its pid file itself (no second exec round trip per command).
        note = f"{{ [ -d /tmp ] || mkdir -p /tmp; echo $$ > {pid_file}; }} 2>/dev/null"
        script = f'{note}; {self._shell} -c "$0"; rc=$?; rm -f {pid_file}; exit $rc'
        argv = [self._shell, "-c", script, command]
        result = await self._run(handle.sandbox_id, argv, cwd, env, timeout, user, pid_file, cleanup=False)
        return result

    async def _run(
        self,
        container: str,
        argv: list[str],
        cwd: str | None,
        env: dict[str, str] | None,
        timeout: float,
        user: str | int | None = None,
        pid_file: str | None = None,
        cleanup: bool = True,
    ) -> SandboxExecResult:
        body: dict[str, Any] = {"AttachStdout": True, "AttachStderr": True, "Cmd": argv}
        if cwd:
            body["WorkingDir"] = cwd
        if env:
            body["Env"] = [f"{k}={v}" for k, v in env.items()]
        if user is not None:
            body["User"] = str(user)
        created = await self._engine.request("POST", f"/containers/{container}/exec", body=body)
        exec_id = created["Id"]
        try:
            stdout, stderr = await asyncio.wait_for(self._engine.exec_stream(exec_id), timeout)
        except TimeoutError:
            if pid_file is not None:
                kill = f"p=$(cat {pid_file}); kill -9 -- -$p 2>/dev/null || kill -9 $p; rm -f {pid_file}"
                await self._run(container, ["/bin/sh", "-c", kill], None, None, 30)
            return SandboxExecResult(
                None,
                f"{self.name} command timed out after {timeout:g}s",
                SANDBOX_RUNTIME_RETURN_CODE,
                "timeout",
            )
        info = await self._engine.request("GET", f"/exec/{exec_id}/json")
        code = info.get("ExitCode")
        if pid_file is not None and cleanup:
            await self._run(container, ["rm", "-f", pid_file], None, None, 30)
        return SandboxExecResult(
            stdout.decode(errors="replace"),
            stderr.decode(errors="replace"),
            int(code) if code is not None else SANDBOX_RUNTIME_RETURN_CODE,
            None if code is not None else "runtime",
        )

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """Put one file into the container (as a one-member tar archive; parents created)."""
        target = posixpath.normpath(target_path)
        directory, name = posixpath.split(target)
        if directory and directory != "/":
            await self._run(handle.sandbox_id, ["mkdir", "-p", directory], None, None, 60)
        data = Path(source_path).read_bytes()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
        await self._engine.request(
            "PUT",
            f"/containers/{handle.sandbox_id}/archive",
            params={"path": directory or "."},
            data=buffer.getvalue(),
        )

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        """Copy one regular file out (a symlink or a directory is refused)."""
        payload = await self._engine.request(
            "GET", f"/containers/{handle.sandbox_id}/archive", params={"path": source_path}, raw=True
        )
        with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise PermissionError(f"{source_path!r} in the sandbox is not a regular file")
            extracted = tar.extractfile(member)
            assert extracted is not None
            target_path.parent.mkdir(parents=True, exist_ok=True)
            target_path.write_bytes(extracted.read())

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """The container's state in the provider-neutral words."""
        try:
            info = await self._engine.request("GET", f"/containers/{handle.sandbox_id}/json")
        except EngineError as exc:
            if exc.status == 404:
                return SandboxStatus.STOPPED
            raise
        return _STATES.get(str(info.get("State", {}).get("Status")), SandboxStatus.UNKNOWN)

    async def pause(self, handle: SandboxHandle) -> None:
        """Freeze every process of the container."""
        await self._engine.request("POST", f"/containers/{handle.sandbox_id}/pause")

    async def resume(self, handle: SandboxHandle) -> None:
        """Thaw the container."""
        await self._engine.request("POST", f"/containers/{handle.sandbox_id}/unpause")

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """The loopback address the engine published ``port`` on."""
        info = await self._engine.request("GET", f"/containers/{handle.sandbox_id}/json")
        bindings = ((info.get("NetworkSettings") or {}).get("Ports") or {}).get(f"{port}/tcp") or []
        if not bindings:
            raise ValueError(f"port {port} of sandbox {handle.sandbox_id} is not published")
        return SandboxEndpoint(f"http://127.0.0.1:{bindings[0]['HostPort']}")


class PodmanProvider(DockerProvider):
    """The same provider against Podman's Docker-compatible API (``podman system service``)."""

    name = "podman"
    podman = True


def _reap_container(record: dict[str, Any]) -> None:
    """Remove a recorded container synchronously (at exit, in a sweep). An engine that is not
    there any more drops the record: its labels let the next sweep find the container."""
    try:
        delete_container_sync(record["socket"], record["container"])
    except (FileNotFoundError, ConnectionRefusedError):
        return
