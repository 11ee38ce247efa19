"""HTTP to engines and APIs outside nemo_gym (vLLM servers, OpenAI): one pool per event loop.

nemo_gym's own :class:`~nemo_gym.serving.server_client.ServerClient` calls servers by instance name;
this client calls plain URLs with an upstream's own auth header, and can hand back an answer
before its body is read (a stream of events). The HTTP is :mod:`nemo_gym.serving.transport`'s:
plain ``http://`` URLs (a vLLM server, a local engine) through the lean hop client, ``https://``
through aiohttp, one pool per event loop, a connect deadline and a whole-request deadline.

Retries are bounded and only for failures that can be retried: a connection that could not be
made (or one the peer closed before a byte of answer), and, when configured, answers such as
429 or 503 that say "try again", honouring ``Retry-After``.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from nemo_gym.failure_classes import TIMEOUT, UNREACHABLE, TransportFailureKind
from nemo_gym.serving import hop_client
from nemo_gym.serving.transport import (
    LoopConnections,
    NotConnected,
    RetryPolicy,
    TransportFailure,
    aiohttp_failure,
    hop_client_enabled,
    hop_failure,
    retry_after_seconds,
    send_with_retries,
)

__all__ = [
    "EncodedJSON",
    "UpstreamError",
    "UpstreamHTTP",
    "UpstreamResponse",
    "error_message",
    "retry_after_seconds",
]


@dataclass(frozen=True)
class EncodedJSON:
    """A JSON body already encoded, in pieces sent one after the other as they are (no copy
    joins them on the plain-HTTP path): a long conversation's items encoded on earlier turns."""

    chunks: list[bytes]


class UpstreamError(Exception):
    """A call to an upstream failed without an HTTP answer; ``kind`` is ``unreachable`` or ``timeout``."""

    def __init__(self, kind: TransportFailureKind, url: str, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.kind = kind
        self.url = url


@dataclass
class UpstreamResponse:
    """An upstream's HTTP answer: status, raw body, headers, and how many attempts it took."""

    status: int
    body: bytes
    headers: Mapping[str, str]
    attempts: int = 1
    # An answer opened by :meth:`UpstreamHTTP.open_stream` whose body is still to be read.
    stream: aiohttp.ClientResponse | None = None
    url: str = ""
    # The same, opened through the hop client (a plain-HTTP upstream).
    hop: hop_client.HopResponse | None = None

    @property
    def is_event_stream(self) -> bool:
        """Whether the answer is server-sent events (``text/event-stream``)."""
        headers = {key.lower(): value for key, value in self.headers.items()}
        return headers.get("content-type", "").startswith("text/event-stream")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (all of it at once for an answer already read).

        Raises :class:`UpstreamError` (``timeout`` past the call's deadline, ``unreachable``
        when the connection breaks) mid-body.
        """
        if self.hop is not None:
            try:
                async for chunk in self.hop.chunks():
                    yield chunk
            except hop_client.HopError as exc:
                raise _hop_stream_error(exc, self.url) from exc
            return
        if self.stream is None:
            yield self.body
            return
        try:
            async for chunk in self.stream.content.iter_any():
                yield chunk
        except TimeoutError as exc:
            raise UpstreamError(TIMEOUT, self.url, "the stream did not finish within the deadline") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(UNREACHABLE, self.url, f"the stream broke: {exc}") from exc

    async def read(self) -> bytes:
        """The whole body (of an opened stream too), which then stays in ``body``."""
        if self.stream is not None or self.hop is not None:
            parts = [chunk async for chunk in self.chunks()]
            self.body = b"".join(parts)
            self.close()
        return self.body

    def close(self) -> None:
        """Let go of an opened stream: its connection back to the pool if read to the end, else closed
        (the upstream sees the disconnect and can stop generating)."""
        if self.hop is not None:
            self.hop.close()
            self.hop = None
        if self.stream is not None:
            if self.stream.content.at_eof():
                self.stream.release()
            else:
                self.stream.close()
            self.stream = None

    def json(self) -> Any:
        """The body parsed as JSON (raises ``orjson.JSONDecodeError`` when it is not JSON)."""
        return orjson.loads(self.body)

    def text(self) -> str:
        """The body as text."""
        return self.body.decode(errors="replace")

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300


def _hop_stream_error(exc: hop_client.HopError, url: str) -> UpstreamError:
    if isinstance(exc, hop_client.HopTimeout):
        return UpstreamError(TIMEOUT, url, "the stream did not finish within the deadline")
    return UpstreamError(UNREACHABLE, url, f"the stream broke: {exc}")


class UpstreamHTTP:
    """JSON calls to upstream URLs with deadlines and bounded retries.

    Args:
        headers: sent on every call (auth, default headers).
        request_timeout_s: deadline of one call, retries and waits included.
        connect_timeout_s: deadline of opening one connection.
        connect_retries: extra attempts after a connection failure.
        retry_statuses: HTTP statuses answered with a retry (empty: none).
        max_status_retries: extra attempts after such a status.
        max_retry_delay_s: cap on one wait between attempts (a longer ``Retry-After`` is capped).
        max_connections: connection pool size (default: safely below the open-file limit).
        first_backoff_s: the first wait between attempts (doubled each time, with jitter).
    """

    def __init__(
        self,
        *,
        headers: Mapping[str, str] | None = None,
        request_timeout_s: float = 1800.0,
        connect_timeout_s: float = 10.0,
        connect_retries: int = 3,
        retry_statuses: Collection[int] = (),
        max_status_retries: int = 0,
        max_retry_delay_s: float = 60.0,
        max_connections: int | None = None,
        first_backoff_s: float = 0.1,
    ) -> None:
        self.headers = dict(headers or {})
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.connect_retries = connect_retries
        self.retry_statuses = frozenset(retry_statuses)
        self.max_status_retries = max_status_retries
        self.max_retry_delay_s = max_retry_delay_s
        self.first_backoff_s = first_backoff_s
        self.connections = LoopConnections(max_connections)
        self.max_connections = self.connections.max_connections
        self._hop_targets: dict[str, _HopTarget | None] = {}
        self._use_hop_client = hop_client_enabled()
        # Per-call constants, built once (the settings above are fixed at construction): the
        # retry policy, and the header lines of a call without extra headers, with and without
        # a body.
        self._policy = self._retry_policy(connect_retries)
        # The statuses a first answer is retried for (none when no status is retried): one look.
        self._retried_statuses = self.retry_statuses if max_status_retries > 0 else frozenset()
        self._encoded_headers: tuple[bytes, bytes] | None = None
        try:
            self._encoded_headers = (
                hop_client.encode_headers(self._call_headers(None, False).items()),
                hop_client.encode_headers(self._call_headers(None, True).items()),
            )
        except ValueError:
            pass  # a header with a line break: refused by each call, as before

    def _call_headers(self, extra_headers: Mapping[str, str] | None, has_body: bool) -> dict[str, str]:
        """The headers of one call: the configured ones, the call's own, and a JSON body's type."""
        headers = {**self.headers, **(extra_headers or {})}
        if has_body:
            headers["Content-Type"] = "application/json"
        return headers

    def _policy_for(self, connect_retries: int | None) -> RetryPolicy:
        """The retry policy of a call (``connect_retries``: the call's own count, if it has one)."""
        if connect_retries is None or connect_retries == self.connect_retries:
            return self._policy
        return self._retry_policy(connect_retries)

    def _retry_policy(self, connect_retries: int) -> RetryPolicy:
        return RetryPolicy(
            connect_retries,
            first_backoff_s=self.first_backoff_s,
            max_delay_s=self.max_retry_delay_s,
            retry_statuses=self.retry_statuses,
            max_status_retries=self.max_status_retries,
        )

    def _hop_target(self, url: str) -> _HopTarget | None:
        """``(host, port, path, heads)`` of a plain-HTTP URL, None for one aiohttp takes; ``heads``:
        the request heads built for it (:func:`hop_client.request_head`) by method and body."""
        try:
            return self._hop_targets[url]
        except KeyError:
            pass
        target: _HopTarget | None = None
        parts = urllib.parse.urlsplit(url)
        if self._use_hop_client and parts.scheme == "http" and parts.hostname:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            target = (parts.hostname, parts.port or 80, path, {})
        if len(self._hop_targets) < 4096:  # URLs are a handful of endpoints; never grow unbounded
            self._hop_targets[url] = target
        return target

    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session of the running event loop, created on first use."""
        return self.connections.session()

    async def close(self) -> None:
        """Close the session and connections of the running loop."""
        await self.connections.close()

    def open_stream(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        connect_retries: int | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Coroutine[Any, Any, UpstreamResponse]:
        """As :meth:`request`, but a 2xx answer comes back before its body is read.

        Read it with :meth:`UpstreamResponse.chunks` as it arrives, and call
        :meth:`UpstreamResponse.close` when done (or when giving up). Retries happen only before
        the answer's status is known; the call's deadline covers the whole body.
        """
        return self.request(
            method, url, body, connect_retries=connect_retries, extra_headers=extra_headers, stream=True
        )

    async def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        connect_retries: int | None = None,
        extra_headers: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> UpstreamResponse:
        """Send one JSON request; return the answer (any status) or raise :class:`UpstreamError`.

        ``connect_retries`` overrides the configured count for this call (a caller that fails
        over to another replica wants fewer attempts on the first). ``stream``: as
        :meth:`open_stream` (what it calls).
        """
        data: bytes | list[bytes] | None
        if isinstance(body, EncodedJSON):
            data = body.chunks
        else:
            data = orjson.dumps(body) if body is not None else None
        target = self._hop_targets.get(url, _UNSEEN)
        if target is _UNSEEN:
            target = self._hop_target(url)
        if target is None:
            send = self._aiohttp_attempt(
                method, url, data, self._call_headers(extra_headers, data is not None), stream
            )
            try:
                return await send_with_retries(
                    send, self._policy_for(connect_retries), self.request_timeout_s
                )
            except TransportFailure as failure:
                raise UpstreamError(failure.kind, url, failure.describe()) from (failure.__cause__ or failure)
        host, port, path, heads = target
        if extra_headers or self._encoded_headers is None:
            encoded = hop_client.encode_headers(self._call_headers(extra_headers, data is not None).items())
            head = hop_client.request_head(method, host, port, path, encoded)
        else:
            encoded = self._encoded_headers[data is not None]
            kind = (method, data is not None)
            built = heads.get(kind)
            if built is None:
                built = hop_client.request_head(method, host, port, path, encoded)
                if len(heads) < 16:  # a handful of methods: never grows unbounded
                    heads[kind] = built
            head = built
        # The first try is made here (no retry loop, closure or extra coroutine on a call that
        # needs none); a try to repeat, or an answer whose status is retried, goes on in the loop.
        started = time.monotonic()
        first_failure: NotConnected | None = None
        first_answer: UpstreamResponse | None = None
        try:
            pool = self.connections.pool()
            try:
                resp = await hop_client.request(
                    pool,
                    method,
                    host,
                    port,
                    path,
                    encoded,
                    data,
                    deadline=pool.loop.time() + self.request_timeout_s,
                    connect_timeout_s=self.connect_timeout_s,
                    stream=stream,
                    head=head,
                )
                if stream and 200 <= resp.status < 300:
                    answer = UpstreamResponse(resp.status, b"", _HopHeaders(resp), 1, None, url, resp)
                else:
                    content = await resp.read() if stream else resp.body  # read whole unless a stream
                    answer = UpstreamResponse(resp.status, content, _HopHeaders(resp), 1)
            except hop_client.HopError as exc:
                fault = hop_failure(exc, self.request_timeout_s, retry_unanswered=True)
                if not isinstance(fault, NotConnected):
                    raise fault from exc
                fault.__cause__ = exc  # as raised from the hop's error, for the retry loop
                first_failure = fault
            else:
                if answer.status not in self._retried_statuses:
                    return answer
                first_answer = answer
            send = self._hop_attempt(method, url, target, data, encoded, head, stream)
            return await send_with_retries(
                send,
                self._policy_for(connect_retries),
                self.request_timeout_s,
                started=started,
                first_failure=first_failure,
                first_answer=first_answer,
            )
        except TransportFailure as failure:
            raise UpstreamError(failure.kind, url, failure.describe()) from (failure.__cause__ or failure)

    def _aiohttp_attempt(
        self,
        method: str,
        url: str,
        data: bytes | list[bytes] | None,
        headers: Mapping[str, str],
        stream: bool,
    ) -> Callable[[float, int], Awaitable[UpstreamResponse]]:
        """One try through aiohttp (TLS, proxies, or ``NEMO_GYM_HOP_CLIENT=aiohttp``)."""
        if isinstance(data, list):
            data = b"".join(data)

        async def attempt(remaining: float, attempts: int) -> UpstreamResponse:
            timeout = aiohttp.ClientTimeout(total=remaining, connect=min(self.connect_timeout_s, remaining))
            try:
                resp = await self.session().request(method, url, data=data, headers=headers, timeout=timeout)
                if stream and 200 <= resp.status < 300:
                    return UpstreamResponse(resp.status, b"", dict(resp.headers), attempts, resp, url)
                try:
                    return UpstreamResponse(resp.status, await resp.read(), dict(resp.headers), attempts)
                finally:
                    resp.release()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise aiohttp_failure(exc, self.request_timeout_s) from exc

        return attempt

    def _hop_attempt(
        self,
        method: str,
        url: str,
        target: _HopTarget,
        data: bytes | list[bytes] | None,
        encoded: bytes,
        head: bytes,
        stream: bool,
    ) -> Callable[[float, int], Awaitable[UpstreamResponse]]:
        """One more try through the lean hop client (plain-HTTP upstreams; :meth:`_send` makes the
        first); ``encoded``: the header lines, ``head``: the request's head built from them."""

        async def attempt(remaining: float, attempts: int) -> UpstreamResponse:
            host, port, path, _ = target
            pool = self.connections.pool()
            try:
                resp = await hop_client.request(
                    pool,
                    method,
                    host,
                    port,
                    path,
                    encoded,
                    data,
                    deadline=pool.loop.time() + remaining,
                    connect_timeout_s=self.connect_timeout_s,
                    stream=stream,
                    head=head,
                )
                if stream and 200 <= resp.status < 300:
                    return UpstreamResponse(resp.status, b"", _HopHeaders(resp), attempts, None, url, resp)
                return UpstreamResponse(resp.status, await resp.read(), _HopHeaders(resp), attempts)
            except hop_client.HopError as exc:
                raise hop_failure(exc, self.request_timeout_s, retry_unanswered=True) from exc

        return attempt


# What _hop_targets answers for a URL not seen yet (None there: a URL aiohttp takes).
_UNSEEN: Any = object()

# A plain-HTTP URL as the hop client takes it: host, port, path, and the request heads built for
# it, by (method, whether a body follows).
_HopTarget = tuple[str, int, str, dict[tuple[str, bool], bytes]]


class _HopHeaders(Mapping[str, str]):
    """An answer's headers, decoded on first use (a call that never looks at them never does)."""

    __slots__ = ("_response",)

    def __init__(self, response: hop_client.HopResponse) -> None:
        self._response = response

    def __getitem__(self, name: str) -> str:
        return self._response.headers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._response.headers)

    def __len__(self) -> int:
        return len(self._response.headers)

    def __repr__(self) -> str:
        return repr(self._response.headers)


def error_message(response: UpstreamResponse) -> str:
    """The error text of an upstream answer (OpenAI/vLLM ``{"error": {"message"}}``, ``{"message"}``, or text)."""
    try:
        body = response.json()
    except orjson.JSONDecodeError:
        return response.text()[:2000]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("message"):
            return str(body["message"])
    return response.text()[:2000]
