"""The model-server contract: an OpenAI Responses API endpoint in front of an engine.

Override :meth:`SimpleResponsesAPIModel.responses` (``POST /v1/responses``) and ``chat_completions``
(``POST /v1/chat/completions``). Bodies are plain dicts shaped as the ``openai`` package's types.

The base speaks the rest of OpenAI's dialect for every model server: ``stream=true`` (the
answer sent as OpenAI's streaming events, see :mod:`nemo_gym.models.streaming`), ``GET /v1/models``,
error bodies shaped as OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (``code`` a
string or null; nemo_gym's own fields such as ``failure_class`` or ``detail`` may follow at the top
level, the server's name is in the ``X-NeMo-Gym-Server`` header), and a 400 naming the field for
a request whose shape is wrong (a message whose ``content`` is a number, no ``input``).

NeMo Gym's model adapters (``responses(self, request, body: NeMoGymResponseCreateParamsNonStreaming)``
returning a ``NeMoGymResponse``) run on the same base: such a class is served by the FastAPI app
of :meth:`SimpleResponsesAPIModel.setup_webserver`, which validates bodies into NeMo Gym's types,
passes the ``Request`` when the method takes one, serves ``stream: true`` and ``/v1/messages``,
and carries NeMo Gym's per-rollout model-call capture (:func:`install_model_call_capture`; records
in :mod:`nemo_gym.models.call_records`). Our own servers (plain-dict bodies) keep the lean path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypedDict

import orjson
from pydantic import BaseModel, Field
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from nemo_gym.models.conversation_store import (
    KEPT_HEADER_LINE,
    NOT_FOUND_CODE,
    ConversationStore,
    KeptConversation,
    reset_current_conversation,
    set_current_conversation,
)
from nemo_gym.models.fastapi_dispatch import (
    as_json,
    call_handler,
    event_stream,
    nemo_gym_handler,
    plain_config,
    validated,
)
from nemo_gym.models.openai_errors import OpenAIErrorBodies
from nemo_gym.models.openai_request_checks import (
    check_chat_request,
    check_responses_request_fully,
    responses_request_fine,
)
from nemo_gym.models.streaming import SSE_KEEPALIVE, stream_chat_completion, stream_responses
from nemo_gym.serving.error_answers import JSONAnswer, dumps
from nemo_gym.serving.process_hooks import LIVENESS_METRICS
from nemo_gym.serving.served_names import served_name
from nemo_gym.serving.server import BaseServer, BaseServerConfig, HTTPError, json_response
from nemo_gym.token_id_capture.handler_calls import call as _call
from nemo_gym.token_id_capture.handler_calls import captured as _captured
from nemo_gym.token_id_capture.model_calls import (
    clear_model_call_captures_for_rollouts,
    install_model_call_capture,
    merge_model_call_capture_into_record,
    model_call_capture_dirs_from_config,
    observability_enabled_from_config,
)
from nemo_gym.token_id_capture.non_generating import NonGeneratingRequest

if TYPE_CHECKING:
    from fastapi import FastAPI, Request


# Also served, loaded on first use: the capture names of _LAZY_NAMES and FastAPI's Body.
__all__ = [
    "BaseResponsesAPIModel",
    "BaseResponsesAPIModelConfig",
    "ModelExecutionOutcome",
    "SimpleResponsesAPIModel",
    "clear_model_call_captures_for_rollouts",
    "install_model_call_capture",
    "merge_model_call_capture_into_record",
    "model_call_capture_dirs_from_config",
    "observability_enabled_from_config",
    "start_model_execution",
]

logger = logging.getLogger(__name__)

# The capture names are loaded on first use (module ``__getattr__`` below): our own model
# servers never capture this way and keep their start-up time.
_LAZY_NAMES = {
    "CaptureStore": ("nemo_gym.models.call_records", "CaptureStore"),
    "ModelCallCaptureConfig": ("nemo_gym.models.call_records", "ModelCallCaptureConfig"),
    "ModelCallRecord": ("nemo_gym.models.call_records", "ModelCallRecord"),
    "aggregate_model_call_metrics": ("nemo_gym.models.call_records", "aggregate_model_call_metrics"),
    "aggregate_model_call_records": ("nemo_gym.models.call_records", "aggregate_model_call_records"),
    "build_model_call_record": ("nemo_gym.models.call_records", "build_model_call_record"),
    "extract_token_stats": ("nemo_gym.models.call_records", "extract_token_stats"),
    "read_available_model_call_records": (
        "nemo_gym.models.call_records",
        "read_available_model_call_records",
    ),
    "read_model_call_records": ("nemo_gym.models.call_records", "read_model_call_records"),
    # NeMo Gym's private names that its adapters and tests import from here.
    "_CaptureMiddleware": ("nemo_gym.token_id_capture.middleware", "TokenCaptureMiddleware"),
    "_reconstruct_streamed_response": ("nemo_gym.models.call_capture", "reconstruct_streamed_response"),
}


class ModelExecutionOutcome(TypedDict):
    """What a model adapter reports about how it produced an answer (stored with the call's record)."""

    upstream_attempted: bool
    response_source: Literal["upstream", "local"] | None
    upstream_status_code: int | None
    local_response_reason: str | None


def start_model_execution(request: Any, *, upstream_attempted: bool) -> ModelExecutionOutcome:
    """Start the execution facts of the request being served; the adapter fills them in as it goes."""
    outcome = ModelExecutionOutcome(
        upstream_attempted=upstream_attempted,
        response_source=None,
        upstream_status_code=None,
        local_response_reason=None,
    )
    from nemo_gym.models.call_capture import EXECUTION_STATE_KEY

    setattr(request.state, EXECUTION_STATE_KEY, outcome)
    return outcome


def _orjson_dispatch_response(content: Any) -> Any:
    """A finished answer as an orjson-encoded JSON response (a ready ``Response`` passes through).

    FastAPI would walk every token ID and log-prob through ``jsonable_encoder`` first.
    """
    if isinstance(content, Response):
        return content
    if isinstance(content, BaseModel):
        content = content.model_dump(mode="json", by_alias=True)
    return Response(content=orjson.dumps(content), media_type="application/json")


class BaseResponsesAPIModelConfig(BaseServerConfig):
    """Config of a model server; adapters subclass it."""

    # Routes of this server that never return generated text (NeMo Gym's training-token capture
    # declares them; read for config compatibility).
    token_id_capture_non_generating_requests: list[NonGeneratingRequest] = Field(default_factory=list)
    # Conversations kept for ``store: true`` requests (see nemo_gym.models.conversation_store).
    kept_conversations_max: int = Field(default=8192, ge=0)
    kept_conversations_max_bytes: int = Field(default=256 * 2**20, ge=0)
    kept_conversations_ttl_s: float = Field(default=1800.0, gt=0)


class SimpleResponsesAPIModel(BaseServer):
    """Base of every model server."""

    server_type: ClassVar[str] = "responses_api_models"
    config: BaseResponsesAPIModelConfig
    # NeMo Gym's: (method, path) of extra routes that never return generated text.
    non_generating_model_routes: ClassVar[frozenset[tuple[str, str]]] = frozenset()
    # Seconds between keep-alive comments of a ``stream: true`` chat answer still being computed.
    chat_keepalive_s: ClassVar[float] = 15.0

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer a Responses API create request with a Responses API response object."""
        raise HTTPError(404, f"{type(self).__name__} does not serve /v1/responses")

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer a Chat Completions request with a chat completion object."""
        raise HTTPError(404, f"{type(self).__name__} does not serve /v1/chat/completions")

    async def count_input_tokens(self, body: dict[str, Any]) -> int:
        """How many tokens the prompt of a Responses create request takes (Anthropic's
        ``/v1/messages/count_tokens``, which Claude Code calls); servers with a tokenizer override it."""
        raise HTTPError(404, f"{type(self).__name__} cannot count tokens: it has no tokenizer")

    def model_ids(self) -> list[str]:
        """The model names ``GET /v1/models`` lists (default: the config's model name, else the server's)."""
        extra = self.config.model_extra or {}
        for field in ("served_model_name", "model_name", "openai_model", "model"):
            value = getattr(self.config, field, None) or extra.get(field)
            if isinstance(value, str) and value:
                return [value]
        return [self.name]

    async def models(self, body: Any) -> dict[str, Any]:
        """``GET /v1/models``: OpenAI's model list."""
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": "nemo_gym"}
            for model in self.model_ids()
        ]
        return {"object": "list", "data": data}

    @property
    def conversations(self) -> ConversationStore:
        """The conversations this server keeps for ``store: true`` requests (created on first use)."""
        found: ConversationStore | None = self.__dict__.get("_ng_conversations")
        if found is None:
            config = self.config
            found = ConversationStore(
                config.kept_conversations_max,
                config.kept_conversations_max_bytes,
                config.kept_conversations_ttl_s,
            )
            object.__setattr__(self, "_ng_conversations", found)
            LIVENESS_METRICS["kept_conversations"] = found.stats
        return found

    def routes(self) -> list[Route]:
        """Liveness (``GET``/``HEAD /``), ``/v1/responses`` (and ``DELETE /v1/responses/{id}``),
        ``/v1/chat/completions``, ``/v1/models``,
        and the Anthropic Messages and Gemini dialects over :meth:`responses`
        (:class:`~nemo_gym.models.dialect_routes.DialectRoutes`)."""
        from nemo_gym.models.dialect_routes import DialectRoutes

        return (
            super().routes()
            + [
                self.route("/v1/responses", self._serve_responses, body_model_of=self.responses),
                Route("/v1/responses/{response_id}", self._delete_response, methods=["DELETE"]),
                self.route(
                    "/v1/chat/completions", self._serve_chat_completions, body_model_of=self.chat_completions
                ),
                self.route("/v1/models", self.models, methods=("GET",)),
            ]
            + DialectRoutes(self).routes()
        )

    def build_app(self) -> ASGIApp:
        """The server's app with every error answer in OpenAI's shape (no route, auth, body limits too),
        and, when the run turns ``token_id_capture`` on, NeMo Gym's training-token capture around it."""
        app: ASGIApp = OpenAIErrorBodies(super().build_app())
        # Our client reads the launched config without building an OmegaConf one (no start-up cost).
        plain = getattr(self.server_client, "plain_global_config", None)
        global_config = (
            plain()
            if callable(plain)
            else plain_config(getattr(self.server_client, "global_config_dict", None))
        )
        block = global_config.get("token_id_capture") if isinstance(global_config, Mapping) else None
        if self.uses_setup_webserver() or not (isinstance(block, dict) and block.get("enabled")):
            return app  # a FastAPI adapter's app installs it itself (install_model_call_capture)
        from nemo_gym.token_id_capture.middleware import TokenCaptureMiddleware, token_capture_components

        return TokenCaptureMiddleware(
            app,
            store=None,
            model_server_name=self.name,
            non_generating_requests={("GET", "/v1/models"), ("GET", "/")},
            **token_capture_components(global_config),
        )

    async def responses_stream(self, body: dict[str, Any]) -> Response:
        """Answer a Responses request that asked for ``stream: true`` with an event stream.

        The default computes the whole answer with :meth:`responses` and sends it as OpenAI's
        events; servers whose engine produces the answer in pieces override this to send events
        as they are produced. Raise ``HTTPError`` before the stream starts for a refused request.
        """
        plain = without_stream(body)
        return stream_responses(await _captured(self.responses, plain, plain))

    async def chat_completions_stream(self, body: dict[str, Any]) -> Response:
        """Answer a Chat Completions request with ``stream: true`` (see :meth:`responses_stream`)."""
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        plain = without_stream(body)
        return stream_chat_completion(await _captured(self.chat_completions, plain, plain), include_usage)

    async def captured_responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """:meth:`responses`, the call's training tokens captured when the call is being captured
        (NeMo Gym's ``token_id_capture``): what every route answering through :meth:`responses` calls."""
        return await _captured(self.responses, body, body)  # type: ignore[no-any-return]

    def _serve_responses(self, body: Any) -> Awaitable[dict[str, Any] | Response]:
        if body.__class__ is not dict or not responses_request_fine(body):  # check_responses_request
            check_responses_request_fully(body)
        previous = body.get("previous_response_id")
        if previous is not None or body.get("store") is True:
            return self._serve_kept(body, previous)
        if body.get("stream") is True:
            return self.responses_stream(body)
        return _call(self.responses, body)  # type: ignore[no-any-return]

    async def _serve_kept(self, body: dict[str, Any], previous: Any) -> dict[str, Any] | Response:
        """A request that continues a kept conversation (``previous_response_id``, ``previous``) or
        asks for its own to be kept (``store: true``): see :mod:`nemo_gym.models.conversation_store`.

        The handler gets the whole input (kept items, then the new ones) and the request's other
        fields unchanged, without ``previous_response_id`` and ``store``: exactly the request the
        full history makes. A streamed answer is not kept.
        """
        if (store := self.__dict__.get("_ng_conversations")) is None:
            store = self.conversations  # made on first use
        rollout = self.rollout_id
        conversation: KeptConversation | None = None
        if previous is not None:
            if previous.__class__ is not str and not isinstance(previous, str):
                raise HTTPError(400, f"previous_response_id must be a string, got {type(previous).__name__}")
            conversation = store.take(rollout, previous)
            if conversation is None:
                raise HTTPError(
                    400,
                    f"previous_response_id {previous!r}: {self.name} keeps no conversation under that id "
                    "(it was never kept with store: true, was deleted, expired or was dropped to stay "
                    "within the server's bounds); send the whole input instead",
                    code=NOT_FOUND_CODE,
                    param="previous_response_id",
                )
        stream = "stream" in body and body["stream"] is True
        keep = not stream and "store" in body and body["store"] is True
        if conversation is None:
            if stream:  # a streamed answer is not kept: served as without ``store``
                return await self.responses_stream(body)
            if not keep:
                return await _captured(self.responses, body, body)  # type: ignore[no-any-return]
            if not store.max_conversations:  # none is kept: none is built (the full history's request)
                request = {k: v for k, v in body.items() if k != "previous_response_id" and k != "store"}
                return await _call(self.responses, request)  # type: ignore[no-any-return]
            conversation = KeptConversation()
        new_items = body["input"]
        if new_items.__class__ is not list and isinstance(new_items, str):
            new_items = [{"role": "user", "content": new_items}]
        mark = (len(conversation.items), conversation.nbytes)
        conversation.extend(new_items)
        request = {**body}
        request.pop("previous_response_id", None)
        request.pop("store", None)
        if previous is not None:
            request["input"] = list(conversation.items)
        conversation.parsed_output = None  # the handler's to set (see KeptConversation)
        token = set_current_conversation(conversation)
        try:
            if stream:
                answer: Any = await self.responses_stream(request)
            else:
                answer = await _call(self.responses, request)
        except BaseException:
            if previous is not None:  # undone: the same continuation may be tried again
                conversation.truncate(*mark)
                store.put(rollout, previous, conversation)
            raise
        finally:
            reset_current_conversation(token)
        if not keep or (answer.__class__ is not dict and not isinstance(answer, dict)):
            return answer  # type: ignore[no-any-return]
        answer_id = answer["id"] if "id" in answer else None
        output = answer["output"] if "output" in answer else None
        if (answer_id.__class__ is not str and not isinstance(answer_id, str)) or (
            output.__class__ is not list and not isinstance(output, list)
        ):
            return answer  # type: ignore[no-any-return]
        # The output's JSON, encoded once: kept with the conversation and put in the answer as is.
        encoded = orjson.dumps(output)
        conversation.extend(output, round_trip=output is not conversation.parsed_output, encoded=encoded)
        conversation.parsed_output = None
        if not store.put(rollout, answer_id, conversation):
            return answer  # type: ignore[no-any-return]
        try:  # json_response's bytes (error_answers.dumps's first try, without its frame)
            response = JSONAnswer(orjson.dumps(whole := {**answer, "output": orjson.Fragment(encoded)}))
        except orjson.JSONEncodeError:
            response = JSONAnswer(dumps(whole))
        response.raw_headers.append(KEPT_HEADER_LINE)
        return response

    async def _delete_response(self, request: Any) -> Response:
        """``DELETE /v1/responses/{id}``: forget the conversation kept under that id."""
        response_id = request.path_params["response_id"]
        if not self.conversations.drop(self.rollout_id, response_id):
            return json_response(
                {
                    "error": f"{self.name} keeps no conversation under response id {response_id!r}",
                    "server": self.name,
                },
                404,
            )
        return json_response({"id": response_id, "object": "response", "deleted": True})

    async def _serve_chat_completions(self, body: Any) -> dict[str, Any] | Response:
        check_chat_request(body)
        if body.get("stream") is True:
            return await self.chat_completions_stream(body)
        return await _call(self.chat_completions, body)

    # ---- NeMo Gym's adapter style: FastAPI, typed bodies, the Request ---------------------
    def nemo_gym_style(self) -> bool:
        """Whether this class's handlers are written NeMo Gym's way: a ``request`` parameter or a
        pydantic body type (``NeMoGymResponseCreateParamsNonStreaming``) instead of a plain dict."""
        return any(nemo_gym_handler(getattr(self, name)) for name in ("responses", "chat_completions"))

    def uses_setup_webserver(self) -> bool:
        """NeMo Gym-style adapters are served by :meth:`setup_webserver`'s FastAPI app."""
        return super().uses_setup_webserver() or self.nemo_gym_style()

    def setup_webserver(self) -> FastAPI:
        """The FastAPI app of a NeMo Gym-style adapter (any other class: the base's).

        Session middleware, model-call capture (:func:`install_model_call_capture`, configured
        from the run's ``observability_enabled`` and ``model_call_capture_dir``) and the routes
        ``/v1/responses``, ``/v1/chat/completions``, ``/v1/messages`` and ``GET /v1/models``.
        """
        if not self.nemo_gym_style():
            return super().setup_webserver()  # type: ignore[no-any-return]
        from fastapi import Body, FastAPI, Request

        from nemo_gym.models.call_records import ModelCallCaptureConfig

        app = FastAPI(title=self.name)
        self.setup_session_middleware(app)
        global_config = getattr(self.server_client, "global_config_dict", None)
        install_model_call_capture(
            app,
            ModelCallCaptureConfig.model_validate(plain_config(global_config) or {}),
            model_server_name=self.config.name,
            global_config_dict=global_config,
            num_workers=self.config.num_workers,
            non_generating_requests=self.non_generating_model_routes
            | {(r.method, r.path) for r in self.config.token_id_capture_non_generating_requests},
        )

        # The route functions are built here, where FastAPI's types exist, and look the
        # dispatch methods up on each call so a subclass's override is the one served.
        async def responses(request: Request, body: dict = Body()) -> Any:  # noqa: B008
            return await self.responses_dispatch(request, body)

        async def chat_completions(request: Request, body: dict = Body()) -> Any:  # noqa: B008
            return await self.chat_completions_dispatch(request, body)

        async def messages(request: Request, body: dict = Body()) -> Any:  # noqa: B008
            return await self.messages(request, body)

        async def models() -> dict[str, Any]:
            return await self.models(None)

        for route in (responses, chat_completions, messages):
            # This module's annotations are strings; FastAPI resolves them from real types.
            route.__annotations__ = {"request": Request, "body": dict, "return": Any}
        app.post("/v1/responses")(responses)
        app.post("/v1/chat/completions")(chat_completions)
        app.post("/v1/messages")(messages)
        app.get("/v1/models")(models)
        return app

    setup_webserver._ng_default_app = True  # type: ignore[attr-defined]

    async def responses_dispatch(self, request: Request, body: dict[str, Any]) -> Any:
        """``POST /v1/responses`` of a NeMo Gym-style adapter.

        The body is validated as ``NeMoGymResponseCreateParamsNonStreaming`` (a 422 naming each
        field otherwise) and handed to :meth:`responses`. ``stream: true``: the body is first
        cleaned of the streaming dialect (:mod:`nemo_gym.responses_streaming`), the answer sent
        as OpenAI's Responses events, and a failure after that point as a ``response.failed`` event.
        """
        from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming

        if not body.get("stream"):
            params = validated(NeMoGymResponseCreateParamsNonStreaming, body)
            response = await self._invoke_responses(request, params)
            answer = _orjson_dispatch_response(response)
            await self._finalize_served_response(response)
            return answer
        from nemo_gym.responses_streaming import sanitize_streaming_responses_body

        cleaned, ns_map = sanitize_streaming_responses_body(body)
        params = validated(NeMoGymResponseCreateParamsNonStreaming, cleaned)
        return await self._stream_responses(request, params, ns_map)

    async def _stream_responses(self, request: Request, params: Any, ns_map: Any = None) -> Response:
        """Serve a Responses request as an event stream (the whole answer computed first)."""
        from nemo_gym.responses_streaming import (
            restore_namespace_tool_calls,
            synthesize_responses_failure_sse,
            synthesize_responses_sse,
        )

        try:
            answer = as_json(await self._invoke_responses(request, params))
            # The client's own tool names come back before the answer is committed or streamed.
            answer["output"] = restore_namespace_tool_calls(list(answer.get("output") or []), ns_map or {})
            # Inside the try: an answer that cannot be serialized (or committed) fails as an event too.
            return await self._stream_served_response(answer, synthesize_responses_sse(answer))
        except Exception as exc:  # noqa: BLE001 - the client asked for a stream: the failure is its last event
            logger.exception("%s: responses() failed serving a streamed /v1/responses request", self.name)
            return event_stream(synthesize_responses_failure_sse(str(exc)))

    async def _stream_served_response(self, response: Any, events: Iterable[str | bytes]) -> Response:
        """The event stream of a finished answer, built before :meth:`_finalize_served_response` runs."""
        chunks = [event.encode() if isinstance(event, str) else event for event in events]
        await self._finalize_served_response(response)
        return event_stream(chunks)

    async def chat_completions_dispatch(self, request: Request, body: dict[str, Any]) -> Any:
        """``POST /v1/chat/completions`` of a NeMo Gym-style adapter (``stream: true`` as chunks)."""
        from nemo_gym.openai_utils import (
            CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS,
            NeMoGymChatCompletionCreateParamsNonStreaming,
        )

        if body.get("stream") is not True:
            params = validated(
                NeMoGymChatCompletionCreateParamsNonStreaming, body, CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS
            )
            completion = await self._invoke_chat_completions(request, params)
            answer = _orjson_dispatch_response(completion)
            await self._finalize_served_response(completion)
            return answer
        from nemo_gym.chat_streaming import sanitize_streaming_chat_body, synthesize_chat_completion_sse

        cleaned, include_usage = sanitize_streaming_chat_body(body)
        params = validated(
            NeMoGymChatCompletionCreateParamsNonStreaming, cleaned, CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS
        )
        pending = asyncio.ensure_future(self._invoke_chat_completions(request, params))
        try:
            # A quick answer (or a quick failure) is served whole, failures as normal HTTP errors.
            done, _ = await asyncio.wait({pending}, timeout=self.chat_keepalive_s)
        except BaseException:
            pending.cancel()
            raise
        if done:
            completion = as_json(pending.result())
            return await self._stream_served_response(
                completion, synthesize_chat_completion_sse(completion, include_usage=include_usage)
            )

        async def events() -> AsyncIterator[bytes]:
            # A long generation would leave the stream silent past a proxy's idle timeout:
            # comment lines keep it open until the answer is there.
            try:
                yield SSE_KEEPALIVE
                while not (await asyncio.wait({pending}, timeout=self.chat_keepalive_s))[0]:
                    yield SSE_KEEPALIVE
                try:
                    completion = as_json(pending.result())
                except Exception as exc:  # noqa: BLE001 - headers are sent: the failure is the stream's last event
                    logger.exception("%s: chat_completions() failed after its stream started", self.name)
                    status = getattr(exc, "status_code", None) or getattr(exc, "status", None) or 500
                    error = {"message": f"HTTP {status}: {exc}", "type": "server_error", "code": status}
                    yield b"event: error\ndata: " + orjson.dumps({"error": error}) + b"\n\n"
                    return
                await self._finalize_served_response(completion)
                for event in synthesize_chat_completion_sse(completion, include_usage=include_usage):
                    yield event.encode() if isinstance(event, str) else event
            finally:
                pending.cancel()

        return event_stream(events())

    async def messages(self, request: Request, body: dict[str, Any]) -> Any:
        """``POST /v1/messages``: an Anthropic Messages request answered through :meth:`responses`."""
        from nemo_gym.anthropic_converter import AnthropicConverter

        converter = AnthropicConverter()
        response = await self._invoke_responses(request, converter.anthropic_request_to_responses(body))
        answer = converter.responses_to_anthropic_response(
            response, model=body.get("model") or response.model
        )
        if body.get("stream"):
            return await self._stream_served_response(answer, converter.anthropic_response_to_sse(answer))
        dispatched = _orjson_dispatch_response(answer)
        await self._finalize_served_response(answer)
        return dispatched

    async def _invoke_responses(self, request: Request, params: Any) -> Any:
        return await _captured(lambda p: call_handler(self.responses, request, p), params, params)

    async def _invoke_chat_completions(self, request: Request, params: Any) -> Any:
        return await _captured(lambda p: call_handler(self.chat_completions, request, p), params, params)

    async def _finalize_served_response(self, response: Any) -> None:
        """Called with each answer once it is converted for the client (adapters that commit
        captured tokens override it)."""


BaseResponsesAPIModel = SimpleResponsesAPIModel


def without_stream(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without ``stream`` and ``stream_options`` (the request a whole answer needs)."""
    return {key: value for key, value in body.items() if key not in ("stream", "stream_options")}


def __getattr__(name: str) -> Any:
    # FastAPI's Body, which NeMo Gym model adapters import from here: loaded only when asked
    # for, so our own model servers never import FastAPI.
    if name == "Body":
        from fastapi import Body

        return Body
    if name in _LAZY_NAMES:
        import importlib

        module, attribute = _LAZY_NAMES[name]
        return getattr(importlib.import_module(module), attribute)
    return served_name(name, __name__)
