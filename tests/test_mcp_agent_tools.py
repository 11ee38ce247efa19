"""Agents calling tools of third-party MCP servers (the ``mcp`` package's own server API), over
streamable HTTP and stdio: the rollout records and verifies the calls; server faults are classified.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from mcp.server.fastmcp import FastMCP
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.launch.launcher import free_port
from nemo_gym.response_items import output_text
from nemo_gym.serving.server import bind_socket
from nemo_gym.testing import SyncClient, running_agent, running_app
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.scripted_model.app import ScriptedModel

EXPECTED = "apple costs 3 coins"
ROW: dict[str, Any] = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is the price of apple?"}]},
    "expected": EXPECTED,
}
SCRIPTS = [
    {
        "match": "price of ([a-z]+)",
        "turns": [
            {"call_tool": "lookup_price", "arguments": {"item": "{match[1]}"}},
            {"text": "{tool_output}"},
        ],
    }
]


class PriceEnv(SimpleResourcesServer):
    """Scores 1.0 when a tool output and the final answer both hold the row's ``expected`` text."""

    config: BaseResourcesServerConfig

    @tool
    async def broken(self, body: dict[str, Any]) -> dict[str, Any]:
        """Fails like a tool whose own upstream is down."""
        raise RuntimeError("the price database is down")

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        expected = str((body.model_extra or {}).get("expected"))
        outputs = [i["output"] for i in body.response["output"] if i.get("type") == "function_call_output"]
        seen = any(expected in o for o in outputs) and expected in output_text(body.response)
        return BaseVerifyResponse(**body.model_dump(), reward=float(seen))


def shop() -> FastMCP:
    server = FastMCP("shop")

    @server.tool()
    def lookup_price(item: str) -> str:
        """The price of an item."""
        if item == "pear":
            raise ValueError("pears are not sold here")
        return f"{item} costs 3 coins"

    return server


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """An ASGI app with its lifespan (FastMCP's session manager runs in it) on a loopback port."""
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "MCP server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def run(mcp_servers: dict[str, Any], row: dict[str, Any] = ROW, **agent: Any) -> tuple[int, Any]:
    model = ScriptedModel({"name": "model", "scripts": SCRIPTS})
    with running_agent(
        PriceEnv({"name": "env"}), model, mcp_servers=mcp_servers, **agent, agent_class=SimpleAgent
    ) as url:
        with SyncClient() as client:
            return client.post(url + "/run", row)


def assert_recorded(answer: dict[str, Any], name: str = "lookup_price") -> None:
    call, output, message = answer["response"]["output"]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == (
        "function_call",
        name,
        {"item": "apple"},
    )
    assert (output["type"], output["call_id"], output["output"]) == (
        "function_call_output",
        call["call_id"],
        EXPECTED,
    )
    assert message["type"] == "message" and answer["reward"] == 1.0


def test_rollout_through_a_third_party_streamable_http_server():
    with serving(shop().streamable_http_app()) as base:
        status, answer = run({"shop": {"url": base + "/mcp"}})
        assert status == 200, answer
        assert_recorded(answer)
        offered = {t["name"]: t for t in answer["response"].get("tools") or []}
        assert offered["lookup_price"]["parameters"]["required"] == ["item"]
        # namespace: the model sees mcp__shop__lookup_price; the call still reaches the tool.
        scripts = [
            {
                **SCRIPTS[0],
                "turns": [
                    {**SCRIPTS[0]["turns"][0], "call_tool": "mcp__shop__lookup_price"},
                    SCRIPTS[0]["turns"][1],
                ],
            }
        ]
        model = ScriptedModel({"name": "model", "scripts": scripts})
        servers = {"shop": {"url": base + "/mcp", "namespace": True}}
        with (
            running_agent(
                PriceEnv({"name": "env"}), model, mcp_servers=servers, agent_class=SimpleAgent
            ) as url,
            SyncClient() as client,
        ):
            status, answer = client.post(url + "/run", ROW)
        assert status == 200, answer
        assert_recorded(answer, "mcp__shop__lookup_price")


def test_rollout_through_a_third_party_stdio_server(tmp_path: Path):
    script = tmp_path / "shop_stdio.py"
    script.write_text(
        "from mcp.server.fastmcp import FastMCP\n"
        "server = FastMCP('shop')\n"
        "@server.tool()\n"
        "def lookup_price(item: str) -> str:\n"
        "    '''The price of an item.'''\n"
        "    return f'{item} costs 3 coins'\n"
        "server.run()\n"
    )
    status, answer = run({"shop": {"command": sys.executable, "args": [str(script)]}})
    assert status == 200, answer
    assert_recorded(answer)


def test_a_tool_error_is_the_model_s_to_read():
    with serving(shop().streamable_http_app()) as base:
        row = {
            **ROW,
            "responses_create_params": {"input": [{"role": "user", "content": "the price of pear?"}]},
        }
        status, answer = run({"shop": {"url": base + "/mcp"}}, row)
    assert status == 200, answer
    output = answer["response"]["output"][1]["output"]
    assert "Error: tool 'lookup_price' failed" in output and "pears are not sold here" in output
    assert answer["reward"] == 0.0


def refusing(status: int) -> Starlette:
    async def answer(request: Any) -> JSONResponse:
        return JSONResponse({"error": "no"}, status_code=status)

    return Starlette(routes=[Route("/mcp", answer, methods=["GET", "POST", "DELETE"])])


@pytest.mark.parametrize(
    ("servers", "failure_class"),
    [
        ({"url": f"http://127.0.0.1:{free_port()}/mcp"}, "unreachable"),
        ({"command": "/nonexistent/mcp-server"}, "unreachable"),
        (500, "upstream_5xx"),
        (401, "upstream_auth"),
        (429, "rate_limited"),
    ],
)
def test_mcp_server_faults_fail_the_rollout_classified(servers: Any, failure_class: str):
    with contextlib.ExitStack() as stack:
        if isinstance(servers, int):
            base = stack.enter_context(running_app(refusing(servers)))
            servers = {"url": base + "/mcp"}
        status, answer = run({"shop": servers})
    assert status == 502, answer
    assert answer["failure_class"] == failure_class, answer
    assert "shop" in answer["error"]


def test_a_hung_mcp_server_is_cut_at_the_hop_deadline():
    async def hang(request: Any) -> JSONResponse:
        await asyncio.sleep(2.5)
        return JSONResponse({})

    app = Starlette(routes=[Route("/mcp", hang, methods=["POST"])])
    with running_app(app) as base:
        started = time.monotonic()
        status, answer = run({"shop": {"url": base + "/mcp"}}, hop_timeout_s=0.5)
    assert status == 502 and answer["failure_class"] == "timeout", answer
    assert time.monotonic() - started < 8


def test_our_resources_server_over_mcp_classifies_its_tool_s_fault():
    """A tool route answering 500 over MCP fails the rollout upstream_5xx, as over HTTP."""
    scripts: list[dict[str, Any]] = [{"turns": [{"call_tool": "broken", "arguments": {}}, {"text": "done"}]}]
    env = PriceEnv({"name": "env", "expose_tools_over_mcp": True})
    servers = {"env": {"from_seed_session": True, "namespace": True}}
    scripts[0]["turns"][0]["call_tool"] = "mcp__env__broken"
    model = ScriptedModel({"name": "model", "scripts": scripts})
    with (
        running_agent(env, model, mcp_servers=servers, agent_class=SimpleAgent) as url,
        SyncClient() as client,
    ):
        status, answer = client.post(url + "/run", ROW)
    assert status == 502 and answer["failure_class"] == "upstream_5xx", answer
    assert "the price database is down" in answer["error"]


def test_mcp_server_config_needs_exactly_one_transport():
    from nemo_gym.agents.mcp_tools import MCPServerConfig

    with pytest.raises(ValueError, match="exactly one of url"):
        MCPServerConfig.model_validate({"url": "http://x/mcp", "command": "y"})
    with pytest.raises(ValueError, match="exactly one of url"):
        MCPServerConfig.model_validate({})
