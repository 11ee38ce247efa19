"""CPU profile of one server's code in a running stack: a twin of it under cProfile, driven over /run.

Starts the stack from ``--config-paths`` (default: example_single_tool_call + simple_agent +
the scripted model), then, in this process, a second instance of the server ``--server``
(default the agent) from the same config, reaching the same head server and peers, on
``--port`` without registering. It profiles the twin with a CPU-time timer for ``--seconds``
while a client process posts ``/run`` rows of example_single_tool_call to it (``--in-flight``
at once), and prints the top functions and the CPU share per package.

Usage: python scripts/profile_server.py [--server NAME] [--config-paths a.yaml,b.yaml] [--port 18200]
       [--seconds 6] [--rollouts 3000] [--in-flight 64] [--out server.prof]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import importlib.util
import io
import os
import pstats
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DRIVER = textwrap.dedent(
    """
    import asyncio, sys, uuid, orjson, uvloop
    sys.path.insert(0, sys.argv[1])
    from nemo_gym.serving.server_client import ServerClient
    url, total, in_flight = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    row = orjson.loads(open(sys.argv[1] + "/resources_servers/example_single_tool_call/data/example.jsonl", "rb").readline())

    async def main():
        client = ServerClient(static_urls={"target": url})
        slots = asyncio.Semaphore(in_flight)

        async def one(i):
            async with slots:  # a rollout id per row, as the collector sends it
                await client.post("target", "/run", {**row, "i": i}, rollout_id=f"t{i}-r0-a0-{uuid.uuid4().hex[:8]}")

        await asyncio.gather(*(one(i) for i in range(total)))
        await client.close()

    uvloop.run(main())
    """
)


def package_of(filename: str) -> str:
    if "site-packages/" in filename:
        return filename.split("site-packages/")[1].split("/")[0]
    if str(ROOT) in filename:
        return filename.split(str(ROOT) + "/")[1]
    if "/lib/python3" in filename:
        return "stdlib"
    return filename  # "~": builtins


def summary(stats: pstats.Stats, top: int) -> str:
    """Top functions by own CPU time, then CPU share per package."""
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(top)
    shares: collections.Counter[str] = collections.Counter()
    for (filename, _, _), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        shares[package_of(filename)] += own
    total = sum(shares.values())
    out.write("\nOwn CPU time by package\n")
    for name, seconds in shares.most_common(20):
        out.write(f"{seconds:8.3f} s {seconds / total:6.1%}  {name}\n")
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", default="example_single_tool_call_simple_agent")
    parser.add_argument(
        "--config-paths",
        default="resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
        "responses_api_models/scripted_model/configs/scripted_model.yaml",
    )
    parser.add_argument("--port", type=int, default=18200)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rollouts", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("server.prof"))
    args = parser.parse_args()

    from nemo_gym.launch.config import load_config, server_instances
    from nemo_gym.launch.launcher import StackHandle
    from nemo_gym.serving.server import ENV_HEAD_URL, BaseServer
    from nemo_gym.serving.uvicorn_factory import loop_factory

    config = load_config([f"+config_paths=[{args.config_paths}]", "++head_server.port=0"], cwd=ROOT)
    instance = server_instances(config)[args.server]
    handle = StackHandle.start(config, log=lambda name, line: None)
    os.environ[ENV_HEAD_URL] = handle.head_url  # the twin finds its peers through the head server
    entrypoint = ROOT / instance.type / instance.impl / str(instance.fields.get("entrypoint", "app.py"))
    spec = importlib.util.spec_from_file_location("profiled_app", entrypoint)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["profiled_app"] = module
    spec.loader.exec_module(module)
    server_class = [
        c
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, BaseServer) and c.__module__ == "profiled_app"
    ][-1]
    server = server_class({**instance.fields, "name": instance.name})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    profile = cProfile.Profile(time.process_time)

    async def run() -> None:
        serving = asyncio.create_task(server.serve(sock, register=False, embedded=True))
        while getattr(server, "uvicorn_server", None) is None or not server.uvicorn_server.started:
            await asyncio.sleep(0.05)
        driver = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            DRIVER,
            str(ROOT),
            f"http://127.0.0.1:{args.port}",
            str(args.rollouts),
            str(args.in_flight),
            stdout=subprocess.DEVNULL,
        )
        await asyncio.sleep(1.0)  # warm-up: connections, caches
        profile.enable()
        await asyncio.sleep(args.seconds)
        profile.disable()
        await driver.wait()
        server.uvicorn_server.should_exit = True
        await serving

    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(run())
    finally:
        handle.stop()
    profile.dump_stats(args.out)
    print(summary(pstats.Stats(str(args.out)), args.top))


if __name__ == "__main__":
    main()
