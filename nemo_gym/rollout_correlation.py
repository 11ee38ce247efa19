"""Compatibility: NeMo Gym's rollout correlation (``nemo_gym.rollout_correlation``): which rollout the current
request belongs to.

A caller correlates its calls with a rollout by prefixing the path with ``/ng-rollout/<id>``;
every server here strips that prefix and keeps the id for the request
(:class:`~nemo_gym.serving.server.StripRolloutPrefix`, which is also
:class:`RolloutContextMiddleware`). :func:`current_rollout_id` reads it;
:func:`rollout_context` sets it for code that makes calls outside a request.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel

from nemo_gym.global_config import (
    ATTEMPT_INDEX_KEY_NAME,
    ROLLOUT_ID_KEY_NAME,
    ROLLOUT_INDEX_KEY_NAME,
    TASK_INDEX_KEY_NAME,
)
from nemo_gym.serving.request_context import _current_rollout_id
from nemo_gym.serving.server import StripRolloutPrefix

__all__ = [
    "ROLLOUT_ID_PATTERN",
    "RolloutContextMiddleware",
    "current_rollout_id",
    "maybe_rollout_id_from_run_body",
    "rollout_context",
]

# An id is one path segment (and a file name in token-capture stores): no slash, no leading dot.
ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

RolloutContextMiddleware = StripRolloutPrefix


def current_rollout_id() -> str | None:
    """The rollout id of the request being handled (None outside one, or without a prefix)."""
    return _current_rollout_id.get()


@contextmanager
def rollout_context(rollout_id: str | None) -> Iterator[None]:
    """Make ``rollout_id`` the current rollout for the block."""
    token = _current_rollout_id.set(rollout_id)
    try:
        yield
    finally:
        _current_rollout_id.reset(token)


def maybe_rollout_id_from_run_body(body: BaseModel | Mapping[str, Any] | None) -> str | None:
    """The rollout id a ``/run`` body names: its ``_ng_rollout_id``, else ``<task>-<rollout>`` from
    its indices (None without them); a retry's ``-a<attempt>`` appended.

    Raises ``ValueError`` for an explicit id that is not one path segment of letters, digits,
    dots, dashes and underscores (a rewritten id could not be looked up by its writer).
    """
    if not isinstance(body, BaseModel | Mapping):
        return None

    def field(key: str) -> Any:
        if isinstance(body, Mapping):
            return body.get(key)
        if key == ROLLOUT_ID_KEY_NAME and hasattr(body, "capture_rollout_id"):
            return body.capture_rollout_id
        return getattr(body, key, None)

    explicit = field(ROLLOUT_ID_KEY_NAME)
    if explicit is not None:
        if not isinstance(explicit, str) or not ROLLOUT_ID_PATTERN.match(explicit):
            raise ValueError(
                f"{ROLLOUT_ID_KEY_NAME} must be letters, digits, dots, dashes or underscores, "
                f"starting with a letter or digit; got {explicit!r}"
            )
        rollout_id = explicit
    else:
        task, rollout = field(TASK_INDEX_KEY_NAME), field(ROLLOUT_INDEX_KEY_NAME)
        if task is None or rollout is None:
            return None
        rollout_id = f"{task}-{rollout}"
    attempt = field(ATTEMPT_INDEX_KEY_NAME)
    if attempt is not None and int(attempt) > 0:
        rollout_id = f"{rollout_id}-a{int(attempt)}"
    return rollout_id
