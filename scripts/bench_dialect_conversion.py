"""What the Anthropic Messages and Gemini dialects cost per turn, on top of the Responses path.

Two measurements:

1. **Conversion alone** (in-process): one turn of a conversation of N turns (each a tool call
   and its result) read from the dialect into Responses params, the token-ID memory restored on
   the history, and the answer (300 generated token IDs, a prompt that grows with N) written
   back as the dialect's answer or its stream events, serialized with orjson as the servers do.
   Median microseconds per turn at N = 1, 10, 50, 100, beside the Responses answer's own
   serialization (what the Responses path costs anyway).
2. **Over HTTP**: the same request to ``scripted_model`` on loopback as ``/v1/responses``,
   ``/v1/messages`` and ``:generateContent`` (whole and streamed), median milliseconds per call:
   the difference is the whole dialect's cost, routing and serialization included.

Usage: ``python scripts/bench_dialect_conversion.py [--rounds 200]``. Prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import orjson

from nemo_gym.models.anthropic_messages import (
    messages_request_to_responses_params,
    messages_response_events,
    response_to_messages_response,
)
from nemo_gym.models.gemini_api import (
    gemini_request_to_responses_params,
    gemini_stream_chunks,
    response_to_gemini_response,
)
from nemo_gym.models.token_memory import TokenIdMemory
from nemo_gym.testing import SyncClient, running_server
from responses_api_models.scripted_model.app import ScriptedModel

TOOL = {"name": "run", "description": "Run a command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}  # fmt: skip
GENERATED = 300  # token IDs on an answer


def messages_history(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test in the repository."}]
    for turn in range(turns - 1):
        history.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {turn}: looking at the files."},
            {"type": "tool_use", "id": f"call_{turn}", "name": "run", "input": {"command": f"cat file_{turn}.py"}}]})  # fmt: skip
        history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"call_{turn}", "content": "x = 1\n" * 40}]})  # fmt: skip
    return history


def gemini_history(turns: int) -> list[dict[str, Any]]:
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Fix the failing test."}]}]
    for turn in range(turns - 1):
        contents.append({"role": "model", "parts": [{"text": f"Step {turn}."}, {"functionCall": {
            "id": f"call_{turn}", "name": "run", "args": {"command": f"cat file_{turn}.py"}}}]})  # fmt: skip
        contents.append({"role": "user", "parts": [{"functionResponse": {
            "id": f"call_{turn}", "name": "run", "response": {"output": "x = 1\n" * 40}}}]})  # fmt: skip
    return contents


def answer(turn: int) -> dict[str, Any]:
    return {"id": f"resp_{turn}", "model": "m", "status": "completed",
            "usage": {"input_tokens": 1000, "output_tokens": GENERATED},
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                       {"type": "function_call", "call_id": f"call_{turn}", "name": "run", "arguments": '{"command": "ls"}',
                        "prompt_token_ids": list(range(1000 + 2 * turn * GENERATED)),
                        "generation_token_ids": list(range(GENERATED)),
                        "generation_log_probs": [-0.5] * GENERATED}]}  # fmt: skip


def median_us(fn: Any, rounds: int) -> tuple[float, float]:
    """(median, minimum) microseconds of ``fn``; the minimum is the figure on a loaded machine."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6, min(times) * 1e6


def conversion_table(rounds: int) -> None:
    print(
        "per turn, median / min us: history turns | Responses answer serialized (baseline) | Messages whole | "
        "Messages stream | Gemini whole | Gemini stream (each: request read, token IDs restored, answer "
        "converted and serialized)"
    )
    for turns in (1, 10, 50, 100):
        memory = TokenIdMemory()
        for turn in range(turns):
            memory.remember("rollout:r", answer(turn))
        body = {"model": "claude-x", "max_tokens": 512, "messages": messages_history(turns), "tools": [TOOL]}
        gbody = {"contents": gemini_history(turns), "tools": [{"functionDeclarations": [
            {"name": "run", "parameters": TOOL["input_schema"]}]}]}  # fmt: skip
        response = answer(turns)

        def messages(stream: bool, body: Any = body, memory: Any = memory, response: Any = response) -> None:
            params = messages_request_to_responses_params(body)
            memory.restore("rollout:r", params["input"])
            message = response_to_messages_response(response, model="claude-x")
            if stream:
                [orjson.dumps(data) for _, data in messages_response_events(message)]
            else:
                orjson.dumps(message)

        def gemini(stream: bool, body: Any = gbody, memory: Any = memory, response: Any = response) -> None:
            params = gemini_request_to_responses_params(body)
            memory.restore("rollout:r", params["input"])
            result = response_to_gemini_response(response, model="g")
            if stream:
                [orjson.dumps(chunk) for chunk in gemini_stream_chunks(result)]
            else:
                orjson.dumps(result)

        def responses_only(response: Any = response) -> None:
            orjson.dumps(response)

        cells = [median_us(responses_only, rounds)]
        cells += [median_us(lambda s=s: messages(s), rounds) for s in (False, True)]
        cells += [median_us(lambda s=s: gemini(s), rounds) for s in (False, True)]
        print(f"{turns:>4} | " + " | ".join(f"{median:7.1f} / {low:7.1f}" for median, low in cells))


def http_table(rounds: int) -> None:
    scripts = [{"turns": [{"text": "Done: the test passes now."}]}]
    with (
        running_server(ScriptedModel({"name": "scripted", "scripts": scripts})) as url,
        SyncClient() as client,
    ):
        history = messages_history(10)
        routes = {
            "/v1/responses": {"model": "m", "input": messages_request_to_responses_params({"messages": history})["input"]},
            "/v1/responses stream": {
                "model": "m",
                "input": messages_request_to_responses_params({"messages": history})["input"],
                "stream": True,
            },
            "/v1/messages": {"model": "claude-x", "max_tokens": 512, "messages": history},
            "/v1/messages stream": {"model": "claude-x", "max_tokens": 512, "messages": history, "stream": True},
            "/v1beta/models/g:generateContent": {"contents": gemini_history(10)},
            "/v1beta/models/g:streamGenerateContent": {"contents": gemini_history(10)},
        }  # fmt: skip
        print("over HTTP to scripted_model, a 10-turn history (median / min ms per call):")
        for label, body in routes.items():
            path = label.removesuffix(" stream")
            for _ in range(20):
                status, _ = client.post(url + path, body)
                assert status == 200, (label, status)
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                client.post(url + path, body)
                times.append(time.perf_counter() - start)
            print(f"  {label:<42} {statistics.median(times) * 1e3:6.3f} / {min(times) * 1e3:6.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    conversion_table(args.rounds)
    http_table(args.rounds)


if __name__ == "__main__":
    main()
