"""What hostile and slow clients cost a server: peak RSS under a 400 MB body, half-sent requests.

Starts real server processes on 127.0.0.1 (the ``example_single_tool_call`` resources server
with its default config, and a head server) and prints:

- peak RSS (``VmHWM``) before and after streaming a 400 MB chunked body at ``/verify`` and at the
  head's ``/register``, the status answered, and how much was sent before the answer;
- how long ``--half-sent`` connections that never finish their headers stay open;
- the latency of one small request on a kept-alive connection (median of 200).

Usage: python scripts/bench_request_guard.py [--body-mb 400] [--half-sent 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import select
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nemo_gym.launch.launcher import free_port  # noqa: E402
from nemo_gym.testing.child_servers import HEAD_SERVER_SCRIPT, peak_rss_kib, start_child_server  # noqa: E402

MB = 1024 * 1024


def stream_chunked(port: int, path: str, total: int) -> tuple[int, int, float]:
    """(status, bytes sent, seconds) for a chunked body of ``total`` bytes, stopped at the answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    chunk = b"x" * MB
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent, started = 0, time.monotonic()
    try:
        while sent < total and not select.select([sock], [], [], 0)[0]:
            sock.sendall(framed)
            sent += len(chunk)
        if sent >= total:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    answer = b""
    try:
        while b"\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                break
            answer += data
    except OSError:
        pass
    sock.close()
    status = int(answer.split()[1]) if answer.startswith(b"HTTP/") else 0
    return status, sent, time.monotonic() - started


def half_sent(port: int, count: int) -> dict[str, float]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Ty")
        socks.append(sock)
    started = time.monotonic()
    closed_after = []
    for sock in socks:
        sock.settimeout(300)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
        closed_after.append(time.monotonic() - started)
        sock.close()
    return {"connections": count, "all_closed_after_s": round(max(closed_after), 2)}


def latency_ms(port: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for _ in range(200):
        started = time.perf_counter()
        conn.request("POST", "/seed_session", body=b'{"responses_create_params": {}}')
        conn.getresponse().read()
        times.append((time.perf_counter() - started) * 1000)
    conn.close()
    return round(statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body-mb", type=int, default=400)
    parser.add_argument("--half-sent", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}

    port = free_port()
    config = json.dumps({"name": "weather", "port": port})
    env = start_child_server(
        [sys.executable, "resources_servers/example_single_tool_call/app.py"],
        {"NEMO_GYM_SERVER_CONFIG": config},
        port,
    )
    head_port = free_port()
    head = start_child_server([sys.executable, "-c", HEAD_SERVER_SCRIPT, str(head_port)], {}, head_port)
    try:
        for name, proc, target, path in (
            ("resources", env, port, "/verify"),
            ("head", head, head_port, "/register"),
        ):
            before = peak_rss_kib(proc.pid) / 1024
            status, sent, seconds = stream_chunked(target, path, args.body_mb * MB)
            results[f"{name}{path}"] = {
                "status": status,
                "sent_mb": sent // MB,
                "seconds": round(seconds, 2),
                "peak_rss_mb_before": round(before),
                "peak_rss_mb_after": round(peak_rss_kib(proc.pid) / 1024),
            }
        results["half_sent_headers"] = half_sent(port, args.half_sent)
        results["small_request_median_ms"] = latency_ms(port)
    finally:
        for proc in (env, head):
            proc.terminate()
            proc.wait(10)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
