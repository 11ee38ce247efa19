"""The ``/ng-rollout/<id>`` path prefix: stripped before routing, the id kept for the handler."""

from __future__ import annotations

from contextvars import Token

from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.serving.protocol import ROLLOUT_PREFIX, TOKEN_CAPTURE_PATH_SEGMENT
from nemo_gym.serving.request_context import _current_rollout_id

# Set in a request's scope when it came with the training-capture segment.
TOKEN_CAPTURE_SCOPE_KEY = "nemo_gym.token_capture"


def strip_rollout_prefix(scope: Scope) -> tuple[Scope, str]:
    """A copy of an HTTP ``scope`` whose path starts with the rollout prefix, the prefix (and the
    capture segment after the id) stripped; and the rollout id."""
    rollout_id, _, rest = scope["path"][len(ROLLOUT_PREFIX) :].partition("/")
    scope = dict(scope)
    # NeMo Gym's training-capture segment follows the id; the route is the same.
    capture, _, after = rest.partition("/")
    if capture == TOKEN_CAPTURE_PATH_SEGMENT:
        rest = after
        scope[TOKEN_CAPTURE_SCOPE_KEY] = True
    scope["path"] = "/" + rest
    scope["raw_path"] = scope["path"].encode()
    # Starlette merges these into the matched route's: NeMo Gym handlers read
    # ``request.path_params["rollout_id"]`` as their prefixed routes bound it.
    scope["path_params"] = {**scope.get("path_params", {}), "rollout_id": rollout_id}
    return scope, rollout_id


def enter_rollout(scope: Scope) -> tuple[Scope, Token[str | None]]:
    """For an HTTP ``scope`` whose path starts with the rollout prefix: the stripped copy
    (:func:`strip_rollout_prefix`), its rollout id made the request's (``current_rollout_id()``);
    and the token that :func:`leave_rollout` takes once the request is served.

    The one implementation of the prefix for every layer that strips it (:class:`StripRolloutPrefix`,
    :class:`~nemo_gym.serving.server_gate.ServerGate`), as plain calls: no coroutine frame of its own.
    """
    scope, rollout_id = strip_rollout_prefix(scope)
    return scope, _current_rollout_id.set(rollout_id)


leave_rollout = _current_rollout_id.reset


class StripRolloutPrefix:
    """ASGI middleware: ``/ng-rollout/<id>[/training-token-capture]/rest`` → ``/rest``, the id
    kept for the handler (and in ``path_params``), the capture segment as a scope flag."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith(ROLLOUT_PREFIX):
            scope, token = enter_rollout(scope)
            try:
                await self.app(scope, receive, send)
            finally:
                leave_rollout(token)
            return
        await self.app(scope, receive, send)
