"""Exact-path endpoints answered straight from ASGI give the same answers starlette's routing gives,
and never take a request starlette would have routed elsewhere."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
from starlette.responses import Response
from starlette.routing import Host, Mount, Route

from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer, tool
from nemo_gym.serving import direct_routes
from nemo_gym.serving.direct_routes import direct_endpoints
from nemo_gym.serving.server import HTTPError
from nemo_gym.testing import running_server
from responses_api_models.scripted_model.app import ScriptedModel


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
    # A path no earlier route could match is taken after them; a mount's paths are not.
    e = _endpoint()
    assert set(direct_endpoints([*routes, Route("/e/f", e, methods=["POST"])])) == {  # type: ignore[arg-type]
        ("POST", "/a"),
        ("POST", "/e/f"),
    }
    assert direct_endpoints([Mount("/m", app=_plain), Route("/m/a", a, methods=["POST"])]) == {}  # type: ignore[arg-type]
    assert set(direct_endpoints([Mount("/m", app=_plain), Route("/a", a, methods=["POST"])])) == {
        ("POST", "/a")
    }  # type: ignore[arg-type]
    assert direct_endpoints([Mount("", app=_plain), Route("/a", a, methods=["POST"])]) == {}  # type: ignore[arg-type]
    assert direct_endpoints([Host("h", app=_plain), Route("/a", a, methods=["POST"])]) == {}  # type: ignore[arg-type]


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
    async def big(self, body: dict) -> dict:
        return {"text": "x" * 70_000}  # an answer past the size written with its head in one join

    @tool
    async def explode(self, body: dict) -> dict:
        raise RuntimeError("boom")

    @tool
    async def teapot(self, body: dict) -> dict:
        raise HTTPError(418, "short and stout")

    @tool
    async def leak(self, body: dict) -> dict:
        raise RuntimeError("upstream said: bad key sk-abcdefghijklmnopqrstuvwxyz0123")

    @tool
    async def wait(self, body: dict) -> dict:
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return {}

    def model_post_init(self, context: object) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()


def _read_answers(sock: socket.socket, count: int) -> list[tuple[bytes, list[bytes], bytes]]:
    """Read ``count`` answers: each one's status line, headers (less Date and Set-Cookie's value), body."""
    data = b""
    answers = []
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return answers + [(b"closed", [], data)]
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        if lines[0].startswith(b"HTTP/1.1 100"):
            answers.append((lines[0], [], b""))
            continue
        length = next(
            int(v) for k, _, v in (h.partition(b": ") for h in lines[1:]) if k.lower() == b"content-length"
        )
        while len(data) < length:
            data += sock.recv(65536)
        body, data = data[:length], data[length:]
        headers = sorted(
            h.split(b"=", 1)[0] if h.lower().startswith(b"set-cookie") else h
            for h in lines[1:]
            if not h.lower().startswith(b"date")
        )
        answers.append((lines[0], headers, body))
    return answers


def _exchange(url: str, raw: bytes, count: int = 1) -> list[tuple[bytes, list[bytes], bytes]]:
    """Send raw requests in one write; ``count`` answers, then whether the server closed the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        answers = _read_answers(sock, count)
        sock.settimeout(0.2)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
    return [*answers, (b"closed" if closed else b"open", [], b"")]


def _post(path: str, body: bytes, extra: bytes = b"", kind: bytes = b"application/json") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n".encode()
        + (b"content-type: " + kind + b"\r\n" if kind else b"")
        + f"content-length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def _chunked(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        "transfer-encoding: chunked\r\n\r\n".encode()
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )


REQUESTS: list[bytes | tuple[bytes, int]] = [
    _post("/seed_session", b"{}"),
    _post("/add", b'{"amount": 2}', b"cookie: session_id=abc\r\n"),
    _post("/add", b'{"amount": 2}'),
    _post("/add", b"{not json"),
    _post("/add", b"[1, 2]"),
    _post("/add", b'{"amount": "x"}'),
    _post("/add", b""),
    _post("/explode", b"{}"),
    _post("/teapot", b"{}"),
    _post("/leak", b"{}"),
    _post("/ng-rollout/r-1/add", b'{"amount": 1}', b"cookie: other=1; session_id=xyz\r\n"),
    _post("/ng-rollout/r-2/training-token-capture/add", b'{"amount": 1}'),
    _post("/nowhere", b"{}"),
    b"GET /add HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n",
    _post("/add", b'{"amount": 1}' + b" " * 5000),  # over the body limit below
    _chunked("/add", b'{"amount": 3}'),
    _chunked("/add", b'{"amount": 3}' + b" " * 5000),  # over the limit, no length declared
    _post("/add", b'{"amount": 4}', b"expect: 100-continue\r\n"),
    _post("/add", b'{"amount": 4}', b"Expect: 100-Continue\r\n"),
    _post("/add", b'{"amount": 4}', b"expect: other\r\nexpect: 100-continue\r\n"),  # any of them
    _post("/add", b'{"amount": 4}', b"expect: other\r\n"),
    _post("/add", b'{"amount": 2}', b"Cookie: session_id=abc\r\nContent-Type: text/plain\r\n"),
    _post("/add", b'{"amount": 1}', kind=b"text/plain"),  # not JSON: refused
    _post("/add", b'{"amount": 1}', kind=b""),
    _post("/add", b"", kind=b"text/plain"),  # no body: its type is not looked at (then no amount: 500)
    _post("/add", b'{"amount": 1}', kind=b"application/vnd.example+json; charset=utf-8"),
    _post("/add", b"{}").replace(b"host: 127.0.0.1", b"host: rebound.example"),
    _post("/add", b"{}").replace(b"host: 127.0.0.1", b"host: 127.0.0.1\r\norigin: http://evil.example"),
    _post("/add", b'{"amount": 1}').replace(b"HTTP/1.1", b"HTTP/1.0"),
    _post("/big", b"{}"),
    _post("/add?amount=9", b'{"amount": 1}'),  # a target that is not a plain path: parsed
    _post("/a%64d", b'{"amount": 1}'),
    _post("/ng-rollout/r-3/add#part", b'{"amount": 1}'),
    (_post("/add", b'{"amount": 1}') + _post("/explode", b"{}") + _post("/add", b'{"amount": 5}'), 3),
]


def _answers(
    monkeypatch: pytest.MonkeyPatch, direct: bool, lean: bool
) -> list[list[tuple[bytes, list[bytes], bytes]]]:
    monkeypatch.setenv("NEMO_GYM_LEAN_HTTP", "1" if lean else "0")
    if not direct:
        monkeypatch.setattr(direct_routes, "direct_endpoints", lambda routes: {})
    server = CounterServer({"name": "counter", "max_body_bytes": 4096})
    with running_server(server) as url:
        return [
            _exchange(url, *(request if isinstance(request, tuple) else (request,))) for request in REQUESTS
        ]


def test_direct_answers_are_the_answers_starlette_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Served by the lean protocol's direct serving, by the direct routes through ASGI (uvicorn's
    own protocol) and by starlette's routing: the same bytes for every request."""
    modes = {}
    for direct, lean in ((True, True), (True, False), (False, True)):
        with monkeypatch.context() as patch:
            modes[direct, lean] = _answers(patch, direct=direct, lean=lean)
    fused = modes[True, True]
    assert [answer[0][0] for answer in fused] == [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 400 Bad Request",
        b"HTTP/1.1 422 Unprocessable Entity",
        b"HTTP/1.1 500 Internal Server Error",
        b"HTTP/1.1 500 Internal Server Error",
        b"HTTP/1.1 500 Internal Server Error",
        b"HTTP/1.1 418 I'm a Teapot",
        b"HTTP/1.1 500 Internal Server Error",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 404 Not Found",
        b"HTTP/1.1 405 Method Not Allowed",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 413 Request Entity Too Large",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 413 Request Entity Too Large",
        b"HTTP/1.1 100 Continue",
        b"HTTP/1.1 100 Continue",
        b"HTTP/1.1 100 Continue",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",  # the first Content-Type counts
        b"HTTP/1.1 415 Unsupported Media Type",
        b"HTTP/1.1 415 Unsupported Media Type",
        b"HTTP/1.1 500 Internal Server Error",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 400 Bad Request",
        b"HTTP/1.1 403 Forbidden",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
    ]
    assert len(fused[-5][0][2]) > 70_000
    assert b"sk-abcdefghijklmnop" not in fused[9][0][2] and b"REDACTED" in fused[9][0][2]
    assert [status for status, _, _ in fused[-1]] == [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 500 Internal Server Error",
        b"HTTP/1.1 200 OK",
        b"open",
    ]
    assert fused[15][-1][0] == fused[17][-1][0] == b"closed"  # the rest of a refused body is never read
    assert modes[True, False] == fused
    assert modes[False, True] == fused


def test_a_body_that_comes_too_slowly_is_answered_408_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = []
    for lean in (True, False):
        monkeypatch.setenv("NEMO_GYM_LEAN_HTTP", "1" if lean else "0")
        with running_server(CounterServer({"name": "counter", "body_timeout_s": 0.3})) as url:
            answers.append(_exchange(url, _post("/add", b'{"amount": 1}')[:-5]))
    assert answers[0][0][0] == b"HTTP/1.1 408 Request Timeout"
    assert b"request body not received within 0.3s" in answers[0][0][2]
    assert answers[0] == answers[1]


@pytest.mark.parametrize("lean", [True, False])
def test_a_direct_routes_handler_is_cancelled_when_its_caller_hangs_up(
    monkeypatch: pytest.MonkeyPatch, lean: bool
) -> None:
    monkeypatch.setenv("NEMO_GYM_LEAN_HTTP", "1" if lean else "0")
    server = CounterServer({"name": "counter"})
    with running_server(server) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(_post("/ng-rollout/r-9/wait", b"{}"))
            assert server.started.wait(10)
        assert server.cancelled.wait(10), "the handler kept running after its caller hung up"
        # The server goes on serving.
        assert _exchange(url, _post("/add", b'{"amount": 1}'))[0][0] == b"HTTP/1.1 200 OK"


def test_a_model_servers_errors_have_openai_shape_on_every_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model server's direct routes shape their error answers as OpenAIErrorBodies does."""
    requests = [
        _post("/v1/responses", b"{not json"),
        _post("/v1/responses", b'{"input": 7}'),
        _post("/ng-rollout/r-1/v1/responses", b'{"input": "hi", "metadata": 5}'),
        _post("/v1/responses", b'{"input": "hi"}' + b" " * 5000),
        _post("/v1/responses", b'{"input": "hi"}', kind=b"text/plain"),
        _post("/v1/chat/completions", b'{"messages": "hi"}'),
        _post("/v1/nowhere", b"{}"),
    ]
    answers = {}
    for lean in (True, False):
        monkeypatch.setenv("NEMO_GYM_LEAN_HTTP", "1" if lean else "0")
        server = ScriptedModel({"name": "scripted", "scripts": [], "max_body_bytes": 4096})
        with running_server(server) as url:
            answers[lean] = [_exchange(url, raw) for raw in requests]
    assert answers[True] == answers[False]
    for answer in answers[True]:
        status, headers, body = answer[0]
        assert int(status.split()[1]) >= 400
        assert b"x-nemo-gym-server: scripted" in headers
        assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}


def test_a_resources_servers_hops_are_direct() -> None:
    taken = direct_endpoints(CounterServer({"name": "counter"}).routes())
    assert {("POST", "/seed_session"), ("POST", "/add"), ("POST", "/verify")} <= set(taken)
    # The lean protocol finds them (the rollout prefix and capture segment stripped) on the app.
    direct = CounterServer({"name": "counter"}).build_app().ng_direct  # type: ignore[attr-defined]
    assert direct.find("POST", "/ng-rollout/r-1/training-token-capture/add")[1:] == ("/add", "r-1")
    assert direct.find("POST", "/add")[1:] == ("/add", None)
    assert direct.find("GET", "/add") is None and direct.find("POST", "/nowhere") is None
    # Found again from memory: the same answers, each target's own rollout id, a bounded memory.
    for _ in range(2):
        assert direct.find("POST", "/ng-rollout/r-1/training-token-capture/add")[1:] == ("/add", "r-1")
        assert direct.find("POST", "/ng-rollout/r-2/add")[1:] == ("/add", "r-2")
        assert direct.find("GET", "/add") is None and direct.find("GET", "/ng-rollout/r-1/add") is None
    for rollout in range(3000):
        assert direct.find("POST", f"/ng-rollout/many-{rollout}/add")[1:] == ("/add", f"many-{rollout}")
    assert len(direct._found) <= 1024
    model = ScriptedModel({"name": "scripted", "scripts": []}).build_app()
    assert model.ng_direct.find("POST", "/v1/responses") is not None  # type: ignore[attr-defined]
    # After DELETE /v1/responses/{response_id}, which cannot match it.
    assert model.ng_direct.find("POST", "/v1/chat/completions") is not None  # type: ignore[attr-defined]
    assert model.ng_direct.shape is not None  # type: ignore[attr-defined]
