"""Time to first event of ``stream=true`` on the model servers, against the time of the whole answer.

Servers run in this process on 127.0.0.1 (as the tests run them):

- ``local_hf_model`` (the CPU engine with the tiny model, ``--tokens`` tokens, greedy,
  ``ignore_eos``): Chat Completions and Responses;
- ``vllm_model`` in front of that engine: Responses (converted live) and Chat (passed through);
- ``openai_model`` in front of a fake upstream that sends ``--upstream-events`` Responses events
  ``--gap-ms`` apart.

For each: the time from sending the request to the first text delta, to the engine's end of
generation (or the upstream's last event), and to the last event; and the same request without
streaming (what the first event cost before streaming was live: the events were built from the
finished answer). Also the CPU time of this process (servers, engine and client all run in it)
for the streamed call and for the whole one: steadier than wall time on a shared machine.
Medians of ``--repeats``. Times are wall-clock on whatever machine this runs on: compare the
columns of one run, not runs on different days.

Usage: python scripts/bench_time_to_first_event.py [--tokens 200] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nemo_gym.testing import running_app, running_server  # noqa: E402
from responses_api_models.local_hf_model.app import LocalHFModel  # noqa: E402
from responses_api_models.openai_model.app import OpenAIModel  # noqa: E402
from responses_api_models.vllm_model.app import VLLMModel  # noqa: E402

TEXT_DELTAS = {"response.output_text.delta"}


class PacedUpstream:
    """A Responses endpoint that streams ``events`` text deltas ``gap_s`` apart."""

    def __init__(self, events: int, gap_s: float) -> None:
        self.events, self.gap_s = events, gap_s
        self.last_event_at = 0.0

    def app(self) -> Starlette:
        async def responses(request: Request) -> StreamingResponse:
            body = orjson.loads(await request.body())
            where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
            item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed"}
            text = "".join(f"word{n} " for n in range(self.events))
            done = {**item, "content": [{"type": "output_text", "text": text, "annotations": []}]}
            response = {
                "id": "resp_1",
                "object": "response",
                "created_at": 1.0,
                "model": "m",
                "output": [done],
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "status": "completed",
            }
            events: list[dict[str, Any]] = [
                {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
                {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
                *(
                    {"type": "response.output_text.delta", **where, "delta": f"word{n} ", "logprobs": []}
                    for n in range(self.events)
                ),
                {"type": "response.output_item.done", "output_index": 0, "item": done},
                {"type": "response.completed", "response": response},
            ]
            stream = body.get("stream") is True

            async def paced() -> AsyncIterator[bytes]:
                for number, event in enumerate(events):
                    if number:
                        await asyncio.sleep(self.gap_s)
                    if number == len(events) - 1:
                        self.last_event_at = time.monotonic()
                    yield (
                        f"event: {event['type']}\n".encode()
                        + b"data: "
                        + orjson.dumps({**event, "sequence_number": number})
                        + b"\n\n"
                    )

            if stream:
                return StreamingResponse(paced(), media_type="text/event-stream")
            await asyncio.sleep(self.gap_s * (len(events) - 1))
            self.last_event_at = time.monotonic()
            return StreamingResponse(iter([orjson.dumps(response)]), media_type="application/json")

        return Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])


def measure(client: openai.OpenAI, api: str, params: dict[str, Any], end_of: Any) -> dict[str, float]:
    """One streamed call and one whole call; times in ms from sending each request."""
    started = time.monotonic()
    cpu_started = time.process_time()
    first = last = None
    if api == "chat":
        stream: Any = client.chat.completions.create(**params, stream=True)
        for chunk in stream:
            last = time.monotonic()
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = last
    else:
        for event in client.responses.create(**params, stream=True):
            last = time.monotonic()
            if first is None and event.type in TEXT_DELTAS:
                first = last
    produced = end_of()
    stream_cpu = time.process_time() - cpu_started
    assert first is not None and last is not None
    whole_started = time.monotonic()
    cpu_started = time.process_time()
    if api == "chat":
        client.chat.completions.create(**params)
    else:
        client.responses.create(**params)
    whole = time.monotonic() - whole_started
    whole_cpu = time.process_time() - cpu_started
    return {
        "first_text_event_ms": 1000 * (first - started),
        "generation_end_ms": 1000 * (produced - started),
        "last_event_ms": 1000 * (last - started),
        "whole_answer_ms": 1000 * whole,
        "stream_cpu_ms": 1000 * stream_cpu,
        "whole_cpu_ms": 1000 * whole_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--upstream-events", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=25.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    engine = LocalHFModel({"name": "engine", "tiny": True, "return_token_id_information": True})
    upstream = PacedUpstream(args.upstream_events, args.gap_ms / 1000)
    chat = {
        "model": "tiny-chatml",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": args.tokens,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    responses = {
        "model": "tiny-chatml",
        "input": "Tell me a long story.",
        "max_output_tokens": args.tokens,
        "temperature": 0,
        "metadata": {"extra_body": '{"ignore_eos": true}'},
    }
    results: dict[str, dict[str, float]] = {}
    with contextlib.ExitStack() as stack:
        engine_url = stack.enter_context(running_server(engine))
        policy = VLLMModel({"name": "policy", "base_url": engine_url + "/v1", "model": "tiny-chatml"})
        policy_url = stack.enter_context(running_server(policy))
        fake = stack.enter_context(running_app(upstream.app()))
        passthrough = OpenAIModel({"name": "openai", "openai_base_url": fake + "/v1", "max_retries": 0})
        openai_url = stack.enter_context(running_server(passthrough))

        def engine_end() -> float:
            assert engine.last_generation_end is not None
            return engine.last_generation_end

        cases = [
            ("local_hf_model chat", engine_url, "chat", chat, engine_end),
            ("local_hf_model responses", engine_url, "responses", responses, engine_end),
            ("vllm_model chat (pass-through)", policy_url, "chat", chat, engine_end),
            ("vllm_model responses (live conversion)", policy_url, "responses", responses, engine_end),
            (
                "openai_model responses (pass-through)",
                openai_url,
                "responses",
                {"model": "m", "input": "x"},
                lambda: upstream.last_event_at,
            ),
        ]
        for name, url, api, params, end_of in cases:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
            measure(client, api, params, end_of)  # warm-up
            runs = [measure(client, api, params, end_of) for _ in range(args.repeats)]
            results[name] = {key: round(statistics.median(run[key] for run in runs), 1) for key in runs[0]}
            print(f"{name:42s} " + "  ".join(f"{key} {value:8.1f}" for key, value in results[name].items()))
    report = {"tokens": args.tokens, "repeats": args.repeats, "cases": results}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
