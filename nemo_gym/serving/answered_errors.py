"""A handler's exception answered as JSON, then raised on, as starlette's error middleware does.

Starlette's ``ServerErrorMiddleware`` sends its 500 answer for an exception a route let escape
and then raises the exception again, so ``TestClient`` (``raise_server_exceptions=True``, its
default) raises it in the test and the server logs it. NeMo Gym's FastAPI servers behave that
way, and their tests rely on it (``with raises(ValidationError): client.post("/run", ...)``).

Our endpoints answer a handler's exception with a classified JSON error (a 422 for a validation
error, a 502 with its failure class for a downstream failure, a 500 otherwise): the answer is
the same here, and :class:`AnswerThenRaise` raises the exception once the answer is sent. What a
server serves (:meth:`~nemo_gym.serving.server.BaseServer.build_app`, an MCP tool call run
through its route) wraps the routes in :class:`KeepAnsweredErrors`, which stops that exception
once it is answered: a real socket sees the same answer on the same kept-alive connection (an
exception reaching uvicorn after the answer would close the connection) and the middlewares
outside see a finished request. Only an app taken without that wrapper (NeMo Gym's
``setup_webserver()`` in a test) lets the exception out, as FastAPI's would.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

# The scope key holding the exception an AnswerThenRaise has answered and raised.
ANSWERED_ERROR_KEY = "nemo_gym.answered_error"


class AnswerThenRaise(Response):
    """``answer`` (a handler's classified error) sent as it is, then ``exc`` raised."""

    def __init__(self, answer: Response, exc: Exception) -> None:  # noqa: D107 - no parent init
        self.__dict__.update(answer.__dict__)  # status, headers, body: the answer unchanged
        self.exc = exc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
        scope[ANSWERED_ERROR_KEY] = self.exc
        raise self.exc


class KeepAnsweredErrors:
    """ASGI middleware: an exception an :class:`AnswerThenRaise` answered stops here."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            if scope.get(ANSWERED_ERROR_KEY) is not exc:
                raise
