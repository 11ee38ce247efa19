"""Compatibility: NeMo Gym's episode identity and envelope types (``nemo_gym.episode_types``).

An *episode* is one attempt at one task: ``EpisodeId`` names the attempt (a rollout id and an
attempt number), ``TaskId`` names the task inside a taskset. ``BaseEpisodeRequest`` carries
both with the task's typed input; ``BaseEpisodeResponse`` carries either a result or an
``EpisodeFailure``, never both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from nemo_gym.failure_kinds import FailureStage, validate_failure_kind

_ATTEMPT_SUFFIX = re.compile(r"-a[1-9][0-9]*$")


class EpisodeId(BaseModel):
    """One attempt of one rollout: ``rollout_id`` (letters, digits, ``._-``) and ``attempt`` (0 first)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _no_attempt_suffix(cls, rollout_id: str) -> str:
        # capture_key appends "-a<N>"; an id already ending so could collide with another's key.
        if _ATTEMPT_SUFFIX.search(rollout_id):
            raise ValueError("rollout_id must not end with '-a<N>' (reserved for the attempt number)")
        return rollout_id

    @property
    def capture_key(self) -> str:
        """The rollout id for the first attempt, ``<rollout_id>-a<attempt>`` for later ones."""
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"


class TaskId(BaseModel):
    """One task: the ``taskset`` it belongs to (``<environment>:<taskset>`` by convention) and its ``task_id``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


def is_materialized_task_row(row: Mapping[str, object]) -> bool:
    """Whether a row is shaped as a materialized task (a ``task_id`` mapping and a ``task_input``)."""
    return isinstance(row.get("task_id"), Mapping) and "task_input" in row


class EpisodeFailure(BaseModel):
    """Why an episode failed (``failure_reason``), whether to stop retrying it (``terminal``),
    and optionally its ``failure_kind`` and the ``stage`` it failed in (omitted when unknown)."""

    model_config = ConfigDict(extra="forbid")

    failure_reason: str = Field(max_length=2000)
    terminal: bool
    failure_kind: str | None = None
    stage: FailureStage | None = None

    @field_validator("failure_kind")
    @classmethod
    def _known_kind(cls, value: str | None) -> str | None:
        return validate_failure_kind(value)

    @model_serializer(mode="wrap")
    def _drop_unknowns(self, handler: Any) -> Any:
        data = handler(self)
        for key in ("failure_kind", "stage"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


TaskInputT = TypeVar("TaskInputT", bound=BaseModel)
EpisodeResultT = TypeVar("EpisodeResultT")


class MaterializedTask(BaseModel, Generic[TaskInputT]):
    """A task's identity and its typed input."""

    model_config = ConfigDict(extra="forbid")

    task_id: TaskId
    task_input: TaskInputT


class BaseEpisodeRequest(BaseModel, Generic[TaskInputT]):
    """Run one episode: which attempt, and the task."""

    model_config = ConfigDict(extra="forbid")

    episode_id: EpisodeId
    task: MaterializedTask[TaskInputT]


class BaseEpisodeResponse(BaseModel, Generic[EpisodeResultT]):
    """An episode's outcome: exactly one of ``result`` and ``failure``."""

    model_config = ConfigDict(extra="forbid")

    episode_id: EpisodeId
    task_id: TaskId
    result: EpisodeResultT | None = None
    failure: EpisodeFailure | None = None

    @model_validator(mode="after")
    def _one_outcome(self) -> Self:
        if (self.result is None) == (self.failure is None):
            raise ValueError("an episode response carries exactly one of result or failure")
        return self
