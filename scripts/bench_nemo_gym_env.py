"""CPU per ``/verify`` and per tool call of one NeMo Gym environment, served here and under NeMo Gym.

The environment is NeMo Gym's own ``example_single_tool_call`` folder from the ``nemo-gym`` wheel
(unchanged). Both sides build its app the NeMo Gym way,
``SimpleWeatherResourcesServer(config=..., server_client=...).setup_webserver()``, and serve it
with uvicorn (same settings: one process, 127.0.0.1, httptools, uvloop) in a child process; only
the ``nemo_gym`` package under it differs. The requests are the folder's own: the
``full_reward`` case of ``tests/verifier_cases.jsonl`` for ``/verify`` and ``{"city": "Warsaw"}``
for ``/get_weather``. The number is the server process's CPU time (user + system) over N
sequential keep-alive requests, divided by N, after a warm-up.

Under NeMo Gym needs a Python with NeMo Gym's dependencies (hydra-core, devtools, yappi, pandas,
scipy, ... but not NeMo Gym itself, which comes from the unpacked wheel): ``--nemo-gym-python``.

    python scripts/bench_nemo_gym_env.py --wheel-dir ~/.cache/nemo_gym/wheels/nemo_gym-0.7.0 \\
        --nemo-gym-python /path/to/venv/bin/python --requests 2000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from nemo_gym.launch.launcher import free_port

ENV = "example_single_tool_call"
SERVE = """
import sys, uvicorn
from unittest.mock import MagicMock
from nemo_gym.server_utils import ServerClient
from resources_servers.example_single_tool_call.app import (
    SimpleWeatherResourcesServer as Server, SimpleWeatherResourcesServerConfig as Config)
server = Server(config=Config(host="127.0.0.1", port=0, entrypoint="", name="weather"),
                server_client=MagicMock(spec=ServerClient))
uvicorn.run(server.setup_webserver(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            loop="uvloop", http="httptools", access_log=False)
"""


def measure(python: str, pythonpath: str, requests: int, warmup: int) -> dict[str, float]:
    """Start the server under ``python``; CPU microseconds per request for each route."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen([python, "-c", SERVE, str(port)], env=env, cwd=tempfile.gettempdir())
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    client.post("/get_weather", json={"city": "Warsaw"})
                    break
                except httpx.TransportError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the server under {python} did not start") from None
                    time.sleep(0.2)
            server = psutil.Process(proc.pid)
            cases = [json.loads(line) for line in VERIFY_CASES.read_text().splitlines() if line.strip()]
            verify_body = next(c["request"] for c in cases if c["kind"] == "full_reward")
            out: dict[str, float] = {}
            for route, body in (("/get_weather", {"city": "Warsaw"}), ("/verify", verify_body)):
                for _ in range(warmup):
                    answer = client.post(route, json=body)
                    assert answer.status_code == 200, (route, answer.status_code, answer.text[:300])
                before = server.cpu_times()
                started = time.perf_counter()
                for _ in range(requests):
                    client.post(route, json=body)
                wall = time.perf_counter() - started
                after = server.cpu_times()
                cpu = (after.user - before.user) + (after.system - before.system)
                out[f"{route} cpu_us"] = 1e6 * cpu / requests
                out[f"{route} wall_us"] = 1e6 * wall / requests
            reward = client.post("/verify", json=verify_body).json()["reward"]
            out["verify reward"] = reward
            return out
    finally:
        proc.terminate()
        proc.wait(10)


VERIFY_CASES = Path()


def main() -> int:
    """Print one line per side and route."""
    global VERIFY_CASES
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel-dir", type=Path, required=True, help="the unpacked nemo-gym wheel")
    p.add_argument("--nemo-gym-python", help="a Python with NeMo Gym's dependencies (omit: ours only)")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    opts = p.parse_args()
    VERIFY_CASES = opts.wheel_dir / "resources_servers" / ENV / "tests" / "verifier_cases.jsonl"
    import nemo_gym

    ours = str(Path(nemo_gym.__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory() as scratch:
        # The folder alone in a scratch tree, so our nemo_gym serves it (never the wheel's).
        (Path(scratch) / "resources_servers").mkdir()
        (Path(scratch) / "resources_servers" / "__init__.py").touch()
        shutil.copytree(opts.wheel_dir / "resources_servers" / ENV, Path(scratch) / "resources_servers" / ENV)
        sides = [("here", sys.executable, os.pathsep.join([scratch, ours]))]
        if opts.nemo_gym_python:
            sides.append(("NeMo Gym 0.7.0", opts.nemo_gym_python, str(opts.wheel_dir)))
        for name, python, path in sides:
            result = measure(python, path, opts.requests, opts.warmup)
            for route in ("/get_weather", "/verify"):
                print(
                    f"{name:<15} {route:<13} {result[route + ' cpu_us']:8.0f} us CPU/request  "
                    f"{result[route + ' wall_us']:8.0f} us wall/request  (reward {result['verify reward']})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
