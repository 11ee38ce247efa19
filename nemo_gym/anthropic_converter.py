"""Compatibility: NeMo Gym's ``nemo_gym.anthropic_converter``: Anthropic's Messages API ⇄ the Responses API.

:class:`AnthropicConverter` serves both directions NeMo Gym uses it for: a model server in front
of Anthropic's API (:meth:`~AnthropicConverter.responses_to_anthropic`,
:meth:`~AnthropicConverter.anthropic_to_responses`) and a model server answering Anthropic
clients such as the Claude Code CLI (:meth:`~AnthropicConverter.anthropic_request_to_responses`,
:meth:`~AnthropicConverter.responses_to_anthropic_response`,
:meth:`~AnthropicConverter.anthropic_response_to_sse`). The mapping lives in
:mod:`nemo_gym.models.anthropic_messages`; this class moves between it and NeMo Gym's pydantic
types. It needs no ``anthropic`` package. New ids use this module's ``uuid4``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

from pydantic import BaseModel

from nemo_gym.models.anthropic_messages import (
    IMAGE_MEDIA_TYPES,
    messages_request_to_responses_params,
    messages_response_events,
    messages_response_to_response,
    response_to_messages_response,
    responses_params_to_messages_request,
)
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming

__all__ = ["SUPPORTED_ANTHROPIC_IMAGE_MEDIA_TYPES", "AnthropicConverter"]

SUPPORTED_ANTHROPIC_IMAGE_MEDIA_TYPES = set(IMAGE_MEDIA_TYPES)
"""The image media types Anthropic's API takes."""


def _new_id(prefix: str) -> str:
    # Looked up at call time, so that patching this module's `uuid4` fixes the ids.
    return f"{prefix}_{uuid4().hex}"


def _plain(value: Any, **dump: Any) -> dict[str, Any]:
    return value.model_dump(**dump) if isinstance(value, BaseModel) else dict(value)


class AnthropicConverter:
    """Converts requests and answers between Anthropic's Messages API and the Responses API."""

    def responses_to_anthropic(
        self,
        body: NeMoGymResponseCreateParamsNonStreaming,
        model: str,
        max_tokens: int,
        thinking: dict[str, Any] | None,
        thinking_budget_tokens: int | None,
        extra_body: dict[str, Any],
    ) -> dict[str, Any]:
        """The Messages request (a dict) for a Responses request, to send to Anthropic's API.

        ``max_tokens`` applies when the request sets no ``max_output_tokens``; thinking comes from
        one of ``thinking``, ``thinking_budget_tokens`` or ``extra_body`` (``ValueError`` if several).
        """
        return responses_params_to_messages_request(
            _plain(body, exclude_unset=True, mode="json"),
            model=model,
            max_tokens=max_tokens,
            thinking=thinking,
            thinking_budget_tokens=thinking_budget_tokens,
            extra_body=extra_body,
        )

    def anthropic_to_responses(
        self,
        anthropic_response: dict[str, Any],
        request_body: NeMoGymResponseCreateParamsNonStreaming,
        model: str,
    ) -> NeMoGymResponse:
        """The Responses response for Anthropic's answer to ``request_body``."""
        response = messages_response_to_response(
            anthropic_response, _plain(request_body), model=model, new_id=_new_id
        )
        return NeMoGymResponse.model_validate(response)

    def anthropic_request_to_responses(
        self, anthropic_body: dict[str, Any]
    ) -> NeMoGymResponseCreateParamsNonStreaming:
        """The Responses request for an Anthropic client's Messages request (a dict, fields read leniently)."""
        return NeMoGymResponseCreateParamsNonStreaming.model_validate(
            messages_request_to_responses_params(anthropic_body, new_id=_new_id)
        )

    def responses_to_anthropic_response(
        self, response: NeMoGymResponse | dict[str, Any], model: str
    ) -> dict[str, Any]:
        """A Responses response as the Messages response (a JSON dict) an Anthropic client reads."""
        return response_to_messages_response(_plain(response, mode="json"), model=model, new_id=_new_id)

    def anthropic_response_to_sse(self, anthropic_response: dict[str, Any]) -> Iterator[str]:
        """A finished Messages response as the Messages server-sent events a streaming client reads."""
        for name, data in messages_response_events(anthropic_response):
            yield self._sse_event(name, data)

    def _sse_event(self, event_type: str, data: dict[str, Any]) -> str:
        """One server-sent event: ``event:`` and ``data:`` lines."""
        return f"event: {event_type}\ndata: {json.dumps(data)}\n\n"
