"""Open-file limits: raised when allowed; under a low one, rollouts queue instead of failing."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from nemo_gym.collection.collection_io import CollectionPaths
from nemo_gym.launch.config import project_root
from nemo_gym.testing import read_jsonl, running_stack

ENV = "resources_servers/example_single_tool_call"
CONFIGS = [
    f"{ENV}/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"


def limited(soft: int, hard: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_soft_limit_is_raised_to_the_hard_limit():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 600:
        pytest.skip(f"the hard limit here is only {hard}")
    code = (
        "import json, resource\n"
        "from nemo_gym.serving.server_client import default_connection_limit\n"
        "cap = default_connection_limit()\n"
        "print(json.dumps([resource.getrlimit(resource.RLIMIT_NOFILE)[0], cap]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=project_root(),
        preexec_fn=limited(300, 600),
        check=True,
    )
    soft, cap = json.loads(done.stdout)
    assert soft == 600  # raised from 300
    assert cap == (600 - 256) // 2  # connections sized to it, leaving room for files and servers


def test_concurrency_far_above_the_fd_limit_queues_instead_of_failing(tmp_path: Path):
    template = orjson.loads((project_root() / ENV / "data" / "example.jsonl").read_bytes().splitlines()[0])
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({**template, "i": i}) + b"\n" for i in range(300)))
    out = tmp_path / "x.jsonl"
    with running_stack(CONFIGS) as stack:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "nemo_gym.rollout_collection",
                f"++head_server.port={stack.head_server_config['port']}",
                f"+agent_name={AGENT}",
                f"+input_jsonl_fpath={source}",
                f"+output_jsonl_fpath={out}",
                "+num_samples_in_parallel=1024",  # 4x the collector's whole fd limit
                "+disable_aggregation=true",
            ],
            capture_output=True,
            text=True,
            cwd=project_root(),
            preexec_fn=limited(256, 256),
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_jsonl(out)
    assert sorted(r["_ng_task_index"] for r in rows) == list(range(300))
    assert all(r["reward"] == 1.0 for r in rows)
    failures = CollectionPaths.for_output(out).failures
    assert not failures.exists() or failures.read_bytes() == b""
