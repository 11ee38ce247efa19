"""The lean hop client against real loopback servers: keep-alive reuse, the stale-connection
retry rule, deadlines, size caps, chunked and streamed answers, fault classes, cancellation."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Awaitable, Callable

import pytest

from nemo_gym.launch.launcher import free_port
from nemo_gym.serving import hop_client
from nemo_gym.serving.server_client import ServerCallError, ServerClient
from nemo_gym.testing.raw_http import read_request

pytestmark = pytest.mark.timeout(60)

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{"ok": 1 }'

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


class ScriptedServer:
    """A raw HTTP/1.1 server on 127.0.0.1 whose answer to the n-th request is scripted.

    ``handler(reader, writer, n)`` writes the answer (or not) and returns whether to keep the
    connection for another request. Counts connections and requests it read.
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests = 0
        self.open_now = 0
        self.most_open = 0
        self.eof_seen = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> ScriptedServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            while True:
                head, _ = await read_request(reader)
                self.requests += 1
                if not await self.handler(reader, writer, self.requests):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof_seen.set()
        except asyncio.CancelledError:
            pass  # the test ended while this handler still waited
        finally:
            self.open_now -= 1
            writer.close()


async def answer_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
    writer.write(OK)
    await writer.drain()
    return True


async def call(pool: hop_client.HopPool, port: int, path: str = "/x", deadline_s: float = 5.0, **kw):
    return await hop_client.request(
        pool,
        "POST",
        "127.0.0.1",
        port,
        path,
        hop_client.encode_headers([("Content-Type", "application/json")]),
        b"{}",
        deadline=pool.loop.time() + deadline_s,
        **kw,
    )


async def test_keep_alive_reuses_one_connection():
    async with ScriptedServer(answer_ok) as server:
        pool = hop_client.HopPool(8)
        for _ in range(20):
            resp = await call(pool, server.port)
            assert resp.status == 200 and resp.body == b'{"ok": 1 }'
            assert resp.headers["content-type"] == "application/json"
        assert server.connections == 1 and server.requests == 20 and pool.open_connections == 1
        pool.close()


async def test_connection_cap_holds_under_a_burst():
    async def slow(reader, writer, n):
        await asyncio.sleep(0.05)
        return await answer_ok(reader, writer, n)

    async with ScriptedServer(slow) as server:
        pool = hop_client.HopPool(3)
        answers = await asyncio.gather(*(call(pool, server.port) for _ in range(30)))
        assert all(a.status == 200 for a in answers)
        assert server.most_open <= 3 and server.connections == 3
        pool.close()


async def test_a_pooled_connection_the_server_dropped_is_sent_again_once_on_a_new_one():
    async def drop_second(reader, writer, n):
        if n == 2:
            return False  # read the request, close without a byte of answer (a stale keep-alive)
        return await answer_ok(reader, writer, n)

    async with ScriptedServer(drop_second) as server:
        pool = hop_client.HopPool(8)
        await call(pool, server.port)
        resp = await call(pool, server.port)  # goes out on the pooled connection, then on a new one
        assert resp.status == 200 and server.connections == 2 and server.requests == 3
        pool.close()


async def test_a_request_on_a_new_connection_that_gets_no_answer_is_not_sent_twice():
    async def drop(reader, writer, n):
        return False

    async with ScriptedServer(drop) as server:
        pool = hop_client.HopPool(8)
        with pytest.raises(hop_client.HopDisconnected) as info:
            await call(pool, server.port)
        assert not info.value.reused and server.requests == 1
        pool.close()


async def test_a_partial_answer_on_a_pooled_connection_is_not_sent_twice():
    async def half(reader, writer, n):
        if n == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")
            await writer.drain()
            return False
        return await answer_ok(reader, writer, n)

    async with ScriptedServer(half) as server:
        pool = hop_client.HopPool(8)
        await call(pool, server.port)
        with pytest.raises(hop_client.HopDisconnected) as info:
            await call(pool, server.port)
        assert info.value.reused and info.value.received > 0 and server.requests == 2
        pool.close()


async def test_chunked_and_close_delimited_answers_are_read_whole():
    async def chunked(reader, writer, n):
        if n == 1:
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()
        return False

    async with ScriptedServer(chunked) as server:
        pool = hop_client.HopPool(8)
        assert (await call(pool, server.port)).body == b"hello world"
        assert (await call(pool, server.port)).body == b"until the end"
        assert server.connections == 1
        pool.close()


async def test_a_streamed_answer_arrives_before_it_ends_and_can_be_abandoned():
    release, abandoned = asyncio.Event(), asyncio.Event()

    async def events(reader, writer, n):
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(b"8\r\ndata: 1\n\r\n")
        await writer.drain()
        if n == 2:  # the client abandons this one: the server sees the connection end
            if await reader.read(1) == b"":
                abandoned.set()
            return False
        await release.wait()
        writer.write(b"8\r\ndata: 2\n\r\n0\r\n\r\n")
        await writer.drain()
        return True

    async with ScriptedServer(events) as server:
        pool = hop_client.HopPool(8)
        resp = await call(pool, server.port, stream=True)
        assert resp.headers["content-type"] == "text/event-stream"
        chunks = resp.chunks()
        assert await chunks.__anext__() == b"data: 1\n"  # before the server wrote the rest
        release.set()
        assert [c async for c in chunks] == [b"data: 2\n"]
        assert pool.open_connections == 1  # read to the end: back in the pool
        second = await call(pool, server.port, stream=True)
        assert await second.chunks().__anext__() == b"data: 1\n"
        second.close()  # abandoned mid-stream: the connection is closed, the server sees it
        await asyncio.wait_for(abandoned.wait(), 5)
        assert pool.open_connections == 0
        pool.close()


async def test_deadline_covers_a_hung_answer_and_waiting_for_a_connection():
    async def hang(reader, writer, n):
        await asyncio.sleep(30)
        return False

    async with ScriptedServer(hang) as server:
        pool = hop_client.HopPool(1)
        started = time.monotonic()
        hung = asyncio.ensure_future(call(pool, server.port, deadline_s=0.4))
        await asyncio.sleep(0.05)
        with pytest.raises(hop_client.HopTimeout):  # waits for the one connection, in vain
            await call(pool, server.port, deadline_s=0.2)
        with pytest.raises(hop_client.HopTimeout):
            await hung
        assert time.monotonic() - started < 2
        pool.close()


async def test_a_reused_connections_deadline_is_each_requests_own():
    """The deadline timer stays armed between requests on a connection: a later request with a
    shorter deadline still times out at its own, one with a longer deadline outlives the
    timer armed for an earlier request, and an answered request never times out later."""

    async def slow_third(reader, writer, n):
        if n in (3, 4):
            await asyncio.sleep(0.5 if n == 3 else 0.3)
        return await answer_ok(reader, writer, n)

    async with ScriptedServer(slow_third) as server:
        pool = hop_client.HopPool(1)
        assert (await call(pool, server.port, deadline_s=0.2)).status == 200  # armed for 0.2 s
        assert (await call(pool, server.port, deadline_s=30)).status == 200
        started = time.monotonic()
        # Past the first request's 0.2 s (the timer fires, finds this later deadline, re-arms).
        assert (await call(pool, server.port, deadline_s=30)).status == 200
        assert time.monotonic() - started >= 0.45
        started = time.monotonic()
        with pytest.raises(hop_client.HopTimeout):  # shorter than the armed one: its own
            await call(pool, server.port, deadline_s=0.1)
        assert time.monotonic() - started < 0.28
        answered = await call(pool, server.port, deadline_s=0.1)  # a new connection
        assert answered.status == 200
        await asyncio.sleep(0.2)  # past its deadline, idle: nothing fails, the connection is reused
        assert (await call(pool, server.port)).status == 200
        assert server.connections == 2 and pool.open_connections == 1
        pool.close()


async def test_an_answer_over_the_cap_is_refused():
    big = b"x" * (2 << 20)

    async def huge(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
        await writer.drain()
        return True

    async with ScriptedServer(huge) as server:
        client = ServerClient(
            static_urls={"big": f"http://127.0.0.1:{server.port}"}, max_answer_bytes=1 << 20
        )
        with pytest.raises(ServerCallError) as info:
            await client.post("big", "/x", {})
        assert info.value.kind == "bad_upstream_body" and "exceeds" in str(info.value)
        await client.close()


async def test_a_cancelled_call_closes_its_connection():
    async def hang(reader, writer, n):
        await asyncio.sleep(30)
        return False

    async with ScriptedServer(hang) as server:
        pool = hop_client.HopPool(8)
        task = asyncio.ensure_future(call(pool, server.port))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.open_connections == 0
        pool.close()


async def test_fault_classes_through_server_client():
    async def faults(reader, writer, n):
        if n == 1:
            body = b'{"error":"busy"}'
            head = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
            writer.write(head % len(body) + body)
            await writer.drain()
            return False
        if n == 2:  # reset: RST instead of an answer
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        await asyncio.sleep(30)
        return False

    async with ScriptedServer(faults) as server:
        client = ServerClient(static_urls={"s": f"http://127.0.0.1:{server.port}"}, connect_retries=1)
        resp = await client.post("s", "/x", {})
        assert resp.status == 503 and resp.json() == {"error": "busy"}
        with pytest.raises(ServerCallError) as info:  # a fresh connection reset: not sent again
            await client.post("s", "/x", {}, timeout_s=5)
        assert info.value.kind == "unreachable"
        with pytest.raises(ServerCallError) as info:
            await client.post("s", "/x", {}, timeout_s=0.3)
        assert info.value.kind == "timeout"
        await client.close()
    refused = ServerClient(static_urls={"gone": f"http://127.0.0.1:{free_port()}"}, connect_retries=1)
    with pytest.raises(ServerCallError) as info:
        await refused.post("gone", "/x", {})
    assert info.value.kind == "unreachable" and "connection refused" in str(info.value)
    await refused.close()


def test_a_header_with_a_line_break_is_refused():
    with pytest.raises(ValueError):
        hop_client.encode_headers([("Cookie", "a=1\r\nX-Evil: 1")])
    request = hop_client.build_request("GET", "h", 1, "/a\r\nX:1", b"", None)
    assert isinstance(request, bytes) and request.startswith(b"GET /a%0D%0AX:1 HTTP/1.1\r\nHost: h:1\r\n")


async def test_a_second_answer_to_one_request_closes_the_connection():
    async def twice(reader, writer, n):
        writer.write(OK + OK)
        await writer.drain()
        return True

    async with ScriptedServer(twice) as server:
        pool = hop_client.HopPool(8)
        assert (await call(pool, server.port)).status == 200
        await asyncio.sleep(0.05)
        assert pool.open_connections == 0  # not reused: its next answer would be the stray one
        assert (await call(pool, server.port)).status == 200 and server.connections == 2
        pool.close()


async def test_a_run_that_reached_a_replica_is_not_sent_to_another_after_a_disconnect():
    from aiohttp import web

    from nemo_gym.testing import serving_aiohttp_app

    async def drop(reader, writer, n):
        return False  # read the request, close without answering (the server died mid-rollout)

    async with ScriptedServer(drop) as one, ScriptedServer(drop) as two:
        urls = [f"http://127.0.0.1:{one.port}", f"http://127.0.0.1:{two.port}"]

        async def instances(request: web.Request) -> web.Response:
            return web.json_response(
                [
                    {"name": "agent", "url": u, "host": "127.0.0.1", "port": int(u.rsplit(":", 1)[1])}
                    for u in urls
                ]
            )

        app = web.Application()
        app.router.add_get("/server_instances", instances)
        async with serving_aiohttp_app(app) as url:
            client = ServerClient(url)
            try:
                with pytest.raises(ServerCallError) as info:
                    await client.post("agent", "/run", {}, rollout_id="r1")
                assert info.value.kind == "unreachable"
                assert one.requests + two.requests == 1  # not re-sent to the other replica
            finally:
                await client.close()


def test_a_caller_that_hangs_up_is_seen_by_the_server_further_down():
    """ServerClient's call cancelled (its own caller went away): the uvicorn server it was
    calling sees the disconnect and can stop the work (the server base's disconnect watch)."""
    import threading

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from nemo_gym.testing import running_app

    started, gone = threading.Event(), threading.Event()

    async def work(request: Request) -> Response:
        started.set()
        while not await request.is_disconnected():
            await asyncio.sleep(0.02)
        gone.set()
        return Response(status_code=499)

    with running_app(Starlette(routes=[Route("/work", work, methods=["POST"])])) as url:

        async def main() -> None:
            client = ServerClient(static_urls={"down": url})
            task = asyncio.ensure_future(client.post("down", "/work", {}))
            while not started.is_set():
                await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await client.close()

        asyncio.run(main())
        assert gone.wait(5)


async def test_upstream_streams_through_the_hop_client_and_a_closed_stream_hangs_up():
    from nemo_gym.serving.upstream import UpstreamError, UpstreamHTTP

    hung_up = asyncio.Event()

    async def events(reader, writer, n):
        if n == 1:  # a dropped first try with no answer: retried, as aiohttp's path does
            return False
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(b"8\r\ndata: 1\n\r\n")
        await writer.drain()
        if await reader.read(1) == b"":
            hung_up.set()
        return False

    async with ScriptedServer(events) as server:
        http = UpstreamHTTP(connect_retries=2, request_timeout_s=10)
        answer = await http.open_stream(
            "POST", f"http://127.0.0.1:{server.port}/v1/responses", {"stream": True}
        )
        assert answer.ok and answer.is_event_stream and answer.hop is not None and answer.attempts == 2
        chunks = answer.chunks()
        assert await chunks.__anext__() == b"data: 1\n"
        answer.close()
        await asyncio.wait_for(hung_up.wait(), 5)
        with pytest.raises(UpstreamError) as info:  # nothing listens there any more
            await http.request("POST", f"http://127.0.0.1:{free_port()}/v1/responses", {})
        assert info.value.kind == "unreachable" and "connection refused" in str(info.value)
        await http.close()


def test_a_server_on_this_machine_is_reached_through_its_unix_socket():
    import os
    import stat

    from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer, tool
    from nemo_gym.serving import local_socket
    from nemo_gym.testing import running_server

    class Counter(SimpleResourcesServer):
        config: BaseResourcesServerConfig

        @tool
        async def count(self, body: dict) -> dict:
            self.session["n"] = self.session.get("n", 0) + 1
            return {"n": self.session["n"]}

    directory = local_socket.socket_dir()
    assert directory is not None and stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    with running_server(Counter({"name": "counter"})) as url:
        port = int(url.rsplit(":", 1)[1])
        path = local_socket.socket_path(directory, "127.0.0.1", port)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

        async def main() -> None:
            client = ServerClient(static_urls={"counter": url})
            client._pids[url] = os.getpid()  # what the head server's registry says of it
            rollout = client.rollout()
            assert [(await rollout.post_json("counter", "/count", {}))["n"] for _ in range(3)] == [1, 2, 3]
            pool = client.hop_pool()
            assert list(pool._idle) == [(path, 0)]  # the one connection went through the file
            await client.close()

        asyncio.run(main())
    assert not os.path.exists(path)  # removed on shutdown


async def test_a_socket_file_left_by_a_killed_server_falls_back_to_tcp(monkeypatch):
    import contextlib
    import os

    from nemo_gym.serving import local_socket

    async with ScriptedServer(answer_ok) as server:
        directory = local_socket.socket_dir()
        assert directory is not None
        path = local_socket.socket_path(directory, "127.0.0.1", server.port)
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(path)
        stale.close()  # the file stays, nothing listens: as after a kill -9
        try:
            base = f"http://127.0.0.1:{server.port}"
            client = ServerClient(static_urls={"s": base}, connect_retries=0)
            client._pids[base] = os.getpid()
            assert client._hop_target(base) == ("127.0.0.1", server.port, "", path)
            assert (await client.post("s", "/x", {})).status == 200
            assert client._hop_target(base) == ("127.0.0.1", server.port, "", None)  # TCP from now on
            assert (await client.post("s", "/x", {})).status == 200 and server.requests == 2
            await client.close()
            monkeypatch.setenv(local_socket.ENV_UNIX_SOCKETS, "0")
            assert local_socket.path_for("127.0.0.1", server.port) is None
            assert local_socket.bind("127.0.0.1", 0) is None
            monkeypatch.delenv(local_socket.ENV_UNIX_SOCKETS)
            local_socket.remove_stale(directory)  # what a server starting up does with the stale file
            assert not os.path.exists(path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


async def test_a_large_stream_is_read_with_flow_control_and_the_connection_is_reused():
    big = bytes(range(256)) * (12 * 1024)  # 3 MiB: reading pauses above 1 MiB buffered

    async def large(reader, writer, n):
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
        else:
            writer.write(OK)
        await writer.drain()
        return True

    async with ScriptedServer(large) as server:
        pool = hop_client.HopPool(8)
        resp = await call(pool, server.port, stream=True)
        await asyncio.sleep(0.2)  # let the buffer fill to the pause point before reading
        assert await resp.read() == big
        assert (await call(pool, server.port, deadline_s=2)).status == 200 and server.connections == 1
        pool.close()


async def test_an_idle_connection_past_its_time_is_not_reused():
    async with ScriptedServer(answer_ok) as server:
        pool = hop_client.HopPool(8, idle_timeout_s=0.05)
        await call(pool, server.port)
        await asyncio.sleep(0.1)
        await call(pool, server.port)
        assert server.connections == 2 and pool.open_connections == 1
        pool.close()
