"""The per-request context every server handler can read: session id, rollout id, body mode.

Context variables set by the server base (and, for FastAPI apps, by the session middleware)
around each handler, so ``self.session`` and ``self.rollout_id`` need no request argument.
"""

from __future__ import annotations

import contextvars
from typing import Any

_current_session_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nemo_gym_session_id", default=None
)
# The server class's ``plain_bodies``, in effect while one of our own endpoints validates and
# handles a body (one idea, one name): Responses API fields
# typed as NeMo Gym's models then stay plain dicts (shape-checked), as our handlers read them,
# and skip building typed models on the hot path. Unset (NeMo Gym-style FastAPI routes, direct
# calls in tests) they are validated into the typed models.
plain_bodies_in_effect: contextvars.ContextVar[PlainBodies | bool] = contextvars.ContextVar(
    "nemo_gym_plain_bodies", default=False
)


class PlainBodies:
    """What :data:`plain_bodies_in_effect` holds while a plain-bodies endpoint handles one request
    (truthy): the plain dicts whose shape was already checked in this request.

    A handler that builds its answer from the body (NeMo Gym's ``Answer(**body.model_dump(), ...)``)
    hands the answer model the very dict the request model checked; the answer's field check
    then recognises it (the same object, its walked list the same list of the same length)
    instead of walking a long response a second time. The record lives only as long as the
    request: a fresh one is set for each.
    """

    # What was checked: none until the first record (a class attribute, so that building a
    # record per request runs no Python ``__init__``).
    checked: tuple[tuple[Any, Any, Any, int], ...] = ()

    def already_checked(self, check: Any, value: dict[str, Any], walked: Any) -> bool:
        """Whether ``check`` passed ``value`` in this request and its ``walked`` list is unchanged."""
        for done_check, done_value, done_walked, done_len in self.checked:
            if done_value is value and done_check is check:
                return walked is done_walked and (walked is None or len(walked) == done_len)
        return False

    def record(self, check: Any, value: dict[str, Any], walked: Any) -> None:
        """Note that ``check`` passed ``value`` (with ``walked``, the list it walks) in this request."""
        self.checked += ((check, value, walked, 0 if walked is None else len(walked)),)


_current_rollout_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nemo_gym_rollout_id", default=None
)
