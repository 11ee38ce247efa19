"""docs/WRITING_AGENTS_AND_MODELS.md's agent and model adapter, run as written: the guide's two
``app.py`` blocks are loaded from the document and serve a rollout of example_single_tool_call
between them on loopback, and a dead model is a classified failure, not a reward."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import orjson

from nemo_gym.launch.config import project_root
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import SyncClient, running_server
from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer

DOC = project_root() / "docs" / "WRITING_AGENTS_AND_MODELS.md"
ROW = orjson.loads(
    (project_root() / "resources_servers/example_single_tool_call/data/example.jsonl")
    .read_bytes()
    .splitlines()[0]
)


def load_block(marker: str, tmp_path: Path) -> ModuleType:
    text = DOC.read_text()
    start = text.index("```python\n", text.index(marker)) + len("```python\n")
    path = tmp_path / f"{marker.strip('<!- >').replace('-', '_')}.py"
    path.write_text(text[start : text.index("\n```", start)])
    spec = importlib.util.spec_from_file_location(f"_guide_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_guides_agent_and_model_run_a_rollout_as_written(tmp_path: Path) -> None:
    agent_module = load_block("<!-- agent-app -->", tmp_path)
    model_module = load_block("<!-- model-app -->", tmp_path)
    env = ExampleSingleToolCallServer({"name": "env", "always_reward": False})
    with (
        running_server(env) as env_url,
        running_server(model_module.EchoModel({"name": "model"})) as model_url,
    ):
        agent = agent_module.OneShotAgent(
            {
                "name": "agent",
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "model"},
            },
            server_client=ServerClient(static_urls={"env": env_url, "model": model_url}),
        )
        with running_server(agent) as agent_url, SyncClient() as client:
            status, body = client.post(agent_url + "/run", ROW)
            assert status == 200, body
            question = ROW["responses_create_params"]["input"][-1]["content"]
            assert body["response"]["output"][0]["content"][0]["text"] == f"You said: {question}"
            assert body["reward"] == 0.0  # no get_weather call: the environment's verify says so
            status, answer = client.post(agent_url + "/v1/responses", {"input": "hello"})
            assert status == 200 and answer["output"][0]["content"][0]["text"] == "You said: hello"
        # The model gone: the rollout is a classified failure, never a reward.
        dead = agent_module.OneShotAgent(
            {
                "name": "agent",
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "model"},
            },
            server_client=ServerClient(
                static_urls={"env": env_url, "model": "http://127.0.0.1:9"}, connect_retries=0
            ),
        )
        with running_server(dead) as agent_url, SyncClient() as client:
            status, body = client.post(agent_url + "/run", ROW)
    assert status == 502 and body["failure_class"] == "unreachable" and "reward" not in body
