"""``nemo_gym.sandbox.agent_tools``: what a sandboxed agent's harness is given, and how a failed
harness is scored (by the environment's own verifier, on an empty answer), against a real
resources server on 127.0.0.1."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from omegaconf import OmegaConf
from openai.types.responses import Response

from nemo_gym import global_config
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.sandbox import agent_tools
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import running_server


class CountsWords(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        response = body.response if isinstance(body.response, dict) else body.response.model_dump()
        words = sum(len(str(item)) for item in response.get("output", []))
        return BaseVerifyResponse(**body.model_dump(), reward=1.0 if words else 0.0)


class Ref:
    name = "words"


def response(text: str) -> Response:
    return Response.model_validate(
        {
            "id": "r",
            "created_at": 0,
            "model": "m",
            "object": "response",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "m1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "tool_choice": "auto",
            "tools": [],
            "parallel_tool_calls": True,
        }
    )


def test_a_failed_harness_is_scored_zero_by_the_verifier_and_keeps_its_response():
    body = BaseRunRequest(responses_create_params={"input": "hi"})
    answer = response("an answer")

    async def both(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
        client = ServerClient(static_urls={"words": url})
        try:
            scored = await agent_tools.verify_agent_response(
                client, Ref(), body, answer, {}, force_zero_reward=False
            )
            failed = await agent_tools.verify_agent_response(
                client, Ref(), body, answer, {}, force_zero_reward=True
            )
        finally:
            await client.close()
        return scored, failed

    with running_server(CountsWords({"name": "words"})) as url:
        scored, failed = asyncio.run(both(url))
    assert scored["reward"] == 1.0
    assert failed["reward"] == 0.0 and failed["failure_kind"] == "agent_run_error"
    assert failed["response"] == answer.model_dump(mode="json")


def test_urls_for_a_sandbox(monkeypatch: pytest.MonkeyPatch):
    config = {"words": {"resources_servers": {"words": {"host": "0.0.0.0", "port": 8123}}}}
    monkeypatch.setattr(global_config, "_GLOBAL_CONFIG_DICT", OmegaConf.create(config))
    assert agent_tools.sandbox_server_url("words") == "http://127.0.0.1:8123"
    with pytest.raises(ValueError, match="not reachable from a remote sandbox"):
        agent_tools.sandbox_server_url("words", require_reachable=True)
    # NeMo Gym's message names OpenSandbox, and its agents' tests match on that name.
    with pytest.raises(ValueError, match="network policies.*OpenSandbox"):
        agent_tools.restricted_network_policy("local", ["http://10.0.0.2:80"])
    policy = agent_tools.restricted_network_policy(
        "opensandbox", ["http://10.0.0.2:80", "http://10.0.0.2:81"]
    )
    assert policy == {"defaultAction": "deny", "egress": [{"action": "allow", "target": "10.0.0.2"}]}


def test_sandbox_server_url_goes_through_the_module_level_get_server_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NeMo Gym's agents' tests replace nemo_gym.sandbox.agent_tools.get_server_url; the sandbox
    URL then follows it (a wildcard bind still becomes loopback)."""
    from nemo_gym.sandbox import agent_tools

    monkeypatch.setattr("nemo_gym.sandbox.agent_tools.get_server_url", lambda name: "http://0.0.0.0:9000")
    assert agent_tools.sandbox_server_url("policy_model") == "http://127.0.0.1:9000"
