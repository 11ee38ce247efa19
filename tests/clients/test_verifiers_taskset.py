"""verifiers' current NeMo Gym taskset (``verifiers/v1/tasksets/nemo_gym/``, main since 2026-08), step by step.

As its code does it, for ``example_mcp_weather`` (tools over MCP) and ``example_single_tool_call``
(direct tools):

- ``NeMoGymEnv.start``: run ``server.py`` as a child process with ``NEMO_GYM_RESOURCE_SERVER`` set
  to the taskset's class, read ``nemo_gym.port`` from its working directory, GET the base URL
  until it answers. ``verifiers_taskset_server.py`` here does what ``server.py`` does; for
  ``example_mcp_weather`` the test also runs verifiers' own ``server.py``, unchanged, from the
  ``verifiers`` release on the package index (fetched with ``pip download`` into a cache outside
  the repository; skipped, saying so, when the index cannot be reached);
- ``NeMoGymTask.setup``: the row's function tools become the direct tools; ``POST /seed_session``
  with the row (cookies kept); when the answer has ``mcp``, the MCP URL is the base URL plus its
  ``url_path`` and the MCP headers are the task's headers plus its ``headers``;
- ``NeMoGymToolset``: ``tools/list`` and ``tools/call`` each on a fresh MCP session (the ``mcp``
  package's streamable HTTP client, headers only, no cookies), or for direct tools ``POST /<tool>``
  with the cookies, the answer's text as the tool result;
- ``NeMoGymTask.nemo_gym`` (the reward): ``POST /verify`` with the row plus the response built
  from the trace (``trace_to_nemo_response``'s shape), ``reward`` popped from the answer,
  ``responses_create_params`` and ``response`` deleted, every numeric field a metric.

The trainer side (the model and the harness loop) is stubbed: it calls the first tool for the
city the prompt names, then answers with the tool's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.types import CallToolResult, TextContent, Tool

from nemo_gym.launch.config import project_root
from nemo_gym.testing import read_jsonl

pytestmark = pytest.mark.slow

HOSTING_SCRIPT = Path(__file__).with_name("verifiers_taskset_server.py")
REQUEST_TIMEOUT_S = 60.0


VERIFIERS_RELEASE = "0.4.0"  # the first release with verifiers/v1/tasksets/nemo_gym (2026-10)
CACHE = Path(os.environ.get("NEMO_GYM_TEST_CACHE", Path.home() / ".cache" / "nemo_gym_tests"))


def verifiers_server_py() -> Path | None:
    """verifiers' own ``server.py`` from its release on the package index (None: not reachable)."""
    target = CACHE / f"verifiers-{VERIFIERS_RELEASE}" / "server.py"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        fetched = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                f"verifiers=={VERIFIERS_RELEASE}",
                "-d",
                tmp,
            ],
            capture_output=True,
            timeout=180,
        )
        wheels = list(Path(tmp).glob("verifiers-*.whl"))
        if fetched.returncode != 0 or not wheels:
            return None
        with zipfile.ZipFile(wheels[0]) as wheel:
            source = wheel.read("verifiers/v1/tasksets/nemo_gym/server.py")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source)
    return target


@contextlib.contextmanager
def hosted_like_verifiers(entrypoint: str, workdir: Path, script: Path = HOSTING_SCRIPT) -> Iterator[str]:
    """``NeMoGymEnv.start``: the class served by a child process running ``script``; yields its base URL."""
    env = {**os.environ, "NEMO_GYM_RESOURCE_SERVER": entrypoint, "PYTHONPATH": str(project_root())}
    log = (workdir / "nemo_gym.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, str(script)], cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        url = None
        for _ in range(60):
            try:
                port = int((workdir / "nemo_gym.port").read_text())
                url = f"http://127.0.0.1:{port}"
                httpx.get(url, timeout=1)
                break
            except (FileNotFoundError, ValueError, httpx.HTTPError):
                url = None
            if child.poll() is not None:
                break
            time.sleep(0.5)
        if url is None:
            raise RuntimeError(
                f"NeMo Gym server did not start:\n{(workdir / 'nemo_gym.log').read_text()[-2000:]}"
            )
        yield url
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)
        log.close()


class TaskState:
    """``NeMoGymState``: one rollout's session with the environment."""

    def __init__(self, resources_url: str, headers: dict[str, str] | None = None) -> None:
        self.resources_url = resources_url.rstrip("/")
        self.headers = dict(headers or {})
        self.cookies: dict[str, str] = {}
        self.mcp_url: str | None = None
        self.mcp_headers: dict[str, str] = {}
        self.direct_tools: dict[str, dict[str, Any]] = {}
        self.tool_names: list[str] = []

    async def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        async with httpx.AsyncClient(
            headers=self.headers, cookies=self.cookies, timeout=REQUEST_TIMEOUT_S
        ) as client:
            return await client.post(f"{self.resources_url}/{path}", json=body)

    @contextlib.asynccontextmanager
    async def mcp_session(self) -> AsyncIterator[ClientSession]:
        assert self.mcp_url is not None
        async with (
            create_mcp_http_client(
                headers=self.mcp_headers, timeout=httpx.Timeout(REQUEST_TIMEOUT_S)
            ) as client,
            streamable_http_client(self.mcp_url, http_client=client) as (read, write, *_),
        ):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session

    # ---- NeMoGymTask.setup -------------------------------------------------------------
    async def setup(self, row: dict[str, Any]) -> None:
        tools = row["responses_create_params"].get("tools") or []
        self.direct_tools = {tool["name"]: tool for tool in tools if tool.get("type") == "function"}
        self.tool_names = list(self.direct_tools)
        response = await self.post("seed_session", row)
        response.raise_for_status()
        self.cookies.update(response.cookies)
        if metadata := response.json().get("mcp"):
            self.mcp_url = f"{self.resources_url}/{metadata['url_path'].lstrip('/')}"
            self.mcp_headers = self.headers | metadata["headers"]

    # ---- NeMoGymToolset ----------------------------------------------------------------
    async def list_tools(self) -> list[Tool]:
        if self.mcp_url is not None:
            async with self.mcp_session() as session:
                tools = (await session.list_tools()).tools
        else:
            tools = [
                Tool(
                    name=spec["name"],
                    description=spec.get("description") or None,
                    inputSchema=spec.get("parameters") or {},
                )
                for spec in self.direct_tools.values()
            ]
        self.tool_names = [tool.name for tool in tools]
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        if self.mcp_url is not None:
            async with self.mcp_session() as session:
                return await session.call_tool(name, arguments)
        if name not in self.direct_tools:
            raise ValueError(f"unknown NeMo Gym tool: {name}")
        response = await self.post(name, arguments)
        return CallToolResult(
            content=[TextContent(type="text", text=response.text)], isError=not response.is_success
        )

    # ---- NeMoGymTask.nemo_gym (the reward) ---------------------------------------------
    async def reward(
        self, row: dict[str, Any], response: dict[str, Any]
    ) -> tuple[float, dict[str, Any], dict[str, float]]:
        answer = await self.post("verify", row | {"response": response})
        answer.raise_for_status()
        result = answer.json()
        reward = result.pop("reward")
        del result["responses_create_params"], result["response"]
        metrics = {
            key: float(value) for key, value in result.items() if isinstance(value, (bool, int, float))
        }
        return float(reward), result, metrics


def nemo_response(row: dict[str, Any], trace_id: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    """``trace_to_nemo_response``'s shape for one branch."""
    params = row["responses_create_params"]
    return {
        "id": f"resp_{trace_id}",
        "created_at": time.time(),
        "model": str(params.get("model") or "verifiers"),
        "object": "response",
        "output": output,
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": params.get("tools") or [],
        "status": "completed",
    }


async def rollout(
    url: str, row: dict[str, Any], trace_id: str
) -> tuple[float, dict[str, Any], dict[str, float], list]:
    """One task: setup, the stubbed harness (first tool for the prompt's city, then answer), reward."""
    state = TaskState(url)
    await state.setup(row)
    tools = await state.list_tools()
    prompt = json.dumps(row["responses_create_params"]["input"])
    city = re.findall(r"(?:for|in) ([A-Z][a-z]+)", prompt)[-1]
    result = await state.call_tool(tools[0].name, {"city": city})
    assert not result.isError, result
    text = "".join(part.text for part in result.content if isinstance(part, TextContent))
    call_id = f"call_{trace_id}"
    output = [
        {
            "type": "function_call",
            "call_id": call_id,
            "name": tools[0].name,
            "arguments": json.dumps({"city": city}),
        },
        {"type": "function_call_output", "call_id": call_id, "output": text},
        {
            "id": f"msg_{trace_id}_2",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        },
    ]
    reward, info, metrics = await state.reward(row, nemo_response(row, trace_id, output))
    return reward, info, metrics, tools


def rows_of(folder: str) -> list[dict[str, Any]]:
    return read_jsonl(project_root() / "resources_servers" / folder / "data" / "example.jsonl")


@pytest.mark.parametrize("hosting", ["step_by_step", "verifiers_server_py"])
def test_example_mcp_weather_over_mcp(tmp_path: Path, hosting: str):
    rows = rows_of("example_mcp_weather")
    entrypoint = "resources_servers.example_mcp_weather.app:ExampleMCPWeatherResourcesServer"
    script = HOSTING_SCRIPT
    if hosting == "verifiers_server_py":
        fetched = verifiers_server_py()
        if fetched is None:
            pytest.skip(f"verifiers=={VERIFIERS_RELEASE} could not be fetched from the package index")
        script = fetched
    with hosted_like_verifiers(entrypoint, tmp_path, script) as url:

        async def all_rows() -> list[Any]:
            return await asyncio.gather(*(rollout(url, row, f"t{i}") for i, row in enumerate(rows)))

        results = asyncio.run(all_rows())
    for row, (reward, info, metrics, tools) in zip(rows, results, strict=True):
        assert [tool.name for tool in tools] == ["get_weather"]
        assert tools[0].inputSchema["required"] == ["city"]
        city = row["verifier_metadata"]["expected_city"]
        assert reward == 1.0
        assert info["expected_weather"] == f"The weather in {city} is sunny and 72 F."
        assert metrics["tool_call_seen"] == 1.0 and metrics["final_response_mentions_weather"] == 1.0


def test_example_single_tool_call_with_direct_tools(tmp_path: Path):
    rows = rows_of("example_single_tool_call")
    entrypoint = "resources_servers.example_single_tool_call.app:ExampleSingleToolCallServer"
    with hosted_like_verifiers(entrypoint, tmp_path) as url:

        async def all_rows() -> list[Any]:
            return await asyncio.gather(*(rollout(url, row, f"t{i}") for i, row in enumerate(rows)))

        results = asyncio.run(all_rows())
    for reward, info, metrics, tools in results:
        assert [tool.name for tool in tools] == ["get_weather"]
        assert reward == 1.0
        assert metrics["called_tool"] == 1.0 and metrics["answered"] == 1.0
        assert "mcp" not in info
