"""NeMo Gym's base_environment_server contract (genrm_compare's tests import it through
environment_servers/legacy_agent): one episode per /run, failures in the response, cleanup
newest-first even when the episode fails, admission and deadline limits; and the
disconnect-cancellation middleware NeMo Gym's servers add with setup_cancellation_middleware."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nemo_gym.base_environment_server import (
    BaseEnvironmentServer,
    BaseEnvironmentServerConfig,
    CleanupContext,
    HandledEpisodeError,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse, EpisodeFailure
from nemo_gym.serving.fastapi_app import DisconnectCancellation


class Echo(BaseEnvironmentServer[BaseEpisodeRequest[dict], BaseEpisodeResponse[dict]]):
    config: BaseEnvironmentServerConfig
    request_model = BaseEpisodeRequest[dict]
    response_model = BaseEpisodeResponse[dict]

    async def run(self, request: Any, cleanup: CleanupContext) -> Any:
        order: list[str] = request.task.task_input.setdefault("order", [])
        for name in ("first", "second"):
            cleanup.register_cleanup(name, lambda name=name: _append(order, name))
        mode = request.task.task_input.get("mode")
        if mode == "handled":
            raise HandledEpisodeError(EpisodeFailure(failure_reason="no moves left", terminal=True))
        if mode == "crash":
            raise KeyError("board")
        if mode == "slow":
            await asyncio.sleep(5)
        return {"episode_id": request.episode_id, "task_id": request.task.task_id, "result": {"ok": True}}

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return AggregateMetrics()


async def _append(order: list[str], name: str) -> None:
    order.append(name)


def request(mode: str | None = None) -> Any:
    return BaseEpisodeRequest[dict].model_validate(
        {
            "episode_id": {"rollout_id": "r1"},
            "task": {"task_id": {"taskset": "t:s", "task_id": "1"}, "task_input": {"mode": mode}},
        }
    )


def test_episode_outcomes_and_cleanup_order() -> None:
    server = Echo(
        config={"name": "echo", "cleanup_timeout_seconds": 1, "default_episode_timeout_seconds": 0.2}
    )

    async def main() -> None:
        ok = request()
        answer = await server.run_request(ok)
        assert answer.result == {"ok": True} and answer.failure is None
        assert ok.task.task_input["order"] == ["second", "first"]  # newest first
        handled = await server.run_request(request("handled"))
        assert handled.failure.failure_reason == "no moves left" and handled.failure.terminal
        crash = await server.run_request(request("crash"))
        assert crash.failure.terminal and "KeyError" in crash.failure.failure_reason
        slow = request("slow")
        timed_out = await server.run_request(slow)
        assert timed_out.failure.failure_reason == "Episode timed out" and not timed_out.failure.terminal
        assert slow.task.task_input["order"] == ["second", "first"]  # cleanup ran after the deadline

    asyncio.run(main())


def test_config_needs_a_queue_timeout_with_an_admission_limit() -> None:
    with pytest.raises(ValueError, match="queue_timeout_seconds is required"):
        BaseEnvironmentServerConfig(cleanup_timeout_seconds=1, max_concurrent_episodes=2)


def test_a_client_that_disconnects_cancels_the_handler() -> None:
    cancelled = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def main() -> None:
        messages = [{"type": "http.request", "body": b"{}", "more_body": False}, {"type": "http.disconnect"}]

        async def receive() -> Any:
            if len(messages) == 1:
                await asyncio.sleep(0.05)
            return messages.pop(0)

        async def send(message: Any) -> None:
            raise AssertionError("nothing is sent to a client that left")

        await asyncio.wait_for(DisconnectCancellation(app)({"type": "http"}, receive, send), 2)
        assert cancelled.is_set()

    asyncio.run(main())
