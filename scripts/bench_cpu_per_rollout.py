"""CPU per rollout of every process, with ``ng_collect_rollouts`` driving the stack as a user runs it.

Two stacks, real processes on 127.0.0.1:

- ``scripted``: example_single_tool_call + simple_agent + the instant scripted model;
- ``openai``: the same with ``openai_model`` in front of an instant OpenAI-compatible fake
  (a bare starlette/uvicorn process answering ``/v1/responses``; its CPU stands for the LLM and
  is shown but not counted).

For each stack: warm up, drive ``/run`` from this process with ``--concurrency`` in flight
(the ``/run``-driven rate), then run the ``ng_collect_rollouts`` command itself ``--repeats``
times on ``--rows`` rows at ``+num_samples_in_parallel=--concurrency``. While it runs, the CPU
times of every server process and of the collector process are sampled with psutil (the
processes' own counters, far less sensitive to a loaded machine than wall time); CPU per rollout
is the CPU spent between the first and the last result row divided by the rows written then.
The best (lowest total) of the repeats is reported. The floor is measured in the same run: a
bare starlette/uvicorn echo server driven by a bare aiohttp client (CPU of both per hop, and
hops/s); a rollout is 6 hops.

Usage: python scripts/bench_cpu_per_rollout.py [--rows 2000] [--concurrency 64] [--repeats 3]
       [--stacks scripted openai] [--json docs/bench_cpu_per_rollout.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nemo_gym.launch.config import load_config  # noqa: E402
from nemo_gym.launch.launcher import StackHandle, free_port, wait_for_port  # noqa: E402
from nemo_gym.serving.server_client import ServerClient  # noqa: E402
from nemo_gym.serving.uvicorn_factory import loop_factory  # noqa: E402

HOPS_PER_ROLLOUT = 6  # collector→agent, seed_session, model, get_weather, model, verify
AGENT = "example_single_tool_call_simple_agent"
ROWS = [
    orjson.loads(line)
    for line in (ROOT / "resources_servers/example_single_tool_call/data/example.jsonl")
    .read_bytes()
    .splitlines()
    if line.strip()
]

ECHO_SERVER = textwrap.dedent(
    """
    import sys, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request):
        return Response(await request.body(), media_type="application/json")

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                loop="uvloop", http="httptools")
    """
)

# An instant OpenAI Responses endpoint: calls the first tool, then answers with its output.
FAKE_OPENAI = textwrap.dedent(
    """
    import sys, itertools, orjson, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    ids = itertools.count()

    async def responses(request):
        body = orjson.loads(await request.body())
        items = body.get("input") or []
        last = items[-1] if isinstance(items, list) and items else {}
        n = next(ids)
        if last.get("type") == "function_call_output" or not body.get("tools"):
            text = "Here is what I found: " + str(last.get("output", ""))
            output = [{"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        else:
            output = [{"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "status": "completed",
                       "name": body["tools"][0]["name"], "arguments": '{"city": "Oslo"}'}]
        answer = {"id": f"resp_{n}", "object": "response", "created_at": 0, "model": body.get("model"),
                  "status": "completed", "output": output, "parallel_tool_calls": True, "tools": body.get("tools", []),
                  "usage": {"input_tokens": 20, "output_tokens": 10, "total_tokens": 30,
                            "input_tokens_details": {"cached_tokens": 0},
                            "output_tokens_details": {"reasoning_tokens": 0}}}
        return Response(orjson.dumps(answer), media_type="application/json")

    app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                loop="uvloop", http="httptools")
    """
)

# The floor's client: a bare aiohttp session posting the row to the echo server.
FLOOR_CLIENT = textwrap.dedent(
    """
    import asyncio, json, sys, time, aiohttp, uvloop
    port, concurrency, total, body = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()

    async def main():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
            sem = asyncio.Semaphore(concurrency)

            async def one():
                async with sem:
                    async with http.post(f"http://127.0.0.1:{port}/echo", data=body,
                                         headers={"Content-Type": "application/json"}) as resp:
                        await resp.read()

            await asyncio.gather(*(one() for _ in range(500)))
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(one() for _ in range(total)))
            print(json.dumps({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}))

    uvloop.run(main())
    """
)


def cpu_s(proc: psutil.Process) -> float:
    """User + system CPU seconds of one process (its own, children not included)."""
    times = proc.cpu_times()
    return times.user + times.system


def measure_floor(echo: subprocess.Popen[bytes], port: int, concurrency: int, total: int) -> dict[str, float]:
    """CPU per hop (client + server) and hops/s of the bare starlette/uvicorn + aiohttp echo hop."""
    server = psutil.Process(echo.pid)
    before = cpu_s(server)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            FLOOR_CLIENT,
            str(port),
            str(concurrency),
            str(total),
            orjson.dumps(ROWS[0]).decode(),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    client = json.loads(out)
    server_cpu = cpu_s(server) - before  # includes the 500 warm-up requests: counted below
    return {
        "cpu_ms_per_hop": (client["cpu_s"] + server_cpu * total / (total + 500)) / total * 1000,
        "client_cpu_ms_per_hop": client["cpu_s"] / total * 1000,
        "server_cpu_ms_per_hop": server_cpu / (total + 500) * 1000,
        "hops_per_s": total / client["wall_s"],
    }


def write_input(path: Path, rows: int) -> None:
    with path.open("wb") as sink:
        for i in range(rows):
            sink.write(
                orjson.dumps({**ROWS[i % len(ROWS)], "bench_row": i}, option=orjson.OPT_APPEND_NEWLINE)
            )


def collector_command() -> list[str]:
    script = Path(sys.executable).with_name("ng_collect_rollouts")
    if script.exists():
        return [str(script)]
    found = shutil.which("ng_collect_rollouts")
    return [found] if found else [sys.executable, "-m", "nemo_gym.rollout_collection"]


def run_collector(
    handle: StackHandle, servers: dict[str, psutil.Process], rows: int, concurrency: int, work: Path
) -> dict[str, Any]:
    """One ``ng_collect_rollouts`` run; CPU per rollout per process over the collection window."""
    input_path, output_path = work / "input.jsonl", work / "output.jsonl"
    for stale in work.glob("output*"):
        stale.unlink()
    head = handle.head_server_config
    argv = collector_command() + [
        f"+agent_name={AGENT}",
        f"+input_jsonl_fpath={input_path}",
        f"+output_jsonl_fpath={output_path}",
        f"+num_samples_in_parallel={concurrency}",
        f"++head_server.host={head['host']}",
        f"++head_server.port={head['port']}",
    ]
    started = time.perf_counter()
    collector = subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc = psutil.Process(collector.pid)
    procs = {"collector": proc, **servers}
    samples: list[tuple[float, int, dict[str, float]]] = []
    seen, offset = 0, 0
    while collector.poll() is None:
        if output_path.exists():
            with output_path.open("rb") as source:
                source.seek(offset)
                chunk = source.read()
            seen += chunk.count(b"\n")
            offset += len(chunk)
        try:
            cpus = {name: cpu_s(p) for name, p in procs.items()}
        except psutil.NoSuchProcess:
            break
        samples.append((time.perf_counter(), seen, cpus))
        if seen >= rows:
            break
        time.sleep(0.01)
    _, stderr = collector.communicate()
    total_wall = time.perf_counter() - started
    if collector.returncode != 0:
        raise RuntimeError(f"ng_collect_rollouts failed ({collector.returncode}): {stderr.decode()[-2000:]}")
    first = next(s for s in samples if s[1] > 0)
    last = next(s for s in samples if s[1] >= rows)
    done = last[1] - first[1]
    per_process = {name: (last[2][name] - first[2][name]) / done * 1000 for name in procs}
    return {
        "cpu_ms_per_rollout": per_process,
        "rollouts_per_s": done / (last[0] - first[0]),
        "end_to_end_wall_s": total_wall,
        "rows_in_window": done,
    }


async def run_driven(
    handle: StackHandle, servers: dict[str, psutil.Process], rows: int, concurrency: int
) -> dict[str, Any]:
    """Rate and server CPU per rollout of ``/run`` posted from this process (no collector)."""
    client = ServerClient(handle.head_url)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with semaphore:
            result = await client.post_json(AGENT, "/run", {**ROWS[i % len(ROWS)], "bench_row": i})
            assert result["reward"] == 1.0, result

    before = {name: cpu_s(p) for name, p in servers.items()}
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(rows)))
    wall = time.perf_counter() - started
    after = {name: cpu_s(p) for name, p in servers.items()}
    await client.close()
    return {
        "rollouts_per_s": rows / wall,
        "server_cpu_ms_per_rollout": {name: (after[name] - before[name]) / rows * 1000 for name in servers},
    }


def stack_config(stack: str, fake_port: int | None) -> dict[str, Any]:
    model_config = {
        "scripted": "responses_api_models/scripted_model/configs/scripted_model.yaml",
        "openai": "responses_api_models/openai_model/configs/openai_model.yaml",
    }[stack]
    overrides = [
        f"+config_paths=[resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,{model_config}]",
        "++head_server.port=0",
    ]
    if stack == "openai":
        overrides += [
            f"++policy_base_url=http://127.0.0.1:{fake_port}/v1",
            "++policy_api_key=bench",
            "++policy_model_name=bench-model",
        ]
    return load_config(overrides, cwd=ROOT)


def bench_stack(stack: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    fake: subprocess.Popen[bytes] | None = None
    fake_port = None
    if stack == "openai":
        fake_port = free_port()
        fake = subprocess.Popen([sys.executable, "-c", FAKE_OPENAI, str(fake_port)])
        wait_for_port(fake_port)
    handle = StackHandle.start(stack_config(stack, fake_port), log=lambda name, line: None)
    try:
        servers = {
            {"example_single_tool_call": "resources", AGENT: "agent", "policy_model": "model"}[
                r.name
            ]: psutil.Process(r.pid)
            for r in handle.stack.head.registry.all()
        }
        if fake is not None:
            servers["fake_llm (not counted)"] = psutil.Process(fake.pid)
        runs: list[dict[str, Any]] = []
        driven_runs: list[dict[str, Any]] = []
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(run_driven(handle, servers, 200, args.concurrency))  # warm-up
            for repeat in range(args.repeats):
                # Interleaved, so a burst of load from other work hits both measurements alike.
                driven = runner.run(run_driven(handle, servers, args.rows, args.concurrency))
                driven_runs.append(driven)
                result = run_collector(handle, servers, args.rows, args.concurrency, work)
                result["total_cpu_ms_per_rollout"] = sum(
                    v for k, v in result["cpu_ms_per_rollout"].items() if "not counted" not in k
                )
                runs.append(result)
                shown = "  ".join(f"{k} {v:.3f}" for k, v in result["cpu_ms_per_rollout"].items())
                print(
                    f"  run {repeat + 1}: /run-driven {driven['rollouts_per_s']:.0f} rollouts/s; ng_collect_rollouts "
                    f"{result['rollouts_per_s']:.0f} rollouts/s, {result['total_cpu_ms_per_rollout']:.3f} ms CPU/rollout "
                    f"({shown})",
                    flush=True,
                )
        driven = max(driven_runs, key=lambda d: d["rollouts_per_s"])
        best = min(runs, key=lambda r: r["total_cpu_ms_per_rollout"])
        best_rate = max(r["rollouts_per_s"] for r in runs)
        rss = {name: p.memory_info().rss / 2**20 for name, p in servers.items()}
    finally:
        handle.stop()
        if fake is not None:
            fake.terminate()
            fake.wait()
    return {
        "best": best,
        "runs": runs,
        "best_collector_rollouts_per_s": best_rate,
        "run_driven": driven,
        "run_driven_runs": driven_runs,
        "collector_rate_vs_run_driven": best_rate / driven["rollouts_per_s"],
        "rss_mib_after": rss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stacks", nargs="+", default=["scripted", "openai"], choices=["scripted", "openai"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    results: dict[str, Any] = {
        "rows": args.rows,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
        "stacks": {},
    }
    echo_port = free_port()
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(echo_port)])
    try:
        wait_for_port(echo_port)
        floors = [measure_floor(echo, echo_port, args.concurrency, 5000) for _ in range(args.repeats)]
        results["floor"] = min(floors, key=lambda f: f["cpu_ms_per_hop"])
        results["floor"]["hops_per_s"] = max(f["hops_per_s"] for f in floors)
        print(
            f"floor (bare starlette/uvicorn echo + bare aiohttp, concurrency {args.concurrency}): "
            f"{results['floor']['cpu_ms_per_hop']:.3f} ms CPU per hop, {results['floor']['hops_per_s']:.0f} hops/s",
            flush=True,
        )
    finally:
        echo.terminate()
        echo.wait()
    with tempfile.TemporaryDirectory(prefix="bench_cpu_") as tmp:
        work = Path(tmp)
        write_input(work / "input.jsonl", args.rows)
        for stack in args.stacks:
            print(f"{stack} stack:", flush=True)
            results["stacks"][stack] = bench_stack(stack, args, work)
    results["load_avg_at_end"] = os.getloadavg()

    floor_rollout = results["floor"]["cpu_ms_per_hop"] * HOPS_PER_ROLLOUT
    print(
        f"\n{args.rows} rows, concurrency {args.concurrency}, best of {args.repeats} ng_collect_rollouts runs"
    )
    print(
        "| stack | collector | agent | resources | model | total CPU ms/rollout | ÷ floor hop | rollouts/s "
        "| /run-driven | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for stack, r in results["stacks"].items():
        cpu = r["best"]["cpu_ms_per_rollout"]
        print(
            f"| {stack} | {cpu['collector']:.3f} | {cpu['agent']:.3f} | {cpu['resources']:.3f} | {cpu['model']:.3f} "
            f"| **{r['best']['total_cpu_ms_per_rollout']:.3f}** "
            f"| {r['best']['total_cpu_ms_per_rollout'] / results['floor']['cpu_ms_per_hop']:.1f} "
            f"| {r['best_collector_rollouts_per_s']:.0f} "
            f"| {r['run_driven']['rollouts_per_s']:.0f} | {r['collector_rate_vs_run_driven']:.0%} |"
        )
    print(
        f"| floor: {HOPS_PER_ROLLOUT} bare echo hops | | | | | {floor_rollout:.3f} | {HOPS_PER_ROLLOUT} "
        f"| {results['floor']['hops_per_s'] / HOPS_PER_ROLLOUT:.0f} | | |"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
