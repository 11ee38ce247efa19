"""Benchmark: the viewer over a 1,000,000-row collection.

Writes a synthetic collection (``--rows`` rows, ``--repeats`` per task, three agents, a tool call
and an answer per rollout, mixed rewards; 1 row in 100 carries token IDs) unless ``--file`` names
one, then prints:

- the first open (the index is built by one streaming pass and saved as ``<file>.ngindex``);
- a later open (the saved index is loaded): the target is under 5 s;
- each page's answer time over HTTP on loopback, median of ``--tries`` (target under 200 ms);
- a live append of 1,000 rows picked up by the next page load;
- the process's peak RSS.

``python scripts/bench_viewer.py [--rows 1000000] [--keep]``. Targets are printed next to the
numbers; the exit code is 1 when one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import orjson
import psutil

from nemo_gym.serving.server import bind_socket, make_uvicorn_server
from nemo_gym.viewer.app import Viewer, build_app
from nemo_gym.viewer.collection import Collection
from nemo_gym.viewer.index import INDEX_SUFFIX

OPEN_TARGET_S = 5.0
PAGE_TARGET_MS = 200.0


def make_row(i: int, repeats: int, rng: random.Random) -> bytes:
    task, repeat = divmod(i, repeats)
    answer = task * 17 + task % 7
    solved = rng.random() < (task % 10) / 10
    output: list[dict[str, object]] = [
        {"type": "function_call", "name": "python", "arguments": orjson.dumps({"code": f"print({task}*17+{task % 7})"}).decode(),
         "call_id": f"c{i}", "id": f"fc{i}", "status": "completed"},
        {"type": "function_call_output", "call_id": f"c{i}", "output": str(answer)},
        {"type": "message", "role": "assistant", "id": f"m{i}", "status": "completed",
         "content": [{"type": "output_text", "text": f"The answer is {answer if solved else answer + 1}.", "annotations": []}]},
    ]  # fmt: skip
    if i % 100 == 0:  # two model calls with token IDs; call 2's prompt extends call 1's
        first_prompt = [rng.randrange(32000) for _ in range(300)]
        first_gen = [rng.randrange(32000) for _ in range(30)]
        second_prompt = first_prompt + first_gen + [rng.randrange(32000) for _ in range(20)]
        second_gen = [rng.randrange(32000) for _ in range(40)]
        for item, prompt, generation in (
            (output[0], first_prompt, first_gen),
            (output[-1], second_prompt, second_gen),
        ):
            item |= {
                "prompt_token_ids": prompt,
                "generation_token_ids": generation,
                "generation_log_probs": [round(-rng.random() * 3, 4) for _ in generation],
            }
    row = {
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
        "agent_ref": {
            "type": "responses_api_agents",
            "name": ("math_agent", "code_agent", "search_agent")[task % 3],
        },
        "responses_create_params": {
            "input": [
                {
                    "role": "system",
                    "content": "You are a careful solver. Use the python tool to check your work.",
                },
                {
                    "role": "user",
                    "content": f"Task {task}: what is {task} * 17 + {task % 7}? Show your work.",
                },
            ]
        },
        "response": {
            "id": f"resp_{i}",
            "object": "response",
            "status": "completed",
            "model": "policy",
            "output": output,
        },
        "reward": 1.0 if solved else 0.0,
        "expected_answer": str(answer),
    }
    return orjson.dumps(row) + b"\n"


def write_collection(path: Path, rows: int, repeats: int) -> None:
    rng = random.Random(0)
    with path.open("wb") as sink:
        batch = []
        for i in range(rows):
            batch.append(make_row(i, repeats, rng))
            if len(batch) == 10_000:
                sink.write(b"".join(batch))
                batch = []
        sink.write(b"".join(batch))


def page_ms(url: str, tries: int) -> tuple[float, float, int]:
    """(first call, median of the rest, answer size) for a GET of ``url``."""
    times = []
    size = 0
    for _ in range(tries):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as response:
            size = len(response.read())
            assert response.status == 200, url
        times.append((time.perf_counter() - started) * 1000)
    return times[0], statistics.median(times[1:] or times), size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--tries", type=int, default=6)
    parser.add_argument("--file", type=Path, help="an existing collection to open instead of a synthetic one")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic file")
    args = parser.parse_args()
    missed = []
    workdir = Path(tempfile.mkdtemp(prefix="bench_viewer_"))
    path = args.file or workdir / "rollouts.jsonl"
    if args.file is None:
        started = time.perf_counter()
        write_collection(path, args.rows, args.repeats)
        print(
            f"wrote {args.rows:,} rows ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f}s"
        )
    Path(str(path) + INDEX_SUFFIX).unlink(missing_ok=True)
    process = psutil.Process()

    started = time.perf_counter()
    collection = Collection.open(path)
    first = time.perf_counter() - started
    print(
        f"first open (index built and saved): {first:.2f}s  rows={len(collection.index):,}  tasks={len(collection.tasks_by_key):,}"
    )
    del collection
    started = time.perf_counter()
    collection = Collection.open(path)
    opened = time.perf_counter() - started
    assert collection.index.loaded_rows == len(collection.index)
    print(f"open with its saved index:          {opened:.2f}s  (target < {OPEN_TARGET_S:.0f} s)")
    if opened >= OPEN_TARGET_S:
        missed.append("open")
    print(f"RSS after open: {process.memory_info().rss / 2**20:.0f} MiB")

    viewer = Viewer([collection, Collection.open(path)])
    sock = bind_socket("127.0.0.1", 0)
    server = make_uvicorn_server(build_app(viewer, token=""), embedded=True)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(server.serve(sockets=[sock])), daemon=True
    )
    thread.start()
    while not server.started:
        time.sleep(0.01)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    middle = len(collection.index) // 2
    pages = {
        "overview": "/api/overview?c=0",
        "tasks (first page)": "/api/tasks?c=0",
        "tasks (page 1000)": "/api/tasks?c=0&offset=50000&limit=50",
        "tasks status=never": "/api/tasks?c=0&status=never",
        "tasks reward 0.2-0.6, sorted": "/api/tasks?c=0&min=0.2&max=0.6&sort=-reward",
        "tasks search in prompts": "/api/tasks?c=0&q=task+12345:",
        "tasks agent filter": "/api/tasks?c=0&agent=code_agent&status=mixed",
        f"rollout (row {middle:,})": f"/api/rollout?c=0&row={middle}",
        "tokens (row with token IDs)": f"/api/tokens?c=0&row={middle - middle % 100}",
        "compare (two collections)": "/api/compare?a=0&b=1&show=changed",
    }
    print(
        f"pages over HTTP, first call and median of {args.tries - 1} more (target < {PAGE_TARGET_MS:.0f} ms):"
    )
    for name, route in pages.items():
        first_ms, ms, size = page_ms(base + route, args.tries)
        flag = "" if max(first_ms, ms) < PAGE_TARGET_MS else "  <-- over target"
        print(f"  {name:32s} first {first_ms:7.1f} ms  then {ms:7.1f} ms  {size / 1024:7.1f} KiB{flag}")
        if max(first_ms, ms) >= PAGE_TARGET_MS:
            missed.append(name)

    with path.open("ab") as sink:
        rng = random.Random(1)
        start = len(collection.index)
        sink.write(b"".join(make_row(start + i, args.repeats, rng) for i in range(1000)))
    time.sleep(0.6)
    started = time.perf_counter()
    with urllib.request.urlopen(base + "/api/overview?c=0", timeout=60) as response:
        rows = orjson.loads(response.read())["rows"]
    print(
        f"live: 1,000 rows appended, next overview shows {rows:,} rows in {(time.perf_counter() - started) * 1000:.0f} ms"
    )
    server.should_exit = True
    thread.join(timeout=10)
    print(f"peak RSS: {process.memory_info().rss / 2**20:.0f} MiB now, {_peak_mib():.0f} MiB peak")
    print(f"machine: {os.cpu_count()} CPUs (shared with other jobs when run on a busy host)")
    if args.file is None and not args.keep:
        for leftover in workdir.iterdir():
            leftover.unlink()
        workdir.rmdir()
    if missed:
        print("MISSED:", ", ".join(missed))
    return 1 if missed else 0


def _peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    raise SystemExit(main())
