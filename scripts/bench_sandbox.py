"""Sandbox start-up cost and the no-leak check (numbers go to docs/SANDBOX.md).

    python scripts/bench_sandbox.py                 # start-up + exec round trip, local (and docker if a daemon answers)
    python scripts/bench_sandbox.py --rollouts 1000 # + 1,000 sandboxed rollouts with a kill -9 in the middle
    python scripts/bench_sandbox.py --kernel-limits off          # local with polled quotas (the fallback)
    python scripts/bench_sandbox.py --provider podman --private-engine  # a private podman engine, offline image

Start-up: sandboxes started and stopped per second (one at a time, and ``--concurrency`` at
once), and the round trip of ``exec("true")`` (p50/p90) in a started sandbox.

Rollouts: a worker process runs sandboxed rollouts (start a sandbox, write a file, run a command
in it, check its output, stop) ``--concurrency`` at a time and notes each finished one. When half
are done the driver kills the worker with SIGKILL mid-exec, starts a new worker (its first
sandbox sweeps what the dead one left) that finishes the rest, and then counts what is left:
sandbox processes, working trees, owner records and (with docker) containers. Every count
should be 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, create_provider  # noqa: E402
from nemo_gym.sandbox.providers.docker.engine import request_sync, socket_path  # noqa: E402

MARKER = "ng_bench_rollout"


async def startup(provider_config: dict, count: int, concurrency: int, image: str | None) -> dict[str, float]:
    provider = create_provider(provider_config)
    spec = SandboxSpec(image=image)

    async def one() -> None:
        async with AsyncSandbox(provider, spec, owns_provider=False) as box:
            await box.start()

    await one()  # warm-up (and the sweep)
    started = time.perf_counter()
    for _ in range(count):
        await one()
    serial = count / (time.perf_counter() - started)
    semaphore = asyncio.Semaphore(concurrency)

    async def bounded() -> None:
        async with semaphore:
            await one()

    started = time.perf_counter()
    await asyncio.gather(*(bounded() for _ in range(count)))
    parallel = count / (time.perf_counter() - started)
    rtts = []
    async with AsyncSandbox(provider, spec, owns_provider=False) as box:
        await box.start()
        for _ in range(max(20, count)):
            t = time.perf_counter()
            await box.exec("true")
            rtts.append((time.perf_counter() - t) * 1000)
    await provider.aclose()
    rtts.sort()
    return {
        "sandboxes_per_s_serial": round(serial, 1),
        f"sandboxes_per_s_x{concurrency}": round(parallel, 1),
        "exec_rtt_p50_ms": round(statistics.median(rtts), 1),
        "exec_rtt_p90_ms": round(rtts[int(len(rtts) * 0.9)], 1),
    }


async def worker(provider_config: dict, todo: list[int], progress: Path, concurrency: int) -> None:
    """Run the rollouts ``todo``, appending each finished index to ``progress``."""
    provider = create_provider(provider_config)
    semaphore = asyncio.Semaphore(concurrency)

    async def rollout(index: int) -> None:
        async with semaphore:
            spec = SandboxSpec(files={"task.txt": f"{index}\n"}, metadata={"rollout": str(index)})
            async with AsyncSandbox(provider, spec, owns_provider=False) as box:
                await box.start()
                # A marker in the command line lets the driver find leftover processes.
                result = await box.exec(f": {MARKER}; sleep 0.2; echo $(( $(cat task.txt) * 2 ))")
                assert result.stdout == f"{index * 2}\n", result
            with progress.open("a") as f:
                f.write(f"{index}\n")

    await asyncio.gather(*(rollout(i) for i in todo))
    await provider.aclose()


def leftovers(trees: Path, state: Path, provider: str) -> dict[str, int]:
    import psutil

    procs = [p for p in psutil.process_iter(["cmdline"]) if MARKER in " ".join(p.info["cmdline"] or [])]
    counts = {
        "processes": len(procs),
        "working_trees": len(list(trees.iterdir())) if trees.is_dir() else 0,
        "owner_records": len(list(state.iterdir())) if state.is_dir() else 0,
    }
    if provider == "local":
        from nemo_gym.sandbox.isolation import kernel_limits

        mounts = Path("/proc/self/mounts").read_text().split()
        counts["tmpfs_mounts"] = sum(1 for m in mounts if m.startswith(str(trees) + "/"))
        pids_root = kernel_limits.machine_support().pids_root
        if pids_root:
            counts["pids_cgroups"] = sum(1 for p in Path(pids_root).iterdir() if p.is_dir())
    if provider != "local":
        listed = request_sync(socket_path(), "GET", "/containers/json?all=1")[1]
        counts["containers"] = sum(
            1 for c in json.loads(listed) if "nemo_gym.sandbox" in (c.get("Labels") or {})
        )
    return counts


def rollouts(args: argparse.Namespace, provider_config: dict) -> dict[str, object]:
    base = Path(tempfile.mkdtemp(prefix="ng_bench_sandbox_", dir="/tmp"))
    base.chmod(0o755)
    trees, state, progress = base / "trees", base / "state", base / "progress"
    progress.touch()
    if args.provider == "local":
        # Not under /tmp: the trees would be hidden by each sandbox's private /tmp.
        base = Path(tempfile.mkdtemp(prefix="ng_bench_sandbox_", dir="/var/tmp"))
        base.chmod(0o755)
        trees, state, progress = base / "trees", base / "state", base / "progress"
        progress.touch()
        provider_config = {"local": {**provider_config["local"], "workspace_root": str(trees)}}
    env = {**os.environ, "NEMO_GYM_SANDBOX_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}

    def spawn(todo: list[int]) -> subprocess.Popen[bytes]:
        payload = json.dumps({"config": provider_config, "todo": todo, "progress": str(progress)})
        argv = [sys.executable, __file__, "--worker", payload, "--concurrency", str(args.concurrency)]
        return subprocess.Popen(argv, env=env)

    def done() -> set[int]:
        return {int(line) for line in progress.read_text().split()}

    started = time.perf_counter()
    first = spawn(list(range(args.rollouts)))
    while len(done()) < args.rollouts // 2 and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = len(done())
    time.sleep(1.0)  # the parent-death signal has ended the dead worker's commands by now
    after_kill = leftovers(trees, state, args.provider)
    second = spawn(sorted(set(range(args.rollouts)) - done()))
    second.wait()
    elapsed = time.perf_counter() - started
    result = {
        "rollouts": args.rollouts,
        "finished": len(done()),
        "killed_after": killed_at,
        "second_worker_exit": second.returncode,
        "seconds": round(elapsed, 1),
        "left_right_after_kill_9": after_kill,
        "left_at_the_end": leftovers(trees, state, args.provider),
    }
    shutil.rmtree(base, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--provider", default="local", choices=["local", "docker", "podman"])
    parser.add_argument("--count", type=int, default=100, help="sandboxes started for the start-up numbers")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--image", default=None, help="image for docker/podman (default: the provider's)")
    parser.add_argument(
        "--rollouts", type=int, default=0, help="run this many rollouts with a kill -9 midway"
    )
    parser.add_argument(
        "--kernel-limits",
        default="auto",
        choices=["auto", "required", "off"],
        help="local: tmpfs + pids cgroup per sandbox (auto/required) or polled quotas (off)",
    )
    parser.add_argument(
        "--private-engine",
        action="store_true",
        help="docker/podman: start a private podman engine with an offline busybox image (needs root, podman, runc, busybox-static)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        asyncio.run(worker(job["config"], job["todo"], Path(job["progress"]), args.concurrency))
        return
    config: dict = {args.provider: {}}
    if args.provider == "local":
        config["local"]["kernel_limits"] = args.kernel_limits
    elif args.private_engine:
        from nemo_gym.testing.podman_engine import podman_engine

        with podman_engine(tempfile.mkdtemp(prefix="ng_bench_podman_", dir="/var/tmp")) as engine:
            config[args.provider] = {"socket": engine.socket, "pull": "never"}
            numbers = asyncio.run(startup(config, args.count, args.concurrency, args.image or engine.image))
            print(json.dumps({"provider": args.provider, "engine": "private podman", **numbers}))
        return
    if args.provider != "local":
        path = socket_path(podman=args.provider == "podman")
        try:
            request_sync(path, "GET", "/_ping", timeout_s=3)
        except OSError as exc:
            print(json.dumps({"provider": args.provider, "skipped": f"no engine answers at {path}: {exc}"}))
            return
    numbers = asyncio.run(startup(config, args.count, args.concurrency, args.image))
    extra = {"kernel_limits": args.kernel_limits} if args.provider == "local" else {}
    print(json.dumps({"provider": args.provider, **extra, **numbers}))
    if args.rollouts:
        print(json.dumps({"provider": args.provider, **rollouts(args, config)}))


if __name__ == "__main__":
    main()
