"""Collection under faults, with real processes on 127.0.0.1: the collector killed with SIGKILL
at random moments and resumed, a resources server killed mid-run, a server that never answers."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.collection.collection_io import CollectionPaths
from nemo_gym.launch.config import project_root
from nemo_gym.launch.launcher import free_port
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.serving.server import ENV_SERVER_CONFIG, HTTPError
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import (
    SyncClient,
    collector_argv,
    distinct_example_rows,
    running_agent,
    running_server,
    running_stack,
    write_jsonl,
)

ROOT = project_root()
ENV = "resources_servers/example_single_tool_call"
CONFIGS = [
    f"{ENV}/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"


def result_keys(path: Path) -> list[tuple[int, int]]:
    keys = []
    for line in path.read_bytes().splitlines(keepends=True):
        assert line.endswith(b"\n"), "a torn line was left in the results"
        row = orjson.loads(line)
        assert row["reward"] == 1.0
        keys.append((row["_ng_task_index"], row["_ng_rollout_index"]))
    return keys


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_loses_and_duplicates_nothing(tmp_path: Path):
    # Enough rows that no cycle can finish inside the kill window (0.12 s after its first write).
    rows = 400
    source = write_jsonl(tmp_path / "in.jsonl", distinct_example_rows(ENV, rows))
    out = tmp_path / "out" / "x.jsonl"
    expected = sorted((t, r) for t in range(rows) for r in range(3))
    rng = random.Random(1234)
    with running_stack(CONFIGS) as stack:
        port = stack.head_server_config["port"]
        argv = collector_argv(port, AGENT, source, out, "+num_repeats=3", "+num_samples_in_parallel=4")
        kills = 0
        for cycle in range(4):
            resume = ["+resume_from_cache=true"] if cycle else []
            proc = subprocess.Popen(argv + resume, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if cycle < 3:
                before = len(out.read_bytes().splitlines()) if out.exists() else 0
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and proc.poll() is None:
                    if out.exists() and len(out.read_bytes().splitlines()) > before:
                        break  # it is dispatching: kill it a random moment later
                    time.sleep(0.005)
                time.sleep(rng.uniform(0.0, 0.12))
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    kills += 1
            output, _ = proc.communicate(timeout=60)
            if cycle == 3:
                assert proc.returncode == 0, output.decode()
        assert kills >= 2  # the run really was interrupted mid-way
    keys = result_keys(out)
    assert sorted(keys) == expected  # every rollout exactly once
    assert len(set(keys)) == len(keys)
    paths = CollectionPaths.for_output(out)
    assert paths.failures.read_text() == ""
    (entry,) = json.loads(paths.aggregate_metrics.read_text())
    assert sum(g["count"] for g in entry["group_level_metrics"]) == rows * 3
    assert entry["agent_metrics"]["mean/reward"] == 1.0


@pytest.mark.slow
def test_a_resources_server_killed_mid_run_gives_classified_failures_and_the_run_finishes(tmp_path: Path):
    from responses_api_agents.simple_agent.app import SimpleAgent
    from responses_api_models.scripted_model.app import ScriptedModel

    port = free_port()
    env = {**os.environ, ENV_SERVER_CONFIG: json.dumps({"name": "example_single_tool_call", "port": port})}
    env.pop("NEMO_GYM_HEAD_URL", None)
    resources = subprocess.Popen([sys.executable, str(ROOT / ENV / "app.py")], env=env, cwd=ROOT)
    resources_url = f"http://127.0.0.1:{port}"
    try:
        with SyncClient() as probe:
            probe.wait_healthy(resources_url, timeout_s=20)
        with running_server(ScriptedModel({"name": "policy_model"})) as model_url:
            agent_client = ServerClient(
                static_urls={"example_single_tool_call": resources_url, "policy_model": model_url},
                connect_retries=1,
            )
            agent = SimpleAgent(
                {
                    "name": AGENT,
                    "resources_server": {"type": "resources_servers", "name": "example_single_tool_call"},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                },
                server_client=agent_client,
            )
            with running_server(agent) as agent_url:
                out = tmp_path / "x.jsonl"

                def kill_after_some_results() -> None:
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        if out.exists() and len(out.read_bytes().splitlines()) >= 8:
                            os.kill(resources.pid, signal.SIGKILL)
                            return
                        time.sleep(0.002)

                killer = threading.Thread(target=kill_after_some_results)
                killer.start()

                async def main() -> Any:
                    client = ServerClient(static_urls={AGENT: agent_url})
                    try:
                        return await RolloutCollectionHelper(server_client=client).run_from_config(
                            {
                                "agent_name": AGENT,
                                "input_jsonl_fpath": str(
                                    write_jsonl(tmp_path / "in.jsonl", distinct_example_rows(ENV, 60))
                                ),
                                "output_jsonl_fpath": str(out),
                                "num_samples_in_parallel": 2,
                                "rollout_timeout_s": 20,
                            }
                        )
                    finally:
                        await client.close()

                summary = asyncio.run(main())
                killer.join()
    finally:
        resources.kill()
        resources.wait()
    assert resources.returncode == -signal.SIGKILL
    results = result_keys(out)
    failures = [orjson.loads(line) for line in summary.paths.failures.read_bytes().splitlines()]
    assert 8 <= len(results) < 60 and len(results) + len(failures) == 60
    assert sorted(results + [(f["_ng_task_index"], f["_ng_rollout_index"]) for f in failures]) == [
        (t, 0) for t in range(60)
    ]
    # The agent reports that its resources server is unreachable (the class rides in its error body).
    assert {f["_ng_failure_class"] for f in failures} == {"unreachable"}
    assert all("example_single_tool_call" in f["_ng_error"] and "reward" not in f for f in failures)
    assert summary.failures_by_class == {"unreachable": len(failures)}
    (entry,) = json.loads(summary.paths.aggregate_metrics.read_text())  # resources server gone: local
    assert entry["agent_metrics"]["mean/reward"] == 1.0
    assert sum(g["count"] for g in entry["group_level_metrics"]) == len(results)


class JudgeEnv(SimpleResourcesServer):
    """A resources server whose verify, by row, passes, reports a failed judge, or hangs."""

    config: BaseResourcesServerConfig

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        mode = getattr(body, "mode", "ok")
        if mode == "judge":  # the class named in the error text only
            raise HTTPError(502, "judge_failed: the judge endpoint answered 503")
        if mode == "judge_body":  # the class as a field of the error body
            raise HTTPError(502, "the judge endpoint answered 503", failure_class="judge_failed")
        if mode == "hang":  # far past the deadline (bounded so the server can shut down)
            await asyncio.sleep(5.0)
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


def test_verify_failures_through_a_real_agent_are_classified(tmp_path: Path):
    from responses_api_agents.simple_agent.app import SimpleAgent
    from responses_api_models.scripted_model.app import ScriptedModel

    model = ScriptedModel({"name": "policy_model", "scripts": [{"turns": [{"text": "4"}]}]})
    env = JudgeEnv({"name": "judge_env"})
    with running_agent(
        env, model, agent_class=SimpleAgent, env_name="judge_env", model_name="policy_model"
    ) as agent_url:
        rows = [
            {"responses_create_params": {"input": "2+2?"}, "mode": m}
            for m in ("ok", "judge", "judge_body", "hang")
        ]

        async def main() -> Any:
            client = ServerClient(static_urls={"judge_agent": agent_url})
            try:
                return await RolloutCollectionHelper(
                    server_client=client
                ).run_from_config(
                    {
                        "agent_name": "judge_agent",
                        "input_jsonl_fpath": str(write_jsonl(tmp_path / "in.jsonl", rows)),
                        "output_jsonl_fpath": str(tmp_path / "x.jsonl"),
                        "rollout_timeout_s": 2.5,  # the hang is 5 s; a loaded machine still answers the rest in time
                    }
                )
            finally:
                await client.close()

        summary = asyncio.run(main())
    assert summary.succeeded == 1 and summary.failures_by_class == {"judge_failed": 2, "timeout": 1}
    failures = {f["mode"]: f for f in map(orjson.loads, summary.paths.failures.read_bytes().splitlines())}
    assert "judge_env" in failures["judge"]["_ng_error"] and "answered 503" in failures["judge"]["_ng_error"]
    assert failures["hang"]["_ng_failure_class"] == "timeout"
    (entry,) = json.loads(summary.paths.aggregate_metrics.read_text())  # through agent → judge_env
    assert entry["agent_metrics"]["mean/reward"] == 1.0 and entry["group_level_metrics"][0]["count"] == 1


def test_a_server_that_never_answers_is_cut_off_by_the_deadline(tmp_path: Path):
    # Accepts connections (the kernel completes the handshake) and never reads or answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        rows = [{"responses_create_params": {"input": f"q{i}"}} for i in range(3)]

        async def main() -> Any:
            client = ServerClient(static_urls={"silent": url})
            try:
                return await RolloutCollectionHelper(server_client=client).run_from_config(
                    {
                        "agent_name": "silent",
                        "input_jsonl_fpath": str(write_jsonl(tmp_path / "in.jsonl", rows)),
                        "output_jsonl_fpath": str(tmp_path / "x.jsonl"),
                        "rollout_timeout_s": 0.5,
                        "disable_aggregation": True,
                    }
                )
            finally:
                await client.close()

        started = time.monotonic()
        summary = asyncio.run(main())
        assert time.monotonic() - started < 3
    assert summary.failures_by_class == {"timeout": 3} and summary.succeeded == 0
    assert (tmp_path / "x.jsonl").read_text() == ""
    failures = [json.loads(line) for line in summary.paths.failures.read_text().splitlines()]
    assert all(f["_ng_failure_class"] == "timeout" and "0.5s" in f["_ng_error"] for f in failures)
