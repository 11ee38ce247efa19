"""Where ``/run`` latency at concurrency 1 goes: every hop of a rollout timed on its own, next to the floor.

Starts the openai stack of ``scripts/bench_cpu_per_rollout.py`` (example_single_tool_call +
simple_agent + openai_model in front of an instant OpenAI-compatible fake, real processes on
127.0.0.1) and a bare starlette/uvicorn echo server (the floor: one bare uvicorn hop on this
machine). With one blocking connection per target (a minimal raw-socket client: ``http.client`` alone
costs about a bare hop) and one request at a time, it measures the p50 of: the echo hop; the fake policy itself; each hop the agent makes in a rollout, posted
directly to its server with the body the agent sends (``/seed_session``, the two model calls,
``/get_weather``, ``/verify``); and the whole ``/run``. ``/run`` minus the sum of its hops is
the agent's own share. While ``/run`` is posted it also reads each process's CPU time (CPU per
rollout at concurrency 1: what the rollout costs when nothing overlaps, a number far less
sensitive to a loaded machine than wall time). Targets take turns 50 requests at a time, so all
see the same load; each number is the median over ``--repeats`` rounds.

Usage: python scripts/bench_latency_c1.py [--requests 1000] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_cpu_per_rollout import (  # noqa: E402
    AGENT,
    ECHO_SERVER,
    FAKE_OPENAI,
    ROWS,
    cpu_s,
    stack_config,
)

from nemo_gym.launch.launcher import StackHandle, free_port, wait_for_port  # noqa: E402

HEADERS = {"Content-Type": "application/json"}


class RawClient:
    """A blocking keep-alive HTTP/1.1 client doing the least work per request (``http.client``
    parses headers in Python and costs about as much as a whole bare hop)."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.host, self.port = host, port

    def request_bytes(self, path: str, body: bytes) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    def post(self, data: bytes) -> bytes:
        self.sock.sendall(data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("connection closed")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answer: {head[:200]!r}")
        length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("connection closed")
            rest += chunk
        return rest

    def close(self) -> None:
        self.sock.close()


def timed(client: RawClient, data: bytes, requests: int) -> list[float]:
    """Seconds of ``requests`` POSTs, one at a time."""
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        client.post(data)
        latencies.append(time.perf_counter() - started)
    return latencies


def post_json(host: str, port: int, path: str, body: Any) -> Any:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("POST", path, body=orjson.dumps(body), headers=HEADERS)
        return orjson.loads(conn.getresponse().read())
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    row = ROWS[0]
    echo_port, fake_port = free_port(), free_port()
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(echo_port)])
    fake = subprocess.Popen([sys.executable, "-c", FAKE_OPENAI, str(fake_port)])
    wait_for_port(echo_port)
    wait_for_port(fake_port)
    handle = StackHandle.start(stack_config("openai", fake_port), log=lambda name, line: None)
    results: dict[str, Any] = {"load_avg_at_start": os.getloadavg(), "requests": args.requests, "rounds": []}
    try:
        servers = {r.name: r for r in handle.stack.head.registry.all()}
        resources, model, agent = servers["example_single_tool_call"], servers["policy_model"], servers[AGENT]
        procs = {
            "agent": psutil.Process(agent.pid),
            "resources": psutil.Process(resources.pid),
            "model": psutil.Process(model.pid),
            "fake policy (not counted)": psutil.Process(fake.pid),
        }
        # The bodies the agent sends in a rollout, built from real answers.
        params = {**row["responses_create_params"], "model": "m"}
        first = post_json(model.host, model.port, "/v1/responses", params)
        call = first["output"][0]
        tool_out = post_json(
            resources.host, resources.port, f"/{call['name']}", orjson.loads(call["arguments"])
        )
        second_input = params["input"] + first["output"]
        second_input.append(
            {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": orjson.dumps(tool_out).decode(),
            }
        )
        second_params = {**params, "input": second_input}
        second = post_json(model.host, model.port, "/v1/responses", second_params)
        response = {**second, "output": first["output"] + second_input[-1:] + second["output"]}
        hops = {
            "floor: bare uvicorn echo hop": ("127.0.0.1", echo_port, "/echo", orjson.dumps(row)),
            "fake policy alone": ("127.0.0.1", fake_port, "/v1/responses", orjson.dumps(params)),
            "resources /seed_session": (resources.host, resources.port, "/seed_session", orjson.dumps(row)),
            "model /v1/responses, turn 1": (model.host, model.port, "/v1/responses", orjson.dumps(params)),
            f"resources /{call['name']}": (
                resources.host,
                resources.port,
                f"/{call['name']}",
                call["arguments"].encode(),
            ),
            "model /v1/responses, turn 2": (
                model.host,
                model.port,
                "/v1/responses",
                orjson.dumps(second_params),
            ),
            "resources /verify": (
                resources.host,
                resources.port,
                "/verify",
                orjson.dumps({**row, "response": response}),
            ),
        }
        targets = {
            **hops,
            "agent /run (a whole rollout)": (agent.host, agent.port, "/run", orjson.dumps(row)),
        }
        clients = {name: RawClient(host, port) for name, (host, port, _, _) in targets.items()}
        data = {name: clients[name].request_bytes(path, body) for name, (_, _, path, body) in targets.items()}
        for name in targets:  # warm-up
            timed(clients[name], data[name], 50)
        chunk = 50  # every target in turn, chunk by chunk, so all see the same load
        for round_index in range(args.repeats):
            samples: dict[str, list[float]] = {name: [] for name in targets}
            run_cpu = {name: 0.0 for name in procs}
            for _ in range(max(1, args.requests // chunk)):
                for name in targets:
                    if name.startswith("agent"):
                        before = {p: cpu_s(proc) for p, proc in procs.items()}
                    samples[name] += timed(clients[name], data[name], chunk)
                    if name.startswith("agent"):
                        for p, proc in procs.items():
                            run_cpu[p] += cpu_s(proc) - before[p]
            runs = len(samples["agent /run (a whole rollout)"])
            measured = {name: statistics.median(values) * 1000 for name, values in samples.items()}
            cpu = {name: seconds / runs * 1000 for name, seconds in run_cpu.items()}
            results["rounds"].append({"p50_ms": measured, "cpu_ms_per_rollout": cpu})
            print(
                f"round {round_index + 1}: /run p50 {measured['agent /run (a whole rollout)']:.3f} ms",
                flush=True,
            )
        for client in clients.values():
            client.close()
    finally:
        handle.stop()
        for proc in (echo, fake):
            proc.terminate()
            proc.wait()
    results["load_avg_at_end"] = os.getloadavg()

    names = list(results["rounds"][0]["p50_ms"])
    p50 = {n: statistics.median(r["p50_ms"][n] for r in results["rounds"]) for n in names}
    cpu_names = list(results["rounds"][0]["cpu_ms_per_rollout"])
    cpu = {n: statistics.median(r["cpu_ms_per_rollout"][n] for r in results["rounds"]) for n in cpu_names}
    floor = p50["floor: bare uvicorn echo hop"]
    rollout_hops = [n for n in names if n.startswith(("resources", "model"))]
    hop_sum = sum(p50[n] for n in rollout_hops)
    run = p50["agent /run (a whole rollout)"]
    results["median"] = {"p50_ms": p50, "cpu_ms_per_rollout": cpu}
    load = results["load_avg_at_start"][0], results["load_avg_at_end"][0]
    print(
        f"\nconcurrency 1, p50 of {args.requests} requests, median of {args.repeats} rounds; load {load[0]:.1f} → {load[1]:.1f}"
    )
    print("| hop | p50 ms | over the floor hop |")
    print("|---|---|---|")
    for name in names:
        over = "" if name.startswith(("floor", "agent")) else f"{p50[name] - floor:+.3f}"
        print(f"| {name} | {p50[name]:.3f} | {over} |")
    print(f"| the agent's own share (/run − its {len(rollout_hops)} hops) | {run - hop_sum:.3f} | |")
    print(f"| floor of a rollout: 8 bare hops | {8 * floor:.3f} | |")
    print("\nCPU ms per rollout at concurrency 1: " + ", ".join(f"{n} {v:.3f}" for n, v in cpu.items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
