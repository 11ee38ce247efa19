"""Any environment of this stack, spoken as OpenEnv: ``reset``, ``step`` and ``state`` over a WebSocket.

OpenEnv's clients (``openenv.core.GenericEnvClient``, typed ``EnvClient`` subclasses, TRL through
them) connect to ``<base>/ws`` and exchange JSON messages: ``{"type": "reset", "data": {...}}``,
``{"type": "step", "data": <action>}``, ``{"type": "state"}``, ``{"type": "close"}``; the server
answers ``{"type": "observation", "data": {"observation", "reward", "done"}}``,
``{"type": "state", "data": {"episode_id", "step_count", ...}}`` or ``{"type": "error", "data":
{"message", "code"}}``. ``GET /health`` answers ``{"status": "healthy"}``. One connection is one
environment instance, as in OpenEnv.

:func:`openenv_app` puts this in front of a running resources server and its dataset rows:

- a Gymnasium-style server (``/reset`` and ``/step``, :mod:`nemo_gym.gymnasium_server`, NeMo
  Gym's ``GymnasiumServer`` folders) is driven through :class:`nemo_gym.gymnasium.RemoteEnv`:
  each OpenEnv step is one environment step, multi-turn until the game ends;
- any other resources server (one answer scored by ``/verify``) is one step long: ``reset``
  shows the row's prompt, ``step`` sends the answer to ``/verify`` and ends with its reward.

``reset``'s data may hold ``row_index`` (which dataset row), ``row`` (fields overriding the
row's), ``seed`` (also picks the row, ``seed % len(rows)``, when no index is given) and
``episode_id``. An action is ``{"message": text}`` (OpenEnv's echo shape) or ``{"text": text}``;
an observation is ``{"text": ..., "info": {...}}``. An infrastructure fault (the resources
server refused or failed) answers an ``error`` message naming the server, never a reward.

Run it: ``python -m nemo_gym.bridges.openenv_server --env-url http://127.0.0.1:PORT --data
rows.jsonl --port 0`` (prints the URL). Needs the ``gym`` extra (``RemoteEnv``) and a WebSocket
implementation for uvicorn (``websockets``, in the ``openenv`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from nemo_gym.bridges.trl_rewards import VerifyReward, VerifyRewardError, trl_dataset_columns

__all__ = ["OpenEnvSession", "openenv_app", "probe_gymnasium"]


def probe_gymnasium(env_url: str, timeout_s: float = 10.0) -> bool:
    """Whether the server at ``env_url`` serves Gymnasium-style ``/reset`` (404 there means no)."""
    request = urllib.request.Request(
        env_url.rstrip("/") + "/reset",
        data=b"{}",
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):  # noqa: S310 - an http URL
            return True
    except urllib.error.HTTPError as exc:
        return exc.code not in (404, 405)
    except OSError as exc:
        raise ValueError(f"cannot reach the resources server at {env_url}: {exc}") from exc


class OpenEnvSession:
    """One OpenEnv environment instance (one WebSocket connection) over a resources server."""

    def __init__(self, env_url: str, rows: Sequence[dict[str, Any]], gymnasium_style: bool) -> None:
        self.env_url = env_url.rstrip("/")
        self.rows = rows
        self.gymnasium_style = gymnasium_style
        self.episode_id: str | None = None
        self.step_count = 0
        self.done = False
        self.row: dict[str, Any] | None = None
        self.total_reward = 0.0
        self._env: Any = None

    def _pick_row(self, data: dict[str, Any]) -> dict[str, Any]:
        index = data.get("row_index")
        if index is None and isinstance(data.get("seed"), int):
            index = data["seed"] % len(self.rows)
        if index is None:
            index = 0
        if not isinstance(index, int) or not 0 <= index < len(self.rows):
            raise ValueError(f"row_index {index!r} is not one of the {len(self.rows)} dataset rows (0-based)")
        row = dict(self.rows[index])
        override = data.get("row")
        if override is not None:
            if not isinstance(override, dict):
                raise ValueError("reset's 'row' must be an object of row fields")
            row.update(override)
        return row

    def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        """Start an episode; the observation payload."""
        self.close()
        row = self._pick_row(data)
        self.row = row
        self.episode_id = str(data.get("episode_id") or uuid.uuid4().hex)
        self.step_count, self.done, self.total_reward = 0, False, 0.0
        if self.gymnasium_style:
            from nemo_gym.gymnasium import RemoteEnv

            self._env = RemoteEnv(self.env_url, row)
            seed = data.get("seed")
            text, info = self._env.reset(seed=seed if isinstance(seed, int) else None)
            if not text:  # None observation: the row's prompt is the first message
                text = trl_dataset_columns([row])["prompt"][0][-1]["content"]
        else:
            text, info = trl_dataset_columns([row])["prompt"][0][-1]["content"], {}
        return {"observation": {"text": text, "info": info}, "reward": None, "done": False}

    def step(self, action: Any) -> dict[str, Any]:
        """One action; the observation payload with its reward."""
        if self.row is None:
            raise ValueError("call reset before step: no episode is in play")
        if self.done:
            raise ValueError("the episode is over; call reset to start another")
        text = action.get("message", action.get("text")) if isinstance(action, dict) else None
        if not isinstance(text, str):
            raise ValueError('an action is {"message": "<text>"} (or {"text": "<text>"})')
        self.step_count += 1
        if self.gymnasium_style:
            observation, reward, terminated, truncated, info = self._env.step(text)
            self.done = bool(terminated or truncated)
            payload = {"text": observation, "info": info, "terminated": terminated, "truncated": truncated}
        else:
            reward = VerifyReward(self.env_url).verify(self.row, text)
            self.done = True
            payload = {"text": "", "info": {}, "terminated": True, "truncated": False}
        self.total_reward += float(reward)
        return {"observation": payload, "reward": float(reward), "done": self.done}

    def state(self) -> dict[str, Any]:
        """OpenEnv's ``State``: ``episode_id`` and ``step_count``, plus what this bridge knows."""
        return {
            "episode_id": self.episode_id,
            "step_count": self.step_count,
            "done": self.done,
            "total_reward": self.total_reward,
            "env_url": self.env_url,
            "multi_turn": self.gymnasium_style,
        }

    def close(self) -> None:
        """Free the open episode on the resources server, if any."""
        if self._env is not None:
            self._env.close()
            self._env = None


def _error(message: str, code: str) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code}}


def openenv_app(
    env_url: str, rows: Sequence[dict[str, Any]], gymnasium_style: bool | None = None
) -> Starlette:
    """An ASGI app serving the resources server at ``env_url`` (with ``rows``) to OpenEnv clients.

    ``gymnasium_style`` None probes the server (:func:`probe_gymnasium`).
    """
    if not rows:
        raise ValueError("the OpenEnv bridge needs at least one dataset row")
    multi_turn = probe_gymnasium(env_url) if gymnasium_style is None else gymnasium_style

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy"})

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        session = OpenEnvSession(env_url, rows, multi_turn)
        try:
            while True:
                raw = await websocket.receive_text()
                try:
                    message = json.loads(raw)
                except json.JSONDecodeError as exc:
                    await websocket.send_text(
                        json.dumps(_error(f"the message is not JSON: {exc}", "INVALID_JSON"))
                    )
                    continue
                kind = message.get("type") if isinstance(message, dict) else None
                data = message.get("data") if isinstance(message, dict) else None
                try:
                    if kind == "reset":
                        reply = {
                            "type": "observation",
                            "data": await asyncio.to_thread(session.reset, data or {}),
                        }
                    elif kind == "step":
                        reply = {"type": "observation", "data": await asyncio.to_thread(session.step, data)}
                    elif kind == "state":
                        reply = {"type": "state", "data": session.state()}
                    elif kind == "close":
                        break
                    else:
                        reply = _error(
                            f"unknown message type {kind!r}; use reset, step, state or close", "UNKNOWN_TYPE"
                        )
                except ValueError as exc:
                    reply = _error(str(exc), "VALIDATION_ERROR")
                except (VerifyRewardError, RuntimeError) as exc:
                    reply = _error(f"the resources server failed: {exc}", "EXECUTION_ERROR")
                await websocket.send_text(json.dumps(reply))
        except WebSocketDisconnect:
            pass
        finally:
            await asyncio.to_thread(session.close)

    return Starlette(routes=[Route("/health", health), WebSocketRoute("/ws", ws)])


def main(argv: list[str] | None = None) -> None:
    """Serve a running resources server to OpenEnv clients until interrupted."""
    parser = argparse.ArgumentParser(
        description="Serve a resources server to OpenEnv clients (reset/step/state)."
    )
    parser.add_argument("--env-url", required=True, help="the resources server, http://host:port")
    parser.add_argument("--data", required=True, help="its dataset rows (JSONL)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]

    from nemo_gym.serving.sockets import bind_socket
    from nemo_gym.serving.uvicorn_factory import make_uvicorn_server

    sock = bind_socket(args.host, args.port)
    print(f"OpenEnv bridge: ws://{args.host}:{sock.getsockname()[1]}/ws -> {args.env_url}", flush=True)
    asyncio.run(make_uvicorn_server(openenv_app(args.env_url, rows)).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
