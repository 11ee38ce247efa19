"""Per-rollout session state of a server, keyed by the session cookie."""

from __future__ import annotations

import os
import time
from typing import Any

_ID_BYTES = 16
_IDS_PER_DRAW = 256


class SessionStore:
    """Per-rollout state by session id, with a TTL and a size bound.

    Entries expire ``ttl_s`` after their last use; the oldest are evicted past ``max_sessions``
    so an agent that never calls verify cannot grow memory without bound.
    """

    def __init__(self, ttl_s: float = 3600.0, max_sessions: int = 1_000_000) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._data: dict[str, tuple[float, dict[str, Any]]] = {}
        self._last_sweep = time.monotonic()
        self._random = b""
        self._used = 0
        # Whether a session id has state (``id in store``, as one C call).
        self.holds = self._data.__contains__

    def new_id(self) -> str:
        """A fresh session id: 128 bits from the OS's CSPRNG as 32 hex digits.

        Every request that brings no session gets one (a handler may open state), so the random
        bytes are drawn 256 ids at a time: one ``getrandom`` call instead of one per request.
        """
        if self._used + _ID_BYTES > len(self._random):
            self._random, self._used = os.urandom(_ID_BYTES * _IDS_PER_DRAW), 0
        start = self._used
        self._used = start + _ID_BYTES
        return self._random[start : start + _ID_BYTES].hex()

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
