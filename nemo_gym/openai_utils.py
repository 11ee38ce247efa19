"""Compatibility: NeMo Gym's ``nemo_gym.openai_utils``: validated pydantic types of the OpenAI objects on the wire.

The types live in :mod:`nemo_gym.models.openai_types` (Responses) and
:mod:`nemo_gym.models.openai_chat_types` (Chat Completions); the client in
:mod:`nemo_gym.models.openai_client`.

Built on the ``openai`` package's own types (subclassed, not re-declared), with what NeMo Gym
adds: defaults that let an item be built from its content alone
(``NeMoGymResponseOutputMessage(id=..., content=[NeMoGymResponseOutputText(text=..., annotations=[])])``),
``*ForTraining`` variants carrying the token IDs of a model call, an output-item union that also
accepts the input items agents put in trajectories, and request models
(:class:`NeMoGymResponseCreateParamsNonStreaming`, :class:`NeMoGymChatCompletionCreateParamsNonStreaming`)
for what the ``openai`` package only types as ``TypedDict``.

Unknown fields pass through (the ``openai`` models allow extras): a row's token IDs or a
provider's extension fields survive validation. :class:`NeMoGymResponse` and the create-params
model also answer ``get``/``[]`` with the JSON value of a field, so code written for plain
dict bodies reads them unchanged.
"""

from __future__ import annotations

from nemo_gym.models.openai_chat_types import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionAssistantMessageForTrainingParam,
    NeMoGymChatCompletionAssistantMessageParam,
    NeMoGymChatCompletionContentPartTextParam,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionMessage,
    NeMoGymChatCompletionMessageForTraining,
    NeMoGymChatCompletionMessageParam,
    NeMoGymChatCompletionMessageToolCall,
    NeMoGymChatCompletionMessageToolCallFunctionParam,
    NeMoGymChatCompletionMessageToolCallParam,
    NeMoGymChatCompletionOutputMessage,
    NeMoGymChatCompletionSystemMessageParam,
    NeMoGymChatCompletionToolMessageParam,
    NeMoGymChatCompletionUserMessageParam,
    NeMoGymChoice,
    NeMoGymFunction,
    NeMoGymFunctionToolParam,
    NeMoGymResponseInputTextParam,
)
from nemo_gym.models.openai_client import (
    MAX_NUM_TRIES,
    RATE_LIMIT_ERROR_CODES,
    RETRY_ERROR_CODES,
    NeMoGymAsyncOpenAI,
    OpenAIEndpointError,  # what NeMoGymAsyncOpenAI raises for an error status (this package's)
)
from nemo_gym.models.openai_types import (
    CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS,
    REQUIRED_TOKEN_METADATA_FIELDS,
    RESPONSES_TO_TRAIN,
    TOKEN_METADATA_FIELDS,
    NeMoGymContent,
    NeMoGymEasyInputMessage,
    NeMoGymEasyInputMessageForTraining,
    NeMoGymFunctionCallOutput,
    NeMoGymMessage,
    NeMoGymMessageForTraining,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionCallOutput,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseInput,
    NeMoGymResponseInputItem,
    NeMoGymResponseInputText,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseMcpCall,
    NeMoGymResponseOutputItem,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputRefusal,
    NeMoGymResponseOutputText,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseReasoningItemForTraining,
    NeMoGymResponseUsage,
    NeMoGymSummary,
    TokenIDLogProbMixin,
    TokenIDLogProbTypedDictMixin,
    accumulate_response_usage,
)

__all__ = [
    "CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS",
    "MAX_NUM_TRIES",
    "NeMoGymAsyncOpenAI",
    "OpenAIEndpointError",
    "NeMoGymChatCompletion",
    "NeMoGymChatCompletionAssistantMessageForTrainingParam",
    "NeMoGymChatCompletionAssistantMessageParam",
    "NeMoGymChatCompletionContentPartTextParam",
    "NeMoGymChatCompletionCreateParamsNonStreaming",
    "NeMoGymChatCompletionMessage",
    "NeMoGymChatCompletionMessageForTraining",
    "NeMoGymChatCompletionMessageParam",
    "NeMoGymChatCompletionMessageToolCall",
    "NeMoGymChatCompletionMessageToolCallFunctionParam",
    "NeMoGymChatCompletionMessageToolCallParam",
    "NeMoGymChatCompletionOutputMessage",
    "NeMoGymChatCompletionSystemMessageParam",
    "NeMoGymChatCompletionToolMessageParam",
    "NeMoGymChatCompletionUserMessageParam",
    "NeMoGymChoice",
    "NeMoGymContent",
    "NeMoGymEasyInputMessage",
    "NeMoGymEasyInputMessageForTraining",
    "NeMoGymFunction",
    "NeMoGymFunctionCallOutput",
    "NeMoGymFunctionToolParam",
    "NeMoGymMessage",
    "NeMoGymMessageForTraining",
    "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming",
    "NeMoGymResponseFunctionCallOutput",
    "NeMoGymResponseFunctionToolCall",
    "NeMoGymResponseFunctionToolCallForTraining",
    "NeMoGymResponseInput",
    "NeMoGymResponseInputItem",
    "NeMoGymResponseInputText",
    "NeMoGymResponseInputTextParam",
    "NeMoGymResponseInputTokensDetails",
    "NeMoGymResponseMcpCall",
    "NeMoGymResponseOutputItem",
    "NeMoGymResponseOutputMessage",
    "NeMoGymResponseOutputMessageForTraining",
    "NeMoGymResponseOutputRefusal",
    "NeMoGymResponseOutputText",
    "NeMoGymResponseOutputTokensDetails",
    "NeMoGymResponseReasoningItem",
    "NeMoGymResponseReasoningItemForTraining",
    "NeMoGymResponseUsage",
    "NeMoGymSummary",
    "RATE_LIMIT_ERROR_CODES",
    "REQUIRED_TOKEN_METADATA_FIELDS",
    "RESPONSES_TO_TRAIN",
    "RETRY_ERROR_CODES",
    "TOKEN_METADATA_FIELDS",
    "TokenIDLogProbMixin",
    "TokenIDLogProbTypedDictMixin",
    "accumulate_response_usage",
]
