"""This project against NeMo Gym, side by side in one run, each driven by its own ``ng_collect_rollouts``.

Both systems run the same stack, real processes on 127.0.0.1: NeMo Gym's example_single_tool_call
resources server, simple_agent and openai_model, in front of one instant loopback policy server
(a bare starlette/uvicorn Responses-API answerer: a ``get_weather`` function call on the first
turn, a message on the second; the same process serves both systems). Each system is started
with its own ``ng_run`` and driven by its own ``ng_collect_rollouts`` on ``--rows`` rows of NeMo
Gym's example_single_tool_call data. The systems take turns: in each of ``--repeats`` rounds, one
system is started, measured and stopped, then the other (so one stack's idle processes, such as
Ray's polling daemons, never load the other's measurement); each number is the median over the
rounds. Measured:

- rollouts/s of ``ng_collect_rollouts`` at each ``--concurrency`` (``+num_samples_in_parallel``),
  over the window from its first to its last result row when the results file grows as rollouts
  finish, else over the collector's whole run (the JSON says which);
- CPU ms per rollout over the same window: every process of the stack (``ng_run`` and all its
  descendants, head server, servers, and for NeMo Gym the Ray daemons it starts) plus the
  collector and its children; the policy server is NOT counted (it stands for the LLM);
- ``/run`` latency p50/p99 at concurrency 1, posted by this script with a bare blocking
  ``http.client`` connection (the same driver for both);
- start-up: from starting ``ng_run`` to every server (head included) answering ``GET /``;
- RSS summed over the stack's processes after start-up and after the last high-concurrency run,
  and the CPU the idle stack burns (5 s after start-up).

NeMo Gym runs from a copy of its source tree (``--nemo-gym-tree``, e.g. the 0.7.0 wheel unpacked
and copied somewhere writable) with a venv holding its dependencies (``--nemo-gym-venv``): each
server folder's ``.venv`` is linked to that venv and ``+skip_venv_if_present=true`` is passed, Ray
is kept on loopback with a private ``RAY_TMPDIR``. Without either path NeMo Gym's side is skipped
(with the reason printed) and this project's side is measured alone.

Usage: python scripts/bench_vs_nemo_gym.py [--nemo-gym-tree DIR] [--nemo-gym-venv DIR]
       [--rows 2000] [--concurrency 64 256] [--repeats 2] [--latency-requests 300]
       [--json docs/bench_vs_nemo_gym.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from nemo_gym.launch.launcher import free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
AGENT = "example_single_tool_call_simple_agent"
SERVER_NAMES = ("example_single_tool_call", AGENT, "policy_model")
CONFIG_PATHS = (
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "responses_api_models/openai_model/configs/openai_model.yaml",
)
SERVER_DIRS = (
    "resources_servers/example_single_tool_call",
    "responses_api_agents/simple_agent",
    "responses_api_models/openai_model",
)

# The instant policy: a complete Responses object (NeMo Gym validates every field it requires).
POLICY_SERVER = textwrap.dedent(
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
        tools = body.get("tools") or []
        if last.get("type") == "function_call_output" or not tools:
            text = "Here is what I found: " + str(last.get("output", ""))
            output = [{"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        else:
            output = [{"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "status": "completed",
                       "name": tools[0]["name"], "arguments": '{"city": "San Francisco"}'}]
        answer = {"id": f"resp_{n}", "object": "response", "created_at": 0, "model": body.get("model") or "m",
                  "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
                  "tools": tools, "temperature": 1.0, "top_p": 1.0, "error": None, "incomplete_details": None,
                  "instructions": None, "metadata": {},
                  "usage": {"input_tokens": 20, "output_tokens": 10, "total_tokens": 30,
                            "input_tokens_details": {"cached_tokens": 0},
                            "output_tokens_details": {"reasoning_tokens": 0}}}
        return Response(orjson.dumps(answer), media_type="application/json")

    app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                loop="uvloop", http="httptools")
    """
)

# NeMo Gym's console scripts dispatch on their own name (argv[0]); run them from its source tree.
NEMO_GYM_COMMAND = "import sys; sys.argv[0] = {name!r}; from nemo_gym.cli.legacy import main; main()"


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def get_json(url: str, timeout_s: float = 2.0) -> Any:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request("GET", parts.path or "/")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise OSError(f"GET {url}: HTTP {resp.status}")
        return json.loads(body)
    finally:
        conn.close()


@dataclass
class System:
    """One system under test: how to start its stack and its collector."""

    label: str
    python: str
    tree: Path
    env: dict[str, str]
    ng_run: list[str]
    ng_collect_rollouts: list[str]
    ray_tmpdir: str | None = None
    head_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log: Any = None
    results: dict[str, Any] = field(default_factory=dict)

    def stack_processes(self) -> list[psutil.Process]:
        """``ng_run`` and its descendants, plus Ray daemons started under this system's RAY_TMPDIR."""
        assert self.proc is not None
        procs: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.proc.pid)
            procs[root.pid] = root
            for child in root.children(recursive=True):
                procs[child.pid] = child
        except psutil.NoSuchProcess:
            pass
        if self.ray_tmpdir:
            for p in psutil.process_iter(["cmdline"]):
                try:
                    if any(self.ray_tmpdir in part for part in p.info["cmdline"] or ()):
                        procs.setdefault(p.pid, p)
                        for child in p.children(recursive=True):
                            procs.setdefault(child.pid, child)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        return list(procs.values())

    def cpu_snapshot(self) -> dict[int, float]:
        out = {}
        for p in self.stack_processes():
            try:
                out[p.pid] = cpu_s(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    def rss_mib(self) -> float:
        total = 0
        for p in self.stack_processes():
            try:
                total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return total / 2**20

    def config_args(self, policy_port: int) -> list[str]:
        args = [
            f"+config_paths=[{','.join(CONFIG_PATHS)}]",
            f"++policy_base_url=http://127.0.0.1:{policy_port}/v1",
            "++policy_api_key=bench",
            "++policy_model_name=bench-model",
            "++head_server.host=127.0.0.1",
            f"++head_server.port={self.head_port}",
        ]
        if self.ray_tmpdir:
            args.append("+skip_venv_if_present=true")
        return args

    def instances(self) -> list[dict[str, Any]]:
        return get_json(f"http://127.0.0.1:{self.head_port}/server_instances")

    def all_answering(self) -> dict[str, str] | None:
        """Instance name → URL once every server (and the head) answers ``GET /``, else None."""
        try:
            get_json(f"http://127.0.0.1:{self.head_port}/")
            # NeMo Gym's entries name the instance in ``process_name`` (``name`` is the folder).
            urls = {
                i.get("process_name") or i["name"]: i.get("url") or f"http://{i['host']}:{i['port']}"
                for i in self.instances()
            }
            if not all(name in urls for name in SERVER_NAMES):
                return None
            for name in SERVER_NAMES:
                get_json(urls[name] + "/")
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return urls

    def start(self, policy_port: int, work: Path, timeout_s: float = 300.0) -> float:
        """Start the stack; seconds from spawning ``ng_run`` to every server answering."""
        self.head_port = free_port()
        self.log = (work / f"{self.label}_ng_run.log").open("ab")
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            self.ng_run + self.config_args(policy_port),
            cwd=self.tree,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        while True:
            if self.proc.poll() is not None:
                self.log.flush()
                tail = Path(self.log.name).read_text(errors="replace")[-4000:]
                raise RuntimeError(f"{self.label}: ng_run exited {self.proc.returncode}:\n{tail}")
            self.urls = self.all_answering()
            if self.urls:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"{self.label}: not all servers answering after {timeout_s:.0f}s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        procs = self.stack_processes()
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for p in procs:  # whatever did not exit with ng_run (Ray daemons, orphans)
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        if self.log:
            self.log.close()
        self.proc = None

    def run_collector(
        self, input_path: Path, concurrency: int, out_dir: Path, poll_s: float = 0.02
    ) -> tuple[list[tuple[float, int, float, dict[int, float]]], float]:
        """Run ``ng_collect_rollouts`` on ``input_path`` into ``out_dir/rollouts.jsonl``.

        Returns the samples taken every ``poll_s`` until it exits, each ``(time, result rows
        written, CPU seconds of the collector and its children, CPU seconds by stack process)``,
        and its wall time; raises when it fails (its log's tail in the message).
        """
        output = out_dir / "rollouts.jsonl"
        argv = self.ng_collect_rollouts + [
            f"+agent_name={AGENT}",
            f"+input_jsonl_fpath={input_path}",
            f"+output_jsonl_fpath={output}",
            f"+num_samples_in_parallel={concurrency}",
            "++head_server.host=127.0.0.1",
            f"++head_server.port={self.head_port}",
        ]
        first = (time.perf_counter(), 0, 0.0, self.cpu_snapshot())
        started = first[0]
        with (out_dir / "collector.log").open("wb") as log:
            collector = subprocess.Popen(
                argv, cwd=self.tree, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        root = psutil.Process(collector.pid)
        collector_procs: dict[int, psutil.Process] = {root.pid: root}
        collector_cpu: dict[int, float] = {}
        samples = [first]
        seen, offset = 0, 0
        while True:
            running = collector.poll() is None
            if output.exists():
                with output.open("rb") as source:
                    source.seek(offset)
                    chunk = source.read()
                seen += chunk.count(b"\n")
                offset += len(chunk)
            if running:
                try:
                    for child in root.children(recursive=True):
                        collector_procs.setdefault(child.pid, child)
                except psutil.NoSuchProcess:
                    pass
                for pid, p in list(collector_procs.items()):
                    try:
                        collector_cpu[pid] = cpu_s(p)
                    except psutil.NoSuchProcess:
                        pass
            samples.append((time.perf_counter(), seen, sum(collector_cpu.values()), self.cpu_snapshot()))
            if not running:
                break
            time.sleep(poll_s)
        wall = time.perf_counter() - started
        if collector.returncode != 0:
            tail = (out_dir / "collector.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.label}: ng_collect_rollouts exited {collector.returncode}:\n{tail}")
        return samples, wall

    def collect(self, input_path: Path, rows: int, concurrency: int, work: Path) -> dict[str, Any]:
        """One ``ng_collect_rollouts`` run; rate and CPU per rollout over its result window."""
        out_dir = work / f"{self.label}_c{concurrency}_{time.monotonic_ns()}"
        out_dir.mkdir()
        output = out_dir / "rollouts.jsonl"
        samples, wall = self.run_collector(input_path, concurrency, out_dir)
        stack_before = samples[0][3]
        samples = samples[1:]
        written = sum(1 for line in output.read_bytes().splitlines() if line.strip())
        if written != rows:
            raise RuntimeError(f"{self.label}: {written} result rows, expected {rows}; see {out_dir}")
        rewards = [json.loads(line)["reward"] for line in output.read_bytes().splitlines() if line.strip()]
        # Steady state: from the 10% to the 90% result row, so as many rollouts are part-done at the
        # window's start as at its end (from the first row on, the in-flight work before it is missed).
        first = next((s for s in samples if s[1] >= rows // 10 and s[1] > 0), None)
        last = next((s for s in samples if s[1] >= rows * 9 // 10), None)
        windowed = (
            first is not None and last is not None and last[1] - first[1] >= rows // 2 and last[0] > first[0]
        )
        stack_whole = sum(v - stack_before[pid] for pid, v in samples[-1][3].items() if pid in stack_before)
        whole = {
            "rollouts_per_s": rows / wall,
            "cpu_ms_per_rollout": (samples[-1][2] + stack_whole) / rows * 1000,
            "collector_cpu_ms_per_rollout": samples[-1][2] / rows * 1000,
        }
        if windowed:
            assert first is not None and last is not None
            done, seconds = last[1] - first[1], last[0] - first[0]
            collector_delta = last[2] - first[2]
            stack_delta = sum(v - first[3][pid] for pid, v in last[3].items() if pid in first[3])
            window = "10% to 90% result row"
        else:  # results written at the end: the collector's whole run
            done, seconds = rows, wall
            collector_delta = samples[-1][2]
            stack_delta = stack_whole
            window = "whole collector run"
        shutil.rmtree(out_dir, ignore_errors=True)
        return {
            "rollouts_per_s": done / seconds,
            "cpu_ms_per_rollout": (collector_delta + stack_delta) / done * 1000,
            "collector_cpu_ms_per_rollout": collector_delta / done * 1000,
            "stack_cpu_ms_per_rollout": stack_delta / done * 1000,
            "window": window,
            "collector_wall_s": wall,
            "mean_reward": sum(rewards) / len(rewards),
            "whole_run": whole,
        }

    def latency_c1(self, rows: list[bytes], requests: int) -> list[float]:
        """Seconds per ``/run`` posted one at a time over one kept-alive connection."""
        parts = urlsplit(self.urls[AGENT])
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        headers = {"Content-Type": "application/json"}
        latencies = []
        try:
            for i in range(requests + 20):
                body = rows[i % len(rows)]
                started = time.perf_counter()
                conn.request("POST", "/run", body=body, headers=headers)
                resp = conn.getresponse()
                answer = resp.read()
                elapsed = time.perf_counter() - started
                if resp.status != 200 or json.loads(answer).get("reward") != 1.0:
                    raise RuntimeError(f"{self.label}: /run answered {resp.status}: {answer[:500]!r}")
                if i >= 20:  # the first 20 warm up
                    latencies.append(elapsed)
        finally:
            conn.close()
        return latencies


def ours() -> System:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NEMO_GYM_AUTH_TOKEN", None)
    return System(
        label="ours",
        python=sys.executable,
        tree=ROOT,
        env=env,
        ng_run=[str(bin_dir / "ng_run")],
        ng_collect_rollouts=[str(bin_dir / "ng_collect_rollouts")],
    )


def nemo_gym(tree: Path | None, venv: Path | None, work: Path) -> tuple[System | None, str | None]:
    """NeMo Gym's side, or None and why it is skipped."""
    if tree is None or venv is None:
        return None, "no --nemo-gym-tree / --nemo-gym-venv given"
    python = venv / "bin" / "python"
    if not (tree / "nemo_gym" / "cli" / "legacy.py").is_file():
        return None, f"{tree} is not a NeMo Gym source tree (no nemo_gym/cli/legacy.py)"
    if not python.exists():
        return None, f"{venv} has no bin/python"
    probe = subprocess.run(
        [str(python), "-c", "import nemo_gym.cli.legacy, ray, fastapi, openai; print(nemo_gym.__file__)"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return None, f"NeMo Gym does not import with {python}: {probe.stderr.strip()[-500:]}"
    # NeMo Gym's example_single_tool_call config also starts an environment server (legacy_agent);
    # it runs (as a NeMo Gym user gets it) and is counted with the stack.
    for server_dir in (*SERVER_DIRS, "environment_servers/legacy_agent"):
        link = tree / server_dir / ".venv"
        if not link.exists():
            if not os.access(tree / server_dir, os.W_OK):
                return None, f"{tree / server_dir} is read-only: copy the tree somewhere writable"
            link.symlink_to(venv)
    ray_tmpdir = tempfile.mkdtemp(prefix="ngray_", dir="/tmp")  # Ray's socket paths must stay short
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv),
        "RAY_TMPDIR": ray_tmpdir,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_NODE_IP_ADDRESS": "127.0.0.1",
    }
    env.pop("NEMO_GYM_AUTH_TOKEN", None)
    version = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, pathlib, sys; "
            "d = [p for p in pathlib.Path(sys.argv[1]).glob('nemo_gym-*.dist-info')]; print(d[0].name if d else '?')",
            str(tree),
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    prefix = [str(python), "-c"]
    system = System(
        label="nemo_gym",
        python=str(python),
        tree=tree,
        env=env,
        ng_run=prefix + [NEMO_GYM_COMMAND.format(name="ng_run")],
        ng_collect_rollouts=prefix + [NEMO_GYM_COMMAND.format(name="ng_collect_rollouts")],
        ray_tmpdir=ray_tmpdir,
    )
    system.results["version"] = version.removesuffix(".dist-info")
    return system, None


def stop_all(systems: list[System]) -> None:
    """Stop every system's stack and remove its private Ray directory."""
    for s in systems:
        s.stop()
        if s.ray_tmpdir:
            shutil.rmtree(s.ray_tmpdir, ignore_errors=True)


def load_rows(tree: Path | None) -> list[bytes]:
    source = ROOT / "resources_servers/example_single_tool_call/data/example.jsonl"
    if (
        tree is not None
        and (tree / "resources_servers/example_single_tool_call/data/example.jsonl").is_file()
    ):
        source = tree / "resources_servers/example_single_tool_call/data/example.jsonl"
    return [line for line in source.read_bytes().splitlines() if line.strip()]


def measure_round(
    s: System,
    policy_port: int,
    work: Path,
    input_path: Path,
    warm_input: Path,
    warm_rows: int,
    rows: list[bytes],
    args: argparse.Namespace,
) -> None:
    """Start ``s``, measure everything once, stop it."""
    seconds = s.start(policy_port, work)
    try:
        time.sleep(1.0)  # let start-up work settle before reading memory
        s.results["startup_s"].append(seconds)
        s.results["rss_after_start_mib"].append(s.rss_mib())
        before, started = s.cpu_snapshot(), time.perf_counter()
        time.sleep(5.0)
        after, idle_s = s.cpu_snapshot(), time.perf_counter() - started
        idle = sum(v - before[pid] for pid, v in after.items() if pid in before) / idle_s * 100
        s.results["idle_cpu_percent"].append(idle)
        print(
            f"{s.label}: start-up {seconds:.2f} s, RSS {s.rss_mib():.0f} MiB, idle CPU {idle:.1f}%",
            flush=True,
        )
        cpu_before = s.cpu_snapshot()
        lat = sorted(s.latency_c1(rows, args.latency_requests))
        cpu_after = s.cpu_snapshot()
        c1_cpu = sum(v - cpu_before[pid] for pid, v in cpu_after.items() if pid in cpu_before)
        s.results["c1_cpu_ms_per_rollout"].append(c1_cpu / (args.latency_requests + 20) * 1000)
        p50 = lat[len(lat) // 2] * 1000
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        s.results["latency_p50_ms"].append(p50)
        s.results["latency_p99_ms"].append(p99)
        print(
            f"{s.label}: /run at c=1 p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
            f"stack CPU {s.results['c1_cpu_ms_per_rollout'][-1]:.2f} ms/rollout",
            flush=True,
        )
        s.collect(warm_input, warm_rows, 64, work)  # the collector path warmed up (pools, caches)
        for concurrency in args.concurrency:
            r = s.collect(input_path, args.rows, concurrency, work)
            s.results["runs"].setdefault(str(concurrency), []).append(r)
            print(
                f"{s.label}: c={concurrency} {r['rollouts_per_s']:.1f} rollouts/s, "
                f"{r['cpu_ms_per_rollout']:.2f} CPU ms/rollout (collector {r['collector_cpu_ms_per_rollout']:.2f}, "
                f"stack {r['stack_cpu_ms_per_rollout']:.2f}; {r['window']}), mean reward {r['mean_reward']:.2f}",
                flush=True,
            )
        s.results["rss_after_last_run_mib"].append(s.rss_mib())
    finally:
        s.stop()


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nemo-gym-tree", type=Path, default=None)
    parser.add_argument("--nemo-gym-venv", type=Path, default=None)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--latency-requests", type=int, default=300)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_vs_ng_"))
    systems = [ours()]
    other, skipped = nemo_gym(args.nemo_gym_tree, args.nemo_gym_venv, work)
    if other is None:
        print(f"NeMo Gym side skipped: {skipped}", flush=True)
    else:
        systems.append(other)
    rows = load_rows(args.nemo_gym_tree)
    input_path = work / "input.jsonl"
    input_path.write_bytes(b"".join(rows[i % len(rows)] + b"\n" for i in range(args.rows)))

    policy_port = free_port()
    policy = subprocess.Popen([sys.executable, "-c", POLICY_SERVER, str(policy_port)])
    results: dict[str, Any] = {
        "rows": args.rows,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
        "nemo_gym_skipped": skipped,
        "systems": {},
    }
    failed = True
    try:
        wait_for_port(policy_port)
        for s in systems:
            s.results.update(
                startup_s=[],
                rss_after_start_mib=[],
                rss_after_last_run_mib=[],
                idle_cpu_percent=[],
                c1_cpu_ms_per_rollout=[],
                latency_p50_ms=[],
                latency_p99_ms=[],
                runs={},
            )
        warm_rows = min(args.rows, 200)
        warm_input = work / "warm_up.jsonl"
        warm_input.write_bytes(b"".join(rows[i % len(rows)] + b"\n" for i in range(warm_rows)))
        # Rounds: in each, one system after the other is started, measured and stopped, so that
        # one system's idle processes (Ray's daemons poll) do not load the other's measurement.
        for _ in range(args.repeats):
            for s in systems:
                measure_round(s, policy_port, work, input_path, warm_input, warm_rows, rows, args)
        failed = False
    finally:
        stop_all(systems)
        policy.terminate()
        policy.wait()
        if failed:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    results["load_avg_at_end"] = os.getloadavg()

    summary: dict[str, dict[str, float]] = {}
    for s in systems:
        r = s.results
        row = {
            "startup_s": median(r["startup_s"]),
            "rss_after_start_mib": median(r["rss_after_start_mib"]),
            "rss_after_last_run_mib": median(r["rss_after_last_run_mib"]),
            "idle_cpu_percent": median(r["idle_cpu_percent"]),
            "latency_p50_ms": median(r["latency_p50_ms"]),
            "latency_p99_ms": median(r["latency_p99_ms"]),
            "c1_cpu_ms_per_rollout": median(r["c1_cpu_ms_per_rollout"]),
        }
        for c, runs in r["runs"].items():
            row[f"rollouts_per_s_c{c}"] = median([x["rollouts_per_s"] for x in runs])
            row[f"cpu_ms_per_rollout_c{c}"] = median([x["cpu_ms_per_rollout"] for x in runs])
            row[f"collector_cpu_ms_per_rollout_c{c}"] = median(
                [x["collector_cpu_ms_per_rollout"] for x in runs]
            )
            row[f"whole_rollouts_per_s_c{c}"] = median([x["whole_run"]["rollouts_per_s"] for x in runs])
            row[f"whole_cpu_ms_per_rollout_c{c}"] = median(
                [x["whole_run"]["cpu_ms_per_rollout"] for x in runs]
            )
        summary[s.label] = row
        results["systems"][s.label] = {**r, "median": row}

    names = [s.label for s in systems]
    version = systems[1].results.get("version") if len(systems) > 1 else None
    print(
        f"\n{args.rows} rows, medians of {args.repeats}, {os.cpu_count()} CPUs"
        + (f", NeMo Gym {version}" if version else "")
        + f"; load average {results['load_avg_at_start'][0]:.1f} → {results['load_avg_at_end'][0]:.1f}"
    )
    header = "| | " + " | ".join(names) + (" | ratio |" if len(names) > 1 else " |")
    print(header)
    print("|---" * (len(names) + 1 + (len(names) > 1)) + "|")

    def line(title: str, key: str, fmt: str, higher_better: bool) -> None:
        values = [summary[n][key] for n in names]
        cells = " | ".join(format(v, fmt) for v in values)
        ratio = ""
        if len(values) > 1 and values[0] and values[1]:
            ratio = f" | {values[0] / values[1] if higher_better else values[1] / values[0]:.1f}×"
        print(f"| {title} | {cells}{ratio} |")

    for c in args.concurrency:
        line(f"rollouts/s, own collector, c={c}", f"rollouts_per_s_c{c}", ".1f", True)
    for c in args.concurrency:
        line(f"CPU ms/rollout, stack + collector, c={c}", f"cpu_ms_per_rollout_c{c}", ".2f", False)
    for c in args.concurrency:
        line(f"  of which the collector, c={c}", f"collector_cpu_ms_per_rollout_c{c}", ".2f", False)
    for c in args.concurrency:
        line(f"rollouts/s, collector start to exit, c={c}", f"whole_rollouts_per_s_c{c}", ".1f", True)
    for c in args.concurrency:
        line(
            f"CPU ms/rollout, collector start to exit, c={c}", f"whole_cpu_ms_per_rollout_c{c}", ".2f", False
        )
    line("/run p50 at c=1 (ms)", "latency_p50_ms", ".2f", False)
    line("/run p99 at c=1 (ms)", "latency_p99_ms", ".2f", False)
    line("stack CPU ms per rollout at c=1", "c1_cpu_ms_per_rollout", ".2f", False)
    line("start-up to all answering (s)", "startup_s", ".2f", False)
    line("RSS after start (MiB)", "rss_after_start_mib", ".0f", False)
    line(f"RSS after c={args.concurrency[-1]} (MiB)", "rss_after_last_run_mib", ".0f", False)
    line("CPU of the idle stack (% of one core)", "idle_cpu_percent", ".1f", False)
    print("(policy server's CPU and memory not counted)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
