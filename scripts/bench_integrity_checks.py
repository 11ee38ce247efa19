"""What the integrity checks of #34 cost: per hop, per new connection, per harness start, per line.

Prints (medians over interleaved rounds):

- ``SO_PEERCRED``: one ``getsockopt`` on a connected Unix socket (the check a client makes on
  every new Unix connection before it sends a byte) and :func:`check_unix_peer` around it;
- a new Unix connection through the hop client to a uvicorn echo server in another process,
  connect + one request, with the check and with it skipped (``--skip-check`` rounds patch it
  out), and one request on a kept-alive connection (no check at all: the hop's cost);
- a harness program start (``true`` through harness_agent's ``run_confined``), bare and with the
  stack's socket directories and the workdir root hidden by mounts;
- :func:`redact_text` on a 200-character log line with and without a credential in it.

Usage: python scripts/bench_integrity_checks.py [--rounds 5] [--requests 400] [--starts 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ECHO = """
import asyncio, os, socket, sys
from nemo_gym.serving.server import make_uvicorn_server

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

path = sys.argv[1]
sock = socket.socket(socket.AF_UNIX)
sock.bind(path)
sock.listen(1024)
print("ready", flush=True)
asyncio.run(make_uvicorn_server(app, embedded=True).serve(sockets=[sock]))
"""


def per_call_us(fn: Any, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def peercred(rounds: int) -> dict[str, float]:
    from nemo_gym.serving.hop_client import check_unix_peer

    a, b = socket.socketpair(socket.AF_UNIX)
    pid = os.getpid()
    raw, checked = [], []
    for _ in range(rounds):
        raw.append(per_call_us(lambda: a.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12), 20000))
        checked.append(per_call_us(lambda: check_unix_peer(a, "x", pid), 20000))
    a.close()
    b.close()
    return {"getsockopt_us": statistics.median(raw), "check_unix_peer_us": statistics.median(checked)}


async def hop_rounds(path: str, pid: int, rounds: int, requests: int) -> dict[str, float]:
    from nemo_gym.serving import hop_client

    real_check = hop_client.check_unix_peer
    headers = hop_client.encode_headers([])
    results: dict[str, list[float]] = {
        "new_conn_checked_us": [],
        "new_conn_unchecked_us": [],
        "pooled_us": [],
    }

    async def one(pool: hop_client.HopPool, fresh: bool) -> None:
        loop = asyncio.get_running_loop()
        conn = await pool.acquire("127.0.0.1", 1, loop.time() + 10, None, fresh, path, pid)
        answer = await conn.send(
            hop_client.build_request("GET", "127.0.0.1", 1, "/", headers, None),
            loop.time() + 10,
            1 << 20,
            False,
        )
        assert answer.status == 200
        if fresh:
            conn._close()
        else:
            pool.release(conn)

    for _ in range(rounds):
        for key, check in (("new_conn_checked_us", real_check), ("new_conn_unchecked_us", lambda *a: None)):
            hop_client.check_unix_peer = check  # type: ignore[assignment]
            pool = hop_client.HopPool(64)
            started = time.perf_counter()
            for _ in range(requests):
                await one(pool, fresh=True)
            results[key].append((time.perf_counter() - started) / requests * 1e6)
            pool.close()
        hop_client.check_unix_peer = real_check
        pool = hop_client.HopPool(64)
        await one(pool, fresh=False)
        started = time.perf_counter()
        for _ in range(requests):
            await one(pool, fresh=False)
        results["pooled_us"].append((time.perf_counter() - started) / requests * 1e6)
        pool.close()
    return {key: statistics.median(values) for key, values in results.items()}


async def harness_starts(starts: int, rounds: int) -> dict[str, Any]:
    from nemo_gym.serving import local_socket
    from responses_api_agents.harness_agent.confine import can_mount, confinement, run_confined

    prefix, how = confinement()
    root = tempfile.mkdtemp(prefix="bench_harness_")
    limits = dict(
        wall_time_s=30,
        cpu_time_s=10,
        memory_bytes=1 << 30,
        file_size_bytes=1 << 24,
        open_files=64,
        max_output_bytes=4096,
        stderr_bytes=4096,
    )
    out: dict[str, list[float]] = {"bare_ms": [], "hidden_ms": []}
    for _ in range(rounds):
        for key, hide in (("bare_ms", False), ("hidden_ms", True)):
            work = tempfile.mkdtemp(dir=root)
            started = time.perf_counter()
            for _ in range(starts):
                extra: dict[str, Any] = (
                    {"hide": local_socket.socket_dirs(), "private_root": root} if hide else {}
                )
                result = await run_confined(
                    ["true"], cwd=work, env={"PATH": "/usr/bin:/bin"}, **limits, **extra
                )
                assert result["status"] == "ok", result
            out[key].append((time.perf_counter() - started) / starts * 1e3)
    return {
        "confinement": how if prefix else "none",
        "mounts": can_mount(),
        **{key: statistics.median(values) for key, values in out.items()},
    }


def redaction(rounds: int) -> dict[str, float]:
    from nemo_gym.serving.secrets import redact_text

    clean = ("POST /v1/responses from agent-7 took 12.5 ms; model=policy tokens=512 status=200 " * 3)[:200]
    dirty = (
        clean[:120] + " url=https://h.example/v1?api-key=abcdef123456 --token xyz hf_abcdefghijklmnopqrstu"
    )
    return {
        "clean_line_us": statistics.median(
            per_call_us(lambda: redact_text(clean), 20000) for _ in range(rounds)
        ),
        "line_with_secrets_us": statistics.median(
            per_call_us(lambda: redact_text(dirty), 20000) for _ in range(rounds)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--starts", type=int, default=20)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("SO_PEERCRED:", {k: round(v, 2) for k, v in peercred(args.rounds).items()})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "echo.sock")
        server = subprocess.Popen(
            [sys.executable, "-c", ECHO, path],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            hops = asyncio.run(hop_rounds(path, server.pid, args.rounds, args.requests))
        finally:
            server.terminate()
            server.wait()
    print(
        "hop client over a Unix socket, client wall time per request:",
        {k: round(v, 1) for k, v in hops.items()},
    )
    starts = asyncio.run(harness_starts(args.starts, args.rounds))
    print(
        "harness program start (true):",
        {k: round(v, 2) if isinstance(v, float) else v for k, v in starts.items()},
    )
    print("redact_text per 200-char line:", {k: round(v, 2) for k, v in redaction(args.rounds).items()})
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
