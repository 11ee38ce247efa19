"""What an inference worker's staging plugs into: a sink, a source, a weight version, an adapter.

Workers call these from synchronous completion hooks, possibly concurrently: implementations
are synchronous and thread-safe (one with async storage moves the call off its loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from nemo_gym.token_id_capture.staging.records import StagedCallBaseSnapshot, StagedCallRecord, StageResult


@runtime_checkable
class StagingSink(Protocol):
    """Makes one staged call durable before answering ``ok`` (thread-safe).

    ``attachments`` (framework payloads such as processed media) land in the same durable
    write or the call is rejected; they never enter the record or a digest.
    """

    def stage(
        self, record: StagedCallRecord, *, attachments: Mapping[str, Any] | None = None
    ) -> StageResult: ...


@runtime_checkable
class StagingSource(Protocol):
    """Returns exactly one base snapshot per staging key, in order (extras stay behind the key)."""

    def fetch(self, staging_keys: list[str]) -> list[StagedCallBaseSnapshot]: ...


@runtime_checkable
class WeightVersionProvider(Protocol):
    """The trainer's weight version, stamped on each call at admission."""

    def __call__(self) -> int: ...


class CaptureAdapter(Protocol):
    """Reads and writes one engine's native request and response shapes."""

    def enter_prefix(self, request_payload: dict[str, Any], prefix_ids: list[int]) -> dict[str, Any]:
        """The request carrying the resolved parent prefix in the engine's own field."""
        ...

    def extract_prompt_ids(self, response_payload: Any) -> list[int]:
        """The exact prompt token IDs the engine generated from."""
        ...

    def extract_generation(self, response_payload: Any) -> tuple[list[int], list[float]]:
        """The generated token IDs and their log-probabilities."""
        ...

    def extract_extras(self, response_payload: Any) -> dict[str, Any] | None:
        """Optional per-token engine material (routed experts, media spans)."""
        ...
