"""One model server's CPU per turn of a long rollout, alone: openai_model in front of an instant policy.

The model server of ``scripts/bench_long_horizon.py``'s stack, without the agent, the resources
server or the collector: ``openai_model`` (run with ``PYTHONPATH=TREE`` for each ``TREE`` given,
so two checkouts compare) in front of that script's instant policy. Client threads (``--threads``,
each on one kept-alive connection) drive rollouts of ``--turns`` tool calls the way
simple_agent's ``ModelConversation`` does: the whole history on the first two calls, then
``store: true`` and, once the server kept it, ``previous_response_id`` with only the new items,
and a ``DELETE`` of the kept conversation at the end. Measured: the model server's CPU (user and
system, from the kernel) per model call over ``--rollouts`` rollouts after a warm-up, and with
``--calls`` the Python calls per model call (cProfile on the server's thread, CPU-time clock:
the count is what is compared, the profiled time is inflated). Trees take turns ``--repeats``
times.

Usage: python scripts/bench_model_turn.py TREE [TREE ...] [--turns 96] [--rollouts 32]
       [--threads 4] [--repeats 3] [--calls]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import pstats
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psutil

from nemo_gym.launch.launcher import free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent

SERVER = """
import cProfile, sys, threading, time, uvloop, asyncio
from nemo_gym.serving.gc_tuning import tune_gc_for_serving
from nemo_gym.serving.sockets import bind_socket
from responses_api_models.openai_model.app import OpenAIModel
server = OpenAIModel({"name": "policy_model", "openai_base_url": sys.argv[1], "openai_model": "m"})
tune_gc_for_serving()
sock = bind_socket("127.0.0.1", 0)
print(sock.getsockname()[1], flush=True)
loop = uvloop.new_event_loop()
asyncio.set_event_loop(loop)
profile = cProfile.Profile(time.process_time)
def control():
    for line in sys.stdin:
        command = line.split()
        if command[0] == "start":
            loop.call_soon_threadsafe(profile.enable)
        elif command[0] == "stop":
            done = threading.Event()
            loop.call_soon_threadsafe(lambda: (profile.disable(), done.set()))
            done.wait()
            profile.dump_stats(command[1])
            print("stopped", flush=True)
    uv = getattr(server, "uvicorn_server", None)
    if uv is not None:
        uv.should_exit = True
threading.Thread(target=control, daemon=True).start()
loop.run_until_complete(server.serve(sock, register=False, embedded=True))
"""

TOOL_OUTPUT = '{"city": "San Francisco", "temperature_c": 14, "conditions": "cloudy"}'


def post(sock: socket.socket, method: str, path: str, body: Any) -> tuple[dict[str, str], Any]:
    """One request on a kept-alive connection; the answer's headers and parsed body (200 only)."""
    data = orjson.dumps(body) if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    sock.sendall(f"{head}content-length: {len(data)}\r\n\r\n".encode() + data)
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(1 << 20)
    raw_head, _, rest = buffer.partition(b"\r\n\r\n")
    lines = raw_head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(rest) < int(headers["content-length"]):
        rest += sock.recv(1 << 20)
    if lines[0].split()[1] != "200":
        raise RuntimeError(f"{method} {path}: {lines[0]}: {rest[:300]!r}")
    return headers, orjson.loads(rest)


def rollout(sock: socket.socket, row: dict[str, Any], turns: int, rollout_id: str) -> int:
    """One rollout as simple_agent's ModelConversation makes its calls; the model calls made."""
    base = f"/ng-rollout/{rollout_id}/v1/responses"
    items = [dict(item) for item in row["input"]]
    items[-1]["content"] += f" [turns={turns}]"
    params = {"model": "m", "tools": row["tools"]}
    calls, kept, kept_count = 0, None, 0
    while True:
        calls += 1
        if calls < 3:
            body = {**params, "input": items}
        elif kept is not None:
            body = {**params, "input": items[kept_count:], "previous_response_id": kept, "store": True}
        else:
            body = {**params, "input": items, "store": True}
        headers, answer = post(sock, "POST", base, body)
        output = answer["output"]
        if calls >= 3 and headers.get("x-nemo-gym-conversation") == "kept":
            kept, kept_count = answer["id"], len(items) + len(output)
        items = items + output
        tool_calls = [item for item in output if item["type"] == "function_call"]
        if not tool_calls:
            break
        items = items + [
            {"type": "function_call_output", "call_id": tool_calls[0]["call_id"], "output": TOOL_OUTPUT}
        ]
    if kept is not None:
        post(sock, "DELETE", f"{base}/{kept}", None)
    return calls


def run_workers(worker: Callable[[int], None], rollouts: int, threads: int) -> None:
    """``worker(rollouts // threads)`` on each of ``threads`` threads at once; back when all are."""
    started = [threading.Thread(target=worker, args=(rollouts // threads,)) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()


def profiled_calls(process: subprocess.Popen[bytes], profile_to: str) -> int:
    """Stop the profile a measured process runs on demand (a ``stop PATH`` line on its stdin; it
    answers a line when the file is written) and count the Python calls it holds."""
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(f"stop {profile_to}\n".encode())
    process.stdin.flush()
    process.stdout.readline()
    stats = pstats.Stats(profile_to)
    return sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]


def measure(tree: str, policy_url: str, args: argparse.Namespace, profile_to: str | None) -> dict[str, float]:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, policy_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": tree},
        cwd=tree,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        port = int(server.stdout.readline())
        row = orjson.loads(
            (ROOT / "resources_servers/example_single_tool_call/data/example.jsonl")
            .read_bytes()
            .split(b"\n")[0]
        )
        row = row["responses_create_params"]
        ids = itertools.count()
        made: list[int] = []

        def worker(count: int) -> None:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                made.append(
                    sum(rollout(sock, row, args.turns, f"t{next(ids)}-r0-a0-b") for _ in range(count))
                )

        worker(2)  # warm-up
        made.clear()
        if profile_to:
            server.stdin.write(b"start\n")
            server.stdin.flush()
            time.sleep(0.2)
        process = psutil.Process(server.pid)
        before = process.cpu_times()
        run_workers(worker, args.rollouts, args.threads)
        after = process.cpu_times()
        calls = sum(made)
        result = {
            "model_calls": calls,
            "cpu_us_per_call": 1e6 * (after.user + after.system - before.user - before.system) / calls,
            "user_us_per_call": 1e6 * (after.user - before.user) / calls,
            "system_us_per_call": 1e6 * (after.system - before.system) / calls,
            "load": os.getloadavg()[0],
        }
        if profile_to:
            result["python_calls_per_call"] = profiled_calls(server, profile_to) / calls
        return result
    finally:
        server.stdin.close()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--turns", type=int, default=96)
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bytes-per-turn", type=int, default=2000)
    parser.add_argument(
        "--calls", action="store_true", help="also count Python calls per model call (cProfile)"
    )
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location(
        "bench_long_horizon", ROOT / "scripts/bench_long_horizon.py"
    )
    assert spec is not None and spec.loader is not None
    long_horizon = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(long_horizon)
    port = free_port()
    policy = subprocess.Popen(
        [sys.executable, "-c", long_horizon.POLICY_SERVER, str(port), str(args.bytes_per_turn)]
    )
    try:
        wait_for_port(port)
        with tempfile.TemporaryDirectory() as tmp:
            for repeat in range(args.repeats):
                for number, tree in enumerate(args.trees):
                    profile_to = f"{tmp}/{number}.prof" if args.calls else None
                    result = measure(os.path.abspath(tree), f"http://127.0.0.1:{port}/v1", args, profile_to)
                    calls = f", {result['python_calls_per_call']:.0f} Python calls" if args.calls else ""
                    print(
                        f"round {repeat + 1} {tree}: {result['cpu_us_per_call']:.0f} us CPU per model call "
                        f"(user {result['user_us_per_call']:.0f}, system {result['system_us_per_call']:.0f})"
                        f"{calls}, {result['model_calls']} calls, load {result['load']:.1f}",
                        flush=True,
                    )
    finally:
        policy.terminate()
        policy.wait()


if __name__ == "__main__":
    main()
