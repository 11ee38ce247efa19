"""The model server's capture middleware: a training-token capture context per correlated call.

A call on ``/ng-rollout/<id>/training-token-capture/<route>`` (or one whose prefix an outer
layer already stripped, leaving the id and the capture flag) gets a :class:`CaptureContext` for
as long as it is served; the server's dispatch resolves its parent and captures its tokens.
Around that, this layer keeps the capture honest:

* a captured route that is not a model dialect (``/v1/responses``, ``/v1/chat/completions``, Gemini,
  ``/v1/messages``) and not non-generating (declared so, a HEAD, OPTIONS or DELETE, a token
  count) marks the rollout incomplete when it answers (404/405 excepted), since its answer may
  carry policy text nobody captured;
* under worker-owned staging, an admitted call that ends without committed coordinates is
  recorded as a failure before the answer's last piece (or a stream's terminal event) is sent,
  so a client that saw the answer end can read the failure.

Evaluation capture (request/answer records, :mod:`nemo_gym.models.call_capture`) runs inside it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any
from uuid import uuid4

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.models.call_capture import (
    OBSERVED_PATHS,
    CaptureMiddleware,
    reconstruct_streamed_response,
    split_rollout_prefix,
    sse_payloads,
)
from nemo_gym.models.call_capture import _stream_end as stream_end
from nemo_gym.models.call_records import CaptureStore
from nemo_gym.models.chat_stream import ChatCompletionAccumulator
from nemo_gym.serving.request_context import _current_rollout_id
from nemo_gym.serving.rollout_prefix import TOKEN_CAPTURE_SCOPE_KEY
from nemo_gym.token_id_capture.protocols import (
    CaptureLedger,
    LineageResolver,
    TokenSink,
    installed_token_sink,
)
from nemo_gym.token_id_capture.records import UNCOMMITTED_CALL_REASON
from nemo_gym.token_id_capture.request_items import request_messages
from nemo_gym.token_id_capture.sink import CaptureContext, capture_tokens, reset_token_sink, set_token_sink

logger = logging.getLogger(__name__)

# A Gemini API model call (Gemini CLI: v1beta; the google-genai SDK: v1).
_GEMINI_CALL = re.compile(r"^/v1(beta)?/models/[^/]+:(generateContent|streamGenerateContent)$")
# Requests whose answers carry no model content whatever the route.
_CONTENTLESS_METHODS = frozenset({"HEAD", "OPTIONS", "DELETE"})
_COUNT_PATHS = frozenset({"/v1/messages/count_tokens"})
_GEMINI_COUNT = re.compile(r"^/v1(beta)?/models/[^/]+:countTokens$")
# The dialects whose streams end with a recognisable terminal event (a Gemini stream just ends).
_TERMINAL_EVENTS = frozenset(OBSERVED_PATHS.values())


async def fail_uncommitted_external_call(context: CaptureContext | None) -> None:
    """Record an admitted worker-staged call that finished without committed coordinates."""
    if (
        context is None
        or not context.external_staging
        or context.capture_admission is None
        or context.committed
        or context.lineage_store is None
    ):
        return
    if not isinstance(context.lineage_store, CaptureLedger):
        logger.error(
            "cannot poison uncommitted call %s of rollout %s: no capture ledger",
            context.model_call_id,
            context.rollout_id,
        )
        return
    try:
        await context.lineage_store.record_failure(
            context.rollout_id, context.model_call_id, UNCOMMITTED_CALL_REASON
        )
    except Exception:
        logger.exception(
            "could not poison uncommitted call %s of rollout %s", context.model_call_id, context.rollout_id
        )


class TokenCaptureMiddleware:
    """ASGI middleware: training-token capture around evaluation capture (NeMo Gym's ``_CaptureMiddleware``).

    ``store``: the evaluation capture store (None: no request/answer records). ``token_store``
    / ``configured_sink``: where entries go (a configured sink, then one installed in this
    process, then the file store). ``lineage_store``: the resolver (under ``external_staging``,
    the capture ledger). ``token_capture_enabled``: open contexts even with no local sink (a
    worker stages the tokens). ``non_generating_requests``: ``(METHOD, path)`` routes whose
    answers never carry generated text.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: CaptureStore | None,
        model_server_name: str | None = None,
        token_store: TokenSink | None = None,
        configured_sink: TokenSink | None = None,
        lineage_store: LineageResolver | None = None,
        delta_records: bool = False,
        external_staging: bool = False,
        token_capture_enabled: bool = False,
        non_generating_requests: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset(),
    ) -> None:
        self.app = CaptureMiddleware(app, store=store, model_server_name=model_server_name)
        self.token_store = token_store
        self.configured_sink = configured_sink
        self.lineage_store = lineage_store
        self.delta_records = delta_records
        self.external_staging = external_staging
        self.token_capture_enabled = token_capture_enabled
        self.non_generating_requests = frozenset(non_generating_requests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rollout_id, token_capture, path = split_rollout_prefix(scope.get("path", ""))
        if rollout_id is None and scope.get(TOKEN_CAPTURE_SCOPE_KEY):
            rollout_id, token_capture = _current_rollout_id.get(), True
        sink = self.configured_sink or installed_token_sink() or self.token_store
        if rollout_id is None or not token_capture or (sink is None and not self.token_capture_enabled):
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method") or "").upper()
        dialect = OBSERVED_PATHS.get(path) or ("gemini" if _GEMINI_CALL.match(path) else None)
        if dialect is None:
            if sink is not None and not self._non_generating(method, path):
                await self._serve_unobserved(scope, receive, send, sink, rollout_id, f"{method} {path}")
            else:
                await self.app(scope, receive, send)
            return
        context = CaptureContext(
            rollout_id=rollout_id,
            model_call_id=uuid4().hex,
            token_sink=sink,
            lineage_store=self.lineage_store,
            delta_records=self.delta_records,
            external_staging=self.external_staging,
            admitted_at=time.time(),
        )
        pending = bytearray()
        streamed = bytearray()
        request_body = bytearray()
        streaming = False

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                request_body.extend(message.get("body", b""))
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers") or []).get(b"content-type", b"")
                streaming = content_type.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body":
                ended = None
                if streaming and dialect in _TERMINAL_EVENTS:
                    chunk = message.get("body", b"")
                    pending.extend(chunk)
                    streamed.extend(chunk)
                    ended = stream_end(pending, dialect)
                if ended is not None or not message.get("more_body", False):
                    if streaming and not context.capture_attempted and not context.external_staging:
                        # The handler streamed as the engine produced: capture the whole answer
                        # before its end reaches the client (the next turn must find it).
                        await _capture_stream(bytes(streamed), dialect, bytes(request_body))
                    await fail_uncommitted_external_call(context)
            await send(message)

        token = set_token_sink(context)
        try:
            await self.app(scope, recording_receive, guarded_send)
        finally:
            await fail_uncommitted_external_call(context)
            reset_token_sink(token)

    def _non_generating(self, method: str, path: str) -> bool:
        """Whether a request's answer can never carry generated text: declared by the server, or
        a method that returns no content of a model's (HEAD, OPTIONS, DELETE of a stored
        response), or a dialect's token count (``count_tokens``, Gemini's ``countTokens``)."""
        return (
            (method, path) in self.non_generating_requests
            or method in _CONTENTLESS_METHODS
            or path in _COUNT_PATHS
            or bool(_GEMINI_COUNT.match(path))
        )

    async def _serve_unobserved(
        self, scope: Scope, receive: Receive, send: Send, sink: TokenSink, rollout_id: str, what: str
    ) -> None:
        """Serve a captured call of an unknown route; mark the rollout incomplete if it answered."""
        state = {"started": False, "marked": False}

        async def mark(reason: str) -> None:
            if state["marked"]:
                return
            state["marked"] = True
            try:
                await sink.mark_incomplete(rollout_id, "")
                logger.warning(
                    "rollout %s marked incomplete: the unclassified model request %s %s; declare it in "
                    "token_id_capture_non_generating_requests only if its answer can never carry generated text",
                    rollout_id, what, reason,
                )  # fmt: skip
            except Exception:
                logger.warning("could not mark rollout %s incomplete for %s", rollout_id, what, exc_info=True)

        async def watching_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
                if int(message.get("status") or 0) not in (404, 405):
                    await mark(f"answered HTTP {message.get('status')}")
            await send(message)

        try:
            await self.app(scope, receive, watching_send)
        except BaseException:
            if not state["started"]:
                await mark("failed before answering")
            raise
        if not state["started"]:
            await mark("ended without answering")


async def _capture_stream(raw: bytes, dialect: str, request_body: bytes) -> None:
    """Capture the current call from its event stream (Responses: the final event's response;
    Chat: the chunks folded, vLLM's token fields included)."""
    try:
        request = json.loads(request_body) if request_body else {}
    except ValueError:
        request = {}
    if dialect == "chat":
        folded = ChatCompletionAccumulator()
        for event in sse_payloads(raw):
            if "choices" in event:
                folded.add(event)
        answer: Any = folded.completion()
    else:
        answer = reconstruct_streamed_response(raw, dialect)
    await capture_tokens(
        answer if isinstance(answer, dict) else {}, request_messages=request_messages(request)
    )


def install_token_capture_middleware(
    app: Any,
    global_config_dict: Any,
    *,
    store: CaptureStore | None,
    model_server_name: str | None,
    non_generating_requests: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset(),
) -> None:
    """Add :class:`TokenCaptureMiddleware` to a FastAPI app, built from the run's capture config.

    Builds the sink, the file store and the resolver once in this process; under
    ``external_staging`` the resolver must be a capture ledger and the bearer-protected manifest
    route is added (its token read from the environment).
    """
    kwargs = token_capture_components(global_config_dict)
    if kwargs["external_staging"]:
        from nemo_gym.token_id_capture.config import token_id_capture_config
        from nemo_gym.token_id_capture.control_routes import install_rollout_control_routes

        settings = token_id_capture_config(global_config_dict).token_id_capture
        install_rollout_control_routes(
            app, kwargs["lineage_store"], auth_token=settings.resolve_control_auth_token()
        )
    app.add_middleware(
        TokenCaptureMiddleware,
        store=store,
        model_server_name=model_server_name,
        non_generating_requests=frozenset(non_generating_requests),
        **kwargs,
    )


def token_capture_components(global_config_dict: Any) -> dict[str, Any]:
    """The middleware's capture arguments for a run's config (all off when capture is off)."""
    from nemo_gym.token_id_capture.config import token_id_capture_config
    from nemo_gym.token_id_capture.lineage import FileLineageStore
    from nemo_gym.token_id_capture.protocols import installed_lineage_store
    from nemo_gym.token_id_capture.store import make_token_store

    config = token_id_capture_config(global_config_dict)
    settings = config.token_id_capture
    if not settings.enabled:
        return {"external_staging": False}
    token_store = make_token_store(global_config_dict)
    lineage = config.build_lineage_store() or installed_lineage_store()
    if lineage is None and token_store is not None:
        lineage = FileLineageStore(token_store.root)
    if settings.external_staging and not isinstance(lineage, CaptureLedger):
        raise ValueError(
            "token_id_capture.external_staging needs a capture ledger: set token_id_capture.lineage_store "
            "to nemo_gym.token_id_capture.lineage:FileLineageStore (with lineage_store_kwargs.root) or a "
            "CaptureLedger of your own"
        )
    return {
        "token_store": None if settings.external_staging else token_store,
        "configured_sink": None if settings.external_staging else config.build_sink(),
        "lineage_store": lineage,
        "delta_records": settings.delta_records,
        "external_staging": settings.external_staging,
        "token_capture_enabled": True,
    }
