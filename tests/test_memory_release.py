"""ReleaseMemoryAfterBurst: one release once a burst of requests has drained, none for light traffic."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.serving.memory_release import ReleaseMemoryAfterBurst, release_enabled, release_memory
from nemo_gym.serving.server import BaseServer, bind_socket, make_uvicorn_server


async def slow(request: Request) -> Response:
    await asyncio.sleep(0.2)
    return Response(b"{}", media_type="application/json")


async def serve_and_call(
    middleware: ReleaseMemoryAfterBurst, in_flight: int, wait_s: float, batches: int = 1
) -> None:
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/slow"
    server = make_uvicorn_server(middleware, embedded=True)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            async with http.get(url) as resp:
                assert resp.status == 200

        for _ in range(batches):
            await asyncio.gather(*(one() for _ in range(in_flight)))
    await asyncio.sleep(wait_s)
    server.should_exit = True
    await task


@pytest.mark.parametrize(("in_flight", "expected"), [(12, 2), (4, 0)])
def test_release_runs_after_a_burst_has_drained_once_per_idle_delay(in_flight: int, expected: int) -> None:
    calls: list[float] = []
    app = Starlette(routes=[Route("/slow", slow)])
    middleware = ReleaseMemoryAfterBurst(
        app, burst=10, idle_s=(0.2, 0.5), release=lambda: calls.append(time.monotonic())
    )
    asyncio.run(serve_and_call(middleware, in_flight, wait_s=0.8))
    assert len(calls) == expected and middleware.releases == expected


@pytest.mark.parametrize(("work", "expected"), [(8, 2), (100, 0)])
def test_release_runs_after_a_long_run_of_requests_that_never_made_a_burst(work: int, expected: int) -> None:
    calls: list[float] = []
    app = Starlette(routes=[Route("/slow", slow)])
    middleware = ReleaseMemoryAfterBurst(
        app, burst=10, idle_s=(0.2, 0.5), release=lambda: calls.append(time.monotonic()), work=work
    )
    # 12 requests, never more than 4 in flight: no burst, but more than `work` requests.
    asyncio.run(serve_and_call(middleware, 4, wait_s=0.8, batches=3))
    assert len(calls) == expected and middleware.releases == expected


def test_release_memory_runs_and_servers_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    release_memory()  # gc + malloc_trim where glibc has it: must not raise
    monkeypatch.setenv("NEMO_GYM_RELEASE_MEMORY_AFTER_BURST", "0")
    assert not release_enabled()
    assert not isinstance(BaseServer({"name": "s"}).build_app(), ReleaseMemoryAfterBurst)
    monkeypatch.delenv("NEMO_GYM_RELEASE_MEMORY_AFTER_BURST")
    assert release_enabled()
    app = BaseServer({"name": "s"}).build_app()
    layers = []
    while app is not None:
        layers.append(type(app).__name__)
        app = getattr(app, "app", None)
    assert "ReleaseMemoryAfterBurst" in layers
