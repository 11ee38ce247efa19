"""NeMo Gym's token-capture record types and ledger reasons, as data (nothing writes them here)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# A call admitted for capture finished without the coordinates of its staged tokens.
UNCOMMITTED_CALL_REASON = "request_finished_without_staged_coordinates"


class ParentResolutionStatus(str, Enum):  # noqa: UP042 - NeMo Gym's str-valued enum
    """Whether a captured call continues an earlier captured call."""

    ROOT = "root"
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"


class TokenEntry(BaseModel):
    """One captured model call's token IDs (NeMo Gym's record; ours travel on response items)."""

    model_config = ConfigDict(extra="allow")

    rollout_id: str
    model_call_id: str
    model: str = ""
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: Any | None = None
    output_items: list[dict[str, Any]] = Field(default_factory=list)
