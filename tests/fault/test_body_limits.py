"""Body limits are enforced while the body is read, on every server including the head server.

Each server runs as a real child process; a 400 MB chunked body is streamed at it over a raw
socket and the child's peak RSS (``VmHWM``) is read from ``/proc`` before and after.
"""

from __future__ import annotations

import select
import socket
import sys
import time

import orjson
import pytest

from nemo_gym.launch.launcher import free_port
from nemo_gym.serving.server import BaseServerConfig
from nemo_gym.testing import SyncClient
from nemo_gym.testing.child_servers import HEAD_SERVER_SCRIPT, peak_rss_kib, start_child_server

MB = 1024 * 1024


@pytest.fixture
def env_server():
    port = free_port()
    config = {"name": "weather", "port": port}
    proc = start_child_server(
        [sys.executable, "resources_servers/example_single_tool_call/app.py"],
        {"NEMO_GYM_SERVER_CONFIG": orjson.dumps(config).decode()},
        port,
    )
    yield proc, port
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def head_server():
    port = free_port()
    proc = start_child_server([sys.executable, "-c", HEAD_SERVER_SCRIPT, str(port)], {}, port)
    yield proc, port
    proc.terminate()
    proc.wait(10)


def stream_chunked(port: int, path: str, total_bytes: int) -> tuple[int, bytes, int]:
    """POST ``total_bytes`` of chunked body, stopping as soon as the server answers.

    Returns (status, response body, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
    )
    chunk = b'{"pad": "' + b"x" * (MB - 12) + b'"}'
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    answer = b""
    try:
        while sent < total_bytes:
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered early
            sock.sendall(framed)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < 20:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    except ConnectionResetError:
        pass
    sock.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head else 0
    return status, body, sent


def test_default_limit_is_counted_while_reading():
    assert BaseServerConfig().max_body_bytes <= 64 * MB


@pytest.mark.slow
def test_400mb_chunked_body_is_refused_without_growing_the_server(env_server):
    proc, port = env_server
    before = peak_rss_kib(proc.pid) / 1024
    status, body, sent = stream_chunked(port, "/verify", 400 * MB)
    after = peak_rss_kib(proc.pid) / 1024
    assert status == 413 and b"exceeds the limit" in body, (status, body[:200])
    assert sent < 200 * MB, sent  # refused early, not after the whole body
    # Bounded by the limit (64 MB) plus the parser's buffers, not by the 400 MB sent.
    assert after - before < 100, (before, after)
    with SyncClient() as client:
        assert client.get(f"http://127.0.0.1:{port}/")[0] == 200


def test_declared_oversized_body_is_refused_before_reading(env_server):
    _, port = env_server
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 419430400\r\n\r\n"
    )
    started = time.monotonic()
    answer = sock.recv(65536)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert time.monotonic() - started < 5


@pytest.mark.slow
def test_head_server_refuses_a_400mb_registration(head_server):
    proc, port = head_server
    before = peak_rss_kib(proc.pid) / 1024
    status, body, sent = stream_chunked(port, "/register", 400 * MB)
    after = peak_rss_kib(proc.pid) / 1024
    assert status == 413 and b"exceeds the limit" in body, (status, body[:200])
    assert sent < 64 * MB
    assert after - before < 20, (before, after)
    with SyncClient() as client:
        assert client.get(f"http://127.0.0.1:{port}/")[0] == 200
