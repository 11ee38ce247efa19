"""The deadlines a user gets without configuring anything, and the environment that changes them.

Each case runs in a fresh Python process (the deadlines are read once, when
``nemo_gym.agents.agent_hops`` is imported), against a real hung server on 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DEFAULTS = """
from nemo_gym.agents import agent_hops
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.serving.server_client import ServerClient
print(agent_hops.hop_timeout_s(), agent_hops.rollout_timeout_s())
"""

# A hop with no per-agent deadline uses NEMO_GYM_HOP_TIMEOUT_S: a tool server that never answers
# is cut there (class timeout), then the whole rollout's NEMO_GYM_ROLLOUT_TIMEOUT_S fires.
HUNG_TOOL = """
import asyncio, time
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from nemo_gym.agents.agent_hops import execute_tool_call, rollout_deadline
from nemo_gym.agents.hop_faults import HopFault
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import running_app

async def hang(request):  # never answers, but lets go when its caller hangs up
    while not await request.is_disconnected():
        await asyncio.sleep(0.05)
    return Response(status_code=499)

async def main(url):
    client = ServerClient(static_urls={"env": url})
    call = {"type": "function_call", "name": "tool", "arguments": "{}", "call_id": "c"}
    try:
        started = time.monotonic()
        try:
            print("returned", await execute_tool_call(client.rollout(), "env", call, {"tool"}))  # never
        except HopFault as exc:
            print("hop", exc.failure_class, round(time.monotonic() - started, 1))
        started = time.monotonic()
        try:
            async with rollout_deadline():
                await asyncio.sleep(60)
        except HopFault as exc:
            print("rollout", exc.failure_class, round(time.monotonic() - started, 1))
    finally:
        await client.close()

with running_app(Starlette(routes=[Route("/{path:path}", hang, methods=["POST"])])) as url:  # any rollout prefix
    asyncio.run(main(url))
"""


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_GYM_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_defaults_are_300_s_per_hop_and_1200_s_per_rollout():
    done = run(DEFAULTS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["300.0", "1200.0"]


def test_the_environment_sets_both_deadlines_and_they_cut_a_hung_hop():
    done = run(HUNG_TOOL, NEMO_GYM_HOP_TIMEOUT_S="0.5", NEMO_GYM_ROLLOUT_TIMEOUT_S="0.7")
    assert done.returncode == 0, done.stderr
    hop, rollout = (line.split() for line in done.stdout.splitlines())
    assert hop[:2] == ["hop", "timeout"] and 0.4 <= float(hop[2]) < 5
    assert rollout[:2] == ["rollout", "timeout"] and 0.6 <= float(rollout[2]) < 5


@pytest.mark.parametrize("value", ["soon", "0", "-3"])
def test_a_bad_deadline_in_the_environment_is_a_clear_error(value):
    done = run(DEFAULTS, NEMO_GYM_HOP_TIMEOUT_S=value)
    assert done.returncode != 0
    assert f"NEMO_GYM_HOP_TIMEOUT_S={value!r}" in done.stderr
