"""verl's NeMo Gym recipe calling pattern (``recipe/nemo_gym/agent_loop.py``), step by step.

As the recipe's agent-loop manager does: the config is a dict of ``config_paths`` plus a partial
``policy_model`` block that overrides the training model config, the trainer's vLLM URLs (with
``/v1``), venv keys that have no effect here, the Ray address, and a head server on 0.0.0.0 at a
port the trainer chose; ``RunHelper.start`` with ``dotenv_path=None``; rollouts run on a
dedicated event-loop thread, results are put back in ``_rowidx`` order and post-processed the
recipe's way, which rejects a rollout whose token IDs are not contiguous across turns.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from omegaconf import DictConfig

from nemo_gym.launch.config import project_root
from nemo_gym.launch.launcher import free_port

from .conftest import AGENT, ENV_CONFIG, TRAINING_MODEL_CONFIG, example_rows

pytestmark = pytest.mark.slow


def postprocess_like_verl(result: dict) -> dict:
    """The recipe's post-processing: a prompt/generation message log, or ValueError if not contiguous."""
    message_log: list[dict] = []
    seen: list[int] = []
    for item in result["response"]["output"]:
        if "generation_token_ids" not in item:
            continue
        prompt_ids = item["prompt_token_ids"]
        if seen != prompt_ids[: len(seen)]:
            raise ValueError(f"non-contiguous token IDs: seen={len(seen)} prompt={len(prompt_ids)}")
        message_log.append({"role": "user", "token_ids": prompt_ids[len(seen) :]})
        message_log.append({"role": "assistant", "token_ids": item["generation_token_ids"]})
        seen = seen + message_log[-2]["token_ids"] + message_log[-1]["token_ids"]
    if not message_log:
        raise ValueError("no generation data")
    return {"message_log": message_log, "reward": result.get("reward")}


def test_verl_agent_loop_manager_pattern(engine_base_url: str) -> None:
    from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig

    root = str(project_root())
    initial: dict = {"config_paths": [f"{root}/{TRAINING_MODEL_CONFIG}", f"{root}/{ENV_CONFIG}"]}
    vllm_model = (
        initial.setdefault("policy_model", {})
        .setdefault("responses_api_models", {})
        .setdefault("vllm_model", {})
    )
    vllm_model["uses_reasoning_parser"] = False
    vllm_model.setdefault("extra_body", {}).setdefault("chat_template_kwargs", {})["enable_thinking"] = False
    initial["policy_model_name"] = "tiny-chatml"
    initial["policy_api_key"] = "dummy_key"
    initial["policy_base_url"] = [engine_base_url]
    initial.setdefault("global_aiohttp_connector_limit_per_host", 16_384)
    initial.setdefault("global_aiohttp_connector_limit", 65_536)
    initial["ray_head_node_address"] = "127.0.0.1:6379"
    initial.setdefault("uv_venv_dir", root)
    initial.setdefault("skip_venv_if_present", True)
    head_port = free_port()
    initial[HEAD_SERVER_KEY_NAME] = {"host": "0.0.0.0", "port": head_port}
    head_server_config = BaseServerConfig(host="127.0.0.1", port=head_port)

    rh = RunHelper()
    rh.start(
        global_config_dict_parser_config=GlobalConfigDictParserConfig(
            dotenv_path=None, initial_global_config_dict=DictConfig(initial), skip_load_from_cli=True
        )
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="nemo-gym-rollout-loop")
    thread.start()
    try:
        # The partial policy_model block won over the file it overrides.
        served = rh._server_client.global_config_dict["policy_model"]["responses_api_models"]["vllm_model"]
        assert served["extra_body"]["chat_template_kwargs"]["enable_thinking"] is False
        assert served["return_token_id_information"] is True
        rch = RolloutCollectionHelper()
        examples = [
            {
                "responses_create_params": {
                    "input": row["responses_create_params"]["input"],
                    "temperature": 1.0,
                    "top_p": 1.0,
                }
                | {"tools": row["responses_create_params"]["tools"]},
                "agent_ref": {"type": "responses_api_agents", "name": AGENT},
                "_rowidx": index,
            }
            for index, row in enumerate(example_rows(3))
        ]

        async def generate() -> list[dict]:
            results: list[dict | None] = [None] * len(examples)
            for task in rch.run_examples(examples=examples, head_server_config=head_server_config):
                row, result = await task
                results[row["_rowidx"]] = postprocess_like_verl(result)
            await rch.close()
            assert all(r is not None for r in results)
            return [r for r in results if r is not None]

        results = asyncio.run_coroutine_threadsafe(generate(), loop).result(timeout=600)
        assert [r["reward"] for r in results] == [1.0, 1.0, 1.0]
        assert all(sum(m["role"] == "assistant" for m in r["message_log"]) == 3 for r in results)
        rh.poll()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        rh.shutdown()
