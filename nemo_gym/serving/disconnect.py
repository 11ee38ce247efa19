"""Cancel a handler whose caller hung up: a caller that gave up must not leave work running here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

# The scope key under which this project's HTTP protocol puts its connection's "gone" future.
CONNECTION_GONE_SCOPE_KEY = "nemo_gym.connection_gone"


class ClientGone(Exception):
    """The caller closed its connection while the handler ran; the handler was cancelled."""


async def _await_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, awaitable: Awaitable[Any], scope: Scope | None = None) -> Any:
    """Await ``awaitable`` (a handler), cancelling it if the caller disconnects first.

    A caller that gave up (its deadline passed, it was killed) must not leave work running here:
    a model server would otherwise keep retrying its upstream for minutes for nobody. Raises
    :class:`ClientGone` when that happened. Call only once the request body has been read.

    On this project's HTTP protocol (:func:`connection_gone_protocol`) the ``scope`` carries a
    future of the connection that resolves when it is lost, and the handler is cancelled from its
    callback; elsewhere a task waits on ``receive`` for ``http.disconnect`` (a task per request).
    """
    gone = scope.get(CONNECTION_GONE_SCOPE_KEY) if scope is not None else None
    # The connection's future names the loop: current_task(loop) skips get_running_loop(),
    # which costs a getpid() system call on every call.
    task = asyncio.current_task(gone.get_loop() if gone is not None else None)
    state = {"gone": False, "finished": False}

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        if state["finished"] or watcher.cancelled() or watcher.exception() is not None or task is None:
            return
        state["gone"] = True
        task.cancel()

    if gone is not None:
        if gone.done():
            raise ClientGone
        gone.add_done_callback(on_disconnect)
        watcher = None
    else:
        watcher = asyncio.ensure_future(_await_disconnect(receive))
        watcher.add_done_callback(on_disconnect)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not state["gone"] or task is None:
            raise
        task.uncancel()
        raise ClientGone from None
    finally:
        state["finished"] = True
        if watcher is not None:
            watcher.cancel()
        elif gone is not None:
            gone.remove_done_callback(on_disconnect)


def running_loop(scope: Scope) -> asyncio.AbstractEventLoop:
    """The running event loop, from the connection's future in ``scope`` when this project's
    protocol put one there (``asyncio.get_running_loop()`` makes a ``getpid()`` system call)."""
    gone = scope.get(CONNECTION_GONE_SCOPE_KEY)
    return gone.get_loop() if gone is not None else asyncio.get_running_loop()


def connection_gone_protocol(base: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol ``base`` whose requests carry a future of their
    connection (``scope[CONNECTION_GONE_SCOPE_KEY]``) that resolves when the connection is lost:
    one future per connection, where waiting on ``receive`` costs a task per request."""

    class ConnectionGoneProtocol(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: Any) -> None:
            gone = self._ng_gone = asyncio.get_running_loop().create_future()
            app: ASGIApp = self.app  # type: ignore[has-type]

            async def app_with_gone(scope: Scope, receive: Receive, send: Send) -> None:
                scope[CONNECTION_GONE_SCOPE_KEY] = gone
                await app(scope, receive, send)

            self.app = app_with_gone
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            if not self._ng_gone.done():
                self._ng_gone.set_result(None)

    ConnectionGoneProtocol.__name__ = f"ConnectionGone{base.__name__}"
    return ConnectionGoneProtocol
