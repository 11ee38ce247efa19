"""Every server's per-request checks in one ASGI layer instead of three.

``BaseServer.build_app`` puts, in front of the request guard (body limits and deadlines, JSON
500s: :mod:`nemo_gym.serving.request_guard`), the access guard (Host, Origin, token, JSON
bodies: :mod:`nemo_gym.serving.access_guard`), the memory release after bursts
(:mod:`nemo_gym.serving.memory_release`) and the ``/ng-rollout/<id>`` prefix stripping
(:mod:`nemo_gym.serving.rollout_prefix`), in that order. As three middlewares each is a
coroutine frame every request passes through on its way in and every time its task resumes;
on the small requests of a rollout's hops (a tool call, a model turn) those frames were about a
tenth of a server's CPU per request. :class:`ServerGate` runs the same steps, from the same
objects, in one frame for HTTP requests; any other scope (a WebSocket handshake, lifespan) goes
through the three middlewares as before. ``gate.app`` is the outermost of them, so the chain of
``.app`` attributes reads as it did.

Given the :class:`~nemo_gym.serving.direct_routes.DirectRoutes` inside the request guard, the gate
also offers the lean HTTP protocol its direct routes, every layer's steps in one coroutine
(``gate.ng_direct``: :mod:`nemo_gym.serving.direct_serve`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.serving.access_guard import AccessGuard
from nemo_gym.serving.direct_routes import DirectRoutes
from nemo_gym.serving.direct_serve import DirectServer
from nemo_gym.serving.memory_release import ReleaseMemoryAfterBurst
from nemo_gym.serving.protocol import ROLLOUT_PREFIX
from nemo_gym.serving.request_guard import RequestGuard
from nemo_gym.serving.rollout_prefix import StripRolloutPrefix, enter_rollout, leave_rollout


class ServerGate:
    """ASGI app: ``access`` checks, ``memory`` counting (optional) and the rollout prefix
    stripped, then ``guarded`` (the request guard around the routes), in one layer.

    Behaves exactly as ``AccessGuard(ReleaseMemoryAfterBurst(StripRolloutPrefix(guarded)))``
    (``memory`` None: without the middle one), which it builds from the same objects and serves
    every scope but HTTP with.

    ``direct``: the direct routes ``guarded`` (a :class:`RequestGuard`) serves, through only the
    answered-errors stop (``BaseServer.build_app``'s chain); then :attr:`ng_direct` serves them
    for the lean protocol.
    """

    def __init__(
        self,
        guarded: ASGIApp,
        access: AccessGuard,
        memory: ReleaseMemoryAfterBurst | None,
        direct: DirectRoutes | None = None,
    ) -> None:
        self.guarded = guarded
        self.ng_direct = (
            DirectServer(direct.answers, access, memory, guarded)
            if direct is not None and direct.answers and isinstance(guarded, RequestGuard)
            else None
        )
        self.access = access
        self.memory = memory
        chain: ASGIApp = StripRolloutPrefix(guarded)
        if memory is not None:
            memory.app = chain
            chain = memory
        access.app = chain
        self.app = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self.access.http_problem(scope)
        if problem is not None:
            await self.access.refuse(send, problem)
            return
        memory = self.memory
        if memory is not None:
            memory.enter()
        try:
            if scope.get("path", "").startswith(ROLLOUT_PREFIX):
                scope, token = enter_rollout(scope)
                try:
                    await self.guarded(scope, receive, send)
                finally:
                    leave_rollout(token)
            else:
                await self.guarded(scope, receive, send)
        finally:
            if memory is not None:
                memory.leave()
