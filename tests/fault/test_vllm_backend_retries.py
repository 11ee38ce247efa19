"""vllm_model retries a backend's 429 and 5xx with bounded, jittered backoff; other 4xx never.

The backend is a real HTTP server on 127.0.0.1 that fails the first N calls with the status
(and ``Retry-After``) the test picks, then answers a good chat completion.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.testing import SyncClient, running_app, running_server
from responses_api_models.vllm_model.app import VLLMModel

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Fine."}}],
}
REQUEST = {"input": [{"role": "user", "content": "How are you?"}]}


class FailingBackend:
    """Fails the next ``failures`` calls with ``status`` (and ``headers``), then answers well."""

    def __init__(self) -> None:
        self.failures = 0
        self.status = 503
        self.headers: dict[str, str] = {}
        self.calls: list[float] = []

    def arm(self, failures: int, status: int, headers: dict[str, str] | None = None) -> None:
        self.failures, self.status, self.headers, self.calls = failures, status, headers or {}, []

    def app(self) -> Any:
        async def chat(request: Request) -> Response:
            await request.body()
            self.calls.append(time.monotonic())
            if len(self.calls) <= self.failures:
                error = {"error": {"message": f"failure {len(self.calls)}", "type": "x", "code": self.status}}
                return Response(
                    orjson.dumps(error), self.status, headers=self.headers, media_type="application/json"
                )
            return Response(orjson.dumps(COMPLETION), media_type="application/json")

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[FailingBackend, str]]:
    backend = FailingBackend()
    with running_app(backend.app()) as backend_url:
        model = VLLMModel(
            {
                "name": "vllm",
                "base_url": backend_url + "/v1",
                "model": "m",
                "max_retries": 3,
                "max_retry_delay_s": 0.5,
            }
        )
        with running_server(model) as url:
            yield backend, url


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_a_429_or_5xx_is_retried_until_the_backend_answers(stack, status: int) -> None:
    backend, url = stack
    backend.arm(failures=2, status=status)
    with SyncClient(timeout_s=30) as client:
        code, answer = client.post(url + "/v1/responses", REQUEST)
    assert code == 200, answer
    assert answer["output"][0]["content"][0]["text"] == "Fine."
    assert len(backend.calls) == 3
    # Backoff: waits from 0.1 s (x0.5-1.5 jitter), doubling, so the attempts are spread out.
    gaps = [later - earlier for earlier, later in zip(backend.calls, backend.calls[1:], strict=False)]
    assert gaps[0] >= 0.04 and gaps[1] >= 0.09, gaps


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_are_not_retried(stack, status: int) -> None:
    backend, url = stack
    backend.arm(failures=5, status=status)
    with SyncClient(timeout_s=30) as client:
        code, answer = client.post(
            url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}
        )
    assert code == status and "failure 1" in answer["error"]["message"]
    assert len(backend.calls) == 1


def test_retries_are_bounded_and_the_failure_classified(stack) -> None:
    backend, url = stack
    backend.arm(failures=100, status=503)
    with SyncClient(timeout_s=30) as client:
        code, answer = client.post(url + "/v1/responses", REQUEST)
    assert len(backend.calls) == 4  # the first try and max_retries=3
    assert code == 502 and answer["failure_class"] == "upstream_5xx", answer
    assert "HTTP 503 after 4 attempts: failure 4" in answer["error"]["message"]


def test_retry_after_is_honoured_within_the_cap(stack) -> None:
    backend, url = stack
    backend.arm(failures=1, status=429, headers={"Retry-After": "0.3"})
    with SyncClient(timeout_s=30) as client:
        code, _ = client.post(url + "/v1/responses", REQUEST)
    assert code == 200 and len(backend.calls) == 2
    assert backend.calls[1] - backend.calls[0] >= 0.29
    # A Retry-After beyond max_retry_delay_s (0.5 s here) is cut to the cap, not obeyed.
    backend.arm(failures=1, status=503, headers={"Retry-After": "120"})
    started = time.monotonic()
    with SyncClient(timeout_s=30) as client:
        code, _ = client.post(url + "/v1/responses", REQUEST)
    assert code == 200 and len(backend.calls) == 2
    assert 0.45 <= backend.calls[1] - backend.calls[0] and time.monotonic() - started < 5
