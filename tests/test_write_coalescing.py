"""A response head leaves together with its body (one vectored write), and never waits for a body
that does not come in the same step."""

from __future__ import annotations

import asyncio
import socket

from nemo_gym.serving.write_coalescing import CoalescingTransport


class RecordingTransport(asyncio.Transport):
    """A real transport's interface, recording what was written and how."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bytes]] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, chunks: object) -> None:
        self.calls.append(("writelines", b"".join(chunks)))  # type: ignore[arg-type]

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name == "peername" else default


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


async def test_head_and_body_leave_in_one_write() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(HEAD)
    assert inner.calls == []  # held for the body
    transport.write(b"{}")
    assert inner.calls == [("writelines", HEAD + b"{}")]
    await asyncio.sleep(0)
    assert inner.calls == [("writelines", HEAD + b"{}")]  # the scheduled flush has nothing left


async def test_a_head_without_a_body_in_the_same_step_goes_out_next_iteration() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(HEAD)  # an event stream: its first event comes later
    await asyncio.sleep(0)
    assert inner.calls == [("write", HEAD)]
    transport.write(b"data: 1\n\n")
    assert inner.calls == [("write", HEAD), ("write", b"data: 1\n\n")]


async def test_close_sends_a_held_head_first_and_other_calls_reach_the_transport() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(HEAD)
    transport.close()
    assert inner.calls == [("write", HEAD)] and inner.closed
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)
    transport.write(b"body bytes that are not a head")
    assert inner.calls[-1] == ("write", b"body bytes that are not a head")


def test_a_served_answer_arrives_in_one_segment() -> None:
    """A real server (uvicorn with this project's protocol): the head and body of a small JSON
    answer reach the client in one read, where uvicorn alone sends them as two segments."""
    import threading

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from nemo_gym.serving.uvicorn_factory import make_uvicorn_server

    async def hello(request: object) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/", hello)])
    server = make_uvicorn_server(app, embedded=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            threading.Event().wait(0.02)
        segments = []
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(20):
                client.sendall(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                first = client.recv(65536)
                segments.append(first)
                while not first.endswith(b'{"ok":true}'):
                    first += client.recv(65536)
        # Each answer's first read holds its body too (two separate writes arrive as two reads
        # almost always when the client waits for each answer).
        assert all(s.endswith(b'{"ok":true}') for s in segments), segments
    finally:
        server.should_exit = True
        thread.join(timeout=10)
