"""A model server's handler called with the call's training tokens captured, when it is being captured.

Only a call made inside a capture context (NeMo Gym's ``token_id_capture``, set up by its
middleware) is captured; every other call is the handler's own coroutine, nothing added.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

# The capture context lives in the sink module, imported (about 0.1 s) only by what sets one
# up: while it is not loaded no call can be captured, and nothing is imported per call.
_CAPTURE_SINK = "nemo_gym.token_id_capture.sink"


def call(handler: Callable[[Any], Awaitable[Any]], body: Any) -> Awaitable[Any]:
    """``handler(body)``, through :func:`captured` only when a call can be captured (the sink is
    loaded); else the handler's own coroutine, without a frame of this module's around it."""
    return handler(body) if _CAPTURE_SINK not in sys.modules else captured(handler, body, body)


async def captured(handler: Callable[[Any], Awaitable[Any]], body: Any, request_body: Any) -> Any:
    """``handler(body)``, with the call's training tokens captured when it is being captured.

    The parent is resolved once from the request as received (prefix supply and capture share
    the decision), before dispatch; the complete answer's tokens are written after it.
    """
    sink = sys.modules.get(_CAPTURE_SINK)
    if sink is None or sink.current_capture_context() is None:
        return await handler(body)
    from nemo_gym.token_id_capture.request_items import request_messages
    from nemo_gym.token_id_capture.sink import capture_tokens, register_call_intent, resolve_parent

    messages = request_messages(request_body)
    await resolve_parent(messages)
    await register_call_intent()
    answer = await handler(body)
    await capture_tokens(answer, request_messages=messages)
    return answer
