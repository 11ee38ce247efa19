"""Long rollouts: the stack's CPU per rollout as the number of turns grows, here and in NeMo Gym.

The stack of ``scripts/bench_vs_nemo_gym.py`` (example_single_tool_call + simple_agent +
openai_model, real processes on 127.0.0.1, each system started by its own ``ng_run`` and driven by
its own ``ng_collect_rollouts``), in front of an instant loopback policy that makes K
``get_weather`` calls and then answers. Each of its turns carries ``--bytes-per-turn`` of text
(an assistant message before the call), so the conversation the policy is sent grows by about
that much, plus the tool's output, every turn. The policy reads K from the row (``[turns=K]`` in
the user message), so one policy process serves every K.

For each K in ``--turns`` (default 1 8 32 96) and each system, ``ng_collect_rollouts`` runs
``--rollouts-per-k`` rows (default: 200 for K <= 8, fewer for longer rollouts so each run does a
similar amount of work) at ``--concurrency`` (default 16), with ``max_steps`` raised above K for
both systems. Measured: rollouts/s over the window from the 10% to the 90% result row, and CPU ms per
rollout over the whole run (less what the idle stack burns in that time) of the stack (``ng_run`` and every descendant; for NeMo Gym its Ray daemons too),
split by process: model server, agent, resources server, and the rest (head server, ``ng_run``,
Ray). The collector's own CPU is reported apart and the policy's is not counted (it stands for
the LLM). The growth exponent of the stack's CPU per rollout is fitted (least squares on
log CPU against log K) over K >= 8, and between each pair of neighbouring K.

Rounds interleave: for each of ``--repeats`` rounds, each system is started, measured at every K
and stopped, then the other; numbers are medians over rounds.

``--baseline-tree DIR`` adds this project at another checkout (``git worktree add DIR COMMIT``),
run with this checkout's venv and ``PYTHONPATH=DIR``: the same table before and after a change.

NeMo Gym's side needs ``--nemo-gym-tree`` and ``--nemo-gym-venv`` exactly as
``scripts/bench_vs_nemo_gym.py`` does (the 0.7.0 wheel unpacked somewhere writable, a venv
holding its requirements); without them it is skipped and this project is measured alone.

Usage: python scripts/bench_long_horizon.py [--turns 1 8 32 96] [--bytes-per-turn 2000]
       [--concurrency 16] [--repeats 2] [--nemo-gym-tree DIR --nemo-gym-venv DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_vs_nemo_gym as pair  # noqa: E402 - the shared stack, systems and process accounting

from nemo_gym.launch.launcher import free_port, wait_for_port  # noqa: E402

ROLES = ("model", "agent", "resources", "other")

# What the instant policy answers (source text, also run by bench_agent_turn's model peer): until
# the row's K get_weather calls are made, a message of PAD bytes of text and a call; then an answer.
# K is read from ``[turns=K]`` in the user message; the embedding source defines PAD and imports re.
POLICY_ANSWER = textwrap.dedent(
    """
    TURNS = re.compile(r"\\[turns=(\\d+)\\]")

    def turns_of(items):
        for item in items:
            content = item.get("content")
            if item.get("role") == "user" and isinstance(content, str):
                found = TURNS.search(content)
                if found:
                    return int(found.group(1))
        return 1

    def policy_answer(body, items, done, turns, n):
        tools = body.get("tools") or []
        if done >= turns or not tools:
            text = "Here is what I found: " + str(items[-1].get("output", ""))[:200]
            output = [{"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        else:
            words = f"Turn {done}: checking the weather once more before answering. "
            pad = (words * (PAD // len(words) + 1))[:PAD]
            output = [{"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": pad, "annotations": []}]},
                      {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "status": "completed",
                       "name": tools[0]["name"], "arguments": '{"city": "San Francisco"}'}]
        return {"id": f"resp_{n}", "object": "response", "created_at": 0, "model": body.get("model") or "m",
                "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
                "tools": tools, "temperature": 1.0, "top_p": 1.0, "error": None, "incomplete_details": None,
                "instructions": None, "metadata": {},
                "usage": {"input_tokens": 20, "output_tokens": 10, "total_tokens": 30,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}
    """
)

# The instant policy: K get_weather calls (each after a message of B bytes of text), then an answer.
POLICY_SERVER = (
    textwrap.dedent(
        """
        import re, sys, itertools, orjson, uvicorn
        from starlette.applications import Starlette
        from starlette.responses import Response
        from starlette.routing import Route

        ids = itertools.count()
        PAD = int(sys.argv[2])
        """
    )
    + POLICY_ANSWER
    + textwrap.dedent(
        """
        async def responses(request):
            body = orjson.loads(await request.body())
            items = body.get("input") or []
            if isinstance(items, str):
                items = [{"role": "user", "content": items}]
            done = sum(1 for item in items if item.get("type") == "function_call_output")
            answer = policy_answer(body, items, done, turns_of(items), next(ids))
            return Response(orjson.dumps(answer), media_type="application/json")

        app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                    loop="uvloop", http="httptools")
        """
    )
)


def role_of(proc: psutil.Process) -> str:
    """Which server a process of the stack is, from its command line and working directory."""
    try:
        where = " ".join(proc.cmdline())
        try:
            where += " " + proc.cwd()
        except (psutil.AccessDenied, OSError):
            pass
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "other"
    for role, folder in (
        ("model", "responses_api_models"),
        ("agent", "responses_api_agents"),
        ("resources", "resources_servers"),
    ):
        if folder in where:
            return role
    return "other"


def rows_for(k: int, rows: list[bytes]) -> list[bytes]:
    """The example rows with ``[turns=K]`` added to their user message."""
    out = []
    for raw in rows:
        row = json.loads(raw)
        for item in row["responses_create_params"]["input"]:
            if item.get("role") == "user" and isinstance(item.get("content"), str):
                item["content"] += f" [turns={k}]"
                break
        out.append(json.dumps(row).encode())
    return out


def default_rollouts(k: int) -> int:
    """200 rollouts up to K=8; fewer for longer ones (their cost grows with K on both systems)."""
    return max(48, min(200, 1600 // k))


def idle_rate(s: pair.System, seconds: float = 3.0) -> dict[str, float]:
    """CPU seconds per second the idle stack burns, by role (Ray's daemons poll; ours should not)."""
    roles = {p.pid: role_of(p) for p in s.stack_processes()}
    before, started = s.cpu_snapshot(), time.perf_counter()
    time.sleep(seconds)
    after, elapsed = s.cpu_snapshot(), time.perf_counter() - started
    out = dict.fromkeys(ROLES, 0.0)
    for pid, cpu in after.items():
        if pid in before:
            out[roles.get(pid, "other")] += (cpu - before[pid]) / elapsed
    return out


def collect(
    s: pair.System,
    input_path: Path,
    rows: int,
    concurrency: int,
    k: int,
    work: Path,
    idle_cpu_s_per_s: dict[str, float],
    py_spy: Path | None = None,
    py_spy_native: bool = False,
) -> dict[str, Any]:
    """One ``ng_collect_rollouts`` run: its rate, and the stack's CPU per rollout by role.

    With ``py_spy`` (a folder), each server (model, agent, resources) is sampled by ``py-spy
    record`` for the run's length, one flame-graph input (``-f raw``) per server in that folder.
    """
    out_dir = work / f"{s.label}_k{k}_{time.monotonic_ns()}"
    out_dir.mkdir()
    output = out_dir / "rollouts.jsonl"
    roles = {p.pid: role_of(p) for p in s.stack_processes()}
    spies = start_py_spy(py_spy, f"{s.label}_k{k}", roles, py_spy_native) if py_spy else []
    try:
        samples, wall = s.run_collector(input_path, concurrency, out_dir, poll_s=0.05)
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)
    results = [json.loads(line) for line in output.read_bytes().splitlines() if line.strip()]
    if len(results) != rows:
        raise RuntimeError(f"{s.label}: {len(results)} result rows, expected {rows}; see {out_dir}")
    calls = [
        sum(1 for item in r["response"]["output"] if item.get("type") == "function_call") for r in results
    ]
    if any(c != k for c in calls):
        raise RuntimeError(f"{s.label}: rollouts made {sorted(set(calls))} tool calls, expected {k}")
    # Rate: from the 10% to the 90% result row (steady state). CPU: the whole run, less what the
    # idle stack burns over the same time (``idle_cpu_s_per_s``, measured before): every rollout's
    # work is then counted once, however the rollouts overlap the window's edges.
    first = next((x for x in samples if x[1] >= max(1, rows // 10)), samples[0])
    last = next((x for x in samples if x[1] >= rows * 9 // 10), samples[-1])
    if last[1] - first[1] >= rows // 2 and last[0] > first[0]:
        rate = (last[1] - first[1]) / (last[0] - first[0])
    else:
        rate = rows / wall
    start, end = samples[0], samples[-1]
    by_role = dict.fromkeys(ROLES, 0.0)
    for pid, cpu in end[3].items():
        if pid in start[3]:
            by_role[roles.get(pid, "other")] += cpu - start[3][pid]
    idle = 0.0
    for role in ROLES:
        burnt = idle_cpu_s_per_s.get(role, 0.0) * (end[0] - start[0])
        by_role[role] = max(0.0, by_role[role] - burnt)
        idle += burnt
    shutil.rmtree(out_dir, ignore_errors=True)
    per = {role: by_role[role] / rows * 1000 for role in ROLES}
    return {
        "rollouts_per_s": rate,
        "stack_cpu_ms_per_rollout": sum(per.values()),
        "cpu_ms_per_rollout_by_role": per,
        "collector_cpu_ms_per_rollout": end[2] / rows * 1000,
        "idle_cpu_ms_subtracted_per_rollout": idle / rows * 1000,
        "rollouts": rows,
        "wall_s": wall,
    }


def start_py_spy(
    folder: Path, prefix: str, roles: dict[int, str], native: bool = False
) -> list[subprocess.Popen[bytes]]:
    """``py-spy record`` on every server process (the busiest one per role is what you want);
    ``native`` adds C frames (uvloop, orjson, the kernel-call wrappers) to the samples."""
    folder.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    spies = []
    for pid, role in roles.items():
        if role == "other":
            continue
        out = folder / f"{prefix}_{role}_{pid}.txt"
        spies.append(
            subprocess.Popen(
                [spy, "record", "-r", "250", "-f", "raw", "-o", str(out), "--pid", str(pid)]
                + (["--native"] if native else []),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    time.sleep(1.0)  # py-spy attaches
    return spies


def fit_exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(cpu) against log(K)."""
    points = [(k, v) for k, v in points if v > 0]
    if len(points) < 2:
        return None
    xs = [math.log(k) for k, _ in points]
    ys = [math.log(v) for _, v in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 8, 32, 96])
    parser.add_argument("--bytes-per-turn", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--rollouts-per-k", type=int, default=None, help="default: 200 up to K=8, then 1600/K, at least 48"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--nemo-gym-tree", type=Path, default=None)
    parser.add_argument("--nemo-gym-venv", type=Path, default=None)
    parser.add_argument("--only", choices=("ours", "nemo_gym"), default=None)
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="also measure this project at another checkout (e.g. `git worktree add DIR COMMIT`), "
        "interleaved with the others, run with this checkout's venv",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="sample every server with `py-spy record -f raw` during each measured run, into this folder "
        "(its CPU is not the stack's, but it shares the machine: use it to find hot spots, not for the table)",
    )
    parser.add_argument(
        "--py-spy-native", action="store_true", help="with --py-spy: sample C frames too (py-spy --native)"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_long_"))
    systems: list[pair.System] = [] if args.only == "nemo_gym" else [pair.ours()]
    if args.baseline_tree is not None:
        baseline = pair.ours()
        baseline.label, baseline.tree = "baseline", args.baseline_tree.resolve()
        baseline.env = {**baseline.env, "PYTHONPATH": str(baseline.tree)}
        systems.append(baseline)
    skipped = None
    if args.only != "ours":
        other, skipped = pair.nemo_gym(args.nemo_gym_tree, args.nemo_gym_venv, work)
        if other is None:
            print(f"NeMo Gym side skipped: {skipped}", flush=True)
        else:
            systems.append(other)
    base_rows = pair.load_rows(args.nemo_gym_tree)
    inputs: dict[int, tuple[Path, int]] = {}
    for k in args.turns:
        n = args.rollouts_per_k or default_rollouts(k)
        rows = rows_for(k, base_rows)
        path = work / f"input_k{k}.jsonl"
        path.write_bytes(b"".join(rows[i % len(rows)] + b"\n" for i in range(n)))
        inputs[k] = (path, n)
    warm = work / "warm.jsonl"
    warm_rows = rows_for(2, base_rows)
    warm.write_bytes(b"".join(warm_rows[i % len(warm_rows)] + b"\n" for i in range(40)))
    max_steps = max(args.turns) + 5
    for s in systems:
        s.results["runs"] = {}
        original = s.config_args

        def config_args(policy_port: int, original: Any = original) -> list[str]:
            return original(policy_port) + [
                f"++{pair.AGENT}.responses_api_agents.simple_agent.max_steps={max_steps}"
            ]

        s.config_args = config_args  # type: ignore[method-assign]

    policy_port = free_port()
    policy = subprocess.Popen(
        [sys.executable, "-c", POLICY_SERVER, str(policy_port), str(args.bytes_per_turn)]
    )
    load_start = os.getloadavg()
    failed = True
    try:
        wait_for_port(policy_port)
        for round_index in range(args.repeats):
            for s in systems:
                s.start(policy_port, work)
                try:
                    time.sleep(1.0)
                    idle = idle_rate(s)
                    s.results.setdefault("idle_cpu_s_per_s", []).append(idle)
                    collect(s, warm, 40, args.concurrency, 2, work, idle)
                    for k in args.turns:
                        path, n = inputs[k]
                        r = collect(
                            s, path, n, args.concurrency, k, work, idle, args.py_spy, args.py_spy_native
                        )
                        r["load_avg"] = os.getloadavg()[0]
                        s.results["runs"].setdefault(str(k), []).append(r)
                        roles = r["cpu_ms_per_rollout_by_role"]
                        print(
                            f"round {round_index + 1} {s.label} K={k}: {r['rollouts_per_s']:.2f} rollouts/s, "
                            f"stack {r['stack_cpu_ms_per_rollout']:.1f} CPU ms/rollout (model {roles['model']:.1f}, "
                            f"agent {roles['agent']:.1f}, resources {roles['resources']:.1f}, other "
                            f"{roles['other']:.1f}; collector {r['collector_cpu_ms_per_rollout']:.1f}), "
                            f"{n} rollouts, load {r['load_avg']:.1f}",
                            flush=True,
                        )
                finally:
                    s.stop()
        failed = False
    finally:
        pair.stop_all(systems)
        policy.terminate()
        policy.wait()
        if failed:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    summary: dict[str, dict[str, Any]] = {}
    for s in systems:
        table = {}
        for k in args.turns:
            runs = s.results["runs"][str(k)]
            table[k] = {
                "rollouts_per_s": statistics.median(r["rollouts_per_s"] for r in runs),
                "stack_cpu_ms_per_rollout": statistics.median(r["stack_cpu_ms_per_rollout"] for r in runs),
                "collector_cpu_ms_per_rollout": statistics.median(
                    r["collector_cpu_ms_per_rollout"] for r in runs
                ),
                **{
                    f"{role}_cpu_ms_per_rollout": statistics.median(
                        r["cpu_ms_per_rollout_by_role"][role] for r in runs
                    )
                    for role in ROLES
                },
            }
        long_ks = [k for k in args.turns if k >= 8]
        summary[s.label] = {
            "by_k": table,
            "exponent_k_ge_8": fit_exponent([(k, table[k]["stack_cpu_ms_per_rollout"]) for k in long_ks]),
            "exponent_between": {
                f"{a}-{b}": fit_exponent(
                    [(a, table[a]["stack_cpu_ms_per_rollout"]), (b, table[b]["stack_cpu_ms_per_rollout"])]
                )
                for a, b in zip(args.turns, args.turns[1:], strict=False)
            },
        }
    load_end = os.getloadavg()
    names = [s.label for s in systems]
    print(
        f"\nbytes per turn {args.bytes_per_turn}, concurrency {args.concurrency}, medians of {args.repeats} "
        f"interleaved rounds, {os.cpu_count()} CPUs; load average {load_start[0]:.1f} -> {load_end[0]:.1f}"
    )
    other = next((n for n in names[1:] if n == "nemo_gym"), names[1] if len(names) > 1 else None)
    print(
        "| turns K | "
        + " | ".join(
            f"{n} rollouts/s | {n} stack CPU ms/rollout (model / agent / resources / other)" for n in names
        )
        + (f" | CPU ratio {other} / ours |" if other else " |")
    )
    print("|---" * (1 + 2 * len(names) + bool(other)) + "|")
    for k in args.turns:
        cells = []
        for n in names:
            t = summary[n]["by_k"][k]
            cells.append(
                f"{t['rollouts_per_s']:.2f} | {t['stack_cpu_ms_per_rollout']:.1f} "
                f"({t['model_cpu_ms_per_rollout']:.1f} / {t['agent_cpu_ms_per_rollout']:.1f} / "
                f"{t['resources_cpu_ms_per_rollout']:.1f} / {t['other_cpu_ms_per_rollout']:.1f})"
            )
        ratio = ""
        if other:  # NeMo Gym's (else the baseline's) CPU per rollout over ours
            a = summary[names[0]]["by_k"][k]["stack_cpu_ms_per_rollout"]
            b = summary[other]["by_k"][k]["stack_cpu_ms_per_rollout"]
            ratio = f" | {b / a:.1f}x" if a else " | -"
        print(f"| {k} | " + " | ".join(cells) + ratio + " |")
    for n in names:
        e = summary[n]["exponent_k_ge_8"]
        between = ", ".join(
            f"{pair_k}: {v:.2f}" for pair_k, v in summary[n]["exponent_between"].items() if v is not None
        )
        print(f"{n}: stack CPU per rollout grows as K^{e:.2f} over K >= 8 (between: {between})" if e else n)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "bytes_per_turn": args.bytes_per_turn,
                    "concurrency": args.concurrency,
                    "repeats": args.repeats,
                    "turns": args.turns,
                    "cpu_count": os.cpu_count(),
                    "load_avg_at_start": load_start,
                    "load_avg_at_end": load_end,
                    "nemo_gym_skipped": skipped,
                    "summary": {
                        n: {**v, "by_k": {str(k): t for k, t in v["by_k"].items()}}
                        for n, v in summary.items()
                    },
                    "runs": {s.label: s.results["runs"] for s in systems},
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
