"""The head server: the registry that maps instance names to running replicas.

It runs inside the ``ng_run`` process (or a trainer's process) on 127.0.0.1:11000 by default.
Servers register the port they actually bound; clients list ``/server_instances`` to resolve
names. ``/global_config_dict_yaml`` serves the merged config with secrets redacted.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from nemo_gym.launch.config import ConfigError, dump_yaml, head_server_address
from nemo_gym.serving.access_guard import AccessGuard
from nemo_gym.serving.server import (
    REGISTRATION_SECRET_HEADER,
    HTTPError,
    RequestGuard,
    auth_token,
    json_error_handlers,
    json_response,
    parse_json_object,
)

# Registrations are a few hundred bytes; nothing the head serves needs a large body.
HEAD_MAX_BODY_BYTES = 1024 * 1024


@dataclass
class Replica:
    """One running server process registered under an instance name."""

    name: str
    server_type: str
    host: str
    port: int
    pid: int
    registered_at: float
    external_url: str | None = None
    node_id: str | None = None  # the Ray node it runs on (Ray backend), else None
    node_ip: str | None = None

    @property
    def url(self) -> str:
        """The replica's base URL (an external endpoint's own URL, path included)."""
        if self.external_url:
            return self.external_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def as_dict(self) -> dict[str, Any]:
        """The JSON form served by ``/server_instances``."""
        data = asdict(self)
        data.pop("external_url")
        return {**data, "url": self.url, "external": self.external_url is not None}


class Registry:
    """Instance name → replicas, with an event per registration for whoever waits on it."""

    def __init__(self) -> None:
        self.replicas: dict[str, list[Replica]] = {}
        self._changed = asyncio.Event()

    def register(self, replica: Replica) -> None:
        """Add (or replace, same host:port) a replica."""
        current = [
            r for r in self.replicas.get(replica.name, []) if (r.host, r.port) != (replica.host, replica.port)
        ]
        current.append(replica)
        self.replicas[replica.name] = current
        self._changed.set()

    def deregister(self, name: str, host: str, port: int) -> None:
        """Remove a replica (a server shutting down cleanly)."""
        kept = [r for r in self.replicas.get(name, []) if (r.host, r.port) != (host, port)]
        if kept:
            self.replicas[name] = kept
        else:
            self.replicas.pop(name, None)

    def remove_where(self, host: str, pid: int) -> None:
        """Forget the replicas of process ``pid`` on ``host`` (pids repeat across machines)."""
        for name in list(self.replicas):
            kept = [r for r in self.replicas[name] if (r.host, r.pid) != (host, pid)]
            if kept:
                self.replicas[name] = kept
            else:
                del self.replicas[name]
        self._changed.set()

    def remove_pid(self, pid: int) -> None:
        """Forget every replica of a process that died."""
        for name in list(self.replicas):
            kept = [r for r in self.replicas[name] if r.pid != pid]
            if kept:
                self.replicas[name] = kept
            else:
                del self.replicas[name]

    def all(self) -> list[Replica]:
        """Every registered replica."""
        return [r for replicas in self.replicas.values() for r in replicas]

    async def wait_changed(self, timeout: float) -> None:
        """Wait until the next registration (or ``timeout`` seconds)."""
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass


class HeadServer:
    """The registry as a starlette app, with the (redacted) global config it serves."""

    def __init__(
        self, global_config: Mapping[str, Any] | None = None, registration_secret: str | None = None
    ) -> None:
        self.registry = Registry()
        self.global_config = dict(global_config or {})
        # With a secret, only processes that hold it (the servers ng_run started and handed it
        # to) may add or remove replicas: any other local process cannot pose as policy_model.
        self.registration_secret = registration_secret

    def build_app(self) -> Any:
        """The ASGI app behind the access guard (Host, Origin, the auth token when
        ``NEMO_GYM_AUTH_TOKEN`` is set, JSON bodies)."""
        app: Any = Starlette(
            exception_handlers=json_error_handlers("head_server"),
            routes=[
                Route("/", self._liveness, methods=["GET"]),
                Route("/register", self._register, methods=["POST"]),
                Route("/deregister", self._deregister, methods=["POST"]),
                Route("/server_instances", self._server_instances, methods=["GET"]),
                Route("/global_config_dict_yaml", self._config_yaml, methods=["GET"]),
            ],
        )
        app = RequestGuard(app, "head_server", HEAD_MAX_BODY_BYTES)
        return AccessGuard(
            app,
            "head_server",
            token=auth_token(),
            hosts=[head_server_address(self.global_config)[0], self.global_config.get("default_host")],
            allowed_hosts=allowed_hosts_setting(self.global_config),
        )

    async def _liveness(self, request: Request) -> Response:
        return json_response({"status": "ok", "server": "head_server", "pid": os.getpid()})

    def _check_registration_secret(self, request: Request) -> None:
        if self.registration_secret is None:
            return
        given = request.headers.get(REGISTRATION_SECRET_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.registration_secret.encode()):
            raise HTTPError(
                403,
                f"{'wrong' if given else 'missing'} registration secret: {request.url.path} needs the "
                f"stack's secret in the {REGISTRATION_SECRET_HEADER} header (ng_run hands it to the "
                "servers it starts)",
            )

    async def _register(self, request: Request) -> Response:
        self._check_registration_secret(request)
        body = parse_json_object(await request.body(), "registration")
        try:
            replica = Replica(
                name=_text(body, "name"),
                server_type=str(body.get("server_type", "")),
                host=_text(body, "host"),
                port=_port(body),
                pid=int(body.get("pid", 0)),
                registered_at=time.time(),
                node_id=_optional_text(body, "node_id"),
                node_ip=_optional_text(body, "node_ip"),
            )
        except (TypeError, ValueError, OverflowError) as exc:
            raise HTTPError(422, f"invalid registration (need name, host, port): {exc}") from exc
        self.registry.register(replica)
        return json_response({"status": "registered", "url": replica.url})

    async def _deregister(self, request: Request) -> Response:
        self._check_registration_secret(request)
        body = parse_json_object(await request.body(), "deregistration")
        try:
            name, host, port = _text(body, "name"), _text(body, "host"), _port(body)
        except (TypeError, ValueError, OverflowError) as exc:
            raise HTTPError(422, f"invalid deregistration (need name, host, port): {exc}") from exc
        self.registry.deregister(name, host, port)
        return json_response({"status": "deregistered"})

    async def _server_instances(self, request: Request) -> Response:
        return json_response([r.as_dict() for r in self.registry.all()])

    async def _config_yaml(self, request: Request) -> Response:
        return PlainTextResponse(dump_yaml(self.served_config()))

    def served_config(self) -> dict[str, Any]:
        """The global config with each registered instance's ``host`` and ``port`` set to where its
        first replica listens (servers bind port 0, so the launch config does not know)."""
        config = dict(self.global_config)
        for name, replicas in self.registry.replicas.items():
            block = config.get(name)
            live = [r for r in replicas if r.external_url is None]
            if not live or not isinstance(block, Mapping) or len(block) != 1:
                continue
            ((kind, impls),) = block.items()
            if not isinstance(impls, Mapping) or len(impls) != 1:
                continue
            ((impl, fields),) = impls.items()
            if isinstance(fields, Mapping):
                config[name] = {kind: {impl: {**fields, "host": live[0].host, "port": live[0].port}}}
        return config


def allowed_hosts_setting(config: Mapping[str, Any]) -> list[str]:
    """The global ``allowed_hosts`` setting (a list, or a comma-separated string) as a list."""
    raw = config.get("allowed_hosts") or []
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        raise ConfigError(f"allowed_hosts must be a list of host names, got {raw!r}")
    return [str(item).strip() for item in items if str(item).strip()]


def _text(body: Mapping[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field} must be a non-empty string, got {value!r:.80}")
    return value


def _optional_text(body: Mapping[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, got {value!r:.80}")
    return value


def _port(body: Mapping[str, Any]) -> int:
    value = body.get("port")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"port must be an integer 1-65535, got {value!r:.80}")
    return value
