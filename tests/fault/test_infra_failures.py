"""An infrastructure fault in any hop of a rollout is a classified failure row, never a reward.

A real simple_agent between a fake model and a fake environment, each a real HTTP server on
127.0.0.1 whose answer the test picks; the collector runs over the agent and the test reads its
results and failures files. A tool's 4xx about the model's own arguments stays a tool error the
model sees, and the rollout is scored.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.agents.agent_hops import execute_tool_call, rollout_deadline
from nemo_gym.agents.hop_faults import HopFault
from nemo_gym.launch.launcher import free_port
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.serving.protocol import ROLLOUT_PREFIX
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import read_jsonl, running_app, running_server
from responses_api_agents.simple_agent.app import SimpleAgent

ROWS = 4


def call_item(name: str = "get_weather", arguments: str = '{"city": "Oslo"}') -> dict[str, Any]:
    return {"type": "function_call", "name": name, "arguments": arguments, "call_id": "c1", "id": "fc1"}


def text_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "id": "m1",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def response(output: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "r1", "object": "response", "status": "completed", "output": output, "model": "fake"}


def strip_rollout_prefix(app: Any) -> Any:
    """The fake servers see plain paths, as a nemo_gym server does after its rollout-prefix step."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(ROLLOUT_PREFIX):
            rest = scope["path"][len(ROLLOUT_PREFIX) :].partition("/")[2]
            scope = {**scope, "path": "/" + rest, "raw_path": ("/" + rest).encode()}
        await app(scope, receive, send)

    return asgi


class Fakes:
    """What the fake model and fake environment answer; the test sets ``model`` and ``tool``."""

    def __init__(self) -> None:
        self.model: tuple[int, bytes] | None = None  # None: a tool call, then a text answer
        self.tool: tuple[int, bytes] = (200, b'{"temperature": 20}')
        self.tool_delay_s = 0.0
        self.tool_outputs: list[str] = []
        self.verified = 0

    def model_app(self) -> Any:
        async def responses(request: Request) -> Response:
            body = orjson.loads(await request.body())
            if self.model is not None:
                return Response(self.model[1], self.model[0], media_type="application/json")
            outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
            if not outputs:
                return Response(orjson.dumps(response([call_item()])), media_type="application/json")
            self.tool_outputs.append(outputs[-1]["output"])
            return Response(orjson.dumps(response([text_item("done")])), media_type="application/json")

        return strip_rollout_prefix(Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])]))

    def env_app(self) -> Any:
        async def seed(request: Request) -> Response:
            return Response(b"{}", media_type="application/json")

        async def tool(request: Request) -> Response:
            until = time.monotonic() + self.tool_delay_s
            while time.monotonic() < until:  # a hung tool, which still notices its caller leaving
                if await request.is_disconnected():
                    return Response(status_code=499)
                await asyncio.sleep(0.05)
            status, body = self.tool
            return Response(body, status, media_type="application/json")

        async def verify(request: Request) -> Response:
            self.verified += 1
            body = orjson.loads(await request.body())
            return Response(orjson.dumps({**body, "reward": 1.0}), media_type="application/json")

        routes = [
            Route("/seed_session", seed, methods=["POST"]),
            Route("/get_weather", tool, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
        ]
        return strip_rollout_prefix(Starlette(routes=routes))


@pytest.fixture(scope="module")
def stack():
    fakes = Fakes()
    with running_app(fakes.model_app()) as model_url, running_app(fakes.env_app()) as env_url:
        agent = SimpleAgent(
            {
                "name": "agent",
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "model"},
                "hop_timeout_s": 1.5,
            },
            server_client=ServerClient(static_urls={"env": env_url, "model": model_url}, connect_retries=1),
        )
        with running_server(agent) as agent_url:
            yield fakes, agent_url


def collect(agent_url: str, tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    source = tmp_path / "in.jsonl"
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "weather in Oslo?"}],
            "tools": [weather],
        }
    }
    source.write_bytes(b"".join(orjson.dumps(row) + b"\n" for _ in range(ROWS)))
    out = tmp_path / "out.jsonl"
    helper = RolloutCollectionHelper(server_client=ServerClient(static_urls={"agent": agent_url}))
    asyncio.run(
        helper.run_from_config(
            {
                "input_jsonl_fpath": str(source),
                "output_jsonl_fpath": str(out),
                "agent_name": "agent",
                "disable_aggregation": True,
                "max_failure_ratio": 1.0,
            },
            verbose=False,
        )
    )
    failures = tmp_path / "out_failures.jsonl"
    return (read_jsonl(out) if out.exists() else []), (read_jsonl(failures) if failures.exists() else [])


TOOL_FAULTS = [
    ((503, b'{"error": "overloaded"}'), "upstream_5xx"),
    ((500, b"Internal Server Error"), "upstream_5xx"),
    ((504, b'{"error": "gateway timeout"}'), "timeout"),
    ((429, b'{"error": "slow down"}'), "rate_limited"),
    ((401, b'{"error": "bad token"}'), "upstream_auth"),
    ((502, b'{"error": "x", "failure_class": "judge_failed"}'), "judge_failed"),
    ((200, b"<html>not json</html>"), "bad_upstream_body"),
]


@pytest.mark.parametrize(("answer", "expected"), TOOL_FAULTS, ids=[f"{a[0]}-{e}" for a, e in TOOL_FAULTS])
def test_a_tool_infrastructure_fault_fails_the_rollout_with_its_class(stack, tmp_path, answer, expected):
    fakes, agent_url = stack
    fakes.model, fakes.tool, fakes.tool_outputs = None, answer, []
    verified_before = fakes.verified
    results, failures = collect(agent_url, tmp_path)
    assert results == []
    assert [f["_ng_failure_class"] for f in failures] == [expected] * ROWS
    assert all("get_weather" in f["_ng_error"] for f in failures)
    assert fakes.tool_outputs == [], "the fault was shown to the model"
    assert fakes.verified == verified_before, "a rollout with an infrastructure fault was verified"


@pytest.mark.parametrize("status", [400, 422])
def test_a_tool_4xx_about_the_arguments_is_a_tool_error_the_model_sees(stack, tmp_path, status):
    fakes, agent_url = stack
    fakes.model, fakes.tool, fakes.tool_outputs = None, (status, b'{"error": "city: unknown city"}'), []
    results, failures = collect(agent_url, tmp_path)
    assert failures == []
    assert [r["reward"] for r in results] == [1.0] * ROWS
    assert (
        fakes.tool_outputs == [f"Error: tool 'get_weather' failed (HTTP {status}): city: unknown city"] * ROWS
    )


MODEL_FAULTS = [
    ((200, b"{}"), "bad_upstream_body"),
    ((200, b'{"error": {"message": "engine crashed", "type": "server_error"}}'), "bad_upstream_body"),
    ((200, b'{"id": "r", "output": "just a string"}'), "bad_upstream_body"),
    ((200, b'{"id": "r", "output": [1, 2]}'), "bad_upstream_body"),
    ((200, b"[]"), "bad_upstream_body"),
    ((200, b'{"id": "r", "output": [{"type": "message", "content": [{"text": 5}]}]}'), "bad_upstream_body"),
    ((200, b'{"id": "r", "outp'), "bad_upstream_body"),
    ((504, b'{"error": "upstream timed out"}'), "timeout"),
    ((500, b'{"error": "boom"}'), "upstream_5xx"),
    ((502, b'{"error": "x", "failure_class": "rate_limited"}'), "rate_limited"),
]


@pytest.mark.parametrize(
    ("answer", "expected"), MODEL_FAULTS, ids=[e + str(i) for i, (_, e) in enumerate(MODEL_FAULTS)]
)
def test_a_model_answer_that_is_not_a_response_fails_the_rollout(stack, tmp_path, answer, expected):
    fakes, agent_url = stack
    fakes.model = answer
    verified_before = fakes.verified
    results, failures = collect(agent_url, tmp_path)
    assert results == []
    assert [f["_ng_failure_class"] for f in failures] == [expected] * ROWS
    assert all("/v1/responses" in f["_ng_error"] for f in failures)
    assert fakes.verified == verified_before


def test_the_healthy_path_still_scores(stack, tmp_path):
    fakes, agent_url = stack
    fakes.model, fakes.tool, fakes.tool_outputs = None, (200, b'{"temperature": 20}'), []
    results, failures = collect(agent_url, tmp_path)
    assert failures == []
    assert len(results) == ROWS
    assert fakes.tool_outputs == ['{"temperature":20}'] * ROWS


def test_a_hung_tool_is_cut_at_the_hop_deadline_and_a_slow_one_is_waited_for(stack, tmp_path):
    fakes, agent_url = stack
    fakes.model, fakes.tool, fakes.tool_outputs = None, (200, b'{"temperature": 20}'), []
    try:
        fakes.tool_delay_s = 30  # hung: far past the agent's 1.5 s hop deadline
        started = time.monotonic()
        results, failures = collect(agent_url, tmp_path / "hung")
        assert time.monotonic() - started < 10
        assert results == [] and [f["_ng_failure_class"] for f in failures] == ["timeout"] * ROWS
        assert all("get_weather" in f["_ng_error"] for f in failures)
        fakes.tool_delay_s = 0.5  # slow but within the deadline
        results, failures = collect(agent_url, tmp_path / "slow")
        assert failures == [] and [r["reward"] for r in results] == [1.0] * ROWS
    finally:
        fakes.tool_delay_s = 0.0


@pytest.mark.parametrize(
    ("body", "expected"), [(b"<html>", "bad_upstream_body"), (b'{"no": "reward"}', "agent_error")]
)
def test_an_agent_answer_that_is_not_a_result_is_a_failure_row(tmp_path, body, expected):
    async def run(request: Request) -> Response:
        return Response(body, 200, media_type="application/json")

    with running_app(strip_rollout_prefix(Starlette(routes=[Route("/run", run, methods=["POST"])]))) as url:
        results, failures = collect(url, tmp_path)
    assert results == [] and [f["_ng_failure_class"] for f in failures] == [expected] * ROWS


def test_an_unreachable_tool_server_is_a_fault_not_a_tool_output():
    async def main() -> None:
        client = ServerClient(static_urls={"env": f"http://127.0.0.1:{free_port()}"}, connect_retries=1)
        try:
            with pytest.raises(HopFault) as caught:
                await execute_tool_call(client.rollout(), "env", call_item(), {"get_weather"}, timeout_s=5)
        finally:
            await client.close()
        assert caught.value.failure_class == "unreachable"
        assert caught.value.body["failure_class"] == "unreachable"

    asyncio.run(main())


def test_the_rollout_deadline_cancels_the_hop_in_flight():
    async def main() -> None:
        started = asyncio.get_running_loop().time()
        with pytest.raises(HopFault) as caught:
            async with rollout_deadline(0.2, "agent"):
                await asyncio.sleep(30)
        assert caught.value.failure_class == "timeout"
        assert asyncio.get_running_loop().time() - started < 5

    asyncio.run(main())
