"""A SIGTERM ends a server even while one of its handlers never returns.

uvicorn waits for requests in flight before it exits; without a bound, a handler that never
returns (a verify waiting for a cohort that will not come, a hung upstream) kept a server alive
after its launcher was gone, port and memory held, for as long as anyone cared to look. A real
server process, a real request that hangs, a real signal.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

SERVER = textwrap.dedent(
    """
    import asyncio, socket, sys
    import nemo_gym.serving.uvicorn_factory as factory
    from nemo_gym.base_resources_server import (
        BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer, tool,
    )

    factory.GRACEFUL_SHUTDOWN_S = int(sys.argv[1])


    class Hang(SimpleResourcesServer):
        config: BaseResourcesServerConfig

        @tool
        async def wait_forever(self, body: dict) -> dict:
            await asyncio.Event().wait()
            return {}

        async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
            return BaseVerifyResponse(**body.model_dump(), reward=1.0)


    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    asyncio.run(Hang({"name": "hang"}).serve(sock, register=False))
    """
)


def test_a_server_with_a_handler_that_never_returns_exits_on_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "hang_server.py"
    script.write_text(SERVER)
    process = subprocess.Popen(
        [sys.executable, str(script), "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        body = b"{}"
        deadline = time.monotonic() + 30
        while True:  # the port is printed before the server listens on it
            try:
                client = socket.create_connection(("127.0.0.1", port), timeout=30)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline and process.poll() is None, "the server never listened"
                time.sleep(0.1)
        with client:
            client.sendall(
                b"POST /wait_forever HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(1.0)  # the handler is now waiting forever
            assert process.poll() is None
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
            took = time.monotonic() - started
            answer = client.recv(4096)
        assert took < 20, f"the server took {took:.1f} s to exit"
        assert code != 0 or took >= 0.9  # it waited its grace period, then stopped the handler
        assert not answer.startswith(b"HTTP/1.1 200"), answer  # the hung request was never answered as done
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
