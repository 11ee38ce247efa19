"""``gym eval submit`` on a real two-node Slurm cluster (slurmd per network namespace).

The stack is spread over both nodes through a Ray service; a collection is requeued, cancelled
and resumed mid-run and ends with every rollout exactly once; a resume after the environment's
code changed is refused naming the file. Skips (saying why) without root or Slurm's packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from nemo_gym.orchestration.jobs import SubmissionRecord
from nemo_gym.testing.slurm_cluster import SlurmCluster, start_cluster, unavailable_reason
from nemo_gym.viewer.collection import Collection

ROOT = Path(__file__).resolve().parents[2]
GYM = str(Path(sys.executable).parent / "gym")
ENV = "example_single_tool_call"
ROWS = 5


def _submit_config(tmp: Path, config_paths: list[str], repeats: int, benchmark: str = "weather") -> Path:
    config = {
        "services": {
            "gym_ray": {
                "type": "ray",
                "node_pools": ["cpu"],
                "num_cpus": 2,
                "resources": {"cpu": {"gym_node": 1}},
            }
        },
        "compute": {
            "local": {
                "type": "slurm",
                "account": "test",
                "node_pools": {"cpu": {"partition": "debug", "nodes": 2}},
            }
        },
        "driver": {
            "benchmarks": {
                benchmark: {
                    "resumable": {"max_retries": 3},
                    "run": {
                        "config_paths": config_paths,
                        "agent_name": f"{ENV}_simple_agent",
                        "input_jsonl_fpath": f"resources_servers/{ENV}/data/example.jsonl",
                        "num_repeats": repeats,
                        "num_samples_in_parallel": 1,
                        "disable_aggregation": True,
                    },
                }
            }
        },
        "job": {"output_path": str(tmp / "runs")},
    }
    path = tmp / "submit.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"), nodes=2, tag=f"ng{uuid.uuid4().hex[:4]}")
    try:
        yield cluster
    finally:
        cluster.stop()


def gym(cluster: SlurmCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([GYM, *args], capture_output=True, text=True, env=cluster.env, timeout=120)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def record_of(run_root: Path) -> SubmissionRecord:
    (manifest,) = run_root.glob("gym-job-*/gym-job.json")
    return SubmissionRecord.load(orjson.loads(manifest.read_bytes()))


def results(record: SubmissionRecord) -> list[dict]:
    path = Path(record.benchmarks[0].job_dir) / "artifacts/rollouts.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            pass  # a line torn by the kill; the resume drops it
    return rows


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, logs: Path | None = None) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.5)
    shown = ""
    if logs is not None:
        for path in sorted(logs.glob("*.log")):
            shown += f"\n==> {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:])
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{shown}")


def state(cluster: SlurmCluster, job_id: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, env=cluster.env
    ).stdout
    fields = dict(t.split("=", 1) for t in out.split() if "=" in t)
    return f"{fields.get('JobState', '?')}/{fields.get('Restarts', '?')}"


def server_processes(cluster: SlurmCluster, index: int) -> list[str]:
    """Command lines of the stack's server processes in node ``index``'s network namespace."""
    pids = subprocess.run(
        ["ip", "netns", "pids", cluster.netns(index)], capture_output=True, text=True
    ).stdout
    found = []
    for pid in pids.split():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "app.py" in cmd and any(kind in cmd for kind in ("resources_servers/", "responses_api_")):
            found.append(cmd)
    return found


def test_dry_run_prints_the_batch_script_and_a_bad_config_names_its_field(tmp_path: Path):
    config = _submit_config(tmp_path, [f"resources_servers/{ENV}/configs/{ENV}.yaml"], 1)
    done = subprocess.run(
        [GYM, "eval", "submit", "--config", str(config), "--dry-run"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert "#SBATCH --nodes=2" in script and "#SBATCH --requeue" in script
    assert "ray start --head" in script and '--address="$gym_ray_address"' in script
    assert "+resume_from_cache=true" in script and "++head_server.port=0" in script
    assert not (tmp_path / "runs").exists()  # nothing staged

    data = yaml.safe_load(config.read_text())
    data["compute"]["local"]["node_pools"]["cpu"]["nodez"] = 2
    config.write_text(yaml.safe_dump(data))
    bad = subprocess.run([GYM, "eval", "submit", "--config", str(config)], capture_output=True, text=True)
    assert bad.returncode == 2 and "compute.local.node_pools.cpu.nodez" in bad.stderr, bad.stderr


@pytest.fixture
def probe_env(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A copy of the example environment under a folder name of its own (so the test may edit its
    code), and a config that runs it; removed afterwards."""
    probe = f"_lock_probe_{uuid.uuid4().hex[:6]}"
    folder = ROOT / "resources_servers" / probe
    shutil.copytree(
        ROOT / "resources_servers" / ENV,
        folder,
        ignore=shutil.ignore_patterns("tests", "__pycache__", "data"),
    )
    try:
        env_config = yaml.safe_load((folder / "configs" / f"{ENV}.yaml").read_text())
        env_config[ENV]["resources_servers"] = {probe: env_config[ENV]["resources_servers"][ENV]}
        config_path = tmp_path / "env.yaml"
        config_path.write_text(yaml.safe_dump(env_config))
        yield folder, str(config_path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(900)  # four job starts (each: scheduling, Ray on two nodes, the stack)
def test_a_submitted_collection_spreads_over_two_nodes_and_survives_requeue_cancel_and_a_refused_resume(
    slurm: SlurmCluster, tmp_path: Path, probe_env: tuple[Path, str]
):
    folder, env_config = probe_env
    repeats = 400
    total = ROWS * repeats
    configs = [env_config, "responses_api_models/scripted_model/configs/scripted_model.yaml"]
    submitted = gym(slurm, "eval", "submit", "--config", str(_submit_config(tmp_path, configs, repeats)))
    assert "Slurm job" in submitted.stdout
    record = record_of(tmp_path / "runs")
    logs = Path(record.benchmarks[0].job_dir) / "logs"
    first = record.benchmarks[0].job_id
    assert first is not None

    wait_for("the first 60 rollouts", lambda: len(results(record)) >= 60, 240, logs)
    # The stack's servers run on both nodes (each node is its own network namespace).
    on_nodes = [server_processes(slurm, 0), server_processes(slurm, 1)]
    assert on_nodes[0] and on_nodes[1], on_nodes

    # Preempted: Slurm requeues the job, which runs again and continues from its results.
    subprocess.run(["scontrol", "requeue", first], check=True, env=slurm.env)
    wait_for("the requeued job to run again", lambda: state(slurm, first) == "RUNNING/1", 120, logs)
    before = len(results(record))
    wait_for("progress after the requeue", lambda: len(results(record)) >= before + 60, 240, logs)

    cancelled = gym(slurm, "eval", "cancel", record.gym_job_id)
    assert first in cancelled.stdout
    wait_for("the cancel", lambda: state(slurm, first).startswith("CANCELLED"), 60, logs)
    kept = len(results(record))
    assert kept < total
    assert "CANCELLED" in gym(slurm, "eval", "status", record.gym_job_id).stdout

    # The environment's code changed since: the resumed job refuses, naming the file, adds nothing.
    app = folder / "app.py"
    original = app.read_text()
    app.write_text(original + "\n# changed after the run started\n")
    gym(slurm, "eval", "resume", record.gym_job_id)
    record = record_of(tmp_path / "runs")
    second = record.benchmarks[0].job_id
    refused = gym(slurm, "eval", "status", record.gym_job_id, "--wait", "240").stdout
    assert "FAILED" in refused, refused
    driver = (logs / f"driver-{second}.log").read_text()
    assert (
        "refusing to resume" in driver and f"file resources_servers/{folder.name}/app.py: changed" in driver
    )
    assert len(results(record)) == kept

    # Restored: the resume finishes the run with every rollout exactly once.
    app.write_text(original)
    assert "Slurm job" in gym(slurm, "eval", "resume", record.gym_job_id).stdout
    record = record_of(tmp_path / "runs")
    assert record.benchmarks[0].previous_job_ids == [first, second]
    final = gym(slurm, "eval", "status", record.gym_job_id, "--wait", "300").stdout
    assert "COMPLETED" in final, final + "\n" + gym(slurm, "eval", "logs", record.gym_job_id).stdout
    rows = results(record)
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == total  # nothing lost, nothing twice
    assert all(r["reward"] == 1.0 for r in rows)
    job_log = gym(slurm, "eval", "logs", record.gym_job_id, "--service", "job", "--tail", "0").stdout
    assert f"gym: job {first} (restart 1)" in job_log
    # The viewer shows the submission record and the run lock beside the results.
    shown = Collection.open(Path(record.benchmarks[0].job_dir) / "artifacts/rollouts.jsonl").overview()[
        "provenance"
    ]
    assert shown["job"]["gym_job_id"] == record.gym_job_id
    assert shown["job"]["benchmarks"][0]["previous_job_ids"] == [first, second]
    assert f"resources_servers/{folder.name}" in shown["lock"]["folders"]


def test_slurm_clients_missing_is_a_clear_error(tmp_path: Path):
    config = _submit_config(tmp_path, [f"resources_servers/{ENV}/configs/{ENV}.yaml"], 1)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    done = subprocess.run(
        [GYM, "eval", "submit", "--config", str(config)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 1 and "sbatch is not on PATH" in done.stdout, done.stdout + done.stderr
