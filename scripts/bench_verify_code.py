"""code_gen /verify throughput: sandboxed test execution through a real server on 127.0.0.1.

Starts the code_gen resources server as its own process (``ng_run`` machinery, head server on a
free port), then posts ``/verify`` requests built from ``resources_servers/code_gen/data/example.jsonl``
with the answers of ``configs/scripted_policy.yaml`` (three correct programs, one wrong, one
without code) at a fixed concurrency, and prints verifies/s and test cases/s.

Usage: python scripts/bench_verify_code.py [--concurrency 16] [--requests 160] [--num-processes 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nemo_gym.launch.config import load_config  # noqa: E402
from nemo_gym.launch.launcher import StackHandle  # noqa: E402
from nemo_gym.response_items import message_item  # noqa: E402
from nemo_gym.serving.server_client import ServerClient  # noqa: E402

ENV = ROOT / "resources_servers" / "code_gen"


def verify_bodies() -> list[dict[str, Any]]:
    """One /verify body per example row, answered as the scripted policy answers it."""
    policy = yaml.safe_load((ENV / "configs" / "scripted_policy.yaml").read_text())
    scripts = policy["policy_model"]["responses_api_models"]["scripted_model"]["scripts"]
    bodies = []
    for line in (ENV / "data" / "example.jsonl").read_text().splitlines():
        row = json.loads(line)
        prompt = row["responses_create_params"]["input"][-1]["content"]
        script = next(s for s in scripts if s["match"] is None or re.search(s["match"], prompt))
        bodies.append({**row, "response": {"output": [message_item(script["turns"][0]["text"])]}})
    return bodies


async def drive(
    head_url: str, bodies: list[dict[str, Any]], requests: int, concurrency: int
) -> dict[str, Any]:
    """Post ``requests`` verifies, ``concurrency`` at a time; returns throughput and latencies."""
    client = ServerClient(head_url, timeout_s=300)
    semaphore = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    test_cases = 0
    rewards: list[float] = []

    async def one(index: int) -> None:
        nonlocal test_cases
        body = bodies[index % len(bodies)]
        async with semaphore:
            started = time.monotonic()
            answer = await client.post_json("code_gen", "/verify", body)
            latencies.append(time.monotonic() - started)
        test_cases += len(answer.get("result") or [])
        rewards.append(answer["reward"])

    await asyncio.gather(*(one(i) for i in range(min(concurrency, requests))))  # warm-up round
    latencies.clear()
    rewards.clear()
    test_cases = 0
    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(requests)))
    elapsed = time.monotonic() - started
    await client.close()
    return {
        "requests": requests,
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "verifies_per_s": round(requests / elapsed, 2),
        "test_cases_per_s": round(test_cases / elapsed, 2),
        "p50_latency_s": round(statistics.median(latencies), 3),
        "p99_latency_s": round(sorted(latencies)[int(0.99 * (len(latencies) - 1))], 3),
        "mean_reward": round(sum(rewards) / len(rewards), 3),
    }


def main() -> None:
    """Start the server, run the benchmark, print the numbers (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument(
        "--num-processes", type=int, default=4, help="sandbox children at once (server config)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    config = load_config(
        [
            f"+config_paths=[{ENV / 'configs' / 'code_gen.yaml'},"
            f"{ROOT / 'responses_api_models' / 'scripted_model' / 'configs' / 'scripted_model.yaml'}]",
            "++head_server.port=0",
            f"++code_gen.resources_servers.code_gen.num_processes={args.num_processes}",
        ]
    )
    for other in ("code_gen_simple_agent", "policy_model"):  # only the resources server is measured
        config.pop(other)
    handle = StackHandle.start(config)
    try:
        result = asyncio.run(drive(handle.head_url, verify_bodies(), args.requests, args.concurrency))
    finally:
        handle.stop()
    result["num_processes"] = args.num_processes
    print(
        f"code_gen /verify at concurrency {result['concurrency']}: {result['verifies_per_s']} verifies/s, "
        f"{result['test_cases_per_s']} test cases/s (p50 {result['p50_latency_s']} s, "
        f"p99 {result['p99_latency_s']} s, {result['requests']} requests in {result['seconds']} s, "
        f"{args.num_processes} sandbox processes)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
