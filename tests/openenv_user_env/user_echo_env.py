"""An Echo environment written the way an OpenEnv user writes theirs: against openenv-core's public
``MCPEnvironment`` API, its tools on a FastMCP server. It stands in for OpenEnv's own ``echo_env``,
which is published only in OpenEnv's git repository (no package on the index carries it), so that
NeMo Gym's pulled ``openenv`` folder can run its Echo config here with ``env_class`` pointed at it,
as a user points that folder at an environment of their own.

The tools keep echo_env's names and arguments (``echo_message``, ``echo_with_length``, one string
``message`` each) so the folder's ``data/echo/example.jsonl`` rows run unchanged. Like echo_env's
tools, a call earns no reward (0.0); a plain ``EchoAction``-style step (``{"message": ...}``)
earns 0.1 per character, echo_env's reward for it.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Action, Observation, State


class UserEchoAction(Action):
    """A plain echo step: the message to send back."""

    message: str


class UserEchoObservation(Observation):
    """What a plain echo step (or ``reset``) shows: the message and its length."""

    echoed_message: str = ""
    message_length: int = 0


def _echo_tools() -> FastMCP:
    server = FastMCP("user-echo")

    @server.tool()
    def echo_message(message: str) -> str:
        """Echo back the provided message."""
        return message

    @server.tool()
    def echo_with_length(message: str) -> dict[str, Any]:
        """Echo back the message with its length."""
        return {"message": message, "length": len(message)}

    return server


class UserEchoEnvironment(MCPEnvironment):
    """Echoes messages back: two MCP tools, or a plain step rewarded by the message's length."""

    def __init__(self) -> None:
        super().__init__(_echo_tools())
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> UserEchoObservation:
        """A fresh episode: step count 0, a ready message, no reward."""
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return UserEchoObservation(echoed_message="Echo environment ready!", done=False, reward=0.0)

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """A plain echo step (tool calls are routed by ``MCPEnvironment.step`` before this)."""
        if not isinstance(action, UserEchoAction):
            raise ValueError(
                f"UserEchoEnvironment steps take a UserEchoAction or an MCP action, not {action!r}"
            )
        self._state.step_count += 1
        text = action.message
        return UserEchoObservation(
            echoed_message=text, message_length=len(text), done=False, reward=round(0.1 * len(text), 6)
        )

    @property
    def state(self) -> State:
        """The episode's id and step count."""
        return self._state
