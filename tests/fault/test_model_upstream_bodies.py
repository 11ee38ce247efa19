"""A model upstream's bad answer is a classified 502 at the model server, never a model answer.

``openai_model`` and ``vllm_model`` in front of a fake OpenAI-compatible upstream (a real HTTP
server on 127.0.0.1 whose answer the test picks), called on both routes a trainer or an agent
uses. A 200 that is not the object asked for (``{}``, ``{"error": ...}``, ``output`` or
``choices`` of the wrong shape, not JSON) is ``bad_upstream_body``; an upstream that cannot be
reached is ``unreachable``. Through a real simple_agent and the collector, the rollout is a
failure row with that class.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.agents.hop_faults import chat_completion_problem, responses_object_problem
from nemo_gym.launch.launcher import free_port
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import SyncClient, read_jsonl, running_app, running_server
from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.openai_model.app import OpenAIModel
from responses_api_models.vllm_model.app import VLLMModel

RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "model": "m",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
        }
    ],
}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "It is sunny."}}
    ],
}


class Upstream:
    """Answers ``/v1/responses`` and ``/v1/chat/completions`` with ``answer`` (None: a good one)."""

    def __init__(self) -> None:
        self.answer: bytes | None = None

    def app(self) -> Any:
        def route(good: dict[str, Any]) -> Any:
            async def handle(request: Request) -> Response:
                await request.body()
                return Response(self.answer or orjson.dumps(good), media_type="application/json")

            return handle

        return Starlette(
            routes=[
                Route("/v1/responses", route(RESPONSE), methods=["POST"]),
                Route("/v1/chat/completions", route(COMPLETION), methods=["POST"]),
            ]
        )


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Upstream, dict[str, str]]]:
    upstream = Upstream()
    with running_app(upstream.app()) as upstream_url:
        openai = OpenAIModel(
            {"name": "openai", "openai_base_url": upstream_url + "/v1", "openai_model": "m", "max_retries": 0}
        )
        vllm = VLLMModel({"name": "vllm", "base_url": upstream_url + "/v1", "model": "m"})
        with running_server(openai) as openai_url, running_server(vllm) as vllm_url:
            yield upstream, {"openai": openai_url, "vllm": vllm_url}


BAD_BODIES = [
    b"{}",
    b'{"error": {"message": "engine crashed", "type": "server_error"}}',
    b'{"id": "r", "output": "just a string", "choices": "just a string"}',
    b'{"id": "r", "output": [1, 2], "choices": [1, 2]}',
    b"[]",
    b"<html>not json</html>",
]
ROUTES = {
    "/v1/responses": {"input": [{"role": "user", "content": "Weather?"}]},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Weather?"}]},
}


@pytest.mark.parametrize("server", ["openai", "vllm"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_bad_upstream_body_is_a_classified_502_on_every_route(servers, server, route):
    upstream, urls = servers
    with SyncClient(timeout_s=30) as client:
        upstream.answer = None
        status, good = client.post(urls[server] + route, ROUTES[route])
        assert status == 200, good
        problems = []
        for body in BAD_BODIES:
            upstream.answer = body
            status, answer = client.post(urls[server] + route, ROUTES[route])
            if status != 502 or answer.get("failure_class") != "bad_upstream_body":
                problems.append((body, status, answer))
    upstream.answer = None
    assert problems == []


@pytest.mark.parametrize("server", ["openai", "vllm"])
def test_an_unreachable_upstream_is_classified(server):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    model = (
        OpenAIModel({"name": "m", "openai_base_url": dead, "max_retries": 0})
        if server == "openai"
        else VLLMModel({"name": "m", "base_url": dead, "connect_retries": 0})
    )
    with running_server(model) as url, SyncClient(timeout_s=30) as client:
        status, answer = client.post(url + "/v1/responses", ROUTES["/v1/responses"])
    assert (status, answer.get("failure_class")) == (502, "unreachable"), answer


def test_good_objects_pass_the_shape_checks():
    assert responses_object_problem(RESPONSE) is None
    assert chat_completion_problem(COMPLETION) is None
    assert chat_completion_problem({"choices": [{"index": 0, "message": "hi"}]}) is not None


def test_through_an_agent_the_rollout_is_a_failure_row(servers, tmp_path: Path):
    upstream, urls = servers
    env = ExampleSingleToolCallServer({"name": "env"})
    with running_server(env) as env_url:
        agent = SimpleAgent(
            {
                "name": "agent",
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "model"},
            },
            server_client=ServerClient(static_urls={"env": env_url, "model": urls["vllm"]}),
        )
        with running_server(agent) as agent_url:
            source = tmp_path / "in.jsonl"
            row = {"responses_create_params": {"input": [{"role": "user", "content": "Weather in Oslo?"}]}}
            source.write_bytes(orjson.dumps(row) + b"\n" + orjson.dumps(row) + b"\n")
            out = tmp_path / "out.jsonl"
            helper = RolloutCollectionHelper(server_client=ServerClient(static_urls={"agent": agent_url}))
            upstream.answer = b'{"error": {"message": "engine crashed"}}'
            try:
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
            finally:
                upstream.answer = None
    assert not out.exists() or read_jsonl(out) == []
    failures = read_jsonl(tmp_path / "out_failures.jsonl")
    assert [f["_ng_failure_class"] for f in failures] == ["bad_upstream_body"] * 2
    assert all("engine crashed" in f["_ng_error"] for f in failures)
