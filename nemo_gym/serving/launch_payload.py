"""The launch payload: the JSON object the launcher writes to a server's stdin (config and secrets)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import orjson

from nemo_gym.serving.protocol import ENV_LAUNCH_PAYLOAD

LAUNCH_PAYLOAD_WAIT_S = 60.0


def read_launch_payload(stream: Any = None, timeout_s: float = LAUNCH_PAYLOAD_WAIT_S) -> dict[str, Any]:
    """The JSON object the launcher writes to a server's stdin (then closes): config and secrets."""
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
    try:
        payload = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise RuntimeError(f"the launch payload on stdin is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise RuntimeError("the launch payload on stdin must be a JSON object")
    return payload
