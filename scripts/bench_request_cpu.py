"""One server's CPU per request, here and at other checkouts, measured in interleaved batches.

Starts example_single_tool_call's resources server (a real process on 127.0.0.1, this project's
serving stack: uvicorn, the server gate, the request guard, a direct route) once per checkout
given, then posts ``get_weather`` over ``--connections`` kept-alive connections (each request
through the ``/ng-rollout/<id>`` prefix, as an agent's tool call is sent), ``--requests`` per
batch, the checkouts taking turns batch by batch for ``--rounds`` rounds, so that outside load
falls on all of them alike. A batch's cost is the server process's CPU time from the kernel's
scheduler statistics (``/proc/<pid>/task/*/schedstat``: nanoseconds on a CPU, all threads),
divided by the requests; the driver's CPU is not counted. Prints the median, lowest and first
quartile per checkout.

A checkout is a source tree (``git worktree add DIR COMMIT``) run with this interpreter and
``PYTHONPATH=DIR``; with none given, this checkout alone.

With ``--verify-turns K`` the requests are ``/verify`` of the response of a K-turn rollout (the
long-horizon benchmark's turns: ~2 KB of text, a call and its output each): what a resources
server pays once per rollout at its end.

Usage: python scripts/bench_request_cpu.py [DIR ...] [--rounds 30] [--requests 1000]
       [--connections 8] [--verify-turns K] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SERVER = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, sys.argv[1])
    from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer
    from nemo_gym.serving.gc_tuning import tune_gc_for_serving
    from nemo_gym.serving.sockets import bind_socket
    from nemo_gym.serving.uvicorn_factory import loop_factory

    server = ExampleSingleToolCallServer({"name": "bench", "host": "127.0.0.1", "port": 0})
    sock = bind_socket("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    tune_gc_for_serving()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(server.serve(sock, register=False))
    """
)


def cpu_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` (all its threads) has spent on a CPU."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stats:
                total += int(stats.read().split()[0])
        except OSError:
            continue  # a thread that just ended
    return total


def verify_body(turns: int, bytes_per_turn: int = 2000) -> bytes:
    """A ``/verify`` body ending a rollout of ``turns`` tool-calling turns, shaped as the long-horizon
    benchmark's (``scripts/bench_long_horizon.py``): each turn an assistant message of
    ``bytes_per_turn`` of text, a ``get_weather`` call and its output, then the final answer."""
    output: list[dict[str, Any]] = []
    for turn in range(turns):
        text = [{"type": "output_text", "text": "x" * bytes_per_turn, "annotations": []}]
        output += [
            {
                "type": "message",
                "id": f"msg_{turn}",
                "role": "assistant",
                "status": "completed",
                "content": text,
            },
            {
                "type": "function_call",
                "id": f"fc_{turn}",
                "call_id": f"call_{turn}",
                "name": "get_weather",
                "arguments": '{"city": "San Francisco"}',
                "status": "completed",
            },
            {
                "type": "function_call_output",
                "call_id": f"call_{turn}",
                "output": '{"city": "San Francisco", "weather_description": "The weather in San Francisco is cold."}',
            },
        ]
    answer = [{"type": "output_text", "text": "It is cold.", "annotations": []}]
    output.append(
        {"type": "message", "id": "msg_end", "role": "assistant", "status": "completed", "content": answer}
    )
    response = {
        "id": "resp_bench",
        "object": "response",
        "created_at": 1,
        "model": "bench",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {"input_tokens": 10, "output_tokens": 10, "total_tokens": 20},
    }
    params = {"input": [{"role": "user", "content": f"What is the weather? [turns={turns}]"}], "tools": []}
    return json.dumps({"responses_create_params": params, "response": response}).encode()


async def drive(port: int, requests: int, connections: int, verify_turns: int = 0) -> None:
    """``requests`` tool calls (with ``verify_turns``, ``/verify`` of a rollout that long) over
    ``connections`` kept-alive connections, one at a time on each."""
    body, path = b'{"city": "San Francisco"}', b"get_weather"
    if verify_turns:
        body, path = verify_body(verify_turns), b"verify"
    request = (
        b"POST /ng-rollout/bench-0/%s HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (path, port, len(body), body)
    )

    async def one(count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(count):
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"the server answered {head[:200]!r}")
                at = head.lower().index(b"content-length:")
                await reader.readexactly(int(head[at + 15 : head.index(b"\r\n", at)]))
        finally:
            writer.close()

    await asyncio.gather(*(one(requests // connections) for _ in range(connections)))


def run(coroutine: Any) -> None:
    """Run the driver on uvloop when it is installed (as the servers' callers are)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs="*", type=Path, help="checkouts to compare (default: this one)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--requests", type=int, default=1000, help="per batch")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--verify-turns",
        type=int,
        default=0,
        help="post /verify with the response of a rollout of this many turns instead of get_weather",
    )
    args = parser.parse_args()
    trees = [t.resolve() for t in args.trees] or [ROOT]
    labels = [str(t) for t in trees]
    servers: list[tuple[subprocess.Popen[bytes], int]] = []
    per_request: dict[str, list[float]] = {label: [] for label in labels}
    load_start = os.getloadavg()
    try:
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            env.pop("NEMO_GYM_AUTH_TOKEN", None)
            proc = subprocess.Popen(
                [sys.executable, "-c", SERVER, str(tree)], stdout=subprocess.PIPE, env=env, cwd=tree
            )
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            servers.append((proc, port))
            time.sleep(0.5)
            run(
                drive(port, args.requests if args.verify_turns else 2000, args.connections, args.verify_turns)
            )  # warm-up
        for _ in range(args.rounds):
            for label, (proc, port) in zip(labels, servers, strict=True):
                before = cpu_ns(proc.pid)
                run(drive(port, args.requests, args.connections, args.verify_turns))
                per_request[label].append((cpu_ns(proc.pid) - before) / args.requests / 1000)
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=30)
    load_end = os.getloadavg()
    what = f"/verify of {args.verify_turns} turns" if args.verify_turns else "request"
    print(
        f"server CPU µs per {what}, {args.rounds} interleaved batches of {args.requests} "
        f"({args.connections} connections); load average {load_start[0]:.1f} -> {load_end[0]:.1f}"
    )
    summary = {}
    for label in labels:
        values = sorted(per_request[label])
        summary[label] = {
            "median_us": statistics.median(values),
            "min_us": values[0],
            "q1_us": values[len(values) // 4],
        }
        print(
            f"{label}: median {summary[label]['median_us']:.1f}, lowest {values[0]:.1f}, "
            f"first quartile {summary[label]['q1_us']:.1f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"summary": summary, "batches": per_request, "load_avg": [load_start, load_end]}, indent=2
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
