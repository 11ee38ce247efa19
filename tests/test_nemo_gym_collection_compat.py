"""What NeMo Gym's own agents and orchestrators import from ``nemo_gym.rollout_collection`` and
``nemo_gym.rollout_observability``: the trajectory from captured evidence, model-call joining,
environment-server routing, attempts and terminal failures, latency, ``ng_perf`` and the
invalid-judge migration (on real files)."""

from __future__ import annotations

import orjson
import pytest
from omegaconf import OmegaConf

from nemo_gym import rollout_collection as rc
from nemo_gym.config_types import ModelServerRef
from nemo_gym.rollout_observability import (
    AgentInvocation,
    AgentObservationBundle,
    ModelCallRef,
    TrajectoryRecord,
    join_model_call_observations,
)

ROW = {"_ng_task_index": 4, "_ng_rollout_index": 1, "instance_id": 0}
POLICY = ModelServerRef(name="policy")


def capture_call(index: int, **extra: object) -> dict:
    return {
        "model_call_id": f"call-{index}",
        "response_id": f"resp-{index}",
        "started_at": 100.0 + index,
        "tokens_in": 10 * index,
        "tokens_out": index,
        "request": {"input": [{"role": "user", "content": f"q{index}"}]},
        "response": {
            "status": "completed",
            "output": [
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
                {"type": "function_call", "call_id": f"t{index}", "name": "lookup", "arguments": "{}"},
            ],
        },
        **extra,
    }


def evidence_result(resolved: bool | None = True) -> dict:
    invocation = AgentInvocation(
        invocation_id="root",
        status="completed",
        model_calls=[ModelCallRef(model_call_id="call-1"), ModelCallRef(model_call_id="call-2")],
        conversation=[
            {"role": "user", "content": "q"},
            {"type": "function_call_output", "call_id": "t1", "output": "42"},
        ],
    )
    tool = {"kind": "tool_call", "invocation_id": "root", "tool_call_id": "t1", "status": "completed"}
    bundle = {"source": "test", "records": [invocation.model_dump(mode="json"), tool], "gaps": []}
    return {
        "reward": 1.0,
        "resolved": resolved,
        "ng_agent_observations": bundle,
        "ng_model_call_capture": {"calls": [capture_call(1), capture_call(2), capture_call(3)]},
    }


def test_trajectory_from_captured_calls_and_observations() -> None:
    assert rc._trajectory_identity(ROW) == ("0", "4-1")
    record = rc._build_trajectory_record(ROW, evidence_result())
    assert isinstance(record, TrajectoryRecord)
    # Three captured calls; the third (a judge's, say) is referenced by no invocation: no turn.
    assert [call.model_call_id for call in record.model_calls] == ["call-1", "call-2", "call-3"]
    assert [(t.turn_no, t.step_count, t.model_calls[0].model_call_id) for t in record.turns] == [
        (1, 0, "call-1"),
        (2, 1, "call-2"),
    ]
    assert record.turns[0].question == [{"type": "message", "role": "user", "content": "q1"}]
    assert [item["type"] for item in record.turns[0].answer] == ["function_call"]
    assert record.turns[-1].resolved is True and record.turns[0].resolved is None
    assert record.model_calls[0].response_metadata.response_status == "completed"
    assert record.model_calls[1].token_stats.prompt_tokens == 20
    [tool] = record.tool_calls
    assert (tool.tool_call_id, tool.status, tool.output) == ("t1", "completed", "42")
    assert record.invocations[0].conversation[0].type == "message"
    assert record.gaps == []


def test_attach_moves_payloads_into_the_trajectory_and_never_raises() -> None:
    result = evidence_result()
    rc._attach_trajectory_record(ROW, result)
    assert TrajectoryRecord.model_validate(result["ng_trajectory"]).turns
    assert all(
        "request" not in call and "response" not in call for call in result["ng_model_call_capture"]["calls"]
    )
    # Evidence of the wrong shape: the failure is a gap where the evidence is, not an exception.
    broken = {"ng_model_call_capture": {"calls": [{"model_call_id": "c", "tokens_in": 1, "duration_ms": -1}]}}
    broken["ng_model_call_capture"]["calls"][0]["response_source"] = "elsewhere"
    rc._attach_trajectory_record(ROW, broken)
    assert "ng_trajectory" not in broken
    assert broken["ng_model_call_capture"]["gaps"][0]["code"] == "trajectory_projection_failed"
    # No evidence at all: the record says what is missing.
    bare: dict = {}
    rc._attach_trajectory_record(ROW, bare)
    codes = {gap["code"] for gap in bare["ng_trajectory"]["gaps"]}
    assert codes == {"model_calls_unavailable", "turns_unavailable", "conversation_unavailable"}


def test_an_agents_own_trajectory_keeps_its_turns_and_identity_is_enforced() -> None:
    own = TrajectoryRecord(task_id="other", rollout_id="4-1").model_dump(mode="json")
    record = rc._build_trajectory_record(ROW, {"ng_trajectory": own})
    assert record.task_id == "0"
    assert [gap.code for gap in record.gaps][:1] == ["producer_trajectory_identity_mismatch"]
    assert "turns_unavailable" not in {gap.code for gap in record.gaps}
    invalid = rc._build_trajectory_record(ROW, {"ng_trajectory": {"task_id": 1}, "ng_agent_observations": {}})
    codes = {gap.code for gap in invalid.gaps}
    assert {"producer_trajectory_invalid", "agent_observations_invalid"} <= codes


class Captured:
    """A captured call as the model server records it (``ModelCallRecord``'s fields)."""

    def __init__(
        self, call_index: int, model_call_id: str, response_id: str | None, session: str | None
    ) -> None:
        self.call_index, self.model_call_id, self.response_id = call_index, model_call_id, response_id
        self.client_session_id, self.model_ref = session, POLICY


def test_join_resolves_references_without_guessing() -> None:
    bundle = AgentObservationBundle(
        source="t",
        records=[
            AgentInvocation(
                invocation_id="root", model_calls=[ModelCallRef(model_ref=POLICY, response_id="r1")]
            ),
            AgentInvocation(invocation_id="sub", model_calls=[ModelCallRef(model_call_id="missing")]),
        ],
    )
    calls = [Captured(0, "c1", "r1", None), Captured(1, "c2", "r2", "sub"), Captured(2, "c3", None, None)]
    joined = join_model_call_observations(bundle, calls)
    root, sub = joined.records
    assert [ref.model_call_id for ref in root.model_calls] == ["c1"]  # resolved to its full identity
    assert [ref.model_call_id for ref in sub.model_calls] == ["missing", "c2"]  # claimed by session id
    codes = {(gap.code, gap.invocation_id, gap.detail) for gap in joined.gaps}
    assert ("model_call_reference_unmatched", "sub", "missing") in codes
    assert ("model_call_ownership_unavailable", None, "capture:c3:call_index=2") in codes
    assert bundle.records[1].model_calls == [ModelCallRef(model_call_id="missing")]  # input untouched


def test_environment_server_routing() -> None:
    config = OmegaConf.create(
        {
            "env_a": {"environment_servers": {"x": {"agent_server": {"name": "solver"}}}},
            "env_b": {
                "environment_servers": {"x": {"user": {"type": "responses_api_agents", "name": "user"}}}
            },
            "env_c": {
                "environment_servers": {"x": {"user": {"type": "responses_api_agents", "name": "user"}}}
            },
            "policy": {"responses_api_models": {"m": {}}},
        }
    )
    by_agent = rc._environment_servers_by_agent(config)
    assert by_agent == {"solver": ["env_a"], "user": ["env_b", "env_c"]}
    assert rc._environment_server_for_agent("solver", by_agent) == "env_a"
    with pytest.raises(ValueError, match="several environment servers"):
        rc._environment_server_for_agent("user", by_agent)
    with pytest.raises(ValueError, match="no environment server"):
        rc._environment_server_for_agent("nobody", by_agent)


def test_attempts_terminal_failures_and_elapsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", raising=False)
    assert rc.get_max_rollout_attempts() == 3
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "5")
    assert rc.get_max_rollout_attempts() == 5
    assert rc._get_max_rollout_attempts() == 5  # NeMo Gym 0.4.0-0.6.0's name
    # NeMo Gym's remote_agent test patches rollout_collection.get_global_config_dict.
    from nemo_gym.global_config import get_global_config_dict

    assert rc.get_global_config_dict is get_global_config_dict
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "0")
    assert rc.get_max_rollout_attempts() == 3
    stamped_timeout = {"_ng_failure_class": "timeout_exceeded", "_ng_failure_terminal": True}
    assert rc.is_terminal_failure(stamped_timeout) is True
    assert rc.is_terminal_failure(stamped_timeout, retry_terminal_timeouts=True) is False
    assert rc.is_terminal_failure({"_ng_failure_class": "skipped"}, retry_terminal_timeouts=True) is True
    assert rc.observed_elapsed({"elapsed_seconds": "2.5"}) == 2.5
    assert rc.observed_elapsed({"response": {"metadata": {"elapsed_seconds": 4}}}) == 4.0
    assert rc.observed_elapsed({"elapsed_seconds": -1}) is None


def test_dispatch_latency_tracker() -> None:
    tracker = rc.DispatchLatencyTracker()
    assert tracker.quantile(0.5) is None and tracker.drain_margin(None) is None
    for seconds in (60, 120, 180, 240, 300, 0):
        tracker.record(seconds)
    assert tracker.quantile(0.5) == 180 and tracker.quantile(0.75) == 240
    assert tracker.drain_margin(None) == 240 and tracker.drain_margin(10.0) == 10.0
    tracker.record_drained()
    assert tracker.drained == 1 and "median 3.0 min" in tracker.summary() and "Drained" in tracker.summary()


def test_ng_perf_from_the_trajectory() -> None:
    result = evidence_result()
    rc._attach_trajectory_record(ROW, result)
    rc._attach_ng_perf(result, observability_enabled=False)
    assert "ng_perf" not in result
    rc._attach_ng_perf(result, observability_enabled=True, rollout_latency_ms=12.5)
    assert result["ng_perf"] == {
        "num_turns": 2,
        "num_tool_calls": 1,
        "token_observability_coverage": 1.0,
        "prompt_tokens": 30,
        "completion_tokens": 3,
        "total_latency_ms": 12.5,
    }


def test_migrate_invalid_judge_rows_is_idempotent(tmp_path) -> None:
    output = tmp_path / "rollouts.jsonl"
    deliverables = tmp_path / "d"
    deliverables.mkdir()
    (deliverables / "report.pdf").write_bytes(b"%PDF")
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "invalid_judge_response": True,
         "_ng_failure_terminal": True, "deliverables_dir": str(deliverables)},
    ]  # fmt: skip
    output.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    assert rc.migrate_invalid_judge_main_rows(output) == 1
    assert [orjson.loads(line) for line in output.read_bytes().splitlines()] == rows[:1]
    [moved] = [
        orjson.loads(line) for line in (tmp_path / "rollouts_failures.jsonl").read_bytes().splitlines()
    ]
    assert moved["_ng_failure_class"] == "judge_invalid" and "_ng_failure_terminal" not in moved
    assert moved["reuse_cached_deliverable"] is True
    assert rc.migrate_invalid_judge_main_rows(output) == 0
    assert rc.migrate_invalid_judge_main_rows(tmp_path / "absent.jsonl") == 0
