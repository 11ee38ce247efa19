"""Exact-path endpoints answered straight from ASGI give the same answers starlette's routing gives,
and never take a request starlette would have routed elsewhere."""

from __future__ import annotations

import socket

import pytest
from starlette.responses import Response
from starlette.routing import Mount, Route

from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer, tool
from nemo_gym.serving import direct_routes
from nemo_gym.serving.direct_routes import direct_endpoints
from nemo_gym.serving.server import HTTPError
from nemo_gym.testing import running_server


async def _plain(request: object) -> Response:
    return Response(b"plain")


def _endpoint() -> object:
    async def run(request: object) -> Response:
        return Response(b"slow path")

    async def run_asgi(scope: object, receive: object, send: object) -> None:
        raise AssertionError

    run._ng_asgi = run_asgi  # type: ignore[attr-defined]
    return run


def test_only_leading_exact_paths_are_taken_and_never_a_shadowed_one() -> None:
    a, b, c, d = _endpoint(), _endpoint(), _endpoint(), _endpoint()
    routes = [
        Route("/", _plain, methods=["GET"]),
        Route("/a", a, methods=["POST"]),  # type: ignore[arg-type]
        Route("/b", _plain, methods=["POST"]),
        Route("/b", b, methods=["POST"]),  # type: ignore[arg-type]  # starlette serves the first /b
        Route("/{tool}", c, methods=["POST"]),  # type: ignore[arg-type]
        Route("/d", d, methods=["POST"]),  # type: ignore[arg-type]  # /{tool} matches /d first
    ]
    found = direct_endpoints(routes)
    assert set(found) == {("POST", "/a")}
    assert found[("POST", "/a")] is a._ng_asgi  # type: ignore[attr-defined]
    assert direct_endpoints([Mount("/m", app=_plain), Route("/a", a, methods=["POST"])]) == {}  # type: ignore[arg-type]


class CounterServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    async def seed_session(self, body):  # noqa: ANN001 - plain override
        self.session["count"] = 0
        return {}

    @tool
    async def add(self, body: dict) -> dict:
        self.session["count"] = self.session.get("count", 0) + int(body["amount"])
        return {"count": self.session["count"]}

    @tool
    async def explode(self, body: dict) -> dict:
        raise RuntimeError("boom")

    @tool
    async def teapot(self, body: dict) -> dict:
        raise HTTPError(418, "short and stout")


def _exchange(url: str, raw: bytes) -> tuple[bytes, list[bytes], bytes]:
    """Send one raw request; the status line, the headers (less Date and Set-Cookie's value), the body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(
            int(v) for k, _, v in (h.partition(b": ") for h in lines[1:]) if k.lower() == b"content-length"
        )
        while len(body) < length:
            body += sock.recv(65536)
    headers = sorted(
        h.split(b"=", 1)[0] if h.lower().startswith(b"set-cookie") else h
        for h in lines[1:]
        if not h.lower().startswith(b"date")
    )
    return lines[0], headers, body


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


REQUESTS = [
    _post("/seed_session", b"{}"),
    _post("/add", b'{"amount": 2}', b"cookie: session_id=abc\r\n"),
    _post("/add", b'{"amount": 2}'),
    _post("/add", b"{not json"),
    _post("/add", b"[1, 2]"),
    _post("/explode", b"{}"),
    _post("/teapot", b"{}"),
    _post("/ng-rollout/r-1/add", b'{"amount": 1}', b"cookie: other=1; session_id=xyz\r\n"),
    _post("/nowhere", b"{}"),
    b"GET /add HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n",
    _post("/add", b'{"amount": 1}' + b" " * 5000),  # over the body limit below
]


def _answers(monkeypatch: pytest.MonkeyPatch, direct: bool) -> list[tuple[bytes, list[bytes], bytes]]:
    if not direct:
        monkeypatch.setattr(direct_routes, "direct_endpoints", lambda routes: {})
    server = CounterServer({"name": "counter", "max_body_bytes": 4096})
    with running_server(server) as url:
        return [_exchange(url, raw) for raw in REQUESTS]


def test_direct_answers_are_the_answers_starlette_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    direct = _answers(monkeypatch, direct=True)
    with monkeypatch.context() as patch:
        routed = _answers(patch, direct=False)
    assert [status for status, _, _ in direct] == [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 400 Bad Request",
        b"HTTP/1.1 422 Unprocessable Entity",
        b"HTTP/1.1 500 Internal Server Error",
        b"HTTP/1.1 418 I'm a Teapot",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 404 Not Found",
        b"HTTP/1.1 405 Method Not Allowed",
        b"HTTP/1.1 413 Request Entity Too Large",
    ]
    assert direct == routed


def test_a_resources_servers_hops_are_direct() -> None:
    taken = direct_endpoints(CounterServer({"name": "counter"}).routes())
    assert {("POST", "/seed_session"), ("POST", "/add"), ("POST", "/verify")} <= set(taken)
