"""A collection driven through a NeMo Gym-style client: a ``RolloutCollectionHelper`` subclass
whose ``setup_server_client`` answers aiohttp responses and whose ``_call_aggregate_metrics`` is
overridden (0.7.0's remote_agent drives the collector this way). A verify answer naming its own
failure keeps its ``error`` in the failures row, as NeMo Gym keeps the answer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from nemo_gym import rollout_collection as rc
from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
from nemo_gym.serving.protocol import auth_headers
from nemo_gym.testing import read_jsonl, running_server, write_jsonl


class RoutingAgent(SimpleResponsesAPIAgent):
    """Scores ``ok`` rows 1.0; answers any other row with a named failure and an ``error``."""

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        if body["responses_create_params"]["input"] == "ok":
            return {**body, "response": {"output": []}, "reward": 1.0}
        return {**body, "response": {"output": []}, "reward": 0.0, "_ng_failure_class": "remote_agent_error",
                "error": "HTTP 500: remote exploded (key sk-abcdefghijklmnopqrstuvwx)"}  # fmt: skip


class AiohttpStyleClient:
    """NeMo Gym's client shape: ``post`` answers an aiohttp response (status, async ``read()``)."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url, self.session = url, session

    async def post(
        self, server_name: str, url_path: str, json: Any = None, **_: Any
    ) -> aiohttp.ClientResponse:
        resp = await self.session.post(self.url + url_path, json=json, headers=auth_headers())
        await resp.read()
        return resp


def test_collection_through_an_aiohttp_style_client_and_an_overridden_metrics_hook(tmp_path: Path) -> None:
    rows = [{"responses_create_params": {"input": text}} for text in ("ok", "fail")]
    config = rc.RolloutCollectionConfig(
        input_jsonl_fpath=str(write_jsonl(tmp_path / "in.jsonl", rows)),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        agent_name="remote",
    )
    hook_calls: list[int] = []

    async def collect(url: str) -> Any:
        async with aiohttp.ClientSession() as session:

            class Helper(rc.RolloutCollectionHelper):
                def setup_server_client(self, *args: Any, **kwargs: Any) -> Any:
                    return AiohttpStyleClient(url, session)

                async def _call_aggregate_metrics(self, results: Any, rows: Any, output_fpath: Any) -> Path:
                    hook_calls.append(len(results))
                    path = tmp_path / "hook_metrics.json"
                    path.write_text(json.dumps([{"agent_ref": {"name": "remote"}, "key_metrics": {"n": 1}}]))
                    return path

            return await Helper().run_from_config(config)

    with running_server(RoutingAgent({"name": "remote"})) as url:
        summary = asyncio.run(collect(url))
    assert [r["reward"] for r in read_jsonl(tmp_path / "out.jsonl")] == [1.0]
    assert hook_calls == [1] and summary.metrics == [
        {"agent_ref": {"name": "remote"}, "key_metrics": {"n": 1}}
    ]
    (failure,) = read_jsonl(tmp_path / "out_failures.jsonl")
    assert failure["_ng_failure_class"] == "remote_agent_error"
    assert (
        failure["error"].startswith("HTTP 500: remote exploded") and "sk-abcdefghij" not in failure["error"]
    )
    assert "HTTP 500" in failure["_ng_error"] and "response" not in failure
