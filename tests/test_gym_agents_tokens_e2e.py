"""[GYM] agents end to end on the CPU engine: collected by ``ng_collect_rollouts``, exported by
``ng_export_training_data`` as token-exact training sequences.

The policy is the tiny local model behind vllm_model (forced completions, so random weights
make well-formed tool calls; token IDs and log-probs are real). Every model call's prompt must
begin with the previous call's prompt + generation, and the exported sequence must be exactly
the last call's prompt + generation, with the loss mask on the policy's tokens only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym.launch.config import project_root
from nemo_gym.rollout_collection import ng_collect_rollouts
from nemo_gym.testing import read_jsonl, running_stack
from nemo_gym.testing.cpu_engine import LOCAL_HF_MODEL_CONFIG, export_training_sequences, forced_engine_config

pytestmark = pytest.mark.slow

ROOT = project_root()


def collect(tmp_path: Path, configs: list[str], agent: str, rows: Path) -> list[dict[str, Any]]:
    with running_stack(configs) as stack:
        return collect_on(tmp_path, stack.head_server_config["port"], agent, rows)


def collect_on(tmp_path: Path, head_port: int, agent: str, rows: Path) -> list[dict[str, Any]]:
    """``ng_collect_rollouts`` on the first row of ``rows`` through ``agent`` of a running stack."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "rollouts.jsonl"
    with pytest.raises(SystemExit) as exited:
        ng_collect_rollouts(
            [
                f"++head_server.port={head_port}",
                f"+agent_name={agent}",
                f"+input_jsonl_fpath={rows}",
                f"+output_jsonl_fpath={out}",
                "+limit=1",
            ]
        )
    assert int(exited.value.code or 0) == 0
    return read_jsonl(out)


def check_token_exact(tmp_path: Path, row: dict[str, Any], num_calls: int) -> None:
    calls = [item for item in row["response"]["output"] if "prompt_token_ids" in item]
    assert len(calls) == num_calls, [item.get("role") or item["type"] for item in row["response"]["output"]]
    for earlier, later in zip(calls, calls[1:], strict=False):
        prefix = earlier["prompt_token_ids"] + earlier["generation_token_ids"]
        assert later["prompt_token_ids"][: len(prefix)] == prefix
        assert "token_ids_contiguous" not in later
    (sequence,) = export_training_sequences([row], tmp_path)
    assert sequence["contiguous"] is True and sequence["num_calls"] == num_calls
    last = calls[-1]
    assert sequence["input_ids"] == last["prompt_token_ids"] + last["generation_token_ids"]
    assert sum(sequence["loss_mask"]) == sum(len(c["generation_token_ids"]) for c in calls)
    assert len(sequence["logprobs"]) == len(sequence["input_ids"])


def test_simulated_user_agent_on_retail_exports_token_exact(tmp_path: Path):
    env = "resources_servers/retail_service"
    forced = [
        '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "W1001"}}\n</tool_call>',
        "Order W1001 was delivered. Shall I return it?",
        '<tool_call>\n{"name": "return_order", "arguments": {"order_id": "W1001"}}\n</tool_call>',
        "Order W1001 is returned.",
    ]
    user_model = yaml.safe_load((ROOT / env / "configs/scripted_policy.yaml").read_text())["user_model"]
    overrides = forced_engine_config(tmp_path / "forced.yaml", forced, 96, user_model=user_model)
    configs = [f"{env}/configs/retail_service.yaml", LOCAL_HF_MODEL_CONFIG, overrides]
    (row,) = collect(
        tmp_path, configs, "retail_service_simulated_user_agent", ROOT / env / "data/example.jsonl"
    )
    assert row["reward"] == 1.0 and row["ended_by"] == "user_stop" and row["num_user_turns"] == 3
    check_token_exact(tmp_path, row, num_calls=4)


def test_harness_agent_black_box_exports_token_exact_over_both_apis(tmp_path: Path):
    env = "resources_servers/example_session_state_mgmt"
    forced = [
        '<tool_call>\n{"name": "increment_counter", "arguments": {"count": 5}}\n</tool_call>',
        '<tool_call>\n{"name": "increment_counter", "arguments": {"count": 7}}\n</tool_call>',
        '<tool_call>\n{"name": "get_counter_value", "arguments": {}}\n</tool_call>',
        "The counter reads 22.",
    ]
    agent = yaml.safe_load(
        (ROOT / "responses_api_agents/harness_agent/configs/harness_agent.yaml").read_text()
    )
    chat_agent = json.loads(json.dumps(agent["example_session_state_mgmt_harness_agent"]))
    chat_agent["responses_api_agents"]["harness_agent"]["command"][3] = "chat"
    overrides = forced_engine_config(tmp_path / "forced.yaml", forced, 96, chat_harness_agent=chat_agent)
    configs = [
        f"{env}/configs/example_session_state_mgmt.yaml",
        "responses_api_agents/harness_agent/configs/harness_agent.yaml",
        LOCAL_HF_MODEL_CONFIG,
        overrides,
    ]
    rows = ROOT / env / "data/example.jsonl"
    with running_stack(configs) as stack:
        collected = {
            agent_name: collect_on(tmp_path / agent_name, stack.head_server_config["port"], agent_name, rows)
            for agent_name in ("example_session_state_mgmt_harness_agent", "chat_harness_agent")
        }
    for agent_name, (row,) in collected.items():
        assert row["reward"] == 1.0, (agent_name, row.get("harness"))
        assert row["harness"]["status"] == "ok" and row["harness"]["model_calls"] == 4
        assert "The counter reads 22." in row["harness"]["stdout_tail"]
        (tmp_path / agent_name).mkdir(exist_ok=True)
        check_token_exact(tmp_path / agent_name, row, num_calls=4)


def test_both_agents_under_run_helper_as_a_trainer_starts_them():
    """NeMo RL / verl's path: RunHelper starts the stack, RolloutCollectionHelper routes rows by ``agent_ref``."""
    import asyncio

    from omegaconf import DictConfig

    from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper
    from nemo_gym.launch.launcher import free_port
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig

    retail = "resources_servers/retail_service"
    counter = "resources_servers/example_session_state_mgmt"

    def scripts(env: str) -> list[dict[str, Any]]:
        policy = yaml.safe_load((ROOT / env / "configs/scripted_policy.yaml").read_text())["policy_model"]
        return policy["responses_api_models"]["scripted_model"]["scripts"]

    # The counter's own scripts (without its catch-all), then retail's.
    combined = [s for s in scripts(counter) if s.get("match")] + scripts(retail)
    head_port = free_port()
    initial: dict[str, Any] = {
        "config_paths": [
            str(ROOT / retail / "configs/retail_service.yaml"),
            str(ROOT / "responses_api_models/scripted_model/configs/scripted_model.yaml"),
            str(ROOT / retail / "configs/scripted_policy.yaml"),
            str(ROOT / counter / "configs/example_session_state_mgmt.yaml"),
            str(ROOT / "responses_api_agents/harness_agent/configs/harness_agent.yaml"),
        ],
        "policy_model": {"responses_api_models": {"scripted_model": {"scripts": combined}}},
        HEAD_SERVER_KEY_NAME: {"host": "127.0.0.1", "port": head_port},
    }
    retail_rows = read_jsonl(ROOT / retail / "data/example.jsonl")[:2]
    counter_rows = read_jsonl(ROOT / counter / "data/example.jsonl")[:2]
    examples = [
        {**row, "agent_ref": {"type": "responses_api_agents", "name": name}, "_rowidx": index}
        for index, (row, name) in enumerate(
            [(r, "retail_service_simulated_user_agent") for r in retail_rows]
            + [(r, "example_session_state_mgmt_harness_agent") for r in counter_rows]
        )
    ]
    helper = RunHelper()
    helper.start(
        global_config_dict_parser_config=GlobalConfigDictParserConfig(
            dotenv_path=None, initial_global_config_dict=DictConfig(initial), skip_load_from_cli=True
        )
    )
    try:

        async def generate() -> dict[int, dict[str, Any]]:
            collector = RolloutCollectionHelper()
            results = {}
            try:
                head = BaseServerConfig(host="127.0.0.1", port=head_port)
                for task in collector.run_examples(examples=examples, head_server_config=head):
                    row, result = await task
                    results[row["_rowidx"]] = result
            finally:
                await collector.close()
            return results

        results = asyncio.run(generate())
    finally:
        helper.shutdown()
    assert [results[i]["reward"] for i in range(4)] == [1.0, 1.0, 1.0, 1.0]
    assert [results[i]["ended_by"] for i in range(2)] == ["user_stop", "user_stop"]
    assert [results[i]["harness"]["status"] for i in (2, 3)] == ["ok", "ok"]
