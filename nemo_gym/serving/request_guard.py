"""What every server checks about a request before a handler sees it.

- The body size is counted while it is read: past the limit the answer is a JSON 413 at once
  (a declared ``Content-Length`` over the limit is refused before a byte of the body is read),
  so an oversized body, chunked or not, never sits in memory.
- A client that sends its headers or its body too slowly is cut: headers must be complete
  ``header_timeout_s`` after the connection opens (or after the first byte of a following
  request on a kept-alive connection), the whole body ``body_timeout_s`` after the headers.
- JSON bodies are parsed by :func:`parse_json_object`: a body that is not JSON, not an object,
  or nested deeper than :data:`MAX_JSON_DEPTH` is a 400/422 naming the problem (a scan of the
  raw bytes before parsing, at C speed: one pass for a body with few brackets, see
  :func:`nesting_over`; a long body of prose is checked on what was parsed instead,
  :func:`parsed_nesting_over`).
- Error answers (status >= 400) have secrets hidden (:mod:`nemo_gym.serving.secrets`) before they leave.
- An exception no handler caught becomes a JSON 500 naming the server, never a plain-text one,
  and an exception raised after the answer was sent keeps the connection usable.

:class:`RequestGuard` is the ASGI part; :func:`header_timeout_protocol` the socket part (the ASGI
app is only called once the headers are complete, so a half-sent header is the protocol's job).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import operator
import re
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.serving.disconnect import running_loop
from nemo_gym.serving.secrets import redact_bytes

logger = logging.getLogger("nemo_gym")

# orjson cannot serialize more than 254 levels; answers echo the request (plus a few levels of
# wrapping), so requests are held well below that.
MAX_JSON_DEPTH = 200
DEFAULT_HEADER_TIMEOUT_S = 15.0
DEFAULT_BODY_TIMEOUT_S = 60.0

_STRINGS = re.compile(rb'"[^"]*"')
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
# What a scan of a JSON text keeps: its brackets and quotes, backslashes, and every byte that may
# follow a backslash in an escape (so that each escape can be dropped whole).
_NOT_ESCAPABLE = bytes(b for b in range(256) if b not in b'[]{}"\\/bfnrtu')
_NOT_BRACKET_OR_QUOTE = bytes(b for b in range(256) if b not in b'[]{}"')
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
# How many rounds of innermost pairs :func:`_depth_at_most` peels before counting the rest.
_PEELS = 8
# From this many bytes, a text of few values has its depth checked on what was parsed
# (parsed_nesting_over): about 8 ns a value against the byte scan's 0.4-1.2 ns a byte.
_PARSED_CHECK_FROM = 16_384
_BYTES_PER_VALUE = 32  # fewer values than one per this many bytes: "few" (_few_values)
_SAMPLE_STEP = 61
_CAP_PROBE_MAX = 4096


def headers_late_answer(header_timeout_s: float) -> bytes:
    """The whole 408 a connection gets when its request headers are late (then it is closed)."""
    body = orjson.dumps({"error": f"request headers not received within {header_timeout_s:g}s"})
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class HTTPError(Exception):
    """Raise from a handler to answer with a status code and a JSON error body.

    ``extra`` fields are added to the body, e.g. ``failure_class="judge_failed"`` (the collector
    files the rollout under that class) or ``detail=[{"field": ..., "message": ...}]``.
    """

    def __init__(self, status_code: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.extra = extra


class BodyTooLarge(HTTPError):
    """The request body passed the server's limit while it was being read (413)."""


class BodyTimeout(HTTPError):
    """The request body did not arrive in time (408)."""


def json_nesting_depth(raw: bytes) -> int:
    """How deeply the arrays and objects of a JSON text nest (0 for a scalar).

    Works on the raw bytes without parsing, in passes at C speed: one pass keeps what can be
    structure (brackets, quotes, escapes: usually a small fraction of the text), escapes are
    dropped from that (when it has any), then strings; the depth is the highest running count
    of open brackets, summed by ``itertools.accumulate``.
    """
    return _running_depth(_outside_strings(_structure(raw.translate(None, _NOT_ESCAPABLE))))


def nesting_over(raw: bytes, limit: int) -> int | None:
    """The nesting depth of the JSON text ``raw`` when it is over ``limit``, else None.

    Cheap for the usual body: a text with at most ``limit`` opening brackets cannot nest deeper,
    and counting them takes the one pass over the text (see :func:`json_nesting_depth`); past
    that, brackets that peel down in a few rounds are shallow without a count per bracket.
    """
    if len(raw) <= limit:
        return None
    kept = raw.translate(None, _NOT_ESCAPABLE)
    if kept.count(b"[") + kept.count(b"{") <= limit:
        return None
    brackets = _outside_strings(_structure(kept))
    if _depth_at_most(brackets, limit):
        return None
    depth = _running_depth(brackets)
    return depth if depth > limit else None


def _structure(kept: bytes) -> bytes:
    """The brackets and quotes of a text (``kept``: what :data:`_NOT_ESCAPABLE` leaves of it)
    outside its escapes."""
    if b"\\" in kept:
        # Each escape is a backslash and the byte after it, which ``kept`` holds for every
        # escape JSON has (a newline's ``\n`` must not pair its backslash with a string's
        # closing quote): drop the pairs, left to right as escapes pair.
        kept = _ESCAPE.sub(b"", kept)
    return kept.translate(None, _NOT_BRACKET_OR_QUOTE)


def _outside_strings(structure: bytes) -> bytes:
    """The brackets of ``structure`` (brackets and quotes, escapes gone) outside its strings."""
    if b'"' not in structure:
        return structure
    # Two quotes in a row are an empty string, or the end of one string and the start of the
    # next with no bracket between: either way the brackets outside strings stay as they are.
    # Most strings hold no bracket, so this leaves few quotes.
    structure = structure.replace(b'""', b"")
    if b'"' not in structure:
        return structure
    if structure.count(b'"') % 2 == 0:
        # Balanced quotes: every second piece between quotes is a string's inside (a split at
        # C speed, ~3x faster than the expression below on a long history).
        return b"".join(structure.split(b'"')[::2])
    return _STRINGS.sub(b"", structure)


def _running_depth(brackets: bytes) -> int:
    """The highest running count of open brackets."""
    if not brackets:
        return 0
    # Opening brackets step 2 and closing ones 0: after n brackets the depth is the running sum - n.
    steps = brackets.translate(_STEP)
    return max(0, max(map(operator.sub, itertools.accumulate(steps), itertools.count(1))))


def _depth_at_most(brackets: bytes, limit: int) -> bool:
    """Whether :func:`_running_depth` of ``brackets`` is at most ``limit``, for the usual shallow
    text in a few passes at C speed: each removal of every innermost ``[]`` (or ``{}``) pair lowers
    the depth by at most one, so the depth is at most the removals that took something plus the
    depth of what is left."""
    removed = 0
    for _ in range(_PEELS):
        before = len(brackets)
        for pair in (b"[]", b"{}"):
            shorter = brackets.replace(pair, b"")
            if len(shorter) != len(brackets):
                removed += 1
                brackets = shorter
        if not brackets or len(brackets) == before:
            break
    return removed + _running_depth(brackets) <= limit


def parse_json_object(raw: bytes, where: str = "request body") -> dict[str, Any]:
    """The JSON object in ``raw`` (empty → ``{}``), or :class:`HTTPError` naming the problem.

    400: not JSON, or nested deeper than :data:`MAX_JSON_DEPTH`; 422: JSON but not an object.
    The depth is checked on the bytes before parsing (:func:`nesting_over`), or, for a long text
    of few values (a conversation's prose: the byte scan's slowest kind of text), on what orjson
    parsed (:func:`parsed_nesting_over`; orjson itself refuses past 1024 levels).
    """
    if not raw.strip():
        return {}
    if len(raw) >= _PARSED_CHECK_FROM and _few_values(raw):
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            # Past the limit is named by its depth, valid JSON or not (as the scan first would).
            depth = nesting_over(raw, MAX_JSON_DEPTH)
            if depth is not None:
                raise _too_deep(where, depth) from None
            raise HTTPError(400, f"{where} is not valid JSON: {exc}") from exc
        depth = parsed_nesting_over(data, raw, MAX_JSON_DEPTH)
        if depth is not None:
            raise _too_deep(where, depth)
    else:
        # A text no longer than the limit cannot nest deeper (the check's first step, without a call).
        depth = nesting_over(raw, MAX_JSON_DEPTH) if len(raw) > MAX_JSON_DEPTH else None
        if depth is not None:
            raise _too_deep(where, depth)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise HTTPError(400, f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise HTTPError(
            422,
            f"{where} must be a JSON object, got {_json_type(data)}",
            detail=[{"field": "body", "message": f"expected an object, got {_json_type(data)}"}],
        )
    return data


def _too_deep(where: str, depth: int) -> HTTPError:
    return HTTPError(400, f"{where} nests {depth} levels deep; at most {MAX_JSON_DEPTH} levels are accepted")


def _few_values(raw: bytes) -> bool:
    """Whether a long JSON text holds few values for its length (prose, not arrays of token IDs
    or log-probabilities), judged from the commas of every 61st byte. Only the cost depends on
    it: both depth checks are exact."""
    return raw[::_SAMPLE_STEP].count(b",") * _SAMPLE_STEP * _BYTES_PER_VALUE < len(raw)


def parsed_nesting_over(data: Any, raw: bytes, limit: int) -> int | None:
    """What :func:`nesting_over` says of ``raw``, for ``data`` parsed from it: the depth checked
    in one serialization at C speed, whose cost grows with the values rather than the bytes.

    ``orjson.dumps`` writes at most :func:`orjson_depth_cap` levels and refuses a deeper value,
    so ``data`` wrapped in ``cap - limit`` arrays is written exactly when ``data`` nests at most
    ``limit`` levels. A refusal (too deep, or a value orjson cannot write for another reason) is
    settled by the byte scan, which also names the depth.
    """
    cap = orjson_depth_cap()
    if cap is None or cap <= limit:
        return nesting_over(raw, limit)
    wrapped = data
    for _ in range(cap - limit):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError:
        return nesting_over(raw, limit)
    return None


@functools.cache
def orjson_depth_cap() -> int | None:
    """The most levels of arrays ``orjson.dumps`` writes (found once by trying, so a release that
    changes it is followed), or None when it writes :data:`_CAP_PROBE_MAX` levels or more."""

    def writes(levels: int) -> bool:
        value: Any = None
        for _ in range(levels):
            value = [value]
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:
            return False
        return True

    if writes(_CAP_PROBE_MAX):
        return None
    low, high = 0, _CAP_PROBE_MAX  # writes(low) and not writes(high)
    while high - low > 1:
        middle = (low + high) // 2
        if writes(middle):
            low = middle
        else:
            high = middle
    return low


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _body_headers(scope: Scope) -> tuple[int | None, bool]:
    """The declared ``Content-Length`` (None: none, or not a number) and whether a body is expected,
    in one pass over the headers."""
    expects: bool | None = None
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            text = value.strip()
            # The first Content-Length settles both (a Transfer-Encoding before it already did).
            return (int(text) if text.isdigit() else None), (
                expects if expects is not None else text not in (b"0", b"")
            )
        if name == b"transfer-encoding" and expects is None:
            expects = True
    return None, bool(expects)


def json_error_answer(
    message: str, server: str, close: bool = False, **extra: Any
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of a JSON error answer ``{"error", "server", ...}``, secrets hidden."""
    body = redact_bytes(orjson.dumps({"error": message, "server": server, **extra}))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    return headers, body


async def send_json_error(
    send: Send, status: int, message: str, server: str, close: bool = False, **extra: Any
) -> None:
    """Send a complete JSON error answer ``{"error", "server", ...}`` straight over ASGI."""
    headers, body = json_error_answer(message, server, close, **extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def read_guarded_body(
    receive: Receive, limit: int, body_timeout_s: float, loop: asyncio.AbstractEventLoop
) -> bytes | None:
    """The whole request body read from ``receive``, or None when the caller hung up first.

    :class:`RequestGuard`'s rules for a body still arriving, for a caller that reads it whole:
    past ``limit`` bytes :class:`BodyTooLarge` (413), not complete ``body_timeout_s`` from now
    :class:`BodyTimeout` (408).
    """
    chunks: list[bytes] = []
    received = 0
    try:
        async with asyncio.timeout_at(loop.time() + body_timeout_s):  # one timer for the whole body
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return None
                body = message.get("body", b"")
                received += len(body)
                if received > limit:
                    raise BodyTooLarge(413, f"request body exceeds the limit of {limit} bytes")
                chunks.append(body)
                if not message.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except TimeoutError:
        raise BodyTimeout(408, f"request body not received within {body_timeout_s:g}s") from None


class RequestGuard:
    """ASGI middleware: body size counted while reading (413), body deadline (408), JSON 500s.

    ``path_limits`` gives some paths their own limit (``/aggregate_metrics`` spools its body to
    disk, so it may take far more than a body parsed in memory), ``path_body_timeouts`` their
    own body deadline (a million rows take longer to upload than one request body).
    """

    def __init__(
        self,
        app: ASGIApp,
        server_name: str,
        max_body_bytes: int,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        path_limits: Mapping[str, int] | None = None,
        path_body_timeouts: Mapping[str, float] | None = None,
    ) -> None:
        self.app = app
        self.server_name = server_name
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.path_limits = dict(path_limits or {})
        self.path_body_timeouts = dict(path_body_timeouts or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path_limits = self.path_limits
        limit = (
            path_limits.get(scope.get("path", ""), self.max_body_bytes)
            if path_limits
            else self.max_body_bytes
        )
        declared, expects_body = _body_headers(scope)
        if declared is not None and declared > limit:
            await send_json_error(
                send,
                413,
                f"request body of {declared} bytes exceeds the limit of {limit} bytes",
                self.server_name,
                close=True,
            )
            return

        # No body, or a body of a declared length (within the limit) the server already holds
        # whole: nothing is left to arrive, so the app reads it without a size count or a
        # deadline, and an early answer needs no ``connection: close`` (the parser has framed
        # the whole body: none of it can be taken for the next request). The usual hop.
        held_whole = not expects_body or (declared is not None and _body_buffered(receive))
        body_done = held_whole
        if not held_whole:
            body_timeout_s = self.path_body_timeouts.get(scope.get("path", ""), self.body_timeout_s)
            loop = running_loop(scope)
            deadline = loop.time() + body_timeout_s
        received = 0
        started = complete = False

        async def guarded_receive() -> Message:
            nonlocal body_done, received
            if body_done:
                return await receive()
            if _body_buffered(receive):
                message = await receive()  # the whole body is here: nothing to wait for
            else:
                remaining = deadline - loop.time()
                try:
                    if remaining <= 0:
                        raise TimeoutError
                    async with asyncio.timeout(remaining):
                        message = await receive()
                except TimeoutError:
                    raise BodyTimeout(408, f"request body not received within {body_timeout_s:g}s") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(413, f"request body exceeds the limit of {limit} bytes")
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        held: list[Message] = []
        held_body: list[bytes] = []

        async def guarded_send(message: Message) -> None:
            nonlocal started, complete
            if message["type"] == "http.response.start":
                started = True
                if not body_done:
                    # Answered before the body was read (413, 408, an early error): the rest of
                    # the body must not be taken for the next request on this connection.
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
                if message["status"] >= 400:
                    held.append(message)  # an error text may quote a secret: hidden before it leaves
                    return
            elif message["type"] == "http.response.body":
                last = not message.get("more_body", False)
                complete = complete or last
                if held:
                    held_body.append(message.get("body", b""))
                    if last:
                        await _send_redacted(send, held[0], b"".join(held_body), self.server_name)
                    return
            await send(message)

        try:
            await self.app(scope, receive if held_whole else guarded_receive, guarded_send)
        except HTTPError as exc:
            if started:
                raise
            await send_json_error(
                send, exc.status_code, exc.message, self.server_name, close=True, **exc.extra
            )
        except Exception as exc:
            if complete:
                # The answer is out; re-raising would make uvicorn drop a healthy keep-alive connection.
                logger.exception(
                    "%s: error after answering %s %s",
                    self.server_name,
                    scope.get("method"),
                    scope.get("path"),
                )
                return
            if started:
                raise
            logger.exception("%s: %s %s failed", self.server_name, scope.get("method"), scope.get("path"))
            await send_json_error(send, 500, f"{type(exc).__name__}: {exc}", self.server_name)


def _body_buffered(receive: Receive) -> bool:
    """Whether uvicorn already holds the request's whole body, so ``receive()`` returns at once.

    The body deadline then needs no timer (most hop bodies arrive with their headers). Reads
    uvicorn's request cycle (``receive`` is its bound method); anything else is "not buffered".
    """
    cycle = getattr(receive, "__self__", None)
    event = getattr(cycle, "message_event", None)
    return getattr(cycle, "more_body", True) is False and event is not None and event.is_set()


async def _send_redacted(send: Send, start: Message, raw: bytes, server_name: str) -> None:
    headers, hidden = redacted_answer(start["status"], start.get("headers", []), raw, server_name)
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": hidden, "more_body": False})


def redacted_answer(
    status: int, headers: list[tuple[bytes, bytes]], raw: bytes, server_name: str
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """An error answer's headers and body with secrets hidden, a plain-text one made JSON naming
    the server (every error a client gets from us is JSON; a 499 is left as it is)."""
    hidden = redact_bytes(raw)
    kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    if not kind.split(b";", 1)[0].strip().endswith(b"json") and status != 499:
        # An error in plain text (a mounted app's, a library's own answer).
        text = hidden.decode("utf-8", "replace")[:2000] or f"HTTP {status}"
        hidden = orjson.dumps({"error": text, "server": server_name})
        headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
        headers.append((b"content-type", b"application/json"))
    if hidden is not raw:
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(hidden)).encode()))
    return headers, hidden


def header_timeout_protocol(base: type[asyncio.Protocol], header_timeout_s: float) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol ``base`` that closes connections whose headers are late.

    The clock starts when the connection opens, and again at the first byte of each following
    request; it stops when the request's headers are complete (uvicorn then starts a request
    cycle). Idle kept-alive connections stay under uvicorn's own keep-alive timeout.
    """

    class HeaderTimeoutProtocol(base):  # type: ignore[valid-type, misc]
        # When the connection started waiting for a request's headers (loop time), None while a
        # request is being served or the connection idles between requests. One timer per
        # connection checks it (not one armed and cancelled per request: that was a fixed cost
        # of every hop).
        _ng_waiting_since: float | None = None
        _ng_header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._ng_waiting_since = self.loop.time()
            self._ng_header_timer = self.loop.call_later(header_timeout_s, self._ng_check)

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            if self._ng_waiting_since is None and (before is None or before.response_complete):
                self._ng_waiting_since = self.loop.time()
            super().data_received(data)
            if self.cycle is not before or self._ng_upgraded():
                self._ng_waiting_since = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._ng_header_timer is not None:
                self._ng_header_timer.cancel()
                self._ng_header_timer = None
            super().connection_lost(exc)

        def _ng_upgraded(self) -> bool:
            """Whether the connection now speaks another protocol (a WebSocket upgrade hands the
            transport to uvicorn's WebSocket protocol without a request cycle): no HTTP answer
            may be written on it any more, and the header clock stops for good."""
            transport = getattr(self, "transport", None)
            return transport is not None and transport.get_protocol() is not self

        def _ng_check(self) -> None:
            self._ng_header_timer = None
            if self.transport.is_closing() or self._ng_upgraded():
                return
            since = self._ng_waiting_since
            now = self.loop.time()
            if since is not None and now - since >= header_timeout_s:
                self._ng_headers_late()
                return
            wait = header_timeout_s if since is None else since + header_timeout_s - now
            self._ng_header_timer = self.loop.call_later(wait, self._ng_check)

        def _ng_headers_late(self) -> None:
            self.transport.write(headers_late_answer(header_timeout_s))
            self.transport.close()

    HeaderTimeoutProtocol.__name__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeoutProtocol
