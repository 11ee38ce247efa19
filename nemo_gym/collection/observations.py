"""The records an agent harness reports about a rollout, and the per-rollout trajectory.

NeMo Gym's ``nemo_gym.rollout_observability`` models (re-exported there): an
:class:`AgentObservationBundle` holds typed records, in no particular order (agent invocations
with the model calls they made, by :class:`ModelCallRef`; tool calls; context compactions;
sandboxes) plus :class:`ObservationGap` entries for evidence a producer could not provide. A
:class:`TrajectoryRecord` is the per-rollout view: invocations, numbered turns, model calls and
tool calls. Every model forbids unknown fields, so a producer's typo fails loudly.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_gym.serving.server import ModelServerRef

NonNegative = Annotated[float, Field(ge=0)]


class ObservationModel(BaseModel):
    """Base of the records: unknown fields are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelCallRef(ObservationModel):
    """One model call, by ``model_call_id`` or by the model server and its ``response_id``."""

    model_call_id: str | None = None
    model_ref: ModelServerRef | None = None
    response_id: str | None = None

    @model_validator(mode="after")
    def _joinable(self) -> Self:
        if not self.model_call_id and not (self.model_ref is not None and self.response_id):
            raise ValueError("a model call needs model_call_id, or both model_ref and response_id")
        return self


class TrajectoryTokenStats(ObservationModel):
    """Token counts of one model call (each optional)."""

    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)


class TrajectoryResponseMetadata(ObservationModel):
    """How one model call was answered (status, finish reason, where the answer came from, latency)."""

    response_id: str | None = None
    model_ref: ModelServerRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    upstream_attempted: bool | None = None
    response_source: Literal["upstream", "local"] | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None
    error_category: str | None = None
    latency_ttft_ms: NonNegative | None = None


class TrajectoryModelCall(ObservationModel):
    """One model call in a trajectory: timing, request, response, metadata and tokens."""

    model_call_id: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: NonNegative | None = None
    request: Any = None
    response: Any = None
    response_metadata: TrajectoryResponseMetadata = Field(default_factory=TrajectoryResponseMetadata)
    token_stats: TrajectoryTokenStats = Field(default_factory=TrajectoryTokenStats)


class TrajectoryTurn(ObservationModel):
    """One numbered turn (from 1) of one invocation, with the model calls it made."""

    invocation_id: str
    task_id: str
    rollout_id: str
    turn_no: int = Field(ge=1)
    timestamp: float
    question: Any = None
    answer: Any = None
    reasoning_content: Any = None
    resolved: bool | None = None
    step_count: int = Field(ge=0)
    model_calls: list[ModelCallRef] = Field(default_factory=list)


class ConversationItem(BaseModel):
    """One Responses API input item of a conversation (a message, function call or output, ...):
    every field kept, read as attributes (``item.type``, ``item.call_id``); a message without
    ``type`` is a ``"message"``."""

    model_config = ConfigDict(extra="allow")

    type: str = "message"

    @model_validator(mode="before")
    @classmethod
    def _from_model(cls, value: Any) -> Any:
        # A typed item (an openai model) is taken as its fields.
        return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


class AgentInvocation(ObservationModel):
    """One run of an agent (a sub-agent names its parent and the tool call that spawned it)."""

    kind: Literal["agent_invocation"] = "agent_invocation"
    invocation_id: str
    parent_invocation_id: str | None = None
    spawned_by_tool_call_id: str | None = None
    status: Literal["completed", "failed", "incomplete", "unknown"] = "unknown"
    duration_ms: NonNegative | None = None
    error_type: str | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    # Typed items (NeMo Gym's NeMoGym* input items) stay the objects they are, so that a harness
    # can look for its function-call outputs with isinstance; plain mappings become ConversationItem.
    conversation: list[Any] = Field(default_factory=list)

    @field_validator("conversation")
    @classmethod
    def _conversation_items(cls, items: list[Any]) -> list[Any]:
        return [
            item if isinstance(item, BaseModel) else ConversationItem.model_validate(item) for item in items
        ]


class ToolCallObservation(ObservationModel):
    """One tool call of an invocation: timing (and who measured it), status, error."""

    kind: Literal["tool_call"] = "tool_call"
    invocation_id: str
    tool_call_id: str
    sandbox_id: str | None = None
    tool_name: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: NonNegative | None = None
    timing_source: Literal["executor", "artifact", "harness"] | None = None
    status: Literal["completed", "failed", "timeout", "cancelled", "incomplete", "unknown"] = "unknown"
    error_type: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if (
            self.started_at is not None
            and self.completed_at is not None
            and self.completed_at < self.started_at
        ):
            raise ValueError("completed_at must not be before started_at")
        return self


class TrajectoryToolCall(ToolCallObservation):
    """A tool call in a trajectory, with its output."""

    output: Any = None


class SandboxObservation(ObservationModel):
    """One sandbox: its role, provider, outcome and measured resource use."""

    kind: Literal["sandbox"] = "sandbox"
    role: Literal["agent", "verifier", "environment"]
    provider: str | None = None
    sandbox_id: str | None = None
    outcome: Literal["completed", "failed", "timeout", "oom", "sandbox_error", "cancelled", "unknown"] = (
        "unknown"
    )
    exit_code: int | None = None
    wall_time_s: NonNegative | None = None
    cpu_time_s: NonNegative | None = None
    peak_memory_mib: NonNegative | None = None
    resource_usage_source: str | None = None
    error_type: str | None = None


class ContextCompactionObservation(ObservationModel):
    """One compaction of an invocation's context: tokens before and after, outcome, summary."""

    kind: Literal["context_compaction"] = "context_compaction"
    invocation_id: str
    observed_at: float | None = None
    trigger: str | None = None
    tokens_before: int | None = Field(default=None, ge=0)
    tokens_after: int | None = Field(default=None, ge=0)
    outcome: Literal["completed", "failed", "aborted", "unknown"] = "unknown"
    summary: str | None = None
    first_kept_item_id: str | None = None
    before_model_call: ModelCallRef | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    after_model_call: ModelCallRef | None = None


class ObservationGap(ObservationModel):
    """Evidence a producer could not provide (``code`` says which)."""

    code: str
    invocation_id: str | None = None
    detail: str | None = None


AgentObservationRecord = Annotated[
    AgentInvocation | ToolCallObservation | ContextCompactionObservation | SandboxObservation,
    Field(discriminator="kind"),
]


class AgentObservationBundle(ObservationModel):
    """A producer's records of one rollout; invocation ids are unique and parents form no cycle."""

    source: str
    records: list[AgentObservationRecord] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _identities(self) -> Self:
        invocations = [r for r in self.records if isinstance(r, AgentInvocation)]
        parents = {r.invocation_id: r.parent_invocation_id for r in invocations}
        if len(parents) != len(invocations):
            raise ValueError("invocation_id must be unique within an observation bundle")
        for start in parents:
            seen, current = set(), start
            while current in parents:
                if current in seen:
                    raise ValueError("parent_invocation_id must not form a cycle")
                seen.add(current)
                current = parents[current]  # type: ignore[assignment]
        return self


class TrajectoryRecord(ObservationModel):
    """One rollout's trajectory: unique invocations and model-call ids, turns that belong to it."""

    schema_version: Literal["1.0"] = "1.0"
    task_id: str
    rollout_id: str
    invocations: list[AgentInvocation] = Field(default_factory=list)
    turns: list[TrajectoryTurn] = Field(default_factory=list)
    model_calls: list[TrajectoryModelCall] = Field(default_factory=list)
    tool_calls: list[TrajectoryToolCall] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _identities(self) -> Self:
        ids = [i.invocation_id for i in self.invocations]
        if len(ids) != len(set(ids)):
            raise ValueError("invocation_id must be unique within a trajectory")
        call_ids = [c.model_call_id for c in self.model_calls if c.model_call_id]
        if len(call_ids) != len(set(call_ids)):
            raise ValueError("model_call_id must be unique within a trajectory")
        turns: set[tuple[str, int]] = set()
        for turn in self.turns:
            if (turn.task_id, turn.rollout_id) != (self.task_id, self.rollout_id):
                raise ValueError("a turn's task_id and rollout_id must be the trajectory's")
            if (turn.invocation_id, turn.turn_no) in turns:
                raise ValueError("turn numbers must be unique within an invocation")
            turns.add((turn.invocation_id, turn.turn_no))
        return self
