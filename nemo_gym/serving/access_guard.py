"""Who may talk to a server at all: the shared token, the Host and Origin a browser sends, JSON bodies.

:class:`AccessGuard` is pure ASGI middleware, so it wraps any Starlette app (FastAPI apps
included) the same way. In front of every server (``BaseServer.build_app``), the head server,
the viewer and harness_agent's capture proxy it refuses, before any route runs:

- a ``Host`` that is neither an IP literal nor a name the server is bound to or configured with
  (``127.0.0.1``, ``localhost``, ``::1``, the configured/bound host, this machine's host name,
  ``allowed_hosts``): **400**. A DNS-rebinding page reaches a loopback port under the attacker's
  own host name, which it cannot change; an IP literal cannot be rebound, so it is accepted
  (``allowed_hosts: ["*"]`` turns the check off, for a proxy that rewrites Host);
- an ``Origin`` (sent by browsers on cross-site requests) that is ``null``, or is neither the
  request's own host nor a loopback/allowed name: **403**;
- when a token is set (``NEMO_GYM_AUTH_TOKEN``, handed to launched servers on stdin), a request
  without ``Authorization: Bearer <token>``: **401** (compared in constant time);
- a request body whose ``Content-Type`` is not JSON (``application/json`` or ``*/*+json``):
  **415**. A web page can send ``text/plain`` or a typeless body cross-site without a preflight;
  it cannot send ``application/json``.

Every refusal is a JSON body ``{"error": ..., "server": ...}`` naming what was wrong.

A WebSocket handshake is refused (closed before it is accepted: the client sees 403) unless the
server opts in with ``websocket=True``; then the same Host, Origin and token checks hold for it
(the JSON rule is for request bodies only). Any other scope but ``lifespan`` is refused too.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.serving.protocol import AUTH_HEADER

# Extra host names every server in this process answers to (comma-separated), on top of its config.
ENV_ALLOWED_HOSTS = "NEMO_GYM_ALLOWED_HOSTS"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_AUTH_KEY = AUTH_HEADER.encode()
# A (Host, Origin) pair not yet checked.
_UNSEEN = object()
# How many (Host, Origin) pairs a guard remembers the verdict for.
_SITE_ANSWERS_KEPT = 256
# The only headers the guard reads (uvicorn gives header names lowercased).
_READ = frozenset(
    {b"host", b"origin", b"authorization", b"content-type", b"content-length", b"transfer-encoding"}
)


def _host_name(value: str) -> str:
    """The host part of a ``Host`` header or netloc, lowercased: ``[::1]:80`` → ``::1``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def is_ip_literal(name: str) -> bool:
    """Whether ``name`` is an IPv4/IPv6 address (no DNS name a rebinding attack could use)."""
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


def allowed_host_names(hosts: Iterable[str | None] = (), extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names a server answers to: loopback names, ``hosts`` (configured or bound, wildcards
    skipped), this machine's host name, ``extra`` and ``NEMO_GYM_ALLOWED_HOSTS``."""
    names = set(LOOPBACK_NAMES)
    for host in hosts:
        if host and host not in WILDCARD_HOSTS:
            names.add(_host_name(host))
    with contextlib.suppress(OSError):
        names.add(socket.gethostname().lower())
    for name in [*extra, *os.environ.get(ENV_ALLOWED_HOSTS, "").split(",")]:
        name = str(name).strip()
        if name:
            names.add("*" if name == "*" else _host_name(name))
    return frozenset(names)


def check_token(given: bytes | None, expected: bytes) -> bool:
    """Constant-time comparison of a presented credential with the expected one."""
    return given is not None and hmac.compare_digest(given, expected)


def is_json_content_type(value: bytes | None) -> bool:
    """``application/json`` or a ``+json`` media type (parameters such as ``charset`` ignored)."""
    if value is None:
        return False
    media = value.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class AccessGuard:
    """ASGI middleware: Host (400), Origin (403), auth token (401), JSON content type (415).

    ``hosts``: the host names this server is bound to or configured with; ``allowed_hosts``:
    more names (``"*"``: any). ``token``: the shared auth token (None: no token needed).
    ``json_only``: refuse request bodies that are not JSON (off for a server with non-JSON routes).
    ``websocket``: serve WebSocket handshakes that pass the same checks (refused otherwise).
    """

    def __init__(
        self,
        app: ASGIApp,
        server_name: str,
        *,
        token: str | None = None,
        hosts: Iterable[str | None] = (),
        allowed_hosts: Iterable[str] = (),
        json_only: bool = True,
        websocket: bool = False,
    ) -> None:
        self.app = app
        self.server_name = server_name
        self.expected = f"Bearer {token}".encode() if token else None
        self.allowed = allowed_host_names(hosts, allowed_hosts)
        self.any_host = "*" in self.allowed
        self.json_only = json_only
        self.websocket = websocket
        self._site_answers: dict[tuple[bytes | None, bytes | None], tuple[int, str] | None] = {}

    def host_allowed(self, name: str) -> bool:
        """Whether a Host/Origin host name is one this server answers to."""
        return self.any_host or name in self.allowed or is_ip_literal(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await self._websocket(scope, receive, send, read_headers(scope))
            return
        problem = self.http_problem(scope) if kind == "http" else (400, f"{kind} is not served here")
        if problem is None:
            await self.app(scope, receive, send)
            return
        await self.refuse(send, problem)

    def http_problem(self, scope: Scope) -> tuple[int, str] | None:
        """Why an HTTP request is refused (status, message), or None when it may pass."""
        return self.problem(scope.get("method"), read_headers(scope))

    async def refuse(self, send: Send, problem: tuple[int, str]) -> None:
        """Answer a refused HTTP request with its JSON error (and close the connection)."""
        status, headers, body = self.refusal(problem)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def refusal(self, problem: tuple[int, str]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The status, headers and JSON body refusing an HTTP request for ``problem``."""
        status, message = problem
        body = orjson.dumps({"error": message, "server": self.server_name})
        answer = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        # The body (if any) is left unread: the connection must not be reused for a next request.
        answer.append((b"connection", b"close"))
        return status, answer, body

    async def _websocket(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes]
    ) -> None:
        if not self.websocket:
            problem: tuple[int, str] | None = (403, "WebSocket connections are not served here")
        else:
            problem = self.problem(scope.get("method"), headers)
        if problem is None:
            await self.app(scope, receive, send)
            return
        await receive()  # websocket.connect
        # Closed before accept: the server answers the handshake with 403 and nothing reaches the app.
        await send({"type": "websocket.close", "code": 1008, "reason": problem[1][:120]})

    def problem(self, method: str | None, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        """Why a request of ``method`` with ``headers`` (:func:`read_headers`) is refused, or None."""
        host, origin = headers.get(b"host"), headers.get(b"origin")
        site = self._site_answers.get((host, origin), _UNSEEN)
        if site is _UNSEEN:
            site = self._site_problem(host, origin)
        if site is not None:
            return site  # type: ignore[return-value]
        expected = self.expected
        if expected is not None:
            given = headers.get(_AUTH_KEY)
            if given is None or not hmac.compare_digest(given, expected):
                return 401, "missing or wrong auth token (set NEMO_GYM_AUTH_TOKEN on the caller)"
        if not (self.json_only and method in _BODY_METHODS):
            return None
        content_type = headers.get(b"content-type")
        if content_type == b"application/json":
            return None  # JSON whether a body comes or not (the usual call: no length to read)
        length = headers.get(b"content-length")
        has_body = (
            length.strip() not in (b"0", b"") if length is not None else b"transfer-encoding" in headers
        )
        if has_body and not is_json_content_type(content_type):
            shown = content_type.decode("latin-1") if content_type is not None else "none"
            return (
                415,
                f"request body must be JSON (Content-Type: application/json), got Content-Type {shown}",
            )
        return None

    def _site_problem(self, host_header: bytes | None, origin_header: bytes | None) -> tuple[int, str] | None:
        """The Host and Origin checks, remembered per pair of header values: a server's callers
        send the same few, and the answer depends on nothing else."""
        key = (host_header, origin_header)
        try:
            return self._site_answers[key]
        except KeyError:
            pass
        answer = self._check_site(host_header, origin_header)
        if len(self._site_answers) >= _SITE_ANSWERS_KEPT:
            self._site_answers.clear()  # many distinct values (a scan): bounded, never grows
        self._site_answers[key] = answer
        return answer

    def _check_site(self, host_header: bytes | None, origin_header: bytes | None) -> tuple[int, str] | None:
        host = host_header.decode("latin-1") if host_header is not None else ""
        if host_header is not None and not self.host_allowed(_host_name(host)):
            return 400, (
                f"Host {host!r} is not a name this server answers to (its addresses, localhost, or "
                f"allowed_hosts / {ENV_ALLOWED_HOSTS}); refused to stop DNS rebinding"
            )
        if origin_header is not None:
            origin = origin_header.decode("latin-1")
            netloc = urlsplit(origin).netloc.lower() if "://" in origin else ""
            same = bool(netloc) and netloc == host.lower()
            if not same and not (netloc and (self.any_host or _host_name(netloc) in self.allowed)):
                return 403, f"cross-site request refused: Origin {origin!r} is not this server"
        return None


def read_headers(scope: Scope) -> dict[bytes, bytes]:
    """The first value of each header the guard reads (of every header, for a list)."""
    raw = scope.get("headers") or ()
    if isinstance(raw, (list, tuple)):
        return dict(reversed(raw))  # at C speed; reversed: the first value of a name wins
    headers: dict[bytes, bytes] = {}
    for key, value in raw:
        if key in _READ and key not in headers:
            headers[key] = value
    return headers
