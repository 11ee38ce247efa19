"""The lean HTTP/1.1 protocol (nemo_gym/serving/http_protocol.py) answers byte for byte as uvicorn's
httptools protocol with this project's layers does: the same raw requests, over real sockets, to
the same app served each way (``NEMO_GYM_LEAN_HTTP=0`` is uvicorn's)."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from nemo_gym.serving.http_protocol import HopHttpProtocol
from nemo_gym.serving.uvicorn_factory import make_uvicorn_server


async def echo(request: Request) -> Response:
    body = await request.body()
    return JSONResponse(
        {
            "method": request.method,
            "path": request.scope["path"],
            "raw_path": request.scope["raw_path"].decode(),
            "query": request.scope["query_string"].decode(),
            "http_version": request.scope["http_version"],
            "headers": [[k.decode(), v.decode()] for k, v in request.scope["headers"]],
            "body": len(body),
        }
    )


async def empty(request: Request) -> Response:
    return Response(status_code=204)


async def stream(request: Request) -> Response:
    async def events() -> Iterator[bytes]:  # type: ignore[misc]
        for n in range(3):
            yield b"data: %d\n\n" % n

    return StreamingResponse(events(), media_type="text/event-stream")


async def injected(request: Request) -> Response:
    return Response(b"x", headers={"x-bad": "a\r\nx-injected: yes"})


async def fails(request: Request) -> Response:
    raise RuntimeError("boom")


APP = Starlette(
    routes=[
        Route("/echo/{rest:path}", echo, methods=["GET", "POST", "HEAD"]),
        Route("/empty", empty),
        Route("/stream", stream),
        Route("/injected", injected),
        Route("/fails", fails),
    ]
)

CLOSE = b"GET /echo/last HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
EXCHANGES = {
    "get": b"GET /echo/a HTTP/1.1\r\nHost: t\r\n\r\n" + CLOSE,
    "post with a length": b"POST /echo/b HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello" + CLOSE,
    "post chunked": b"POST /echo/c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n" + CLOSE,
    "query and escapes": b"GET /echo/d%20e/f?x=1&y=%2F HTTP/1.1\r\nHost: t\r\n\r\n" + CLOSE,
    "absolute form": b"GET http://t/echo/g?z=2 HTTP/1.1\r\nHost: t\r\n\r\n" + CLOSE,
    "head": b"HEAD /echo/h HTTP/1.1\r\nHost: t\r\n\r\n" + CLOSE,
    "no content": b"GET /empty HTTP/1.1\r\nHost: t\r\n\r\n" + CLOSE,
    "streamed": b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n" + CLOSE,
    "pipelined three": b"GET /echo/1 HTTP/1.1\r\nHost: t\r\n\r\nPOST /echo/2 HTTP/1.1\r\nHost: t\r\n"
    b"Content-Length: 2\r\n\r\nhi" + CLOSE,
    "http/1.0": b"GET /echo/old HTTP/1.0\r\nHost: t\r\n\r\n",
    "not found then more": b"POST /nowhere HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc" + CLOSE,
    "malformed": b"GET /echo/x HTTP/1.1\r\nHost t\r\n\r\n",
    "header injection refused": b"GET /injected HTTP/1.1\r\nHost: t\r\n\r\n",
    "app failure": b"GET /fails HTTP/1.1\r\nHost: t\r\n\r\n",
    "expect 100-continue": b"POST /echo/e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
    b"Content-Length: 2\r\nConnection: close\r\n\r\nok",
}


@contextmanager
def served(lean: bool, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, object]]:
    monkeypatch.setenv("NEMO_GYM_LEAN_HTTP", "1" if lean else "0")
    server = make_uvicorn_server(APP, embedded=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(250):
            if server.started:
                break
            threading.Event().wait(0.02)
        yield sock.getsockname()[1], server
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` in one write and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(data)
        received = b""
        while chunk := client.recv(65536):
            received += chunk
    return re.sub(rb"date: [^\r]*\r\n", b"", received)


def test_the_lean_protocol_answers_as_uvicorns_does(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {}
    for lean in (True, False):
        with served(lean, monkeypatch) as (port, server):
            protocol = server.config.http  # type: ignore[attr-defined]
            assert issubclass(protocol, HopHttpProtocol) == lean
            answers[lean] = {name: exchange(port, data) for name, data in EXCHANGES.items()}
    for name in EXCHANGES:
        assert answers[True][name] == answers[False][name], name
    lean = answers[True]
    # What those answers are (so that two equally wrong protocols cannot pass the comparison).
    assert lean["pipelined three"].count(b"HTTP/1.1 200 OK") == 3
    assert b'"path":"/echo/1"' in lean["pipelined three"].split(b'"path":"/echo/2"')[0]
    assert b'"body":7' in lean["post chunked"]
    assert b'"path":"/echo/d e/f","raw_path":"/echo/d%20e/f","query":"x=1&y=%2F"' in lean["query and escapes"]
    assert b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 0\n\n\r\n" in lean["streamed"]
    assert lean["head"].startswith(b"HTTP/1.1 200 OK") and b"}HTTP/1.1" not in lean["head"]
    assert lean["http/1.0"].count(b"HTTP/1.1 200") == 1 and b"connection: close" in lean["http/1.0"]
    assert lean["malformed"].startswith(b"HTTP/1.1 400 Bad Request")
    assert lean["header injection refused"] == b""  # nothing sent: the connection was closed
    assert lean["app failure"].startswith(b"HTTP/1.1 500 Internal Server Error")
    assert lean["expect 100-continue"].startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert (
        lean["not found then more"].startswith(b"HTTP/1.1 404")
        and b'"path":"/echo/last"' in lean["not found then more"]
    )


def test_a_streamed_answers_head_leaves_before_its_first_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream whose first event is late: the head must not wait for it (a client reads the
    status and headers first)."""
    import asyncio

    released = threading.Event()

    async def slow(request: Request) -> Response:
        async def events() -> Iterator[bytes]:  # type: ignore[misc]
            while not released.is_set():
                await asyncio.sleep(0.01)
            yield b"data: late\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    global APP
    saved = APP
    APP = Starlette(routes=[Route("/slow", slow)])
    try:
        with served(True, monkeypatch) as (port, _):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                client.sendall(b"GET /slow HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                head = client.recv(65536)
                assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n"), head
                released.set()
                rest = b""
                while chunk := client.recv(65536):
                    rest += chunk
                assert b"data: late" in rest
    finally:
        APP = saved
