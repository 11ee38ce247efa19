"""TRL through OpenEnv's client: ``GRPOTrainer(environment_factory=...)`` driving any environment
of this stack that the OpenEnv bridge (:mod:`nemo_gym.bridges.openenv_server`) serves.

TRL's OpenEnv integration gives each rollout an environment object from ``environment_factory``
(one per rollout, pooled and reset between batches) and hands those objects to the reward
function. :func:`openenv_environment_factory` builds that class around OpenEnv's own
``GenericEnvClient`` (one WebSocket session each):

- ``reset(**columns)`` is TRL's call before generation, with the dataset row's columns: the
  episode starts with ``client.reset(row=<the NeMo Gym row>)`` (the ``ng_row`` column of
  :func:`nemo_gym.bridges.trl_rewards.trl_dataset_columns`), so the bridge's resources server sees
  exactly that row; it returns None (the prompt is already the dataset's);
- :func:`openenv_reward` is the reward function: each completion's text is the episode's action,
  ``client.step({"message": text})``, and the reward is the one OpenEnv's observation carries,
  which the bridge took from the environment's ``/verify``.

One step per episode: the completion is the answer (the bridge's one-step mapping of a
``/verify`` environment). An episode the step did not end (a multi-turn Gymnasium-style
environment) raises :class:`OpenEnvRewardError`, as does an OpenEnv error message (an
infrastructure fault on the bridge's side): neither is learned as a zero reward. The class has no
public methods besides ``reset``, so TRL exposes no tools to the policy.

``openenv-core`` is imported when an episode is created, not on import.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nemo_gym.bridges.trl_rewards import ROW_COLUMN, completion_text

__all__ = ["OpenEnvEpisode", "OpenEnvRewardError", "openenv_environment_factory", "openenv_reward"]


class OpenEnvRewardError(RuntimeError):
    """An episode that produced no reward through OpenEnv (an error message, or not done)."""


class OpenEnvEpisode:
    """One rollout's OpenEnv episode; ``base_url`` is set on the subclass the factory makes."""

    base_url: str = ""

    def __init__(self) -> None:
        from openenv.core.generic_client import GenericEnvClient

        if not self.base_url:
            raise ValueError("build the class with openenv_environment_factory(base_url)")
        self._client = GenericEnvClient(base_url=self.base_url).sync()
        self._done = False
        self._reward: float | None = None
        self._observation: dict[str, Any] = {}

    def reset(self, **columns: Any) -> None:
        """TRL's per-rollout reset, with the dataset row's columns: a new episode on that row."""
        encoded = columns.get(ROW_COLUMN)
        kwargs: dict[str, Any] = {"row": json.loads(encoded)} if isinstance(encoded, str) else {}
        result = self._run(lambda: self._client.reset(**kwargs), "reset")
        self._done, self._reward = bool(result.done), None
        self._observation = dict(result.observation or {})
        return None

    def _run(self, call: Any, what: str) -> Any:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - the client raises plain exceptions for error messages
            raise OpenEnvRewardError(f"OpenEnv {what} at {self.base_url} failed: {exc}") from exc

    def _answer(self, text: str) -> float:
        """Send ``text`` as the episode's one action; the reward OpenEnv reports."""
        result = self._run(lambda: self._client.step({"message": text}), "step")
        if not result.done:
            raise OpenEnvRewardError(
                f"the episode at {self.base_url} is not over after one answer: a multi-turn environment needs "
                "tool methods on the environment class, which this one-step bridge does not offer"
            )
        if result.reward is None:
            raise OpenEnvRewardError(f"OpenEnv step at {self.base_url} ended the episode without a reward")
        self._done, self._reward = True, float(result.reward)
        return self._reward

    def _close(self) -> None:
        self._client.close()


def openenv_environment_factory(base_url: str) -> type[OpenEnvEpisode]:
    """A class TRL can take as ``environment_factory`` (no-argument constructor), bound to the
    OpenEnv server at ``base_url`` (``http://host:port``; OpenEnv's client opens ``/ws``)."""
    return type("NeMoGymOpenEnvEpisode", (OpenEnvEpisode,), {"base_url": base_url.rstrip("/")})


def openenv_reward(
    prompts: Sequence[Any], completions: Sequence[Any], environments: Sequence[OpenEnvEpisode], **columns: Any
) -> list[float]:
    """TRL reward function: each completion's text stepped into its rollout's episode."""
    if len(environments) != len(completions):
        raise OpenEnvRewardError(
            f"{len(completions)} completions but {len(environments)} environments: pass "
            "environment_factory=openenv_environment_factory(url) to the trainer"
        )
    return [env._answer(completion_text(c)) for env, c in zip(environments, completions, strict=True)]
