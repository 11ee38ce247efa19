"""JSONAnswer (nemo_gym/serving/error_answers.py) is what starlette's general Response gives for
the same JSON bytes: its attributes, headers and bytes on the wire."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.responses import Response

from nemo_gym.serving.error_answers import JSONAnswer


async def _sent(response: Response) -> list[Any]:
    messages: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        messages.append(message)

    await response({"type": "http", "method": "POST"}, receive, send)
    return messages


@pytest.mark.parametrize("status", [200, 201, 204, 304, 404, 500, 101])
def test_a_json_answer_is_starlettes_response_of_the_same_bytes(status: int) -> None:
    body = b'{"a": 1}' if status not in (204, 304) else b""
    ours, theirs = JSONAnswer(body, status), Response(body, status, media_type="application/json")
    for name in ("status_code", "media_type", "background", "body", "raw_headers", "charset"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert asyncio.run(_sent(ours)) == asyncio.run(_sent(theirs))
