"""What a sandbox provider implements, and the values that cross the API (NeMo Gym's names).

A provider is any object with ``name`` and the async methods of :class:`SandboxProvider`
(``create``, ``exec``, ``upload_file``, ``download_file``, ``status``, ``close``, ``aclose``).
Optional abilities are separate ``runtime_checkable`` protocols (``SupportsSandboxEndpoint``,
``SupportsSandboxPauseResume``, ...): :class:`~nemo_gym.sandbox.AsyncSandbox` checks them with
``isinstance`` and answers ``NotImplementedError`` naming the provider when one is missing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit


class SandboxStatus(StrEnum):
    """Where a sandbox is in its life, the same words for every provider."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    ERROR = "error"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SandboxEndpoint:
    """How a caller reaches a service port inside a sandbox: an absolute URL plus any headers
    the provider needs on every request."""

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        url = self.endpoint.strip() if isinstance(self.endpoint, str) else ""
        parts = urlsplit(url)
        if not parts.scheme or not parts.netloc:
            raise ValueError(f"sandbox endpoint must be an absolute URL, got {self.endpoint!r}")
        if not isinstance(self.headers, Mapping):
            raise TypeError("sandbox endpoint headers must be a mapping")
        object.__setattr__(self, "endpoint", url)
        object.__setattr__(self, "headers", {str(k): str(v) for k, v in self.headers.items()})


def _optional(kind: type, value: Any) -> Any:
    return None if value is None else kind(value)


@dataclass(frozen=True)
class SandboxResources:
    """Resources asked for: ``cpu`` cores, ``memory_mib``, ``disk_gib``, ``gpu`` count and type.
    ``None`` leaves the provider's default."""

    cpu: float | None = None
    memory_mib: int | None = None
    disk_gib: int | None = None
    gpu: int | None = None
    gpu_type: str | None = None

    @classmethod
    def from_mapping(cls, resources: Mapping[str, Any] | None) -> SandboxResources:
        """Build from a config mapping; unknown keys are an error that lists the known ones."""
        if resources is None:
            return cls()
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(resources) - known)
        if unknown:
            raise ValueError(
                f"Unknown sandbox resource keys: {', '.join(unknown)}. Expected keys: {', '.join(sorted(known))}"
            )
        return cls(
            cpu=_optional(float, resources.get("cpu")),
            memory_mib=_optional(int, resources.get("memory_mib")),
            disk_gib=_optional(int, resources.get("disk_gib")),
            gpu=_optional(int, resources.get("gpu")),
            gpu_type=_optional(str, resources.get("gpu_type")),
        )


def _tcp_port(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError(f"Invalid sandbox TCP port: {raw!r}")
    try:
        port = int(raw)
    except ValueError as exc:
        raise ValueError(f"Invalid sandbox TCP port: {raw!r}") from exc
    if not 1 <= port <= 65535:
        raise ValueError(f"Sandbox TCP port must be between 1 and 65535, got {port}")
    return port


@dataclass(frozen=True)
class SandboxSpec:
    """What to start: image, lifetime (``ttl_s``), working directory, environment, files written
    at start (path → text), metadata (labels), resources, entrypoint, provider-specific
    options and the service ports that :meth:`~nemo_gym.sandbox.AsyncSandbox.endpoint` may
    resolve. ``resources`` may be a mapping; it becomes :class:`SandboxResources`."""

    image: str | None = None
    ttl_s: int | float | None = None
    ready_timeout_s: int | float | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    resources: SandboxResources | Mapping[str, Any] = field(default_factory=SandboxResources)
    entrypoint: list[str] | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    ports: tuple[int, ...] | list[int] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.resources, SandboxResources):
            object.__setattr__(self, "resources", SandboxResources.from_mapping(self.resources))
        if not isinstance(self.ports, (list, tuple)):
            raise TypeError("Sandbox ports must be a list or tuple of TCP port numbers")
        ports: list[int] = []
        for raw in self.ports:
            port = _tcp_port(raw)
            if port in ports:
                raise ValueError(f"Duplicate sandbox TCP port: {port}")
            ports.append(port)
        object.__setattr__(self, "ports", tuple(ports))


@dataclass
class SandboxHandle:
    """A started sandbox as the provider knows it. ``raw`` belongs to the provider: callers pass
    the handle back and never look inside."""

    sandbox_id: str
    provider_name: str
    raw: Any


@dataclass(frozen=True)
class SandboxExecResult:
    """The result of one command. ``return_code`` is the command's exit status when it ran;
    when the sandbox failed to run it (timeout, runtime error) providers set ``error_type``
    and a non-process code (125)."""

    stdout: str | None
    stderr: str | None
    return_code: int
    error_type: str | None = None


ExecResult = SandboxExecResult


@dataclass(frozen=True)
class SandboxPtySpec:
    """An interactive terminal request (providers with ``SupportsSandboxPty``)."""

    command: str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    rows: int = 24
    cols: int = 80
    user: str | int | None = None
    pty: bool = True


class SandboxPtyError(RuntimeError):
    """A terminal session failed other than by its process exiting."""


class SandboxCreateError(RuntimeError):
    """A provider could not create a sandbox."""


class SandboxCreateVerificationError(SandboxCreateError):
    """A new sandbox did not pass the provider's readiness check."""


class SandboxProvider(Protocol):
    """The contract every provider keeps."""

    name: str

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Start a sandbox and return once it can run commands and take files; raise
        :class:`SandboxCreateError` when it cannot."""
        ...

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
        """Run a shell command in the sandbox."""
        ...

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """Copy one local file into the sandbox."""
        ...

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        """Copy one file out of the sandbox."""
        ...

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """The sandbox's current status."""
        ...

    async def close(self, handle: SandboxHandle) -> None:
        """Stop the sandbox and free what it holds."""
        ...

    async def aclose(self) -> None:
        """Free what the provider itself holds (clients, connections)."""
        ...


@runtime_checkable
class SupportsSandboxBackgroundServices(Protocol):
    """Runs a command so that services it starts outlive it."""

    async def exec_with_background_services(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        timeout_s: int | float | None = None,
    ) -> SandboxExecResult: ...


@runtime_checkable
class SupportsSandboxNetwork(Protocol):
    """Sandboxes that reach each other directly."""

    def validate_networking(self) -> None: ...

    async def network_address(self, handle: SandboxHandle) -> str: ...

    async def set_hosts(self, handle: SandboxHandle, hosts: Mapping[str, str]) -> None: ...


@runtime_checkable
class SupportsSandboxRuntimeRequirements(Protocol):
    """Checks and applies task-declared runtime needs (capabilities, shared memory)."""

    def validate_runtime_requirements(
        self, *, cap_add: tuple[str, ...], shm_size: int | None
    ) -> dict[str, str] | None: ...

    async def configure_runtime(
        self, handle: SandboxHandle, *, cap_add: tuple[str, ...], shm_size: int | None
    ) -> None: ...


@runtime_checkable
class SupportsSandboxPortForwarding(Protocol):
    """Forwards loopback TCP ports into a sandbox until cancelled."""

    def validate_port_forwarding(self) -> None: ...

    async def forward_ports(
        self, handle: SandboxHandle, target_address: str, ports: tuple[int, ...], *, ready_file: str
    ) -> None: ...


@runtime_checkable
class SupportsSandboxSharedStorage(Protocol):
    """A shared file system the operator's provider config sets up."""

    def shared_volume_options(
        self, source: str | None, target: str, *, read_only: bool = False
    ) -> dict[str, Any]: ...

    def shared_volume_metadata(self) -> dict[str, str]: ...


@runtime_checkable
class SupportsSandboxEndpoint(Protocol):
    """Resolves a declared service port to a URL the caller can reach."""

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint: ...


@runtime_checkable
class SupportsSandboxPauseResume(Protocol):
    """Pauses a sandbox and resumes it with its state."""

    async def pause(self, handle: SandboxHandle) -> None: ...

    async def resume(self, handle: SandboxHandle) -> None: ...


@runtime_checkable
class SandboxPtySession(Protocol):
    """One live terminal (an async context manager; leaving it closes the session)."""

    session_id: str
    mode: str | None

    @property
    def closed(self) -> bool: ...

    async def read(self, *, timeout_s: float | None = None) -> bytes: ...

    async def read_stderr(self, *, timeout_s: float | None = None) -> bytes: ...

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def write(self, data: bytes) -> None: ...

    async def resize(self, rows: int, cols: int) -> None: ...

    async def send_signal(self, signal: str) -> None: ...

    async def wait_exit(self, *, timeout_s: float | None = None) -> int: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> SandboxPtySession: ...

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None: ...


@runtime_checkable
class SupportsSandboxPty(Protocol):
    """Opens interactive terminals."""

    async def create_pty(self, handle: SandboxHandle, spec: SandboxPtySpec) -> SandboxPtySession: ...


@runtime_checkable
class SupportsSandboxPtyAttach(Protocol):
    """Re-attaches to a terminal by id."""

    async def attach_pty(
        self, handle: SandboxHandle, session_id: str, *, takeover: bool = True, since: int | None = None
    ) -> SandboxPtySession: ...


@runtime_checkable
class ConnectableProvider(Protocol):
    """Rebuilds a handle in another process from a JSON descriptor."""

    async def serialize_handle(
        self, handle: SandboxHandle, *, scope: str | None = None
    ) -> dict[str, Any]: ...

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle: ...
