"""Real servers on a free loopback port, served in a background thread of the test's process."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web

from nemo_gym.serving.server import BaseServer
from nemo_gym.serving.sockets import bind_socket
from nemo_gym.serving.uvicorn_factory import make_uvicorn_server
from nemo_gym.testing.http_clients import SyncClient


@contextlib.contextmanager
def running_server(server: BaseServer, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``server`` on a free port of ``host`` in a background thread; yields its base URL."""
    sock = bind_socket(host, 0)
    url = f"http://{host}:{sock.getsockname()[1]}"
    loop = asyncio.new_event_loop()
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve(sock, register=False, embedded=True))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, name=f"server-{server.name}", daemon=True)
    thread.start()
    try:
        with SyncClient() as client:
            deadline = time.monotonic() + 30
            while True:
                if done.is_set():
                    raise RuntimeError(f"server {server.name!r} stopped while starting") from (
                        failure[0] if failure else None
                    )
                try:
                    client.wait_healthy(url, timeout_s=0.5)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
        yield url
    finally:
        uv = getattr(server, "uvicorn_server", None)
        if uv is not None:
            uv.should_exit = True
        done.wait(10)
        thread.join(10)
        loop.close()


@contextlib.contextmanager
def running_app(app: Any, host: str = "127.0.0.1", header_timeout_s: float = 15.0) -> Iterator[str]:
    """Serve any ASGI app (the head server's, a fake upstream's) on a free loopback port; yields its URL."""
    sock = bind_socket(host, 0)
    url = f"http://{host}:{sock.getsockname()[1]}"
    uv = make_uvicorn_server(app, embedded=True, header_timeout_s=header_timeout_s)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(uv.serve(sockets=[sock])), name="app", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the app at {url} did not start")
        time.sleep(0.01)
    try:
        yield url
    finally:
        uv.should_exit = True
        thread.join(10)
        loop.close()


@contextlib.contextmanager
def running_aiohttp_app(app: web.Application) -> Iterator[str]:
    """Serve an aiohttp app (a fake upstream speaking some protocol) on a free loopback port in a
    background thread with its own loop; yields its base URL, ``http://127.0.0.1:PORT``."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, name="aiohttp-app", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@contextlib.contextmanager
def fake_openai_responses(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]], client_max_size: int = 2**26
) -> Iterator[str]:
    """Serve ``handler`` as ``POST /v1/responses`` of a fake OpenAI endpoint (see
    :func:`running_aiohttp_app`); yields the ``openai_base_url`` to point a model server at,
    ``http://127.0.0.1:PORT/v1``."""
    app = web.Application(client_max_size=client_max_size)
    app.router.add_post("/v1/responses", handler)
    with running_aiohttp_app(app) as url:
        yield f"{url}/v1"


@contextlib.asynccontextmanager
async def serving_aiohttp_app(app: web.Application) -> AsyncIterator[str]:
    """Serve an aiohttp app on a free loopback port in the running loop; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def lazy_servers(make: Callable[[str], BaseServer]) -> Iterator[Callable[[str], str]]:
    """Serve ``make(name)`` on first use of each name (see :func:`running_server`); yields name → URL.

    For tests whose cases need several configurations of one server: only those used start.
    """
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}

        def url(name: str) -> str:
            if name not in urls:
                urls[name] = stack.enter_context(running_server(make(name)))
            return urls[name]

        yield url


@contextlib.contextmanager
def running_agent(
    resources_server: BaseServer,
    model_server: BaseServer,
    *,
    agent_class: type[BaseServer],
    env_name: str = "env",
    model_name: str = "model",
    **agent_fields: Any,
) -> Iterator[str]:
    """An environment, a model and an agent between them, all in this process; yields the agent's URL.

    The agent (``agent_class``, e.g. simple_agent's ``SimpleAgent``: the framework imports no
    agent folder itself) reaches the two servers by the names ``env_name`` and ``model_name``
    (static URLs, no head server). ``agent_fields`` are extra agent settings (``max_steps``, ...).
    """
    from nemo_gym.serving.server_client import ServerClient

    with running_server(resources_server) as env_url, running_server(model_server) as model_url:
        agent = agent_class(
            {
                "name": "agent",
                "resources_server": {"type": "resources_servers", "name": env_name},
                "model_server": {"type": "responses_api_models", "name": model_name},
                **agent_fields,
            },
            server_client=ServerClient(static_urls={env_name: env_url, model_name: model_url}),
        )
        with running_server(agent) as agent_url:
            yield agent_url
