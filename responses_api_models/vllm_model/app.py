"""vllm_model: the Responses API in front of one or more vLLM OpenAI-compatible servers.

Each ``POST /v1/responses`` is converted to a Chat Completions request (:mod:`nemo_gym.models.conversion`),
sent to one backend replica, and the completion converted back. ``POST /v1/chat/completions``
is passed through to the same replica.

Replica choice: every call of one rollout goes to the same replica, so that the replica's
prefix cache holds the rollout's history. The key is the rollout id (the ``/ng-rollout/<id>``
prefix nemo_gym's client puts on every call of a rollout), else the session cookie. The replica
is ``crc32(key) % number_of_replicas``: a stable hash needs no memory and survives restarts of
this server; the cost is that changing the replica list re-maps running rollouts. A replica
that cannot be reached after the connection retries is skipped for that call (the next one in
the list is tried), because a finished rollout on another replica beats a failed one.

A backend answer 429 or 5xx is retried on the same replica up to ``max_retries`` times, after
a wait that doubles from 0.1 s with jitter (x0.5-1.5), or the ``Retry-After`` the backend asked
for, each wait capped at ``max_retry_delay_s``, all within ``request_timeout_s``.

Token IDs for RL (``return_token_id_information: true``): the backend is asked for logprobs and
token IDs, and the last output item of every response carries ``prompt_token_ids``,
``generation_token_ids`` and ``generation_log_probs``. Token-ID fields on input items (from
earlier calls) ride on the assistant messages sent to the backend, where a backend with the
splice installed (``local_vllm_model``, the CPU engine ``local_hf_model``) uses them.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import AsyncIterator
from typing import Any

from pydantic import Field, field_validator, model_validator
from starlette.responses import Response

from nemo_gym.base_responses_api_agent import chat_completion_problem, status_failure_class
from nemo_gym.base_responses_api_model import (
    BaseResponsesAPIModelConfig,
    ChatBridge,
    ChatCompletionAccumulator,
    EventStreamResponse,
    HTTPError,
    MediaLimitError,
    MediaLimits,
    ResponsesEventStream,
    ServerRef,
    SimpleResponsesAPIModel,
    SSEParser,
    TokenIdMemory,
    UpstreamError,
    UpstreamHTTP,
    UpstreamResponse,
    check_chat_media,
    error_message,
    is_context_length_error,
    relay_events,
    sse_bytes,
    stream_chat_completion,
    stream_responses,
    without_stream,
)
from nemo_gym.failure_classes import BAD_UPSTREAM_BODY, TIMEOUT, UNREACHABLE, UPSTREAM_ERROR

logger = logging.getLogger(__name__)

_TOKEN_ID_PREFIX = "token_id:"
# A backend that is overloaded (429) or failing (5xx) may answer the same request later; any
# other 4xx (a prompt too long, a bad parameter) would be refused again, so it is not retried.
RETRY_STATUSES = frozenset({429, *range(500, 600)})


def generation_ids_from_logprobs(completion: dict[str, Any]) -> list[int] | None:
    """Generated token IDs read from ``token_id:<id>`` logprob entries (vLLM before ``return_token_ids``)."""
    choices = completion.get("choices") or [{}]
    entries = (choices[0].get("logprobs") or {}).get("content")
    if entries is None:
        return None
    ids = []
    for entry in entries:
        token = str(entry.get("token", ""))
        if not token.startswith(_TOKEN_ID_PREFIX):
            return None
        ids.append(int(token[len(_TOKEN_ID_PREFIX) :]))
    return ids


class VLLMModelConfig(BaseResponsesAPIModelConfig):
    """Config of ``vllm_model`` (see README.md for every field)."""

    base_url: str | list[str] | None = None
    backend_server: ServerRef | None = None
    api_key: str | None = None
    model: str | None = None
    return_token_id_information: bool = False
    uses_reasoning_parser: bool = False
    replace_developer_role_with_system: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] | None = None
    default_headers: dict[str, str] | None = None
    request_timeout_s: float = 1800.0
    connect_timeout_s: float = 10.0
    connect_retries: int = 3
    max_retries: int = Field(default=3, ge=0)
    max_retry_delay_s: float = Field(default=30.0, gt=0)
    max_connections: int | None = None
    # Most image / video / file parts one prompt may carry, as vLLM's limit_mm_per_prompt
    # ({image: 4, video: 1}); a prompt over it is answered 400 before the backend sees it.
    limit_mm_per_prompt: dict[str, int] | None = None

    @field_validator("limit_mm_per_prompt")
    @classmethod
    def _check_media_limits(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        MediaLimits(value)  # names an unknown kind
        if value and any(n < 0 for n in value.values()):
            raise ValueError(f"limit_mm_per_prompt values must be >= 0, got {value}")
        return value

    @field_validator("base_url")
    @classmethod
    def _check_urls(cls, value: str | list[str] | None) -> str | list[str] | None:
        urls = [value] if isinstance(value, str) else (value or [])
        if isinstance(value, list) and not value:
            raise ValueError("base_url is an empty list; give at least one http(s)://host:port/v1 URL")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"base_url entry {url!r} must start with http:// or https://")
        return value

    @model_validator(mode="after")
    def _check(self) -> VLLMModelConfig:
        if (self.base_url is None) == (self.backend_server is None):
            raise ValueError(
                "give exactly one of base_url (URL or list of URLs of vLLM servers, ending in /v1) "
                "and backend_server ({type: responses_api_models, name: <engine instance>})"
            )
        if self.return_token_id_information:
            check_on_policy_settings(self.extra_body or {}, "extra_body")
        return self

    def replica_urls(self) -> list[str]:
        """The configured base URLs without trailing slashes ([] when ``backend_server`` is used)."""
        if self.base_url is None:
            return []
        urls = [self.base_url] if isinstance(self.base_url, str) else self.base_url
        return [url.rstrip("/") for url in urls]


def check_on_policy_settings(settings: dict[str, Any], where: str) -> None:
    """Refuse sampling settings that make sampled tokens differ from the policy's distribution.

    Trainers compute the policy's logprobs of the sampled tokens; ``top_k`` truncation, stop
    strings (which cut text mid-token) and several samples per call break that correspondence.
    """
    top_k = settings.get("top_k")
    if top_k is not None and top_k not in (-1, 0):
        raise ValueError(
            f"{where}.top_k={top_k!r} breaks on-policy training with return_token_id_information: true "
            "(sampled tokens would come from a truncated distribution); remove it or set it to -1"
        )
    if settings.get("stop"):
        raise ValueError(
            f"{where}.stop={settings['stop']!r}: stop strings break on-policy training with "
            "return_token_id_information: true (text is cut inside tokens); remove them"
        )
    n = settings.get("n")
    if n is not None and n != 1:
        raise ValueError(
            f"{where}.n={n!r}: more than one sample per call breaks on-policy training with "
            "return_token_id_information: true; use num_repeats in the collector instead"
        )


class VLLMModel(SimpleResponsesAPIModel):
    """Responses API → Chat Completions on vLLM replicas, and back."""

    config: VLLMModelConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = self.config
        self.bridge = ChatBridge(
            model=config.model,
            return_token_id_information=config.return_token_id_information,
            uses_reasoning_parser=config.uses_reasoning_parser,
            replace_developer_role_with_system=config.replace_developer_role_with_system,
            chat_template_kwargs=config.chat_template_kwargs,
            extra_body=dict(config.extra_body or {}),
            limit_mm_per_prompt=config.limit_mm_per_prompt,
        )
        # Token IDs of this server's answers, put back for clients that drop them (Codex, OpenCode).
        self.token_memory = TokenIdMemory()
        headers = dict(config.default_headers or {})
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self.http = UpstreamHTTP(
            headers=headers,
            request_timeout_s=config.request_timeout_s,
            connect_timeout_s=config.connect_timeout_s,
            connect_retries=config.connect_retries,
            retry_statuses=RETRY_STATUSES,
            max_status_retries=config.max_retries,
            max_retry_delay_s=config.max_retry_delay_s,
            max_connections=config.max_connections,
        )

    async def on_shutdown(self) -> None:
        """Close the backend connections."""
        await self.http.close()

    # ---- routes --------------------------------------------------------------------------
    def restored(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the token-ID fields a client dropped put back on its echoed items."""
        if not self.config.return_token_id_information or not isinstance(body.get("input"), list):
            return body
        return {**body, "input": self.token_memory.restore(self.memory_scope(), body["input"])}

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer a Responses create request through the rollout's backend replica."""
        response = await self._responses(self.restored(body))
        if self.config.return_token_id_information:
            self.token_memory.remember(self.memory_scope(), response)
        return response

    async def _responses(self, body: dict[str, Any]) -> dict[str, Any]:
        chat_request = self.bridge.chat_request(body)
        answer, base = await self.post_backend("/chat/completions", chat_request)
        if not answer.ok:
            message = error_message(answer)
            if is_context_length_error(answer.status, message):
                return self.bridge.context_exceeded_response(body, message)
            raise backend_http_error(answer, base, message)
        completion = parse_completion(answer, base)
        if self.config.return_token_id_information:
            await self.fill_missing_token_ids(completion, chat_request, base)
        return self.bridge.response(completion, body)

    def _chat_passthrough_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """A Chat Completions body to pass on: its media within ``limit_mm_per_prompt`` (else a
        400 naming the part), and the configured model where the body names none."""
        try:
            check_chat_media(body.get("messages"), self.config.limit_mm_per_prompt)
        except MediaLimitError as exc:
            raise HTTPError(400, str(exc)) from exc
        request = dict(body)
        if self.config.model and not request.get("model"):
            request["model"] = self.config.model
        if self.config.return_token_id_information:
            # A client that does not ask (OpenCode) still gets each call's token IDs, and the
            # ones it dropped from the history are put back so that the engine splices.
            request.setdefault("return_token_ids", True)
            request["logprobs"] = True
            if isinstance(request.get("messages"), list):
                request["messages"] = self.token_memory.restore_chat(self.memory_scope(), request["messages"])
        return request

    def memory_scope(self) -> str:
        """The conversation a Chat call belongs to (as the dialect routes scope theirs)."""
        return f"rollout:{self.rollout_id}" if self.rollout_id else "server"

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """Pass a Chat Completions request through to the rollout's backend replica."""
        request = self._chat_passthrough_request(body)
        answer, base = await self.post_backend("/chat/completions", request)
        if not answer.ok:
            raise backend_http_error(answer, base, error_message(answer), keep_status=True)
        completion = parse_completion(answer, base)
        if self.config.return_token_id_information:
            self.token_memory.remember_chat(self.memory_scope(), completion)
        return completion

    async def chat_completions_stream(self, body: dict[str, Any]) -> Response:
        """The backend's chat completion chunks, passed on as they arrive (token IDs and logprobs
        where the backend puts them: vLLM sends them on each chunk)."""
        request = self._chat_passthrough_request(body)
        answer, base = await self.post_backend("/chat/completions", request, stream=True)
        if not answer.ok:
            raise backend_http_error(answer, base, error_message(answer), keep_status=True)
        if not answer.is_event_stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return stream_chat_completion(parse_completion(await _read(answer, base), base), include_usage)
        events = relay_events(answer, responses_api=False)
        if self.config.return_token_id_information:
            events = self._remembered(events, self.memory_scope())
        return EventStreamResponse(events, answer.close)

    async def _remembered(self, events: AsyncIterator[bytes], scope: str) -> AsyncIterator[bytes]:
        """Relayed chunks, folded on the way so the call's token IDs are remembered at the end."""
        folded = ChatCompletionAccumulator()
        parser = SSEParser()
        async for event in events:
            yield event
            for parsed in parser.feed(event):
                if parsed.data.strip() != "[DONE]":
                    try:
                        chunk = parsed.json()
                    except ValueError:
                        continue
                    if isinstance(chunk, dict) and "choices" in chunk:
                        folded.add(chunk)
        self.token_memory.remember_chat(scope, folded.completion())

    async def responses_stream(self, body: dict[str, Any]) -> Response:
        """Responses events sent as the backend's chunks arrive; the last event carries the
        response converted from the whole completion (token IDs and logprobs included)."""
        params = self.restored(without_stream(body))
        chat_request = self.bridge.chat_request(params)
        chat_request.update(stream=True, stream_options={"include_usage": True})
        answer, base = await self.post_backend("/chat/completions", chat_request, stream=True)
        if not answer.ok:
            message = error_message(answer)
            if is_context_length_error(answer.status, message):
                return stream_responses(self.bridge.context_exceeded_response(params, message))
            raise backend_http_error(answer, base, message)
        if not answer.is_event_stream:
            completion = parse_completion(await _read(answer, base), base)
            if self.config.return_token_id_information:
                await self.fill_missing_token_ids(completion, chat_request, base)
            return stream_responses(self.bridge.response(completion, params))
        events = ResponsesEventStream(params, model=self.bridge.model or str(params.get("model") or ""))
        return EventStreamResponse(
            self._response_events(answer, base, chat_request, params, events), answer.close
        )

    async def _response_events(
        self,
        answer: UpstreamResponse,
        base: str,
        chat_request: dict[str, Any],
        params: dict[str, Any],
        events: ResponsesEventStream,
    ) -> AsyncIterator[bytes]:
        yield b"".join(sse_bytes(event, named=True) for event in events.start())
        scope = self.memory_scope()
        folded = ChatCompletionAccumulator()
        parser = SSEParser()
        try:
            async for data in answer.chunks():
                out = []
                for event in parser.feed(data):
                    if event.data.strip() == "[DONE]":
                        continue
                    chunk = event.json()
                    if not isinstance(chunk, dict) or ("error" in chunk and "choices" not in chunk):
                        raise HTTPError(
                            502,
                            f"backend {base} stream failed: {event.data[:500]}",
                            failure_class=BAD_UPSTREAM_BODY,
                        )
                    folded.add(chunk)
                    out += events.feed(chunk)
                if out:
                    yield b"".join(sse_bytes(event, named=True) for event in out)
            completion = folded.completion()
            problem = chat_completion_problem(completion)
            if problem is not None:
                raise HTTPError(502, f"backend {base} streamed {problem}", failure_class=BAD_UPSTREAM_BODY)
            if self.config.return_token_id_information:
                await self.fill_missing_token_ids(completion, chat_request, base)
            response = self.bridge.response(completion, params)
            if self.config.return_token_id_information:
                self.token_memory.remember(scope, response)
            closing = events.finish(response)
        except UpstreamError as exc:
            closing = events.fail(f"backend {base} stream failed: {exc}", exc.kind)
        except HTTPError as exc:
            closing = events.fail(exc.message, str(exc.extra.get("failure_class") or UPSTREAM_ERROR))
        except ValueError as exc:  # not JSON, an event too large
            closing = events.fail(f"backend {base} stream is malformed: {exc}", BAD_UPSTREAM_BODY)
        yield b"".join(sse_bytes(event, named=True) for event in closing)

    async def count_input_tokens(self, body: dict[str, Any]) -> int:
        """The prompt's length from the backend's ``/tokenize`` of the converted messages."""
        chat_request = self.bridge.chat_request(body)
        tokenize = {key: chat_request[key] for key in ("model", "messages", "tools", "chat_template_kwargs")
                    if chat_request.get(key) is not None}  # fmt: skip
        tokenize["add_generation_prompt"] = True
        urls = await self.replica_urls()
        key = self.affinity_key()
        base = urls[zlib.crc32(key.encode()) % len(urls) if key else 0]
        root = base[: -len("/v1")] if base.endswith("/v1") else base
        try:
            answer = await self.http.request("POST", root + "/tokenize", tokenize)
        except UpstreamError as exc:
            raise HTTPError(502, f"backend {root}/tokenize failed: {exc}", failure_class=exc.kind) from exc
        if not answer.ok:
            raise backend_http_error(answer, root, error_message(answer))
        count = parse_json(answer, root).get("count")
        if not isinstance(count, int):
            raise HTTPError(
                502, f"backend {root}/tokenize answered without a count", failure_class=BAD_UPSTREAM_BODY
            )
        return count

    # ---- backend -------------------------------------------------------------------------
    async def replica_urls(self) -> list[str]:
        """Base URLs (ending in ``/v1``) of every backend replica."""
        urls = self.config.replica_urls()
        if urls:
            return urls
        assert self.config.backend_server is not None
        resolved = await self.server_client.resolve(self.config.backend_server.name)
        # nemo_gym servers register their root; an external endpoint may register its /v1 URL.
        return [
            url.rstrip("/") if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1"
            for url in resolved
        ]

    def affinity_key(self) -> str | None:
        """The key that pins this call to a replica: the rollout id, else the session id."""
        return self.rollout_id or self.session_id

    async def post_backend(
        self, path: str, body: dict[str, Any], stream: bool = False
    ) -> tuple[UpstreamResponse, str]:
        """POST to the rollout's replica (failing over to the others); the answer and the base URL used.

        With ``stream`` a 2xx answer comes back unread (see :meth:`UpstreamHTTP.open_stream`).
        """
        urls = await self.replica_urls()
        key = self.affinity_key()
        first = zlib.crc32(key.encode()) % len(urls) if key else 0
        order = urls[first:] + urls[:first]
        last_error: UpstreamError | None = None
        for attempt, base in enumerate(order):
            try:
                # The sticky replica gets the full retry budget; failover targets one try each.
                retries = None if attempt == 0 else 0
                send = self.http.open_stream if stream else self.http.request
                return await send("POST", base + path, body, connect_retries=retries), base
            except UpstreamError as exc:
                if exc.kind == TIMEOUT:
                    raise HTTPError(
                        504, f"backend {base} did not answer {path} in time: {exc}", failure_class=TIMEOUT
                    ) from exc
                logger.warning("backend replica %s unreachable, trying the next one: %s", base, exc)
                last_error = exc
        raise HTTPError(
            502, f"no backend replica reachable for {path}: {last_error}", failure_class=UNREACHABLE
        )

    async def fill_missing_token_ids(
        self, completion: dict[str, Any], chat_request: dict[str, Any], base: str
    ) -> None:
        """Complete token IDs for backends without ``return_token_ids`` (vLLM before 0.10.2).

        Generated IDs come from the ``token_id:<id>`` logprob entries; prompt IDs from the
        backend's ``/tokenize`` of the same messages (which does not see a splice, so such
        backends should be upgraded for multi-turn training).
        """
        choices = completion.get("choices") or []
        if not choices:
            return
        if choices[0].get("token_ids") is None:
            ids = generation_ids_from_logprobs(completion)
            if ids is None:
                raise HTTPError(
                    502,
                    f"backend {base} returned neither choices[0].token_ids nor token_id:<id> logprobs; "
                    "is it a vLLM server with --return-tokens-as-token-ids support?",
                )
            choices[0]["token_ids"] = ids
        if completion.get("prompt_token_ids") is None and choices[0].get("prompt_token_ids") is None:
            tokenize = {
                key: chat_request[key]
                for key in ("model", "messages", "tools", "chat_template_kwargs")
                if chat_request.get(key) is not None
            }
            tokenize["add_generation_prompt"] = True
            root = base[: -len("/v1")] if base.endswith("/v1") else base
            try:
                answer = await self.http.request("POST", root + "/tokenize", tokenize)
            except UpstreamError as exc:
                raise HTTPError(502, f"backend {root}/tokenize failed: {exc}") from exc
            if not answer.ok:
                raise backend_http_error(answer, root, error_message(answer))
            completion["prompt_token_ids"] = parse_json(answer, root).get("tokens")


async def _read(answer: UpstreamResponse, base: str) -> UpstreamResponse:
    try:
        await answer.read()
    except UpstreamError as exc:
        raise HTTPError(
            504 if exc.kind == TIMEOUT else 502, f"backend {base}: {exc}", failure_class=exc.kind
        ) from exc
    return answer


def parse_json(answer: UpstreamResponse, base: str) -> dict[str, Any]:
    """The JSON object of a backend answer, or a 502 naming the backend."""
    try:
        value = answer.json()
    except ValueError as exc:
        raise HTTPError(
            502,
            f"backend {base} answered with a body that is not JSON: {answer.text()[:200]}",
            failure_class=BAD_UPSTREAM_BODY,
        ) from exc
    if not isinstance(value, dict):
        raise HTTPError(
            502, f"backend {base} answered with JSON that is not an object", failure_class=BAD_UPSTREAM_BODY
        )
    return value


def parse_completion(answer: UpstreamResponse, base: str) -> dict[str, Any]:
    """The chat completion of a backend's 2xx answer; ``{}``, ``{"error": ...}`` or ``choices``
    of the wrong shape are a 502 ``bad_upstream_body`` (the backend's fault, never a model answer)."""
    completion = parse_json(answer, base)
    problem = chat_completion_problem(completion)
    if problem is not None:
        raise HTTPError(
            502,
            f"backend {base} answered HTTP {answer.status} with {problem}",
            failure_class=BAD_UPSTREAM_BODY,
        )
    return completion


def backend_http_error(
    answer: UpstreamResponse, base: str, message: str, keep_status: bool = False
) -> HTTPError:
    """An ``HTTPError`` for a backend's error answer: 4xx kept (the request was bad), 5xx → 502."""
    status = answer.status if keep_status or 400 <= answer.status < 500 else 502
    failure_class = status_failure_class(answer.status)
    extra = {"failure_class": failure_class} if failure_class is not None else {}
    retried = f" after {answer.attempts} attempts" if answer.attempts > 1 else ""
    return HTTPError(status, f"backend {base} answered HTTP {answer.status}{retried}: {message}", **extra)


if __name__ == "__main__":
    VLLMModel.run_webserver()
