"""This stack's agents as TRL's rollout function: multi-turn, tool-using rollouts, token IDs and
logprobs from the stack's engine, the reward from the environment's ``/verify``.

TRL's ``GRPOTrainer(rollout_func=...)`` hands each training step's prompts to a function that
must return the token IDs it trains on. :class:`AgentRollouts` is that function:

1. when the trainer's step has moved on, it writes the policy's weights (``save_pretrained``,
   safetensors) and POSTs ``/update_weights_from_disk`` to the engine that serves the policy
   (``local_hf_model`` with ``weight_updates: true``), so every rollout samples from the policy
   being trained;
2. it runs one rollout per prompt through the stack with
   :meth:`nemo_gym.rollout_collection.RolloutCollectionHelper.run_examples` (what NeMo RL calls):
   the row goes to its agent's ``/run``, which calls the model and the tools turn after turn and
   ends with the resources server's ``/verify``;
3. it lays each rollout's model calls end to end with :func:`nemo_gym.train_data.build_training_sequence`:
   the first call's prompt is TRL's ``prompt_ids``; everything after it is ``completion_ids``,
   with ``env_mask`` 1 where the policy sampled a token and 0 on what the template and the tools
   wrote (TRL leaves those out of the loss), and ``logprobs`` the engine's sampling logprobs.
   ``skip_calls`` masks whole model calls out too (by their index in the rollout): turns the
   policy did not choose, such as those an engine's test hook wrote.

The reward rides along as the extra field ``ng_reward``; :func:`rollout_reward` is the reward
function that hands it to TRL. A rollout that fails (a classified infrastructure failure) or
whose token IDs do not line up raises :class:`AgentRolloutError`: it stops training rather than
being learned as a zero reward.

Prompts are matched back to their dataset rows by their messages (TRL passes only the prompt):
two rows with the same prompt but different task fields are refused at construction.
``trl`` itself is not imported here.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_gym.bridges.trl_rewards import trl_dataset_columns
from nemo_gym.rollout_collection import RolloutCollectionHelper, RolloutFailedError
from nemo_gym.train_data import TrainingDataError, build_training_sequence, model_calls

__all__ = ["REWARD_FIELD", "AgentRolloutError", "AgentRollouts", "rollout_reward"]

REWARD_FIELD = "ng_reward"


class AgentRolloutError(RuntimeError):
    """A rollout that gave no trainable sample (failed, or token IDs that do not line up)."""


def _prompt_key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True)


def rollout_reward(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
    """TRL reward function: each rollout's reward as the environment's ``/verify`` gave it."""
    rewards = columns.get(REWARD_FIELD)
    if not isinstance(rewards, list) or len(rewards) != len(completions):
        raise AgentRolloutError(
            f"no {REWARD_FIELD!r} column for {len(completions)} completions: use rollout_reward with AgentRollouts"
        )
    return [float(r) for r in rewards]


class AgentRollouts:
    """TRL ``rollout_func``: one rollout of this stack's agent per prompt (see the module docstring).

    Args:
        rows: the dataset's NeMo Gym rows (the same rows the trainer's dataset was built from
            with :func:`nemo_gym.bridges.trl_rewards.trl_dataset_columns`).
        head_server_config: the running stack's head server (``StackHandle.head_server_config``).
        engine_url: ``http://host:port`` of the engine serving the policy; None: never push weights.
        agent_name: the agent to run rows without an ``agent_ref``.
        weights_dir: where the weights are written for the engine (default: a temporary folder).
        turn_end_token_ids: passed to :func:`build_training_sequence`.
        concurrency: rollouts in flight at once.
        skip_calls: indices of model calls (0 = a rollout's first) kept out of the loss.

    After each call :attr:`history` has gained the batch's rewards and :attr:`pushes` counts weight
    updates the engine accepted.
    """

    def __init__(
        self,
        rows: Iterable[Mapping[str, Any]],
        *,
        head_server_config: Any,
        engine_url: str | None,
        agent_name: str | None = None,
        weights_dir: str | Path | None = None,
        turn_end_token_ids: Iterable[int] | None = None,
        concurrency: int = 8,
        timeout_s: float = 120.0,
        skip_calls: Iterable[int] = (),
    ) -> None:
        listed = [dict(row) for row in rows]
        prompts = trl_dataset_columns(listed)["prompt"]
        self.rows: dict[str, dict[str, Any]] = {}
        for index, (prompt, row) in enumerate(zip(prompts, listed, strict=True)):
            key = _prompt_key(prompt)
            if key in self.rows and self.rows[key] != row:
                raise ValueError(
                    f"row {index} has the prompt of an earlier row but other fields: prompts must be unique"
                )
            self.rows[key] = row
        self.head_server_config = head_server_config
        self.engine_url = engine_url.rstrip("/") if engine_url else None
        self.agent_name = agent_name
        self._own_dir = (
            None if weights_dir is not None else tempfile.TemporaryDirectory(prefix="ng_trl_weights_")
        )
        self.weights_dir = Path(weights_dir) if weights_dir is not None else Path(self._own_dir.name)  # type: ignore[union-attr]
        self.turn_end_token_ids = list(turn_end_token_ids or ())
        self.concurrency = concurrency
        self.skip_calls = frozenset(skip_calls)
        self.timeout_s = timeout_s
        self.history: list[list[float]] = []
        self.pushes = 0
        self._pushed_step: int | None = None

    # ---- weights ------------------------------------------------------------------------
    def push_weights(self, model: Any) -> None:
        """Write ``model`` (safetensors) and have the engine load it."""
        assert self.engine_url is not None
        model.save_pretrained(str(self.weights_dir), safe_serialization=True)
        url = self.engine_url + "/update_weights_from_disk"
        body = json.dumps({"model_path": str(self.weights_dir)}).encode()
        request = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310 - http URL
                payload = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise AgentRolloutError(f"{url} answered {exc.code}: {detail}") from exc
        except (OSError, ValueError) as exc:
            raise AgentRolloutError(f"{url} could not be called: {exc}") from exc
        if not (isinstance(payload, dict) and payload.get("success") is True):
            raise AgentRolloutError(f"{url} did not load the weights: {payload!r}")
        self.pushes += 1

    # ---- rollouts -----------------------------------------------------------------------
    def row_for(self, prompt: Any) -> dict[str, Any]:
        """The dataset row a TRL prompt came from."""
        row = self.rows.get(_prompt_key(prompt))
        if row is None:
            raise AgentRolloutError(f"no dataset row has this prompt: {str(prompt)[:200]}")
        return dict(row)

    async def _collect(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results: list[dict[str, Any] | None] = [None] * len(rows)
        for index, row in enumerate(rows):
            row["_ng_trl_index"] = index
            if self.agent_name and "agent_ref" not in row:
                row["agent_ref"] = {"type": "responses_api_agents", "name": self.agent_name}
        helper = RolloutCollectionHelper(rollout_timeout_s=self.timeout_s)
        try:
            semaphore = asyncio.Semaphore(self.concurrency)
            for future in helper.run_examples(rows, self.head_server_config, semaphore):
                try:
                    row, result = await future
                except RolloutFailedError as exc:
                    raise AgentRolloutError(str(exc)) from exc
                results[row["_ng_trl_index"]] = result
        finally:
            await helper.close()
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Push the trainer's current weights if its step moved on, run the rollouts, and return
        ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask`` and ``ng_reward``."""
        step = int(trainer.state.global_step)
        if self.engine_url is not None and step != self._pushed_step:
            self.push_weights(trainer.accelerator.unwrap_model(trainer.model))
            self._pushed_step = step
        rows = [self.row_for(prompt) for prompt in prompts]
        results = asyncio.run(self._collect(rows))
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            REWARD_FIELD: [],
        }
        for index, result in enumerate(results):
            try:
                sequence = build_training_sequence(result, turn_end_token_ids=self.turn_end_token_ids)
            except TrainingDataError as exc:
                raise AgentRolloutError(f"rollout {index}: {exc}") from exc
            if not sequence.contiguous:
                raise AgentRolloutError(
                    f"rollout {index}: model call {sequence.break_at_call}'s prompt does not extend the calls "
                    "before it (the engine's splice was refused); it cannot be trained on as one sequence"
                )
            calls = model_calls(result["response"])
            mask, logprobs = list(sequence.loss_mask), list(sequence.logprobs)
            for call in calls[: sequence.num_calls]:
                if call.index in self.skip_calls:  # contiguous: call k's generation follows its prompt
                    begin = len(call.prompt_token_ids)
                    end = begin + len(call.generation_token_ids)
                    mask[begin:end] = [0] * (end - begin)
                    logprobs[begin:end] = [0.0] * (end - begin)
            start = len(calls[0].prompt_token_ids)
            out["prompt_ids"].append(sequence.input_ids[:start])
            out["completion_ids"].append(sequence.input_ids[start:])
            out["logprobs"].append(logprobs[start:])
            out["env_mask"].append(mask[start:])
            out[REWARD_FIELD].append(sequence.reward)
        self.history.append(list(out[REWARD_FIELD]))
        return out
