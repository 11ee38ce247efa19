"""TRL's rollout_func over this stack's agents (nemo_gym.bridges.trl_rollouts): multi-turn,
tool-using rollouts from the CPU engine that serves the trainer's current weights, laid out as
TRL's prompt/completion token IDs with the tool's output masked, the reward from /verify."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nemo_gym.bridges.trl_rewards import server_url, trl_dataset_columns
from nemo_gym.bridges.trl_rollouts import AgentRolloutError, AgentRollouts, rollout_reward
from nemo_gym.launch.launcher import free_port
from nemo_gym.testing import read_jsonl

ROOT = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(ROOT / "resources_servers/letter_lookup/data/train.jsonl")
CONFIGS = [
    "resources_servers/letter_lookup/configs/letter_lookup.yaml",
    "responses_api_models/local_hf_model/configs/local_hf_model.yaml",
    "resources_servers/letter_lookup/configs/trl_policy.yaml",
]
AGENT = "letter_lookup_simple_agent"


def _why_not() -> str | None:
    for module in ("torch", "transformers", "safetensors"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[cpu]')"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[Any, str]]:
    from nemo_gym.launch.config import load_config
    from nemo_gym.launch.launcher import StackHandle
    from nemo_gym.serving.nemo_gym_client import NeMoGymServerClient

    handle = StackHandle.start(
        load_config([f"+config_paths=[{','.join(CONFIGS)}]", "++head_server.port=0"], cwd=ROOT)
    )
    try:
        config = NeMoGymServerClient.load_from_global_config(handle.head_server_config).global_config_dict
        yield handle.head_server_config, server_url(config, "local_hf_engine")
    finally:
        handle.stop()


def _trainer(model: Any, step: int = 0) -> Any:
    """What AgentRollouts reads of TRL's trainer: its step, its model, accelerate's unwrap."""
    return SimpleNamespace(
        state=SimpleNamespace(global_step=step),
        model=model,
        accelerator=SimpleNamespace(unwrap_model=lambda m: m),
    )


@pytest.mark.slow
def test_rollouts_are_the_stacks_tokens_sampled_from_the_trainers_weights(stack, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nemo_gym.engine.tiny_model import build_tiny_model

    head, engine = stack
    path = build_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():  # the "trained" policy differs from the engine's starting weights
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    rows = ROWS[:2]
    rollouts = AgentRollouts(
        rows, head_server_config=head, engine_url=engine, agent_name=AGENT, weights_dir=tmp_path
    )
    prompts = trl_dataset_columns(rows)["prompt"]
    out = rollouts([prompts[0], prompts[0], prompts[1]], _trainer(model))
    assert rollouts.pushes == 1 and len(out["completion_ids"]) == 3
    for index, row in enumerate([rows[0], rows[0], rows[1]]):
        prompt, completion = out["prompt_ids"][index], out["completion_ids"][index]
        mask, logprobs = out["env_mask"][index], out["logprobs"][index]
        assert len(completion) == len(mask) == len(logprobs)
        text = tokenizer.decode(completion)
        assert '<tool_call>{"name": "lookup"' in text  # turn 1: the call
        tool_output = text.split("<tool_response>")[1].split("</tool_response>")[0]
        assert json.loads(tool_output) == {
            "answer": row["expected_answer"]
        }  # the tool's output, in the sequence...
        runs = [m for i, m in enumerate(mask) if i == 0 or mask[i - 1] != m]
        assert runs == [1, 0, 1], runs  # ...masked out between the policy's two turns
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
        # The engine sampled with the weights the trainer pushed: its logprobs are that model's.
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0].float()
        reference = torch.log_softmax(logits, dim=-1)
        for i, (token, lp, m) in enumerate(zip(completion, logprobs, mask, strict=True)):
            if m:
                assert lp == pytest.approx(float(reference[len(prompt) - 1 + i, token]), abs=2e-3)
        # The reward is letter_lookup's /verify: the answer (the last turn) leads with the letter.
        answer = tokenizer.decode(
            completion[len(mask) - mask[::-1].index(0) :], skip_special_tokens=True
        ).strip()
        expected = float(answer[:1].upper() == row["expected_answer"])
        assert out["ng_reward"][index] == expected, (answer, out["ng_reward"][index])
    assert rollouts.history == [out["ng_reward"]]
    assert rollout_reward(prompts, [None] * 3, ng_reward=out["ng_reward"]) == out["ng_reward"]
    rollouts([prompts[1]], _trainer(model, step=0))
    assert rollouts.pushes == 1  # same step: the engine already has these weights
    rollouts([prompts[1]], _trainer(model, step=1))
    assert rollouts.pushes == 2


def test_faults_stop_training_rather_than_scoring_zero(stack, tmp_path: Path) -> None:
    head, _ = stack
    prompts = trl_dataset_columns(ROWS[:1])["prompt"]
    closed = f"http://127.0.0.1:{free_port()}"
    rollouts = AgentRollouts(ROWS[:1], head_server_config=head, engine_url=closed, agent_name=AGENT)

    class Model:
        def save_pretrained(self, folder: str, safe_serialization: bool) -> None:
            Path(folder).mkdir(parents=True, exist_ok=True)

    with pytest.raises(AgentRolloutError, match="update_weights_from_disk could not be called"):
        rollouts(prompts, _trainer(Model()))
    no_agent = AgentRollouts(ROWS[:1], head_server_config=head, engine_url=None, agent_name="no_such_agent")
    with pytest.raises(AgentRolloutError, match="no_such_agent"):
        no_agent(prompts, _trainer(None))
    with pytest.raises(AgentRolloutError, match="no dataset row has this prompt"):
        no_agent([[{"role": "user", "content": "unknown"}]], _trainer(None))
    with pytest.raises(ValueError, match="row 1 has the prompt of an earlier row"):
        AgentRollouts(
            [ROWS[0], {**ROWS[0], "expected_answer": "D"}], head_server_config=head, engine_url=None
        )
    with pytest.raises(AgentRolloutError, match="ng_reward"):
        rollout_reward(prompts, ["x"])


def _why_no_trl() -> str | None:
    if importlib.util.find_spec("trl") is None:
        return "trl is not installed (pip install -e '.[trl]')"
    return _why_not()


@pytest.mark.slow
@pytest.mark.skipif(_why_no_trl() is not None, reason=_why_no_trl() or "")
def test_trl_grpo_trains_on_agent_rollouts(stack, tmp_path: Path) -> None:
    """TRL's GRPOTrainer for two steps over the stack's rollouts (what scripts/train_trl_agent.py
    runs): it pushes its weights to the engine each step, and each reward is /verify's."""
    import torch
    from datasets import Dataset

    from nemo_gym.bridges.trl_grpo import cpu_grpo_trainer
    from nemo_gym.engine.tiny_model import build_tiny_model

    head, engine = stack
    torch.manual_seed(0)
    path = build_tiny_model()
    rows = ROWS[:4]
    rollouts = AgentRollouts(rows, head_server_config=head, engine_url=engine, agent_name=AGENT)
    trainer = cpu_grpo_trainer(
        path,
        Dataset.from_dict({"prompt": trl_dataset_columns(rows)["prompt"]}),
        rollout_reward,
        output_dir=tmp_path,
        steps=2,
        generations=4,
        max_completion_length=256,
        rollout_func=rollouts,
    )
    trainer.train()
    assert rollouts.pushes == 2 and [len(batch) for batch in rollouts.history] == [4, 4]
    logged = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    assert logged == pytest.approx([sum(batch) / 4 for batch in rollouts.history])
