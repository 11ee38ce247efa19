"""The per-request context every server handler can read: session id, rollout id, body mode.

Context variables set by the server base (and, for FastAPI apps, by the session middleware)
around each handler, so ``self.session`` and ``self.rollout_id`` need no request argument.
"""

from __future__ import annotations

import contextvars

_current_session_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nemo_gym_session_id", default=None
)
# The server class's ``plain_bodies``, in effect while one of our own endpoints validates and
# handles a body (one idea, one name): Responses API fields
# typed as NeMo Gym's models then stay plain dicts (shape-checked), as our handlers read them,
# and skip building typed models on the hot path. Unset (NeMo Gym-style FastAPI routes, direct
# calls in tests) they are validated into the typed models.
plain_bodies_in_effect: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "nemo_gym_plain_bodies", default=False
)
_current_rollout_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nemo_gym_rollout_id", default=None
)
