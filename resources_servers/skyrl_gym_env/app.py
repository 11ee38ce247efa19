"""skyrl_gym_env: any registered SkyRL-gym text environment served as a resources server, by config alone.

The config names the environment (``env_id``, ``env_config``); each rollout gets its own
``skyrl_gym.make(env_id, env_config=..., extras=row["extras"])`` instance (``extras`` holds what
SkyRL-gym's datasets carry: ``reward_spec.ground_truth``, ``max_turns``, ``extra_info``). Every
model answer is one ``env.step(text)``; its reward is SkyRL-gym's own, its ``observations``
(messages) become the next user message, and ``done`` ends the episode. Multi-turn environments
(``gsm8k_multi_turn``) go through the same ``gymnasium_agent`` as any Gymnasium-style
environment. Needs the ``skyrl`` extra (``skyrl-gym``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.base_resources_server import BaseResourcesServerConfig, HTTPError
from nemo_gym.gymnasium_server import GymnasiumServer, StepResult, extract_text


class SkyRLGymEnvConfig(BaseResourcesServerConfig):
    """``env_id``: a SkyRL-gym registry id (``gsm8k``, ``aime``, ``gsm8k_multi_turn``, ...);
    ``env_config``: passed to the environment's constructor."""

    env_id: str
    env_config: dict[str, Any] = Field(default_factory=dict)


class SkyRLGymRow(BaseModel):
    """A row's SkyRL-gym fields: ``extras`` as SkyRL-gym's datasets carry them."""

    model_config = ConfigDict(extra="allow")
    extras: dict[str, Any] = Field(default_factory=dict)


class SkyRLGymEnvServer(GymnasiumServer):
    """One SkyRL-gym environment instance per rollout; every reward is the environment's own."""

    config: SkyRLGymEnvConfig
    plain_bodies = True

    def make_env(self, extras: dict[str, Any]) -> Any:
        """A fresh SkyRL-gym environment for a row; a 422 naming the field when it refuses the row."""
        import skyrl_gym

        try:
            return skyrl_gym.make(self.config.env_id, env_config=self.config.env_config, extras=extras)
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            raise HTTPError(
                422,
                f"{self.name}: SkyRL-gym's {self.config.env_id!r} refused the row's extras "
                f"({type(exc).__name__}: {exc}); rows need extras.reward_spec.ground_truth and the "
                "environment's other fields",
            ) from None

    async def reset(
        self, metadata: dict[str, Any], session_id: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        """Build the row's environment; the row's prompt is the first message."""
        row = self.parse_row(SkyRLGymRow, metadata)
        env = self.make_env(row.extras)
        env.init([])
        self.session_state[session_id] = env
        return None, {"env_id": self.config.env_id}

    async def step(
        self, action: dict[str, Any], metadata: dict[str, Any], session_id: str | None = None
    ) -> StepResult:
        """One ``env.step`` on the answer's text."""
        env = self.session_state.get(session_id)
        if env is None:
            raise HTTPError(409, "no episode in this rollout: call /reset first (it may be over or expired)")
        output = env.step(extract_text(action))
        messages = output.get("observations") or []
        text = "\n\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict)) or None
        done = bool(output.get("done"))
        info = {"skyrl_metadata": output.get("metadata") or {}, "turns": getattr(env, "turns", None)}
        return text, float(output.get("reward") or 0.0), done, False, info


if __name__ == "__main__":
    SkyRLGymEnvServer.run_webserver()
