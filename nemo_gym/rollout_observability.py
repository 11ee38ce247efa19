"""Compatibility: NeMo Gym's rollout observation records (``nemo_gym.rollout_observability``): what an agent
harness reports about a rollout beyond its final answer.

An :class:`AgentObservationBundle` holds typed records, in no particular order: agent
invocations (with the model calls they made, by :class:`ModelCallRef`), tool calls, context
compactions and sandboxes, plus :class:`ObservationGap` entries for evidence a producer could not
provide. A :class:`TrajectoryRecord` is the per-rollout view: invocations, numbered turns, model
calls and tool calls. Every model forbids unknown fields, so a producer's typo fails loudly.
:func:`join_model_call_observations` resolves an agent's model-call references against the calls
the model server captured. The models live in :mod:`nemo_gym.collection.observations`.
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_gym.collection.observations import (
    AgentInvocation,
    AgentObservationBundle,
    AgentObservationRecord,
    ContextCompactionObservation,
    ModelCallRef,
    ObservationGap,
    ObservationModel,
    SandboxObservation,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryResponseMetadata,
    TrajectoryTokenStats,
    TrajectoryToolCall,
    TrajectoryTurn,
)
from nemo_gym.collection.trajectory_evidence import join_model_call_observations
from nemo_gym.openai_utils import NeMoGymResponse

__all__ = [
    "AgentEpisode",
    "AgentInvocation",
    "AgentObservationBundle",
    "AgentObservationRecord",
    "ContextCompactionObservation",
    "ModelCallRef",
    "ObservationGap",
    "ObservationModel",
    "SandboxObservation",
    "ToolCallObservation",
    "TrajectoryModelCall",
    "TrajectoryRecord",
    "TrajectoryResponseMetadata",
    "TrajectoryTokenStats",
    "TrajectoryToolCall",
    "TrajectoryTurn",
    "join_model_call_observations",
]


@dataclass(frozen=True)
class AgentEpisode:
    """An agent's response and the observations it could make of the run that produced it."""

    response: NeMoGymResponse
    observations: AgentObservationBundle
