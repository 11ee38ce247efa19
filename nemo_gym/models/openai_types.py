"""NeMo Gym's validated pydantic types of the OpenAI Responses objects: items, requests, responses.

Built on the ``openai`` package's own types (subclassed, not re-declared), with what NeMo Gym
adds: defaults that let an item be built from its content alone, ``*ForTraining`` variants
carrying the token IDs of a model call, an output-item union that also accepts the input items
agents put in trajectories, and a request model for what the ``openai`` package only types as
``TypedDict``. Unknown fields pass through. Served at NeMo Gym's path, :mod:`nemo_gym.openai_utils`
(the Chat Completions types are in :mod:`nemo_gym.models.openai_chat_types`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from openai.types.responses import (
    EasyInputMessage,
    Response,
    ResponseFunctionToolCall,
    ResponseFunctionToolCallOutputItem,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseUsage,
    Tool,
)
from openai.types.responses.response_output_item import McpCall
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    FieldSerializationInfo,
    SerializerFunctionWrapHandler,
    Tag,
    TypeAdapter,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
)
from typing_extensions import TypedDict

from nemo_gym.models.token_usage import NEWER_INPUT_DETAILS, add_usage, without_unknown

REQUIRED_TOKEN_METADATA_FIELDS = frozenset(
    {"prompt_token_ids", "generation_token_ids", "generation_log_probs"}
)
TOKEN_METADATA_FIELDS = REQUIRED_TOKEN_METADATA_FIELDS | {"routed_experts"}
CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS = frozenset({"chat_template_kwargs", "thinking", "output_config"})
_STATUS = Literal["in_progress", "completed", "incomplete"]


class _FieldAccess:
    """``get``/``[]``/``in`` on a model, answering each field's JSON value, as on a plain dict body."""

    def _plain(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)  # type: ignore[attr-defined,no-any-return]

    def get(self, key: str, default: Any = None) -> Any:
        """The JSON value of field ``key`` (``default`` when unset)."""
        return self._plain().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self._plain()[key]

    def __contains__(self, key: object) -> bool:
        return key in self._plain()

    def keys(self) -> Any:
        """The names of the fields that are set."""
        return self._plain().keys()


class TokenIDLogProbMixin(BaseModel):
    """The token IDs and log-probabilities of the model call that produced an item."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: str | list[list[list[int]]] | None = None


class TokenIDLogProbTypedDictMixin(TypedDict):
    """:class:`TokenIDLogProbMixin` as a ``TypedDict`` (for chat message params)."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


def _token_metadata_complete(value: Any) -> Any:
    # All three token fields or none: a partial set cannot be spliced and is a caller's mistake.
    if isinstance(value, dict):
        present = TOKEN_METADATA_FIELDS.intersection(value)
        missing = REQUIRED_TOKEN_METADATA_FIELDS - present
        if present and missing:
            raise ValueError(
                f"token metadata must include all of its fields; missing: {', '.join(sorted(missing))}"
            )
    return value


# ---- items ---------------------------------------------------------------------------------


class NeMoGymSummary(Summary):
    """A reasoning summary part."""

    type: Literal["summary_text"] = "summary_text"


class NeMoGymResponseOutputText(ResponseOutputText):
    """An ``output_text`` content part."""

    annotations: list[Any] = Field(default_factory=list)  # type: ignore[assignment]
    type: Literal["output_text"] = "output_text"


class NeMoGymResponseOutputRefusal(ResponseOutputRefusal):
    """A ``refusal`` content part."""

    type: Literal["refusal"] = "refusal"


NeMoGymContent = Annotated[
    NeMoGymResponseOutputText | NeMoGymResponseOutputRefusal, Field(discriminator="type")
]


class NeMoGymResponseOutputMessage(ResponseOutputMessage):
    """An assistant message in a response's output (role, status and type defaulted)."""

    content: list[NeMoGymContent]  # type: ignore[assignment]
    role: Literal["assistant"] = "assistant"
    status: _STATUS = "completed"
    type: Literal["message"] = "message"


def _part_dict(value: Any) -> Any:
    # Parts may be given as models (NeMoGymResponseInputText(...)); they are kept as dicts.
    return value.model_dump(exclude_none=True) if isinstance(value, BaseModel) else value


_Part = Annotated[dict[str, Any], BeforeValidator(_part_dict)]


class NeMoGymEasyInputMessage(EasyInputMessage):
    """A message in a request's input: ``content`` a string or a list of input parts."""

    content: str | list[_Part]  # type: ignore[assignment]
    type: Literal["message"] = "message"  # type: ignore[assignment]


class NeMoGymMessage(BaseModel):
    """A user, system or developer message whose content is a list of input parts."""

    model_config = ConfigDict(extra="allow")

    content: list[_Part]
    role: Literal["user", "system", "developer"]
    status: _STATUS = "completed"
    type: Literal["message"] = "message"


class NeMoGymFunctionCallOutput(BaseModel):
    """A tool's result sent back to the model (the ``openai`` package types it as a ``TypedDict`` only)."""

    model_config = ConfigDict(extra="allow")

    call_id: str
    output: str | list[_Part]
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    status: _STATUS | None = None


# Fields the installed ``openai`` package has and NeMo Gym's pinned one (2.44.0) lacks. Left
# unset, they are left out of a dump: NeMo Gym's agents compare dumps with dicts of its keys
# (aviary_agent's function call, critpt_agent's summed usage), and an unset ``async`` dumped by
# alias (the wire) and by name (``async_``) then agree.
NEWER_OPENAI_FIELDS = (
    "async",
    "async_",
    "caller",
    "access_programs",
    "image",
    "input_transformations",
    "prompt_cache_diagnostics",
    "prompt_cache_options",
    "tool_usage",
    *NEWER_INPUT_DETAILS,
)


class _NeMoGymKeys(BaseModel):
    """Dumps without the unset fields of :data:`NEWER_OPENAI_FIELDS` (and the class's own ``_newer``)."""

    _newer: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _with_nemo_gym_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_unknown(handler(self), (*NEWER_OPENAI_FIELDS, *self._newer))


class NeMoGymResponseReasoningItem(ResponseReasoningItem, _NeMoGymKeys):
    """A reasoning item (``summary`` a list, ``type`` defaulted, no ``status``).

    A ``status`` given is dropped, as NeMo Gym does: OpenAI refuses a status on a reasoning
    item sent back in the next request's input. ``content`` is dumped only when it holds
    something: NeMo Gym 0.3.0's and 0.4.0's reasoning item has no ``content`` and their agents'
    tests compare dumps exactly, while 0.6.0's and 0.7.0's, which expect ``content: None``,
    compare them without their nulls.
    """

    _newer = ("content",)

    summary: list[NeMoGymSummary]  # type: ignore[assignment]
    type: Literal["reasoning"] = "reasoning"
    status: None = Field(default=None, exclude=True)  # type: ignore[assignment]

    @field_validator("status", mode="before")
    @classmethod
    def _drop_status(cls, value: Any) -> None:
        return None


class NeMoGymResponseFunctionToolCall(ResponseFunctionToolCall, _NeMoGymKeys):
    """A function call the model made (``type`` defaulted)."""

    # ``async_`` (wire name ``async``) is read back by either name: a model dumped without
    # aliases and validated again must not grow an ``async_`` extra.
    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    type: Literal["function_call"] = "function_call"


class NeMoGymResponseFunctionCallOutput(ResponseFunctionToolCallOutputItem, _NeMoGymKeys):
    """A function call's result as a provider lists it in output (with ``id`` and ``status``)."""

    _newer = ("name", "namespace")


class NeMoGymResponseMcpCall(McpCall):
    """A hosted-MCP tool call, as some endpoints return it (``type`` defaulted; ``id``/``server_label``/``status`` relaxed)."""

    type: Literal["mcp_call"] = "mcp_call"
    id: str | None = None  # type: ignore[assignment]
    server_label: str | None = None  # type: ignore[assignment]
    status: str | None = None  # type: ignore[assignment]


class NeMoGymResponseInputText(BaseModel):
    """An ``input_text`` content part as a model."""

    model_config = ConfigDict(extra="allow")

    text: str
    type: Literal["input_text"] = "input_text"


class NeMoGymEasyInputMessageForTraining(NeMoGymEasyInputMessage, TokenIDLogProbMixin):
    """:class:`NeMoGymEasyInputMessage` with its model call's token IDs."""


class NeMoGymMessageForTraining(NeMoGymMessage, TokenIDLogProbMixin):
    """:class:`NeMoGymMessage` with its model call's token IDs."""


class NeMoGymResponseOutputMessageForTraining(NeMoGymResponseOutputMessage, TokenIDLogProbMixin):
    """:class:`NeMoGymResponseOutputMessage` with its model call's token IDs."""


class NeMoGymResponseFunctionToolCallForTraining(NeMoGymResponseFunctionToolCall, TokenIDLogProbMixin):
    """:class:`NeMoGymResponseFunctionToolCall` with its model call's token IDs."""


class NeMoGymResponseReasoningItemForTraining(NeMoGymResponseReasoningItem, TokenIDLogProbMixin):
    """:class:`NeMoGymResponseReasoningItem` with its model call's token IDs."""


RESPONSES_TO_TRAIN: dict[type, type] = {
    NeMoGymEasyInputMessage: NeMoGymEasyInputMessageForTraining,
    NeMoGymMessage: NeMoGymMessageForTraining,
    NeMoGymResponseOutputMessage: NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseFunctionToolCall: NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseReasoningItem: NeMoGymResponseReasoningItemForTraining,
}

# Every other output item type the openai package knows, by its ``type`` literal.
_OPENAI_ITEMS: dict[str, type] = {}
for _member in ResponseOutputItem.__origin__.__args__:  # type: ignore[attr-defined]
    _literal = _member.model_fields["type"].annotation
    for _value in getattr(_literal, "__args__", ()):
        _OPENAI_ITEMS.setdefault(_value, _member)
_OPENAI_ITEMS["mcp_call"] = NeMoGymResponseMcpCall
_OURS = {
    "output_message": NeMoGymResponseOutputMessage,
    "easy_message": NeMoGymEasyInputMessage,
    "input_message": NeMoGymMessage,
    "function_call": NeMoGymResponseFunctionToolCall,
    "function_call_output": NeMoGymResponseFunctionCallOutput,
    "function_call_output_input": NeMoGymFunctionCallOutput,
    "reasoning": NeMoGymResponseReasoningItem,
}
_TAG_OF_CLASS: dict[type, str] = {cls: tag for tag, cls in _OURS.items()}
_TAG_OF_CLASS.update(
    {RESPONSES_TO_TRAIN[cls]: f"{tag}__training" for tag, cls in _OURS.items() if cls in RESPONSES_TO_TRAIN}
)
_TAG_OF_CLASS.update({cls: item_type for item_type, cls in _OPENAI_ITEMS.items()})


def _message_tag(value: dict[str, Any]) -> str:
    content = value.get("content")
    if value.get("role") in ("user", "system", "developer"):
        if isinstance(content, list) and value.get("status") in ("in_progress", "completed", "incomplete"):
            return "input_message"
        return "easy_message"
    if isinstance(content, list) and content:
        first = content[0]
        part_type = first.get("type") if isinstance(first, dict) else getattr(first, "type", None)
        if part_type in ("output_text", "refusal"):
            return "output_message"
    elif isinstance(content, list) and isinstance(value.get("id"), str):
        return "output_message"
    return "easy_message"


def _item_tag(value: Any) -> str | None:
    if not isinstance(value, dict):
        for cls in type(value).__mro__:
            if cls in _TAG_OF_CLASS:
                return _TAG_OF_CLASS[cls]
        return getattr(value, "type", None)
    item_type = value.get("type")
    if item_type == "message" or (item_type is None and "role" in value):
        tag = _message_tag(value)
    elif item_type == "function_call_output":
        complete = isinstance(value.get("id"), str) and value.get("status") in (
            "in_progress",
            "completed",
            "incomplete",
        )
        tag = "function_call_output" if complete else "function_call_output_input"
    elif item_type is None:
        if "arguments" in value and "call_id" in value:
            tag = "function_call"
        elif "call_id" in value and "output" in value:
            tag = "function_call_output_input"
        elif isinstance(value.get("summary"), list):
            tag = "reasoning"
        else:
            return None
    else:
        tag = item_type if item_type in _OURS or item_type in _OPENAI_ITEMS else "other"
    if tag in _OURS and _OURS[tag] in RESPONSES_TO_TRAIN and REQUIRED_TOKEN_METADATA_FIELDS.issubset(value):
        return f"{tag}__training"
    return tag


def _item_union() -> Any:
    members: list[Any] = [Annotated[cls, Tag(tag)] for tag, cls in _OURS.items()]
    members += [
        Annotated[RESPONSES_TO_TRAIN[cls], Tag(f"{tag}__training")]
        for tag, cls in _OURS.items()
        if cls in RESPONSES_TO_TRAIN
    ]
    members += [Annotated[cls, Tag(t)] for t, cls in _OPENAI_ITEMS.items() if t not in _OURS]
    # An item type newer than the installed openai package passes through as it came.
    members.append(Annotated[dict[str, Any], Tag("other")])
    union = Union.__getitem__(tuple(members))  # type: ignore[attr-defined]
    return Annotated[
        union,
        Discriminator(_item_tag),
        BeforeValidator(_token_metadata_complete),
    ]


NeMoGymResponseOutputItem = _item_union()
NeMoGymResponseInputItem = NeMoGymResponseOutputItem
NeMoGymResponseInput = list[NeMoGymResponseInputItem]  # type: ignore[valid-type]


# ---- requests and responses ----------------------------------------------------------------


class NeMoGymResponseCreateParamsNonStreaming(_FieldAccess, BaseModel):
    """A Responses API create request (``openai`` types it as a ``TypedDict``; this validates it).

    Fields the installed ``openai`` package does not know pass through unchanged.
    """

    model_config = ConfigDict(extra="allow")

    input: str | NeMoGymResponseInput = ""  # type: ignore[valid-type]
    instructions: str | None = None
    model: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    temperature: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] | None = "auto"
    tools: list[dict[str, Any]] | None = Field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    stream: Literal[False] | None = None
    # The rest of OpenAI's request fields: NeMo Gym's model adapters read them as attributes
    # (azure_openai_model forwards background, prompt, service_tier).
    background: bool | None = None
    include: list[str] | None = None
    prompt: dict[str, Any] | None = None
    service_tier: str | None = None
    store: bool | None = None
    context_management: list[dict[str, Any]] | None = None
    conversation: str | dict[str, Any] | None = None
    moderation: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None


class NeMoGymResponseInputTokensDetails(InputTokensDetails, _NeMoGymKeys):
    """Input token details; ``cached_tokens`` may be unknown."""

    cached_tokens: int | None = 0  # type: ignore[assignment]
    cache_write_tokens: int | None = None  # type: ignore[assignment]


class NeMoGymResponseOutputTokensDetails(OutputTokensDetails):
    """Output token details; ``reasoning_tokens`` may be unknown."""

    reasoning_tokens: int | None = 0  # type: ignore[assignment]


class NeMoGymResponseUsage(ResponseUsage):
    """Token usage of a response."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_tokens_details: NeMoGymResponseInputTokensDetails = Field(
        default_factory=NeMoGymResponseInputTokensDetails
    )  # type: ignore[assignment]
    output_tokens_details: NeMoGymResponseOutputTokensDetails = Field(
        default_factory=NeMoGymResponseOutputTokensDetails
    )  # type: ignore[assignment]

    @classmethod
    def sum_from_list(cls, usages: Any) -> NeMoGymResponseUsage:
        """The sum of ``usages`` (zero for none); a detail count unknown in any of them stays unknown."""
        total: NeMoGymResponseUsage | None = None
        for usage in usages:
            total = accumulate_response_usage(total, usage)
        return total if total is not None else cls()


def accumulate_response_usage(
    total: NeMoGymResponseUsage | None, additional: NeMoGymResponseUsage | None
) -> NeMoGymResponseUsage | None:
    """``total`` plus ``additional`` (either may be None), details included; inputs unchanged."""
    if additional is None:
        return total
    if total is None:
        return additional.model_copy(deep=True)
    return add_usage(total.model_copy(deep=True), additional)  # type: ignore[no-any-return]


_TOOL: TypeAdapter[Any] = TypeAdapter(Tool)


def _typed_tool(tool: Any) -> Any:
    """``tool`` as the ``openai`` SDK's typed tool (a ``FunctionTool`` for a function), as NeMo
    Gym's response (the SDK's ``Response``) holds it; a tool the SDK does not know stays as given."""
    if not isinstance(tool, dict):
        return tool
    try:
        return _TOOL.validate_python(tool, by_alias=True, by_name=True)
    except ValidationError:
        return tool


def _dump_tool(tool: Any, info: FieldSerializationInfo) -> Any:
    """A typed tool dumped with the fields it was given (a dict tool comes back as it was sent:
    no ``strict: null`` or ``description: null`` added); anything else as it is."""
    if not isinstance(tool, BaseModel):
        return tool
    return tool.model_dump(
        mode=info.mode, by_alias=info.by_alias, exclude_unset=True, exclude_none=info.exclude_none
    )


def _attr(value: Any, key: str) -> Any:
    """A field of a plain dict or of a typed item."""
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


class NeMoGymResponse(_FieldAccess, Response, _NeMoGymKeys):
    """A Responses API response object with NeMo Gym's item types.

    As in NeMo Gym (and the ``openai`` model it extends), ``id``, ``created_at``, ``model``,
    ``object``, ``output``, ``parallel_tool_calls``, ``tool_choice`` and ``tools`` are required:
    ``NeMoGymResponse.model_validate({})`` fails naming them. A verify request's ``response``
    is taken more leniently (the envelope filled from :data:`nemo_gym.response_items.ENVELOPE_DEFAULTS`): a body carrying only ``output``
    is still a response there.
    """

    id: str
    created_at: float
    model: str  # type: ignore[assignment]
    object: Literal["response"]
    output: list[NeMoGymResponseOutputItem]  # type: ignore[valid-type,assignment]
    parallel_tool_calls: bool | None  # type: ignore[assignment]
    tool_choice: Any
    tools: list[Any]  # type: ignore[assignment]
    usage: NeMoGymResponseUsage | None = None

    @field_validator("tools", mode="after")
    @classmethod
    def _typed_tools(cls, tools: list[Any]) -> list[Any]:
        """Each tool typed as in NeMo Gym, so a response rebuilt from its dump equals the original."""
        return [_typed_tool(tool) for tool in tools]

    @field_serializer("tools", mode="plain")
    def _tools_as_given(self, tools: list[Any], info: FieldSerializationInfo) -> list[Any]:
        """Each typed tool dumped with the fields it was given (see :func:`_dump_tool`)."""
        return [_dump_tool(tool, info) for tool in tools]

    @property
    def output_text(self) -> str:
        """Every ``output_text`` part of the assistant's messages, joined (the SDK's property,
        which may assume every output message is the assistant's: here one of another role, a
        user message a harness put in the output, adds nothing)."""
        texts: list[str] = []
        for item in self.output:
            item_type, role, content = (_attr(item, key) for key in ("type", "role", "content"))
            if item_type != "message" or role != "assistant" or not isinstance(content, list):
                continue
            texts.extend(
                _attr(part, "text") or "" for part in content if _attr(part, "type") == "output_text"
            )
        return "".join(texts)
