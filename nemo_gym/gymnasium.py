"""``RemoteEnv``: a Gymnasium-style resources server as a real ``gymnasium.Env`` (needs the ``gym`` extra).

Any Gymnasium loop (a random agent, a wrapper stack, ``gymnasium.utils.env_checker.check_env``)
can drive an environment served over HTTP by :mod:`nemo_gym.gymnasium_server`::

    env = RemoteEnv("http://127.0.0.1:8001", row)      # the server's base URL, a dataset row
    observation, info = env.reset(seed=7)               # POST /reset with the row (seed=7)
    observation, reward, terminated, truncated, info = env.step("<action>hit</action>")
    env.close()                                         # POST /close if an episode is open

Observations and actions are text (``gymnasium.spaces.Text``). The action is sent as the
model's answer: a response with one assistant message holding the text. An action the game
cannot read is the game's business (it answers with an observation or ends the episode),
never an exception here. A terminal step's missing observation is ``""``.

Seeding follows Gymnasium: ``reset(seed=s)`` sends the row with its ``seed`` field set to
``s``; a later ``reset()`` sends a seed drawn from ``self.np_random``, so a seeded sequence of
episodes repeats; an environment never seeded sends the row as it is (its own seed, or none).
"""

from __future__ import annotations

import copy
import string
import urllib.error
import urllib.request
from typing import Any, SupportsFloat

import gymnasium
import orjson
from gymnasium.spaces import Text

from nemo_gym.response_items import message_item
from nemo_gym.serving.protocol import SESSION_COOKIE, auth_headers

__all__ = [
    "ACTION_CHARSET",
    "OBSERVATION_CHARSET",
    "REMOTE_ENV_ID",
    "RemoteEnv",
    "RemoteEnvError",
    "register_remote_env",
]

ACTION_CHARSET = string.printable
"""What a sampled action is made of: printable ASCII and whitespace."""

OBSERVATION_CHARSET = frozenset(string.printable) | frozenset(
    chr(c)
    for c in range(0xA0, 0x3000)  # Latin-1 up to CJK punctuation: card suits, box drawing, arrows
)
"""Characters an observation may hold; any other is written as ``?`` so it stays in the space."""


REMOTE_ENV_ID = "nemo_gym/RemoteEnv-v0"
"""The id :func:`register_remote_env` registers ``RemoteEnv`` under."""


def register_remote_env(env_id: str = REMOTE_ENV_ID) -> str:
    """Register ``RemoteEnv`` with gymnasium (once), so ``gymnasium.make(env_id, url=..., row=...)`` builds one.

    Returns ``env_id``. Registration is explicit: importing this module changes no registry.
    """
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point="nemo_gym.gymnasium:RemoteEnv", disable_env_checker=True)
    return env_id


class RemoteEnvError(RuntimeError):
    """The server could not be reached or refused a request; the message names the URL and its error."""


class RemoteEnv(gymnasium.Env[str, str]):
    """A Gymnasium-style resources server at ``url`` as a ``gymnasium.Env``, one episode per reset of ``row``.

    Args:
        url: the resources server's base URL (``http://host:port``).
        row: the dataset row to reset with (``responses_create_params`` may be omitted).
        seed_field: the row field that seeds an episode (``seed``).
        max_observation_length, max_action_length: bounds of the two ``Text`` spaces; a longer
            observation is cut to fit.
        timeout_s: the limit of one HTTP request.
        render_mode: ``"ansi"`` makes :meth:`render` return the latest observation.
    """

    # render_fps means nothing for text, but gymnasium's checker expects one with a render mode.
    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        url: str,
        row: dict[str, Any] | None = None,
        *,
        seed_field: str = "seed",
        max_observation_length: int = 65536,
        max_action_length: int = 2048,
        timeout_s: float = 60.0,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use 'ansi' or None")
        self.url = url.rstrip("/")
        self.row: dict[str, Any] = {"responses_create_params": {}, **(row or {})}
        self.seed_field = seed_field
        self.timeout_s = timeout_s
        self.render_mode = render_mode
        self._max_observation_length = max_observation_length
        self.observation_space = Text(max_observation_length, min_length=0, charset=OBSERVATION_CHARSET)
        self.action_space = Text(max_action_length, min_length=0, charset=ACTION_CHARSET)
        self._cookie: str | None = None
        self._open = False  # an episode is in play on the server
        self._closable = False
        self._seeded = False
        self._observation = ""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start a new episode (closing the previous one); returns ``(observation, info)``.

        ``options={"row": {...}}`` overrides row fields for this episode.
        """
        super().reset(seed=seed)
        self._end_episode()
        row = copy.deepcopy(self.row)
        if seed is not None:
            self._seeded = True
            row[self.seed_field] = seed
        elif self._seeded:
            row[self.seed_field] = int(self.np_random.integers(0, 2**31 - 1))
        row.update((options or {}).get("row") or {})  # the caller's fields win, its seed included
        answer = self._post("/reset", row)
        info = answer.get("info") or {}
        self._open = True
        self._closable = info.get("supports_explicit_close") is True
        self._observation = self._fit(answer.get("observation"))
        return self._observation, dict(info)

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Send ``action`` as the model's answer; returns ``(observation, reward, terminated, truncated, info)``."""
        if not self._open:
            raise gymnasium.error.ResetNeeded("call reset() before step(): no episode is in play")
        response = {"output": [message_item(str(action))]}
        answer = self._post("/step", {**self.row, "response": response})
        terminated, truncated = bool(answer.get("terminated")), bool(answer.get("truncated"))
        if terminated or truncated:
            self._open = False  # the server freed the episode with its last step
        self._observation = self._fit(answer.get("observation"))
        return (
            self._observation,
            float(answer.get("reward") or 0.0),
            terminated,
            truncated,
            answer.get("info") or {},
        )

    def render(self) -> str | None:  # type: ignore[override]
        """The latest observation with ``render_mode="ansi"``; ``None`` otherwise."""
        return self._observation if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Free the open episode on the server (``/close``, when it supports it). Safe to call twice."""
        self._end_episode()
        super().close()

    # ---- HTTP ---------------------------------------------------------------------------
    def _end_episode(self) -> None:
        if self._open and self._closable and self._cookie is not None:
            try:
                self._post("/close", {})
            except RemoteEnvError:
                pass  # the server is gone or the episode expired: nothing left to free
        self._open = False
        self._cookie = None

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", **auth_headers()}
        if self._cookie is not None:
            headers["Cookie"] = f"{SESSION_COOKIE}={self._cookie}"
        request = urllib.request.Request(
            self.url + route, data=orjson.dumps(body), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                raw = resp.read()
                self._remember_cookie(resp.headers.get_all("Set-Cookie") or [])
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = orjson.loads(detail).get("error", detail)
            except (orjson.JSONDecodeError, AttributeError):
                pass
            raise RemoteEnvError(f"{self.url}{route} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RemoteEnvError(f"cannot reach {self.url}{route}: {reason}") from None
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise RemoteEnvError(
                f"{self.url}{route} answered a body that is not JSON: {raw[:200]!r}"
            ) from None
        if not isinstance(answer, dict):
            raise RemoteEnvError(
                f"{self.url}{route} answered {type(answer).__name__}, expected a JSON object"
            )
        return answer

    def _remember_cookie(self, set_cookies: list[str]) -> None:
        for header in set_cookies:
            name, _, rest = header.partition("=")
            if name.strip() == SESSION_COOKIE:
                self._cookie = rest.split(";", 1)[0]

    def _fit(self, observation: Any) -> str:
        text = "" if observation is None else str(observation)
        if any(c not in OBSERVATION_CHARSET for c in text):
            text = "".join(c if c in OBSERVATION_CHARSET else "?" for c in text)
        return text[: self._max_observation_length]
