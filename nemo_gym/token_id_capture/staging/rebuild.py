"""NeMo Gym's rebuild of a rollout from staged token deltas: not implemented here."""

from __future__ import annotations

from typing import Any

from nemo_gym.token_id_capture.config import unavailable


def verify_and_linearize(*args: Any, **kwargs: Any) -> Any:
    """Check and join a rollout's staged deltas: refused (no capture ledger here)."""
    raise unavailable("staging.rebuild.verify_and_linearize")
