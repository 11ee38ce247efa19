"""A model instance declared as an existing endpoint: registered by name, no process started."""

import asyncio
import json

import pytest

from nemo_gym.launch.config import load_config
from nemo_gym.launch.launcher import StackError, StackHandle, free_port
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.testing import running_server
from responses_api_models.scripted_model.app import ScriptedModel

ENV_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"


def external_config(url: str) -> dict:
    return load_config(
        [
            f"+config_paths=[{ENV_CONFIG}]",
            "++head_server.port=0",
            f"++policy_model.responses_api_models.trainer_endpoint.external_url={url}/v1",
        ]
    )


@pytest.mark.slow
def test_external_endpoint_serves_rollouts(tmp_path):
    # The "trainer's" own model endpoint: a real server this process runs, not started by the stack.
    with running_server(ScriptedModel({"name": "trainer_policy"})) as url:
        handle = StackHandle.start(external_config(url))
        try:
            listed = {r.name: r for r in handle.stack.head.registry.all()}
            assert listed["policy_model"].url == url and listed["policy_model"].pid == 0
            assert "policy_model" not in handle.stack.processes
            out = tmp_path / "out.jsonl"
            config = {
                "head_server": handle.head_server_config,
                "agent_name": "example_single_tool_call_simple_agent",
                "input_jsonl_fpath": "resources_servers/example_single_tool_call/data/example.jsonl",
                "output_jsonl_fpath": str(out),
            }
            asyncio.run(RolloutCollectionHelper().run_from_config(config, verbose=False))
        finally:
            handle.stop()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and all(row["reward"] == 1.0 for row in rows)


def test_unreachable_external_endpoint_is_named():
    with pytest.raises(StackError, match="'policy_model': external endpoint .* is unreachable"):
        StackHandle.start(external_config(f"http://127.0.0.1:{free_port()}"))
