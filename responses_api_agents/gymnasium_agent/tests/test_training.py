"""gymnasium_agent as a trainer uses it: RunHelper starts blackjack and the CPU engine with token IDs,
RolloutCollectionHelper.run_examples plays hands, ng_export_training_data builds token-exact sequences.

The engine is the tiny local model with forced completions (call k of every rollout answers
completion k), so the random weights play hit, then stand; the prompt IDs and logprobs are real.
Observations come back as user messages between calls, and each call's prompt must still
begin with the previous call's prompt + generation.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nemo_gym.launch.config import project_root
from nemo_gym.launch.launcher import free_port
from nemo_gym.testing.cpu_engine import LOCAL_HF_MODEL_CONFIG, export_training_sequences, forced_engine_config

pytestmark = pytest.mark.slow

AGENT = "blackjack_gymnasium_agent"
FORCED = ["Another card. <action>hit</action>", "I stay. <action>stand</action>"]


def test_run_helper_rollouts_export_token_exact_sequences(tmp_path: Path) -> None:
    from omegaconf import DictConfig

    from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig

    root = project_root()
    head_port = free_port("127.0.0.1")
    initial = {
        "config_paths": [
            f"{root}/resources_servers/blackjack/configs/blackjack.yaml",
            f"{root}/{LOCAL_HF_MODEL_CONFIG}",
            forced_engine_config(tmp_path / "forced.yaml", FORCED, 24),
        ],
        HEAD_SERVER_KEY_NAME: {"host": "127.0.0.1", "port": head_port},
    }
    rows = [
        json.loads(line)
        for line in (root / "resources_servers/blackjack/data/example.jsonl").read_text().splitlines()
    ]
    examples = [
        {
            **row,
            "agent_ref": {"type": "responses_api_agents", "name": AGENT},
            "_ng_task_index": i,
            "_ng_rollout_index": 0,
        }
        for i, row in enumerate(rows[1:3])  # seeds 4 and 18: neither hand is over after one hit
    ]

    async def collect() -> list[dict]:
        helper = RolloutCollectionHelper()
        head = BaseServerConfig(host="127.0.0.1", port=head_port)
        results = []
        for future in helper.run_examples(examples=examples, head_server_config=head):
            _, result = await future
            results.append(result)
        await helper.close()
        return results

    helper = RunHelper()
    try:
        helper.start(
            GlobalConfigDictParserConfig(
                dotenv_path=None, initial_global_config_dict=DictConfig(initial), skip_load_from_cli=True
            )
        )
        results = asyncio.run(collect())
    finally:
        helper.shutdown()

    by_seed = {r["seed"]: r for r in results}
    assert (by_seed[4]["reward"], by_seed[4]["info"]["result"]) == (1.0, "win")  # 11, hit to 19, stand
    for result in results:
        output = result["response"]["output"]
        assert [(i["type"], i.get("role")) for i in output] == [
            ("message", "assistant"),
            ("message", "user"),
            ("message", "assistant"),
        ]
        calls = [i for i in output if "prompt_token_ids" in i]
        assert len(calls) == 2
        prefix = calls[0]["prompt_token_ids"] + calls[0]["generation_token_ids"]
        assert calls[1]["prompt_token_ids"][: len(prefix)] == prefix
        assert len(calls[1]["prompt_token_ids"]) > len(prefix)  # the observation sits between the calls

    exported = export_training_sequences(results, tmp_path)
    assert len(exported) == 2
    for sequence, result in zip(exported, results, strict=True):
        last = [i for i in result["response"]["output"] if "prompt_token_ids" in i][-1]
        assert sequence["contiguous"] is True and sequence["num_calls"] == 2
        assert sequence["input_ids"] == last["prompt_token_ids"] + last["generation_token_ids"]
        generated = sum(
            len(i["generation_token_ids"])
            for i in result["response"]["output"]
            if "generation_token_ids" in i
        )
        assert sum(sequence["loss_mask"]) == generated
        assert sequence["reward"] == result["reward"]
