"""A handler whose caller hung up is cancelled, from the connection's own "gone" future."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer, tool
from nemo_gym.testing import running_server


class SlowServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    def model_post_init(self, context: object) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()

    @tool
    async def wait(self, body: dict) -> dict:
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return {}


def test_a_handler_is_cancelled_when_its_caller_hangs_up() -> None:
    server = SlowServer({"name": "slow"})
    with running_server(server) as url:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(
            b"POST /wait HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        )
        assert server.started.wait(10)
        started = time.monotonic()
        sock.close()
        assert server.cancelled.wait(10), "the handler kept running after its caller hung up"
        assert time.monotonic() - started < 5
