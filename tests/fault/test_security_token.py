"""The auth token guards every server ``ng_run`` starts, not only the head; and no web page gets in.

``ng_run`` runs as a real subprocess with ``NEMO_GYM_AUTH_TOKEN`` exported (it hands the token
to its children on stdin; their environment never has it). The attacks, from this process over
loopback: every route of the model, agent and resources servers without the token (401), with a
wrong one (401), with it (works); a DNS-rebinding Host (400), a cross-site Origin (403) and a
``text/plain`` body (415) on every server and the head; a WebSocket handshake (refused, 403,
whatever its Origin and token: no server opts in); and the token read from the launcher's
``/proc/<pid>/environ``.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest

from nemo_gym.serving.protocol import ENV_AUTH_TOKEN
from nemo_gym.testing import http_call as call
from nemo_gym.testing import ng_run_process

pytestmark = pytest.mark.slow

TOKEN = "security-test-token-5f1c2e9a"
ENV_DIR = "resources_servers/example_session_state_mgmt"
CONFIGS = [
    f"{ENV_DIR}/configs/example_session_state_mgmt.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
    f"{ENV_DIR}/configs/scripted_policy.yaml",
]
AGENT = "example_session_state_mgmt_simple_agent"
RESOURCES = "example_session_state_mgmt"
MODEL = "policy_model"
ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "Increase the counter by 20 and report its value."}],
        "tools": [
            {
                "type": "function",
                "name": "increment_counter",
                "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}},
            },
            {
                "type": "function",
                "name": "get_counter_value",
                "parameters": {"type": "object", "properties": {}},
            },
        ],
    },
    "expected_count": 20,
    "initial_count": 0,
}


@pytest.fixture(scope="module")
def stack():
    env = {**os.environ, ENV_AUTH_TOKEN: TOKEN}
    with ng_run_process(CONFIGS, env=env) as (proc, head_url):
        status, listed = call(head_url + "/server_instances", token=TOKEN)
        assert status == 200, listed
        urls = {item["name"]: item["url"] for item in listed}
        assert {AGENT, RESOURCES, MODEL} <= set(urls), urls
        yield proc, head_url, urls


def routes(urls: dict[str, str]) -> list[tuple[str, str, str, Any]]:
    """(server, method, path, body) for every kind of route of every server kind."""
    return [
        (RESOURCES, "GET", "/", None),
        (RESOURCES, "POST", "/seed_session", ROW),
        (RESOURCES, "POST", "/increment_counter", {"count": 1}),
        (RESOURCES, "POST", "/verify", {**ROW, "response": {"output": []}}),
        (RESOURCES, "POST", "/aggregate_metrics", {"verify_responses": []}),
        (MODEL, "GET", "/", None),
        (MODEL, "POST", "/v1/responses", ROW["responses_create_params"]),
        (MODEL, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        (AGENT, "GET", "/", None),
        (AGENT, "POST", "/run", ROW),
        (AGENT, "POST", "/v1/responses", ROW["responses_create_params"]),
        (AGENT, "POST", "/ng-rollout/abc/run", ROW),
    ]


def test_every_server_refuses_requests_without_the_token(stack):
    _, head_url, urls = stack
    for name, method, path, body in [("head", "GET", "/server_instances", None), *routes(urls)]:
        base = head_url if name == "head" else urls[name]
        for token in (None, "wrong-token", TOKEN[:-1]):
            status, answer = call(base + path, method, body, token=token)
            assert status == 401, (name, path, token, status, answer)
            assert "auth token" in json.dumps(answer), answer


def test_every_server_works_with_the_token(stack):
    _, _, urls = stack
    for name, method, path, body in routes(urls):
        status, answer = call(urls[name] + path, method, body, token=TOKEN)
        # Past the guard: the route itself answered (a tool without a seeded session says so: 409).
        assert status == 200 or (status == 409 and path == "/increment_counter"), (name, path, status, answer)
    status, answer = call(urls[AGENT] + "/run", "POST", ROW, token=TOKEN)
    assert status == 200 and answer["reward"] == 1.0, answer


def test_the_token_is_in_no_process_environment(stack):
    proc, _, _ = stack
    # The launcher read it, dropped it and re-executed itself: /proc/<pid>/environ (the
    # environment the process started with, which unsetenv cannot change) no longer holds it.
    with open(f"/proc/{proc.pid}/environ", "rb") as environ:
        assert TOKEN.encode() not in environ.read()
    import psutil

    for child in psutil.Process(proc.pid).children(recursive=True):
        with open(f"/proc/{child.pid}/environ", "rb") as environ:
            assert TOKEN.encode() not in environ.read(), child.cmdline()


def test_dns_rebinding_cross_site_and_text_plain_are_refused_everywhere(stack):
    _, head_url, urls = stack
    targets = [head_url + "/server_instances"] + [urls[n] + "/" for n in (AGENT, RESOURCES, MODEL)]
    for url in targets:
        port = urlsplit(url).port
        # DNS rebinding: the attacker's name resolves to 127.0.0.1; the browser still sends it as Host.
        status, answer = call(url, token=TOKEN, headers={"Host": f"rebind.attacker.example:{port}"})
        assert status == 400 and "rebind.attacker.example" in json.dumps(answer), (url, answer)
        for origin in ("http://attacker.example", "null", "http://203.0.113.7"):
            status, answer = call(url, token=TOKEN, headers={"Origin": origin})
            assert status == 403 and "cross-site" in json.dumps(answer), (url, origin, answer)
        # What our own clients send is accepted: IP literal or localhost, same-origin Origin.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert call(url, token=TOKEN, headers={"Host": host})[0] == 200
        assert call(url, token=TOKEN, headers={"Origin": f"http://127.0.0.1:{port}"})[0] == 200
    # A cross-site "simple" POST (no preflight): text/plain or no type at all never runs a rollout.
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        raw = json.dumps(ROW).encode()
        status, answer = call(urls[AGENT] + "/run", "POST", token=TOKEN, headers=headers, raw=raw)
        assert status == 415 and "JSON" in json.dumps(answer), (content_type, answer)
    status, _ = call(
        urls[AGENT] + "/run",
        "POST",
        token=TOKEN,
        headers={"Content-Type": "application/json; charset=utf-8"},
        raw=json.dumps(ROW).encode(),
    )
    assert status == 200


def websocket_handshake(url: str, headers: dict[str, str]) -> str:
    """The status line a server answers a WebSocket handshake on ``url`` with."""
    parts = urlsplit(url)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while b"\r\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0].decode()


def test_websocket_handshakes_are_refused_everywhere(stack):
    _, head_url, urls = stack
    for url in [head_url + "/"] + [urls[n] + "/" for n in (AGENT, RESOURCES, MODEL)]:
        for headers in (
            {"Origin": "http://attacker.example"},  # a web page, no token
            {},  # no token
            {"Authorization": f"Bearer {TOKEN}"},  # even with the token: no server serves WebSockets
        ):
            status_line = websocket_handshake(url, headers)
            assert status_line.split()[1:2] == ["403"], (url, headers, status_line)
        assert call(url, token=TOKEN)[0] == 200  # and the server goes on serving


def test_websockets_are_refused_unless_opted_in_and_then_checked_like_http():
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    from nemo_gym.serving.access_guard import AccessGuard
    from nemo_gym.testing import running_app

    async def echo(websocket):
        await websocket.accept()
        await websocket.close()

    app = Starlette(routes=[WebSocketRoute("/ws", echo)])
    # A route that accepts WebSockets, on a server that did not opt in: refused before the app.
    with running_app(AccessGuard(app, "ws_server", token=TOKEN, hosts=["127.0.0.1"])) as url:
        for headers in ({"Origin": "http://attacker.example"}, {"Authorization": f"Bearer {TOKEN}"}):
            assert websocket_handshake(url + "/ws", headers).split()[1] == "403"
    guarded = AccessGuard(app, "ws_server", token=TOKEN, hosts=["127.0.0.1"], websocket=True)
    with running_app(guarded) as url:
        assert websocket_handshake(url + "/ws", {}).split()[1] == "403"
        foreign = {"Authorization": f"Bearer {TOKEN}", "Origin": "http://attacker.example"}
        assert websocket_handshake(url + "/ws", foreign).split()[1] == "403"
        assert websocket_handshake(url + "/ws", {"Authorization": f"Bearer {TOKEN}"}).split()[1] == "101"


def test_every_server_the_ray_backend_starts_requires_the_token(tmp_path):
    pytest.importorskip("ray", reason="the Ray backend needs the [ray] extra")
    env = {**os.environ, ENV_AUTH_TOKEN: TOKEN, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    # A fresh single-node Ray instance started by ng_run itself (ray.init(address="local")).
    overrides = ["+server_backend=ray", "+ray_head_node_address=local"]
    with ng_run_process(CONFIGS, overrides, env=env, timeout_s=180) as (_, head_url):
        status, listed = call(head_url + "/server_instances", token=TOKEN)
        assert status == 200 and {AGENT, RESOURCES, MODEL} <= {i["name"] for i in listed}, listed
        assert all(item.get("node_id") for item in listed), listed  # placed by Ray
        urls = {item["name"]: item["url"] for item in listed}
        for name, method, path, body in routes(urls):
            status, answer = call(urls[name] + path, method, body)
            assert status == 401, (name, path, status, answer)
        status, answer = call(urls[AGENT] + "/run", "POST", ROW, token=TOKEN)
        assert status == 200 and answer["reward"] == 1.0, answer
