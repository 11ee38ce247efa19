"""The agent's CPU per turn of a long rollout, alone: simple_agent in front of instant peers.

``simple_agent`` (run with ``PYTHONPATH=TREE`` for each ``TREE`` given, so two checkouts compare)
as a real process, in front of one small peer process that speaks the same HTTP as the stack's
other servers and does next to nothing: a head server (``/server_instances``, so the agent
resolves its peers, and reaches them over their Unix sockets, as under ``ng_run``), a model server
answering ``/v1/responses`` as ``scripts/bench_long_horizon.py``'s instant policy does (K
``get_weather`` calls, each after ``--bytes-per-turn`` of text, then an answer; it keeps a
conversation on ``store: true`` and answers ``X-NeMo-Gym-Conversation: kept`` as openai_model
does, so the agent sends only what is new from its third call on) and a resources server
(``/seed_session`` setting a session cookie, ``/get_weather``, ``/verify`` answering the row back
with a reward). Client threads (``--threads``, each on one kept-alive connection) post rows to
the agent's ``/ng-rollout/<id>/run`` as the collector does, one rollout after another.

Measured: the agent process's CPU per turn (nanoseconds on a CPU from the kernel's scheduler
statistics, all threads; the user/system split from the coarser tick counts) (one model call
and, but for the last, one tool call; a rollout of K tool calls has K+1 turns) over
``--rollouts`` rollouts after a warm-up, and with ``--calls`` the Python calls per turn (cProfile
on the agent's thread, CPU-time clock: the count is what is compared; ``--top N`` prints the N
functions called most); with ``--bytecodes`` the Python bytecodes it executes per turn
(``sys.settrace`` opcode events: exact and load-independent, unlike the CPU on a shared machine;
``--top N`` prints the N functions that run most). Trees take turns ``--repeats`` times.

Usage: python scripts/bench_agent_turn.py TREE [TREE ...] [--turns 96] [--rollouts 16]
       [--threads 4] [--repeats 3] [--calls] [--bytecodes] [--top 30]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import pstats
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import ModuleType

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent

# The head, model and resources servers in one process: asyncio + httptools, no framework. The
# model answers as bench_long_horizon's instant policy does (its POLICY_ANSWER, between the two).
PEERS_HEAD = textwrap.dedent(
    """
    import asyncio, itertools, os, re, sys, uuid
    import httptools, orjson, uvloop
    from nemo_gym.models.conversation_store import KEPT_HEADER
    from nemo_gym.serving import local_socket

    PAD = int(sys.argv[1])
    ids = itertools.count()
    kept = {}  # response id -> (turns, tool outputs so far) of the conversation kept under it
    KEPT = f"{KEPT_HEADER}: kept\\r\\n".encode()
    """
)
# ... bench_long_horizon's POLICY_ANSWER goes here (turns_of, policy_answer) ...
PEERS_SERVE = textwrap.dedent(
    """
    def model(method, path, raw):
        if method == b"DELETE":
            kept.pop(path.rsplit("/", 1)[1], None)
            return 200, {"id": path.rsplit("/", 1)[1], "deleted": True}, b""
        body = orjson.loads(raw)
        items = body.get("input") or []
        previous = body.get("previous_response_id")
        if previous is not None:
            turns, done = kept.pop(previous)
        else:
            turns, done = turns_of(items), 0
        done += sum(1 for item in items if item.get("type") == "function_call_output")
        answer = policy_answer(body, items, done, turns, next(ids))
        extra = b""
        if body.get("store"):
            kept[answer["id"]] = (turns, done)
            extra = KEPT
        return 200, answer, extra

    def resources(method, path, raw):
        name = path.rsplit("/", 1)[1]
        if name == "seed_session":
            cookie = uuid.uuid4().hex
            return 200, {}, f"set-cookie: session_id={cookie}; HttpOnly; Path=/; SameSite=strict\\r\\n".encode()
        if name == "get_weather":
            city = orjson.loads(raw)["city"]
            return 200, {"city": city, "weather_description": f"The weather in {city} is cold."}, b""
        if name == "verify":
            return 200, {**orjson.loads(raw), "reward": 1.0}, b""
        return 404, {"error": f"no route {path}"}, b""

    class Connection(asyncio.Protocol):
        def __init__(self, handler):
            self.handler = handler
            self.parser = httptools.HttpRequestParser(self)

        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_message_begin(self):
            self.url, self.parts = b"", []

        def on_url(self, url):
            self.url += url

        def on_body(self, body):
            self.parts.append(body)

        def on_message_complete(self):
            status, answer, extra = self.handler(self.parser.get_method(), self.url.decode(), b"".join(self.parts))
            data = orjson.dumps(answer)
            head = b"HTTP/1.1 %d OK\\r\\ncontent-type: application/json\\r\\ncontent-length: %d\\r\\n%s\\r\\n"
            self.transport.write(head % (status, len(data), extra) + data)

    async def main():
        loop = asyncio.get_running_loop()
        ports, unlink = {}, []
        instances = []
        def head(method, path, raw):
            return 200, instances, b""
        for role, handler in (("head", head), ("model", model), ("resources", resources)):
            server = await loop.create_server(lambda handler=handler: Connection(handler), "127.0.0.1", 0)
            ports[role] = port = server.sockets[0].getsockname()[1]
            local = local_socket.bind("127.0.0.1", port)
            if local is not None:
                unlink.append(local)
                await loop.create_unix_server(lambda handler=handler: Connection(handler), sock=local.sock)
            if role != "head":
                instances.append({"name": f"bench_{role}", "url": f"http://127.0.0.1:{port}", "host": "127.0.0.1",
                                  "port": port, "pid": os.getpid(), "server_type": role})
        print(ports["head"], flush=True)
        try:
            await loop.run_in_executor(None, sys.stdin.read)  # until the benchmark closes stdin
        finally:
            for local in unlink:
                local.unlink()

    uvloop.run(main())
    """
)

# The agent, profiled on demand: "start" / "stop PATH" lines on stdin (as bench_model_turn's server);
# "count" / "counted PATH": the Python bytecodes each function executes (sys.settrace opcode events),
# written as JSON {"file:function": [bytecodes, calls]}.
AGENT = textwrap.dedent(
    """
    import asyncio, cProfile, collections, json, sys, threading, time, uvloop
    from nemo_gym.serving.gc_tuning import tune_gc_for_serving
    from nemo_gym.serving.sockets import bind_socket
    from responses_api_agents.simple_agent.app import SimpleAgent
    server = SimpleAgent({
        "name": "bench_agent",
        "resources_server": {"type": "resources_servers", "name": "bench_resources"},
        "model_server": {"type": "responses_api_models", "name": "bench_model"},
        "max_steps": int(sys.argv[1]),
    })
    tune_gc_for_serving()
    sock = bind_socket("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    profile = cProfile.Profile(time.process_time)
    bytecodes, calls = collections.Counter(), collections.Counter()
    def trace(frame, event, arg):
        where = frame.f_code.co_filename.rsplit("/", 1)[-1] + ":" + frame.f_code.co_name
        if event == "call":
            frame.f_trace_opcodes = True
            calls[where] += 1
        elif event == "opcode":
            bytecodes[where] += 1
        return trace
    def control():
        for line in sys.stdin:
            command = line.split()
            if command[0] in ("start", "count"):
                loop.call_soon_threadsafe(profile.enable if command[0] == "start" else lambda: sys.settrace(trace))
            elif command[0] in ("stop", "counted"):
                done = threading.Event()
                loop.call_soon_threadsafe(lambda: (profile.disable(), sys.settrace(None), done.set()))
                done.wait()
                if command[0] == "stop":
                    profile.dump_stats(command[1])
                else:
                    with open(command[1], "w") as out:
                        json.dump({k: [v, calls[k]] for k, v in bytecodes.items()}, out)
                print("stopped", flush=True)
        uv = getattr(server, "uvicorn_server", None)
        if uv is not None:
            uv.should_exit = True
    threading.Thread(target=control, daemon=True).start()
    loop.run_until_complete(server.serve(sock, register=False, embedded=True))
    """
)


def load_script(name: str) -> ModuleType:
    """Another benchmark script of this folder as a module (its pieces reused, not copied)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / f"scripts/{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(
    tree: str,
    head_url: str,
    rows: list[bytes],
    args: argparse.Namespace,
    profile_to: str | None,
    count_to: str | None = None,
) -> dict[str, float]:
    """One tree's agent: its CPU per turn, and with ``profile_to`` its Python calls (cProfile),
    with ``count_to`` its Python bytecodes (counted per function into that JSON file)."""
    model_turn = load_script("bench_model_turn")
    post = model_turn.post
    cpu_ns = load_script("bench_request_cpu").cpu_ns
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(args.turns + 5)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": tree, "NEMO_GYM_HEAD_URL": head_url},
        cwd=tree,
    )
    assert agent.stdin is not None and agent.stdout is not None
    try:
        port = int(agent.stdout.readline())
        ids = itertools.count()
        turns: list[int] = []

        def worker(count: int) -> None:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                made = 0
                for _ in range(count):
                    n = next(ids)
                    row = {
                        **orjson.loads(rows[n % len(rows)]),
                        "agent_ref": {"type": "responses_api_agents", "name": "bench_agent"},
                        "_ng_task_index": n,
                        "_ng_rollout_index": 0,
                    }
                    _, result = post(sock, "POST", f"/ng-rollout/t{n}-r0-a0-b/run", row)
                    calls = sum(1 for item in result["response"]["output"] if item["type"] == "function_call")
                    if calls != args.turns or result.get("reward") != 1.0:
                        raise RuntimeError(f"rollout {n}: {calls} tool calls (expected {args.turns})")
                    made += calls + 1
                turns.append(made)

        worker(2)  # warm-up
        turns.clear()
        for command, wanted in ((b"start\n", profile_to), (b"count\n", count_to)):
            if wanted:
                agent.stdin.write(command)
                agent.stdin.flush()
        if profile_to or count_to:
            time.sleep(0.2)
        spies = []
        if args.py_spy:
            spies = load_script("bench_long_horizon").start_py_spy(
                args.py_spy, Path(tree).name, {agent.pid: "agent"}, args.py_spy_native
            )
        process = psutil.Process(agent.pid)
        before, before_ns, started = process.cpu_times(), cpu_ns(agent.pid), time.perf_counter()
        model_turn.run_workers(worker, args.rollouts, args.threads)
        after, after_ns, wall = process.cpu_times(), cpu_ns(agent.pid), time.perf_counter() - started
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)
        made = sum(turns)
        result = {
            "turns": made,
            "turns_per_s": made / wall,
            "cpu_us_per_turn": (after_ns - before_ns) / 1e3 / made,
            "user_us_per_turn": 1e6 * (after.user - before.user) / made,
            "system_us_per_turn": 1e6 * (after.system - before.system) / made,
            "load": os.getloadavg()[0],
        }
        if profile_to:
            result["python_calls_per_turn"] = model_turn.profiled_calls(agent, profile_to) / made
        if count_to:
            agent.stdin.write(f"counted {count_to}\n".encode())
            agent.stdin.flush()
            agent.stdout.readline()
            counted = orjson.loads(Path(count_to).read_bytes())
            result["bytecodes_per_turn"] = sum(v[0] for v in counted.values()) / made
        return result
    finally:
        agent.stdin.close()
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def top_bytecodes(counted: str, turns: float, count: int) -> list[str]:
    """The ``count`` functions that ran the most bytecodes, as lines of bytecodes and calls per turn
    (a coroutine's call count includes each time it resumed)."""
    ranked = sorted(orjson.loads(Path(counted).read_bytes()).items(), key=lambda kv: -kv[1][0])[:count]
    return [f"  {v[0] / turns:7.1f} {v[1] / turns:6.2f}  {where}" for where, v in ranked]


def top_calls(profile: str, turns: float, count: int) -> list[str]:
    """The ``count`` functions called most in a profile, as lines of calls per turn."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][1])[:count]
    return [f"  {v[1] / turns:7.2f}  {Path(f).name}:{line} {name}" for (f, line, name), v in ranked]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--turns", type=int, default=96, help="tool calls per rollout (K)")
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bytes-per-turn", type=int, default=2000)
    parser.add_argument("--calls", action="store_true", help="also count Python calls per turn (cProfile)")
    parser.add_argument(
        "--bytecodes",
        action="store_true",
        help="also count the Python bytecodes the agent runs per turn (sys.settrace; load-independent)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=0,
        help="with --calls/--bytecodes: the N functions called most / running most",
    )
    parser.add_argument(
        "--profile-dir",
        type=Path,
        default=None,
        help="with --calls/--bytecodes: keep each run's cProfile file and bytecode counts here",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="sample the agent with `py-spy record -f raw` into this folder",
    )
    parser.add_argument("--py-spy-native", action="store_true", help="with --py-spy: C frames too")
    args = parser.parse_args()
    long_horizon = load_script("bench_long_horizon")
    rows = long_horizon.rows_for(
        args.turns,
        (ROOT / "resources_servers/example_single_tool_call/data/example.jsonl").read_bytes().splitlines(),
    )
    peers = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PEERS_HEAD + long_horizon.POLICY_ANSWER + PEERS_SERVE,
            str(args.bytes_per_turn),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert peers.stdin is not None and peers.stdout is not None
    results: dict[str, list[float]] = {tree: [] for tree in args.trees}
    try:
        head_url = f"http://127.0.0.1:{int(peers.stdout.readline())}"
        with tempfile.TemporaryDirectory() as tmp:
            for repeat in range(args.repeats):
                for number, tree in enumerate(args.trees):
                    folder = args.profile_dir or Path(tmp)
                    profile_to = f"{folder}/{number}_{repeat + 1}.prof" if args.calls else None
                    count_to = f"{folder}/{number}_{repeat + 1}.bytecodes.json" if args.bytecodes else None
                    result = measure(os.path.abspath(tree), head_url, rows, args, profile_to, count_to)
                    results[tree].append(result["cpu_us_per_turn"])
                    calls = f", {result['python_calls_per_turn']:.0f} Python calls" if args.calls else ""
                    if count_to:
                        calls += f", {result['bytecodes_per_turn']:.0f} Python bytecodes"
                    print(
                        f"round {repeat + 1} {tree}: {result['cpu_us_per_turn']:.0f} us agent CPU per turn "
                        f"(user {result['user_us_per_turn']:.0f}, system {result['system_us_per_turn']:.0f})"
                        f"{calls}, {result['turns']} turns at {result['turns_per_s']:.0f}/s, load {result['load']:.1f}",
                        flush=True,
                    )
                    if profile_to and args.top and repeat == args.repeats - 1:
                        print("\n".join(top_calls(profile_to, result["turns"], args.top)), flush=True)
                    if count_to and args.top and repeat == args.repeats - 1:
                        print("\n".join(top_bytecodes(count_to, result["turns"], args.top)), flush=True)
        for tree, values in results.items():
            print(f"median {tree}: {statistics.median(values):.0f} us agent CPU per turn")
    finally:
        peers.stdin.close()
        peers.wait(10)


if __name__ == "__main__":
    main()
