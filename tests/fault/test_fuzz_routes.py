"""Fuzz every route of every bundled server with hypothesis-generated bodies.

Each server runs on 127.0.0.1 with its own bundled config; the servers it calls (a model, an
environment) are real servers too (``scripted_model``, a tiny local engine). The rule: no body
gets a 500, a 5xx is only ever a classified failure of a server further down (naming it), every
error is JSON, and each server still answers ``GET /`` afterwards.

``local_vllm_model`` is left out: it starts vLLM, which needs a GPU.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib
import inspect
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_gym.launch.head_server import HeadServer
from nemo_gym.serving.server import BaseServer
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import running_app, running_server

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("resources_servers", "responses_api_models", "responses_api_agents")
NEEDS_GPU = {"local_vllm_model"}
BUNDLED = sorted(
    (p.parent.parent.name, p.parent.name)
    for kind in KINDS
    for p in (ROOT / kind).glob("*/app.py")
    if p.parent.name not in NEEDS_GPU
)
EXAMPLES_PER_SERVER = int(os.environ.get("NEMO_GYM_FUZZ_EXAMPLES", "150"))

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)
KEYS = [
    "responses_create_params", "response", "input", "model", "messages", "tools", "verify_responses",
    "city", "reward", "stream", "max_output_tokens", "arguments", "action", "seed", "expected_answer",
]  # fmt: skip
shaped_row = st.fixed_dictionaries(
    {
        "responses_create_params": st.fixed_dictionaries(
            {},
            optional={
                k: json_values for k in ("input", "tools", "model", "max_output_tokens", "temperature")
            },
        ),
    },
    optional={
        "response": st.fixed_dictionaries({}, optional={"output": json_values, "status": json_values}),
        "verify_responses": st.lists(
            st.dictionaries(st.sampled_from(KEYS), json_values, max_size=3), max_size=3
        ),
    },
)
bodies = st.one_of(
    json_values.map(orjson.dumps),
    st.fixed_dictionaries({}, optional={k: json_values for k in KEYS}).map(orjson.dumps),
    shaped_row.map(orjson.dumps),
    st.binary(max_size=48),
)


def bundled_fields(kind: str, impl: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The instance fields of ``impl`` in its first bundled config (its own folder's first), and
    instance name → impl of every resources server in the same file."""
    own = sorted((ROOT / kind / impl / "configs").glob("*.yaml"))
    # An agent may have no configs of its own: the environment that uses it holds its block.
    for path in own + sorted(p for k in KINDS for p in (ROOT / k).glob("*/configs/*.yaml") if p not in own):
        blocks = yaml.safe_load(path.read_text()) or {}
        envs = {
            name: next(iter(block["resources_servers"]))
            for name, block in blocks.items()
            if isinstance(block, dict) and isinstance(block.get("resources_servers"), dict)
        }
        for block in blocks.values():
            if isinstance(block, dict) and isinstance(block.get(kind), dict) and impl in block[kind]:
                return dict(block[kind][impl] or {}), envs
    return {}, {}


def refs(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        if set(value) == {"type", "name"}:
            return [value]
        return [r for v in value.values() for r in refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in refs(v)]
    return []


def server_class(kind: str, impl: str) -> type[BaseServer]:
    module = importlib.import_module(f"{kind}.{impl}.app")
    # One class may sit under two names (openai_model also answers to NeMo Gym's SimpleModelServer).
    found = list(
        dict.fromkeys(
            c
            for c in vars(module).values()
            if inspect.isclass(c) and issubclass(c, BaseServer) and c.__module__ == module.__name__
        )
    )
    assert len(found) == 1, (impl, found)
    return found[0]


class Fleet:
    """Servers started on demand and kept for the module: the dependencies of the fuzzed ones."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.urls: dict[str, str] = {}

    def url(self, kind: str, impl: str) -> str:
        if impl not in self.urls:
            self.urls[impl] = self.stack.enter_context(running_server(self.build(kind, impl)))
        return self.urls[impl]

    def build(self, kind: str, impl: str) -> BaseServer:
        fields, envs = bundled_fields(kind, impl)
        fields = {**fields, "name": impl}
        if impl == "local_hf_model":
            fields.update(tiny=True, default_max_tokens=8)
        if impl == "openai_model":
            fields.update(
                openai_base_url=self.url("responses_api_models", "scripted_model") + "/v1", openai_model="m"
            )
        if impl == "vllm_model":
            fields.update(
                base_url=self.url("responses_api_models", "local_hf_model") + "/v1", model="tiny-chatml"
            )
        static: dict[str, str] = {}
        for ref in refs(fields):
            if ref["type"] == "responses_api_models":
                static[ref["name"]] = self.url("responses_api_models", "scripted_model")
            elif ref["type"] == "resources_servers":
                static[ref["name"]] = self.url(
                    "resources_servers", envs.get(ref["name"], "example_single_tool_call")
                )
        return server_class(kind, impl)(fields, ServerClient(static_urls=static, timeout_s=20))


@pytest.fixture(scope="module")
def fleet():
    with contextlib.ExitStack() as stack:
        yield Fleet(stack)


def route_paths(server: BaseServer) -> list[tuple[str, str]]:
    paths = []
    for route in server.routes():
        if not hasattr(route, "methods"):
            continue  # a mounted app (the MCP endpoint) answers in its own protocol's terms
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                paths.append((method, route.path.replace("{tool_name}", "fuzz_tool")))
    return paths


def check_answer(status: int, headers: dict[str, str], raw: bytes, where: str) -> None:
    kind = headers.get("content-type", "")
    if status >= 400:
        assert kind.startswith("application/json"), (where, status, raw[:300])
        answer = orjson.loads(raw)
        assert isinstance(answer, dict) and answer.get("error"), (where, status, raw[:300])
    assert status != 500, (where, raw[:500])
    if status >= 500:
        # Only a server further down failing (a classified infrastructure fault), never this one.
        text = raw.decode(errors="replace")
        assert status in (502, 503, 504) and ("upstream" in text or "failure_class" in text), (
            where,
            status,
            text[:500],
        )


def fuzz_server(url: str, paths: list[tuple[str, str]], where: str) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    examples = max(5, EXAMPLES_PER_SERVER // max(1, len(paths)))

    def send(method: str, path: str, body: bytes | None) -> None:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        resp = conn.getresponse()
        raw = resp.read()
        check_answer(
            resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw, f"{where} {method} {path}"
        )

    def case(method: str, path: str) -> Any:
        @settings(
            max_examples=examples if method == "POST" else 3,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(body=bodies)
        def one(body: bytes) -> None:
            send(method, path, body if method == "POST" else None)

        return one

    for method, path in paths:
        case(method, path)()
    conn.request("GET", "/")
    resp = conn.getresponse()
    assert resp.status == 200 and orjson.loads(resp.read())["status"] == "ok", where
    conn.close()


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "impl"), BUNDLED, ids=[impl for _, impl in BUNDLED])
def test_fuzz_every_route(fleet, kind, impl):
    server = fleet.build(kind, impl)
    with running_server(server) as url:
        fuzz_server(url, route_paths(server), impl)


@pytest.mark.slow
def test_fuzz_head_server():
    with running_app(HeadServer({}, registration_secret="s3cret-value").build_app()) as url:
        paths = [("POST", "/register"), ("POST", "/deregister"), ("GET", "/server_instances"),
                 ("GET", "/global_config_dict_yaml"), ("GET", "/"), ("POST", "/"), ("GET", "/nope")]  # fmt: skip
        fuzz_server(url, paths, "head_server")


MODELS = [(k, i) for k, i in BUNDLED if k == "responses_api_models"]
AGENTS_WITH_TOOLS = [("responses_api_agents", "simple_agent")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "impl"), MODELS + AGENTS_WITH_TOOLS, ids=[i for _, i in MODELS + AGENTS_WITH_TOOLS]
)
def test_a_tool_schema_of_the_wrong_shape_is_a_4xx_naming_the_field(fleet, kind, impl):
    # Found by the fuzz: parameters.properties as a string or a boolean was an AttributeError (a
    # 500 in the model server, a 502 from the agent). It is the caller's mistake: 400 naming it.
    server = fleet.build(kind, impl)
    with running_server(server) as url:
        conn = http.client.HTTPConnection("127.0.0.1", urlsplit(url).port, timeout=60)
        # The last one (a property whose schema is `true`) was the fuzz's last 5xx (#34).
        for bad in ("a string", True, ["x"], {"city": True}):
            responses_tool = {
                "type": "function",
                "name": "f",
                "parameters": {"type": "object", "properties": bad},
            }
            chat_tool = {"type": "function", "function": {"name": "f", "parameters": {"properties": bad}}}
            cases = [("/run", {"responses_create_params": {"input": "hi", "tools": [responses_tool]}})]
            if kind == "responses_api_models":
                cases = [
                    ("/v1/responses", {"input": "hi", "tools": [responses_tool]}),
                    (
                        "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}], "tools": [chat_tool]},
                    ),
                ]
            for path, body in cases:
                conn.request(
                    "POST", path, body=orjson.dumps(body), headers={"Content-Type": "application/json"}
                )
                resp = conn.getresponse()
                raw = resp.read()
                assert 400 <= resp.status < 500, (impl, path, bad, resp.status, raw[:300])
                assert b"properties" in raw, (impl, path, raw[:300])
                if isinstance(bad, dict):
                    assert b"properties.city" in raw, (impl, path, raw[:300])
        conn.close()
