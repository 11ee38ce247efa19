"""NeMo Gym's readers of captured tokens: not implemented here."""

from __future__ import annotations

from typing import Any

from nemo_gym.token_id_capture.config import unavailable


def trajectories_from_source(*args: Any, **kwargs: Any) -> Any:
    """Rebuild trajectories from a token source: refused (token IDs come on response items here)."""
    raise unavailable("trajectories_from_source")
