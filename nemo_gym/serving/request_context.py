"""The per-request context every server handler can read: session id, rollout id, body mode.

Context variables set by the server base (and, for FastAPI apps, by the session middleware)
around each handler, so ``self.session`` and ``self.rollout_id`` need no request argument.
"""

from __future__ import annotations

import contextvars

_current_session_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nemo_gym_session_id", default=None
)
# Set while one of our own (lean) endpoints validates and handles a body: Responses API fields
# typed as NeMo Gym's models then stay plain dicts (shape-checked), as our handlers read them,
# and skip building typed models on the hot path. Unset (NeMo Gym-style FastAPI routes, direct
# calls in tests) they are validated into the typed models.
lean_bodies: contextvars.ContextVar[bool] = contextvars.ContextVar("nemo_gym_lean_bodies", default=False)
_current_rollout_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nemo_gym_rollout_id", default=None
)
