"""Per-rollout session state of a server, keyed by the session cookie."""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

_ID_BYTES = 16
_IDS_PER_DRAW = 256
# One session id: 128 bits as 32 hex digits.
_ID_DIGITS = re.compile(f"[0-9a-f]{{{2 * _ID_BYTES}}}")


def _drawn_ids() -> Iterator[list[str]]:
    """Fresh session ids, :data:`_IDS_PER_DRAW` at a time: one ``getrandom`` call and one C-level
    split of its hex digits per batch."""
    while True:
        yield _ID_DIGITS.findall(os.urandom(_ID_BYTES * _IDS_PER_DRAW).hex())


class SessionStore:
    """Per-rollout state by session id, with a TTL and a size bound.

    Entries expire ``ttl_s`` after their last use; the oldest are evicted past ``max_sessions``
    so an agent that never calls verify cannot grow memory without bound.

    ``new_id()`` gives a fresh session id: 128 bits from the OS's CSPRNG as 32 hex digits. Every
    request that brings no session gets one (a handler may open state), so the ids are drawn
    256 at a time and handed out by a C-level iterator: no Python frame per request.
    """

    def __init__(self, ttl_s: float = 3600.0, max_sessions: int = 1_000_000) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._data: dict[str, tuple[float, dict[str, Any]]] = {}
        self._last_sweep = time.monotonic()
        self.new_id: Callable[[], str] = itertools.chain.from_iterable(_drawn_ids()).__next__
        # Whether a session id has state (``id in store``, as one C call).
        self.holds = self._data.__contains__

    def get(self, session_id: str, create: bool = True) -> dict[str, Any] | None:
        """The state dict of a session, created empty when ``create`` and absent or expired."""
        now = time.monotonic()
        self._sweep(now)
        entry = self._data.pop(session_id, None)
        if entry is not None and now - entry[0] > self.ttl_s:
            entry = None
        if entry is None:
            if not create:
                return None
            entry = (now, {})
        # Re-inserting keeps the dict in last-used order, so eviction takes the oldest first.
        self._data[session_id] = (now, entry[1])
        while len(self._data) > self.max_sessions:
            self._data.pop(next(iter(self._data)))
        return entry[1]

    def free(self, session_id: str) -> None:
        """Drop a session's state (after verify)."""
        self._data.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._data

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < min(self.ttl_s, 60.0):
            return
        self._last_sweep = now
        for key, (used, _) in list(self._data.items()):
            if now - used > self.ttl_s:
                del self._data[key]
