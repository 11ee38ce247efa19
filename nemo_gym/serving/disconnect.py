"""Cancel a handler whose caller hung up: a caller that gave up must not leave work running here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from starlette.types import Receive


class ClientGone(Exception):
    """The caller closed its connection while the handler ran; the handler was cancelled."""


async def _await_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, awaitable: Awaitable[Any]) -> Any:
    """Await ``awaitable`` (a handler), cancelling it if the caller disconnects first.

    A caller that gave up (its deadline passed, it was killed) must not leave work running here:
    a model server would otherwise keep retrying its upstream for minutes for nobody. Raises
    :class:`ClientGone` when that happened. Call only once the request body has been read.
    """
    task = asyncio.current_task()
    state = {"gone": False, "finished": False}

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        if state["finished"] or watcher.cancelled() or watcher.exception() is not None or task is None:
            return
        state["gone"] = True
        task.cancel()

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
        watcher.cancel()
