"""The uvicorn server (and event loop) a nemo_gym server runs on, tuned for internal hops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp

from nemo_gym.serving.disconnect import connection_gone_protocol
from nemo_gym.serving.process_hooks import SHUTDOWN_CLEANUPS
from nemo_gym.serving.protocol import switched_on
from nemo_gym.serving.request_guard import DEFAULT_HEADER_TIMEOUT_S, header_timeout_protocol
from nemo_gym.serving.write_coalescing import coalescing_protocol

# A SIGTERM lets requests in flight finish for this long, then cancels them and the process exits.
# Without a bound, one handler that never returns (a verify waiting on a cohort that will not
# come, a hung upstream) keeps the server alive after its launcher is gone, holding its port.
GRACEFUL_SHUTDOWN_S = 10


def make_uvicorn_server(
    app: ASGIApp, embedded: bool = False, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
) -> Any:
    """A uvicorn server for ``app`` tuned for internal hops: no access log, keep-alive, big backlog,
    one write per answer (:mod:`nemo_gym.serving.write_coalescing`), no ``X-Forwarded-*`` rewriting
    (nothing here reads the client address, and a server is reached directly, never through a proxy).

    Connections whose request headers are not complete within ``header_timeout_s`` are closed;
    a SIGTERM waits at most :data:`GRACEFUL_SHUTDOWN_S` for requests in flight.
    ``embedded`` servers do not install signal handlers (their host process owns the signals).
    """
    import uvicorn

    http: type[asyncio.Protocol]
    if _has("httptools") and lean_protocol_enabled():
        from nemo_gym.serving.http_protocol import hop_http_protocol

        http = hop_http_protocol(header_timeout_s)
    else:
        if _has("httptools"):
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as protocol
        else:
            from uvicorn.protocols.http.h11_impl import H11Protocol as protocol  # type: ignore[assignment]
        http = header_timeout_protocol(
            connection_gone_protocol(coalescing_protocol(protocol)), header_timeout_s
        )
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        loop="none",
        http=http,
        proxy_headers=False,
        timeout_keep_alive=75,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        backlog=4096,
    )

    if not embedded:

        class Server(uvicorn.Server):
            async def shutdown(self, sockets: Any = None) -> None:
                # Here, not after serve(): uvicorn re-raises a captured SIGTERM when serve() ends.
                try:
                    await super().shutdown(sockets)
                finally:
                    for cleanup in list(SHUTDOWN_CLEANUPS.values()):
                        cleanup()

        return Server(config)

    class EmbeddedServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    return EmbeddedServer(config)


def lean_protocol_enabled() -> bool:
    """Whether servers speak :mod:`nemo_gym.serving.http_protocol` (the default) rather than
    uvicorn's own httptools protocol with this project's layers around it
    (``NEMO_GYM_LEAN_HTTP=0``: for comparing the two, and a way back should a client need it)."""
    return switched_on("NEMO_GYM_LEAN_HTTP")


def _has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:
        return None
