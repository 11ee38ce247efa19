"""A lean HTTP/1.1 client for the hops between nemo_gym's own servers (plain ``http://`` only).

aiohttp's client was about half of an agent's and a collector's CPU per rollout: a hop there
builds a request object, a URL object, a timer context, a header multidict, a response object
and a stream reader. An internal hop needs far less: one keep-alive connection from a pool, one
write of a pre-built request, and httptools' C parser (uvicorn's, already installed) filling a
list of body parts. This module is that and no more:

- a pool per event loop with one cap on open connections (in use and idle, all hosts together)
  kept below the open-file limit; callers over the cap wait, within their deadline;
- a deadline for the whole call and one for opening a connection;
- a cap on the answer's size (headers and body);
- ``Content-Length``, chunked and close-delimited answers, read whole or as they arrive
  (:meth:`HopResponse.chunks`, for server-sent events);
- a call cancelled while in flight closes its connection, so the server sees the disconnect and
  stops working for nobody;
- errors that say what happened: no connection (:class:`HopConnectError`, safe to retry), the
  connection dropped (:class:`HopDisconnected`), no answer in time (:class:`HopTimeout`), an
  answer too large or not HTTP (:class:`HopBadAnswer`).

A pooled connection the server has closed meanwhile is sent again once on a new connection,
and only when nothing at all came back on the old one: such a request never reached the
server's handler. A request that got a byte of answer, or that was sent on a new connection,
is never sent twice.

One idea: the connection, its parser callbacks and the pool share private state (a connection
returns itself to its pool, the pool opens, hands out and expires connections), so they stay together.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import re
import socket
import struct
import urllib.parse
from collections.abc import AsyncIterator, Iterable
from http.cookies import CookieError, SimpleCookie
from typing import Any

import httptools

# struct ucred of SO_PEERCRED: pid, uid, gid.
_UCRED = struct.Struct("3i")

DEFAULT_MAX_ANSWER_BYTES = 1 << 30
MAX_HEADER_BYTES = 256 * 1024
# Idle connections older than this are closed instead of reused: our servers keep them 75 s,
# a server that keeps them less closes them itself (and the pool sees it).
IDLE_TIMEOUT_S = 60.0
# Buffered stream bytes above which reading from the socket pauses until the consumer catches up.
_STREAM_HIGH_WATER = 1 << 20
# Request heads remembered per pool (a caller sends the same method, target and headers again).
_HEADS_KEPT = 1024

# An answer in the strict form our servers write, read in one go (see parse_whole_answer):
# ``HTTP/1.1``, a status of 200 or more other than 204 and 304, a printable reason phrase, header
# lines ``Name: value`` (a token, then printable ASCII without surrounding whitespace), exactly
# one of them ``Content-Length`` (at most 18 digits) and none ``Transfer-Encoding``,
# ``Connection``, ``Proxy-Connection`` or ``Upgrade``. Anything else goes through httptools.
# (Possessive quantifiers: the same matches without backtracking into a token or value; a value's
# last character is a non-space, as its first is.)
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]++"
_VALUE = rb"[!-~][ -~]*+(?<! )"
_OTHER_LINE = (
    rb"(?!(?i:content-length|transfer-encoding|connection|proxy-connection|upgrade):)"
    + _TOKEN
    + rb": "
    + _VALUE
    + rb"\r\n"
)
_WHOLE_HEAD = re.compile(
    rb"HTTP/1\.1 ((?!204|304)[2-9][0-9][0-9]) [ -~]*+\r\n("
    + rb"(?:"
    + _OTHER_LINE
    + rb")*"
    + rb"(?i:content-length): ([0-9]{1,18})\r\n"
    + rb"(?:"
    + _OTHER_LINE
    + rb")*"
    + rb")\r\n"
)
_HEADER_LINE = re.compile(rb"(" + _TOKEN + rb"): (" + _VALUE + rb")\r\n")
_SET_COOKIE_LINE = re.compile(rb"^set-cookie: (.*)\r$", re.IGNORECASE | re.MULTILINE)
_new_object = object.__new__
_TOKEN_TEXT = re.compile(_TOKEN.decode())


class HopError(Exception):
    """A hop failed without a complete HTTP answer."""

    def __init__(self, host: str, port: int, message: str) -> None:
        super().__init__(message)
        self.host = host
        self.port = port


class HopConnectError(HopError):
    """No connection could be made (refused, no route, a name that does not resolve); nothing was sent."""

    def __init__(self, host: str, port: int, os_error: BaseException) -> None:
        super().__init__(host, port, f"cannot connect to {host}:{port}: {os_error}")
        self.os_error = os_error


class HopPeerMismatch(OSError):
    """The process listening on a Unix socket file is not the server registered for it."""


def check_unix_peer(sock: Any, path: str, expected_pid: int) -> None:
    """Raise :class:`HopPeerMismatch` unless the process that listens on the connected Unix
    socket ``sock`` is ``expected_pid`` running as this user (its kernel-reported peer
    credentials, ``SO_PEERCRED``). A program of the same user that replaced the socket file
    with a listener of its own fails here, before anything is sent to it."""
    if expected_pid <= 0 or sock is None:
        raise HopPeerMismatch(f"{path}: no registered server process to check the listener against")
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except (AttributeError, OSError) as exc:
        raise HopPeerMismatch(f"{path}: cannot read the listener's credentials: {exc}") from exc
    pid, uid, _ = _UCRED.unpack(raw)
    if pid != expected_pid or uid != os.getuid():
        raise HopPeerMismatch(
            f"{path}: the listener is pid {pid} (uid {uid}), not the registered server pid "
            f"{expected_pid} (uid {os.getuid()})"
        )


class HopDisconnected(HopError):
    """The connection closed or broke before the answer was complete.

    ``reused``: the request went out on a pooled connection; ``received``: answer bytes that had
    arrived. A request with ``reused`` and no bytes received never reached a handler.
    """

    def __init__(self, host: str, port: int, message: str, *, reused: bool, received: int) -> None:
        super().__init__(host, port, message)
        self.reused = reused
        self.received = received


class HopTimeout(HopError, TimeoutError):
    """No connection or no complete answer within the deadline."""


class HopBadAnswer(HopError):
    """The answer is larger than allowed or is not HTTP/1.x."""


class _HeaderLines:
    """``HopResponse.raw_headers`` of an answer read in one go: its header block parsed on first
    use, then kept on the answer (which is looked up first from then on: no call again)."""

    def __get__(self, answer: Any, owner: Any = None) -> list[tuple[bytes, bytes]]:
        if answer is None:
            raise AttributeError("raw_headers")
        raw_headers: list[tuple[bytes, bytes]] = _HEADER_LINE.findall(answer._block)
        answer.__dict__["raw_headers"] = raw_headers
        return raw_headers


class HopResponse:
    """One answer: ``status``, ``headers`` (lower-case names; repeated names keep the last),
    ``cookies`` it set, and ``body`` (empty until read for an answer opened as a stream)."""

    # What only some answers have is set on those (no slots: an answer read in one go sets three
    # attributes, its header lines kept as one block until asked for).
    raw_headers: list[tuple[bytes, bytes]] = _HeaderLines()  # type: ignore[assignment]
    _block: bytes | None = None  # the header lines, unparsed (``raw_headers`` is made from them)
    _headers: dict[str, str] | None = None
    _cookies: dict[str, str] | None = None
    _set_cookies: list[bytes] | None = None  # the Set-Cookie values when already picked out
    _conn: _HopConnection | None = None
    _stream: _StreamBuffer | None = None

    def __init__(
        self,
        status: int,
        raw_headers: list[tuple[bytes, bytes]] | None,
        body: bytes,
        conn: _HopConnection | None = None,
        stream: _StreamBuffer | None = None,
        set_cookies: list[bytes] | None = None,
        block: bytes | None = None,
    ) -> None:
        """``raw_headers`` None: ``block`` holds the header lines (``Name: value\\r\\n`` each, as
        :func:`parse_whole_answer` checked them), parsed when first asked for."""
        self.status = status
        if raw_headers is None:
            self._block = block
        else:
            self.raw_headers = raw_headers
        self.body = body
        if stream is not None:
            self._conn = conn
            self._stream = stream
        if set_cookies is not None:
            if set_cookies:
                self._set_cookies = set_cookies
            else:
                self._cookies = {}  # picked out and none there

    def header(self, name: str) -> str | None:
        """The value of the header ``name`` as the answer carried it (any case; the last if
        repeated), else None. An answer read in one go finds it in its header block, without
        parsing every line (``raw_headers``)."""
        block = self._block
        if block is not None:  # (the block is kept once parsed too: no look at __dict__, which makes one)
            line_start = _line_start(name)
            if line_start is not None:
                # The last line of that name in the block lower-cased (same offsets, behind a "\n").
                at = (b"\n" + block.lower()).rfind(line_start)
                if at < 0:
                    return None
                at += len(line_start) - 1
                return block[at : block.index(b"\r", at)].decode("latin-1")
        wanted = name.lower().encode("latin-1")
        for key, value in reversed(self.raw_headers):  # the last one wins: the first from the end
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    @property
    def headers(self) -> dict[str, str]:
        """Header names lower-cased (decoded on first use: most hops never look)."""
        if self._headers is None:
            self._headers = {
                name.decode("latin-1").lower(): value.decode("latin-1") for name, value in self.raw_headers
            }
        return self._headers

    @property
    def cookies(self) -> dict[str, str]:
        """The cookies the answer set (``Set-Cookie`` headers), parsed on first use."""
        cookies = self._cookies
        if cookies is None:
            values: list[bytes] | tuple[()] | None = self._set_cookies
            if values is None:
                block = self._block
                if block is not None:
                    # (A substring search first: the line pattern is slow where it finds nothing.)
                    values = _SET_COOKIE_LINE.findall(block) if b"set-cookie:" in block.lower() else ()
                else:
                    values = [value for name, value in self.raw_headers if name.lower() == b"set-cookie"]
            cookies = self._cookies = {}
            for value in values:
                cookies.update(parse_set_cookie(value.decode("latin-1")))
        return cookies

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises :class:`HopError` when the connection breaks or the
        deadline passes mid-body. An answer read whole yields its body once."""
        stream = self._stream
        if stream is None:
            if self.body:
                yield self.body
            return
        while True:
            chunk = await stream.next_chunk()
            if chunk is None:
                self._stream = None
                self._conn = None
                return
            yield chunk

    async def read(self) -> bytes:
        """The whole body (an opened stream is read to its end), which then stays in ``body``."""
        if self._stream is not None:
            self.body = b"".join([chunk async for chunk in self.chunks()])
        return self.body

    def close(self) -> None:
        """Let go of an opened stream: its connection goes back to the pool when the body was
        read to the end, else it is closed (the server sees the disconnect)."""
        stream, conn = self._stream, self._conn
        self._stream = self._conn = None
        if stream is not None and conn is not None and not stream.finished:
            conn.abort_request(stream)


class _StreamBuffer:
    """Body chunks of a streamed answer, handed from the protocol to the reader."""

    __slots__ = ("chunks", "size", "finished", "error", "waiter", "conn")

    def __init__(self, conn: _HopConnection) -> None:
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.finished = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.conn = conn

    def feed(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > _STREAM_HIGH_WATER:
            self.conn.pause()
        self._wake()

    def finish(self, error: BaseException | None = None) -> None:
        if not self.finished:
            self.finished = True
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_chunk(self) -> bytes | None:
        while not self.chunks:
            if self.finished:
                if self.error is not None:
                    raise self.error
                return None
            self.waiter = self.conn.loop.create_future()
            try:
                await self.waiter
            except asyncio.CancelledError:
                self.conn.abort_request(self)
                raise
            finally:
                self.waiter = None
        chunk = self.chunks.popleft()
        self.size -= len(chunk)
        if self.size <= _STREAM_HIGH_WATER // 2:
            self.conn.resume()
        return chunk


class _HopConnection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self, pool: HopPool, key: tuple[str, int]) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.requests = 0  # requests sent on this connection (> 1: it was reused)
        self.idle_since = 0.0
        self.paused = False
        self.unsolicited = False
        # This key's idle list in the pool (made once: the pool never drops a key's list).
        self.idle: list[_HopConnection] = pool._idle.setdefault(key, [])
        self._on_deadline = self._deadline_passed
        # The deadline timer stays armed between requests (one timer per timeout period, not one
        # per request): it is armed for ``timer_at``; a request whose deadline is later only
        # notes it (``deadline``), and the timer, firing before it, is armed again for it.
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self._reset()

    def _reset(self) -> None:
        self.waiter: asyncio.Future[HopResponse] | None = None
        self.stream: _StreamBuffer | None = None
        self.want_stream = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.size = 0
        self.received = 0
        self.max_bytes = DEFAULT_MAX_ANSWER_BYTES
        self.headers_done = False
        self.deadline: float | None = None  # the request in flight's (None: none in flight)
        self.status = 0

    # ---- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is not None and not self.received and not self.want_stream:
            # The common case: a whole answer in one read, parsed in one go (else httptools).
            response = parse_whole_answer(data)
            if response is not None:
                self.waiter = self.deadline = None  # the rest of the state is as _reset leaves it
                if not self.closed:  # HopPool.release's work, inline (every hop): back to idle
                    pool = self.pool
                    if pool.closed:
                        self._close()
                    else:
                        self.idle_since = self.loop.time()
                        self.idle.append(self)
                        if pool._waiters:
                            pool._wake_one()
                if not waiter.done():
                    waiter.set_result(response)
                return
        if waiter is None and self.stream is None:
            # Bytes nobody asked for (or after the answer ended): the connection is not reusable.
            self._close()
            return
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HopBadAnswer(*self.key, f"the answer is not HTTP/1.1: {exc}"))
            return
        if self.unsolicited:
            self._fail(HopBadAnswer(*self.key, "the server sent more than one answer to one request"))
            return
        if not self.headers_done and self.received > MAX_HEADER_BYTES:
            self._fail(HopBadAnswer(*self.key, f"the answer's headers exceed {MAX_HEADER_BYTES} bytes"))
        elif self.size > self.max_bytes:
            self._fail(HopBadAnswer(*self.key, f"the answer's body exceeds {self.max_bytes} bytes"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        self.pool.forget(self)
        if self.waiter is None and self.stream is None:
            return
        if self.headers_done and self._close_delimited():
            self.on_message_complete()  # the body ran to the end of the connection
            return
        host, port = self.key
        reason = f": {exc}" if exc else ""
        what = "before answering" if not self.received else "in the middle of its answer"
        self._fail(
            HopDisconnected(
                host,
                port,
                f"{host}:{port} closed the connection {what}{reason}",
                reused=self.requests > 1,
                received=self.received,
            )
        )

    # ---- httptools callbacks -------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.waiter is None and self.stream is None:
            self.unsolicited = True  # an answer to nothing (bytes after the last one): close after this feed

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:
            return  # an interim answer (100 Continue): the real one follows
        self.headers_done = True
        if self.want_stream:
            waiter = self.waiter
            self.waiter = None
            self.stream = _StreamBuffer(self)
            if waiter is not None and not waiter.done():
                waiter.set_result(self._response(b"", self.stream))

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.stream is not None:
            self.stream.feed(body)
        else:
            self.parts.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:
            self.headers = []
            return
        keep_alive = self.parser.should_keep_alive() and not self.closed
        waiter, stream = self.waiter, self.stream
        response = None if waiter is None else HopResponse(self.status, self.headers, b"".join(self.parts))
        self._reset()
        if self.paused:
            self.resume()  # paused by the stream's last chunk: the next request's answer must be read
        if keep_alive:
            self.pool.release(self)
        else:
            self._close()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)  # type: ignore[arg-type]
        if stream is not None:
            stream.finish()

    # ---- requests ------------------------------------------------------------------------
    def send(
        self, request: bytes | list[bytes], deadline: float, max_bytes: int, stream: bool
    ) -> asyncio.Future[HopResponse]:
        """Write one request; the future resolves with the answer (at its headers when ``stream``)."""
        self.requests += 1
        self.waiter = waiter = self.loop.create_future()
        self.want_stream = stream
        self.max_bytes = max_bytes
        self.deadline = deadline
        timer = self.timer
        if timer is None or self.timer_at > deadline:
            if timer is not None:
                timer.cancel()
            self.timer = self.loop.call_at(deadline, self._on_deadline)
            self.timer_at = deadline
        # A connection is handed out only once connected: its transport is set.
        if request.__class__ is bytes:  # what build_request makes: bytes, or a list of them
            self.transport.write(request)  # type: ignore[union-attr,arg-type]
        else:
            self.transport.writelines(request)  # type: ignore[union-attr,arg-type]
        return waiter

    def abort_request(self, owner: object) -> None:
        """Close the connection if ``owner`` (a request's future or stream) still holds it."""
        if owner is self.waiter or owner is self.stream:
            self._fail(None)

    def _deadline_passed(self) -> None:
        self.timer = None
        deadline = self.deadline
        if deadline is None:
            return  # armed for a request answered since; none in flight now
        if deadline > self.timer_at:  # armed for an earlier request's: armed again for this one's
            self.timer = self.loop.call_at(deadline, self._on_deadline)
            self.timer_at = deadline
            return
        self._fail(HopTimeout(*self.key, "no complete answer within the deadline"))

    def _disarm(self) -> None:
        """Cancel the deadline timer (the connection is closing)."""
        timer = self.timer
        if timer is not None:
            timer.cancel()
            self.timer = None

    def _fail(self, error: BaseException | None) -> None:
        waiter, stream = self.waiter, self.stream
        self._disarm()
        self._reset()
        self._close()
        if error is not None:
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
            if stream is not None:
                stream.finish(error)
        elif stream is not None:
            stream.finish(HopDisconnected(*self.key, "the stream was closed", reused=False, received=0))

    def _close(self) -> None:
        self._disarm()
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.abort()

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def _close_delimited(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _response(self, body: bytes, stream: _StreamBuffer | None) -> HopResponse:
        return HopResponse(self.status, self.headers, body, self if stream else None, stream)


def parse_whole_answer(data: bytes) -> HopResponse | None:
    """``data`` read in one go when it is exactly one whole answer in the strict form our servers
    write (``_WHOLE_HEAD``): the same answer httptools' parser makes of it, its header
    lines kept as they are (parsed when asked for); else None (then the parser reads it). Such an
    answer keeps its connection open (HTTP/1.1 with no ``Connection`` header).

    The caps on the head and body are the parser path's too: that path checks them between
    reads, while an answer is still incomplete, so a whole answer in one read passes either way.
    """
    match = _WHOLE_HEAD.match(data)
    if match is None:
        return None
    end = match.end()
    if len(data) - end != int(match[3]):
        return None
    # What HopResponse(status, None, body, block=block) sets, without the call (every hop's answer).
    response: HopResponse = _new_object(HopResponse)
    response.status = int(match[1])
    response._block = match[2]
    response.body = data[end:]
    return response


@functools.lru_cache(maxsize=256)
def _line_start(name: str) -> bytes | None:
    """``\\n<name>: `` lower-cased: how a line of header ``name`` starts in a header block that
    :func:`parse_whole_answer` read (``Name: value\\r\\n`` lines), put behind a ``\\n`` and
    lower-cased; None for a name that is not a header token (then no line can be it)."""
    if _TOKEN_TEXT.fullmatch(name) is None:
        return None
    return b"\n" + name.lower().encode() + b": "


def parse_set_cookie(value: str) -> dict[str, str]:
    """The ``name: value`` a ``Set-Cookie`` header sets (attributes dropped; {} if malformed)."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(value)
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in jar.items()}


class HopPool:
    """Keep-alive connections of one event loop, at most ``max_connections`` open at once."""

    def __init__(self, max_connections: int, idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.loop = asyncio.get_running_loop()
        self.max_connections = max(1, max_connections)
        self.idle_timeout_s = idle_timeout_s
        self._idle: dict[tuple[str, int], list[_HopConnection]] = {}
        self._open: set[_HopConnection] = set()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closed = False
        # Request heads by (method, host, port, path, headers), a bounded number (see request).
        self.heads: dict[tuple[str, str, int, str, bytes], bytes] = {}

    @property
    def open_connections(self) -> int:
        """Connections open now, in use and idle."""
        return len(self._open)

    async def acquire(
        self,
        host: str,
        port: int,
        deadline: float,
        connect_timeout_s: float | None,
        fresh: bool = False,
        unix_path: str | None = None,
        unix_peer_pid: int = 0,
    ) -> _HopConnection:
        """An idle connection to ``host:port`` (through the Unix socket ``unix_path`` when given;
        unless ``fresh``), else a new one once the cap allows. A new Unix connection is used only
        when the process listening on it is ``unix_peer_pid`` (see :func:`check_unix_peer`)."""
        key = (host, port) if unix_path is None else (unix_path, 0)
        while True:
            if not fresh:
                conn = self.take_idle(key)
                if conn is not None:
                    return conn
            if len(self._open) < self.max_connections or self._close_one_idle():
                return await self._connect(key, deadline, connect_timeout_s, unix_peer_pid)
            await self._wait_for_room(key, deadline)

    def take_idle(self, key: tuple[str, int]) -> _HopConnection | None:
        """An idle connection for ``key`` still fit for use, or None."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be stale
            if conn.closed:
                continue
            if self.loop.time() - conn.idle_since > self.idle_timeout_s:
                conn._close()
                continue
            return conn
        return None

    async def _wait_for_room(self, key: tuple[str, int], deadline: float) -> None:
        waiter = self.loop.create_future()
        self._waiters.append(waiter)
        timer = self.loop.call_at(
            deadline, _expire, waiter, HopTimeout(*key, "no free connection within the deadline")
        )
        try:
            await waiter
        finally:
            timer.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def _connect(
        self, key: tuple[str, int], deadline: float, connect_timeout_s: float | None, peer_pid: int = 0
    ) -> _HopConnection:
        conn = _HopConnection(self, key)
        self._open.add(conn)  # counted from the start: a burst must not open more than the cap
        remaining = deadline - self.loop.time()
        timeout = remaining if connect_timeout_s is None else min(remaining, connect_timeout_s)
        try:
            if timeout <= 0:
                raise TimeoutError
            async with asyncio.timeout(timeout):
                if key[1] == 0:  # a Unix socket: the key holds its path
                    transport, _ = await self.loop.create_unix_connection(lambda: conn, key[0])
                    # Before a byte (the token, a session cookie) goes out: is it our server?
                    check_unix_peer(transport.get_extra_info("socket"), key[0], peer_pid)
                else:
                    await self.loop.create_connection(lambda: conn, *key)
        except TimeoutError as exc:
            self._drop(conn)
            raise HopTimeout(*key, f"no connection to {key[0]}:{key[1]} within {timeout:.3g}s") from exc
        except OSError as exc:
            self._drop(conn)
            raise HopConnectError(*key, exc) from exc
        except BaseException:
            self._drop(conn)
            raise
        if self.closed:
            conn._close()
            raise HopConnectError(*key, RuntimeError("the client was closed"))
        return conn

    def _drop(self, conn: _HopConnection) -> None:
        conn.closed = True
        if conn.transport is not None:
            conn.transport.abort()
        self.forget(conn)

    def _close_one_idle(self) -> bool:
        for conns in self._idle.values():
            while conns:
                conn = conns.pop(0)  # the oldest
                if not conn.closed:
                    conn._close()
                    return True
        return False

    def release(self, conn: _HopConnection) -> None:
        """Back to the idle list after a complete answer."""
        if self.closed or conn.closed:
            conn._close()
            return
        conn.idle_since = self.loop.time()
        conn.idle.append(conn)
        if self._waiters:
            self._wake_one()

    def forget(self, conn: _HopConnection) -> None:
        """A connection closed: it no longer counts against the cap."""
        if conn in self._open:
            self._open.discard(conn)
            idle = self._idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        """Close every connection (in flight ones too); later calls fail."""
        self.closed = True
        for conn in list(self._open):
            conn._fail(HopDisconnected(*conn.key, "the client was closed", reused=False, received=0))
        self._idle.clear()


def _expire(waiter: asyncio.Future[None], error: BaseException) -> None:
    if not waiter.done():
        waiter.set_exception(error)


def encode_headers(headers: Iterable[tuple[str, str]]) -> bytes:
    """Header lines for :func:`request` (``Name: value\\r\\n`` each); a line break inside one is refused."""
    lines = []
    for name, value in headers:
        line = f"{name}: {value}"
        if "\r" in line or "\n" in line:
            raise ValueError(f"a line break inside the HTTP header {name!r}")
        lines.append(line + "\r\n")
    out = "".join(lines)
    return out.encode("latin-1")


def request_head(method: str, host: str, port: int, path: str, headers: bytes) -> bytes:
    """A request's first lines: the request line, ``Host`` and ``headers`` (from
    :func:`encode_headers`); :func:`build_request` adds ``Content-Length`` and the body. A caller
    sending many requests alike builds it once and passes it to :func:`request` as ``head``."""
    if not path.isascii() or " " in path or "\r" in path or "\n" in path:
        path = urllib.parse.quote(path, safe="/?#&=%:@!$'()*+,;~-._")  # never a line break on the wire
    return b"%s %s HTTP/1.1\r\nHost: %s:%d\r\n%s" % (
        method.encode(),
        path.encode(),
        host.encode(),
        port,
        headers,
    )


def build_request(
    method: str,
    host: str,
    port: int,
    path: str,
    headers: bytes,
    body: bytes | list[bytes] | None,
    head: bytes | None = None,
) -> bytes | list[bytes]:
    """The bytes of one HTTP/1.1 request (a list for a large body or one in pieces: no copy of it);
    ``head``: :func:`request_head`'s bytes for these, already built."""
    if head is None:
        head = request_head(method, host, port, path, headers)
    if body is None:
        return head + b"\r\n"
    if body.__class__ is not bytes and not isinstance(body, bytes):
        return [b"%sContent-Length: %d\r\n\r\n" % (head, sum(map(len, body))), *body]
    size = len(body)
    if size < 65536:
        return b"%sContent-Length: %d\r\n\r\n%s" % (head, size, body)
    return [b"%sContent-Length: %d\r\n\r\n" % (head, size), body]


async def request(
    pool: HopPool,
    method: str,
    host: str,
    port: int,
    path: str,
    headers: bytes,
    body: bytes | list[bytes] | None,
    *,
    deadline: float,
    connect_timeout_s: float | None = None,
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    stream: bool = False,
    unix_path: str | None = None,
    unix_peer_pid: int = 0,
    head: bytes | None = None,
) -> HopResponse:
    """Send one request through ``pool`` and return its answer (read whole unless ``stream``).

    ``unix_path``: connect through that Unix socket (``Host`` still names ``host:port``), whose
    listener must be process ``unix_peer_pid`` (else :class:`HopConnectError`, nothing sent).

    ``headers`` comes from :func:`encode_headers` (``Host`` and ``Content-Length`` are added);
    ``head``, when given, is :func:`request_head`'s bytes for this method, host, port, path and
    headers (built once by a caller that sends many such requests).

    ``deadline`` is on the loop's clock (``loop.time()``) and covers waiting for a connection,
    connecting, and the whole answer (a streamed body too). Raises :class:`HopError`.
    """
    if method in ("HEAD", "CONNECT"):
        raise ValueError(f"{method} is not supported by the hop client")
    if head is None:
        # The same target and headers again (a rollout's calls): the head built for them then.
        heads = pool.heads
        key = (method, host, port, path, headers)
        head = heads.get(key)
        if head is None:
            head = request_head(method, host, port, path, headers)
            if len(heads) >= _HEADS_KEPT:
                heads.clear()
            heads[key] = head
    # build_request's, without the call, for the usual bodies: small bytes, or pieces.
    if body.__class__ is bytes and (size := len(body)) < 65536:
        data: bytes | list[bytes] = b"%sContent-Length: %d\r\n\r\n%s" % (head, size, body)  # type: ignore[arg-type]
    elif body.__class__ is list:
        data = [b"%sContent-Length: %d\r\n\r\n" % (head, sum(map(len, body))), *body]  # type: ignore[arg-type]
    else:
        data = build_request(method, host, port, path, headers, body, head)
    # An idle connection without the acquire coroutine (what acquire hands out first anyway).
    conn = pool.take_idle((host, port) if unix_path is None else (unix_path, 0))
    fresh = False
    while True:
        if conn is None:
            conn = await pool.acquire(
                host, port, deadline, connect_timeout_s, fresh, unix_path, unix_peer_pid
            )
        waiter = conn.send(data, deadline, max_answer_bytes, stream)
        try:
            return await waiter
        except HopDisconnected as exc:
            # A pooled connection the server had closed: nothing came back, so no handler ran.
            if fresh or not exc.reused or exc.received:
                raise
            fresh = True
            conn = None  # a new connection, never an idle one, for the second try
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                waiter.result().close()  # a stream opened just before the cancel
            else:
                conn.abort_request(waiter)
            raise
