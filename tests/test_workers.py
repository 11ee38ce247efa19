"""num_workers: several processes behind one name, each rollout kept on one replica (state stays correct)."""

import asyncio
import json
from pathlib import Path

import pytest

from nemo_gym.launch.config import load_config
from nemo_gym.launch.launcher import StackHandle
from nemo_gym.rollout_collection import RolloutCollectionHelper

COUNTER_APP = """
from nemo_gym.base_resources_server import BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer, tool


class Counter(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    async def seed_session(self, body):
        self.session["count"] = body.model_dump()["start"]
        return {}

    @tool
    async def increment(self, body: dict) -> dict:
        self.session["count"] += 1
        return {"count": self.session["count"]}

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        expected = body.model_dump()["start"] + 1
        return BaseVerifyResponse(**body.model_dump(), reward=float(self.session.get("count") == expected))


if __name__ == "__main__":
    Counter.run_webserver()
"""

CONFIG = """
counter:
  resources_servers:
    counter_env:
      entrypoint: app.py
      num_workers: 3
counter_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      num_workers: 2
      resources_server: {type: resources_servers, name: counter}
      model_server: {type: responses_api_models, name: policy_model}
"""


@pytest.mark.slow
def test_stateful_env_on_several_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    env_dir = tmp_path / "resources_servers" / "counter_env"
    env_dir.mkdir(parents=True)
    (env_dir / "app.py").write_text(COUNTER_APP)
    (tmp_path / "counter.yaml").write_text(CONFIG)
    tool = {"type": "function", "name": "increment", "parameters": {"type": "object", "properties": {}}}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"responses_create_params": {"input": f"go {i}", "tools": [tool]}, "start": i}) + "\n"
            for i in range(30)
        )
    )
    monkeypatch.chdir(tmp_path)
    config = load_config(
        [
            f"+config_paths=[{tmp_path / 'counter.yaml'},responses_api_models/scripted_model/configs/scripted_model.yaml]",
            "++head_server.port=0",
        ]
    )
    handle = StackHandle.start(config, log=lambda name, line: None)
    try:
        replicas = [r.name for r in handle.stack.head.registry.all()]
        assert replicas.count("counter") == 3 and replicas.count("counter_agent") == 2
        out = tmp_path / "out.jsonl"
        summary = asyncio.run(
            RolloutCollectionHelper().run_from_config(
                {
                    "head_server": handle.head_server_config,
                    "agent_name": "counter_agent",
                    "input_jsonl_fpath": str(rows),
                    "output_jsonl_fpath": str(out),
                    "num_samples_in_parallel": 8,
                },
                verbose=False,
            )
        )
    finally:
        handle.stop()
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 30 and all(r["reward"] == 1.0 for r in results), summary
