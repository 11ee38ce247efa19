"""One rollout's model calls, each sending only what is new when the model server keeps the conversation.

An agent loop re-sends its whole history on every model call; over a long rollout that is
quadratic work for the agent (serialising it) and the model server (parsing and checking it).
:class:`ModelConversation` sends the whole history at first, and from its third call on asks
the model server to keep the conversation (``store: true``, see
:mod:`nemo_gym.models.conversation_store`). Once the server answers that it kept it, each call
sends ``previous_response_id`` and only the items added since; the server puts the kept items in
front, so the engine gets exactly the request the whole history would have made. Any server
that does not keep conversations (no ``X-NeMo-Gym-Conversation: kept`` answer, e.g. NeMo Gym's)
just keeps getting the whole history, and an id the server no longer holds (restarted, bounded
out) is answered by sending the whole history again. Rows that set ``store`` or
``previous_response_id`` themselves are sent as they are. :meth:`close` (or leaving the
``async with`` block) deletes what the server kept, so nothing of the rollout outlives it::

    async with ModelConversation(rollout, "policy_model") as conversation:
        items = input_items(params)
        answer = await conversation.call(params, items)   # items: the whole history, only appended to
        items.extend(answer["output"])
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

from nemo_gym.agents.agent_hops import MODEL_PATH, hop_timeout_s
from nemo_gym.agents.hop_faults import check_responses_object, check_status, from_call_error
from nemo_gym.models.conversation_store import KEPT_HEADER, KEPT_VALUE, NOT_FOUND_CODE
from nemo_gym.serving.server_client import Rollout, ServerCallError, ServerResponse, raise_for_status

# The first calls of a rollout send the whole (still short) history: a rollout of one or two
# model calls then costs no extra request to delete a kept conversation.
KEEP_FROM_CALL = 3
DELETE_TIMEOUT_S = 5.0


class ModelConversation:
    """The model calls of one rollout (see the module docstring). ``timeout_s``: each call's deadline."""

    def __init__(
        self,
        rollout: Rollout,
        model_server: str,
        *,
        timeout_s: float | None = None,
        keep_from_call: int = KEEP_FROM_CALL,
    ) -> None:
        self.rollout = rollout
        self.model_server = model_server
        self.timeout_s = timeout_s
        self.keep_from_call = keep_from_call
        self.calls = 0
        self.kept_id: str | None = None
        self._kept_count = 0  # items of the history the server holds under kept_id
        self._kept_last: Any = None  # the last of them (the history must still hold it there)
        self._server_keeps = True  # False once a store request was answered without keeping

    async def __aenter__(self) -> ModelConversation:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    async def call(self, params: dict[str, Any], items: Sequence[Any]) -> dict[str, Any]:
        """One model call with ``params`` and the whole history ``items`` (only ever appended to
        between calls); the checked Responses object it answered."""
        self.calls += 1
        timeout_s = self.timeout_s or hop_timeout_s()
        own = "store" in params or "previous_response_id" in params
        ask = not own and self._server_keeps and self.calls >= self.keep_from_call
        body = self._request(params, items, ask)
        continued = "previous_response_id" in body and not own
        try:
            # _post's work, inline on the usual path (one coroutine less per model call).
            try:
                resp = await self.rollout.post(self.model_server, MODEL_PATH, body, timeout_s=timeout_s)
            except ServerCallError as exc:
                raise from_call_error(exc) from exc
            parsed = check_status(resp, self.model_server, MODEL_PATH)
            if not 200 <= resp.status < 300:
                raise_for_status(resp, self.model_server, MODEL_PATH)
        except ServerCallError as exc:
            if not continued or not _previous_not_found(exc):
                raise
            self._forget()  # the server lost it: the whole history once more
            body = self._request(params, items, ask)
            resp, parsed = await self._post(body, timeout_s)
        answer = check_responses_object(parsed, self.model_server, MODEL_PATH)
        if ask:
            kept = resp.header(KEPT_HEADER) == KEPT_VALUE and isinstance(answer.get("id"), str)
            if kept:
                output = answer["output"]
                self.kept_id = answer["id"]
                self._kept_count = len(items) + len(output)
                self._kept_last = output[-1] if output else (items[-1] if items else None)
            else:
                self._forget()
                self._server_keeps = False
        return answer

    async def close(self) -> None:
        """Delete the conversation the model server keeps for this rollout (best effort: the
        server's own bounds and time limit drop it anyway)."""
        kept, self.kept_id = self.kept_id, None
        if kept is None:
            return
        try:
            await self.rollout.request(
                "DELETE", self.model_server, f"{MODEL_PATH}/{kept}", timeout_s=DELETE_TIMEOUT_S
            )
        except ServerCallError:
            pass

    def _request(self, params: dict[str, Any], items: Sequence[Any], ask: bool) -> dict[str, Any]:
        if not ask:
            return {**params, "input": list(items)}
        count = self._kept_count
        # The history still holds what the server kept (its last item where it was), and more.
        if (
            self.kept_id is not None
            and len(items) > count
            and (count == 0 or items[count - 1] is self._kept_last)
        ):
            return {
                **params,
                "input": items[count:] if items.__class__ is list else list(items[count:]),
                "previous_response_id": self.kept_id,
                "store": True,
            }
        return {**params, "input": list(items), "store": True}

    def _forget(self) -> None:
        self.kept_id, self._kept_count, self._kept_last = None, 0, None

    async def _post(self, body: dict[str, Any], timeout_s: float) -> tuple[ServerResponse, Any]:
        try:
            resp = await self.rollout.post(self.model_server, MODEL_PATH, body, timeout_s=timeout_s)
        except ServerCallError as exc:
            raise from_call_error(exc) from exc
        parsed = check_status(resp, self.model_server, MODEL_PATH)
        if not 200 <= resp.status < 300:
            raise_for_status(resp, self.model_server, MODEL_PATH)
        return resp, parsed


def _previous_not_found(exc: ServerCallError) -> bool:
    body = exc.body
    error = body.get("error") if isinstance(body, dict) else None
    return exc.status == 400 and isinstance(error, dict) and error.get("code") == NOT_FOUND_CODE
