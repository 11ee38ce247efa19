"""A resources server's tools over MCP: per-session state, bad input as MCP errors, guard and auth.

Real servers on loopback, driven by the ``mcp`` package's own streamable HTTP client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import Request
from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.mcp_auto_exposure import (
    NEMO_GYM_MCP_SESSION_TOKEN_HEADER,
    maybe_auto_expose,
    normalize_tool_name,
)
from nemo_gym.server_utils import SESSION_ID_KEY
from nemo_gym.testing import running_server


class AddRequest(BaseModel):
    """Arguments of `add`."""

    amount: int


class CounterServer(SimpleResourcesServer):
    """A per-session counter; `slow` sleeps, `boom` fails."""

    config: BaseResourcesServerConfig

    @tool
    async def add(self, body: AddRequest) -> dict[str, int]:
        """Add to this session's counter."""
        self.session["total"] = self.session.get("total", 0) + body.amount
        return {"total": self.session["total"]}

    @tool
    async def slow(self, body: dict[str, Any]) -> dict[str, str]:
        """Wait a while."""
        await asyncio.sleep(float(body.get("seconds", 5)))
        return {"done": "yes"}

    @tool
    async def boom(self, body: dict[str, Any]) -> dict[str, str]:
        """Always fails."""
        raise RuntimeError("the tool broke")

    def mcp_allowed_tools_for_session(self, seed_body: dict[str, Any]) -> list[str] | None:
        return seed_body.get("allowed_tools")

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=float(self.session.get("total", 0)))


ROW: dict[str, Any] = {"responses_create_params": {"input": "count"}}


@pytest.fixture(scope="module")
def url():
    with running_server(CounterServer({"name": "counter", "expose_tools_over_mcp": True})) as base:
        yield base


@contextlib.asynccontextmanager
async def mcp_session(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with create_mcp_http_client(headers=headers, timeout=httpx.Timeout(10)) as client:
        async with streamable_http_client(url, http_client=client) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def seed(http: httpx.AsyncClient, url: str, row: dict[str, Any] = ROW) -> dict[str, str]:
    resp = await http.post(url + "/seed_session", json=row)
    assert resp.status_code == 200, resp.text
    meta = resp.json()["mcp"]
    assert meta["url_path"] == "/mcp"
    return meta["headers"]


def text(result: CallToolResult) -> str:
    return " ".join(getattr(part, "text", "") for part in result.content)


def test_mcp_calls_share_the_session_with_http_routes_and_verify(url: str):
    async def go() -> None:
        async with httpx.AsyncClient() as one, httpx.AsyncClient() as two:
            headers_one, headers_two = await seed(one, url), await seed(two, url)
            async with mcp_session(url + "/mcp", headers_one) as session:
                tools = {t.name: t for t in (await session.list_tools()).tools}
                assert set(tools) == {"add", "slow", "boom"}
                assert tools["add"].inputSchema["required"] == ["amount"]
                assert tools["add"].description == "Add to this session's counter."
                assert (await session.call_tool("add", {"amount": 2})).structuredContent == {"total": 2}
            # The same session over plain HTTP (cookie), then over MCP again.
            assert (await one.post(url + "/add", json={"amount": 3})).json() == {"total": 5}
            async with mcp_session(url + "/mcp", headers_one) as session:
                assert (await session.call_tool("add", {"amount": 1})).structuredContent == {"total": 6}
            async with mcp_session(url + "/mcp", headers_two) as session:
                assert (await session.call_tool("add", {"amount": 10})).structuredContent == {"total": 10}
            verified = (await one.post(url + "/verify", json={**ROW, "response": {"output": []}})).json()
            assert verified["reward"] == 6.0
            assert (await two.post(url + "/verify", json={**ROW, "response": {"output": []}})).json()[
                "reward"
            ] == 10

    asyncio.run(go())


def test_bad_input_is_a_clear_mcp_error_and_nothing_is_lost(url: str):
    async def go() -> None:
        async with httpx.AsyncClient() as http:
            headers = await seed(http, url)
            async with mcp_session(url + "/mcp", headers) as session:
                await session.call_tool("add", {"amount": 4})
                unknown = await session.call_tool("multiply", {"by": 2})
                assert (
                    unknown.isError
                    and "unknown tool 'multiply'" in text(unknown)
                    and "'add'" in text(unknown)
                )
                bad = await session.call_tool("add", {"amount": "four"})
                assert bad.isError and "invalid arguments for 'add'" in text(bad) and "amount" in text(bad)
                missing = await session.call_tool("add", {})
                assert missing.isError and "amount" in text(missing)
                broke = await session.call_tool("boom", {})
                assert broke.isError and "HTTP 500" in text(broke) and "the tool broke" in text(broke)
                # After all of that, the session's state is what the good call left.
                assert (await session.call_tool("add", {"amount": 1})).structuredContent == {"total": 5}
            async with mcp_session(url + "/mcp", {}) as session:
                assert {t.name for t in (await session.list_tools()).tools} == {"add", "slow", "boom"}
                no_token = await session.call_tool("add", {"amount": 1})
                assert no_token.isError and NEMO_GYM_MCP_SESSION_TOKEN_HEADER in text(no_token)
            forged = dict(headers)
            claims, _, _ = forged[NEMO_GYM_MCP_SESSION_TOKEN_HEADER].partition(".")
            forged[NEMO_GYM_MCP_SESSION_TOKEN_HEADER] = claims + ".AAAA"
            async with mcp_session(url + "/mcp", forged) as session:
                result = await session.call_tool("add", {"amount": 1})
                assert result.isError and "invalid X-NeMo-Gym-Session-Token" in text(result)
            assert (await http.post(url + "/add", json={"amount": 0})).json() == {"total": 5}
            await http.post(url + "/verify", json={**ROW, "response": {"output": []}})
            # Verified: the session is closed; a late MCP call says so instead of starting afresh.
            async with mcp_session(url + "/mcp", headers) as session:
                late = await session.call_tool("add", {"amount": 1})
                assert late.isError and "session is closed" in text(late) and "/seed_session" in text(late)

    asyncio.run(go())


def test_a_dropped_mcp_connection_loses_nothing(url: str):
    async def go() -> None:
        async with httpx.AsyncClient() as http:
            headers = await seed(http, url)
            # The client gives up on a slow call and drops its connection mid-call.
            with pytest.raises(BaseException):  # noqa: B017,PT011 - the SDK wraps the timeout in a group
                async with create_mcp_http_client(headers=headers, timeout=httpx.Timeout(0.5)) as client:
                    async with streamable_http_client(url + "/mcp", http_client=client) as (read, write, *_):
                        async with ClientSession(read, write) as session:
                            await session.initialize()
                            await session.call_tool("slow", {"seconds": 3})
            # The server still serves this session, over MCP and HTTP, with its state intact.
            async with mcp_session(url + "/mcp", headers) as session:
                assert (await session.call_tool("add", {"amount": 7})).structuredContent == {"total": 7}
            assert (await http.post(url + "/add", json={"amount": 1})).json() == {"total": 8}

    asyncio.run(go())


def test_per_session_tool_allow_list_and_rollout_prefix(url: str):
    async def go() -> None:
        async with httpx.AsyncClient() as http:
            headers = await seed(http, url, {**ROW, "allowed_tools": ["add"]})
            async with mcp_session(url + "/ng-rollout/r-1/mcp", headers) as session:
                assert [t.name for t in (await session.list_tools()).tools] == ["add"]
                refused = await session.call_tool("boom", {})
                assert refused.isError and "not allowed in this session" in text(refused)
                assert (await session.call_tool("add", {"amount": 1})).structuredContent == {"total": 1}

    asyncio.run(go())


def test_request_guard_limits_the_mcp_route():
    server = CounterServer({"name": "small", "expose_tools_over_mcp": True, "max_body_bytes": 2000})
    with running_server(server) as base:
        big = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "add", "arguments": {"x": "y" * 5000}},
        }
        resp = httpx.post(base + "/mcp", json=big, headers={"Accept": "application/json, text/event-stream"})
        assert resp.status_code == 413 and resp.json()["server"] == "small"


@pytest.mark.parametrize("style", ["ours", "nemo_gym"])
def test_auth_token_and_host_guard_cover_the_mcp_route(monkeypatch: pytest.MonkeyPatch, style: str):
    monkeypatch.setenv("NEMO_GYM_AUTH_TOKEN", "s3cret-token")
    config = BaseResourcesServerConfig(name="authed", expose_tools_over_mcp=True)
    server = CounterServer(config=config) if style == "ours" else NeMoGymStyleWeather(config=config)
    tool, arguments = ("add", {"amount": 2}) if style == "ours" else ("get_weather", {"city": "Oslo"})
    with running_server(server) as base:
        bearer = {"Authorization": "Bearer s3cret-token"}

        async def go() -> None:
            async with httpx.AsyncClient(headers=bearer) as http:
                headers = await seed(http, base)
            probe = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            accept = {"Accept": "application/json, text/event-stream"}
            async with httpx.AsyncClient() as anon:
                refused = await anon.post(base + "/mcp", json=probe, headers={**accept, **headers})
                assert refused.status_code == 401 and refused.json()["server"] == "authed"
                rebound = {**accept, **headers, **bearer, "Host": "attacker.example"}
                assert (await anon.post(base + "/mcp", json=probe, headers=rebound)).status_code == 400
            async with mcp_session(base + "/mcp", {**headers, **bearer}) as session:
                assert not (await session.call_tool(tool, arguments)).isError

        asyncio.run(go())


def test_exposure_is_off_by_default_and_names_match_nemo_gym():
    plain = CounterServer({"name": "plain"})
    assert maybe_auto_expose(plain) is None
    assert not any(getattr(r, "path", "") == "/mcp" for r in plain.routes())
    exposed = CounterServer({"name": "on", "expose_tools_over_mcp": True})
    assert set(maybe_auto_expose(exposed) or {}) == {"add", "slow", "boom"}
    assert NEMO_GYM_MCP_SESSION_TOKEN_HEADER == "X-NeMo-Gym-Session-Token"
    assert normalize_tool_name("mcp__on__add", "on") == "add"
    assert normalize_tool_name("mcp__other__add", "on") == "mcp__other__add"
    assert normalize_tool_name("mcp__x__add") == "add" and normalize_tool_name("add") == "add"


def test_verify_scores_namespaced_tool_names_bare_and_keeps_them_in_the_answer():
    from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer

    server = ExampleSingleToolCallServer({"name": "weather", "expose_tools_over_mcp": True})
    output = [
        {"type": "function_call", "call_id": "c1", "name": "mcp__weather__get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "cold"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Wear a coat."}],
        },
    ]
    with running_server(server) as base:
        answer = httpx.post(base + "/verify", json={**ROW, "response": {"output": output}}).json()
    assert answer["reward"] == 1.0 and answer["called_tool"] is True
    assert answer["response"]["output"][0]["name"] == "mcp__weather__get_weather"


class NeMoGymStyleWeather(SimpleResourcesServer):
    """Written the way NeMo Gym's environments are: a FastAPI app extended in ``setup_webserver``,
    handlers taking ``Request``, state keyed by ``request.session[SESSION_ID_KEY]``."""

    config: BaseResourcesServerConfig
    calls_by_session: dict[str, list[str]] = Field(default_factory=dict)

    def setup_webserver(self) -> Any:
        app = super().setup_webserver()
        app.post("/get_weather")(self.get_weather)
        return app

    async def seed_session(self, request: Request, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        self.calls_by_session[request.session[SESSION_ID_KEY]] = []
        return BaseSeedSessionResponse()

    async def get_weather(self, request: Request, body: CityRequest) -> dict[str, str]:
        """Get the weather of a city."""
        self.calls_by_session.setdefault(request.session[SESSION_ID_KEY], []).append(body.city)
        return {"weather": f"sunny in {body.city}"}

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        calls = self.calls_by_session.get(request.session[SESSION_ID_KEY], [])
        return BaseVerifyResponse(**body.model_dump(), reward=float(calls == ["Oslo"]))


class CityRequest(BaseModel):
    """Arguments of `get_weather`."""

    city: str


def test_a_nemo_gym_style_server_shares_request_session_with_mcp():
    server = NeMoGymStyleWeather(config=BaseResourcesServerConfig(name="ngw", expose_tools_over_mcp=True))

    async def go(base: str) -> None:
        async with httpx.AsyncClient() as one, httpx.AsyncClient() as two:
            headers = await seed(one, base)
            await seed(two, base)
            async with mcp_session(base + "/mcp", headers) as session:
                tools = (await session.list_tools()).tools
                assert [t.name for t in tools] == ["get_weather"]
                assert tools[0].inputSchema["required"] == ["city"]
                result = await session.call_tool("get_weather", {"city": "Oslo"})
                assert result.structuredContent == {"weather": "sunny in Oslo"}
                bad = await session.call_tool("get_weather", {"town": "Oslo"})
                assert bad.isError and "city" in text(bad)
            assert (await one.post(base + "/verify", json={**ROW, "response": {"output": []}})).json()[
                "reward"
            ] == 1.0
            assert (await two.post(base + "/verify", json={**ROW, "response": {"output": []}})).json()[
                "reward"
            ] == 0.0

    with running_server(server) as base:
        asyncio.run(go(base))


class Dispatcher(SimpleResourcesServer):
    """NeMo Gym's dispatcher shape: one ``POST /{path}`` route; the tools' schemas live in data."""

    config: BaseResourcesServerConfig
    seen: dict[str, list[int]] = Field(default_factory=dict)

    def setup_webserver(self) -> Any:
        app = super().setup_webserver()
        app.post("/{path}")(self.route_to_function)
        return app

    def mcp_tools(self, harvested: list[Any], catchall: Any) -> list[Any]:
        schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
        return harvested + [catchall.tool("double", schema, "Double x.")]

    async def route_to_function(self, path: str, body: dict[str, Any], request: Request) -> dict[str, Any]:
        self.seen.setdefault(request.session[SESSION_ID_KEY], []).append(body["x"])
        return {"tool": path, "result": body["x"] * 2}

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(
            **body.model_dump(), reward=float(sum(self.seen.get(request.session[SESSION_ID_KEY], [])))
        )


def test_catch_all_route_tools_over_mcp():
    server = Dispatcher(config=BaseResourcesServerConfig(name="dispatch", expose_tools_over_mcp=True))

    async def go(base: str) -> None:
        async with httpx.AsyncClient() as http:
            headers = await seed(http, base)
            async with mcp_session(base + "/mcp", headers) as session:
                tools = (await session.list_tools()).tools
                assert [(t.name, t.description) for t in tools] == [("double", "Double x.")]
                assert (await session.call_tool("double", {"x": 21})).structuredContent == {
                    "tool": "double",
                    "result": 42,
                }
            assert (await http.post(base + "/verify", json={**ROW, "response": {"output": []}})).json()[
                "reward"
            ] == 21

    with running_server(server) as base:
        asyncio.run(go(base))
