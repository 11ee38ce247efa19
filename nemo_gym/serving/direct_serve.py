"""A direct route's whole request in one coroutine, on this project's lean HTTP protocol.

Through ASGI a hop (a tool call, a model turn) passes the server gate, the request guard, the
answered-errors stop, the direct-route lookup and the endpoint (and, on a model server, the
OpenAI error shaping): a coroutine frame each, and a wrapper around every message sent. For a
request to one of :class:`~nemo_gym.serving.direct_routes.DirectRoutes`' routes,
:class:`~nemo_gym.serving.http_protocol.HopHttpProtocol` instead asks the app's ``ng_direct``
(a :class:`DirectServer`, built by :class:`~nemo_gym.serving.server_gate.ServerGate` from the
same objects) to :meth:`~DirectServer.serve` it: the access checks, the requests-in-flight count,
the rollout prefix, the body limit and deadline, the endpoint's steps (``answer``: parse,
validate, handler, serialize) and the answer written in one write, in one frame, with an error
answer's secrets hidden and its shape finished (:meth:`DirectServer.shaped_by`) only when there is one.

Every answer is the one the ASGI layers give, byte for byte (``tests/test_direct_routes.py``
compares them): the same refusals, 413/408s with ``connection: close``, JSON 500s naming the
server, the endpoint's classified errors. A caller that hangs up while the handler runs gets
its handler cancelled by the protocol (``connection_lost`` cancels the watched cycle's task),
as :func:`~nemo_gym.serving.disconnect.until_disconnect` does for ASGI routes. An answer that is
not a whole body (an event stream, a background task) is sent through ASGI as before.

The contract with the protocol's request cycle (:class:`~nemo_gym.serving.http_cycle.HopCycle`):
its ``direct`` (what :meth:`DirectServer.find` gave), ``scope``, ``first_values`` (each request
header's first value), ``task``, ``client_gone``,
the body as it arrived (``body_chunks``, ``more_body``), ``receive``/``send``,
``answer_whole`` and ``app_failed``; and its protocol's ``flow`` and ``_ng_watched``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import cookie_parser
from starlette.responses import Response

from nemo_gym.serving.access_guard import AccessGuard
from nemo_gym.serving.answered_errors import AnswerThenRaise
from nemo_gym.serving.error_answers import JSONAnswer
from nemo_gym.serving.memory_release import ReleaseMemoryAfterBurst
from nemo_gym.serving.protocol import ROLLOUT_PREFIX, SESSION_COOKIE, TOKEN_CAPTURE_PATH_SEGMENT
from nemo_gym.serving.request_context import _current_rollout_id
from nemo_gym.serving.request_guard import (
    HTTPError,
    RequestGuard,
    json_error_answer,
    read_guarded_body,
    redacted_answer,
)

logger = logging.getLogger("nemo_gym")

Headers = list[tuple[bytes, bytes]]
# How an error answer's headers and body are finished after its secrets are hidden (OpenAI's shape).
Shape = Callable[[int, Headers, bytes], tuple[Headers, bytes]]
# Answers whose whole body is at hand: written at once (anything else is sent through ASGI).
_WHOLE = frozenset({JSONAnswer, AnswerThenRaise, Response})
_PREFIX_LENGTH = len(ROLLOUT_PREFIX)
# How many request targets a direct server remembers what it found for (a rollout sends the same
# ``/ng-rollout/<id>/...`` path turn after turn); past it the memory starts over.
_FOUND_KEPT = 1024
_UNSEEN: Any = object()


def _nothing() -> None:
    return None


def session_cookie(header: bytes) -> str | None:
    """The session id in a ``Cookie`` header: what starlette's ``cookie_parser`` gives for
    :data:`SESSION_COOKIE`, without its loop for the usual header of that one cookie (a hop's)."""
    text = header.decode("latin-1")
    if ";" in text:
        return cookie_parser(text).get(SESSION_COOKIE)
    name, equals, value = text.partition("=")
    if not equals or name.strip() != SESSION_COOKIE:
        return None  # no name, or another cookie's
    value = value.strip()
    if len(value) >= 2 and value[0] == '"' == value[-1]:
        return cookie_parser(text).get(SESSION_COOKIE)  # quoted: unquoted as it does
    return value


class DirectServer:
    """A server's direct routes served straight from the lean protocol's request cycle.

    ``answers``: ``(method, path) -> answer`` (:attr:`DirectRoutes.answers`); ``access``,
    ``memory`` and ``guard``: the server gate's access guard and memory release and the
    request guard in front of the routes, whose rules (and settings) it applies.
    """

    def __init__(
        self,
        answers: Mapping[tuple[str, str], Callable[..., Any]],
        access: AccessGuard,
        memory: ReleaseMemoryAfterBurst | None,
        guard: RequestGuard,
        shape: Shape | None = None,
    ) -> None:
        self.answers = dict(answers)
        self.access = access
        self.memory = memory
        self.guard = guard
        self.shape = shape
        self._found: dict[tuple[str, str], tuple[Any, str, str | None] | None] = {}

    def shaped_by(self, shape: Shape) -> DirectServer:
        """The same routes with every error answer finished by ``shape`` (after the secrets are
        hidden): what an ASGI layer rewriting error answers outside the gate does."""
        inner = self.shape
        if inner is not None:
            outer = shape

            def shape(status: int, headers: Headers, body: bytes) -> tuple[Headers, bytes]:
                return outer(status, *inner(status, headers, body))

        return DirectServer(self.answers, self.access, self.memory, self.guard, shape)

    def find(self, method: str, path: str) -> tuple[Any, str, str | None] | None:
        """``(answer, route path, rollout id)`` when ``method path`` (a ``/ng-rollout/<id>``
        prefix and its capture segment stripped) is a direct route, else None (remembered per
        ``method path``: the answer depends on nothing else)."""
        key = (method, path)
        found = self._found.get(key, _UNSEEN)
        if found is _UNSEEN:
            found = self._look_up(method, path)
            if len(self._found) >= _FOUND_KEPT:
                self._found.clear()  # many distinct targets: bounded, never grows
            self._found[key] = found
        return found  # type: ignore[no-any-return]

    def _look_up(self, method: str, path: str) -> tuple[Any, str, str | None] | None:
        """What :meth:`find` gives, worked out."""
        if path.startswith(ROLLOUT_PREFIX):
            rollout_id, _, rest = path[_PREFIX_LENGTH:].partition("/")
            capture, _, after = rest.partition("/")
            if capture == TOKEN_CAPTURE_PATH_SEGMENT:
                rest = after
            path = "/" + rest
        else:
            rollout_id = None
        answer = self.answers.get((method, path))
        return None if answer is None else (answer, path, rollout_id)

    async def serve(self, cycle: Any) -> None:
        """Serve the request of ``cycle`` (its ``direct`` set by :meth:`find`) to the end."""
        answer, path, rollout_id = cycle.direct
        scope = cycle.scope
        method = scope["method"]
        protocol = cycle.protocol
        guard = self.guard
        try:
            headers = cycle.first_values
            problem = self.access.problem(method, headers)
            if problem is not None:
                await self._write(cycle, *self.access.refusal(problem), hidden=True)
                return
            memory = self.memory
            if memory is not None:
                memory.enter()
            if rollout_id is not None:
                # Not reset after: this coroutine is its task's whole work, the context its own.
                _current_rollout_id.set(rollout_id)
            try:
                limits = guard.path_limits
                limit = limits.get(path, guard.max_body_bytes) if limits else guard.max_body_bytes
                length = headers.get(b"content-length")
                declared: int | None
                if length is not None and length.isdigit():
                    # Plain digits (the usual header): a length, whose body the reading needs no
                    # more about (whether one is expected matters only without a length).
                    declared, expects_body = int(length), True
                elif length is not None:
                    length = length.strip()
                    declared = int(length) if length.isdigit() else None
                    expects_body = length not in (b"0", b"")
                else:
                    declared, expects_body = None, b"transfer-encoding" in headers
                if declared is not None and declared > limit:
                    await self._error(
                        cycle, 413, f"request body of {declared} bytes exceeds the limit of {limit} bytes"
                    )
                    return
                if cycle.disconnected or protocol._ng_gone.done():
                    return  # the caller hung up before its body was read: nobody to answer
                if (
                    cycle.more_body is False
                    and not cycle.waiting_for_100_continue
                    and (not expects_body or declared is not None)
                ):
                    # The whole body is here (the usual hop): no count, no deadline.
                    raw = b"".join(cycle.body_chunks)  # one chunk: that very object
                    cycle.body_chunks = []
                    cycle.body_size = 0
                    if protocol.flow.read_paused:
                        protocol.flow.resume_reading()
                else:
                    try:
                        timeouts = guard.path_body_timeouts
                        timeout = (
                            timeouts.get(path, guard.body_timeout_s) if timeouts else guard.body_timeout_s
                        )
                        body = await read_guarded_body(cycle.receive, limit, timeout, protocol.loop)
                    except HTTPError as exc:  # too large or too slow
                        await self._error(cycle, exc.status_code, exc.message, **exc.extra)
                        return
                    if body is None:
                        return
                    raw = body
                cookie = headers.get(b"cookie")
                incoming = None if cookie is None else session_cookie(cookie)
                protocol._ng_watched = cycle
                try:
                    response = await answer(raw, incoming, method, path, None, None)
                except asyncio.CancelledError:
                    if not cycle.client_gone:
                        raise
                    cycle.task.uncancel()  # the caller hung up: nobody is left to read an answer
                    return
                finally:
                    if protocol._ng_watched is cycle:
                        protocol._ng_watched = None
                if type(response) in _WHOLE and response.background is None:
                    status = response.status_code
                    body = response.body
                    answer_headers = response.raw_headers
                    if status >= 400:
                        answer_headers, body = self._finish(status, answer_headers, body)
                    if protocol.flow.write_paused and not cycle.disconnected:
                        await protocol.flow.drain()
                    if not cycle.disconnected:
                        cycle.answer_whole(status, answer_headers, body)
                else:
                    await response(scope, cycle.receive, self._finishing_send(cycle.send))
            finally:
                if memory is not None:
                    memory.leave()
        except BaseException as exc:
            await self._failed(cycle, exc, method, path)
        finally:
            cycle.on_response = _nothing

    # ---- the rare paths -----------------------------------------------------------------------
    def _finish(self, status: int, headers: Headers, body: bytes) -> tuple[Headers, bytes]:
        """An error answer's secrets hidden (a plain-text one made JSON), then its shape finished."""
        headers, body = redacted_answer(status, headers, body, self.guard.server_name)
        if self.shape is not None:
            headers, body = self.shape(status, headers, body)
        return headers, body

    async def _error(self, cycle: Any, status: int, message: str, **extra: Any) -> None:
        """The request guard's JSON error, the connection closed (what is left of the body unread)."""
        headers, body = json_error_answer(message, self.guard.server_name, close=True, **extra)
        await self._write(cycle, status, headers, body, hidden=True)

    async def _write(self, cycle: Any, status: int, headers: Headers, body: bytes, hidden: bool) -> None:
        """Write a whole error answer; ``hidden``: its secrets are already hidden."""
        if hidden:
            if self.shape is not None:
                headers, body = self.shape(status, headers, body)
        else:
            headers, body = self._finish(status, headers, body)
        flow = cycle.protocol.flow
        if flow.write_paused and not cycle.disconnected:
            await flow.drain()
        if not cycle.disconnected:
            cycle.answer_whole(status, headers, body)

    def _finishing_send(self, send: Any) -> Callable[[Any], Any]:
        """``send`` with an error answer held until its body is whole, then finished (:meth:`_finish`)."""
        held: list[Any] = []
        held_body: list[bytes] = []

        async def finishing_send(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held.append(message)
                return
            if message["type"] == "http.response.body" and held:
                held_body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    start = held[0]
                    headers, body = self._finish(
                        start["status"], start.get("headers", []), b"".join(held_body)
                    )
                    await send({**start, "headers": headers})
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await send(message)

        return finishing_send

    async def _failed(self, cycle: Any, exc: BaseException, method: str, path: str) -> None:
        """What the request guard and the protocol do with an exception nothing else caught."""
        server = self.guard.server_name
        if isinstance(exc, HTTPError) and not cycle.response_started:
            await self._error(cycle, exc.status_code, exc.message, **exc.extra)
        elif isinstance(exc, Exception) and not isinstance(exc, HTTPError) and cycle.response_complete:
            # The answer is out: the connection stays usable.
            logger.error("%s: error after answering %s %s", server, method, path, exc_info=exc)
        elif isinstance(exc, Exception) and not cycle.response_started:
            logger.error("%s: %s %s failed", server, method, path, exc_info=exc)
            headers, body = json_error_answer(f"{type(exc).__name__}: {exc}", server)
            await self._write(cycle, 500, headers, body, hidden=True)
        else:
            await cycle.app_failed(exc)
