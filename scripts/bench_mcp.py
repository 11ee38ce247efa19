"""What a tool call over MCP costs against the same call over HTTP, on one resources server.

Starts ``example_mcp_weather`` (``expose_tools_over_mcp``) in a child process on 127.0.0.1 and
times ``get_weather`` sequentially from one client, three ways:

- ``http``: ``POST /get_weather`` with the session cookie, kept-alive connection (httpx);
- ``mcp_session``: ``tools/call`` on one open MCP session (the ``mcp`` package's streamable HTTP
  client), as our agents call an HTTP MCP server within a rollout;
- ``mcp_fresh``: a fresh MCP session per call (``initialize`` then ``tools/call``), as verifiers'
  NeMo Gym toolset does.

Prints the median and p90 latency (ms) of each and the server's CPU per call.

Usage: python scripts/bench_mcp.py [--calls 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
SERVER = """
import asyncio, sys
from nemo_gym.serving.server import bind_socket
from resources_servers.example_mcp_weather.app import ExampleMCPWeatherResourcesServer
sock = bind_socket("127.0.0.1", 0)
print(sock.getsockname()[1], flush=True)
asyncio.run(ExampleMCPWeatherResourcesServer({"name": "weather"}).serve(sock, register=False))
"""


def summary(samples: list[float], cpu_s: float) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p90_ms": round(ordered[int(len(ordered) * 0.9)] * 1000, 3),
        "server_cpu_ms_per_call": round(cpu_s / len(samples) * 1000, 3),
    }


async def measure(url: str, calls: int, server: psutil.Process) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        seeded = await http.post(url + "/seed_session", json={"verifier_metadata": {"expected_city": "Oslo"}})
        headers = seeded.json()["mcp"]["headers"]
        mcp_url = url + seeded.json()["mcp"]["url_path"]

        async def http_call() -> None:
            (await http.post(url + "/get_weather", json={"city": "Oslo"})).raise_for_status()

        async with create_mcp_http_client(headers=headers) as client:
            async with streamable_http_client(mcp_url, http_client=client) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()

                    async def session_call() -> None:
                        assert not (await session.call_tool("get_weather", {"city": "Oslo"})).isError

                    async def fresh_call() -> None:
                        async with create_mcp_http_client(headers=headers) as fresh_client:
                            async with streamable_http_client(mcp_url, http_client=fresh_client) as (
                                r,
                                w,
                                *_,
                            ):
                                async with ClientSession(r, w) as fresh:
                                    await fresh.initialize()
                                    assert not (
                                        await fresh.call_tool("get_weather", {"city": "Oslo"})
                                    ).isError

                    for name, call in (
                        ("http", http_call),
                        ("mcp_session", session_call),
                        ("mcp_fresh", fresh_call),
                    ):
                        for _ in range(10):
                            await call()  # warm up
                        cpu_before = sum(server.cpu_times()[:2])
                        samples = []
                        for _ in range(calls):
                            started = time.perf_counter()
                            await call()
                            samples.append(time.perf_counter() - started)
                        results[name] = summary(samples, sum(server.cpu_times()[:2]) - cpu_before)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        results = asyncio.run(measure(url, args.calls, psutil.Process(child.pid)))
    finally:
        child.terminate()
        child.wait(10)
    for name, numbers in results.items():
        print(f"{name:12s} " + "  ".join(f"{k}={v}" for k, v in numbers.items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
