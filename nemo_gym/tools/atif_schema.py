"""The ATIF v1.7 subset ``gym eval export`` writes (Agent Trajectory Interchange Format, as NeMo
Gym 0.7.0 supports it): a trajectory of numbered steps from ``system``, ``user`` or ``agent``;
agent steps carry tool calls, their observations, reasoning and per-call metrics. Unknown fields
are rejected, so a conversion bug fails here instead of writing a file other tools misread.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ATIF_SCHEMA_VERSION = "ATIF-v1.7"


class _Atif(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AtifAgent(_Atif):
    """The agent that produced the trajectory."""

    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class AtifToolCall(_Atif):
    """One tool call of an agent step; ``arguments`` is a JSON object."""

    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class AtifObservationResult(_Atif):
    """What one tool call returned (``source_call_id`` names it)."""

    source_call_id: str | None = None
    content: str | None = None
    extra: dict[str, Any] | None = None


class AtifObservation(_Atif):
    """The results an agent step's tool calls returned."""

    results: list[AtifObservationResult]


class AtifStepMetrics(_Atif):
    """Token counts (and token IDs with log-probs, when the rollout has them) of one model call."""

    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class AtifFinalMetrics(_Atif):
    """Totals of the trajectory."""

    total_prompt_tokens: int | None = Field(default=None, ge=0)
    total_completion_tokens: int | None = Field(default=None, ge=0)
    total_cached_tokens: int | None = Field(default=None, ge=0)
    total_cost_usd: float | None = Field(default=None, ge=0)
    total_steps: int | None = Field(default=None, ge=0)
    extra: dict[str, Any] | None = None


class AtifStep(_Atif):
    """One step; only agent steps may carry model, reasoning, tool calls and metrics."""

    step_id: int = Field(ge=1)
    source: Literal["system", "user", "agent"]
    message: str
    timestamp: str | None = None
    model_name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[AtifToolCall] | None = None
    observation: AtifObservation | None = None
    metrics: AtifStepMetrics | None = None
    llm_call_count: int | None = Field(default=None, ge=0)
    is_copied_context: bool | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _agent_only(self) -> AtifStep:
        if self.source != "agent":
            for name in ("model_name", "reasoning_content", "tool_calls", "metrics"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is only valid on agent steps")
        return self


class AtifTrajectory(_Atif):
    """An ATIF v1.7 trajectory: steps numbered from 1, observations naming their step's tool calls."""

    schema_version: Literal["ATIF-v1.7"] = "ATIF-v1.7"
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: AtifAgent
    steps: list[AtifStep] = Field(min_length=1)
    notes: str | None = None
    final_metrics: AtifFinalMetrics | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> AtifTrajectory:
        for index, step in enumerate(self.steps):
            if step.step_id != index + 1:
                raise ValueError(f"steps[{index}].step_id: expected {index + 1}, got {step.step_id}")
            calls = {call.tool_call_id for call in step.tool_calls or []}
            for result in step.observation.results if step.observation else []:
                if result.source_call_id is not None and result.source_call_id not in calls:
                    raise ValueError(
                        f"step {step.step_id}: observation of unknown tool call {result.source_call_id!r}"
                    )
        final = self.final_metrics
        if final is not None and final.total_steps is not None and final.total_steps != len(self.steps):
            raise ValueError(
                f"final_metrics.total_steps is {final.total_steps}, but there are {len(self.steps)} steps"
            )
        return self
