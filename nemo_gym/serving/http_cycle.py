"""One request and its answer on the lean HTTP/1.1 protocol (:mod:`nemo_gym.serving.http_protocol`).

:class:`HopCycle` keeps uvicorn's ``RequestResponseCycle`` contract (``receive``, ``send``,
``run_asgi``, and the attributes the protocol and the request guard read) with less per request:
no ``asyncio.Event`` (a flag, and a future only while ``receive`` has to wait), the body kept as
the chunks that came (no ``bytearray`` copies), the answer's head sent with its body in one
write (a streamed answer's head leaves on the loop's next iteration if no body follows in the
same step), header names and values checked with a few scans of the whole head instead of two
regular expressions per header, the server's own headers rendered once per change; and
``answer_whole`` for an answer whose body is at hand (a direct route's).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_RE, STATUS_LINE
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

# Control characters a header value must not hold, less the line ends (counted apart) and tab.
_BAD_VALUE_BYTE = re.compile(b"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Header names already checked against uvicorn's rule (an app sends the same few names).
_GOOD_NAMES: set[bytes] = set()
_GOOD_NAMES_MAX = 512
# Header lines as sent, by the (name, value) pair an app gave: pairs that neither frame the answer
# nor close the connection, short, not cookies, already checked (an app sends the same few).
_LINES: dict[Any, bytes] = {}
_LINES_MAX = 512
_LINE_KEPT_BELOW = 256
_NOT_KEPT = frozenset((b"content-length", b"transfer-encoding", b"connection", b"set-cookie", b"date"))
# Bodies up to this size are joined with their head into one bytes object; larger ones are
# written with the head as a vectored write (no copy).
_JOIN_BELOW = 65536


class HopCycle:
    """One request and its answer: uvicorn's ``RequestResponseCycle`` contract (``receive``,
    ``send``, ``run_asgi``, and the attributes the protocol and the request guard read).

    The cycle is its own ``message_event``: ``asyncio.Event``'s ``set``/``clear``/``is_set``/
    ``wait`` over a flag, with a future only while ``receive`` waits (no second object per request).
    """

    # What every request starts with, as class attributes: a cycle writes only the few that
    # differ from request to request (and those that change while it runs, on the instance).
    flag = False
    waiter: asyncio.Future[None] | None = None
    disconnected = False
    body_size = 0
    more_body = True
    response_started = False
    response_complete = False
    chunked_encoding: bool | None = None
    expected_content_length = 0
    head: bytes | None = None
    # A direct route's target (what the app's ``ng_direct.find`` gave), served by its
    # ``serve(cycle)`` instead of the ASGI app; the task serving the request; whether the
    # connection was lost while that route's handler ran (the task was cancelled for it).
    direct: Any = None
    task: asyncio.Task[None] | None = None
    client_gone = False

    def __init__(
        self, protocol: Any, scope: dict[str, Any], keep_alive: bool, first_values: dict[bytes, bytes]
    ) -> None:
        self.protocol = protocol
        self.scope = scope
        # The first value of each request header by its lower-cased name.
        self.first_values = first_values
        self.transport = protocol.transport
        self.on_response = protocol.on_response_complete
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = protocol.expect_100_continue
        self.body_chunks: list[bytes] = []

    # ---- ``message_event``: a request body's part or the answer's end came --------------------
    @property
    def message_event(self) -> HopCycle:
        """The cycle itself (a property, not an attribute: no reference cycle to collect)."""
        return self

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
            waiter = self.waiter = self.protocol.loop.create_future()
            try:
                await waiter
            finally:
                self.waiter = None

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
        if len(body) < _JOIN_BELOW:  # what _write does with a head
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))
        self._complete()

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
        kept: list[tuple[Any, bytes]] | None = None  # lines to keep once the head is checked
        unchecked = False  # whether a line was neither kept nor plain digits (then all are checked)
        for header in headers:
            name, value = header
            if name == b"content-length" and self.chunked_encoding is None:
                # The usual framing header as apps write it (a lower-case name needs no check;
                # ASCII digits need none either).
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
                content.append(b"content-length: " + value + b"\r\n")
                if not value.isdigit():
                    unchecked = True
                continue
            try:
                line = _LINES.get(header)
            except TypeError:  # a list, not a tuple: nothing kept for it
                line = None
            if line is not None:
                content.append(line)
                continue
            unchecked = True
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
            line = name + b": " + value + b"\r\n"
            content.append(line)
            if (
                len(line) < _LINE_KEPT_BELOW
                and name not in _NOT_KEPT
                and len(_LINES) < _LINES_MAX
                and type(header) is tuple
                and type(value) is bytes
            ):
                if kept is None:
                    kept = []
                kept.append((header, line))
        # The values, checked at once: no control byte but tab, and no line end of their own
        # (each header line adds exactly one CR LF; a kept line was checked so).
        if unchecked:
            lines = b"".join(content[1:] if lead is None else content[2:])
            if (
                _BAD_VALUE_BYTE.search(lines) is not None
                or lines.count(b"\r") != len(headers)
                or lines.count(b"\n") != len(headers)
            ):
                raise RuntimeError("Invalid HTTP header value.")
        if kept is not None:  # each of these lines is clean: the whole head passed
            for header, line in kept:
                if len(_LINES) < _LINES_MAX:
                    _LINES[header] = line
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
        self.head = None
        self._write(head, data)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self._complete()

    def _write(self, head: bytes | None, data: bytes) -> None:
        """Write ``data`` after the answer's head when that is still held (one write when small)."""
        if head is None:
            if data:
                self.transport.write(data)
        elif len(data) < _JOIN_BELOW:
            self.transport.write(head + data)
        else:
            self.transport.writelines((head, data))

    def _complete(self) -> None:
        """The answer is whole: wake a receive waiting for it, close a connection not kept alive,
        and let the protocol go on to the next request."""
        self.response_complete = True
        if self.waiter is None:
            self.flag = True
        else:
            self.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    async def receive(self) -> Any:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.protocol.flow.resume_reading()
            if not self.flag:
                await self.wait()
            self.flag = False
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body = b"".join(self.body_chunks)  # one chunk: that very object
        self.body_chunks = []
        self.body_size = 0
        return {"type": "http.request", "body": body, "more_body": self.more_body}


def _nothing() -> None:
    return None


def default_header_lines(defaults: list[tuple[bytes, bytes]]) -> bytes | None:
    """The server's default headers (uvicorn's date and server) as their lines are sent, checked
    once; None when one of them frames the answer or is invalid (each answer then handles them)."""
    lines = []
    for name, value in defaults:
        lower = name.lower()
        if lower in (b"content-length", b"transfer-encoding", b"connection") or HEADER_RE.search(name):
            return None
        lines.append(b"%s: %s\r\n" % (lower, value))
    lead = b"".join(lines)
    valid = (
        _BAD_VALUE_BYTE.search(lead) is None
        and lead.count(b"\r") == len(defaults)
        and lead.count(b"\n") == len(defaults)
    )
    return lead if valid else None
