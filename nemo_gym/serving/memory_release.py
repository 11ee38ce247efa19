"""Give memory back to the operating system once a burst of requests is over.

Thousands of requests in flight (a collector at ``num_samples_in_parallel=4096``) leave a
server's objects freed but its heap grown: glibc keeps freed pages for reuse, so RSS stays at
the burst's peak long after the burst. Long runs at modest concurrency do the same more slowly:
each request's short-lived objects land in a slightly different place of a fragmented heap, and
after 10,000 long rollouts a model server's RSS had grown by a quarter with nothing kept.
:class:`ReleaseMemoryAfterBurst` counts requests in flight and served and, when a burst (at least
``burst`` requests in flight at once) or a run of ``work`` requests has ended, runs a full
garbage collection and ``malloc_trim`` after each of ``idle_s`` seconds without a request in
flight: soon after the burst, and again once idle keep-alive connections (aiohttp closes its
own after 15 s) have been closed and freed. ``NEMO_GYM_RELEASE_MEMORY_AFTER_BURST=0`` turns it
off.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.serving.protocol import switched_on

ENV_RELEASE_MEMORY = "NEMO_GYM_RELEASE_MEMORY_AFTER_BURST"
DEFAULT_BURST = 256
DEFAULT_WORK = 20_000
DEFAULT_IDLE_S = (2.0, 20.0)


def _malloc_trim() -> Callable[[], Any] | None:
    """glibc's ``malloc_trim(0)``, or ``None`` where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


def release_memory() -> None:
    """Collect garbage and hand the heap's free pages back to the operating system."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim()


def release_enabled() -> bool:
    """Whether servers release memory after bursts (``NEMO_GYM_RELEASE_MEMORY_AFTER_BURST``)."""
    return switched_on(ENV_RELEASE_MEMORY)


class ReleaseMemoryAfterBurst:
    """ASGI middleware: :func:`release_memory` after each burst of requests in flight (or run of
    ``work`` requests), once per entry of ``idle_s`` (seconds without a request in flight).

    ``releases`` counts how often it ran. Costs three integer updates per request (and a clock
    read when the requests in flight drop to none after a burst or run).
    """

    def __init__(
        self,
        app: ASGIApp,
        burst: int = DEFAULT_BURST,
        idle_s: tuple[float, ...] = DEFAULT_IDLE_S,
        release: Callable[[], None] = release_memory,
        work: int = DEFAULT_WORK,
    ) -> None:
        self.app = app
        self.burst = burst
        self.work = work
        self._served = 0
        self.idle_s = idle_s
        self.release = release
        self.releases = 0
        self._in_flight = 0
        self._peak = 0
        self._timer: asyncio.TimerHandle | None = None
        self._next = 0  # which entry of idle_s the timer waits for
        self._idle_since = 0.0  # when requests in flight last dropped to none (time.monotonic())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.leave()

    def enter(self) -> None:
        """An HTTP request came in (what ``__call__`` does before the app; the fused gate calls it)."""
        in_flight = self._in_flight = self._in_flight + 1
        self._served += 1
        if in_flight > self._peak:
            self._peak = in_flight

    def leave(self) -> None:
        """An HTTP request is done."""
        in_flight = self._in_flight = self._in_flight - 1
        if not in_flight and (self._peak >= self.burst or self._served >= self.work):
            # One timer at a time, whatever the request rate: it checks the idle time itself.
            self._idle_since = time.monotonic()
            if self._timer is None or self._next:
                self._start_timer(0)

    def _start_timer(self, index: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._next = index
        delay = self.idle_s[index] - (time.monotonic() - self._idle_since)
        self._timer = asyncio.get_running_loop().call_later(max(delay, 0.0), self._after_idle)

    def _after_idle(self) -> None:
        self._timer = None
        if self._in_flight:
            return  # busy again: when it drains, the timers start over
        if time.monotonic() - self._idle_since < self.idle_s[self._next]:
            self._start_timer(self._next)  # requests came and went meanwhile: wait the rest
            return
        self.releases += 1
        self.release()
        if self._next + 1 < len(self.idle_s):
            self._start_timer(self._next + 1)
        else:
            self._peak = self._served = 0
