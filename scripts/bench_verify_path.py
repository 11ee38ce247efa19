"""CPU per ``/verify`` handler call on our lean path: validate the body, verify, serialize.

Runs ``example_single_tool_call``'s verify in-process (no HTTP), as its endpoint does, on a
typical body (a function call and an answer), and prints microseconds of CPU per verify. Run it
from two checkouts (``PYTHONPATH=<tree>``) to compare the server base before and after a change.

``--typed`` times instead the request models as a NeMo Gym-style verify route uses them
(typed ``response``/``responses_create_params``): validate a ``BaseVerifyRequest``, build
``BaseVerifyResponse(**body.model_dump(), reward=1.0)``, dump it as JSON.

Usage: python scripts/bench_verify_path.py [--n 20000] [--typed]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym.serving.request_context import plain_bodies_in_effect
from nemo_gym.serving.server import dumps
from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer

BODY = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "weather in SF?"}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    },
    "response": {
        "id": "r",
        "created_at": 0,
        "model": "m",
        "object": "response",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": [
            {
                "type": "function_call",
                "id": "fc",
                "call_id": "c",
                "name": "get_weather",
                "arguments": '{"city": "SF"}',
            },
            {
                "type": "message",
                "id": "m",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "cold", "annotations": []}],
            },
        ],
    },
}


async def per_verify_us(n: int) -> float:
    """Mean CPU microseconds of one verify (validate, verify, serialize) over ``n`` calls."""
    server = ExampleSingleToolCallServer(config={"name": "bench"})
    plain_bodies_in_effect.set(server.plain_bodies)
    for _ in range(500):
        dumps(await server._verify_and_free(dict(BODY)))
    start = time.process_time()
    for _ in range(n):
        dumps(await server._verify_and_free(dict(BODY)))
    return (time.process_time() - start) / n * 1e6


def per_typed_verify_us(n: int) -> float:
    """Mean CPU microseconds of the typed models' share of one NeMo Gym-style verify."""

    def once() -> None:
        body = BaseVerifyRequest.model_validate(BODY)
        BaseVerifyResponse(**body.model_dump(), reward=1.0).model_dump_json()

    for _ in range(500):
        once()
    start = time.process_time()
    for _ in range(n):
        once()
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    """Print CPU µs per verify."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--typed", action="store_true", help="the typed request models instead")
    args = parser.parse_args()
    if args.typed:
        print(
            f"typed BaseVerifyRequest -> BaseVerifyResponse -> JSON: {per_typed_verify_us(args.n):.1f} us CPU"
        )
        return
    print(
        f"example_single_tool_call /verify handler: {asyncio.run(per_verify_us(args.n)):.1f} us CPU per verify"
        f" (openai imported: {'yes' if 'openai' in sys.modules else 'no'})"
    )


if __name__ == "__main__":
    main()
