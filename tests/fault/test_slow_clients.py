"""Half-sent requests are cut: headers and bodies that arrive too slowly get a 408 and a closed socket."""

from __future__ import annotations

import http.client
import socket
import time

import pytest

from nemo_gym.testing import SyncClient, running_server
from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer


@pytest.fixture(scope="module")
def port():
    server = ExampleSingleToolCallServer({"name": "weather", "header_timeout_s": 0.5, "body_timeout_s": 0.5})
    with running_server(server) as url:
        yield int(url.rsplit(":", 1)[1])


def read_until_closed(sock: socket.socket, timeout_s: float = 5.0) -> bytes:
    sock.settimeout(timeout_s)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def test_half_sent_headers_are_cut(port):
    socks = []
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic")
        socks.append(sock)
    silent = socket.create_connection(("127.0.0.1", port))  # never sends a byte
    started = time.monotonic()
    answers = [read_until_closed(s) for s in socks]
    silent_answer = read_until_closed(silent)
    assert time.monotonic() - started < 4
    for answer in answers + [silent_answer]:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        assert b"headers not received" in answer
    for sock in socks + [silent]:
        sock.close()
    with SyncClient() as client:
        assert client.get(f"http://127.0.0.1:{port}/")[0] == 200


def test_half_sent_body_is_cut_with_a_json_408(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        b'{"responses'
    )
    started = time.monotonic()
    answer = read_until_closed(sock)
    sock.close()
    assert time.monotonic() - started < 4
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"application/json" in answer and b"request body not received" in answer


def test_slow_chunked_body_is_cut(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    sock.settimeout(5)
    started = time.monotonic()
    # A trickle: each chunk arrives before any idle timeout could fire, but the whole body is late.
    try:
        for _ in range(20):
            sock.sendall(b"1\r\n \r\n")
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < 4


def test_an_idle_kept_alive_connection_is_not_cut_by_the_header_timeout(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/")
    assert conn.getresponse().read()
    time.sleep(1.2)  # past the header timeout, well within keep-alive
    conn.request("GET", "/")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read()
    conn.close()


def test_half_sent_headers_of_a_later_request_on_a_kept_alive_connection_are_cut(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    sock.settimeout(5)
    first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200"), first[:100]
    time.sleep(0.8)  # idle past the header timeout: not cut, it was between requests
    sock.sendall(b"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
    started = time.monotonic()
    answer = read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert 0.3 < time.monotonic() - started < 4


def test_only_a_body_uvicorn_already_holds_skips_the_body_timer():
    from nemo_gym.serving.request_guard import _body_buffered

    class Cycle:
        def __init__(self, more_body: bool, arrived: bool) -> None:
            import asyncio

            self.more_body = more_body
            self.message_event = asyncio.Event()
            if arrived:
                self.message_event.set()

        async def receive(self) -> dict:
            return {}

    assert _body_buffered(Cycle(False, True).receive)
    assert not _body_buffered(Cycle(True, True).receive)
    assert not _body_buffered(Cycle(False, False).receive)
    assert not _body_buffered(lambda: None)  # type: ignore[arg-type,return-value]


def test_an_idle_websocket_is_not_cut_by_the_header_timeout():
    """A WebSocket upgrade hands the connection to another protocol: the header clock stops, and
    no HTTP 408 is ever written into the WebSocket stream (the OpenEnv bridge's sessions)."""
    pytest.importorskip("websockets")
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from websockets.sync.client import connect

    from nemo_gym.testing import running_app

    async def echo(websocket):
        await websocket.accept()
        while True:
            await websocket.send_text(await websocket.receive_text())

    with running_app(Starlette(routes=[WebSocketRoute("/ws", echo)]), header_timeout_s=0.5) as url:
        with connect(url.replace("http://", "ws://") + "/ws", ping_interval=None) as ws:
            ws.send("first")
            assert ws.recv(timeout=5) == "first"
            time.sleep(1.2)  # past the header timeout
            ws.send("after")
            assert ws.recv(timeout=5) == "after"
