"""gymnasium_env: any registered ``gymnasium.Env`` served as an LLM environment, by config alone.

The config names the environment (``env_id``, ``env_kwargs``), how the model's text becomes an
action (``action_pattern`` finds a name, ``actions`` maps names to the env's actions) and how
an observation is written for the model (``observation_template`` over the env's text
rendering and raw observation). Each rollout gets its own ``gymnasium.make`` instance, reset
with the row's ``seed``; every step's reward is the env's own.

An answer with no readable action does not reach the env: it is answered with an observation
saying what was expected (reward ``invalid_action_reward``), and ``max_invalid_actions`` of
them in a row truncate the episode. ``invalid_action: end`` ends the episode at once instead.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import gymnasium
from gymnasium.envs.registration import load_env_creator
from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_gym.base_resources_server import BaseResourcesServerConfig, HTTPError
from nemo_gym.gymnasium_server import GymnasiumServer, StepResult, extract_text

ANSI = re.compile(r"\x1b\[([0-9;]*)m(.*?)\x1b\[0m", re.DOTALL)
STRAY_ANSI = re.compile(r"\x1b\[[0-9;]*m")
COLORS = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white", "crimson")


class GymnasiumEnvConfig(BaseResourcesServerConfig):
    """Which gymnasium env to serve and how the model reads and plays it.

    - ``env_id``, ``env_kwargs``: passed to ``gymnasium.make`` (a row's ``env_kwargs`` are
      merged over these); ``max_episode_steps`` overrides the registered time limit.
    - ``render``: write the env's ``ansi`` rendering into ``{render}`` (needs an env that has
      one); ``ansi_markers`` turns colored text into plain text by color name (``red``,
      ``yellow``, ...; a highlight counts as its color): a format string with ``{}`` for the
      colored text; colors not listed get ``default_marker``.
    - ``actions``: action names the model may write → the env's action (several names may map
      to one action). Empty: a ``Discrete(n)`` env's actions by number (``0`` .. ``n-1``).
    - ``action_pattern``: a regex whose group 1 is the action name, searched in the model's
      text (names match case-insensitively).
    - ``observation_template``: ``str.format`` template with ``{render}``, ``{observation}``
      (the raw observation; ``{observation[0]}`` for a tuple), ``{actions}`` (the names, comma
      separated), ``{reward}`` (the last step's) and ``{step}`` (steps taken).
    """

    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    max_episode_steps: int | None = Field(None, ge=1)
    render: bool = True
    ansi_markers: dict[str, str] = Field(default_factory=dict)
    default_marker: str = "[{}]"
    actions: dict[str, int] = Field(default_factory=dict)
    action_pattern: str = r"<action>\s*([^<]*?)\s*</action>"
    observation_template: str = "{render}\nAnswer with <action>NAME</action>, NAME one of: {actions}."
    invalid_action: Literal["ask_again", "end"] = "ask_again"
    invalid_action_reward: float = 0.0
    max_invalid_actions: int = Field(3, ge=1)

    @field_validator("action_pattern")
    @classmethod
    def _one_group(cls, value: str) -> str:
        if re.compile(value).groups < 1:
            raise ValueError("action_pattern needs a capturing group around the action name")
        return value


class EpisodeRow(BaseModel):
    """The row fields this server reads: ``seed`` (optional) and ``env_kwargs`` (merged over the config's)."""

    model_config = ConfigDict(extra="ignore")

    seed: int | None = None
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class Episode:
    """One rollout's env and its counters."""

    def __init__(self, env: gymnasium.Env, observation: Any) -> None:
        self.env = env
        self.observation = observation
        self.steps = 0
        self.invalid_in_a_row = 0
        self.total_reward = 0.0
        self.last_reward = 0.0


def json_safe(value: Any) -> Any:
    """Numpy arrays and scalars (which gymnasium infos hold) as plain JSON values."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist"):  # numpy array or scalar
        return json_safe(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class GymnasiumEnvServer(GymnasiumServer):
    """Serves ``config.env_id`` as a text game: one ``gymnasium.make`` instance per rollout."""

    config: GymnasiumEnvConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = self.config
        try:
            spec = gymnasium.spec(config.env_id)
        except gymnasium.error.Error as exc:
            raise ValueError(
                f"{self.name}: env_id {config.env_id!r} is not a registered gymnasium env: {exc}"
            ) from None
        creator = spec.entry_point
        if isinstance(creator, str):
            creator = load_env_creator(creator)
        if config.render and "ansi" not in (getattr(creator, "metadata", {}).get("render_modes") or []):
            raise ValueError(
                f"{self.name}: {config.env_id} has no 'ansi' text rendering; set render: false and write "
                "the observation with {observation} in observation_template"
            )
        probe = self._make({})  # fail at start-up, not on the first rollout, for a config that cannot work
        try:
            space = probe.action_space
            if config.actions:
                bad = {name: a for name, a in config.actions.items() if not space.contains(a)}
                if bad:
                    raise ValueError(
                        f"{self.name}: actions {bad} are not in {config.env_id}'s action space {space}"
                    )
                self._actions = {name.lower(): a for name, a in config.actions.items()}
                self._names = list(config.actions)
            elif isinstance(space, gymnasium.spaces.Discrete):
                self._names = [str(int(space.start) + i) for i in range(int(space.n))]
                self._actions = {name: int(name) for name in self._names}
            else:
                raise ValueError(
                    f"{self.name}: {config.env_id}'s action space {space} needs an 'actions' mapping"
                )
            observation, _ = probe.reset(seed=0)
            try:
                self._write(Episode(probe, observation))
            except HTTPError as exc:
                raise ValueError(exc.message) from None
        finally:
            probe.close()
        self._pattern = re.compile(config.action_pattern, re.IGNORECASE | re.DOTALL)
        self.env_spec = spec

    async def reset(
        self, metadata: dict[str, Any], session_id: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        """Make this rollout's env and reset it with the row's ``seed``."""
        row = self.parse_row(EpisodeRow, metadata)
        try:
            env = self._make(row.env_kwargs)
        except Exception as exc:  # noqa: BLE001 - a row's env_kwargs the env refuses is the row's fault
            raise HTTPError(
                422, f"env_kwargs: {self.config.env_id} refused them: {type(exc).__name__}: {exc}"
            ) from None
        observation, info = env.reset(seed=row.seed)
        episode = Episode(env, observation)
        self.session_state[session_id] = episode
        return self._write(episode), {"env_id": self.config.env_id, **json_safe(info)}

    async def step(
        self, action: dict[str, Any], metadata: dict[str, Any], session_id: str | None = None
    ) -> StepResult:
        """Read the action from the model's text and step the env; an unreadable one is answered, not stepped."""
        episode: Episode | None = self.session_state.get(session_id)
        if episode is None:
            raise HTTPError(409, "no episode in this rollout: call /reset first (or it ended or expired)")
        text = extract_text(action)
        found = self._pattern.search(text)
        name = found.group(1).strip().lower() if found else None
        if name not in self._actions:
            return self._invalid(episode, name)
        episode.invalid_in_a_row = 0
        observation, reward, terminated, truncated, info = episode.env.step(self._actions[name])
        episode.observation = observation
        episode.steps += 1
        episode.last_reward = float(reward)
        episode.total_reward += float(reward)
        info = {**json_safe(info), "action": name, "step": episode.steps}
        if terminated or truncated:
            info["episode_return"] = episode.total_reward
            return None, float(reward), bool(terminated), bool(truncated), info
        return self._write(episode), float(reward), False, False, info

    async def close_session(self, session_id: str | None) -> bool:
        """Close the rollout's env, then free its state."""
        episode = self.session_state.get(session_id)
        if isinstance(episode, Episode):
            episode.env.close()
        return await super().close_session(session_id)

    def _invalid(self, episode: Episode, name: str | None) -> StepResult:
        episode.invalid_in_a_row += 1
        reward = self.config.invalid_action_reward
        what = "no action" if name is None else f"the action {name!r}, which is not one of them"
        note = f"Your answer must name one action of: {', '.join(self._names)}; it had {what}."
        info = {"invalid_action": True, "step": episode.steps}
        if self.config.invalid_action == "end":
            return None, reward, True, False, {**info, "reason": note}
        if episode.invalid_in_a_row >= self.config.max_invalid_actions:
            reason = f"{episode.invalid_in_a_row} answers in a row without a valid action"
            return None, reward, False, True, {**info, "reason": reason}
        return f"{note}\n{self._write(episode)}", reward, False, False, info

    def _make(self, row_kwargs: dict[str, Any]) -> gymnasium.Env:
        kwargs: dict[str, Any] = {**self.config.env_kwargs, **row_kwargs}
        if self.config.render:
            kwargs["render_mode"] = "ansi"
        if self.config.max_episode_steps is not None:
            kwargs["max_episode_steps"] = self.config.max_episode_steps
        return gymnasium.make(self.config.env_id, **kwargs)

    def _write(self, episode: Episode) -> str:
        rendered = ""
        if self.config.render:
            rendered = self._plain(str(episode.env.render() or "")).strip("\n")
        fields = {
            "render": rendered,
            "observation": json_safe(episode.observation),
            "actions": ", ".join(self._names),
            "reward": episode.last_reward,
            "step": episode.steps,
        }
        try:
            return self.config.observation_template.format(**fields)
        except (KeyError, IndexError, AttributeError) as exc:
            raise HTTPError(
                500, f"observation_template of {self.name} cannot be filled: {type(exc).__name__}: {exc}"
            ) from None

    def _plain(self, text: str) -> str:
        def mark(found: re.Match[str]) -> str:
            marker = self.config.ansi_markers.get(_color(found.group(1)), self.config.default_marker)
            return marker.format(found.group(2))

        return STRAY_ANSI.sub("", ANSI.sub(mark, text))


def _color(codes: str) -> str:
    """The color name of an SGR code list (``41`` highlight red → ``red``, ``34;1`` → ``blue``)."""
    for code in codes.split(";"):
        if code.isdigit() and (30 <= int(code) <= 38 or 40 <= int(code) <= 48):
            return COLORS[int(code) % 10]
    return "plain"


if __name__ == "__main__":
    GymnasiumEnvServer.run_webserver()
