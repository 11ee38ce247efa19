"""The reproducibility lock: written by a collection, checked on resume, differences named."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from nemo_gym.collection.run_lock import RunLock, check_or_write_lock, lock_path
from nemo_gym.launch.config import ConfigError
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.testing import running_stack
from nemo_gym.viewer.collection import Collection

ROOT = Path(__file__).resolve().parents[1]
ENV = "resources_servers/example_single_tool_call"
CONFIGS = [
    f"{ENV}/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"


def _config() -> dict[str, Any]:
    return {
        "example_single_tool_call": {
            "resources_servers": {"example_single_tool_call": {"entrypoint": "app.py"}}
        },
        "policy_model": {"responses_api_models": {"scripted_model": {"model_name": "m", "port": 1234}}},
    }


def test_a_changed_file_in_a_server_folder_is_named(tmp_path: Path):
    root = tmp_path / "repo"
    shutil.copytree(ROOT / ENV, root / ENV, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "responses_api_models/scripted_model").mkdir(parents=True)
    (root / "responses_api_models/scripted_model/app.py").write_text("x = 1\n")
    data = tmp_path / "rows.jsonl"
    data.write_text('{"responses_create_params": {"input": "hi"}}\n')
    before = RunLock.compute(_config(), data, root=root)
    assert set(before.folders) == {ENV, "responses_api_models/scripted_model"}
    assert before.model == {"policy_model.responses_api_models.scripted_model.model_name": "m"}

    # A port that differs from start to start is not a difference; an edited verifier is.
    moved = _config()
    moved["policy_model"]["responses_api_models"]["scripted_model"]["port"] = 4321
    assert before.differences(RunLock.compute(moved, data, root=root)) == []
    app = root / ENV / "app.py"
    app.write_text(app.read_text() + "\n# reward everything\n")
    (root / ENV / "new_helper.py").write_text("")
    diffs = before.differences(RunLock.compute(_config(), data, root=root))
    assert diffs == [f"file {ENV}/app.py: changed", f"file {ENV}/new_helper.py: added"]

    out = tmp_path / "x.jsonl"
    check_or_write_lock(out, before, resume=False)
    with pytest.raises(ConfigError, match=f"file {ENV}/app.py: changed"):
        check_or_write_lock(out, RunLock.compute(_config(), data, root=root), resume=True)
    check_or_write_lock(out, RunLock.compute(_config(), data, root=root), resume=True, force=True)
    recorded = orjson.loads(lock_path(out).read_bytes())
    assert recorded["overrides"][0]["forced_resume_differences"] == diffs


def _collect(stack: Any, rows: Path, out: Path, **extra: Any) -> Any:
    return asyncio.run(
        RolloutCollectionHelper().run_from_config(
            {
                "head_server": stack.head_server_config,
                "agent_name": AGENT,
                "input_jsonl_fpath": str(rows),
                "output_jsonl_fpath": str(out),
                "disable_aggregation": True,
                **extra,
            },
            verbose=False,
        )
    )


def test_collection_writes_its_lock_and_a_resume_on_changed_data_is_refused(tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    lines = (ROOT / ENV / "data/example.jsonl").read_bytes().splitlines()
    rows.write_bytes(b"\n".join(lines[:2]) + b"\n")
    out = tmp_path / "x.jsonl"
    with running_stack(CONFIGS) as stack:
        assert _collect(stack, rows, out).succeeded == 2
        lock = orjson.loads(lock_path(out).read_bytes())
        assert {ENV, "responses_api_models/scripted_model", "responses_api_agents/simple_agent"} <= set(
            lock["folders"]
        )
        assert lock["data_file"]["path"] == str(rows.resolve())
        # The viewer's overview shows what the collection was made from.
        shown = Collection.open(out).overview()["provenance"]
        assert shown["job"] is None and shown["lock"]["folders"][ENV] == len(lock["folders"][ENV])
        assert shown["lock"]["data_file"]["sha256"] == lock["data_file"]["sha256"]
        # A row appended is not a change to what was collected: the resume collects it.
        rows.write_bytes(b"\n".join(lines[:3]) + b"\n")
        assert _collect(stack, rows, out, resume_from_cache=True).succeeded == 1
        # A row that was collected and is now different: refused, naming the line; nothing runs.
        rows.write_bytes(b"\n".join([lines[0], lines[3], lines[2], lines[4]]) + b"\n")
        with pytest.raises(ConfigError, match=r"data file .*rows\.jsonl line 2: changed"):
            _collect(stack, rows, out, resume_from_cache=True)
        assert len(out.read_bytes().splitlines()) == 3
        summary = _collect(stack, rows, out, resume_from_cache=True, force_resume=True)
        assert summary.succeeded == 1 and len(out.read_bytes().splitlines()) == 4
