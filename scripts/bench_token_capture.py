"""What NeMo Gym's training-token capture costs the model server per call, as a rollout grows.

Simulates one rollout of N tool turns on the file store (real files, fsync): for each call, the
parent resolution the server runs before dispatch (FileLineageStore over the store) and the
capture after it (build, stamp, fsynced put), with ``--tokens-per-turn`` new prompt tokens and
``--gen`` generated tokens per turn. Prints the per-call milliseconds at a few turn numbers and
the medians of the first and second half, so growth with the conversation's length is visible.

    python scripts/bench_token_capture.py --turns 100
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

from nemo_gym.token_id_capture import (
    CaptureContext,
    FileLineageStore,
    TokenCaptureStore,
    reset_token_sink,
    set_token_sink,
)
from nemo_gym.token_id_capture.sink import capture_tokens, resolve_parent


async def rollout(
    turns: int, per_turn: int, gen: int, root: str, rollout_id: str, delta: bool
) -> list[float]:
    store, lineage = TokenCaptureStore(root), FileLineageStore(root)
    history: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    tokens: list[int] = []
    costs = []
    for turn in range(turns):
        prompt = tokens + list(range(1000 + turn * per_turn, 1000 + (turn + 1) * per_turn))
        generated = list(range(5, 5 + gen))
        call = {"type": "function_call", "call_id": f"c{turn}", "name": "f", "arguments": f'{{"i": {turn}}}'}
        answer = {"id": f"r{turn}", "output": [{**call, "prompt_token_ids": prompt, "generation_token_ids": generated, "generation_log_probs": [-0.1] * gen}]}  # fmt: skip
        context = CaptureContext(
            rollout_id=rollout_id,
            model_call_id=f"m{turn}",
            token_sink=store,
            lineage_store=lineage,
            delta_records=delta,
        )
        token = set_token_sink(context)
        started = time.perf_counter()
        await resolve_parent(history)
        await capture_tokens(answer, request_messages=history)
        costs.append((time.perf_counter() - started) * 1000)
        reset_token_sink(token)
        assert context.committed and (turn == 0 or context.parent_call_id == f"m{turn - 1}"), (
            "the chain broke"
        )
        history += [call, {"type": "function_call_output", "call_id": f"c{turn}", "output": "ok"}]
        tokens = prompt + generated
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--tokens-per-turn", type=int, default=200)
    parser.add_argument("--gen", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delta-records", action="store_true", help="store continuations as prompt suffixes")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            runs.append(
                asyncio.run(
                    rollout(
                        args.turns,
                        args.tokens_per_turn,
                        args.gen,
                        root,
                        f"bench-{repeat}",
                        args.delta_records,
                    )
                )
            )
    per_turn = [statistics.median(run[i] for run in runs) for i in range(args.turns)]
    for turn in sorted({1, 10, 50, args.turns} & set(range(1, args.turns + 1))):
        length = turn * (args.tokens_per_turn + args.gen)
        print(f"turn {turn:4d} (~{length:6d} tokens): {per_turn[turn - 1]:7.2f} ms per call")
    half = len(per_turn) // 2
    first, second = statistics.median(per_turn[1:half]), statistics.median(per_turn[half:])
    print(f"median per call: turns 2-{half} {first:.2f} ms, turns {half + 1}-{len(per_turn)} {second:.2f} ms")


if __name__ == "__main__":
    main()
