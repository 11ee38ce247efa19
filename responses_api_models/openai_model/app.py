"""openai_model: a passthrough to an OpenAI Responses API endpoint.

``POST /v1/responses`` goes to ``{openai_base_url}/responses`` and ``POST /v1/chat/completions``
to ``{openai_base_url}/chat/completions``, with ``openai_model`` as the model and
``openai_api_key`` as the bearer token. Before sending, input items lose the nemo_gym-only
fields that OpenAI rejects (token-ID fields, ``token_ids_contiguous``).

Only an allow-list of request fields goes upstream (``forward_request_fields``,
``forward_chat_fields``), and of tools only the types in ``forward_tool_types`` (function tools
by default): the operator's key pays for and answers every call, and a dataset row or a harness
program must not reach past the policy model with it (a built-in web search or code
interpreter, ``previous_response_id`` into stored conversations, a ``service_tier``). What is
left out is logged once per field.

Answers 429 and 5xx are retried (bounded, honouring ``Retry-After`` / ``retry-after-ms``, else
exponential backoff with jitter), as are connection failures; ``max_concurrent_requests``
caps calls in flight from this server. ``max_http_attempts`` (NeMo Gym's field) bounds the tries
of a call answered a retried status (default ``max_retries`` + 1).

A call answered as one JSON object goes through ``self._client``, NeMo Gym's client
(``NeMoGymAsyncOpenAI``, looked up in this module when the server is made: what NeMo Gym's tests
replace, and a replacement gets NeMo Gym's keywords only). This package's client is lent the
server's own transport, ``self.http``, which also carries streamed calls and a kept
conversation's input already encoded: one connection pool, so ``max_connections`` caps them all.
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Collection, Coroutine
from typing import Any

import aiohttp
import orjson
from pydantic import Field
from starlette.responses import Response

from nemo_gym.base_responses_api_agent import (
    chat_completion_problem,
    responses_object_problem,
    status_failure_class,
)
from nemo_gym.base_responses_api_model import (
    TOKEN_ID_FIELDS,
    BaseResponsesAPIModelConfig,
    EncodedJSON,
    EventStreamResponse,
    HTTPError,
    KeptConversation,
    SimpleResponsesAPIModel,
    UpstreamError,
    UpstreamHTTP,
    UpstreamResponse,
    current_conversation,
    error_message,
    relay_events,
    stream_chat_completion,
    stream_responses,
)
from nemo_gym.failure_classes import BAD_UPSTREAM_BODY, TIMEOUT
from nemo_gym.openai_utils import NeMoGymAsyncOpenAI, OpenAIEndpointError
from nemo_gym.response_items import output_shape_fine

# This package's client class, bound at import (a test replaces the name NeMoGymAsyncOpenAI).
_OwnClient = NeMoGymAsyncOpenAI

RETRY_STATUSES = (408, 409, 429, 500, 502, 503, 504)
# Fields nemo_gym adds to items for RL; OpenAI answers 400 on unknown item fields.
_NEMO_GYM_ITEM_FIELDS = (*TOKEN_ID_FIELDS, "token_ids_contiguous")
_NEMO_GYM_ITEM_FIELD_SET = frozenset(_NEMO_GYM_ITEM_FIELDS)
# Where a kept conversation holds its input as encoded for the upstream.
_ENCODED_INPUT = "openai_model.encoded_input"
logger = logging.getLogger("nemo_gym")

# What a policy call needs, and nothing that reaches past the model (stored conversations and
# prompts, built-in tools, billing tiers, background jobs).
DEFAULT_RESPONSES_FIELDS = (
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_tool_calls",
    "temperature",
    "top_p",
    "top_logprobs",
    "max_output_tokens",
    "reasoning",
    "text",
    "include",
    "truncation",
    "metadata",
    "stream",
    "stream_options",
    "store",
)
DEFAULT_CHAT_FIELDS = (
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "n",
    "logprobs",
    "top_logprobs",
    "response_format",
    "presence_penalty",
    "frequency_penalty",
    "reasoning_effort",
    "stream",
    "stream_options",
)
DEFAULT_TOOL_TYPES = ("function", "custom")


class OpenAIModelConfig(BaseResponsesAPIModelConfig):
    """Config of ``openai_model`` (see README.md for every field)."""

    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: str | None = None
    openai_model: str | None = None
    openai_default_headers: dict[str, str] | None = None
    max_concurrent_requests: int | None = Field(default=None, gt=0)
    max_retries: int = Field(default=4, ge=0)
    max_http_attempts: int | None = Field(default=None, ge=1)
    max_retry_delay_s: float = Field(default=60.0, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    max_connections: int | None = Field(default=None, gt=0)
    forward_request_fields: list[str] = Field(default_factory=lambda: list(DEFAULT_RESPONSES_FIELDS))
    forward_chat_fields: list[str] = Field(default_factory=lambda: list(DEFAULT_CHAT_FIELDS))
    forward_tool_types: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOL_TYPES))
    # NeMo Gym's field (its litellm_model builds on this config): fields added to every upstream
    # request; the request's own fields win.
    extra_body: dict[str, Any] = Field(default_factory=dict)


class OpenAIModel(SimpleResponsesAPIModel):
    """Forwards Responses and Chat Completions calls to an OpenAI-compatible API."""

    config: OpenAIModelConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = self.config
        headers = dict(config.openai_default_headers or {})
        if config.openai_api_key:
            headers["Authorization"] = f"Bearer {config.openai_api_key}"
        self.base_url = config.openai_base_url.rstrip("/")
        attempts = config.max_http_attempts or config.max_retries + 1
        self.http = UpstreamHTTP(
            headers=headers,
            request_timeout_s=config.request_timeout_s,
            connect_timeout_s=config.connect_timeout_s,
            connect_retries=config.max_retries,
            retry_statuses=RETRY_STATUSES,
            max_status_retries=attempts - 1,
            max_retry_delay_s=config.max_retry_delay_s,
            max_connections=config.max_connections,
        )
        # Looked up by name here (not bound at import) so a test's replacement takes effect; a
        # replacement gets NeMo Gym's keywords only (those NeMo Gym's openai_model passes).
        client_class = NeMoGymAsyncOpenAI
        nemo_gym_keywords: dict[str, Any] = {
            "base_url": self.base_url,
            "api_key": config.openai_api_key or "",
            "default_headers": dict(config.openai_default_headers or {}),
            "max_http_attempts": attempts,
        }
        if isinstance(client_class, type) and issubclass(client_class, _OwnClient):
            self._client = client_class(
                **nemo_gym_keywords,
                max_connection_retries=config.max_retries,
                timeout_s=config.request_timeout_s,
                connect_timeout_s=config.connect_timeout_s,
                retry_statuses=list(RETRY_STATUSES),
                max_retry_delay_s=config.max_retry_delay_s,
                first_backoff_s=self.http.first_backoff_s,
                max_connections=config.max_connections,
            )
            # Its settings are this server's: it sends through self.http (one pool, one cap).
            self._client.use_transport(self.http)
        else:
            self._client = client_class(**nemo_gym_keywords)
        # This class's own client, as built here: its calls are made on self.http directly (what
        # its create_* would do, without the keyword copy and two coroutine frames). A client
        # of another class, or one put in its place later, is called as NeMo Gym's.
        self._own_client = self._client if type(self._client) is _OwnClient else None
        # One semaphore per event loop: a semaphore is bound to the loop that first waits on it.
        self._semaphores: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self._responses_url = self.base_url + "/responses"
        self._chat_url = self.base_url + "/chat/completions"
        self._responses_fields = frozenset(config.forward_request_fields)
        self._chat_fields = frozenset(config.forward_chat_fields)
        self._tool_types = frozenset(config.forward_tool_types)
        self._dropped: set[str] = set()  # what was already logged as left out

    async def on_shutdown(self) -> None:
        """Close the upstream connections."""
        await self.http.close()
        close = getattr(self._client, "aclose", None)
        if close is not None:
            await close()

    def responses(self, body: dict[str, Any]) -> Coroutine[Any, Any, dict[str, Any]]:
        """Forward a Responses create request; the upstream's Response object comes back as is.
        (The forwarding coroutine, to await: no frame of this method's own stays on the stack.)"""
        request, dropped = allowed_request(body, self._responses_fields, self._tool_types)
        if dropped:
            self._log_dropped(dropped, "responses")
        conversation = current_conversation()
        if conversation is not None and "input" in request and request["input"].__class__ is list:
            # A kept conversation: its input was encoded for the upstream on earlier turns.
            return self._forward("/responses", request, _encoded_items(conversation), conversation)
        return self._forward("/responses", _responses_request(request))

    def chat_completions(self, body: dict[str, Any]) -> Coroutine[Any, Any, dict[str, Any]]:
        """Forward a Chat Completions request (the forwarding coroutine, as :meth:`responses`)."""
        return self._forward("/chat/completions", _chat_request(self._allowed(body, "chat")))

    async def responses_stream(self, body: dict[str, Any]) -> Response:
        """The upstream's Responses event stream, passed on event by event as it arrives."""
        request = self._allowed(body, "responses")
        conversation = current_conversation()
        if conversation is not None and request.get("input").__class__ is list:
            return await self._forward_stream("/responses", request, _encoded_items(conversation))
        return await self._forward_stream("/responses", _responses_request(request))

    async def chat_completions_stream(self, body: dict[str, Any]) -> Response:
        """The upstream's chat completion chunks, passed on as they arrive."""
        return await self._forward_stream("/chat/completions", _chat_request(self._allowed(body, "chat")))

    def _allowed(self, body: dict[str, Any], api: str) -> dict[str, Any]:
        """``body`` with only the fields, and the tools, this server forwards upstream."""
        fields = self._responses_fields if api == "responses" else self._chat_fields
        kept, dropped = allowed_request(body, fields, self._tool_types)
        if dropped:
            self._log_dropped(dropped, api)
        return kept

    def _log_dropped(self, dropped: set[str], api: str) -> None:
        """Log each field or tool type left out of an ``api`` request, once per server."""
        for what in dropped - self._dropped:
            self._dropped.add(what)
            logger.warning(
                "%s: not forwarding %s upstream (forward_%s_fields / forward_tool_types in its config)",
                self.name,
                what,
                "request" if api == "responses" else "chat",
            )

    async def _forward(
        self,
        path: str,
        request: dict[str, Any],
        encoded_input: list[bytes] | None = None,
        conversation: KeptConversation | None = None,
    ) -> dict[str, Any]:
        # ``request`` is this call's own dict (built by _responses_request / _chat_request);
        # ``encoded_input``: its input already encoded (``conversation``'s, _encoded_items).
        config = self.config
        if config.extra_body:
            request = {**config.extra_body, **request}
        if config.openai_model:
            request["model"] = config.openai_model
        url = self._responses_url if path == "/responses" else self.base_url + path
        value: Any
        semaphore = None if config.max_concurrent_requests is None else self._in_flight_cap()
        if semaphore is not None:
            await semaphore.acquire()
        try:
            if encoded_input is not None:
                # _with_encoded_input's pieces, made here (the usual call: no frame of its own).
                request["input"] = _INPUT_MARK
                head, _, tail = orjson.dumps(request).partition(b"\x00")
                body = EncodedJSON([head, *encoded_input, tail])
                answer = await self.http.request("POST", url, body)
                if not 200 <= answer.status < 300:
                    self._result(answer, url)  # raises the error the status means
                value = orjson.loads(answer.body)
            elif self._client is self._own_client:
                # What the client's create_* does, on the transport it shares with this server.
                answer = await self.http.request("POST", url, request)
                if answer.status >= 400:
                    self._result(answer, url)  # raises the error the status means
                value = orjson.loads(answer.body) if answer.body else None
            elif path == "/responses":
                value = await self._client.create_response(**request)
            else:
                value = await self._client.create_chat_completion(**request)
        except UpstreamError as exc:
            raise _upstream_failure(url, exc) from exc
        except OpenAIEndpointError as exc:
            if exc.answer is None:
                raise HTTPError(502, f"OpenAI endpoint {url} answered HTTP {exc.status}") from exc
            self._result(exc.answer, url)  # raises the error the status means
            raise
        except orjson.JSONDecodeError as exc:
            raise HTTPError(
                502,
                f"OpenAI endpoint {url} answered with a body that is not JSON",
                failure_class=BAD_UPSTREAM_BODY,
            ) from exc
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            # NeMo Gym's client raises these for a timeout or a connection given up on.
            cause = exc.__cause__
            if isinstance(cause, UpstreamError):
                raise _upstream_failure(url, cause) from exc
            raise
        finally:
            if semaphore is not None:
                semaphore.release()
        if value.__class__ is not dict:
            if not isinstance(value, dict):
                raise HTTPError(
                    502,
                    f"OpenAI endpoint {url} answered with JSON that is not an object",
                    failure_class=BAD_UPSTREAM_BODY,
                )
        elif path == "/responses" and "output" in value:
            output = value["output"]
            if output.__class__ is list and output_shape_fine(output):
                if conversation is not None:
                    conversation.parsed_output = output  # parsed here from the upstream's body
                return value  # the usual answer: what responses_object_problem passes
        return self._checked(path, value, url)

    async def _forward_stream(
        self, path: str, request: dict[str, Any], encoded_input: list[bytes] | None = None
    ) -> Response:
        # Errors before the first event (refusals, retries given up, an unreachable endpoint)
        # are answered as HTTP errors, exactly as without streaming.
        request = {**self.config.extra_body, **request}
        if self.config.openai_model:
            request["model"] = self.config.openai_model
        url = self.base_url + path
        limit = self._in_flight_cap() or _NO_LIMIT
        await limit.acquire()
        try:
            body = request if encoded_input is None else _with_encoded_input(request, encoded_input)
            answer = await self.http.open_stream("POST", url, body)
        except UpstreamError as exc:
            limit.release()
            raise _upstream_failure(url, exc) from exc
        except BaseException:
            limit.release()
            raise
        responses_api = path == "/responses"
        if answer.ok and answer.is_event_stream:

            def cleanup() -> None:
                answer.close()
                limit.release()

            return EventStreamResponse(relay_events(answer, responses_api), cleanup)
        try:
            await answer.read()
        except UpstreamError as exc:
            raise _upstream_failure(url, exc) from exc
        finally:
            limit.release()
        # An upstream that answered one JSON object: checked, then sent as events.
        value = self._checked(path, self._result(answer, url), url)
        if responses_api:
            return stream_responses(value)
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        return stream_chat_completion(value, include_usage)

    def _checked(self, path: str, value: dict[str, Any], url: str) -> dict[str, Any]:
        # A 200 that is not the object asked for ({}, {"error": ...}, "output" a string) is the
        # upstream's fault: a classified 502, never handed on as a model's answer.
        problem = (chat_completion_problem if path == "/chat/completions" else responses_object_problem)(
            value
        )
        if problem is not None:
            raise HTTPError(
                502,
                f"OpenAI endpoint {url} answered HTTP 200 with {problem}",
                failure_class=BAD_UPSTREAM_BODY,
            )
        return value

    def _result(self, answer: UpstreamResponse, url: str) -> dict[str, Any]:
        status = answer.status
        if not 200 <= status < 300:
            # 4xx means the request itself was refused: keep the status so the caller sees why.
            retried = f" after {answer.attempts} attempts" if answer.attempts > 1 else ""
            message = f"OpenAI endpoint {url} answered HTTP {status}{retried}: {error_message(answer)}"
            failure_class = status_failure_class(status)
            status = status if 400 <= status < 500 else 502
            if failure_class is None:
                raise HTTPError(status, message)
            raise HTTPError(status, message, failure_class=failure_class)
        try:
            value = orjson.loads(answer.body)
        except ValueError as exc:
            raise HTTPError(
                502,
                f"OpenAI endpoint {url} answered with a body that is not JSON",
                failure_class=BAD_UPSTREAM_BODY,
            ) from exc
        if value.__class__ is not dict and not isinstance(value, dict):
            raise HTTPError(
                502,
                f"OpenAI endpoint {url} answered with JSON that is not an object",
                failure_class=BAD_UPSTREAM_BODY,
            )
        return value  # type: ignore[no-any-return]

    def _in_flight_cap(self) -> asyncio.Semaphore | None:
        """The running loop's cap on calls in flight (None: ``max_concurrent_requests`` unset)."""
        if self.config.max_concurrent_requests is None:
            return None
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.config.max_concurrent_requests)
        return semaphore


class _NoLimit:
    """A stream's stand-in semaphore when calls are not capped: holds nothing."""

    async def acquire(self) -> bool:
        return True

    def release(self) -> None:
        return None


_NO_LIMIT = _NoLimit()  # holds nothing: one serves every call


def _responses_request(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` (a dict of this call's own, from :meth:`OpenAIModel._allowed`) as it goes upstream."""
    items = request.get("input")
    if (items.__class__ is list or isinstance(items, list)) and not _plain_items(items):
        request["input"] = _stripped(items)
    return request


def _plain_items(items: list[Any]) -> bool:
    """Whether no item holds nemo_gym's fields (checked from C, item by item: no frame per item);
    False also when that cannot be told so (an item that is no object: the items are stripped)."""
    try:
        return all(map(_NEMO_GYM_ITEM_FIELD_SET.isdisjoint, items))
    except TypeError:
        return False


# A NUL byte never appears in orjson's output (it escapes it inside strings): it marks the spot,
# inside the array's brackets (the pieces around it end and start with them: no copy adds them).
_INPUT_MARK = orjson.Fragment(b"[\x00]")


def _with_encoded_input(request: dict[str, Any], chunks: list[bytes]) -> EncodedJSON:
    """The request's JSON in pieces, its input the items' pieces already encoded (the same bytes,
    not copied). ``request`` is the call's own dict: its ``input`` keeps its place, marked."""
    request["input"] = _INPUT_MARK
    head, _, tail = orjson.dumps(request).partition(b"\x00")
    return EncodedJSON([head, *chunks, tail])


class _EncodedInput:
    """A kept conversation's input as encoded for the upstream: the items' JSON in a few pieces
    (the first starts bare, each later one with a comma), and how many items they cover."""

    __slots__ = ("chunks", "items")

    def __init__(self, chunks: list[bytes], items: int) -> None:
        self.chunks = chunks
        self.items = items


_JSON_OF_ENTRY = operator.itemgetter(1)  # of a take_encoded entry: (items after it, their JSON)


def _encoded_items(conversation: KeptConversation) -> list[bytes]:
    """The conversation's items without nemo_gym's fields, encoded once: on its first turn here
    the items are encoded, later the JSON of the items added since (the conversation keeps it
    from its ``extend``) is taken as is, or, where an item holds one of nemo_gym's fields, the
    items are encoded again without them.

    The pieces are merged as they come (a piece at least as long as the one before it joins
    it): a long conversation is a few pieces to write, not one per turn, for copying each byte
    about log2(turns) times over the whole rollout."""
    items = conversation.items
    done: _EncodedInput | None = conversation.derived.get(_ENCODED_INPUT)
    if done is None:
        chunks = [] if not items else [orjson.dumps(items if _plain_items(items) else _stripped(items))[1:-1]]
        conversation.take_encoded()  # covered above; what is added from now on is kept
        conversation.derived[_ENCODED_INPUT] = _EncodedInput(chunks, len(items))
        return chunks
    chunks = done.chunks
    taken = conversation.encoded_since  # take_encoded's, without its frame
    if not taken:
        return chunks
    conversation.encoded_since = []
    # The entries follow each other (each extend's items after the one before; a turn undone
    # drops its own): together they are the JSON of every item added since, one piece.
    end = taken[-1][0]
    added = items[done.items : end]
    try:  # _plain_items's check, without its frame
        plain = all(map(_NEMO_GYM_ITEM_FIELD_SET.isdisjoint, added))
    except TypeError:
        plain = False
    if plain:
        piece = b"".join(map(_JSON_OF_ENTRY, taken))
    else:  # one holds nemo_gym's fields: encoded again without them
        piece = b"," + orjson.dumps(_stripped(added))[1:-1]
    done.items = end
    if not chunks:
        chunks.append(piece[1:])
        return chunks
    size = len(piece)
    while chunks and len(chunks[-1]) <= size:
        piece = chunks.pop() + piece
        size = len(piece)
    chunks.append(piece)
    return chunks


def _chat_request(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` (a dict of this call's own, from :meth:`OpenAIModel._allowed`) as it goes upstream."""
    messages = request.get("messages")
    if isinstance(messages, list) and not _plain_items(messages):
        request["messages"] = _stripped(messages)
    return request


def _stripped(items: list[Any]) -> list[Any]:
    return [strip_nemo_gym_fields(item) for item in items]


def allowed_request(
    body: dict[str, Any], fields: frozenset[str], tool_types: Collection[str]
) -> tuple[dict[str, Any], set[str]]:
    """``(body with only ``fields`` and tools of ``tool_types``, names of what was left out)``."""
    if fields.issuperset(body):
        kept, dropped = body.copy(), set()
    else:
        kept = {key: value for key, value in body.items() if key in fields}
        dropped = {f"field {key!r}" for key in body if key not in fields}
    tools = kept.get("tools")
    if tools.__class__ is not list and not isinstance(tools, list):
        return kept, dropped
    for tool in tools:
        if (
            not (tool.__class__ is dict or isinstance(tool, dict))
            or tool.get("type", "function") not in tool_types
        ):
            break
    else:
        return kept, dropped  # every tool is forwarded
    allowed = [t for t in tools if isinstance(t, dict) and t.get("type", "function") in tool_types]
    dropped |= {
        f"tool type {t.get('type') if isinstance(t, dict) else t!r}" for t in tools if t not in allowed
    }
    kept["tools"] = allowed
    if not allowed:
        kept.pop("tools")
        kept.pop("tool_choice", None)
    return kept, dropped


def _upstream_failure(url: str, exc: UpstreamError) -> HTTPError:
    return HTTPError(
        504 if exc.kind == TIMEOUT else 502, f"OpenAI endpoint {url}: {exc}", failure_class=exc.kind
    )


def strip_nemo_gym_fields(item: Any) -> Any:
    """A copy of an input item (or chat message) without nemo_gym's RL fields."""
    if not isinstance(item, dict) or _NEMO_GYM_ITEM_FIELD_SET.isdisjoint(item):
        return item
    return {key: value for key, value in item.items() if key not in _NEMO_GYM_ITEM_FIELD_SET}


# NeMo Gym's names for this adapter's classes (environments and their tests import them).
SimpleModelServerConfig = OpenAIModelConfig
SimpleModelServer = OpenAIModel


if __name__ == "__main__":
    OpenAIModel.run_webserver()
