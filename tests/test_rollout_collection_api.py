"""Every name of NeMo Gym's documented ``nemo_gym.rollout_collection`` API, called with its fields and
return shapes: the configs, both helpers (public and underscore methods), the command functions,
``_expand_input_glob``, ``_rollout_request_debug_summary`` and ``attach_trajectory_record``.

A real head server (in this process, on loopback) lists one real agent server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from nemo_gym import rollout_collection as rc
from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
from nemo_gym.config_types import BaseNeMoGymCLIConfig
from nemo_gym.launch.config import ConfigError, project_root
from nemo_gym.launch.head_server import HeadServer, Replica
from nemo_gym.testing import read_jsonl, running_app, running_server, write_jsonl

AGENT = "probe"


class EchoAgent(SimpleResponsesAPIAgent):
    """Answers every row with a reward from the row's ``score`` (1.0 by default)."""

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "response": {"output": []}, "reward": float(body.get("score", 1.0))}


@pytest.fixture(scope="module")
def head_port() -> Iterator[int]:
    agent = EchoAgent({"name": AGENT})
    with running_server(agent) as agent_url:
        head = HeadServer({})
        host, port = agent_url.removeprefix("http://").split(":")
        head.registry.register(
            Replica(AGENT, "responses_api_agents", host, int(port), pid=0, registered_at=time.time())
        )
        with running_app(head.build_app()) as head_url:
            yield int(head_url.rsplit(":", 1)[1])


def rows(n: int) -> list[dict[str, Any]]:
    return [{"responses_create_params": {"input": f"q{i}"}, "score": i % 2} for i in range(n)]


def test_config_classes_have_nemo_gyms_fields_and_bases() -> None:
    assert issubclass(rc.SharedRolloutCollectionConfig, BaseNeMoGymCLIConfig)
    assert issubclass(rc.RolloutCollectionConfig, rc.SharedRolloutCollectionConfig)
    assert issubclass(rc.E2ERolloutCollectionConfig, rc.SharedRolloutCollectionConfig)
    assert issubclass(rc.RolloutAggregationConfig, BaseNeMoGymCLIConfig)
    shared = set(rc.SharedRolloutCollectionConfig.model_fields)
    assert {
        "output_jsonl_fpath",
        "num_samples_in_parallel",
        "responses_create_params",
        "upload_rollouts_to_wandb",
        "disable_aggregation",
    } <= shared
    config = rc.RolloutCollectionConfig(input_jsonl_fpath="in.jsonl", output_jsonl_fpath="out/x.jsonl")
    assert config.materialized_jsonl_fpath == Path("out/x_materialized_inputs.jsonl")
    assert config.upload_rollouts_to_wandb is True and config.use_wandb is False  # nothing configured
    assert rc.RolloutCollectionConfig.from_config(
        {"input_jsonl_fpath": "a", "output_jsonl_fpath": "b", "upload_rollouts_to_wandb": True}
    ).use_wandb
    e2e = rc.E2ERolloutCollectionConfig(output_jsonl_fpath="x.jsonl", split="benchmark")
    assert e2e.reuse_existing_data_preparation is False
    with pytest.raises(ValidationError):
        rc.E2ERolloutCollectionConfig(output_jsonl_fpath="x.jsonl", split="test")
    aggregation = rc.RolloutAggregationConfig(input_glob="a*.jsonl", output_jsonl_fpath="all.jsonl")
    assert aggregation.merge_shards is True
    with pytest.raises(ConfigError, match=r"\+num_repeats must be >= 1"):
        rc.RolloutCollectionConfig.from_config(
            {"input_jsonl_fpath": "a", "output_jsonl_fpath": "b", "num_repeats": 0}
        )


def test_expand_input_glob_and_debug_summary(tmp_path: Path) -> None:
    for name in ("b.jsonl", "a.jsonl", "a_failures.jsonl", "a_materialized_inputs.jsonl", "c.txt"):
        (tmp_path / name).write_text("")
    found = rc._expand_input_glob(f"{tmp_path}/*.jsonl , {tmp_path}/a.jsonl,{tmp_path}/none*.jsonl")
    assert found == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]  # sorted, once, side files out
    assert rc._expand_input_glob(f"{tmp_path}/none*.jsonl") == []
    row = {"_ng_task_index": 3, "_ng_rollout_index": 1, "agent_ref": {"name": AGENT}, "secret": "x"}
    assert rc._rollout_request_debug_summary(row) == {
        "_ng_task_index": 3,
        "_ng_rollout_index": 1,
        "agent_name": AGENT,
    }
    assert rc._rollout_request_debug_summary({}) == {}


def test_helpers_and_commands_end_to_end(head_port: int, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", rows(3))
    out = tmp_path / "run" / "x.jsonl"
    base = {"input_jsonl_fpath": str(source), "output_jsonl_fpath": str(out), "agent_name": AGENT}
    helper = rc.RolloutCollectionHelper()

    # _preprocess_rows_from_config: NeMo Gym's in-memory materialized rows.
    config = rc.RolloutCollectionConfig(**base, num_repeats=2)
    pre = helper._preprocess_rows_from_config(config)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in pre] == [
        (t, r) for t in range(3) for r in range(2)
    ]
    assert all(r["agent_ref"]["name"] == AGENT for r in pre)

    # collect_rollouts is the ng_collect_rollouts command.
    assert rc.collect_rollouts is rc.ng_collect_rollouts
    argv = [f"+{k}={v}" for k, v in base.items()] + ["+num_repeats=2", f"++head_server.port={head_port}"]
    with pytest.raises(SystemExit) as exited:
        rc.collect_rollouts(argv)
    assert exited.value.code == 0
    assert len(read_jsonl(out)) == 6

    # _load_from_cache: (input_rows, rows, results, result_strs) after losing one result.
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:-1]))
    lost = json.loads(lines[-1])
    input_rows, cached_rows, results, result_strs = helper._load_from_cache(config)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in input_rows] == [
        (lost["_ng_task_index"], lost["_ng_rollout_index"])
    ]
    assert len(results) == len(cached_rows) == len(result_strs) == 5
    assert all(json.loads(s[0]) == r for s, r in zip(result_strs, results, strict=True))
    assert all(
        (row["_ng_task_index"], row["_ng_rollout_index"]) == (r["_ng_task_index"], r["_ng_rollout_index"])
        for row, r in zip(cached_rows, results, strict=True)
    )

    # _call_aggregate_metrics: the agent's /aggregate_metrics, written next to the given output.
    async def metrics() -> Path | None:
        helper2 = rc.RolloutCollectionHelper()
        try:
            assert await helper2._call_aggregate_metrics([], [], tmp_path / "none.jsonl") is None
            head = {"host": "127.0.0.1", "port": head_port}
            helper2.server_client = helper2.setup_server_client(head)  # what _call_aggregate_metrics uses
            return await helper2._call_aggregate_metrics(results, cached_rows, tmp_path / "again.jsonl")
        finally:
            await helper2.close()

    metrics_path = asyncio.run(metrics())
    assert metrics_path == tmp_path / "again_aggregate_metrics.json"
    (entry,) = json.loads(metrics_path.read_text())
    assert entry["agent_ref"]["name"] == AGENT
    assert entry["agent_metrics"]["mean/reward"] == pytest.approx(sum(r["reward"] for r in results) / 5)

    # Resume through run_from_config; the summary iterates as NeMo Gym's list of results.
    async def resume() -> Any:
        async with rc.RolloutCollectionHelper() as h:
            return await h.run_from_config(
                {**base, "num_repeats": 2, "resume_from_cache": True, "head_server": {"port": head_port}}
            )

    summary = asyncio.run(resume())
    assert summary.succeeded == 1 and len(summary) == 6 and len(list(summary)) == 6

    # aggregate_rollouts is ng_aggregate_rollouts; RolloutAggregationHelper returns the metrics path.
    merged = tmp_path / "merged" / "all.jsonl"
    with pytest.raises(SystemExit) as exited:
        rc.aggregate_rollouts(
            [f"+input_glob={out}", f"+output_jsonl_fpath={merged}", f"++head_server.port={head_port}"]
        )
    assert exited.value.code == 0 and len(read_jsonl(merged)) == 6
    only_metrics = tmp_path / "m" / "metrics_only.jsonl"
    aggregation = rc.RolloutAggregationConfig(
        input_glob=str(out), output_jsonl_fpath=str(only_metrics), merge_shards=False
    )
    path = asyncio.run(
        rc.RolloutAggregationHelper({"host": "127.0.0.1", "port": head_port}).run_from_config(aggregation)
    )
    assert path == only_metrics.with_name("metrics_only_aggregate_metrics.json") and path.exists()
    assert not only_metrics.exists()  # merge_shards=false writes the metrics only
    assert list(path.parent.iterdir()) == [path]


@pytest.mark.slow
def test_materialized_jsonl_fpath_is_settable(head_port: int, tmp_path: Path) -> None:
    """NeMo Gym's API sets where the materialized inputs go; the collection writes and resumes from there."""
    source = write_jsonl(tmp_path / "in.jsonl", rows(2))
    out = tmp_path / "run" / "x.jsonl"
    config = rc.RolloutCollectionConfig(
        input_jsonl_fpath=str(source), output_jsonl_fpath=str(out), agent_name=AGENT
    )
    assert config.materialized_jsonl_fpath == out.with_name("x_materialized_inputs.jsonl")
    chosen = tmp_path / "elsewhere" / "inputs.jsonl"
    chosen.parent.mkdir()
    config.materialized_jsonl_fpath = str(chosen)
    assert config.materialized_jsonl_fpath == chosen
    assert (
        rc.RolloutCollectionConfig.model_validate(
            {**config.model_dump(), "materialized_jsonl_fpath": chosen}
        ).materialized_jsonl_fpath
        == chosen
    )

    async def collect(resume: bool) -> Any:
        config.resume_from_cache = resume
        async with rc.RolloutCollectionHelper() as h:
            h.server_client = h.setup_server_client({"host": "127.0.0.1", "port": head_port})
            return await h.run_from_config(config)

    asyncio.run(collect(False))
    assert len(read_jsonl(chosen)) == 2 and len(read_jsonl(out)) == 2
    assert not out.with_name("x_materialized_inputs.jsonl").exists()
    out.write_bytes(out.read_bytes().splitlines(keepends=True)[0])
    summary = asyncio.run(collect(True))
    assert summary.succeeded == 1 and len(read_jsonl(out)) == 2


def test_e2e_collection_of_a_prepared_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert rc.e2e_rollout_collection is rc.ng_e2e_collect_rollouts
    env = "resources_servers/example_single_tool_call"
    bench = write_jsonl(tmp_path / "bench.jsonl", read_jsonl(project_root() / env / "data/example.jsonl")[:2])
    datasets = [{"name": "bench", "type": "benchmark", "jsonl_fpath": str(bench), "num_repeats": 2}]
    extra = tmp_path / "bench.yaml"
    extra.write_text(json.dumps({"example_single_tool_call_simple_agent": {"responses_api_agents": {"simple_agent": {"datasets": datasets}}}}))  # fmt: skip
    configs = f"+config_paths=[{env}/configs/example_single_tool_call.yaml,responses_api_models/scripted_model/configs/scripted_model.yaml,{extra}]"
    out = tmp_path / "run" / "bench.jsonl"
    argv = [
        configs,
        "+split=benchmark",
        f"+output_jsonl_fpath={out}",
        "+reuse_existing_data_preparation=true",
    ]
    with pytest.raises(SystemExit) as exited:
        rc.e2e_rollout_collection(argv)
    assert exited.value.code == 0, capsys.readouterr()
    prepared = tmp_path / "run" / "bench" / "preprocessed_datasets" / "benchmark.jsonl"
    assert len(read_jsonl(prepared)) == 4  # two rows, each twice (the dataset's num_repeats)
    rows = read_jsonl(out)
    assert len(rows) == 4 and all(
        r["agent_ref"]["name"] == "example_single_tool_call_simple_agent" for r in rows
    )
    capsys.readouterr()
    out.unlink()
    with pytest.raises(SystemExit) as exited:  # the same run again: the prepared data is reused
        rc.e2e_rollout_collection(argv)
    assert exited.value.code == 0 and "Reusing the prepared benchmark data" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:  # a split no agent lists
        rc.e2e_rollout_collection(
            [configs, "+split=validation", f"+output_jsonl_fpath={tmp_path / 'v.jsonl'}"]
        )
    assert exited.value.code == 2 and "+split=validation" in capsys.readouterr().err


def test_attach_trajectory_record() -> None:
    output = [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "prompt_token_ids": [1, 2],
         "generation_token_ids": [3], "generation_log_probs": [-0.1]},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "42"}],
         "prompt_token_ids": [1, 2, 3, 4], "generation_token_ids": [5, 6], "generation_log_probs": [-0.2, -0.3]},
    ]  # fmt: skip
    row = {"_ng_rollout_id": "step7.0-0", "_ng_task_index": 0, "_ng_rollout_index": 0}
    result = {"reward": 1.0, "response": {"output": output}}
    before = json.dumps(output)
    rc.attach_trajectory_record(row, result)
    record = result["ng_trajectory"]
    assert json.dumps(output) == before  # token IDs untouched
    assert (record["task_id"], record["rollout_id"]) == ("0", "step7.0-0")
    assert [c["token_stats"] for c in record["model_calls"]] == [
        {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
        {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    ]
    assert record["tool_calls"] == [{"call_id": "c1", "name": "f", "arguments": "{}", "output": "42"}]
    broken = {"reward": 0.0, "response": "oops"}
    rc.attach_trajectory_record({"_ng_task_index": 1, "_ng_rollout_index": 2}, broken)
    assert broken["ng_trajectory"]["gaps"][0]["code"] == "trajectory_projection_failed"
    assert broken["ng_trajectory"]["rollout_id"] == "1-2"


def test_a_rows_own_rollout_id_is_not_shared_by_its_repeats() -> None:
    from nemo_gym.collection.rollouts import rollout_id_for
    from nemo_gym.collection.row_materializer import RowMaterializer

    row = {"_ng_rollout_id": "step7.0", "responses_create_params": {"input": "hi"}}
    repeated = RowMaterializer(agent_name="a", num_repeats=3)
    rows = list(repeated.expand(repeated.prepare(row), task_index=0, first_rollout=0))
    assert [rollout_id_for(r) for r in rows] == ["step7.0-r0", "step7.0-r1", "step7.0-r2"]
    # Resumed later repeats get theirs too; one rollout per row keeps the id it was given.
    assert rollout_id_for(next(repeated.expand(repeated.prepare(row), 0, 3))) == "step7.0-r3"
    once = RowMaterializer(agent_name="a")
    assert [rollout_id_for(r) for r in once.expand(once.prepare(row), 0, 0)] == ["step7.0"]


def test_a_harness_programs_own_tool_outputs_are_shown_as_its_own() -> None:
    from nemo_gym.collection.trajectory import build_trajectory_record

    call = {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"}
    result = {
        "response": {"output": [call, {"type": "message", "role": "assistant", "content": "done"}]},
        "harness": {
            "program_items": [
                {"before_call": 1, "item": {"type": "function_call_output", "call_id": "c1", "output": "ok"}}
            ]
        },
    }
    (tool,) = build_trajectory_record({"_ng_task_index": 0, "_ng_rollout_index": 0}, result)["tool_calls"]
    assert tool["output"] == "ok" and tool["output_source"] == "program"
