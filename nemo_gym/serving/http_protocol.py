"""The HTTP/1.1 protocol every server here speaks: uvicorn's httptools protocol, its per-request
path made lean, with this project's socket-level behaviour built in rather than layered on.

uvicorn's :class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` stays in charge of
everything but one request's ordinary path: the connection set and graceful shutdown, flow
control, pipelining, 400s for malformed requests, WebSocket upgrades, ``limit_concurrency``.
:class:`HopHttpProtocol` replaces, per request:

- the header callback, which only lower-cases the name and keeps the pair: the ``Expect`` check
  and each header's first value (what the access checks and a direct route read, on the cycle
  as ``first_values``) are made once per request when the headers are complete;
- the scope, copied from one built per connection (uvicorn builds every key again), carrying the
  connection's "gone" future (:data:`~nemo_gym.serving.disconnect.CONNECTION_GONE_SCOPE_KEY`,
  resolved when the connection is lost) without a wrapper around the app;
- the request cycle and its answer (:class:`~nemo_gym.serving.http_cycle.HopCycle`): no
  ``asyncio.Event``, the body kept as the chunks that came, the answer's head sent with its body
  in one write (what :mod:`nemo_gym.serving.write_coalescing` does for other protocols), headers
  checked with a few scans of the whole head;
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
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from nemo_gym.serving.disconnect import CONNECTION_GONE_SCOPE_KEY
from nemo_gym.serving.http_cycle import HopCycle, default_header_lines
from nemo_gym.serving.request_guard import headers_late_answer

# A request target that is a plain path: no query, fragment or escapes (nothing to parse).
_PLAIN_PATH = re.compile(rb"/[^?%#]*")


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
        # Whether the request being read is a WebSocket handshake (set when its headers are complete).
        self._ng_upgrading = False
        self._ng_fresh_context = bool(getattr(self.config, "reset_contextvars", False))
        self._ng_task_done = self.tasks.discard  # what takes a request's finished task off the set
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
        elif self._ng_waiting_since is None and (before is None or before.response_complete):
            # A request's first bytes without all its headers: they are due within the deadline
            # (from now: this read's parse is all that came before). A whole request in one read
            # (the usual case) never waits.
            self._ng_waiting_since = self.loop.time()

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's, less its Expect check (made once per request in on_headers_complete).
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        headers = self.headers
        # The first value of each header (what the access checks and a direct route read).
        first = dict(reversed(headers))
        if b"expect" in first:  # uvicorn's rule: any Expect header of 100-continue
            self.expect_100_continue = any(
                name == b"expect" and value.lower() == b"100-continue" for name, value in headers
            )
        scope: dict[str, Any] = {
            **self._ng_scope,
            "headers": headers,
            "state": self.app_state.copy(),
            "method": parser.get_method().decode("ascii"),
        }
        self.scope = scope  # type: ignore[assignment]
        http_version = parser.get_http_version()
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            self._ng_upgrading = True
            return
        self._ng_upgrading = False
        url = self.url
        if _PLAIN_PATH.fullmatch(url) is not None:
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
        cycle = HopCycle(self, scope, http_version != "1.0" and parser.should_keep_alive(), first)
        app: Any
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        else:
            app = self.app
            direct = self._ng_direct
            if direct is not None and not root_path:
                found = cycle.direct = direct.find(scope["method"], path)
                if found is not None:
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
        task.add_done_callback(self._ng_task_done)
        self.tasks.add(task)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        # An upgrade first: a WebSocket handshake has no cycle (what on_headers_complete found).
        if self._ng_upgrading or cycle.response_complete:
            return
        cycle.body_chunks.append(body)
        cycle.body_size += len(body)
        if cycle.body_size > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        if cycle.waiter is None:  # the cycle is its own message_event
            cycle.flag = True
        else:
            cycle.set()

    def on_message_complete(self) -> None:
        cycle = self.cycle
        # An upgrade first: a WebSocket handshake has no cycle (what on_headers_complete found).
        if self._ng_upgrading or cycle.response_complete:
            return
        cycle.more_body = False
        if cycle.waiter is None:  # the cycle is its own message_event
            cycle.flag = True
        else:
            cycle.set()

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
        self._ng_lead = default_header_lines(defaults)

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
