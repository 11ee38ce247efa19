"""textarena_env: any single-player TextArena game served as a resources server, by config alone.

The config names the game (``env_id``, e.g. ``GuessTheNumber-v0``, ``TowerOfHanoi-v0``,
``Mastermind-v0``; ``env_kwargs`` go to ``textarena.make``). Each rollout gets its own
instance, reset with one player and the row's ``seed``; its first observation is the first
user message. Every model answer is one ``env.step(text)`` (TextArena reads the bracketed
action itself: ``[5]``, ``[A C]``); the next observation is the next user message. When the
game ends, the reward is TextArena's own (``env.close()``'s reward for player 0), earned on that
last step; every other step is 0. Needs the ``textarena`` extra.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.base_resources_server import BaseResourcesServerConfig, HTTPError
from nemo_gym.gymnasium_server import GymnasiumServer, StepResult, extract_text


class TextArenaEnvConfig(BaseResourcesServerConfig):
    """``env_id``: a TextArena id; ``env_kwargs``: passed to ``textarena.make``."""

    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class TextArenaRow(BaseModel):
    """A row's TextArena fields: the ``seed`` the game is reset with."""

    model_config = ConfigDict(extra="allow")
    seed: int | None = None


def observation_text(observation: Any) -> str:
    """TextArena's observation (a string, or a list of ``(sender, message, ...)`` entries) as text."""
    if isinstance(observation, str):
        return observation
    if isinstance(observation, list):
        return "\n".join(
            str(e[1]) if isinstance(e, (list, tuple)) and len(e) > 1 else str(e) for e in observation
        )
    return str(observation)


def final_rewards(closed: Any) -> tuple[dict[int, float], dict[Any, Any]]:
    """``env.close()``'s result as ``(rewards by player, game info)``: TextArena 0.7 returns both, older ones the rewards."""
    rewards, game_info = closed if isinstance(closed, tuple) else (closed, {})
    return {int(k): float(v) for k, v in (rewards or {}).items()}, dict(game_info or {})


class TextArenaEnvServer(GymnasiumServer):
    """One TextArena game per rollout, one player; the reward is TextArena's own."""

    config: TextArenaEnvConfig
    plain_bodies = True

    async def reset(
        self, metadata: dict[str, Any], session_id: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        """Make and reset the game; its first observation."""
        import textarena

        row = self.parse_row(TextArenaRow, metadata)
        env = textarena.make(self.config.env_id, **self.config.env_kwargs)
        env.reset(num_players=1, seed=row.seed)
        _, observation = env.get_observation()
        self.session_state[session_id] = env
        return observation_text(observation), {"env_id": self.config.env_id}

    async def step(
        self, action: dict[str, Any], metadata: dict[str, Any], session_id: str | None = None
    ) -> StepResult:
        """One ``env.step`` on the answer's text; the game's reward when it ends."""
        env = self.session_state.get(session_id)
        if env is None:
            raise HTTPError(409, "no game in this rollout: call /reset first (it may be over or expired)")
        done, step_info = env.step(action=extract_text(action))
        if not done:
            _, observation = env.get_observation()
            return observation_text(observation), 0.0, False, False, {"step_info": step_info or {}}
        rewards, game_info = final_rewards(env.close())
        info = {"step_info": step_info or {}, "rewards": rewards, "game_info": game_info}
        return None, float(rewards.get(0, 0.0)), True, False, info


if __name__ == "__main__":
    TextArenaEnvServer.run_webserver()
