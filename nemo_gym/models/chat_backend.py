"""Shared by the model servers that end in a vLLM-flavoured Chat Completions backend.

``vllm_model`` (remote vLLM), ``local_vllm_model`` (vLLM it starts) and ``local_hf_model`` (the
CPU engine) turn Responses requests into Chat Completions and back the same way
(:class:`ChatBridge`), hand messages to chat templates the same way (:func:`template_messages`),
and recognise a context-window overflow the same way. Errors in OpenAI's shape and streaming
are every model server's (:mod:`nemo_gym.base_responses_api_model`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from nemo_gym.failure_classes import BAD_UPSTREAM_BODY
from nemo_gym.models.chat_tools import needs_a_tool
from nemo_gym.models.conversion import (
    ROUTED_EXPERTS_FIELD,
    TOKEN_ID_FIELDS,
    chat_completion_to_response,
    responses_to_chat_request,
)
from nemo_gym.models.media import MediaLimitError
from nemo_gym.response_items import build_response
from nemo_gym.serving.server import HTTPError

logger = logging.getLogger(__name__)

# vLLM's wordings for a prompt that does not fit: "This model's maximum context length is N
# tokens..." (OpenAI-style) and "The decoder prompt (length N) is longer than the maximum model
# length of M" (V1 engine).
_CONTEXT_LENGTH_ERROR = re.compile(r"maximum context length|maximum model length", re.IGNORECASE)
CONTIGUITY_FIELD = "token_ids_contiguous"
"""Set to ``false`` on a model call's last output item when the engine could not splice its prompt."""


def is_context_length_error(status: int, message: str) -> bool:
    """Whether a backend answer says the prompt is longer than the context window."""
    return status == 400 and bool(_CONTEXT_LENGTH_ERROR.search(message))


@dataclass(frozen=True)
class ChatBridge:
    """How Responses requests become Chat Completions requests for one backend, and back.

    Used in-process by every model server that ends in a vLLM-flavoured Chat Completions
    engine (``vllm_model``, ``local_vllm_model``, the CPU engine's own ``/v1/responses``).
    """

    model: str | None = None
    return_token_id_information: bool = False
    uses_reasoning_parser: bool = False
    replace_developer_role_with_system: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    limit_mm_per_prompt: dict[str, int] | None = None

    def chat_request(self, params: dict[str, Any]) -> dict[str, Any]:
        """The Chat Completions request for Responses create-params (raises ``HTTPError`` 400/422)."""
        try:
            # With a reasoning parser the chat template reads `reasoning_content`; without one the
            # reasoning goes back as <think> text, as the model wrote it.
            request = responses_to_chat_request(
                params,
                think_tags=not self.uses_reasoning_parser,
                limit_mm_per_prompt=self.limit_mm_per_prompt,
            )
        except MediaLimitError as exc:
            raise HTTPError(400, str(exc)) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise HTTPError(422, f"cannot convert the Responses request to Chat Completions: {exc}") from exc
        for message in request["messages"]:
            if self.replace_developer_role_with_system and message.get("role") == "developer":
                message["role"] = "system"
            if not self.return_token_id_information:
                for key in TOKEN_ID_FIELDS:
                    message.pop(key, None)
        if self.model:
            request["model"] = self.model
        if self.chat_template_kwargs:
            request["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        request.update(self.extra_body)
        request.update(per_request_extra_body(params))
        if self.return_token_id_information:
            # Raw sampled IDs and their logprobs from the engine itself: no re-tokenization.
            request.update(
                logprobs=True, top_logprobs=0, return_tokens_as_token_ids=True, return_token_ids=True
            )
        if needs_a_tool(request.get("tool_choice")) and not request.get("tools"):
            # OpenAI-compatible engines refuse it too; say so here, naming the field.
            raise HTTPError(
                400,
                f"tool_choice={params.get('tool_choice')!r} needs at least one tool, but 'tools' is empty: "
                "give the tools or leave tool_choice out",
            )
        return request

    def response(self, completion: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        """The Responses object for a backend completion (raises ``HTTPError`` 502 on a malformed one)."""
        try:
            response = chat_completion_to_response(completion, request_params=params, think_tags=True)
        except (ValueError, KeyError, TypeError) as exc:
            raise HTTPError(
                502,
                f"the backend's chat completion cannot be converted: {exc}",
                failure_class=BAD_UPSTREAM_BODY,
            ) from exc
        output = response["output"]
        if not self.return_token_id_information:
            for item in output:
                for key in (*TOKEN_ID_FIELDS, ROUTED_EXPERTS_FIELD):
                    item.pop(key, None)
        elif completion.get(CONTIGUITY_FIELD) is False and output:
            output[-1][CONTIGUITY_FIELD] = False
        return response

    def context_exceeded_response(self, params: dict[str, Any], message: str) -> dict[str, Any]:
        """An ``incomplete`` Responses object for a prompt that does not fit the context window.

        The output is empty: the model produced nothing. ``max_output_tokens`` is the reason
        because no room was left for output tokens (the Responses API has no closer reason).
        """
        logger.warning("prompt does not fit the context window: %s", message)
        model = self.model or params.get("model") or ""
        return build_response(
            [], params, model=model, status="incomplete", incomplete_reason="max_output_tokens"
        )


def per_request_extra_body(params: dict[str, Any]) -> dict[str, Any]:
    """Engine settings a row carries in ``metadata.extra_body`` (a JSON object as a string).

    The Responses API has no ``seed``; the collector's ``+num_repeats_add_seed`` puts
    ``{"seed": n}`` there (NeMo Gym's spelling), and it reaches the engine through here.
    Raises ``HTTPError`` 422 when the string is not a JSON object.
    """
    raw = (params.get("metadata") or {}).get("extra_body")
    if not raw:
        return {}
    try:
        extra = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
    except orjson.JSONDecodeError as exc:
        raise HTTPError(422, f"metadata.extra_body is not valid JSON: {exc}") from exc
    if not isinstance(extra, dict):
        raise HTTPError(422, f"metadata.extra_body must be a JSON object, got {type(extra).__name__}")
    return extra


def template_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to a chat template: tool-call arguments parsed into objects.

    Templates render arguments with ``tojson``, so vLLM parses the JSON string first; doing the
    same here reproduces the re-tokenization drift the splice exists to correct. Raises
    ``ValueError`` naming a message that is not an object with a role.
    """
    prepared = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{index}] must be an object with a 'role'")
        message = dict(message)
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                call = dict(call)
                function = dict(call.get("function") or {})
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    try:
                        function["arguments"] = orjson.loads(arguments)
                    except orjson.JSONDecodeError:
                        pass  # left as text: the template renders it verbatim
                call["function"] = function
                calls.append(call)
            message["tool_calls"] = calls
        prepared.append(message)
    return prepared
