"""NeMo Gym's externally staged token capture (inference workers stage tokens): not implemented here."""

from __future__ import annotations

from typing import Any

from nemo_gym.token_id_capture.config import unavailable


def select_terminal_call(*args: Any, **kwargs: Any) -> Any:
    """Pick a rollout's final captured call: refused (no capture ledger here)."""
    raise unavailable("staging.select_terminal_call")


def resolve_terminal(*args: Any, **kwargs: Any) -> Any:
    """Resolve a rollout's final captured call: refused (no capture ledger here)."""
    raise unavailable("staging.resolve_terminal")
