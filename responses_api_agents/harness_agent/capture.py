"""The capture proxy of harness_agent: a rollout-scoped model URL in front of the policy model.

One loopback HTTP server per agent process serves every rollout under its own path prefix
``/r/<token>``:

- ``POST /r/<token>/v1/responses`` and ``POST /r/<token>/v1/chat/completions``: forwarded to
  the policy model (Chat requests are converted to the Responses API and back), each call
  recorded with its input items and output items, token-ID fields included;
- ``POST /r/<token>/tools/<name>``: one tool call on the rollout's resources server, in the
  rollout's session (the answer is the tool's output text).

A harness echoes earlier answers back without our token-ID fields (the ``openai`` client keeps
only what it knows), so the proxy puts them back on the echoed items (matched by ``call_id``
or by the assistant text) before forwarding: the model server can then splice the token IDs
and every call's prompt extends the previous call's prompt + generation. Contiguity is still
checked on each answer; a call whose prompt does not extend the previous call's is marked
``token_ids_contiguous: false`` (as the model servers do when a splice is refused), so a
trainer never stitches it onto the previous call.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.base_responses_api_agent import (
    HopFault,
    HTTPError,
    Rollout,
    ServerCallError,
    call_model,
    execute_tool_call,
)
from nemo_gym.base_responses_api_model import TOKEN_ID_FIELDS
from nemo_gym.response_items import add_usage, content_text, input_items, is_model_item
from nemo_gym.server_utils import (
    AccessGuard,
    RequestGuard,
    bind_socket,
    json_error_handlers,
    make_uvicorn_server,
    parse_json_object,
)
from responses_api_agents.harness_agent.wire import PROXY_OWNED_FIELDS, DialectError, read_request

CONTIGUITY_FIELD = "token_ids_contiguous"


@dataclass
class CapturedCall:
    """One model call the harness made: what it sent (token fields restored) and what came back."""

    input: list[dict[str, Any]]
    response: dict[str, Any]


@dataclass
class RolloutCapture:
    """Everything one rollout's harness did through the proxy."""

    rollout: Rollout
    model_server: str
    resources_server: str
    max_model_calls: int
    hop_timeout_s: float | None = None
    # The tools the row offered: the only ones the tools URL runs.
    tools: frozenset[str] = frozenset()
    calls: list[CapturedCall] = field(default_factory=list)
    tool_calls: int = 0
    # Model calls let through to the policy model (counted before forwarding: concurrent calls
    # cannot pass the limit while earlier ones are in flight).
    forwarded: int = 0
    fault: HopFault | None = None
    # Token-ID fields of each model-produced item, by the key an echoed copy can be matched on.
    _tokens: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    _last_sequence: list[int] | None = None
    # Output texts the resources server returned through the tools URL, by tool name.
    _stack_outputs: dict[str, list[str]] = field(default_factory=dict)

    def restore_token_fields(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``items`` with our token-ID fields put back on echoed model items that lost them."""
        restored = []
        for item in items:
            if is_model_item(item) and "prompt_token_ids" not in item:
                fields = self._tokens.get(item_key(item))
                if fields:
                    item = {**item, **fields}
            restored.append(item)
        return restored

    def record(self, sent: list[dict[str, Any]], response: dict[str, Any]) -> None:
        """Keep one call; check its prompt extends the previous call's prompt + generation."""
        carrier = next((i for i in reversed(response.get("output") or []) if "prompt_token_ids" in i), None)
        if carrier is not None:
            prompt = list(carrier["prompt_token_ids"])
            previous = self._last_sequence
            if previous is not None and prompt[: len(previous)] != previous:
                carrier[CONTIGUITY_FIELD] = False
            self._last_sequence = prompt + list(carrier.get("generation_token_ids") or [])
            fields = {k: carrier[k] for k in (*TOKEN_ID_FIELDS, CONTIGUITY_FIELD) if k in carrier}
            self._tokens[item_key(carrier)] = fields
        self.calls.append(CapturedCall(sent, response))

    def record_tool_output(self, name: str, text: str) -> None:
        """Keep the output text the resources server returned for one tool call of the program."""
        self._stack_outputs.setdefault(name, []).append(text)

    def assembled_response(self) -> dict[str, Any]:
        """The rollout's graded response: every call's output in order and, between them, only
        the tool outputs the stack itself returned (a ``function_call_output`` answering one of
        the policy's calls with a text the resources server gave for that tool); the usage
        summed. Everything else the program put between calls (its own messages, outputs of
        tools it ran itself, edited outputs) is never graded: see :meth:`program_items`. Empty
        ``output`` when the harness made no call."""
        return self._assemble()[0]

    def program_items(self) -> list[dict[str, Any]]:
        """What the program wrote on its own between model calls, for the record: each entry is
        ``{"before_call": index, "item": item}``. Never part of the graded response."""
        return self._assemble()[1]

    def _assemble(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        output: list[dict[str, Any]] = []
        own: list[dict[str, Any]] = []
        usage: dict[str, Any] | None = None
        policy_calls: dict[str, str] = {}  # call_id -> tool name, of the policy's function calls
        unclaimed = {name: list(texts) for name, texts in self._stack_outputs.items()}
        for index, call in enumerate(self.calls):
            if index:
                for item in items_since_last_model_item(call.input):
                    if _stack_tool_output(item, policy_calls, unclaimed):
                        output.append(item)
                    else:
                        own.append({"before_call": index, "item": item})
            produced = call.response.get("output") or []
            output.extend(produced)
            for item in produced:
                if isinstance(item, dict) and item.get("type") == "function_call":
                    policy_calls[str(item.get("call_id"))] = str(item.get("name"))
            usage = add_usage(usage, call.response.get("usage"))
        last = self.calls[-1].response if self.calls else {"object": "response", "status": "completed"}
        return {**last, "output": output, "usage": usage}, own


def _stack_tool_output(
    item: dict[str, Any], policy_calls: dict[str, str], unclaimed: dict[str, list[str]]
) -> bool:
    """Whether ``item`` hands back, for one of the policy's calls, a text the stack returned for
    that tool (each returned text vouches for one item only)."""
    if item.get("type") != "function_call_output":
        return False
    name = policy_calls.get(str(item.get("call_id")))
    output = item.get("output")
    text = output if isinstance(output, str) else content_text(output) if isinstance(output, list) else None
    texts = unclaimed.get(name or "")
    if text is None or not texts or text not in texts:
        return False
    texts.remove(text)
    return True


def item_key(item: dict[str, Any]) -> tuple[str, str]:
    """How an echoed copy of a model item is recognised: its call id, or its text."""
    if item.get("type") == "function_call":
        return ("call", str(item.get("call_id") or ""))
    if item.get("type") == "reasoning":
        return ("reasoning", orjson.dumps(item.get("summary") or item.get("content") or []).decode())
    return ("message", content_text(item.get("content")))


def items_since_last_model_item(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items after the last model-produced one (what the harness added since the model spoke)."""
    for index in range(len(items) - 1, -1, -1):
        if is_model_item(items[index]):
            return [dict(item) for item in items[index + 1 :]]
    return []


CAPTURE_MAX_BODY_BYTES = 64 * 1024 * 1024


def _error(status: int, message: str, **extra: Any) -> Response:
    body = {"error": {"message": message, "type": "capture_proxy_error", **extra}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


class CaptureProxy:
    """The loopback server; :meth:`open` gives a rollout its base URL, :meth:`close` ends it."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.base_url = ""
        self._captures: dict[str, RolloutCapture] = {}
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Start serving (once; later calls return at once)."""
        async with self._lock:
            if self._server is not None:
                return
            sock = bind_socket(self.host, 0)
            self.base_url = f"http://{self.host}:{sock.getsockname()[1]}"
            app = Starlette(
                routes=[
                    Route("/r/{token}/v1/responses", self._responses, methods=["POST"]),
                    Route("/r/{token}/v1/chat/completions", self._chat, methods=["POST"]),
                    Route("/r/{token}/v1/messages", self._messages, methods=["POST"]),
                    Route("/r/{token}/v1beta/models/{target}", self._gemini, methods=["POST"]),
                    Route("/r/{token}", self._root, methods=["GET", "HEAD"]),
                    Route("/r/{token}/", self._root, methods=["GET", "HEAD"]),
                    Route("/r/{token}/tools/{name}", self._tool, methods=["POST"]),
                ],
                exception_handlers=json_error_handlers("harness_capture_proxy"),
            )
            # The harness is untrusted code: its bodies are bounded and timed like any client's.
            guarded = AccessGuard(
                RequestGuard(app, "harness_capture_proxy", CAPTURE_MAX_BODY_BYTES),
                "harness_capture_proxy",
                hosts=[self.host],
                # Third-party programs send JSON under any type (curl's default is a form type);
                # the URL's unguessable token already keeps web pages out.
                json_only=False,
            )
            self._server = make_uvicorn_server(guarded, embedded=True)
            self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
            while not self._server.started:
                if self._task.done():
                    self._task.result()
                await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop serving."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
            self._server = None

    def open(self, capture: RolloutCapture) -> str:
        """Register a rollout; returns its base URL (``<base>/v1/...`` and ``<base>/tools/...``)."""
        token = secrets.token_urlsafe(16)
        self._captures[token] = capture
        return f"{self.base_url}/r/{token}"

    def close(self, url: str) -> None:
        """Forget a rollout: later calls to its URL get a 404."""
        self._captures.pop(url.rsplit("/", 1)[-1], None)

    async def _body(self, request: Request) -> tuple[RolloutCapture | None, Any, Response | None]:
        capture = self._captures.get(request.path_params["token"])
        if capture is None:
            return None, None, _error(404, "no rollout at this URL (it has ended, or the URL is wrong)")
        try:
            body = parse_json_object(await request.body())
        except HTTPError as exc:
            return capture, None, _error(exc.status_code, exc.message)
        return capture, body, None

    async def _forward(self, capture: RolloutCapture, params: dict[str, Any]) -> dict[str, Any] | Response:
        if capture.forwarded >= capture.max_model_calls:
            return _error(429, f"this rollout's limit of {capture.max_model_calls} model calls is reached")
        if capture.fault is not None:
            return _error(502, f"the policy model failed earlier in this rollout: {capture.fault}")
        capture.forwarded += 1  # before the first await: the check and the count are one step
        params = {k: v for k, v in params.items() if k not in PROXY_OWNED_FIELDS}
        sent = capture.restore_token_fields(input_items(params))
        try:
            response = await call_model(
                capture.rollout,
                capture.model_server,
                {**params, "input": sent},
                timeout_s=capture.hop_timeout_s,
            )
        except HopFault as exc:
            capture.fault = exc  # the rollout fails with this class once the harness is done
            return _error(502, str(exc), failure_class=exc.failure_class)
        except ServerCallError as exc:
            if exc.kind == "http_error" and exc.status is not None and 400 <= exc.status < 500:
                # The program's own malformed request (a message without a role, ...): its 4xx.
                return _error(exc.status, str(exc))
            raise
        capture.record(sent, response)
        return response

    async def _model_call(self, request: Request, dialect: str) -> Response:
        capture, body, problem = await self._body(request)
        if problem is not None or capture is None:
            return problem or _error(404, "no rollout")
        try:
            call = read_request(dialect, body, str(request.path_params.get("target") or ""))
        except DialectError as exc:
            return _error(400, str(exc))
        local = call.answer_locally()
        if local is not None:
            return local
        answer = await self._forward(capture, call.params)
        if isinstance(answer, Response):
            return answer
        try:
            return call.answer(answer)
        except DialectError as exc:
            return _error(502, str(exc))

    async def _responses(self, request: Request) -> Response:
        return await self._model_call(request, "responses")

    async def _chat(self, request: Request) -> Response:
        return await self._model_call(request, "chat")

    async def _messages(self, request: Request) -> Response:
        return await self._model_call(request, "messages")

    async def _gemini(self, request: Request) -> Response:
        return await self._model_call(request, "gemini")

    async def _root(self, request: Request) -> Response:
        # Clients probe their base URL before the first call (Claude Code sends HEAD /).
        if request.path_params["token"] not in self._captures:
            return _error(404, "no rollout at this URL (it has ended, or the URL is wrong)")
        return Response(orjson.dumps({"status": "ok"}), media_type="application/json")

    async def _tool(self, request: Request) -> Response:
        capture, body, problem = await self._body(request)
        if problem is not None or capture is None:
            return problem or _error(404, "no rollout")
        call = {"name": request.path_params["name"], "arguments": orjson.dumps(body).decode()}
        try:
            text = await execute_tool_call(
                capture.rollout,
                capture.resources_server,
                call,
                capture.tools,
                timeout_s=capture.hop_timeout_s,
            )
        except HopFault as exc:
            capture.fault = exc
            return _error(502, str(exc), failure_class=exc.failure_class)
        capture.tool_calls += 1
        capture.record_tool_output(call["name"], text)
        return Response(text, media_type="text/plain; charset=utf-8")
