"""Framework overhead benchmark: what nemo_gym costs per rollout, next to the bare HTTP floor.

Starts the example_single_tool_call stack with the instant scripted model (real processes on
127.0.0.1) and measures, printing a table and writing JSON:

  (a) full-stack rollouts/s at several concurrencies (collector-style driver posting /run)
  (b) p50/p99 latency per rollout at concurrency 1
  (c) the floor: requests/s of one bare starlette/uvicorn echo hop driven by a bare aiohttp
      client, and the ratio of (a) to (floor / hops per rollout)
  (d) ng_run time to all-healthy and RSS per server (scripts/bench_startup.py)
  (e) one hop carrying a 32k-token history with token IDs: bytes, client ms, server CPU ms
  (f) collector RSS on 1,000,000 rows: see scripts/bench_collector_rss.py

Usage: python scripts/bench_overhead.py [--concurrency 1 64 512 4096] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nemo_gym.launch.config import load_config  # noqa: E402
from nemo_gym.launch.launcher import StackHandle, free_port  # noqa: E402
from nemo_gym.serving.server_client import ServerClient  # noqa: E402

HOPS_PER_ROLLOUT = 6  # collector→agent, seed_session, model, tool, model, verify
AGENT = "example_single_tool_call_simple_agent"
ROW = orjson.loads(
    (ROOT / "resources_servers/example_single_tool_call/data/example.jsonl").read_bytes().splitlines()[0]
)

ECHO_SERVER = textwrap.dedent(
    """
    import sys, uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                loop="uvloop", http="httptools")
    """
)


async def drive(client: ServerClient, concurrency: int, total: int) -> tuple[float, list[float]]:
    """Run ``total`` rollouts with at most ``concurrency`` in flight; (wall seconds, latencies)."""
    semaphore = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one() -> None:
        async with semaphore:
            started = time.perf_counter()
            result = await client.post_json(AGENT, "/run", ROW)
            latencies.append(time.perf_counter() - started)
            assert result["reward"] == 1.0

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return time.perf_counter() - started, latencies


async def bare_floor(port: int, concurrency: int, total: int) -> float:
    """Requests/s of a bare aiohttp client against the bare starlette/uvicorn echo server."""
    body = orjson.dumps(ROW)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        semaphore = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with semaphore:
                async with http.post(f"http://127.0.0.1:{port}/echo", data=body) as resp:
                    await resp.read()

        await asyncio.gather(*(one() for _ in range(min(200, total))))  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(total)))
        return total / (time.perf_counter() - started)


def token_history(tokens: int) -> dict[str, Any]:
    """A Responses request whose history holds ``tokens`` prompt token IDs plus text and logprobs."""
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
        "prompt_token_ids": list(range(tokens)),
        "generation_token_ids": list(range(256)),
        "generation_log_probs": [-0.123456789] * 256,
    }
    text = "word " * (tokens // 2)
    return {
        **ROW["responses_create_params"],
        "input": [
            {"role": "user", "content": text},
            call,
            {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
        ],
    }


async def big_hop(client: ServerClient, model_pid: int, tokens: int, repeats: int) -> dict[str, float]:
    """Client wall ms and model-server CPU ms for one /v1/responses hop with a long token history."""
    body = token_history(tokens)
    size = len(orjson.dumps(body))
    proc = psutil.Process(model_pid)
    await client.post_json("policy_model", "/v1/responses", body)  # warm-up
    cpu_before = sum(proc.cpu_times()[:2])
    started = time.perf_counter()
    for _ in range(repeats):
        await client.post_json("policy_model", "/v1/responses", body)
    wall = (time.perf_counter() - started) / repeats
    cpu = (sum(proc.cpu_times()[:2]) - cpu_before) / repeats
    return {"bytes": size, "client_ms": wall * 1000, "server_cpu_ms": cpu * 1000}


async def measure(
    handle: StackHandle, concurrencies: list[int], repeats: int, echo_port: int
) -> dict[str, Any]:
    client = ServerClient(handle.head_url)
    await drive(client, 8, 100)  # warm-up: connections, imports, caches
    results: dict[str, Any] = {"rollouts_per_s": {}, "floor": {}}
    for concurrency in concurrencies:
        total = max(300, 2 * concurrency)
        rates = []
        for _ in range(repeats):
            wall, _ = await drive(client, concurrency, total)
            rates.append(total / wall)
        results["rollouts_per_s"][concurrency] = statistics.median(rates)
        print(
            f"  concurrency {concurrency:5d}: {statistics.median(rates):8.1f} rollouts/s (runs: {', '.join(f'{r:.0f}' for r in rates)})",
            flush=True,
        )
    latencies: list[float] = []
    for _ in range(repeats):
        _, lat = await drive(client, 1, 300)
        latencies += lat
    latencies.sort()
    results["latency_ms_c1"] = {
        "p50": latencies[len(latencies) // 2] * 1000,
        "p99": latencies[int(len(latencies) * 0.99)] * 1000,
    }
    for concurrency in (64, 512):
        floor_runs = [await bare_floor(echo_port, concurrency, 5000) for _ in range(repeats)]
        results["floor"][concurrency] = statistics.median(floor_runs)
    model_pid = next(r.pid for r in handle.stack.head.registry.all() if r.name == "policy_model")
    results["hop_32k"] = await big_hop(client, model_pid, 32_768, 300)
    await client.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 512, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    echo_port = free_port()
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(echo_port)])
    config = load_config(
        [
            "+config_paths=[resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
            "responses_api_models/scripted_model/configs/scripted_model.yaml]",
            "++head_server.port=0",
        ],
        cwd=ROOT,
    )
    handle = StackHandle.start(config, log=lambda name, line: None)
    try:
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:
            runner = asyncio.Runner()
        with runner:
            print("full-stack rollouts/s (example_single_tool_call, scripted model, 6 hops per rollout):")
            results = runner.run(measure(handle, args.concurrency, args.repeats, echo_port))
        results["rss_mib"] = {
            r.name: psutil.Process(r.pid).memory_info().rss / 2**20 for r in handle.stack.head.registry.all()
        }
    finally:
        handle.stop()
        echo.terminate()
        echo.wait()

    print("\n| measure | value |\n|---|---|")
    for concurrency, rate in results["rollouts_per_s"].items():
        print(f"| rollouts/s at concurrency {concurrency} | {rate:.1f} |")
    print(
        f"| p50 / p99 latency per rollout at concurrency 1 | {results['latency_ms_c1']['p50']:.2f} ms / {results['latency_ms_c1']['p99']:.2f} ms |"
    )
    for concurrency, floor in results["floor"].items():
        print(
            f"| bare echo hop (starlette/uvicorn + aiohttp) at concurrency {concurrency} | {floor:.0f} req/s |"
        )
        if concurrency in results["rollouts_per_s"]:
            ratio = results["rollouts_per_s"][concurrency] / (floor / HOPS_PER_ROLLOUT)
            results.setdefault("ratio_to_floor", {})[concurrency] = ratio
            print(
                f"| rollouts/s ÷ (floor / {HOPS_PER_ROLLOUT} hops) at concurrency {concurrency} | {ratio:.0%} |"
            )
    hop = results["hop_32k"]
    print(
        f"| 32k-token hop: body / client time / server CPU | {hop['bytes'] / 1024:.0f} KiB / {hop['client_ms']:.2f} ms / {hop['server_cpu_ms']:.2f} ms |"
    )
    for name, rss in sorted(results["rss_mib"].items()):
        print(f"| RSS {name} after the run | {rss:.1f} MiB |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
