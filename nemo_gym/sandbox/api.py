"""``AsyncSandbox`` and ``Sandbox``: one sandbox, the same calls whatever the provider.

::

    async with AsyncSandbox({"local": {}}, SandboxSpec(workdir="/workspace")) as box:
        await box.start()
        result = await box.exec("python -c 'print(6 * 7)'")
        assert result.stdout == "42\\n"

``start`` creates the sandbox (and writes ``spec.files``); ``stop`` (or leaving ``async with``)
removes it. A started sandbox is also stopped at its ``ttl_s``, or at the rollout deadline
when it has none, and when its process ends (see :mod:`nemo_gym.sandbox.lifecycle`).
Abilities a provider lacks (endpoints, pause/resume, terminals, reconnecting) raise
``NotImplementedError`` naming the provider.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from nemo_gym.sandbox.providers import (
    ConnectableProvider,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxProvider,
    SandboxPtySession,
    SandboxPtySpec,
    SandboxSpec,
    SandboxStatus,
    SupportsSandboxBackgroundServices,
    SupportsSandboxEndpoint,
    SupportsSandboxPauseResume,
    SupportsSandboxPty,
    SupportsSandboxPtyAttach,
    create_provider,
)

T = TypeVar("T")
SYNC_OPERATION_TIMEOUT_S = 3600.0
DEFAULT_EXEC_TIMEOUT_S = 180


def _provider_name(provider: Any) -> str:
    return getattr(provider, "name", type(provider).__name__)


def _default_ttl_s() -> float:
    """No rollout lasts longer than the rollout deadline, so neither does its sandbox."""
    from nemo_gym.agents.agent_hops import rollout_timeout_s

    return rollout_timeout_s()


class SandboxPty:
    """``sandbox.pty``: interactive terminals, for providers that have them."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def create(
        self,
        command: str | None = None,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        rows: int = 24,
        cols: int = 80,
        user: str | int | None = None,
        pty: bool = True,
    ) -> SandboxPtySession:
        """Open a terminal running ``command`` (the shell when None)."""
        provider = self._sandbox._provider
        if not isinstance(provider, SupportsSandboxPty):
            raise NotImplementedError(
                f"Sandbox provider {_provider_name(provider)!r} does not support PTY sessions; use exec() instead"
            )
        spec = SandboxPtySpec(command, cwd or self._sandbox._workdir(), env, rows, cols, user, pty)
        return await provider.create_pty(self._sandbox._require_handle(), spec)

    async def attach(
        self, session_id: str, *, takeover: bool = True, since: int | None = None
    ) -> SandboxPtySession:
        """Re-attach to a terminal opened earlier (here or in another process)."""
        provider = self._sandbox._provider
        if not isinstance(provider, SupportsSandboxPtyAttach):
            raise NotImplementedError(
                f"Sandbox provider {_provider_name(provider)!r} does not support re-attaching PTY sessions"
            )
        return await provider.attach_pty(
            self._sandbox._require_handle(), session_id, takeover=takeover, since=since
        )

    async def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = 180,
    ) -> SandboxExecResult:
        """Run ``command`` in a fresh terminal and collect its output (one stream)."""
        session = await self.create(command, cwd=cwd, env=env)
        try:

            async def collect() -> tuple[bytes, int]:
                chunks = bytearray()
                while chunk := await session.read():
                    chunks.extend(chunk)
                return bytes(chunks), await session.wait_exit()

            output, code = await asyncio.wait_for(collect(), timeout_s)
        except TimeoutError:
            return SandboxExecResult(None, f"PTY command timed out after {timeout_s}s", 125, "timeout")
        finally:
            await session.close()
        return SandboxExecResult(output.decode(errors="replace"), None, code)


class AsyncSandbox:
    """One sandbox on a provider (a provider object, or a ``{name: config}`` mapping).

    With ``owns_provider=False`` the caller closes a provider it shares between sandboxes.
    """

    def __init__(
        self,
        provider: Mapping[str, Any] | SandboxProvider,
        spec: SandboxSpec | None = None,
        *,
        owns_provider: bool = True,
    ) -> None:
        self._provider: SandboxProvider = (
            create_provider(provider) if isinstance(provider, Mapping) else provider
        )
        self._owns_provider = owns_provider
        self._spec = spec
        self._handle: SandboxHandle | None = None
        self._stopped = True
        self._closed = False
        self._connected = False
        self._deadline: asyncio.TimerHandle | None = None
        self.pty = SandboxPty(self)

    @property
    def sandbox_id(self) -> str | None:
        """The provider's id of the started sandbox (None before start)."""
        return self._handle.sandbox_id if self._handle is not None else None

    def _require_handle(self) -> SandboxHandle:
        if self._handle is None or self._stopped:
            raise RuntimeError("Sandbox has not been started")
        return self._handle

    def _workdir(self) -> str | None:
        return self._spec.workdir if self._spec is not None else None

    async def start(self, spec: SandboxSpec | None = None) -> AsyncSandbox:
        """Create the sandbox from ``spec`` (or the one given at construction), write
        ``spec.files`` into it, and arm its deadline. If writing the files fails it is stopped."""
        if self._closed:
            raise RuntimeError("Sandbox has been stopped")
        if self._handle is not None and not self._stopped:
            raise RuntimeError("Sandbox is already started")
        spec = spec if spec is not None else self._spec
        if spec is None:
            raise ValueError("Sandbox.start() requires a SandboxSpec")
        self._handle = await self._provider.create(spec)
        self._spec = spec
        self._stopped = False
        try:
            if spec.files:
                with tempfile.TemporaryDirectory(prefix="nemo_gym_sandbox_upload_") as tmp:
                    for index, (target, text) in enumerate(spec.files.items()):
                        source = Path(tmp, f"file-{index}")
                        source.write_text(text, encoding="utf-8")
                        await self._provider.upload_file(self._handle, source, target)
            ttl = float(spec.ttl_s) if spec.ttl_s else _default_ttl_s()
            self._deadline = asyncio.get_running_loop().call_later(ttl, self._on_deadline)
        except BaseException:
            await self.stop()
            raise
        return self

    def _on_deadline(self) -> None:
        self._deadline = None
        task = asyncio.ensure_future(self.stop())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def start_with_setup(
        self, spec: SandboxSpec | None, setup: Callable[[AsyncSandbox], Awaitable[None]]
    ) -> AsyncSandbox:
        """``start`` then ``await setup(self)``; a failing setup stops the sandbox and re-raises."""
        await self.start(spec)
        try:
            await setup(self)
        except BaseException:
            await self.stop()
            raise
        return self

    async def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = DEFAULT_EXEC_TIMEOUT_S,
        user: str | int | None = None,
        preserve_background_services: bool = False,
    ) -> SandboxExecResult:
        """Run a shell command (in ``cwd``, default the spec's workdir) and return its result.
        ``preserve_background_services`` uses the provider's way of letting services started by
        the command outlive it, where it has one (then without ``env``/``user``)."""
        handle = self._require_handle()
        cwd = cwd if cwd is not None else self._workdir()
        provider = self._provider
        if preserve_background_services and isinstance(provider, SupportsSandboxBackgroundServices):
            if env is not None or user is not None:
                raise ValueError(
                    "Service-preserving execution does not support per-command env or user overrides"
                )
            return await provider.exec_with_background_services(handle, command, cwd=cwd, timeout_s=timeout_s)
        return await provider.exec(handle, command, cwd=cwd, env=env, timeout_s=timeout_s, user=user)

    async def upload(self, local_path: Path | str, remote_path: str) -> None:
        """Copy a local file into the sandbox."""
        await self._provider.upload_file(self._require_handle(), Path(local_path), remote_path)

    async def download(self, remote_path: str, local_path: Path | str) -> None:
        """Copy a file out of the sandbox."""
        await self._provider.download_file(self._require_handle(), remote_path, Path(local_path))

    async def status(self) -> SandboxStatus:
        """UNKNOWN before start, STOPPED after stop, else what the provider reports."""
        if self._handle is None:
            return SandboxStatus.UNKNOWN
        if self._stopped:
            return SandboxStatus.STOPPED
        return await self._provider.status(self._handle)

    async def endpoint(self, port: int) -> SandboxEndpoint:
        """The URL (and headers) of service ``port``, which the spec must have declared."""
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"Sandbox endpoint port must be an integer between 1 and 65535, got {port!r}")
        declared = self._spec.ports if self._spec is not None else ()
        if port not in declared:
            raise ValueError(
                f"Sandbox port {port} was not declared in SandboxSpec.ports; declared ports: {list(declared)!r}"
            )
        if not isinstance(self._provider, SupportsSandboxEndpoint):
            raise NotImplementedError(
                f"Sandbox provider {_provider_name(self._provider)!r} does not support service endpoints"
            )
        resolved = await self._provider.endpoint(self._require_handle(), port)
        if not isinstance(resolved, SandboxEndpoint):
            raise TypeError(
                f"Sandbox provider endpoint() must return SandboxEndpoint, got {type(resolved).__name__}"
            )
        return resolved

    def _pause_resume_provider(self) -> SupportsSandboxPauseResume:
        """The provider, when it can pause and resume (the sandbox must be started)."""
        self._require_handle()
        if not isinstance(self._provider, SupportsSandboxPauseResume):
            raise NotImplementedError(
                f"Sandbox provider {_provider_name(self._provider)!r} does not support pause/resume"
            )
        return self._provider

    async def pause(self) -> None:
        """Pause the sandbox, keeping its state (providers with pause/resume)."""
        await self._pause_resume_provider().pause(self._require_handle())

    async def resume(self) -> None:
        """Resume a paused sandbox."""
        await self._pause_resume_provider().resume(self._require_handle())

    async def stop(self) -> None:
        """Remove the sandbox (idempotent). A failed provider stop may be retried: the sandbox
        is marked stopped only once the provider has removed it."""
        if self._closed:
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._handle is not None and not self._stopped:
            await self._provider.close(self._handle)
            self._stopped = True
        if self._owns_provider:
            await self._provider.aclose()
        self._closed = True

    async def disconnect(self) -> None:
        """Let go of a sandbox rebuilt with :meth:`connect` without stopping it (its owner will)."""
        if self._closed:
            return
        if not self._connected:
            raise RuntimeError("disconnect() is valid only for a sandbox rebuilt with connect()")
        if self._owns_provider:
            await self._provider.aclose()
        self._handle, self._stopped, self._closed = None, True, True

    async def serialize(self, *, scope: str | None = None) -> dict[str, Any]:
        """A JSON descriptor from which another process can :meth:`connect` to this sandbox."""
        provider = self._provider
        if not isinstance(provider, ConnectableProvider):
            raise RuntimeError(
                f"provider {_provider_name(provider)!r} does not support serialize()/connect()"
            )
        descriptor = dict(await provider.serialize_handle(self._require_handle(), scope=scope))
        if descriptor.get("workdir") is None and self._spec is not None:
            descriptor["workdir"] = self._spec.workdir
        if self._spec is not None and self._spec.ports:
            descriptor["ports"] = list(self._spec.ports)
        return descriptor

    @classmethod
    async def connect(
        cls, descriptor: Mapping[str, Any] | Any, *, provider: SandboxProvider, owns_provider: bool = True
    ) -> AsyncSandbox:
        """Rebuild a sandbox from :meth:`serialize`'s descriptor, on ``provider``."""
        if not isinstance(provider, ConnectableProvider):
            raise RuntimeError(
                f"provider {_provider_name(provider)!r} does not support serialize()/connect()"
            )
        if not isinstance(descriptor, Mapping) and hasattr(descriptor, "to_dict"):
            descriptor = descriptor.to_dict()
        handle = await provider.connect(descriptor)
        spec = SandboxSpec(workdir=descriptor.get("workdir"), ports=descriptor.get("ports", ()))
        sandbox = cls(provider, spec, owns_provider=owns_provider)
        sandbox._handle, sandbox._stopped, sandbox._connected = handle, False, True
        return sandbox

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        await self.stop()


class _LoopThread:
    """An event loop on a daemon thread, for the blocking :class:`Sandbox`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, name="nemo-gym-sandbox-loop", daemon=True)
        self.thread.start()
        ready.wait()

    def run(self, operation: str, make: Callable[[], Awaitable[T]]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(f"Sandbox.{operation}() blocks; use AsyncSandbox in async code instead.")
        if self.loop.is_closed():
            raise RuntimeError("Sandbox sync loop is closed")

        async def call() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(call(), self.loop)
        try:
            return future.result(timeout=SYNC_OPERATION_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"Sandbox.{operation}() timed out after {SYNC_OPERATION_TIMEOUT_S:g}s"
            ) from None

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5.0)
            if not self.thread.is_alive():
                self.loop.close()


class Sandbox:
    """The blocking twin of :class:`AsyncSandbox` (for scripts and synchronous code); it runs
    its own event loop on a thread. ``pty``, ``serialize`` and ``connect`` are async-only."""

    def __init__(
        self, provider: Mapping[str, Any] | SandboxProvider, spec: SandboxSpec | None = None
    ) -> None:
        self._runner = _LoopThread()
        self._closed = False

        async def build() -> AsyncSandbox:
            return AsyncSandbox(provider, spec)

        try:
            self._async_sandbox = self._runner.run("__init__", build)
        except BaseException:
            self._runner.close()
            raise

    def start(self, spec: SandboxSpec | None = None) -> Sandbox:
        """See :meth:`AsyncSandbox.start`."""
        self._runner.run("start", lambda: self._async_sandbox.start(spec))
        return self

    def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = DEFAULT_EXEC_TIMEOUT_S,
        user: str | int | None = None,
        preserve_background_services: bool = False,
    ) -> SandboxExecResult:
        """See :meth:`AsyncSandbox.exec`."""
        return self._runner.run(
            "exec",
            lambda: self._async_sandbox.exec(
                command,
                cwd=cwd,
                env=env,
                timeout_s=timeout_s,
                user=user,
                preserve_background_services=preserve_background_services,
            ),
        )

    def upload(self, local_path: Path | str, remote_path: str) -> None:
        """See :meth:`AsyncSandbox.upload`."""
        self._runner.run("upload", lambda: self._async_sandbox.upload(local_path, remote_path))

    def download(self, remote_path: str, local_path: Path | str) -> None:
        """See :meth:`AsyncSandbox.download`."""
        self._runner.run("download", lambda: self._async_sandbox.download(remote_path, local_path))

    def status(self) -> SandboxStatus:
        """See :meth:`AsyncSandbox.status`."""
        if self._closed:
            return SandboxStatus.STOPPED
        return self._runner.run("status", self._async_sandbox.status)

    def endpoint(self, port: int) -> SandboxEndpoint:
        """See :meth:`AsyncSandbox.endpoint`."""
        return self._runner.run("endpoint", lambda: self._async_sandbox.endpoint(port))

    def pause(self) -> None:
        """See :meth:`AsyncSandbox.pause`."""
        self._runner.run("pause", self._async_sandbox.pause)

    def resume(self) -> None:
        """See :meth:`AsyncSandbox.resume`."""
        self._runner.run("resume", self._async_sandbox.resume)

    def stop(self) -> None:
        """See :meth:`AsyncSandbox.stop`; also ends the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run("stop", self._async_sandbox.stop)
        finally:
            self._runner.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self.stop()
