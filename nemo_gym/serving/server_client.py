"""The client servers and collectors use to call each other by instance name.

The HTTP itself is :mod:`nemo_gym.serving.transport`'s (the per-loop connections and the one
retry loop, shared with the upstream client): a deadline on every call and bounded retries for
connection failures only (a request that reached a server is never sent twice). This module
adds what is particular to calls between our servers: names resolved through the head server,
a rollout kept on one replica of a replicated server, per-rollout cookies, and a hop to a server
on this machine over its Unix socket.

One idea: a call to a named server, from its name to its answer (the name resolved, the replica
kept, the hop with its first try inline, the retries, a rollout's cookies); the pieces share the
client's caches (resolved names, hop targets, cookie lines), so they stay together.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import urllib.parse
import uuid
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from nemo_gym.failure_classes import (
    HTTP_ERROR,
    NOT_FOUND,
    UNREACHABLE,
    CallErrorKind,
)
from nemo_gym.serving import hop_client, local_socket
from nemo_gym.serving.protocol import (
    ENV_HEAD_URL,
    ROLLOUT_PREFIX,
    SESSION_COOKIE,
    TOKEN_CAPTURE_PATH_SEGMENT,
    auth_headers,
)

# The transport's names, re-exported: callers import them from here.
from nemo_gym.serving.transport import (  # noqa: F401
    DEFAULT_MAX_CONNECTIONS,
    ENV_HOP_CLIENT,
    LoopConnections,
    NotConnected,
    RetryPolicy,
    TransportFailure,
    aiohttp_failure,
    capped_connector,
    connection_error_text,
    default_connection_limit,
    fd_connection_cap,
    hop_client_enabled,
    hop_failure,
    send_with_retries,
)

logger = logging.getLogger("nemo_gym")

DEFAULT_TIMEOUT_S = float(os.environ.get("NEMO_GYM_CLIENT_TIMEOUT_S", "1800"))
DEFAULT_CONNECT_RETRIES = 4
# How long a name's replica list is reused before the head server is asked again: replicas
# started later (more workers, a restart on another node) get new rollouts within this time.
RESOLVE_TTL_S = 2.0
# How many header blocks with a Cookie line a client remembers (about one per rollout in flight).
_COOKIE_LINES_KEPT = 1024


class ServerCallError(Exception):
    """A call to a named server failed; ``kind`` classifies it for failure rows.

    ``kind`` is one of ``unreachable`` (no connection after retries, or the connection broke
    before the answer was complete), ``timeout`` (deadline exceeded), ``http_error`` (the server
    answered with a non-2xx status), ``not_found`` (no such instance registered),
    ``bad_upstream_body`` (an answer larger than the client's cap, or not HTTP).
    """

    def __init__(
        self,
        kind: CallErrorKind,
        server: str,
        path: str,
        message: str,
        status: int | None = None,
        body: Any = None,
    ) -> None:
        # Exception's own __init__, not the next class's: HTTPStatusError is also an
        # aiohttp.ClientResponseError, whose __init__ takes (request_info, history, ...).
        Exception.__init__(self, f"{server}{path}: {message}")
        self.kind = kind
        self.server = server
        self.path = path
        self.status = status
        self.body = body


@dataclass(frozen=True)
class ServerInstanceInfo:
    """One registered replica of a server instance, as the head server lists it."""

    name: str
    url: str
    host: str
    port: int
    pid: int
    server_type: str
    external: bool = False
    node_id: str | None = None  # the Ray node it runs on (Ray backend)
    node_ip: str | None = None


class ServerResponse:
    """A finished HTTP answer: ``status``, raw ``body``, the ``cookies`` it set, the replica that
    answered (``base_url``) and its header lines (``raw_headers``, name and value bytes)."""

    # An answer of the hop client keeps its header lines unparsed until raw_headers is asked for
    # (most hops never look): _hop is that answer, _raw_headers None until then.
    _hop: Any = None
    _raw_headers: Sequence[tuple[bytes, bytes]] | None = None

    def __init__(
        self,
        status: int,
        body: bytes,
        cookies: dict[str, str],
        base_url: str = "",
        raw_headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        self.status = status
        self.body = body
        self.cookies = cookies
        self.base_url = base_url
        self._raw_headers = raw_headers

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]:
        """The answer's header lines as ``(name, value)`` bytes, in order."""
        found = self._raw_headers
        if found is None:
            found = self._raw_headers = self._hop.raw_headers
        return found

    @raw_headers.setter
    def raw_headers(self, value: Sequence[tuple[bytes, bytes]]) -> None:
        self._raw_headers = value

    def __repr__(self) -> str:
        return (
            f"ServerResponse(status={self.status!r}, body={self.body!r}, cookies={self.cookies!r}, "
            f"base_url={self.base_url!r}, raw_headers={self.raw_headers!r})"
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, ServerResponse)
        return (self.status, self.body, self.cookies, self.base_url, self.raw_headers) == (
            other.status,
            other.body,
            other.cookies,
            other.base_url,
            other.raw_headers,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as the dataclass was)

    def header(self, name: str) -> str | None:
        """The value of the answer's header ``name`` (any case; the last if repeated), else None."""
        if self._raw_headers is None:  # a hop answer's lines, not parsed yet: the hop client finds it
            found: str | None = self._hop.header(name)
            return found
        wanted = name.lower().encode("latin-1")
        for key, value in reversed(self.raw_headers):  # the last one wins: the first from the end
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    def json(self) -> Any:
        """The body parsed as JSON."""
        return orjson.loads(self.body) if self.body else None

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300


def _hop_answer(hop: hop_client.HopResponse, cookies: dict[str, str], base: str) -> ServerResponse:
    """The :class:`ServerResponse` of a hop client's answer, its header lines read from ``hop``
    when first asked for (what ``ServerResponse(hop.status, hop.body, cookies, base,
    hop.raw_headers)`` holds)."""
    resp: ServerResponse = _new_object(ServerResponse)
    resp.status = hop.status
    resp.body = hop.body
    resp.cookies = cookies
    resp.base_url = base
    resp._hop = hop  # (_raw_headers: the class's None)
    return resp


_new_object = object.__new__


@dataclass(frozen=True)
class _FirstTry:
    """A first try over the hop client that failed, handed on to the retries (ServerClient._send)."""

    error: hop_client.HopError
    target: tuple[str, int, str, str | None]
    data: bytes | None
    headers: bytes
    started: float  # time.monotonic() before it
    deadline: float  # on the loop's clock


class ServerClient:
    """Calls named servers; resolves names through the head server at ``head_url``.

    ``static_urls`` maps instance names to base URLs directly (no head server needed): used by
    trainers that point at an existing endpoint and by tests. ``max_answer_bytes`` caps one
    answer's size (headers and body) on the plain-HTTP path.
    """

    def __init__(
        self,
        head_url: str | None = None,
        *,
        static_urls: Mapping[str, str | list[str]] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_retries: int = DEFAULT_CONNECT_RETRIES,
        max_connections: int | None = None,
        max_answer_bytes: int = hop_client.DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        self.head_url = head_url.rstrip("/") if head_url else None
        self.max_answer_bytes = max_answer_bytes
        self.timeout_s = timeout_s
        self.connect_retries = connect_retries
        self.connections = LoopConnections(max_connections)
        self.max_connections = self.connections.max_connections
        self._retry = RetryPolicy(connect_retries)
        self._static: dict[str, list[str]] = {
            k: [v] if isinstance(v, str) else list(v) for k, v in (static_urls or {}).items()
        }
        self._resolved: dict[str, list[str]] = {}
        self._resolved_at = float("-inf")
        self._external: set[str] = set()  # base URLs of endpoints that are not nemo_gym servers
        # The registered process of each base URL: a Unix socket file is used only when that
        # process is the one listening on it (serving/local_socket.py).
        self._pids: dict[str, int] = {}
        self._round_robin = 0
        self._lookups: dict[asyncio.AbstractEventLoop, asyncio.Task[list[ServerInstanceInfo]]] = {}
        self._headers = auth_headers()
        self._hop_targets: dict[str, tuple[str, int, str, str | None] | None] = {}
        self._use_hop_client = hop_client_enabled()
        self._hop_headers = hop_client.encode_headers(self._headers.items())
        self._cookie_headers: dict[tuple[Any, ...], bytes] = {}
        self._hop_json_headers = hop_client.encode_headers(
            [*self._headers.items(), ("Content-Type", "application/json")]
        )

    @classmethod
    def from_env(cls) -> ServerClient:
        """A client for the head server named by ``NEMO_GYM_HEAD_URL`` (set by ``ng_run``)."""
        return cls(os.environ.get(ENV_HEAD_URL))

    # ---- connections ---------------------------------------------------------------------
    def http(self) -> aiohttp.ClientSession:
        """The aiohttp session of the running event loop (one per loop: loops never share one)."""
        return self.connections.session()

    def hop_pool(self) -> hop_client.HopPool:
        """The plain-HTTP connection pool of the running event loop."""
        return self.connections.pool()

    async def close(self) -> None:
        """Close the sessions and connections this client opened on the running loop."""
        await self.connections.close()

    # ---- name resolution -----------------------------------------------------------------
    async def server_instances(self) -> list[ServerInstanceInfo]:
        """Every replica the head server knows."""
        if not self.head_url:
            return []
        resp = await self._send(
            "GET", "head_server", self.head_url, "/server_instances", None, None, self.timeout_s
        )
        if not resp.ok:
            raise ServerCallError(
                HTTP_ERROR,
                "head_server",
                "/server_instances",
                resp.body.decode(errors="replace"),
                resp.status,
            )
        return [
            ServerInstanceInfo(
                name=i["name"],
                url=i["url"],
                host=i["host"],
                port=i["port"],
                pid=i.get("pid", 0),
                server_type=i.get("server_type", ""),
                external=bool(i.get("external", False)),
                node_id=i.get("node_id"),
                node_ip=i.get("node_ip"),
            )
            for i in resp.json()
        ]

    async def resolve(self, server_name: str, refresh: bool = False) -> list[str]:
        """Base URLs of every replica of ``server_name``."""
        if server_name in self._static:
            return self._static[server_name]
        fresh = time.monotonic() - self._resolved_at < RESOLVE_TTL_S
        if not refresh and fresh and server_name in self._resolved:
            return self._resolved[server_name]
        if not self.head_url:
            raise ServerCallError(
                NOT_FOUND, server_name, "", "no head server configured and no static URL for this name"
            )
        instances = await (self.server_instances() if refresh else self._shared_lookup())
        by_name: dict[str, list[str]] = {}
        for info in instances:
            by_name.setdefault(info.name, []).append(info.url)
            self._pids[info.url] = info.pid
            if info.external:
                self._external.add(info.url)
        self._resolved = by_name
        self._resolved_at = time.monotonic()
        if server_name not in by_name:
            known = ", ".join(sorted(by_name)) or "none"
            raise ServerCallError(
                NOT_FOUND,
                server_name,
                "",
                f"no server named {server_name!r} is registered (registered: {known})",
            )
        return by_name[server_name]

    async def _shared_lookup(self) -> list[ServerInstanceInfo]:
        """One head-server lookup shared by every caller that needs it at the same time (the
        first burst of rollouts would otherwise send one lookup per rollout)."""
        loop = asyncio.get_running_loop()
        lookup = self._lookups.get(loop)
        if lookup is None:
            lookup = self._lookups[loop] = loop.create_task(self.server_instances())
            lookup.add_done_callback(lambda _: self._lookups.pop(loop, None))
        return await asyncio.shield(lookup)

    async def base_url(self, server_name: str, affinity: str | None = None) -> str:
        """One replica's base URL; the same ``affinity`` key picks the same replica.

        Rendezvous hashing: when a replica joins or leaves, only the keys that hashed to it move
        (with ``len(urls)`` as a modulus almost every key would).
        """
        urls = await self.resolve(server_name)
        if len(urls) == 1:
            return urls[0]
        if affinity is not None:
            key = affinity.encode()
            return max(urls, key=lambda url: zlib.crc32(url.encode(), zlib.crc32(key)))
        self._round_robin += 1
        return urls[self._round_robin % len(urls)]

    # ---- calls ---------------------------------------------------------------------------
    async def request(
        self,
        method: str,
        server_name: str,
        url_path: str,
        json: Any = None,
        *,
        cookies: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        rollout_id: str | None = None,
        replica: str | None = None,
        token_capture: bool = False,
    ) -> ServerResponse:
        """Send one request to a named server and read the whole answer.

        ``replica`` (a base URL) sends it to that replica only: a rollout holding session state
        on it must not move (when it is gone the call fails ``unreachable``). ``token_capture``
        adds NeMo Gym's training-token capture segment after the rollout prefix.
        Raises :class:`ServerCallError` of kind ``unreachable``, ``timeout`` or ``not_found``;
        an HTTP error status is returned, not raised (see :meth:`post_json`).
        """
        return await self._request(
            method, server_name, url_path, json, cookies, timeout_s, rollout_id, replica, token_capture
        )

    async def _request(
        self,
        method: str,
        server_name: str,
        url_path: str,
        json: Any,
        cookies: Mapping[str, str] | None,
        timeout_s: float | None,
        rollout_id: str | None,
        replica: str | None,
        token_capture: bool,
        rollout: Rollout | None = None,
    ) -> ServerResponse:
        """:meth:`request` with its arguments in order. A rollout's hops are this one coroutine
        (:meth:`Rollout.request` hands it its own, and it keeps what the answer set for the rollout,
        :meth:`Rollout.keep_session`), and its first try over the hop client is made here, inline:
        on the hot path (a connection that works) a hop is this coroutine over the hop client's,
        and anything else goes on in :meth:`_send`, the same as if it had made that try."""
        base = replica
        if not base:
            # What base_url answers without awaiting anything: the one replica of a server whose
            # address is static or freshly resolved (inline: a rollout's model calls have no replica).
            urls = self._static.get(server_name)
            if urls is None and time.monotonic() - self._resolved_at < RESOLVE_TTL_S:
                urls = self._resolved.get(server_name)
            base = urls[0] if urls is not None and len(urls) == 1 else None
            if not base:
                base = await self.base_url(server_name, affinity=rollout_id)
        if rollout is None:
            path = self._path(base, url_path, rollout_id, token_capture)
        else:  # the rollout's prefix, built once for all its hops (as _path builds it)
            prefix = rollout._path_prefix
            path = url_path if prefix is None or base in self._external else prefix + url_path
        timeout_s = timeout_s or self.timeout_s
        try:
            try:
                target = self._hop_targets[base]
            except KeyError:
                target = self._hop_target(base)
            if target is None:
                resp = await self._send(method, server_name, base, path, json, cookies, timeout_s)
            else:
                data = orjson.dumps(json) if json is not None else None
                headers = self._hop_headers if data is None else self._hop_json_headers
                if cookies:
                    headers = self._with_cookies(headers, cookies)
                started = time.monotonic()
                pool = self.connections.pool()
                deadline = pool.loop.time() + timeout_s
                host, port, prefix, unix_path = target
                try:
                    hop = await hop_client.request(
                        pool,
                        method,
                        host,
                        port,
                        prefix + path,
                        headers,
                        data,
                        deadline=deadline,
                        max_answer_bytes=self.max_answer_bytes,
                        unix_path=unix_path,
                        unix_peer_pid=self._pids.get(base, 0),
                    )
                except hop_client.HopError as exc:
                    first = _FirstTry(exc, target, data, headers, started, deadline)
                    resp = await self._send(method, server_name, base, path, json, cookies, timeout_s, first)
                else:  # _hop_answer's, inline (every hop): the header lines read when asked for
                    resp = _new_object(ServerResponse)
                    resp.status = hop.status
                    resp.body = hop.body
                    resp.cookies = hop.cookies
                    resp.base_url = base
                    resp._hop = hop  # (_raw_headers: the class's None)
        except ServerCallError as exc:
            if exc.kind != UNREACHABLE or replica or server_name in self._static or not self.head_url:
                raise
            if not isinstance(exc.__cause__, (hop_client.HopConnectError, aiohttp.ClientConnectorError)):
                raise  # the connection broke after the request went out: it may have run; never twice
            # The server may have restarted on another port: re-resolve once and try again.
            fresh = await self.resolve(server_name, refresh=True)
            if base in fresh and len(fresh) == 1:
                raise
            base = await self.base_url(server_name, affinity=rollout_id)
            path = self._path(base, url_path, rollout_id, token_capture)
            resp = await self._send(method, server_name, base, path, json, cookies, timeout_s)
        if rollout is not None and resp.cookies:
            rollout.keep_session(server_name, resp)
        return resp

    def _path(self, base: str, url_path: str, rollout_id: str | None, token_capture: bool = False) -> str:
        # The rollout prefix is ours: an external endpoint (a trainer's engine or proxy) gets the plain path.
        if rollout_id and base not in self._external:
            capture = f"/{TOKEN_CAPTURE_PATH_SEGMENT}" if token_capture else ""
            return f"{ROLLOUT_PREFIX}{rollout_id}{capture}{url_path}"
        return url_path

    async def post(self, server_name: str, url_path: str, json: Any = None, **kwargs: Any) -> ServerResponse:
        """POST to a named server (see :meth:`request`)."""
        return await self.request("POST", server_name, url_path, json, **kwargs)

    async def get(self, server_name: str, url_path: str, **kwargs: Any) -> ServerResponse:
        """GET from a named server (see :meth:`request`)."""
        return await self.request("GET", server_name, url_path, None, **kwargs)

    async def post_json(self, server_name: str, url_path: str, json: Any = None, **kwargs: Any) -> Any:
        """POST and return the parsed JSON answer; a non-2xx answer raises ``http_error``."""
        resp = await self.request("POST", server_name, url_path, json, **kwargs)
        return raise_for_status(resp, server_name, url_path)

    def rollout(self, rollout_id: str | None = None, *, token_capture: bool = False) -> Rollout:
        """A per-rollout view of this client with its own cookie jars (see :class:`Rollout`);
        ``token_capture``: its calls ask for NeMo Gym's training-token capture."""
        return Rollout(self, rollout_id or uuid.uuid4().hex, token_capture=token_capture)

    async def _send(
        self,
        method: str,
        server_name: str,
        base: str,
        path: str,
        json: Any,
        cookies: Mapping[str, str] | None,
        timeout_s: float,
        first: _FirstTry | None = None,
    ) -> ServerResponse:
        """One call to ``base``, with the connection retries. ``first``: a first try over the hop
        client that the caller already made and that failed (see :meth:`_request`)."""
        if first is None:
            data = orjson.dumps(json) if json is not None else None
            target = self._hop_target(base)
            started = time.monotonic()
        else:
            data, target, started = first.data, first.target, first.started
        attempt: Callable[[float, int], Awaitable[ServerResponse]]
        try:
            try:
                if target is None:
                    attempt = self._aiohttp_attempt(method, base, path, data, cookies, timeout_s)
                    return await attempt(timeout_s, 1)
                if first is not None:
                    headers = first.headers
                    return await self._hop_try(
                        timeout_s, method, base, target, path, data, headers, timeout_s, first
                    )
                headers = self._hop_headers if data is None else self._hop_json_headers
                if cookies:
                    headers = self._with_cookies(headers, cookies)
                return await self._hop_try(timeout_s, method, base, target, path, data, headers, timeout_s)
            except NotConnected as failed:
                if target is not None:

                    def attempt(remaining: float, attempts: int) -> Awaitable[ServerResponse]:
                        now = self._hop_targets.get(base) or target  # after a Unix-socket fallback: TCP
                        return self._hop_try(remaining, method, base, now, path, data, headers, timeout_s)

                return await send_with_retries(
                    attempt, self._retry, timeout_s, started=started, first_failure=failed
                )
        except TransportFailure as failure:
            raise ServerCallError(failure.kind, server_name, path, failure.describe(base)) from (
                failure.__cause__ or failure
            )

    def _with_cookies(self, headers: bytes, cookies: Mapping[str, str]) -> bytes:
        """``headers`` followed by the encoded ``Cookie`` line for ``cookies``. A rollout's jar sends
        the same one on each of its calls: remembered (a bounded number of them), the same bytes
        object each time (the hop client's request heads are looked up by it: hashed once)."""
        key = (headers, *cookies.items())
        found = self._cookie_headers.get(key)
        if found is None:
            line = "; ".join(f"{k}={v}" for k, v in cookies.items())
            found = headers + hop_client.encode_headers([("Cookie", line)])
            if len(self._cookie_headers) >= _COOKIE_LINES_KEPT:
                self._cookie_headers.clear()
            self._cookie_headers[key] = found
        return found

    def _aiohttp_attempt(
        self,
        method: str,
        base: str,
        path: str,
        data: bytes | None,
        cookies: Mapping[str, str] | None,
        timeout_s: float,
    ) -> Any:
        """One try through aiohttp (TLS, or ``NEMO_GYM_HOP_CLIENT=aiohttp``)."""
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        if cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        http = self.http()

        async def attempt(remaining: float, attempts: int) -> ServerResponse:
            try:
                async with http.request(
                    method,
                    base + path,
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=remaining),
                ) as resp:
                    body = await resp.read()
                    cookies = {k: m.value for k, m in resp.cookies.items()}
                    return ServerResponse(resp.status, body, cookies, base, resp.raw_headers)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise aiohttp_failure(exc, timeout_s) from exc

        return attempt

    def _hop_target(self, base: str) -> tuple[str, int, str, str | None] | None:
        """``(host, port, path prefix, Unix socket)`` of a plain-HTTP base URL, None for one aiohttp
        takes. The socket is the file a server on this machine listens on too (see
        :mod:`nemo_gym.serving.local_socket`), or None."""
        try:
            return self._hop_targets[base]
        except KeyError:
            pass
        target = None
        url = urllib.parse.urlsplit(base)
        if self._use_hop_client and url.scheme == "http" and url.hostname and not url.query:
            port = url.port or 80
            # A socket file only for a registered server (its pid is what the listener must be).
            unix = local_socket.path_for(url.hostname, port) if self._pids.get(base, 0) > 0 else None
            target = (url.hostname, port, url.path.rstrip("/"), unix)
        self._hop_targets[base] = target
        return target

    async def _hop_try(
        self,
        remaining: float,
        method: str,
        base: str,
        target: tuple[str, int, str, str | None],
        path: str,
        data: bytes | None,
        headers: bytes,
        timeout_s: float,
        first: _FirstTry | None = None,
    ) -> ServerResponse:
        """One try through the lean hop client (plain HTTP, or this machine's Unix socket);
        ``first``: its first request was already sent and failed (:meth:`_request`), so this
        goes on from that failure, within the same deadline."""
        host, port, prefix, unix_path = target
        pool = self.connections.pool()
        deadline = pool.loop.time() + remaining if first is None else first.deadline
        failed = None if first is None else first.error
        while True:
            try:
                if failed is not None:
                    error, failed = failed, None
                    raise error
                resp = await hop_client.request(
                    pool,
                    method,
                    host,
                    port,
                    prefix + path,
                    headers,
                    data,
                    deadline=deadline,
                    max_answer_bytes=self.max_answer_bytes,
                    unix_path=unix_path,
                    unix_peer_pid=self._pids.get(base, 0),
                )
                return _hop_answer(resp, resp.cookies, base)
            except hop_client.HopConnectError as exc:
                if unix_path is None:
                    raise NotConnected(exc) from exc
                # A socket file left by a server that is gone, or one whose listener is not
                # the registered server (nothing was sent to it): TCP from now on for this base.
                if isinstance(exc.os_error, hop_client.HopPeerMismatch):
                    logger.warning("not using the Unix socket of %s: %s", base, exc.os_error)
                unix_path = None
                self._hop_targets[base] = (host, port, prefix, None)
            except hop_client.HopError as exc:
                raise hop_failure(exc, timeout_s) from exc


def raise_for_status(resp: ServerResponse, server_name: str, url_path: str) -> Any:
    """The parsed body of a 2xx answer; otherwise a ``http_error`` naming the server's error text."""
    if resp.ok:
        return resp.json()
    try:
        body = resp.json()
    except orjson.JSONDecodeError:
        body = resp.body.decode(errors="replace")
    message = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(message, dict) and isinstance(message.get("message"), str):
        message = message["message"]  # a model server's OpenAI-shaped error object
    raise ServerCallError(
        HTTP_ERROR, server_name, url_path, f"HTTP {resp.status}: {message}", resp.status, body
    )


class Rollout:
    """One rollout's view of a :class:`ServerClient`: a cookie jar per server and a rollout id.

    Every call made through it carries the cookies that server set earlier in this rollout, so
    session state survives from ``seed_session`` to ``verify`` without the agent threading
    cookies, and two rollouts never share a session.
    """

    def __init__(self, client: ServerClient, rollout_id: str, *, token_capture: bool = False) -> None:
        self.client = client
        self.rollout_id = rollout_id
        self.token_capture = token_capture
        self.cookies: dict[str, dict[str, str]] = {}
        # Servers that gave this rollout a session: later calls stay on the replica holding it.
        self.replicas: dict[str, str] = {}
        # The client's own request (not a subclass's override): called without its keyword layer.
        self._direct = getattr(type(client), "request", None) is ServerClient.request
        # ... and this class's own request too: post goes straight to the client's coroutine.
        self._post_direct = self._direct and type(self).request is Rollout.request
        # What ServerClient._path puts before each hop's path (rollout id and capture segment are
        # fixed for a rollout): built once here, not on every hop.
        capture = f"/{TOKEN_CAPTURE_PATH_SEGMENT}" if token_capture else ""
        self._path_prefix = f"{ROLLOUT_PREFIX}{rollout_id}{capture}" if rollout_id else None

    def request(
        self,
        method: str,
        server_name: str,
        url_path: str,
        json: Any = None,
        *,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, ServerResponse]:
        """Like :meth:`ServerClient.request`, with this rollout's cookies and id (``await`` it)."""
        jar = self.cookies.get(server_name)
        if jar is None:
            jar = self.cookies[server_name] = {}
        if self._direct and not kwargs:
            # The client's own coroutine, no second one around it: it keeps the session itself.
            return self.client._request(
                method,
                server_name,
                url_path,
                json,
                jar,
                timeout_s,
                self.rollout_id,
                self.replicas.get(server_name),
                self.token_capture,
                self,
            )
        if timeout_s is not None:
            kwargs["timeout_s"] = timeout_s
        return self._request_through_client(method, server_name, url_path, json, jar, kwargs)

    async def _request_through_client(
        self,
        method: str,
        server_name: str,
        url_path: str,
        json: Any,
        jar: dict[str, str],
        kwargs: dict[str, Any],
    ) -> ServerResponse:
        # A client whose request is its own (a subclass's override), with ServerClient's keywords.
        resp = await self.client.request(
            method,
            server_name,
            url_path,
            json,
            cookies=jar,
            rollout_id=self.rollout_id,
            replica=self.replicas.get(server_name),
            token_capture=self.token_capture,
            **kwargs,
        )
        if resp.cookies:
            self.keep_session(server_name, resp)
        return resp

    def keep_session(self, server_name: str, resp: ServerResponse) -> None:
        """Keep the cookies ``resp`` set for this rollout's later calls to ``server_name``, and
        the replica that set them (the session lives there)."""
        self.cookies.setdefault(server_name, {}).update(resp.cookies)
        if resp.base_url:
            self.replicas.setdefault(server_name, resp.base_url)

    def post(
        self,
        server_name: str,
        url_path: str,
        json: Any = None,
        *,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, ServerResponse]:
        """POST with this rollout's cookies (``await`` it; it is :meth:`request`'s coroutine)."""
        if kwargs or not self._post_direct:
            return self.request("POST", server_name, url_path, json, timeout_s=timeout_s, **kwargs)
        # request's direct path, inline (one call less per hop): the client's own coroutine.
        jar = self.cookies.get(server_name)
        if jar is None:
            jar = self.cookies[server_name] = {}
        return self.client._request(
            "POST",
            server_name,
            url_path,
            json,
            jar,
            timeout_s,
            self.rollout_id,
            self.replicas.get(server_name),
            self.token_capture,
            self,
        )

    async def post_json(self, server_name: str, url_path: str, json: Any = None, **kwargs: Any) -> Any:
        """POST with this rollout's cookies; parsed JSON, non-2xx raises ``http_error``."""
        resp = await self.post(server_name, url_path, json, **kwargs)
        return raise_for_status(resp, server_name, url_path)

    def session_id(self, server_name: str) -> str | None:
        """The session id a server gave this rollout, if any."""
        return self.cookies.get(server_name, {}).get(SESSION_COOKIE)
