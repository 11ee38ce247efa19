"""The training-token record of one model call (:class:`TokenEntry`) and what is derived from it.

A ``TokenEntry`` holds the exact prompt token IDs a call generated from, the IDs it generated
and their log-probabilities, the call's content items (without the token arrays, which are held
once on the entry) and its lineage: which earlier call of the rollout it continues
(``parent_call_id``, decided at request time and stated in ``parent_resolution``), and a digest of
its cumulative sequence (prompt + generation) that a child's prompt must begin with.

The digest encoding and the reason strings below are NeMo Gym's wire contract: a trainer reading
records written here, or a writer of its own, must agree on them byte for byte.
"""

from __future__ import annotations

import hashlib
import struct
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The token fields a served item carries (``routed_experts`` only on MoE engines that return it).
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")
REQUIRED_TOKEN_FIELDS = TOKEN_FIELDS[:3]

TOKEN_ENTRY_RECORD_SCHEMA_VERSION = 1
TOKEN_ENTRY_MIN_SCHEMA_VERSION = 1

DIGEST_VERSION = 1
_DIGEST_DOMAIN = b"nemo-gym-tokens"

# Why a call's capture failed: trainers switch on these strings.
UNRESOLVED_PARENT_REASON = "unresolved_parent"
UNCOMMITTED_CALL_REASON = "request_finished_without_staged_coordinates"
LEDGER_ROW_MISSING_RESPONSE_ID_REASON = "ledger_row_missing_response_id"
LEDGER_ROW_MISSING_CHAIN_HASH_REASON = "ledger_row_missing_chain_hash"


class ParentResolutionStatus(StrEnum):
    """The request-time decision about a call's parent: a root, a proven parent, or unknown."""

    ROOT = "root"
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"


def encode_token_ids(token_ids: list[int]) -> bytes:
    """Version byte, length, then each ID as an unsigned big-endian 64-bit integer."""
    try:  # one C-level pack: a per-token Python check would dominate a long rollout's capture
        return struct.pack(f">BQ{len(token_ids)}Q", DIGEST_VERSION, len(token_ids), *token_ids)
    except struct.error:
        raise ValueError(f"token ids must be non-negative 64-bit integers, got {min(token_ids)}") from None


def compute_digest(token_ids: list[int]) -> str:
    """SHA-256 of an exact token sequence (the empty sequence hashes the domain alone)."""
    if not token_ids:
        return hashlib.sha256(_DIGEST_DOMAIN).hexdigest()
    return hashlib.sha256(_DIGEST_DOMAIN + encode_token_ids(token_ids)).hexdigest()


class TokenEntry(BaseModel):
    """One model call's training tokens, its content and its lineage within the rollout."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = TOKEN_ENTRY_RECORD_SCHEMA_VERSION
    rollout_id: str
    model_call_id: str
    model: str = ""
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: Any | None = None
    # The call's output items without token arrays; token_item_index names the one that had them.
    output_items: list[dict[str, Any]] = Field(default_factory=list)
    token_item_index: int | None = None
    # The id of the response the client received (terminal attribution joins on it).
    response_id: str | None = None
    created_at: float = 0.0
    parent_call_id: str | None = None
    cum_len: int | None = None
    digest: str | None = None
    parent_resolution: ParentResolutionStatus | None = None
    # What request-time resolution looks this call up by (see lineage.stamp_continuation).
    continuation_fingerprint: str = ""
    continuation_context_len: int = 0
    continuation_context_digest: str = ""
    parent_resolution_reason: str = ""
    fingerprint_version: int | None = None
    # A delta record stores only the prompt after its resolved parent's cumulative tokens.
    prompt_is_delta: bool = False
    # Whether the server asked the engine for the parent's exact prefix, and whether the
    # generation's prompt proves the engine used it.
    prefix_requested: bool = False
    prefix_supplied: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> TokenEntry:
        if self.schema_version > TOKEN_ENTRY_RECORD_SCHEMA_VERSION:
            raise ValueError(
                f"token record schema_version {self.schema_version} is newer than this reader "
                f"({TOKEN_ENTRY_RECORD_SCHEMA_VERSION}); upgrade the reader"
            )
        if self.schema_version < TOKEN_ENTRY_MIN_SCHEMA_VERSION:
            raise ValueError(
                f"token record schema_version {self.schema_version} is older than the supported "
                f"minimum {TOKEN_ENTRY_MIN_SCHEMA_VERSION}; regenerate the rollout"
            )
        if len(self.generation_token_ids) != len(self.generation_log_probs):
            raise ValueError(
                "generation_token_ids and generation_log_probs differ in length "
                f"({len(self.generation_token_ids)} vs {len(self.generation_log_probs)})"
            )
        if self.token_item_index is not None and not 0 <= self.token_item_index < len(self.output_items):
            raise ValueError(f"token_item_index {self.token_item_index} is outside output_items")
        _check_parent(self.parent_resolution, self.parent_call_id)
        if self.prompt_is_delta and (
            self.parent_call_id is None or self.parent_resolution != ParentResolutionStatus.RESOLVED
        ):
            raise ValueError("a delta prompt needs a RESOLVED parent_call_id to be rebuilt from")
        return self


def _check_parent(resolution: ParentResolutionStatus | None, parent_call_id: str | None) -> None:
    if resolution == ParentResolutionStatus.RESOLVED and not parent_call_id:
        raise ValueError("a resolved parent needs parent_call_id")
    if resolution in (ParentResolutionStatus.ROOT, ParentResolutionStatus.UNRESOLVED) and parent_call_id:
        raise ValueError(f"a {resolution.value} call cannot name parent_call_id")


def cumulative_tokens(entry: TokenEntry) -> list[int]:
    """Prompt + generation: what a child of this call must begin with (full-prompt entries only)."""
    if entry.prompt_is_delta:
        raise ValueError(
            f"model call {entry.model_call_id} stores a delta prompt; rebuild it from its parents"
        )
    return [*entry.prompt_token_ids, *entry.generation_token_ids]


def stamp_lineage(
    entry: TokenEntry,
    parent_call_id: str | None,
    *,
    parent_resolution: ParentResolutionStatus | None = None,
    cumulative: list[int] | None = None,
) -> TokenEntry:
    """Set ``cum_len``, ``digest`` and the parent decision (a delta entry passes ``cumulative``)."""
    if cumulative is None:
        cumulative = cumulative_tokens(entry)
    elif not entry.prompt_is_delta and cumulative != cumulative_tokens(entry):
        raise ValueError("the cumulative tokens given disagree with the entry's own arrays")
    _check_parent(parent_resolution, parent_call_id)
    entry.cum_len = len(cumulative)
    entry.digest = compute_digest(cumulative)
    entry.parent_call_id = parent_call_id
    entry.parent_resolution = parent_resolution
    return entry


def _anthropic_items(payload: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    text_blocks: list[Any] = []
    for block in payload.get("content") or []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "thinking":
            summary = (
                [{"type": "summary_text", "text": block["thinking"]}]
                if isinstance(block.get("thinking"), str)
                else []
            )
            items.append({"type": "reasoning", "summary": summary})
        elif kind == "redacted_thinking":
            item: dict[str, Any] = {"type": "reasoning", "summary": []}
            if block.get("data") is not None:
                item["encrypted_content"] = block["data"]
            items.append(item)
        else:
            text_blocks.append(block)
    if text_blocks:
        items.append({"type": "message", "role": "assistant", "content": text_blocks})
    return items


def response_to_output_items(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """A served answer (Responses, Chat Completions or Anthropic Messages) as Responses-style items."""
    output = payload.get("output")
    if isinstance(output, list) and output:
        return [item for item in output if isinstance(item, dict)]
    if payload.get("type") == "message" and payload.get("role") == "assistant":
        return _anthropic_items(payload)
    items = []
    for choice in payload.get("choices") or []:
        message = (choice or {}).get("message")
        if isinstance(message, dict):
            items.append({"type": "message", "role": "assistant", **message})
    return items


def strip_token_fields(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int | None]:
    """The items without token arrays, and the index of the one item that carried them."""
    carriers = [i for i, item in enumerate(items) if item.get("generation_token_ids") is not None]
    if len(carriers) > 1:
        raise ValueError("more than one output item carries token metadata")
    stripped = [{k: v for k, v in item.items() if k not in TOKEN_FIELDS} for item in items]
    return stripped, carriers[0] if carriers else None


def extract_token_fields(response_json: dict[str, Any]) -> dict[str, Any] | None:
    """The token fields of a served answer's one token-bearing item (None when no item has them).

    Raises ``ValueError`` when two items carry them or one carries only some of the three.
    """
    messages = [(choice or {}).get("message") for choice in response_json.get("choices") or []]
    sources: list[Any] = [*(response_json.get("output") or []), *messages]
    carriers = [
        s for s in sources if isinstance(s, dict) and any(s.get(f) is not None for f in REQUIRED_TOKEN_FIELDS)
    ]
    if not carriers:
        return None
    if len(carriers) > 1:
        raise ValueError("more than one response item carries token metadata")
    missing = [f for f in REQUIRED_TOKEN_FIELDS if carriers[0].get(f) is None]
    if missing:
        raise ValueError(f"partial token metadata: {', '.join(missing)} missing")
    return {f: carriers[0].get(f) for f in TOKEN_FIELDS}
