"""example_mcp_weather: the tool over MCP and over HTTP in one session, the reward, session isolation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from nemo_gym.response_items import message_item
from nemo_gym.testing import read_jsonl, running_server
from resources_servers.example_mcp_weather.app import ExampleMCPWeatherResourcesServer

HERE = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(HERE / "data" / "example.jsonl")


@pytest.fixture(scope="module")
def url():
    with running_server(ExampleMCPWeatherResourcesServer({"name": "example_mcp_weather"})) as base:
        yield base


async def seed(http: httpx.AsyncClient, url: str, row: dict[str, Any]) -> dict[str, Any]:
    resp = await http.post(url + "/seed_session", json=row)
    assert resp.status_code == 200, resp.text
    return resp.json()["mcp"]


async def call_over_mcp(url: str, meta: dict[str, Any], name: str, arguments: dict[str, Any]) -> Any:
    async with create_mcp_http_client(headers=meta["headers"]) as client:
        async with streamable_http_client(url + meta["url_path"], http_client=client) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = [tool.name for tool in (await session.list_tools()).tools]
                assert listed == ["get_weather"]
                return await session.call_tool(name, arguments)


def answer(text: str) -> dict[str, Any]:
    return {"output": [message_item(text)]}


async def verify(http: httpx.AsyncClient, url: str, row: dict[str, Any], text: str) -> dict[str, Any]:
    resp = await http.post(url + "/verify", json={**row, "response": answer(text)})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_seed_answers_mcp_metadata_as_nemo_gym(url: str):
    async def go() -> None:
        async with httpx.AsyncClient() as http:
            meta = await seed(http, url, ROWS[0])
        assert meta["url_path"] == "/mcp" and meta["transport"] == "http"
        assert meta["server_name"] == "example_mcp_weather"
        assert set(meta["headers"]) == {"X-NeMo-Gym-Session-Token"}

    asyncio.run(go())


def test_tool_over_mcp_counts_in_its_session_only(url: str):
    async def go() -> None:
        paris, tokyo = ROWS[0], ROWS[1]
        async with httpx.AsyncClient() as first, httpx.AsyncClient() as second:
            meta = await seed(first, url, paris)
            await seed(second, url, tokyo)
            result = await call_over_mcp(url, meta, "get_weather", {"city": "Paris"})
            assert not result.isError
            assert result.structuredContent == {"weather": "The weather in Paris is sunny and 72 F."}
            good = await verify(first, url, paris, "The weather in Paris is sunny and 72 F.")
            # The other session never called the tool: the right sentence alone is not enough.
            other = await verify(second, url, tokyo, "The weather in Tokyo is sunny and 72 F.")
        assert (good["reward"], good["tool_call_seen"], good["final_response_mentions_weather"]) == (
            1.0,
            True,
            True,
        )
        assert good["expected_weather"] == "The weather in Paris is sunny and 72 F."
        assert (other["reward"], other["tool_call_seen"], other["final_response_mentions_weather"]) == (
            0.0,
            False,
            True,
        )

    asyncio.run(go())


def test_http_tool_call_and_wrong_answer(url: str):
    async def go() -> None:
        row = ROWS[2]  # Seattle
        async with httpx.AsyncClient() as http:
            await seed(http, url, row)
            resp = await http.post(url + "/get_weather", json={"city": "SEATTLE"})
            assert resp.json() == {"weather": "The weather in SEATTLE is sunny and 72 F."}
            wrong = await verify(http, url, row, "It is raining in Seattle.")
        assert (wrong["reward"], wrong["tool_call_seen"], wrong["final_response_mentions_weather"]) == (
            0.0,
            True,
            False,
        )

    asyncio.run(go())


def test_rows_and_config():
    assert len(ROWS) == 5
    cities = [row["verifier_metadata"]["expected_city"] for row in ROWS]
    assert cities == ["Paris", "Tokyo", "Seattle", "Nairobi", "Toronto"]
    for row, city in zip(ROWS, cities, strict=True):
        assert city in json.dumps(row["responses_create_params"]["input"])


def test_example_rows_end_to_end_through_mcp(tmp_path: Path):
    """ng_run's stack: simple_agent takes the tool from the environment's /mcp; every row scores 1.0."""
    from nemo_gym.testing import collect_examples

    summary, rows = collect_examples(HERE, tmp_path / "out.jsonl")
    assert len(rows) == 5 and all(row["reward"] == 1.0 for row in rows), rows
    for row in rows:
        call, output, message = row["response"]["output"]
        city = row["verifier_metadata"]["expected_city"]
        assert (call["type"], call["name"], json.loads(call["arguments"])) == (
            "function_call",
            "get_weather",
            {"city": city},
        )
        assert output["type"] == "function_call_output" and output["call_id"] == call["call_id"]
        assert json.loads(output["output"]) == {"weather": f"The weather in {city} is sunny and 72 F."}
        assert row["tool_call_seen"] and row["final_response_mentions_weather"]
