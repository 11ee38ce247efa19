"""Pieces of serving NeMo Gym-style model adapters (typed bodies, ``Request`` parameters) on our
model base: recognising such a handler, calling it, validating a body as NeMo Gym's strict
request types do, and event-stream answers. The dispatch itself is
:class:`nemo_gym.base_responses_api_model.SimpleResponsesAPIModel`'s (its methods are NeMo Gym's
names, which adapters override).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response

from nemo_gym.serving.server import body_model


def nemo_gym_handler(handler: Any) -> bool:
    """Whether a handler is written NeMo Gym's way: a ``request`` parameter or a pydantic body."""
    try:
        params = inspect.signature(handler).parameters
    except (TypeError, ValueError):
        return False
    return "request" in params or body_model(handler) is not None


async def call_handler(handler: Any, request: Any, params: Any) -> Any:
    """Call ``handler`` with the body, and the ``Request`` when it takes one."""
    # NeMo Gym adapters declare ``responses(self, body)`` or ``responses(self, request, body)``.
    if "request" in inspect.signature(handler).parameters:
        return await handler(request=request, body=params)
    return await handler(body=params)


def validated(model: type[BaseModel], body: dict[str, Any], extensions: frozenset[str] = frozenset()) -> Any:
    """``body`` as ``model``, or FastAPI's 422 listing each wrong field under ``body``.

    NeMo Gym's request types forbid fields OpenAI's API does not define (a misspelt ``thinkng``
    is a 422, not silently dropped), and its adapters rely on that: a field outside the
    ``openai`` package's request fields, the model's own and (for chat) ``extensions`` is refused.
    """
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    from nemo_gym.models.stream_requests import CHAT_REQUEST_FIELDS, RESPONSES_REQUEST_FIELDS

    known = CHAT_REQUEST_FIELDS | extensions if "messages" in model.model_fields else RESPONSES_REQUEST_FIELDS
    errors: list[dict[str, Any]] = [
        {
            "type": "extra_forbidden",
            "loc": ("body", key),
            "msg": "Extra inputs are not permitted",
            "input": body[key],
        }
        for key in body
        if key not in known and key not in model.model_fields
    ]
    try:
        params = model.model_validate(body)
    except ValidationError as exc:
        errors += [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
    if errors:
        raise RequestValidationError(errors)
    return params


def as_json(answer: Any) -> dict[str, Any]:
    """A pydantic answer (or a mapping) as a JSON-ready dict."""
    if isinstance(answer, BaseModel):
        return answer.model_dump(mode="json", by_alias=True)
    return dict(answer)


def event_stream(chunks: Iterable[str | bytes] | AsyncIterator[bytes]) -> Response:
    """A ``text/event-stream`` response of ready chunks (sync or async), never buffered by proxies."""
    from starlette.responses import StreamingResponse

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    content = chunks if isinstance(chunks, AsyncIterator) else iter(chunks)
    return StreamingResponse(content, media_type="text/event-stream", headers=headers)


def plain_config(config: Any) -> Any:
    """A global config as plain Python (an OmegaConf config converted, a mapping as is); None for
    anything else (a test's ``MagicMock()`` server client has a mock there: no config)."""
    if config is None or isinstance(config, dict):
        return config
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:
        return config if isinstance(config, Mapping) else None
    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)
    return config if isinstance(config, Mapping) else None
