"""Compatibility: NeMo Gym's ``nemo_gym.responses_converter``: Responses API ⇄ Chat Completions, as typed objects.

:class:`ResponsesConverter` is what NeMo Gym's model adapters (``vllm_model``, ``azure_openai_model``,
``inference_provider``, ``litellm_model``) and agents (``opencode_sandboxed_agent``,
``conversational_tool_use``, ``terminus_2_agent``, ...) call to turn a Responses request into a
chat request for an engine and the engine's chat completion back into a Responses response.
The conversion itself is :mod:`nemo_gym.models.conversion` (what our own model servers use),
with NeMo Gym's rules on top in :mod:`nemo_gym.models.responses_chat`; this module only moves
between NeMo Gym's pydantic types (:mod:`nemo_gym.openai_utils`) and those dict functions.

Ids of new response objects and items are ``<prefix>_<uuid4().hex>`` with this module's
``uuid4``, so a test may patch ``nemo_gym.responses_converter.uuid4`` for fixed ids.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar
from uuid import uuid4

from pydantic import BaseModel, Field, TypeAdapter

from nemo_gym.models.conversion import split_think_tags
from nemo_gym.models.responses_chat import (
    assistant_message_to_output_items,
    chat_completion_to_response_envelope,
    chat_messages_to_items,
    chat_params_to_responses_params,
    responses_params_to_chat_params,
    split_input_output_items,
)
from nemo_gym.models.token_usage import usage_detail
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChoice,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseOutputItem,
    TokenIDLogProbMixin,
)

__all__ = [
    "ResponsesConverter",
    "ResponsesConverterState",
    "VLLMConverter",
    "VLLMConverterResponsesToChatCompletionsState",
    "split_responses_input_output_items",
]

_ITEM = TypeAdapter(NeMoGymResponseOutputItem)
_usage_detail = usage_detail
"""NeMo Gym's name for :func:`nemo_gym.models.token_usage.usage_detail` (NeMo Gym's ``litellm_model`` imports it)."""


def _new_id(prefix: str) -> str:
    # Looked up at call time, so that patching this module's `uuid4` fixes the ids.
    return f"{prefix}_{uuid4().hex}"


def _plain(value: Any, **dump: Any) -> dict[str, Any]:
    return value.model_dump(**dump) if isinstance(value, BaseModel) else dict(value)


def _items(dicts: list[dict[str, Any]]) -> list[Any]:
    return [_ITEM.validate_python(item) for item in dicts]


class ResponsesConverterState(BaseModel):
    """The chat messages a Responses → Chat conversion has produced, and the assistant turn it collects.

    NeMo Gym's name for a conversion's working state; :class:`ResponsesConverter` keeps its
    state inside :mod:`nemo_gym.models.conversion` and does not need this object.
    """

    return_token_id_information: bool
    messages: list[dict[str, Any]] = Field(default_factory=list)
    content_buffer: str = ""
    refusal_buffer: str = ""
    tool_calls_buffer: list[dict[str, Any]] = Field(default_factory=list)
    assistant_item_buffered: bool = False
    token_information: TokenIDLogProbMixin | None = None


class ResponsesConverter(BaseModel):
    """Converts between the Responses API and Chat Completions, on NeMo Gym's pydantic types.

    ``return_token_id_information``: carry the token-ID fields of model calls across (on assistant
    turns going to chat, on the last output item coming back). ``uses_reasoning_parser``: read
    ``<think>...</think>`` blocks in an assistant's text as reasoning items (a backend whose
    reasoning parser already split them out sends no tags).
    """

    return_token_id_information: bool
    uses_reasoning_parser: bool = True

    THINK_TAG_PATTERN: ClassVar[re.Pattern[str]] = re.compile(r"<think>(.*?)</think>", re.DOTALL)

    @staticmethod
    def _wrap_reasoning_in_think_tags(texts: list[str]) -> str:
        """Each non-empty reasoning text wrapped in ``<think>`` tags, joined."""
        return "".join(f"<think>{text}</think>" for text in texts if text)

    @classmethod
    def _parse_think_tags(cls, content: str) -> tuple[list[str], str]:
        """``(reasoning texts, remaining text)`` of assistant ``content``."""
        return split_think_tags(content)

    def _extract_reasoning_from_content(self, content: str) -> tuple[list[str], str]:
        """``(reasoning texts, remaining text)`` of assistant ``content``."""
        return self._parse_think_tags(content)

    # ---- Responses -> Chat Completions

    def responses_to_chat_completion_create_params(
        self, responses_create_params: NeMoGymResponseCreateParamsNonStreaming | dict[str, Any]
    ) -> NeMoGymChatCompletionCreateParamsNonStreaming:
        """The chat request for a Responses request (only the fields it sets are read).

        Raises ``NotImplementedError`` (also a ``ValueError``) for what chat cannot express:
        ``previous_response_id`` and the other server-state fields, hosted tools, item types
        other than messages, reasoning, function calls and their outputs.
        """
        params = _plain(responses_create_params, exclude_none=True, exclude_unset=True)
        chat = responses_params_to_chat_params(
            params, token_ids=self.return_token_id_information, think_tags=True
        )
        return NeMoGymChatCompletionCreateParamsNonStreaming(**chat)

    # ---- Chat Completions -> Responses

    def chat_completion_to_responses_create_params(
        self, chat_completion_create_params: NeMoGymChatCompletionCreateParamsNonStreaming | dict[str, Any]
    ) -> NeMoGymResponseCreateParamsNonStreaming:
        """The Responses request for a chat request."""
        chat = _plain(chat_completion_create_params, exclude_none=True)
        params = chat_params_to_responses_params(
            chat,
            think_tags=self.uses_reasoning_parser,
            token_ids=self.return_token_id_information,
            new_id=_new_id,
        )
        return NeMoGymResponseCreateParamsNonStreaming.model_validate(params)

    def postprocess_chat_response(self, choice: NeMoGymChoice) -> list[Any]:
        """The Responses output items of one chat completion choice."""
        return self.postprocess_assistant_message_dict(choice.message.model_dump(exclude_none=True))

    def postprocess_assistant_message_dict(self, message_dict: dict[str, Any]) -> list[Any]:
        """The Responses output items of one assistant chat message (a dict).

        A reasoning item (from ``<think>`` blocks when ``uses_reasoning_parser``), a message
        (text and refusal), one function call per tool call; with ``return_token_id_information``
        the message's token-ID fields make the last item its ``*ForTraining`` variant.
        """
        return _items(
            assistant_message_to_output_items(
                dict(message_dict),
                think_tags=self.uses_reasoning_parser,
                token_ids=self.return_token_id_information,
                new_id=_new_id,
            )
        )

    def chat_completions_messages_to_responses_items(self, messages: list[dict[str, Any]]) -> list[Any]:
        """Chat messages as Responses items (input messages, output items, function call outputs)."""
        return _items(
            chat_messages_to_items(
                [dict(message) for message in messages],
                think_tags=self.uses_reasoning_parser,
                token_ids=self.return_token_id_information,
                new_id=_new_id,
            )
        )

    def chat_completion_to_response(
        self,
        responses_create_params: NeMoGymResponseCreateParamsNonStreaming,
        chat_completion: NeMoGymChatCompletion,
        *,
        preserve_envelope_id: bool = False,
    ) -> NeMoGymResponse:
        """The Responses response for ``chat_completion``, which answered ``responses_create_params``.

        Its output comes from the first choice; its settings echo the request. With
        ``preserve_envelope_id`` the response keeps the completion's id (external token capture
        records calls under it), else it gets a fresh ``resp_`` id.
        """
        choice = chat_completion.choices[0]
        output = [item.model_dump() for item in self.postprocess_chat_response(choice)]
        # Only the envelope's fields are read: the rollout's input and the message (token IDs and
        # all) are not dumped again.
        head = {
            "id": chat_completion.id,
            "created": chat_completion.created,
            "model": chat_completion.model,
            "choices": [
                {
                    "finish_reason": choice.finish_reason,
                    "native_finish_reason": getattr(choice, "native_finish_reason", None),
                }
            ],
            "usage": chat_completion.usage,
        }
        response = chat_completion_to_response_envelope(
            _plain(responses_create_params, exclude={"input"}),
            head,
            output,
            new_id=_new_id,
            keep_completion_id=preserve_envelope_id,
        )
        return NeMoGymResponse.model_validate(response)


def split_responses_input_output_items(items: list[Any]) -> tuple[list[Any], list[Any]]:
    """``(prompt items, generated items)``: ``items`` cut where the model's own items begin.

    The cut is at the first assistant message or model-only item (reasoning, a function or tool
    call); everything before it was replayed to the model as its prompt.
    """
    return split_input_output_items(items)


VLLMConverter = ResponsesConverter
"""NeMo Gym's earlier name for :class:`ResponsesConverter`."""
VLLMConverterResponsesToChatCompletionsState = ResponsesConverterState
"""NeMo Gym's earlier name for :class:`ResponsesConverterState`."""
