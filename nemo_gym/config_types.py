"""Compatibility: NeMo Gym's ``nemo_gym.config_types`` names, for trainers and NeMo Gym-style server code that import them.

A compatibility layer with no logic of its own: ``BaseServerConfig`` (``host``, ``port``; NeMo RL
and verl build the head server's address with it) and the server-ref types, over
:mod:`nemo_gym.serving.server`'s own.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collection.settings import BaseNeMoGymCLIConfig
from nemo_gym.launch.datasets import DatasetConfig
from nemo_gym.serving.protocol import ROLLOUT_PATH_SEGMENT, TOKEN_CAPTURE_PATH_SEGMENT
from nemo_gym.serving.server import BaseServerConfig, ModelServerRef, ServerRef

__all__ = [
    "AgentServerRef",
    "AggregateMetrics",
    "Domain",
    "AggregateMetricsRequest",
    "BaseNeMoGymCLIConfig",
    "BaseServerConfig",
    "DatasetConfig",
    "ModelServerRef",
    "ROLLOUT_PATH_PREFIX",
    "ResourcesServerRef",
    "ServerRef",
    "TOKEN_CAPTURE_PATH_SEGMENT",
]

# The path segments that correlate a call with its rollout: ``/ng-rollout/<id>/...`` and, for
# training token-ID capture, ``/ng-rollout/<id>/training-token-capture/...``.
ROLLOUT_PATH_PREFIX = ROLLOUT_PATH_SEGMENT


class ResourcesServerRef(ServerRef):
    """A reference to a resources server instance."""

    type: Literal["resources_servers"] = "resources_servers"


class AgentServerRef(ServerRef):
    """A reference to an agent server instance."""

    type: Literal["responses_api_agents"] = "responses_api_agents"


class AggregateMetricsRequest(BaseModel):
    """``{verify_responses: [...]}``: verify answers, heavy fields usually stripped."""

    model_config = ConfigDict(extra="allow")

    verify_responses: list[dict[str, Any]] = Field(default_factory=list)


class AggregateMetrics(BaseModel):
    """The answer of ``/aggregate_metrics``: flat metric names, ready to log."""

    model_config = ConfigDict(extra="allow")

    group_level_metrics: list[dict[str, Any]] = Field(default_factory=list)
    agent_metrics: dict[str, Any] = Field(default_factory=dict)
    key_metrics: dict[str, Any] = Field(default_factory=dict)
    # NeMo Gym's per-repeat summaries (0.6.0 on; see nemo_gym.collection.repeat_metrics).
    repeat_level_metrics: list[dict[str, Any]] = Field(default_factory=list)


class Domain(str, Enum):  # noqa: UP042 - NeMo Gym's str(domain)
    """The capability a resources server mainly evaluates (a server config's ``domain``)."""

    MATH = "math"
    CODING = "coding"
    AGENT = "agent"
    KNOWLEDGE = "knowledge"
    INSTRUCTION_FOLLOWING = "instruction_following"
    LONG_CONTEXT = "long_context"
    SAFETY = "safety"
    GAMES = "games"
    TRANSLATION = "translation"
    E2E = "e2e"
    RLHF = "rlhf"
    OTHER = "other"


def __getattr__(name: str) -> Any:
    # ``OmegaConf``, which NeMo Gym agents import from here: loaded only when asked for (it
    # costs start-up time that servers not using it should not pay).
    if name == "OmegaConf":
        from omegaconf import OmegaConf

        return OmegaConf
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
