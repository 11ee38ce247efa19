"""The launch payload: what the launcher hands a server process on its stdin (config and secrets).

:class:`LaunchPayload` is written by the launcher (``launch/launcher.py``), may be adjusted on
the way by the Ray backend (the node's address as the server's host) and is read by the server
process (:meth:`~nemo_gym.serving.server.BaseServer.from_env`): one type, its keys spelled here
only. Secrets travel this way, never in the environment (readable in ``/proc/<pid>/environ`` and
inherited by every process the server starts).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from nemo_gym.serving.protocol import ENV_LAUNCH_PAYLOAD

LAUNCH_PAYLOAD_WAIT_S = 60.0


@dataclass(frozen=True)
class LaunchPayload:
    """A launched server's config and secrets.

    ``server_config``: the instance's fields plus its ``name``; ``auth_token``: the token every
    call between the run's servers carries; ``registration_secret``: what the head server asks
    of a registering server; ``global_config``: the run's whole config with other servers'
    secrets redacted (what ``get_global_config_dict()`` answers in the server), when given.
    """

    server_config: dict[str, Any] = field(default_factory=dict)
    auth_token: str | None = None
    registration_secret: str | None = None
    global_config: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        """The bytes written to the server's stdin (``global_config`` left out when not given)."""
        data = dataclasses.asdict(self)
        if self.global_config is None:
            del data["global_config"]
        # default=str: a config value that is not JSON (a Path from a trainer's dict) travels as text.
        return orjson.dumps(data, default=str)

    @classmethod
    def from_json(cls, raw: bytes) -> LaunchPayload:
        """Parse the bytes a launcher wrote; raises ``RuntimeError`` naming what is wrong."""
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise RuntimeError(f"the launch payload on stdin is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise RuntimeError("the launch payload on stdin must be a JSON object")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise RuntimeError(f"the launch payload has unknown keys {unknown}")
        for key, kind in (("server_config", Mapping), ("global_config", Mapping)):
            if data.get(key) is not None and not isinstance(data[key], kind):
                raise RuntimeError(f"the launch payload's {key} must be a JSON object")
        for key in ("auth_token", "registration_secret"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise RuntimeError(f"the launch payload's {key} must be a string")
        return cls(
            server_config=dict(data.get("server_config") or {}),
            auth_token=data.get("auth_token"),
            registration_secret=data.get("registration_secret"),
            global_config=data.get("global_config"),
        )

    def on_host(self, host: str) -> LaunchPayload:
        """This payload with ``host`` as the server's host when its config names none."""
        if self.server_config.get("host"):
            return self
        return dataclasses.replace(self, server_config={**self.server_config, "host": host})


def read_launch_payload(stream: Any = None, timeout_s: float = LAUNCH_PAYLOAD_WAIT_S) -> LaunchPayload:
    """The payload the launcher writes to a server's stdin (then closes): config and secrets."""
    import select

    source = stream if stream is not None else sys.stdin.buffer
    chunks = []
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([source], [], [], remaining)[0]:
            raise RuntimeError(
                f"{ENV_LAUNCH_PAYLOAD}=stdin is set but no launch payload arrived on stdin within "
                f"{timeout_s:g}s (a replaced run_command hook must pass LaunchSettings.stdin_payload)"
            )
        chunk = os.read(source.fileno(), 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return LaunchPayload.from_json(b"".join(chunks))
