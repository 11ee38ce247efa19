"""A hostile OpenAI-compatible upstream behind ``openai_model``, reached by a real simple_agent.

The upstream is a raw HTTP/1.1 server on 127.0.0.1 (asyncio streams, so it can send what a real
server library would refuse to: a truncated body, garbage, nothing at all). Each fault must end
the rollout as a classified failure (never a reward), within the deadlines, and a rollout the
agent abandoned must stop the model server's retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import SyncClient, running_server
from nemo_gym.testing.raw_http import read_request
from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.openai_model.app import OpenAIModel

GOOD_RESPONSE = orjson.dumps(
    {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "m",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
            }
        ],
    }
)


class HostileUpstream:
    """Answers ``POST /v1/responses`` the way ``mode`` says; counts the requests it got."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests = 0
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, _ = await read_request(reader)
                self.requests += 1
                if not await self.answer(writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(self, writer: asyncio.StreamWriter) -> bool:
        """Write one answer; False closes the connection."""

        def send(status: str, body: bytes, *headers: str, length: int | None = None) -> None:
            lines = [f"HTTP/1.1 {status}", "Content-Type: application/json", *headers]
            lines.append(f"Content-Length: {len(body) if length is None else length}")
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

        mode = self.mode
        if mode == "ok":
            send("200 OK", GOOD_RESPONSE)
        elif mode == "429":
            send("429 Too Many Requests", b'{"error": {"message": "slow down"}}', "Retry-After: 3600")
        elif mode == "500":
            send("500 Internal Server Error", b'{"error": {"message": "boom"}}')
        elif mode == "garbage":
            send("200 OK", b"\x00\xff<html>definitely not json")
        elif mode == "empty_object":
            send("200 OK", b"{}")
        elif mode == "echo_key":
            send("200 OK", b'{"error": {"message": "invalid key sk-hostile-SECRET-123"}}')
        elif mode == "truncated":
            send("200 OK", GOOD_RESPONSE[:40], length=len(GOOD_RESPONSE))
            await writer.drain()
            return False
        elif mode == "slow":
            await asyncio.sleep(30)
            send("200 OK", GOOD_RESPONSE)
        await writer.drain()
        return True


@contextlib.contextmanager
def hostile_upstream() -> Iterator[HostileUpstream]:
    upstream = HostileUpstream()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop: list[asyncio.Event] = []

    async def serve() -> None:
        stop.append(asyncio.Event())
        server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
        upstream.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        started.set()
        await stop[0].wait()
        server.close()
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:  # a slow answer still sleeping
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield upstream
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def stack():
    with hostile_upstream() as upstream:
        settings = {"openai_api_key": "sk-hostile-SECRET-123", "max_retries": 2, "request_timeout_s": 2.0}
        with agent_before(upstream, settings, hop_timeout_s=5) as agent_url:
            yield upstream, agent_url


@contextlib.contextmanager
def agent_before(upstream: Any, model_settings: dict[str, Any], hop_timeout_s: float) -> Iterator[str]:
    """simple_agent + the weather environment + openai_model in front of ``upstream``; the agent's URL."""
    model = OpenAIModel(
        {
            "name": "model",
            "openai_base_url": upstream.url,
            "openai_model": "m",
            "max_retry_delay_s": 0.05,
            **model_settings,
        }
    )
    env = ExampleSingleToolCallServer({"name": "env"})
    with running_server(model) as model_url, running_server(env) as env_url:
        agent = SimpleAgent(
            {
                "name": "agent",
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "model"},
                "hop_timeout_s": hop_timeout_s,
            },
            server_client=ServerClient(static_urls={"env": env_url, "model": model_url}),
        )
        with running_server(agent) as agent_url:
            yield agent_url


ROW = {"responses_create_params": {"input": [{"role": "user", "content": "Weather in Oslo?"}]}}


def run(agent_url: str) -> tuple[int, Any, float]:
    started = time.monotonic()
    with SyncClient(timeout_s=60) as client:
        status, body = client.post(agent_url + "/run", ROW)
    return status, body, time.monotonic() - started


FAULTS = [
    ("429", "rate_limited", 3),  # Retry-After: 3600 capped to max_retry_delay_s; 1 + 2 retries
    ("500", "upstream_5xx", 3),
    ("garbage", "bad_upstream_body", 1),
    ("empty_object", "bad_upstream_body", 1),
    ("truncated", "unreachable", 1),
    ("slow", "timeout", 1),
]


@pytest.mark.parametrize(("mode", "failure_class", "requests"), FAULTS, ids=[f[0] for f in FAULTS])
def test_each_upstream_fault_is_a_classified_failure(stack, mode, failure_class, requests):
    upstream, agent_url = stack
    upstream.mode, upstream.requests = mode, 0
    status, body, elapsed = run(agent_url)
    assert status == 502, body
    assert body["failure_class"] == failure_class, body
    assert "reward" not in body
    assert upstream.requests == requests
    assert elapsed < 10  # bounded by the model server's 2 s deadline, not the 3,600 s Retry-After


def test_an_upstream_echo_of_the_api_key_is_not_passed_on(stack):
    upstream, agent_url = stack
    upstream.mode = "echo_key"
    status, body, _ = run(agent_url)
    assert status == 502 and body["failure_class"] == "bad_upstream_body"
    assert "sk-hostile-SECRET-123" not in orjson.dumps(body).decode()


def test_the_healthy_upstream_scores(stack):
    upstream, agent_url = stack
    upstream.mode = "ok"
    status, body, _ = run(agent_url)
    assert status == 200 and isinstance(body["reward"], float)


def test_an_abandoned_rollout_stops_the_model_servers_retries():
    """The agent's hop deadline passes while openai_model waits out 429s: the agent hangs up, and
    the model server's handler is cancelled instead of retrying for its whole 600 s deadline."""
    with hostile_upstream() as upstream:
        upstream.mode = "429"
        settings = {"max_retries": 10_000, "request_timeout_s": 600.0}
        with agent_before(upstream, settings, hop_timeout_s=0.5) as agent_url:
            status, body, elapsed = run(agent_url)
            assert status == 502 and body["failure_class"] == "timeout", body
            assert elapsed < 5
            time.sleep(0.3)
            after_hangup = upstream.requests
            time.sleep(1.0)
            assert after_hangup > 1  # it was retrying
            assert upstream.requests == after_hangup, "the model server kept retrying for nobody"
