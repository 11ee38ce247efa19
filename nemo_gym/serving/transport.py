"""The HTTP core under both clients: per-loop connections, one try's errors, and the one retry loop.

:class:`~nemo_gym.serving.server_client.ServerClient` (servers calling each other by name) and
:class:`~nemo_gym.serving.upstream.UpstreamHTTP` (engines and APIs by URL) send through this module:

- :class:`LoopConnections`: one aiohttp session and one :class:`~nemo_gym.serving.hop_client.HopPool`
  per event loop (a server runs on one loop; tests run several servers on several loops in one
  process, and connections must not cross loops), with one connection limit kept below the
  open-file limit, closed with the client or when it is collected;
- :func:`aiohttp_failure` and :func:`hop_failure`: what one try's exception means, in one
  vocabulary: :class:`NotConnected` (nothing reached the server: safe to try again) or a
  :class:`TransportFailure` of kind ``unreachable``, ``timeout`` or ``bad_upstream_body``;
- :func:`send_with_retries`: the loop around the tries: a deadline over all of them, bounded
  connection retries with exponential backoff and jitter, and (for upstreams that ask for it)
  retries of statuses such as 429 or 503 that say "try again", honouring ``Retry-After``.

Plain ``http://`` goes through the lean hop client, ``https://`` through aiohttp;
``NEMO_GYM_HOP_CLIENT=aiohttp`` sends everything through aiohttp (for comparisons).
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from threading import get_ident
from typing import Protocol, TypeVar

import aiohttp
import orjson

from nemo_gym.failure_classes import BAD_UPSTREAM_BODY, TIMEOUT, UNREACHABLE, TransportFailureKind
from nemo_gym.serving import hop_client
from nemo_gym.serving.protocol import raise_fd_limit

# Hops over plain HTTP use the lean client unless this says "aiohttp" (for comparisons).
ENV_HOP_CLIENT = "NEMO_GYM_HOP_CLIENT"
DEFAULT_MAX_CONNECTIONS = 1024


def hop_client_enabled() -> bool:
    """Whether plain-HTTP calls go through the lean hop client (``NEMO_GYM_HOP_CLIENT`` is not ``aiohttp``)."""
    return os.environ.get(ENV_HOP_CLIENT, "").lower() != "aiohttp"


def default_connection_limit() -> int:
    """Connections one process keeps open at most: 1024, and always below the open-file limit.

    More in-flight requests than this queue in the pool instead of opening sockets: measured
    here (docs/PERFORMANCE.md), 4096 concurrent rollouts ran at 2x the throughput and a third of
    the agent's memory with 1024 connections than with one connection per request.
    ``NEMO_GYM_MAX_CONNECTIONS`` changes it (e.g. higher for a slow, large-batch model server).
    """
    wanted = os.environ.get("NEMO_GYM_MAX_CONNECTIONS")
    return min(fd_connection_cap(), max(1, int(wanted)) if wanted else DEFAULT_MAX_CONNECTIONS)


def fd_connection_cap() -> int:
    """The most connections one process may hold: half the open-file limit left after 256 spare fds."""
    soft = raise_fd_limit()
    return max(16, (soft - 256) // 2)


def capped_connector(limit: int, limit_per_host: int) -> aiohttp.TCPConnector:
    """A connector with the requested limits, each lowered to :func:`fd_connection_cap` (0 = no limit asked)."""
    cap = fd_connection_cap()
    return aiohttp.TCPConnector(
        limit=min(limit, cap) if limit > 0 else cap,
        limit_per_host=min(limit_per_host, cap) if limit_per_host > 0 else 0,
        ttl_dns_cache=300,
    )


class LoopConnections:
    """One aiohttp session and one hop pool per event loop, created on first use.

    Trainers often drop a client without ``close()``: what it opened is closed when this object
    is collected (or at exit) instead of warning "Unclosed client session".
    """

    def __init__(self, max_connections: int | None = None) -> None:
        self.max_connections = max_connections or default_connection_limit()
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._pools: dict[asyncio.AbstractEventLoop, hop_client.HopPool] = {}
        # The thread and pool of the last pool() call.
        self._last_thread = 0
        self._last_pool: hop_client.HopPool | None = None
        weakref.finalize(self, _close_sessions_now, self._sessions)
        weakref.finalize(self, _close_pools_now, self._pools)

    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session of the running event loop."""
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300)
            # Cookies are kept per rollout by the caller, never in a process-wide jar.
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                json_serialize=lambda v: orjson.dumps(v).decode(),
            )
            self._sessions[loop] = session
        return session

    def pool(self) -> hop_client.HopPool:
        """The plain-HTTP connection pool of the running event loop."""
        # Every hop asks: the pool last handed out on this thread is the running loop's while its
        # loop is running (a thread runs one loop at a time), which spares get_running_loop()
        # and the getpid() system call it makes.
        pool = self._last_pool
        if (
            pool is not None
            and self._last_thread == get_ident()
            and not pool.closed
            and pool.loop.is_running()
        ):
            return pool
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None or pool.closed:
            pool = self._pools[loop] = hop_client.HopPool(self.max_connections)
        self._last_thread = get_ident()
        self._last_pool = pool
        return pool

    async def close(self) -> None:
        """Close the session and the connections opened on the running loop."""
        loop = asyncio.get_running_loop()
        pool = self._pools.pop(loop, None)
        if pool is not None:
            pool.close()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()


# ---- what one try's failure means ------------------------------------------------------------
class NotConnected(Exception):
    """One try made no connection, or lost a pooled one before the request was read: try again."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class TransportFailure(Exception):
    """A call ended without a usable HTTP answer; each client turns it into its own error.

    ``kind``: ``unreachable`` (no connection after the retries, or the connection broke),
    ``timeout`` (the call's deadline passed) or ``bad_upstream_body`` (an answer too large or
    not HTTP). :meth:`describe` words it for a target (a base URL), or without one.
    """

    def __init__(
        self,
        kind: TransportFailureKind,
        reason: str,
        *,
        attempts: int = 1,
        timeout_s: float | None = None,
        retried: bool = False,
    ) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.retried = retried  # the connection retries ran out

    def describe(self, target: str | None = None) -> str:
        """The failure in words, naming ``target`` when given."""
        if self.kind == TIMEOUT and self.timeout_s is not None:
            where = f" from {target}" if target else ""
            return f"no answer{where} within {self.timeout_s:g}s"
        if self.retried:
            where = f"reach {target}" if target else "connect"
            tries = f"{self.attempts} attempt" + ("s" if self.attempts != 1 else "")
            return f"cannot {where} after {tries}: {self.reason}"
        if self.kind == BAD_UPSTREAM_BODY:
            return f"{target}: {self.reason}" if target else self.reason
        where = f" to {target}" if target else ""
        return f"connection{where} failed: {self.reason}"


def aiohttp_failure(exc: BaseException, timeout_s: float) -> Exception:
    """What an aiohttp exception of one try means (:class:`NotConnected` or :class:`TransportFailure`)."""
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError)):
        # Retryable: no connection was made, or the peer closed a pooled keep-alive connection
        # before reading the request.
        return NotConnected(exc)
    if isinstance(exc, TimeoutError):
        return TransportFailure(TIMEOUT, "deadline passed", timeout_s=timeout_s)
    return TransportFailure(UNREACHABLE, connection_error_text(exc))


def hop_failure(exc: hop_client.HopError, timeout_s: float, *, retry_unanswered: bool = False) -> Exception:
    """What a hop client error of one try means (:class:`NotConnected` or :class:`TransportFailure`).

    ``retry_unanswered`` also retries a connection closed before a byte of answer came back (as
    aiohttp's ``ServerDisconnectedError``): right for an engine, never for a hop between our
    servers, where the request may have run.
    """
    if isinstance(exc, hop_client.HopTimeout):
        return TransportFailure(TIMEOUT, "deadline passed", timeout_s=timeout_s)
    if isinstance(exc, hop_client.HopConnectError):
        return NotConnected(exc)
    if retry_unanswered and isinstance(exc, hop_client.HopDisconnected) and not exc.received:
        return NotConnected(exc)
    if isinstance(exc, hop_client.HopBadAnswer):
        return TransportFailure(BAD_UPSTREAM_BODY, str(exc))
    return TransportFailure(UNREACHABLE, str(exc))


def connection_error_text(exc: BaseException) -> str:
    """What went wrong with a connection, in words that fit the URL's scheme.

    aiohttp's own text says ``ssl:default`` for every connect failure, plain HTTP included; this
    names the host, port and the OS's reason (``connection refused``, a name that does not
    resolve) instead, and mentions TLS only for a failure of TLS itself.
    """
    if isinstance(exc, hop_client.HopConnectError):
        return f"cannot connect to {exc.host}:{exc.port}: {_os_error_reason(exc.os_error)}"
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS handshake with {exc.host}:{exc.port} failed: {exc.os_error}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port}: {_os_error_reason(exc.os_error)}"
    return str(exc) or type(exc).__name__


def _os_error_reason(error: BaseException) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (nothing listening there)"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[:1].lower() + error.strerror[1:]
    return str(error) or type(error).__name__


# ---- the retry loop --------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """How a call retries: connection failures always (bounded), statuses only when listed."""

    connect_retries: int
    first_backoff_s: float = 0.05
    max_delay_s: float = 60.0
    retry_statuses: Collection[int] = field(default_factory=frozenset)
    max_status_retries: int = 0


class _Answer(Protocol):
    status: int


Answer = TypeVar("Answer", bound=_Answer)


async def send_with_retries(
    attempt: Callable[[float, int], Awaitable[Answer]],
    policy: RetryPolicy,
    timeout_s: float,
    *,
    started: float | None = None,
    first_failure: NotConnected | None = None,
    first_answer: Answer | None = None,
) -> Answer:
    """Call ``attempt(seconds left, attempt number)`` until it answers, within ``timeout_s`` in all.

    ``attempt`` raises :class:`NotConnected` for a try worth repeating and
    :class:`TransportFailure` for one that is not. An answer whose status is in
    ``policy.retry_statuses`` is tried again (at most ``max_status_retries`` times, after the
    delay its ``Retry-After`` asks for, capped), and then returned as it is. Raises
    :class:`TransportFailure` when the deadline passes or the connection retries run out.

    A caller on a hot path may make the first try itself (one coroutine less per call) and hand
    its :class:`NotConnected` here as ``first_failure``, or the answer it got as ``first_answer``
    (one whose status is to be retried), with ``started`` (``time.monotonic()`` before that try):
    the loop goes on from there, the same as if it had made that try.
    """
    deadline = (time.monotonic() if started is None else started) + timeout_s
    retries_left = policy.connect_retries
    status_retries_left = policy.max_status_retries
    backoff = policy.first_backoff_s
    attempts = 0 if first_failure is None and first_answer is None else 1
    failed = first_failure
    answer: Answer | None = first_answer
    while True:
        if answer is not None:
            if status_retries_left > 0 and answer.status in policy.retry_statuses:
                status_retries_left -= 1
                headers = getattr(answer, "headers", None) or {}
                asked = retry_after_seconds({k.lower(): v for k, v in headers.items()})
                await _sleep(
                    asked if asked is not None else backoff,
                    deadline,
                    policy.max_delay_s,
                    jitter=asked is None,
                )
                backoff *= 2
                answer = None
                continue
            return answer
        if failed is not None:
            if retries_left <= 0 or time.monotonic() >= deadline:
                raise TransportFailure(
                    UNREACHABLE, connection_error_text(failed.cause), attempts=attempts, retried=True
                ) from failed.cause
            retries_left -= 1
            await _sleep(backoff, deadline, policy.max_delay_s)
            backoff *= 2
            failed = None
        attempts += 1
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TransportFailure(TIMEOUT, "deadline passed", timeout_s=timeout_s, attempts=attempts)
        try:
            answer = await attempt(remaining, attempts)
        except NotConnected as exc:
            failed = exc


async def _sleep(delay: float, deadline: float, max_delay_s: float, jitter: bool = True) -> None:
    delay = min(delay, max_delay_s)
    if jitter:
        delay *= 0.5 + random.random()
    await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The delay an answer asks for: ``retry-after-ms``, or ``Retry-After`` in seconds or as a date."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# ---- closing what a dropped client left open -------------------------------------------------
def _close_pools_now(pools: dict[asyncio.AbstractEventLoop, hop_client.HopPool]) -> None:
    """Close the connection pools of a client being collected (or at exit), each on its own loop."""
    for loop, pool in list(pools.items()):
        if pool.closed or loop.is_closed():
            continue
        if loop.is_running() and asyncio._get_running_loop() is not loop:
            loop.call_soon_threadsafe(pool.close)
        else:
            pool.close()
    pools.clear()


def _close_sessions_now(sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession]) -> None:
    """Close the sessions of a client being collected (or at exit) on whatever state their loop is in."""
    for loop, session in list(sessions.items()):
        if session.closed:
            continue
        if loop.is_closed():
            _close_without_loop(session)
        elif not loop.is_running():
            loop.run_until_complete(session.close())
        elif asyncio._get_running_loop() is loop:
            loop.create_task(session.close())
        else:
            asyncio.run_coroutine_threadsafe(session.close(), loop)
    sessions.clear()


def _close_without_loop(session: aiohttp.ClientSession) -> None:
    # The loop is gone, so its sockets are too: closing only marks the session closed, which
    # needs no loop. Step the coroutine by hand; if it ever waits on the loop, stop there.
    closing = session.close()
    try:
        closing.send(None)
    except StopIteration:
        return
    except RuntimeError:
        pass
    closing.close()
    session.detach()
