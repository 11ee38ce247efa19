"""The Ray backend on a real three-node Ray cluster on this machine (127.0.0.1 only).

A head node without CPUs and two worker nodes, each with its own custom resource: replicas land
where their ``ray_placement`` says, a collection uses replicas on both workers, a worker lost
mid-run costs no rollout after a resume, and stopping the stack leaves no process or actor.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from nemo_gym.launch.config import ConfigError, load_config, project_root
from nemo_gym.launch.launcher import StackHandle
from nemo_gym.testing import collector_argv, distinct_example_rows, write_jsonl

ray = pytest.importorskip("ray", reason="the Ray backend needs the [ray] extra (pip install -e '.[ray]')")

from nemo_gym.launch.ray_backend import Placement, RayBackend, default_backend, wants_ray  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = project_root()
ENV = "resources_servers/example_single_tool_call"
CONFIGS = [
    f"{ENV}/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"
RESOURCES = "example_single_tool_call.resources_servers.example_single_tool_call"
AGENT_BLOCK = f"{AGENT}.responses_api_agents.simple_agent"
MODEL = "policy_model.responses_api_models.scripted_model"
SMALL_STORE = 80 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray then takes the loopback address as every node's address (and so do the processes the
    # nodes start, through the environment): nothing leaves 127.0.0.1.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    node = {"node_ip_address": "127.0.0.1", "object_store_memory": SMALL_STORE, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "num_cpus": 0})
    node_a = cluster.add_node(**node, num_cpus=4, resources={"node_a": 4})
    node_b = cluster.add_node(**node, num_cpus=4, resources={"node_b": 4})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield {"cluster": cluster, "a": node_a.node_id, "b": node_b.node_id, "node_b": node_b}
    finally:
        ray.shutdown()
        cluster.shutdown()


def stack_config(*overrides: str) -> dict[str, Any]:
    argv = ["+config_paths=[" + ",".join(CONFIGS) + "]", "++head_server.port=0", "++server_backend=ray"]
    return load_config([*argv, *overrides])


def instances(handle: StackHandle) -> list[dict[str, Any]]:
    return [r.as_dict() for r in handle.stack.head.registry.all()]


def cpu_available_settles(total: float, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0.0) >= total:
            return True
        time.sleep(0.2)
    return False


def collector(handle: StackHandle, source: Path, out: Path, *extra: str) -> list[str]:
    port = handle.head_server_config["port"]
    options = ("+num_samples_in_parallel=32", "++max_failure_ratio=1.0", *extra)
    return collector_argv(port, AGENT, source, out, *options)


def collect(handle: StackHandle, source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(collector(handle, source, out, *extra), cwd=ROOT, capture_output=True, timeout=240)


def test_backend_choice_and_placement_errors() -> None:
    base = {"a": {"resources_servers": {"x": {}}}}
    assert not wants_ray(base)
    assert not wants_ray({**base, "ray_head_node_address": "127.0.0.1:6379"})  # a trainer's own cluster
    assert wants_ray(
        {"ray_head_node_address": "auto", "a": {"resources_servers": {"x": {"ray_placement": {}}}}}
    )
    assert wants_ray({**base, "server_backend": "ray"})
    assert not isinstance(default_backend(base), RayBackend)
    with pytest.raises(ConfigError, match="server_backend"):
        wants_ray({**base, "server_backend": "kubernetes"})
    with pytest.raises(ConfigError, match="'x': ray_placement.strategy"):
        Placement.of("x", {"ray_placement": {"strategy": "STRICT_ANYWHERE"}})
    with pytest.raises(ConfigError, match="num_cpus"):
        Placement.of("x", {"ray_placement": {"num_cpus": "two"}})
    assert Placement.of("x", {"ray_placement": {"resources": {"node_a": 1}, "memory_mb": 64}}).bundle() == {
        "CPU": 0.5,
        "node_a": 1.0,
        "memory": 64 * 1024 * 1024.0,
    }


def test_replicas_land_where_placed_and_a_collection_uses_both_workers(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    total_cpu = ray.cluster_resources()["CPU"]
    config = stack_config(
        f"++{RESOURCES}.num_workers=2",
        f"++{RESOURCES}.ray_placement.strategy=PACK",
        f"++{RESOURCES}.ray_placement.resources.node_a=1",
        f"++{MODEL}.ray_placement.resources.node_b=1",
        f"++{AGENT_BLOCK}.num_workers=2",
        f"++{AGENT_BLOCK}.ray_placement.strategy=SPREAD",
        f"++{AGENT_BLOCK}.ray_placement.num_cpus=2",
    )
    handle = StackHandle.start(config, backend=RayBackend(cluster["cluster"].address))
    pids = []
    try:
        listed = instances(handle)
        by_name: dict[str, list[dict[str, Any]]] = {}
        for item in listed:
            by_name.setdefault(item["name"], []).append(item)
        assert {r["node_id"] for r in by_name["example_single_tool_call"]} == {cluster["a"]}
        assert {r["node_id"] for r in by_name["policy_model"]} == {cluster["b"]}
        assert {r["node_id"] for r in by_name[AGENT]} == {cluster["a"], cluster["b"]}  # 2 CPUs each: spread
        assert all(r["node_ip"] == "127.0.0.1" for r in listed)
        pids = [r["pid"] for r in listed]
        agents = {r["node_id"]: psutil.Process(r["pid"]) for r in by_name[AGENT]}
        before = {node: p.cpu_times().user + p.cpu_times().system for node, p in agents.items()}

        out = tmp_path / "out.jsonl"
        done = collect(handle, write_jsonl(tmp_path / "in.jsonl", distinct_example_rows(ENV, 500)), out)
        assert done.returncode == 0, done.stdout.decode()[-2000:]
        rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
        assert len(rows) == 500 and all(r["reward"] == 1.0 for r in rows)
        used = {node: p.cpu_times().user + p.cpu_times().system - before[node] for node, p in agents.items()}
        assert all(seconds > 0.05 for seconds in used.values()), used  # both workers' agents served rollouts
    finally:
        handle.stop()
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert cpu_available_settles(total_cpu), "actors still hold CPUs after the stack stopped"


def test_a_worker_lost_mid_run_costs_no_rollout_after_resume(cluster: dict[str, Any], tmp_path: Path) -> None:
    config = stack_config(
        f"++{RESOURCES}.num_workers=2",
        f"++{RESOURCES}.ray_placement.strategy=SPREAD",
        f"++{RESOURCES}.ray_placement.num_cpus=1",
        f"++{MODEL}.ray_placement.resources.node_a=1",
        f"++{AGENT_BLOCK}.ray_placement.resources.node_a=1",
    )
    handle = StackHandle.start(config, backend=RayBackend(cluster["cluster"].address))
    try:
        on_b = [r for r in instances(handle) if r["node_id"] == cluster["b"]]
        assert [r["name"] for r in on_b] == ["example_single_tool_call"]
        rows = 1500
        source = write_jsonl(tmp_path / "in.jsonl", distinct_example_rows(ENV, rows))
        out = tmp_path / "out.jsonl"
        argv_proc = subprocess.Popen(
            collector(handle, source, out), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out.exists() and len(out.read_bytes().splitlines()) > 50):
            time.sleep(0.02)
        cluster["cluster"].remove_node(cluster["node_b"], allow_graceful=False)
        lost_at = time.monotonic()
        while any(r["node_id"] == cluster["b"] for r in instances(handle)):
            assert time.monotonic() - lost_at < 5.0, "replicas of the lost node are still registered"
            time.sleep(0.05)
        print(f"replicas of the lost node left the registry after {time.monotonic() - lost_at:.2f} s")
        argv_proc.communicate(timeout=240)
        first = len(out.read_bytes().splitlines())
        # The lost replica is started again where Ray can place it (node a).
        deadline = time.monotonic() + 60
        while len([r for r in instances(handle) if r["name"] == "example_single_tool_call"]) < 2:
            assert time.monotonic() < deadline, "the lost replica was not restarted"
            time.sleep(0.2)
        assert {r["node_id"] for r in instances(handle)} == {cluster["a"]}
        resumed = collect(handle, source, out, "+resume_from_cache=true")
        assert resumed.returncode == 0, resumed.stdout.decode()[-2000:]
        keys = [orjson.loads(line)["_ng_task_index"] for line in out.read_bytes().splitlines()]
        assert sorted(keys) == list(range(rows)), f"{first} rows before the resume"
        assert all(orjson.loads(line)["reward"] == 1.0 for line in out.read_bytes().splitlines())
        handle.poll()  # the stack is still healthy
    finally:
        handle.stop()
