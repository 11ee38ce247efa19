"""gem_env: any GEM (``gem-llm``) environment served as a resources server, by config alone.

The config names the environment (``env_id``, e.g. ``game:GuessTheNumber-v0-easy``,
``game:Mastermind-v0-easy``, ``game:TowerofHanoi-v0-easy``; ``env_kwargs`` go to ``gem.make``).
Each rollout gets its own instance, reset with the row's ``seed``; its first observation is the
first user message. GEM's environments are Gymnasium-shaped (``step(text)`` returns observation,
reward, terminated, truncated, info), so every model answer is one ``env.step`` and every reward
is GEM's own. Needs ``gem-llm`` (the ``gem`` extra's note: install it with ``--no-deps``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.base_resources_server import BaseResourcesServerConfig, HTTPError
from nemo_gym.gymnasium_server import GymnasiumServer, StepResult, extract_text


class GemEnvConfig(BaseResourcesServerConfig):
    """``env_id``: a GEM registry id; ``env_kwargs``: passed to ``gem.make``."""

    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class GemRow(BaseModel):
    """A row's GEM fields: the ``seed`` the environment is reset with."""

    model_config = ConfigDict(extra="allow")
    seed: int | None = None


class GemEnvServer(GymnasiumServer):
    """One GEM environment per rollout; every reward is GEM's own."""

    config: GemEnvConfig
    plain_bodies = True

    async def reset(
        self, metadata: dict[str, Any], session_id: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        """Make and reset the environment; its first observation."""
        import gem

        row = self.parse_row(GemRow, metadata)
        env = gem.make(self.config.env_id, **self.config.env_kwargs)
        observation, _ = env.reset(seed=row.seed)
        self.session_state[session_id] = env
        return str(observation), {"env_id": self.config.env_id}

    async def step(
        self, action: dict[str, Any], metadata: dict[str, Any], session_id: str | None = None
    ) -> StepResult:
        """One ``env.step`` on the answer's text."""
        env = self.session_state.get(session_id)
        if env is None:
            raise HTTPError(409, "no episode in this rollout: call /reset first (it may be over or expired)")
        observation, reward, terminated, truncated, info = env.step(extract_text(action))
        done = bool(terminated or truncated)
        safe_info = {
            k: v for k, v in (info or {}).items() if isinstance(v, (str, int, float, bool, type(None)))
        }
        return (
            (None if done else str(observation)),
            float(reward),
            bool(terminated),
            bool(truncated),
            safe_info,
        )


if __name__ == "__main__":
    GemEnvServer.run_webserver()
