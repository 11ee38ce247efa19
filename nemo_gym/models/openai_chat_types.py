"""NeMo Gym's validated pydantic types of the OpenAI Chat Completions objects and request params.

Served at NeMo Gym's path, :mod:`nemo_gym.openai_utils`; the Responses types are in
:mod:`nemo_gym.models.openai_types`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_assistant_message_param import ChatCompletionAssistantMessageParam
from openai.types.chat.chat_completion_content_part_text_param import ChatCompletionContentPartTextParam
from openai.types.chat.chat_completion_message_param import ChatCompletionMessageParam
from openai.types.chat.chat_completion_message_tool_call_param import ChatCompletionMessageToolCallParam
from openai.types.chat.chat_completion_system_message_param import ChatCompletionSystemMessageParam
from openai.types.chat.chat_completion_tool_message_param import ChatCompletionToolMessageParam
from openai.types.chat.chat_completion_user_message_param import ChatCompletionUserMessageParam
from openai.types.responses import (
    FunctionToolParam,
    ResponseInputTextParam,
)
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)
from typing_extensions import TypedDict

from nemo_gym.models.openai_types import (
    CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS,
    TokenIDLogProbMixin,
    _FieldAccess,
    _NeMoGymKeys,
    _token_metadata_complete,
)


class NeMoGymFunction(BaseModel):
    """A chat tool call's function: name and JSON arguments."""

    model_config = ConfigDict(extra="allow")

    arguments: str
    name: str


class NeMoGymChatCompletionMessageToolCall(ChatCompletionMessageFunctionToolCall):
    """A chat tool call."""

    function: NeMoGymFunction  # type: ignore[assignment]
    type: Literal["function"] = "function"


class NeMoGymChatCompletionMessage(ChatCompletionMessage):
    """An assistant chat message."""

    tool_calls: list[NeMoGymChatCompletionMessageToolCall] | None = None  # type: ignore[assignment]
    role: Literal["assistant"] = "assistant"


class NeMoGymChatCompletionMessageForTraining(NeMoGymChatCompletionMessage, TokenIDLogProbMixin):
    """:class:`NeMoGymChatCompletionMessage` with its model call's token IDs."""


NeMoGymChatCompletionOutputMessage = Annotated[
    NeMoGymChatCompletionMessageForTraining | NeMoGymChatCompletionMessage,
    Field(union_mode="left_to_right"),
    BeforeValidator(_token_metadata_complete),
]
"""An assistant message: the training variant when it carries its call's token IDs."""


class NeMoGymChoice(Choice):
    """One chat completion choice."""

    message: NeMoGymChatCompletionOutputMessage  # type: ignore[assignment]


class NeMoGymChatCompletion(ChatCompletion):
    """A chat completion object."""

    choices: list[NeMoGymChoice]  # type: ignore[assignment]
    object: Literal["chat.completion"] = "chat.completion"


class NeMoGymChatCompletionCreateParamsNonStreaming(_FieldAccess, _NeMoGymKeys):
    """A Chat Completions create request (messages as dicts); unknown fields pass through.

    The provider extensions are dumped only when given: NeMo Gym 0.6.0's request has none of them
    and its ``vllm_model`` tests compare a converted request's whole dump, while 0.7.0's exclude
    them from that comparison.
    """

    model_config = ConfigDict(extra="allow")
    _newer = tuple(sorted(CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS))

    messages: list[dict[str, Any]]
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    stream: Literal[False] | None = None
    # The provider extensions (CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS): objects when given, so a
    # malformed one is a 422 at the door rather than a failure inside the adapter.
    chat_template_kwargs: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    # The rest of OpenAI's chat request fields, declared (as NeMo Gym declares them) so that a dump
    # lists them and adapters can read them as attributes.
    audio: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, int] | None = None
    metadata: dict[str, str] | None = None
    modalities: list[str] | None = None
    parallel_tool_calls: bool = True
    prediction: dict[str, Any] | None = None
    presence_penalty: float | None = None
    reasoning_effort: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    verbosity: str | None = None


# The chat request param TypedDicts under NeMo Gym's names (the openai package's own).
NeMoGymChatCompletionMessageParam = ChatCompletionMessageParam
NeMoGymChatCompletionUserMessageParam = ChatCompletionUserMessageParam
NeMoGymChatCompletionSystemMessageParam = ChatCompletionSystemMessageParam
NeMoGymChatCompletionAssistantMessageParam = ChatCompletionAssistantMessageParam
NeMoGymChatCompletionToolMessageParam = ChatCompletionToolMessageParam
NeMoGymChatCompletionMessageToolCallParam = ChatCompletionMessageToolCallParam
NeMoGymChatCompletionContentPartTextParam = ChatCompletionContentPartTextParam
NeMoGymFunctionToolParam = FunctionToolParam
NeMoGymResponseInputTextParam = ResponseInputTextParam


class NeMoGymChatCompletionMessageToolCallFunctionParam(TypedDict):
    """A chat tool call's function as a request param."""

    arguments: str
    name: str


class NeMoGymChatCompletionAssistantMessageForTrainingParam(ChatCompletionAssistantMessageParam, total=False):
    """An assistant message param with its model call's token IDs."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
