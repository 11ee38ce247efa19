"""A row that names its own rollout (``_ng_rollout_id``) and is repeated: the repeats must not
share the id (every call of a rollout carries it in its ``/ng-rollout/<id>`` prefix, and
captured model calls are filed under it: shared, they would collide).

``ng_run`` (a subprocess) serves example_single_tool_call with the scripted policy;
``ng_collect_rollouts`` (a subprocess) runs one row carrying ``_ng_rollout_id`` three times. Each
repeat carries an id of its own, ``<id>-r<rollout index>``, and is recorded with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.testing import ng_run_process

pytestmark = pytest.mark.slow

ENV_DIR = "resources_servers/example_single_tool_call"
CONFIGS = [
    f"{ENV_DIR}/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
    f"{ENV_DIR}/configs/scripted_policy.yaml",
]


def test_repeats_of_a_row_with_its_own_rollout_id_do_not_share_it(tmp_path: Path) -> None:
    with open(f"{ENV_DIR}/data/example.jsonl", encoding="utf-8") as handle:
        row = json.loads(handle.readline())
    row["_ng_rollout_id"] = "trainer-step3.row0"
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(row) + "\n")
    out = tmp_path / "out.jsonl"
    env = {key: value for key, value in os.environ.items() if key != "NEMO_GYM_AUTH_TOKEN"}
    with ng_run_process(CONFIGS, env=env) as (_, head_url):
        port = head_url.rsplit(":", 1)[1]
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "ng_collect_rollouts"),
                "+agent_name=example_single_tool_call_simple_agent",
                f"+input_jsonl_fpath={source}",
                f"+output_jsonl_fpath={out}",
                "+num_repeats=3",
                f"++head_server.port={port}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["reward"] == 1.0 for r in rows), rows
    ids = sorted(r["_ng_rollout_id"] for r in rows)
    assert ids == [f"trainer-step3.row0-r{i}" for i in range(3)], ids
