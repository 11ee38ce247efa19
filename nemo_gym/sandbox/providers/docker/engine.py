"""A small client for the Docker Engine HTTP API (Podman serves the same API) over a unix socket.

Async calls go through aiohttp's unix connector; :func:`delete_container_sync` uses only the
standard library, for the sweep and exit paths where no event loop runs. Errors become
:class:`EngineError` with the engine's own message and the HTTP status.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import struct
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

API_PREFIX = "/v1.41"  # every engine since Docker 20.10 and Podman 3 answers it
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock")


class EngineError(RuntimeError):
    """The engine answered an error (``status`` is the HTTP status) or could not be reached (0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(
            f"container engine: {message} (HTTP {status})" if status else f"container engine: {message}"
        )
        self.status = status


def socket_path(configured: str | None = None, *, podman: bool = False) -> str:
    """The engine's socket: the configured path, ``DOCKER_HOST`` (``unix://`` only), the rootless
    Podman socket of this user, or the usual system paths (the first that exists)."""
    if configured:
        return configured.removeprefix("unix://")
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        return host.removeprefix("unix://")
    candidates = list(DEFAULT_SOCKETS)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if podman:
        candidates = ["/run/podman/podman.sock"]
        if runtime:
            candidates.insert(0, f"{runtime}/podman/podman.sock")
    for candidate in candidates:
        if os.path.exists(candidate):
            return candidate
    return candidates[0]


class Engine:
    """Async Docker Engine API calls on one unix socket (one aiohttp session, opened on first use)."""

    def __init__(self, socket_file: str, timeout_s: float = 600.0) -> None:
        self.socket_file = socket_file
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.socket_file), timeout=self._timeout
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        data: bytes | None = None,
        ok: tuple[int, ...] = (200, 201, 204, 304),
        raw: bool = False,
    ) -> Any:
        """Call ``path`` (without the version prefix); JSON answers are decoded, ``raw`` gives bytes."""
        url = "http://engine" + API_PREFIX + path + (f"?{urlencode(params)}" if params else "")
        headers = {"Content-Type": "application/x-tar"} if data is not None else {}
        try:
            async with self._client().request(
                method, url, json=body if data is None else None, data=data, headers=headers
            ) as resp:
                payload = await resp.read()
                if resp.status not in ok:
                    raise EngineError(resp.status, _message(payload))
                if raw:
                    return payload
                if payload and resp.content_type == "application/json":
                    return json.loads(payload)
                return payload
        except aiohttp.ClientConnectionError as exc:
            raise EngineError(0, f"cannot reach the engine at {self.socket_file}: {exc}") from exc

    async def exec_stream(self, exec_id: str) -> tuple[bytes, bytes]:
        """Start an exec attached and split its multiplexed stream into stdout and stderr."""
        payload = await self.request(
            "POST", f"/exec/{exec_id}/start", body={"Detach": False, "Tty": False}, raw=True
        )
        return demultiplex(payload)

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def demultiplex(payload: bytes) -> tuple[bytes, bytes]:
    """Split Docker's attach stream (8-byte frame headers: stream, 0, 0, 0, size) into stdout and
    stderr; a stream without headers (a TTY) is all stdout."""
    out, err = bytearray(), bytearray()
    index = 0
    while index + 8 <= len(payload):
        kind, size = payload[index], struct.unpack(">I", payload[index + 4 : index + 8])[0]
        if kind not in (0, 1, 2) or payload[index + 1 : index + 4] != b"\0\0\0":
            return bytes(payload), b""
        chunk = payload[index + 8 : index + 8 + size]
        (err if kind == 2 else out).extend(chunk)
        index += 8 + size
    return bytes(out), bytes(err)


def _message(payload: bytes) -> str:
    try:
        decoded = json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace").strip() or "no message"
    return str(decoded.get("message", decoded)) if isinstance(decoded, dict) else str(decoded)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("engine", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def request_sync(socket_file: str, method: str, path: str, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """One blocking API call (no event loop needed): status and body."""
    conn = _UnixHTTPConnection(socket_file, timeout_s)
    try:
        conn.request(method, API_PREFIX + path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def delete_container_sync(socket_file: str, container: str) -> None:
    """Force-remove a container and its anonymous volumes; gone already is fine."""
    status, body = request_sync(socket_file, "DELETE", f"/containers/{quote(container)}?force=1&v=1")
    if status not in (204, 404):
        raise EngineError(status, _message(body))


def list_containers_sync(socket_file: str, label: str) -> list[dict[str, Any]]:
    """Every container (running or not) carrying ``label``."""
    filters = quote(json.dumps({"label": [label]}))
    status, body = request_sync(socket_file, "GET", f"/containers/json?all=1&filters={filters}")
    if status != 200:
        raise EngineError(status, _message(body))
    listed: list[dict[str, Any]] = json.loads(body)
    return listed
