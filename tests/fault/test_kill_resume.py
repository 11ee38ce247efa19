"""kill -9 of each server of a real stack mid-collection, then a fresh stack and a resume.

The operator's path: a server dies, the run finishes with its rollouts as classified failures
(never scored), the stack is started again, ``+resume_from_cache=true`` finishes the rest. At
the end every rollout is in the results exactly once and the failures file is empty. (The
collector's own kill -9 is covered by ``tests/test_collect_faults.py``.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from nemo_gym.collection.collection_io import CollectionPaths
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import read_jsonl, running_stack

ENV = "resources_servers/example_single_tool_call"
CONFIGS = [
    f"{ENV}/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"
ROWS = 40


def rows_file(path: Path) -> Path:
    template = orjson.loads(
        (Path(__file__).parents[2] / ENV / "data" / "example.jsonl").read_bytes().splitlines()[0]
    )
    lines = []
    for i in range(ROWS):
        row = orjson.loads(orjson.dumps(template))
        row["responses_create_params"]["input"][-1]["content"] = f"What is the weather in city {i}?"
        lines.append(orjson.dumps(row) + b"\n")
    path.write_bytes(b"".join(lines))
    return path


def collect(stack: Any, source: Path, out: Path, resume: bool) -> Any:
    return asyncio.run(
        RolloutCollectionHelper().run_from_config(
            {
                "head_server": stack.head_server_config,
                "agent_name": AGENT,
                "input_jsonl_fpath": str(source),
                "output_jsonl_fpath": str(out),
                "num_samples_in_parallel": 4,
                "rollout_timeout_s": 30,
                "resume_from_cache": resume,
                "disable_aggregation": True,
            },
            verbose=False,
        )
    )


def server_pid(stack: Any, name: str) -> int:
    async def lookup() -> int:
        client = ServerClient(f"http://{stack.head_server_config['host']}:{stack.head_server_config['port']}")
        try:
            (pid,) = {i.pid for i in await client.server_instances() if i.name == name}
            return pid
        finally:
            await client.close()

    return asyncio.run(lookup())


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["policy_model", "example_single_tool_call", AGENT])
def test_kill_9_of_a_server_then_restart_and_resume_loses_and_duplicates_nothing(tmp_path: Path, victim: str):
    source = rows_file(tmp_path / "in.jsonl")
    out = tmp_path / "x.jsonl"
    with running_stack(CONFIGS) as stack:
        pid = server_pid(stack, victim)

        def kill_after_some_results() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if out.exists() and len(out.read_bytes().splitlines()) >= 8:
                    os.kill(pid, signal.SIGKILL)
                    return
                time.sleep(0.002)

        killer = threading.Thread(target=kill_after_some_results)
        killer.start()
        first = collect(stack, source, out, resume=False)
        killer.join()
    assert 8 <= first.succeeded < ROWS and first.succeeded + first.failed == ROWS
    assert set(first.failures_by_class) == {"unreachable"}, first.failures_by_class
    failures = read_jsonl(CollectionPaths.for_output(out).failures)
    assert all("reward" not in f for f in failures)

    with running_stack(CONFIGS) as stack:
        second = collect(stack, source, out, resume=True)
    assert second.failed == 0 and second.succeeded == first.failed
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(out)]
    assert sorted(keys) == [(t, 0) for t in range(ROWS)]
    assert all(r["reward"] == 1.0 for r in read_jsonl(out))
    assert CollectionPaths.for_output(out).failures.read_bytes() == b""
