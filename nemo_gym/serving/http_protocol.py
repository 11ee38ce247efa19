"""The HTTP/1.1 protocol every server here speaks: uvicorn's httptools protocol, its per-request
path made lean, with this project's socket-level behaviour built in rather than layered on.

uvicorn's :class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` stays in charge of
everything but one request's ordinary path: the connection set and graceful shutdown, flow
control, pipelining, 400s for malformed requests, WebSocket upgrades, ``limit_concurrency``.
:class:`HopHttpProtocol` replaces, per request:

- the scope, copied from one built per connection (uvicorn builds every key again), carrying the
  connection's "gone" future (:data:`~nemo_gym.serving.disconnect.CONNECTION_GONE_SCOPE_KEY`,
  resolved when the connection is lost) without a wrapper around the app;
- the request cycle (:class:`HopCycle`): no ``asyncio.Event`` (a flag, and a future only while
  ``receive`` has to wait), the body kept as the chunks that came (no ``bytearray`` copies);
- the answer: its head goes out with its body in one write (what
  :mod:`nemo_gym.serving.write_coalescing` does for other protocols; a streamed answer's head
  leaves on the loop's next iteration if no body follows in the same step), header names and
  values checked with a few scans of the whole head instead of two regular expressions per header;
- a direct route's request (one the app's ``ng_direct`` finds: a server gate's
  :class:`~nemo_gym.serving.direct_serve.DirectServer`): served by that server's one coroutine
  instead of the ASGI layers, and its handler cancelled from ``connection_lost`` when the
  caller hangs up;
- the timers: one per connection, checking both the header deadline (headers complete within
  ``header_timeout_s`` of the connection opening or of a following request's first byte, else a
  JSON 408 and the connection closed: :func:`~nemo_gym.serving.request_guard.header_timeout_protocol`'s
  rule) and uvicorn's keep-alive timeout, instead of a keep-alive timer armed and cancelled per request.

What the app sees and what goes on the wire are as with uvicorn's protocol: the same scope keys,
lower-cased header names, ``date``/``server`` headers, ``connection: close`` when the request or
the answer ends the connection, chunked answers without a length, 100 Continue on the first
``receive``, a text 500 for an app that fails before answering.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import HEADER_RE, STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from nemo_gym.serving.disconnect import CONNECTION_GONE_SCOPE_KEY
from nemo_gym.serving.request_guard import headers_late_answer

# Control characters a header value must not hold, less the line ends (counted apart) and tab.
_BAD_VALUE_BYTE = re.compile(b"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Header names already checked against uvicorn's rule (an app sends the same few names).
_GOOD_NAMES: set[bytes] = set()
_GOOD_NAMES_MAX = 512
# Bodies up to this size are joined with their head into one bytes object; larger ones are
# written with the head as a vectored write (no copy).
_JOIN_BELOW = 65536


class _Signal:
    """``asyncio.Event``'s ``set``/``clear``/``is_set``/``wait``, with a future only while waited on."""

    __slots__ = ("flag", "loop", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.flag = False
        self.waiter: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self.flag = False

    async def wait(self) -> None:
        while not self.flag:
            waiter = self.waiter = self.loop.create_future()
            try:
                await waiter
            finally:
                self.waiter = None


class HopCycle:
    """One request and its answer: uvicorn's ``RequestResponseCycle`` contract (``receive``,
    ``send``, ``run_asgi``, and the attributes the protocol and the request guard read)."""

    __slots__ = (
        "body_chunks",
        "body_size",
        "chunked_encoding",
        "client_gone",
        "direct",
        "disconnected",
        "expected_content_length",
        "head",
        "keep_alive",
        "message_event",
        "more_body",
        "on_response",
        "protocol",
        "response_complete",
        "response_started",
        "scope",
        "task",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(self, protocol: HopHttpProtocol, scope: dict[str, Any], keep_alive: bool) -> None:
        self.protocol = protocol
        self.scope = scope
        self.transport = protocol.transport
        self.message_event = _Signal(protocol.loop)
        self.on_response = protocol.on_response_complete
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = protocol.expect_100_continue
        self.body_chunks: list[bytes] = []
        self.body_size = 0
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0
        self.head: bytes | None = None
        # A direct route's target (what the app's ``ng_direct.find`` gave), served by its
        # ``serve(cycle)`` instead of the ASGI app; the task serving the request; whether the
        # connection was lost while that route's handler ran (the task was cancelled for it).
        self.direct: Any = None
        self.task: asyncio.Task[None] | None = None
        self.client_gone = False

    async def run_asgi(self, app: Any) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            await self.app_failed(exc)
        else:
            if result is not None:
                self.protocol.logger.error("ASGI callable should return None, but returned '%s'.", result)
                self.flush_head()
                self.transport.close()
            elif not self.response_started and not self.disconnected:
                self.protocol.logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                self.protocol.logger.error("ASGI callable returned without completing response.")
                self.flush_head()
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def app_failed(self, exc: BaseException) -> None:
        """What uvicorn does for an app that raised: logged, a text 500 if nothing was answered
        yet, else the connection closed."""
        self.protocol.logger.error("Exception in ASGI application\n", exc_info=exc)
        if not self.response_started:
            await self.send_500_response()
        else:
            self.flush_head()
            self.transport.close()

    async def send_500_response(self) -> None:
        await self.send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", b"21"),
                    (b"connection", b"close"),
                ],
            }
        )
        await self.send({"type": "http.response.body", "body": b"Internal Server Error", "more_body": False})

    def flush_head(self) -> None:
        """Write a response head held for its body now (its body is not coming in this step)."""
        head = self.head
        if head is not None:
            self.head = None
            if not self.transport.is_closing():
                self.transport.write(head)

    async def send(self, message: Any) -> None:
        protocol = self.protocol
        if protocol.flow.write_paused and not self.disconnected:
            await protocol.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{message['type']}'."
                )
            self._start(message)
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.body', but got '{message['type']}'."
                )
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, after response already completed."
            )

    def _start(self, message: Any) -> None:
        self._begin(message["status"], message.get("headers", ()))
        if self.chunked_encoding:
            # A stream: its first chunk may be a while; the head must not wait for it.
            self.protocol.loop.call_soon(self.flush_head)

    def answer_whole(self, status_code: int, headers: Any, body: bytes) -> None:
        """A whole answer at once: what ``send`` does for an ``http.response.start`` of
        ``status_code`` and ``headers`` followed by the last ``http.response.body`` of ``body``
        (flow control and a lost connection are the caller's to check)."""
        self._begin(status_code, headers)
        if (
            self.chunked_encoding
            or self.expected_content_length != len(body)
            or self.scope["method"] == "HEAD"
        ):
            self._body(body, False)  # framed otherwise, or a length that does not match: as send does
            return
        head: bytes = self.head  # type: ignore[assignment]
        self.head = None
        self.expected_content_length = 0
        if len(body) < _JOIN_BELOW:
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))
        self.response_complete = True
        event = self.message_event
        if event.waiter is None:
            event.flag = True
        else:
            event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    def _begin(self, status_code: int, app_headers: Any) -> None:
        """The answer's head, held in ``self.head`` for its body."""
        self.response_started = True
        self.waiting_for_100_continue = False
        protocol = self.protocol
        defaults = protocol.server_state.default_headers
        if defaults is not protocol._ng_defaults:
            protocol._ng_take_defaults(defaults)
        lead = protocol._ng_lead
        if lead is None:
            headers = defaults + list(app_headers)
            content = [STATUS_LINE[status_code]]
        else:  # the server's own headers (date, server) as rendered and checked once
            headers = app_headers if type(app_headers) is list else list(app_headers)
            content = [STATUS_LINE[status_code], lead]
        scope = self.scope
        if protocol.access_log:
            protocol.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(scope),  # type: ignore[arg-type]
                scope["method"],
                get_path_with_query_string(scope),  # type: ignore[arg-type]
                scope["http_version"],
                status_code,
            )
        has_connection_close = False
        for name, value in headers:
            if name not in _GOOD_NAMES:
                if HEADER_RE.search(name):
                    raise RuntimeError("Invalid HTTP header name.")
                if len(_GOOD_NAMES) < _GOOD_NAMES_MAX:
                    _GOOD_NAMES.add(name)
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                if b"close" in [token.lower().strip() for token in value.split(b",")]:
                    self.keep_alive = False
                    has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
        # The values, checked at once: no control byte but tab, and no line end of their own
        # (each header line adds exactly one CR LF).
        lines = b"".join(content[1:] if lead is None else content[2:])
        if (
            _BAD_VALUE_BYTE.search(lines) is not None
            or lines.count(b"\r") != len(headers)
            or lines.count(b"\n") != len(headers)
        ):
            raise RuntimeError("Invalid HTTP header value.")
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and scope["method"] != "HEAD" and status_code not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.head = b"".join(content)

    def _body(self, body: bytes, more_body: bool) -> None:
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            data = b""
        elif self.chunked_encoding:
            data = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more_body:
                data += b"0\r\n\r\n"
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            data = body
        head = self.head
        if head is not None:
            self.head = None
            if len(data) < _JOIN_BELOW:
                self.transport.write(head + data)
            else:
                self.transport.writelines((head, data))
        elif data:
            self.transport.write(data)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            event = self.message_event
            if event.waiter is None:
                event.flag = True
            else:
                event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    async def receive(self) -> Any:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.protocol.flow.resume_reading()
            event = self.message_event
            if not event.flag:
                await event.wait()
            event.flag = False
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        chunks = self.body_chunks
        body = (chunks[0] if len(chunks) == 1 else b"".join(chunks)) if chunks else b""
        self.body_chunks = []
        self.body_size = 0
        return {"type": "http.request", "body": body, "more_body": self.more_body}


def _nothing() -> None:
    return None


class HopHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a lean per-request path (see the module's docstring).

    ``header_timeout_s`` is set on the subclass :func:`hop_http_protocol` makes.
    """

    header_timeout_s: float = 15.0
    cycle: Any

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        loop = self.loop
        self._ng_gone: asyncio.Future[None] = loop.create_future()
        self._ng_scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            CONNECTION_GONE_SCOPE_KEY: self._ng_gone,
        }
        # The app's direct routes (a server gate's ``ng_direct``), served without the ASGI layers;
        # the cycle whose direct-route handler is running (cancelled if the connection is lost).
        self._ng_direct: Any = getattr(self.app, "ng_direct", None)
        self._ng_watched: HopCycle | None = None
        self._ng_fresh_context = bool(getattr(self.config, "reset_contextvars", False))
        # The server's default headers (uvicorn's date and server; a new list each second) and
        # their lines as sent, checked once (None: they need the general handling).
        self._ng_defaults: Any = None
        self._ng_lead: bytes | None = None
        # When the connection began waiting for a request's headers / began idling between
        # requests (loop time), None otherwise: one timer per connection checks both.
        self._ng_waiting_since: float | None = loop.time()
        self._ng_idle_since: float | None = None
        self._ng_timer: asyncio.TimerHandle | None = loop.call_later(self.header_timeout_s, self._ng_check)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ng_timer is not None:
            self._ng_timer.cancel()
            self._ng_timer = None
        super().connection_lost(exc)
        if not self._ng_gone.done():
            self._ng_gone.set_result(None)
        watched = self._ng_watched
        if watched is not None:
            # A direct route's handler whose caller hung up: nobody is left to read its answer,
            # and its work must not go on (what until_disconnect does for ASGI routes).
            self._ng_watched = None
            watched.disconnected = watched.client_gone = True
            if watched.task is not None:
                watched.task.cancel()

    def data_received(self, data: bytes) -> None:
        self._ng_idle_since = None
        before = self.cycle
        if self._ng_waiting_since is None and (before is None or before.response_complete):
            self._ng_waiting_since = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        if self.cycle is not before or self._ng_upgraded():
            self._ng_waiting_since = None

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        scope = self._ng_scope.copy()
        scope["headers"] = self.headers
        scope["state"] = self.app_state.copy()
        self.scope = scope  # type: ignore[assignment]

    def on_headers_complete(self) -> None:
        parser = self.parser
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope["method"] = parser.get_method().decode("ascii")
        http_version = parser.get_http_version()
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        url = self.url
        if url[:1] == b"/" and b"?" not in url and b"%" not in url and b"#" not in url:
            raw_path, query = url, b""
            path = url.decode("ascii")
        else:
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path, parsed.query or b""
            path = raw_path.decode("ascii")
            if "%" in path:
                from urllib.parse import unquote

                path = unquote(path)
        root_path = self.root_path
        if root_path:
            path = root_path + path
            raw_path = root_path.encode("ascii") + raw_path
        scope["path"] = path
        scope["raw_path"] = raw_path
        scope["query_string"] = query
        cycle = HopCycle(self, scope, http_version != "1.0" and parser.should_keep_alive())
        app: Any
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        else:
            app = self.app
            direct = self._ng_direct
            if direct is not None and not root_path:
                cycle.direct = direct.find(scope["method"], path)
                if cycle.direct is not None:
                    app = direct
        existing = self.cycle
        self.cycle = cycle
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, app)
        else:
            self.flow.pause_reading()  # a pipelined request waits for the answer before it
            self.pipeline.appendleft((cycle, app))  # type: ignore[arg-type]

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # A direct route's request is served by the direct server's one coroutine.
        coroutine = app.serve(cycle) if cycle.direct is not None else cycle.run_asgi(app)
        if self._ng_fresh_context:  # uvicorn's opt-in: each request in an empty context
            task = self.loop.create_task(coroutine, context=contextvars.Context())
        else:
            task = self.loop.create_task(coroutine)
        cycle.task = task
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_body(self, body: bytes) -> None:
        # An upgrade first: a WebSocket handshake has no cycle.
        if (self.parser.should_upgrade() and self._should_upgrade()) or self.cycle.response_complete:
            return
        cycle = self.cycle
        cycle.body_chunks.append(body)
        cycle.body_size += len(body)
        if cycle.body_size > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        event = cycle.message_event
        if event.waiter is None:
            event.flag = True
        else:
            event.set()

    def on_message_complete(self) -> None:
        if (self.parser.should_upgrade() and self._should_upgrade()) or self.cycle.response_complete:
            return
        cycle = self.cycle
        cycle.more_body = False
        event = cycle.message_event
        if event.waiter is None:
            event.flag = True
        else:
            event.set()

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.flow.read_paused:
            self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._ng_idle_since = self.loop.time()

    def _ng_take_defaults(self, defaults: list[tuple[bytes, bytes]]) -> None:
        """Render the server's default headers once for every answer until they change."""
        self._ng_defaults = defaults
        lines = []
        for name, value in defaults:
            lower = name.lower()
            if lower in (b"content-length", b"transfer-encoding", b"connection") or HEADER_RE.search(name):
                self._ng_lead = None  # they frame the answer, or are refused: each answer handles them
                return
            lines.append(b"%s: %s\r\n" % (lower, value))
        lead = b"".join(lines)
        valid = (
            _BAD_VALUE_BYTE.search(lead) is None
            and lead.count(b"\r") == len(defaults)
            and lead.count(b"\n") == len(defaults)
        )
        self._ng_lead = lead if valid else None

    def _ng_upgraded(self) -> bool:
        """Whether the connection now speaks another protocol (a WebSocket upgrade)."""
        transport = self.transport
        return transport is not None and transport.get_protocol() is not self

    def _ng_check(self) -> None:
        self._ng_timer = None
        if self.transport.is_closing() or self._ng_upgraded():
            return
        now = self.loop.time()
        header_timeout, keep_alive = self.header_timeout_s, self.timeout_keep_alive
        waiting, idle = self._ng_waiting_since, self._ng_idle_since
        if waiting is not None and now - waiting >= header_timeout:
            self._ng_headers_late()
            return
        if idle is not None and waiting is None and now - idle >= keep_alive:
            self.transport.close()
            return
        # Never more than the header deadline away: a request may start at any moment, and its
        # headers are then due at most that long after (no timer is re-armed per request).
        wait = header_timeout
        if waiting is not None:
            wait = waiting + header_timeout - now
        elif idle is not None:
            wait = min(header_timeout, idle + keep_alive - now)
        self._ng_timer = self.loop.call_later(max(wait, 0.001), self._ng_check)

    def _ng_headers_late(self) -> None:
        self.transport.write(headers_late_answer(self.header_timeout_s))
        self.transport.close()


def hop_http_protocol(header_timeout_s: float) -> type[HopHttpProtocol]:
    """:class:`HopHttpProtocol` with its header deadline set to ``header_timeout_s``."""
    return type("HopHttpProtocol", (HopHttpProtocol,), {"header_timeout_s": header_timeout_s})
