"""Client mistakes get a JSON 4xx naming the problem, on every kind of server, never a 5xx.

Real servers on 127.0.0.1; the keep-alive checks send over one raw HTTP/1.1 connection, so a
server that drops the connection after an error is caught.
"""

from __future__ import annotations

import http.client
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from nemo_gym.launch.head_server import HeadServer
from nemo_gym.serving.request_guard import MAX_JSON_DEPTH, json_nesting_depth
from nemo_gym.serving.server import BaseServer, BaseServerConfig, ServerRef
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import running_app, running_server
from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer

NOT_OBJECTS = [b"[]", b'"s"', b"1", b"null", b"true", b"[1, {}]"]


def nested(depth: int) -> bytes:
    return b'{"responses_create_params": {}, "response": ' + b"[" * depth + b"]" * depth + b"}"


class Connection:
    """One kept-alive HTTP/1.1 connection; ``request`` returns (status, JSON body, headers)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any, dict[str, str]]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=body, headers=headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        assert resp.getheader("content-type", "").startswith("application/json"), (resp.status, raw[:200])
        return resp.status, orjson.loads(raw), {k.lower(): v for k, v in resp.getheaders()}

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(scope="module")
def env_url():
    with running_server(ExampleSingleToolCallServer({"name": "weather"})) as url:
        yield url


def test_depth_scan_ignores_brackets_inside_strings():
    assert json_nesting_depth(b'{"a": "[[[[{{{{", "b": [[1]]}') == 3
    assert json_nesting_depth(b'["\\"[[[", ["\\\\"], {"k": "\\\\\\"{{"}]') == 2
    assert json_nesting_depth(b"[" * 300 + b"]" * 300) == 300
    assert json_nesting_depth(b"12") == 0


@pytest.mark.parametrize("route", ["/seed_session", "/verify", "/get_weather", "/aggregate_metrics"])
def test_non_object_bodies_are_4xx_naming_the_problem(env_url, route):
    conn = Connection(env_url)
    try:
        for body in NOT_OBJECTS:
            status, answer, _ = conn.request("POST", route, body)
            assert 400 <= status < 500, (route, body, status, answer)
            assert answer["server"] == "weather" and answer["error"]
        # The connection survived every refusal.
        assert conn.request("GET", "/")[0] == 200
    finally:
        conn.close()


def test_wrong_nested_types_in_a_response_are_422_naming_the_field(env_url):
    conn = Connection(env_url)
    try:
        good_item = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi"}],
        }
        for response, field in [
            ({"output": [good_item, "x"]}, "response.output.1"),
            ({"output": "just text"}, "response.output"),
            ({"output": [{"type": "message", "content": [3]}]}, "response.output.0.content.0"),
            ({"output": [{"type": 7}]}, "response.output.0.type"),
            ([1, 2], "response"),
        ]:
            body = orjson.dumps({"responses_create_params": {}, "response": response})
            status, answer, _ = conn.request("POST", "/verify", body)
            assert status == 422, (response, answer)
            assert field in answer["error"], answer
        status, answer, _ = conn.request(
            "POST",
            "/verify",
            orjson.dumps({"responses_create_params": {}, "response": {"output": [good_item]}}),
        )
        assert status == 200 and answer["reward"] == 0.0
    finally:
        conn.close()


def test_deep_nesting_is_400_and_keeps_the_connection(env_url):
    conn = Connection(env_url)
    try:
        for route in ["/verify", "/seed_session", "/get_weather"]:
            status, answer, _ = conn.request("POST", route, nested(300))
            assert status == 400 and "levels" in answer["error"], (route, answer)
            # The very next request on the same connection is served.
            assert conn.request("GET", "/")[:2] == (200, {"status": "ok", "server": "weather"})
        # /aggregate_metrics reads rows one at a time and echoes none: deep rows are no 5xx there.
        for depth in (300, 5000):
            body = b'{"verify_responses": [{"reward": 1, "x": ' + b"[" * depth + b"]" * depth + b"}]}"
            status, answer, _ = conn.request("POST", "/aggregate_metrics", body)
            assert status < 500, answer
        assert conn.request("GET", "/")[0] == 200
        # Just under the limit is accepted as JSON (and then judged on its shape).
        status, answer, _ = conn.request("POST", "/verify", nested(MAX_JSON_DEPTH - 2))
        assert status == 422 and "response" in answer["error"]
    finally:
        conn.close()


def test_huge_numbers_in_aggregate_metrics_are_not_a_5xx(env_url):
    conn = Connection(env_url)
    try:
        rows = [{"reward": 1.5e308, "score": 1.5e308}, {"reward": 1.5e308, "score": -1.5e308}]
        status, answer, _ = conn.request(
            "POST", "/aggregate_metrics", orjson.dumps({"verify_responses": rows})
        )
        assert status < 500, answer
        status, answer, _ = conn.request(
            "POST", "/aggregate_metrics", b'{"verify_responses": [{"reward": 1e999}]}'
        )
        assert status < 500, answer
        assert conn.request("GET", "/")[0] == 200
    finally:
        conn.close()


@pytest.fixture(scope="module")
def head_url():
    with running_app(HeadServer({}).build_app()) as url:
        yield url


def test_head_server_errors_are_json_4xx(head_url):
    conn = Connection(head_url)
    try:
        assert conn.request("POST", "/deregister", b"{not json")[0] == 400
        assert conn.request("POST", "/register", b"{not json")[0] == 400
        for body in NOT_OBJECTS:
            assert conn.request("POST", "/register", body)[0] == 422
            assert conn.request("POST", "/deregister", body)[0] == 422
        assert conn.request("POST", "/register", b'{"name": "x", "host": "h", "port": "many"}')[0] == 422
        assert conn.request("POST", "/register", b'{"name": ["x"], "host": "h", "port": 1}')[0] == 422
        assert conn.request("POST", "/deregister", nested(300))[0] == 400
        status, answer, _ = conn.request("GET", "/no/such/route")
        assert status == 404 and "no route" in answer["error"] and answer["server"] == "head_server"
        status, answer, _ = conn.request("DELETE", "/register")
        assert status == 405 and "method not allowed" in answer["error"]
        assert conn.request("GET", "/server_instances")[:2] == (200, [])
    finally:
        conn.close()


class PassThroughAgent(BaseServer):
    """An agent-like hop that forwards the caller's arguments to a tool downstream."""

    server_type = "responses_api_agents"

    class Config(BaseServerConfig):
        resources_server: ServerRef

    config: Config

    def routes(self):
        return super().routes() + [self.route("/run", self.run)]

    async def run(self, body: dict) -> Any:
        return await self.server_client.post_json(
            self.config.resources_server.name, "/get_weather", body["args"]
        )


def test_a_downstream_4xx_from_the_callers_input_is_not_a_502(env_url):
    client = ServerClient(static_urls={"weather": env_url})
    agent = PassThroughAgent(
        {"name": "agent", "resources_server": {"type": "resources_servers", "name": "weather"}}, client
    )
    with running_server(agent) as url:
        conn = Connection(url)
        try:
            status, answer, _ = conn.request(
                "POST", "/run", orjson.dumps({"args": {"city": ["not", "a", "city"]}})
            )
            assert status == 422, answer
            assert answer["upstream"] == "weather" and "weather rejected the request" in answer["error"]
            status, answer, _ = conn.request("POST", "/run", orjson.dumps({"args": {"city": "Oslo"}}))
            assert status == 200 and answer["city"] == "Oslo"
        finally:
            conn.close()


async def test_harness_capture_proxy_refuses_bad_bodies_as_json_4xx():
    # The black-box harness is untrusted code: its proxy guards bodies like any server.
    from responses_api_agents.harness_agent.capture import (
        CAPTURE_MAX_BODY_BYTES,
        CaptureProxy,
        RolloutCapture,
    )

    proxy = CaptureProxy()
    await proxy.start()
    try:
        client = ServerClient(static_urls={})
        base = proxy.open(RolloutCapture(client.rollout("r1"), "policy", "env", max_model_calls=4))
        import aiohttp

        async with aiohttp.ClientSession() as http:
            for body, status in [
                (b"[]", 422),
                (b"{broken", 400),
                (b'{"input": ' + b"[" * 300 + b"]" * 300 + b"}", 400),
                (b"x" * (CAPTURE_MAX_BODY_BYTES + 1), 413),
            ]:
                async with http.post(base + "/v1/responses", data=body) as resp:
                    answer = await resp.json(content_type=None)
                    assert resp.status == status, (body[:20], resp.status, answer)
                    assert answer["error"]
        await client.close()
    finally:
        await proxy.stop()
