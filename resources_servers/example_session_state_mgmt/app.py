"""example_session_state_mgmt: a counter per rollout, opened by seed_session and read by verify.

``seed_session`` starts the rollout's counter at the row's ``initial_count``; ``increment_counter``
adds to it and ``get_counter_value`` reads it; ``verify`` gives 1.0 when the counter ends at
``expected_count``. Each rollout has its own counter (the session cookie keeps them apart), freed
after verify and expired after the server's ``session_ttl_s``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    HTTPError,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.response_items import function_calls, output_text

COUNTER_KEY = "count"


class CounterSeedSessionRequest(BaseSeedSessionRequest):
    """The row: ``initial_count`` starts the counter (0 when absent)."""

    initial_count: StrictInt = 0


class IncrementCounterRequest(BaseModel):
    """Arguments of ``increment_counter``: how much to add (may be negative)."""

    count: StrictInt


class IncrementCounterResponse(BaseModel):
    """What ``increment_counter`` returns."""

    success: bool


class GetCounterValueResponse(BaseModel):
    """What ``get_counter_value`` returns."""

    count: int


class CounterVerifyRequest(BaseVerifyRequest):
    """The row plus response: ``expected_count`` is the value the counter must end at."""

    expected_count: StrictInt


class CounterVerifyResponse(CounterVerifyRequest, BaseVerifyResponse):
    """Reward plus what verify found in the session."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    session_found: bool
    final_count: int | None = None
    num_increments: int = 0
    num_tool_calls: int = 0
    answer_mentions_count: bool = False


class ExampleSessionStateMgmtConfig(BaseResourcesServerConfig):
    """``unseeded_counter_starts_at_zero``: NeMo Gym's behaviour, a tool call in a session that
    was never seeded opens a counter at 0 (default: a 409 naming the missing ``/seed_session``)."""

    unseeded_counter_starts_at_zero: bool = False


class ExampleSessionStateMgmtServer(SimpleResourcesServer):
    """A per-rollout counter: the smallest environment whose reward depends on tool-made state."""

    config: ExampleSessionStateMgmtConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    async def seed_session(self, body: CounterSeedSessionRequest) -> BaseSeedSessionResponse:  # type: ignore[override]
        """Open this rollout's counter at ``initial_count``."""
        self.session.update({COUNTER_KEY: body.initial_count, "increments": 0})
        return BaseSeedSessionResponse()

    def _state(self) -> dict[str, Any]:
        """This rollout's state; a clear error when the session was never seeded or has expired."""
        if self.config.unseeded_counter_starts_at_zero:
            state = self.session
            state.setdefault(COUNTER_KEY, 0)
            state.setdefault("increments", 0)
            return state
        # create=False: a stray call without a session must not leave an empty entry behind.
        state = self.sessions.get(self.session_id or "", create=False)
        if state is None or COUNTER_KEY not in state:
            raise HTTPError(
                409,
                "no counter for this rollout: call /seed_session with the row first "
                f"(sessions expire {self.config.session_ttl_s:g}s after their last use and are freed by /verify)",
            )
        return state

    @tool
    async def increment_counter(self, body: IncrementCounterRequest) -> IncrementCounterResponse:
        """Add ``count`` to this rollout's counter."""
        state = self._state()
        state[COUNTER_KEY] += body.count
        state["increments"] += 1
        return IncrementCounterResponse(success=True)

    @tool
    async def get_counter_value(self, body: dict[str, Any]) -> GetCounterValueResponse:
        """This rollout's counter (takes no arguments)."""
        if body:
            raise HTTPError(422, f"get_counter_value takes no arguments; got {sorted(body)}")
        return GetCounterValueResponse(count=self._state()[COUNTER_KEY])

    async def verify(self, body: CounterVerifyRequest) -> CounterVerifyResponse:  # type: ignore[override]
        """1.0 when this rollout's counter equals ``expected_count``; 0.0 otherwise or without a session."""
        state = self.sessions.get(self.session_id or "", create=False)
        found = state is not None and COUNTER_KEY in state
        final = state[COUNTER_KEY] if found and state is not None else None
        text = output_text(body.response)
        return CounterVerifyResponse(
            **body.model_dump(),
            reward=float(final == body.expected_count),
            session_found=found,
            final_count=final,
            num_increments=state.get("increments", 0) if state else 0,
            num_tool_calls=len(function_calls(body.response.get("output") or [])),
            answer_mentions_count=final is not None and re.search(rf"(?<!\d){final}(?!\d)", text) is not None,
        )


if __name__ == "__main__":
    ExampleSessionStateMgmtServer.run_webserver()
