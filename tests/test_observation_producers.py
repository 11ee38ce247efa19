"""A producer's own pass over its observation bundle when a rollout's model calls are merged in.

NeMo Gym's ``merge_model_call_capture_into_record`` hands a bundle of source ``S`` to the agent
folder ``responses_api_agents/S_agent`` (``observability.associate_S_compaction_calls``) before
the generic join; 0.6.0's and 0.7.0's ``claude_code_agent`` tests rely on it. Here a synthetic
folder on the agents package's path plays that folder.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import responses_api_agents
from nemo_gym.base_responses_api_model import CaptureStore, merge_model_call_capture_into_record
from nemo_gym.collection.observation_producers import compaction_call_association
from nemo_gym.rollout_observability import (
    AgentInvocation,
    AgentObservationBundle,
    ContextCompactionObservation,
    ModelCallRef,
)

HOOK = '''
from nemo_gym.rollout_observability import AgentInvocation, ContextCompactionObservation, ModelCallRef

CALLS_SEEN = []


def associate_probe_compaction_calls(bundle, calls):
    """Ties every captured call whose request asks for a summary to the compaction."""
    CALLS_SEEN.append([call.model_call_id for call in calls])
    if any(call.request.get("fail") for call in calls):
        raise RuntimeError("the producer's pass broke")
    result = bundle.model_copy(deep=True)
    compact = [ModelCallRef(model_call_id=c.model_call_id) for c in calls if c.request.get("summarize")]
    for record in result.records:
        if isinstance(record, ContextCompactionObservation):
            record.model_calls = compact
        if isinstance(record, AgentInvocation):
            record.model_calls = [*record.model_calls, *compact]
    return result
'''


@pytest.fixture
def probe_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``responses_api_agents/probe_agent/observability.py`` importable as a pulled folder is."""
    root = tmp_path / "responses_api_agents"
    folder = root / "probe_agent"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "observability.py").write_text(HOOK)
    monkeypatch.setattr(responses_api_agents, "__path__", [*responses_api_agents.__path__, str(root)])
    yield folder
    for name in [n for n in sys.modules if n.startswith("responses_api_agents.probe_agent")]:
        del sys.modules[name]


def record_with_calls(store_dir: Path, source: str, *requests: dict) -> dict:
    store = CaptureStore(store_dir)
    for index, request in enumerate(requests):
        store.record("0-0", {"model_call_id": f"call-{index}", "dialect": "messages", "request": request})
    bundle = AgentObservationBundle(
        source=source,
        records=[
            AgentInvocation(invocation_id="root", model_calls=[ModelCallRef(model_call_id="call-0")]),
            ContextCompactionObservation(invocation_id="root", outcome="completed"),
        ],
    )
    return {
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "ng_agent_observations": bundle.model_dump(mode="json"),
    }


def merged_bundle(record: dict, store_dir: Path) -> AgentObservationBundle:
    merge_model_call_capture_into_record(record, [store_dir])
    return AgentObservationBundle.model_validate(record["ng_agent_observations"])


def refs(bundle: AgentObservationBundle, kind: type) -> list[list[str | None]]:
    return [[r.model_call_id for r in rec.model_calls] for rec in bundle.records if isinstance(rec, kind)]


def test_the_producing_folder_ties_its_compaction_call_before_the_generic_join(
    probe_folder: Path, tmp_path: Path
) -> None:
    record = record_with_calls(tmp_path / "capture", "probe", {"turn": 1}, {"summarize": True})
    bundle = merged_bundle(record, tmp_path / "capture")
    assert refs(bundle, ContextCompactionObservation) == [["call-1"]]
    assert refs(bundle, AgentInvocation) == [["call-0", "call-1"]]
    assert not {gap.code for gap in bundle.gaps} & {
        "compaction_model_call_join_failed",
        "model_call_ownership_unavailable",
    }
    observability = sys.modules["responses_api_agents.probe_agent.observability"]
    assert observability.CALLS_SEEN == [["call-0", "call-1"]]


def test_a_failing_pass_is_a_gap_and_the_generic_join_still_runs(probe_folder: Path, tmp_path: Path) -> None:
    record = record_with_calls(tmp_path / "capture", "probe", {"turn": 1}, {"fail": True})
    bundle = merged_bundle(record, tmp_path / "capture")
    codes = {gap.code for gap in bundle.gaps}
    assert "compaction_model_call_join_failed" in codes
    assert refs(bundle, AgentInvocation) == [["call-0"]]  # the generic join resolved its reference
    assert "model_call_ownership_unavailable" in codes  # and says call-1 is no one's
    assert record["ng_model_call_capture"]["rollout_id"] == "0-0"


def test_a_source_without_a_folder_gets_the_generic_join_only(tmp_path: Path) -> None:
    assert compaction_call_association("no_such_source") is None
    record = record_with_calls(tmp_path / "capture", "no_such_source", {"turn": 1})
    bundle = merged_bundle(record, tmp_path / "capture")
    assert refs(bundle, AgentInvocation) == [["call-0"]]
    assert "compaction_model_call_join_failed" not in {gap.code for gap in bundle.gaps}


def test_a_source_is_never_a_module_path(probe_folder: Path) -> None:
    assert compaction_call_association("probe") is not None
    for source in ("probe_agent.observability", "../probe", "probe.x", ""):
        assert compaction_call_association(source) is None
