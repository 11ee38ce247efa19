"""A collection's metrics and rollouts in Weights & Biases (offline run files) and MLflow (a local
file store), read back from the files the libraries wrote; a missing tracker package stops the
run before anything is collected.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
from nemo_gym.launch.config import ConfigError
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import read_jsonl, running_server, write_jsonl

AGENT = "scored"


class ScoredAgent(SimpleResponsesAPIAgent):
    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "response": {"output": []}, "reward": float(body["score"])}


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    with running_server(ScoredAgent({"name": AGENT})) as url:
        yield url


def collect(agent_url: str, tmp_path: Path, **options: Any) -> Any:
    rows = write_jsonl(tmp_path / "in.jsonl", [{"responses_create_params": {"input": f"q{i}"}, "score": i % 2} for i in range(3)])  # fmt: skip

    async def main() -> Any:
        client = ServerClient(static_urls={AGENT: agent_url})
        try:
            return await RolloutCollectionHelper(server_client=client).run_from_config(
                {
                    "input_jsonl_fpath": str(rows),
                    "output_jsonl_fpath": str(tmp_path / "out.jsonl"),
                    "agent_name": AGENT,
                    "num_repeats": 2,
                    **options,
                }
            )
        finally:
            await client.close()

    return asyncio.run(main())


def wandb_history(run_file: Path) -> dict[str, Any]:
    """Every history value in a W&B run file (a LevelDB-style log of protobuf ``Record``\\ s)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, history = 32768, 7, b"", {}
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if left < 7 or (length == 0 and kind == 0):
            pos += left  # the rest of a block is padding
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # a whole record: FULL, or the LAST of FIRST/MIDDLE/LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                for item in record.history.item:
                    history[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return history


def test_wandb_offline_run_holds_metrics_and_rollouts(
    agent_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'nemo_gym[wandb]')")
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)
    summary = collect(
        agent_url,
        tmp_path,
        upload_rollouts_to_wandb=True,
        wandb_name="trackers-test",
        wandb_api_key="sekrit-" + "x" * 33,
    )
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    deadline = time.monotonic() + 20
    while True:  # W&B's service process writes the run file behind finish(); it flushes at exit at the latest
        history = wandb_history(next(run_dir.glob("run-*.wandb")))
        if "Rollouts/_type" in history or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    (entry,) = summary.metrics
    assert history[f"{AGENT}/mean/reward"] == pytest.approx(entry["agent_metrics"]["mean/reward"])
    assert history[f"{AGENT}/pass@2/reward"] == pytest.approx(entry["agent_metrics"]["pass@2/reward"])
    assert history["collection/succeeded"] == 6 and history["collection/failed"] == 0
    assert any(key.startswith(f"key_metrics/{AGENT}/") for key in history)
    assert history["Rollouts/_type"] == "table-file" and history["Rollouts/nrows"] == 6
    (table,) = run_dir.glob("files/media/table/Rollouts_*.table.json")
    rows = json.loads(table.read_text())
    assert rows["columns"] == ["Rollout"]
    assert sorted(json.loads(r[0])["_ng_rollout_index"] for r in rows["data"]) == [0, 0, 0, 1, 1, 1]
    assert [json.loads(r[0]) for r in rows["data"]] == read_jsonl(tmp_path / "out.jsonl")
    assert not [
        p for p in run_dir.rglob("*") if p.is_file() and b"sekrit" in p.read_bytes()
    ]  # key not logged


def test_mlflow_file_store_holds_metrics_and_rollouts(agent_url: str, tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install 'nemo_gym[mlflow]')")
    store = tmp_path / "mlruns"
    summary = collect(
        agent_url, tmp_path, upload_rollouts_to_mlflow=True, mlflow_tracking_uri=str(store), wandb_name="t"
    )
    (run,) = [p.parent for p in store.glob("*/*/meta.yaml") if (p.parent / "metrics").is_dir()]

    def metric(name: str) -> float:
        return float((run / "metrics" / name).read_text().split()[1])

    (entry,) = summary.metrics
    assert metric(f"{AGENT}/mean/reward") == pytest.approx(entry["agent_metrics"]["mean/reward"])
    assert metric(f"{AGENT}/pass_2/reward") == pytest.approx(entry["agent_metrics"]["pass@2/reward"])
    assert metric("collection/succeeded") == 6
    assert (run / "params" / "num_repeats").read_text() == "2"
    table = json.loads((run / "artifacts" / "Rollouts.json").read_text())
    assert [json.loads(r[0]) for r in table["data"]] == read_jsonl(tmp_path / "out.jsonl")
    assert (run / "artifacts" / "rollouts" / "out.jsonl").read_bytes() == (
        tmp_path / "out.jsonl"
    ).read_bytes()


def test_a_missing_tracker_package_stops_before_collecting(
    agent_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"pip install 'nemo_gym\[wandb\]'"):
        collect(agent_url, tmp_path, wandb_project="p")
    assert not (tmp_path / "out.jsonl").exists()
