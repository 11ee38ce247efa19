"""The details of NeMo RL's contract with ``run_examples`` (``nemo_rl/environments/nemo_gym.py`` and
its open pull requests), against real servers on loopback:

- a failed rollout's error has ``.status`` and ``.response_content`` (NeMo RL prints it) and pickles;
- ``reward_components``, ``instance_config.mask_sample`` and vLLM's ``routed_experts`` come back untouched;
- the row comes back with every key it went in with (``_rowidx``, ``agent_ref``, unknown keys);
- ``global_config.ROLLOUT_ID_KEY_NAME`` on a row is the rollout's id on the wire;
- ``ServerClient.load_from_global_config`` + ``global_config.get_first_server_config_dict`` find
  where each model server listens (PR 2114's kv-cache invalidation);
- ``rollout_collection.attach_trajectory_record(row, result)`` after merging indices (vllm-router branch).
"""

from __future__ import annotations

import asyncio
import copy
import pickle
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
from nemo_gym.global_config import (
    ROLLOUT_ID_KEY_NAME,
    ROLLOUT_INDEX_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    get_first_server_config_dict,
)
from nemo_gym.launch.head_server import HeadServer, Replica
from nemo_gym.models.conversion import chat_completion_to_response
from nemo_gym.rollout_collection import RolloutCollectionHelper, RolloutFailedError, attach_trajectory_record
from nemo_gym.server_utils import BaseServerConfig, ServerClient
from nemo_gym.serving.server import HTTPError
from nemo_gym.testing import running_app, running_server

ROUTES = [[[3, 7]], [[1, 2]]]
SEEN_ROLLOUT_IDS: list[
    str | None
] = []  # tokens x layers x top-k, as vLLM's enable_return_routed_experts gives


class TrainerFacingAgent(SimpleResponsesAPIAgent):
    """Answers like an environment with multi-reward verify, a masked sample and MoE token data."""

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        SEEN_ROLLOUT_IDS.append(self.rollout_id)
        if body.get("fail"):
            raise HTTPError(500, "the sandbox died: out of memory")
        item = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "4", "annotations": []}],
            "prompt_token_ids": [1],
            "generation_token_ids": [2],
            "generation_log_probs": [-0.5],
            "routed_experts": ROUTES,
        }
        return {
            **body,
            "response": {"output": [item]},
            "reward": 1.5,
            "reward_components": {"accuracy": 1.0, "format": 0.5},
            "instance_config": {"mask_sample": True, "other_key": "kept"},
        }


@pytest.fixture(scope="module")
def head() -> Iterator[BaseServerConfig]:
    agent = TrainerFacingAgent({"name": "env_agent"})
    with running_server(agent) as url:
        host, port = url.removeprefix("http://").split(":")
        config = {
            "env_agent": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}},
            "policy_model": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py", "port": 0}}},
        }
        server = HeadServer(config)
        for name, kind, replica_port in [
            ("env_agent", "responses_api_agents", int(port)),
            ("policy_model", "responses_api_models", 45678),
        ]:
            server.registry.register(Replica(name, kind, host, replica_port, 0, time.time()))
        with running_app(server.build_app()) as head_url:
            head_host, head_port = head_url.removeprefix("http://").split(":")
            yield BaseServerConfig(host=head_host, port=int(head_port))


def test_rows_results_and_errors_as_nemo_rl_reads_them(head: BaseServerConfig) -> None:
    agent_ref = {"type": "responses_api_agents", "name": "env_agent"}
    rows = [
        {
            "responses_create_params": {"input": "2+2?"},
            "agent_ref": agent_ref,
            "_rowidx": i,
            ROLLOUT_ID_KEY_NAME: f"sabc-{i}",
            "unknown_field": {"nested": [i]},
        }
        for i in range(2)
    ]
    bad = {"responses_create_params": {"input": "x"}, "agent_ref": agent_ref, "_rowidx": 9, "fail": True}
    sent = copy.deepcopy(rows + [bad])

    async def main() -> tuple[list[tuple[dict, dict]], list[BaseException]]:
        rch = RolloutCollectionHelper()
        done, errors = [], []
        for task in rch.run_examples(examples=[*rows, bad], head_server_config=head):
            try:
                done.append(await task)
            except Exception as error:  # noqa: BLE001 - NeMo RL's own pattern
                assert hasattr(error, "response_content")
                errors.append(error)
        await rch.close()
        return done, errors

    done, errors = asyncio.run(main())
    assert sorted(row["_rowidx"] for row, _ in done) == [0, 1]
    for row, result in done:
        assert row == sent[row["_rowidx"]] and row is rows[row["_rowidx"]]  # every key, untouched
        assert result["reward_components"] == {"accuracy": 1.0, "format": 0.5}
        assert result["instance_config"] == {"mask_sample": True, "other_key": "kept"}
        (item,) = result["response"]["output"]
        assert item["routed_experts"] == ROUTES and item["generation_token_ids"] == [2]
        # NeMo RL's vllm-router branch: indices merged in, then the trajectory record attached.
        for key in (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME):
            result.setdefault(key, row["_rowidx"])
        attach_trajectory_record(row, result)
        assert result["ng_trajectory"]["rollout_id"] == row[ROLLOUT_ID_KEY_NAME]
        assert result["ng_trajectory"]["model_calls"][0]["token_stats"]["completion_tokens"] == 1
    assert {"sabc-0", "sabc-1"} <= set(SEEN_ROLLOUT_IDS)  # the id on the wire

    (error,) = errors
    assert isinstance(error, RolloutFailedError) and error.status == 500
    assert b"out of memory" in error.response_content
    assert error.row == sent[2]
    copied = pickle.loads(pickle.dumps(error))
    assert (copied.status, copied.response_content, copied.failure_class) == (
        500,
        error.response_content,
        error.failure_class,
    )


def test_model_servers_found_through_the_served_config(head: BaseServerConfig) -> None:
    sc = ServerClient.load_from_global_config(head)
    urls = []
    for key, value in sc.global_config_dict.items():
        try:
            has_models = "responses_api_models" in value
        except TypeError:
            has_models = False
        if has_models:
            cfg = get_first_server_config_dict(sc.global_config_dict, key)
            urls.append(f"http://{cfg.host}:{cfg.port}")
    assert urls == [f"http://{head.host}:45678"]  # the registered port, not the configured 0


def test_routed_experts_ride_next_to_the_token_ids() -> None:
    completion = {
        "prompt_token_ids": [5, 6],
        "choices": [
            {
                "message": {"role": "assistant", "content": "hi", "routed_experts": ROUTES},
                "token_ids": [7],
                "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.1}]},
                "finish_reason": "stop",
            }
        ],
    }
    (item,) = chat_completion_to_response(completion, request_params={})["output"]
    assert item["routed_experts"] == ROUTES and item["prompt_token_ids"] == [5, 6]
