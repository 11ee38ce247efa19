"""NeMo Gym's secondary public modules at their paths: judge, reward_profile's helpers,
episode_types, failure_kinds, prompt, and the package-level names."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import nemo_gym
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
    SimpleResourcesServer,
)
from nemo_gym.deliverables import is_deliverable
from nemo_gym.episode_types import BaseEpisodeResponse, EpisodeFailure, EpisodeId, TaskId
from nemo_gym.failure_kinds import FAILURE_KINDS, JUDGE_FAILED, is_namespaced, validate_failure_kind
from nemo_gym.judge import JudgeError, call_judge, judge_failsafe, reraise_judge_errors
from nemo_gym.path_utils import aggregate_metrics_path_for, failures_path_for, materialized_path_for
from nemo_gym.prompt import (
    PromptConfig,
    apply_prompt_to_row,
    fill_prompt,
    load_prompt_config,
    validate_prompt_compatibility,
)
from nemo_gym.reward_profile import (
    AggregateMetricsMixin,
    add_avg_sample_std_dev,
    compute_pass_majority_metrics,
    compute_subset_metrics,
    highest_k_metrics,
)
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.server_utils import ServerClient
from nemo_gym.serving.server_client import ServerClient as CollectorClient
from nemo_gym.testing import SyncClient, running_app
from nemo_gym.testing.session_conformance import check_resources_session_contract
from nemo_gym.tool_access import DirectHTTPToolAccess, MCPToolAccess, ToolAccess
from nemo_gym.verifier_fixture import VerifierFixture, VerifierFixtureError, exercise_verifier_fixture


class JudgeAnswer(BaseModel):
    model_config = ConfigDict(extra="allow")

    output: list[dict[str, Any]]


async def judge_endpoint(request: Request) -> Response:
    body = await request.json()
    if body.get("input") == "fail":
        return JSONResponse({"error": "judge overloaded"}, status_code=503)
    return JSONResponse({"output": [{"type": "message", "content": [{"text": "[[A=B]] " + body["input"]}]}]})


JUDGE_APP = Starlette(routes=[Route("/v1/responses", judge_endpoint, methods=["POST"])])


def test_call_judge_parses_the_answer_and_turns_every_call_failure_into_judge_error() -> None:
    async def scenario(judge_url: str) -> None:
        client = ServerClient(
            static_urls={"judge": judge_url, "gone": "http://127.0.0.1:9"}, connect_retries=1
        )
        try:
            answer = await call_judge(
                client,
                server_name="judge",
                url_path="/v1/responses",
                json={"input": "hi"},
                response_model=JudgeAnswer,
            )
            assert answer.output[0]["content"][0]["text"] == "[[A=B]] hi"
            with pytest.raises(JudgeError, match=r"answered HTTP 503: .*judge overloaded"):
                await call_judge(
                    client,
                    server_name="judge",
                    url_path="/v1/responses",
                    json={"input": "fail"},
                    response_model=JudgeAnswer,
                )
            with pytest.raises(JudgeError, match="ServerConnectionError: gone/v1/responses: cannot reach"):
                await call_judge(
                    client,
                    server_name="gone",
                    url_path="/v1/responses",
                    json={"input": "x"},
                    response_model=JudgeAnswer,
                )

            class Strict(BaseModel):
                verdict: str

            with pytest.raises(JudgeError, match="ValidationError"):
                await call_judge(
                    client,
                    server_name="judge",
                    url_path="/v1/responses",
                    json={"input": "x"},
                    response_model=Strict,
                )
        finally:
            await client.close()

    with running_app(JUDGE_APP) as url:
        asyncio.run(scenario(url))


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    response: dict[str, Any]
    expected_answer: str


def test_judge_failsafe_answers_a_judge_failed_row_and_lets_other_errors_through() -> None:
    async def verify(body: VerifyRequest) -> dict[str, Any]:
        if body.expected_answer == "bug":
            raise KeyError("not a judge failure")
        await reraise_judge_errors(asyncio.sleep(0, result=None))
        await reraise_judge_errors(_raise(ConnectionError("judge down")))
        return {"reward": 1.0}

    async def _raise(exc: Exception) -> None:
        raise exc

    request = VerifyRequest(response={"output": []}, expected_answer="4", instance_config={"seed": 1})
    answer = asyncio.run(judge_failsafe(verify)(body=request))
    row = json.loads(answer.body)
    assert row["reward"] == 0.0 and row["mask_sample"] is True
    assert row["_ng_failure_class"] == row["failure_kind"] == JUDGE_FAILED
    assert row["_ng_failure_judge_error"] == row["failure_reason"] == "ConnectionError: judge down"
    assert row["instance_config"] == {"seed": 1, "mask_sample": True}
    assert row["expected_answer"] == "4" and row["response"] == {"output": []}
    # Positional body too; and the wrapper keeps the signature a web framework reads.
    assert json.loads(asyncio.run(judge_failsafe(verify)(request)).body)["reward"] == 0.0
    assert judge_failsafe(verify).__wrapped__ is verify  # type: ignore[attr-defined]
    with pytest.raises(KeyError):
        asyncio.run(judge_failsafe(verify)(body=VerifyRequest(response={}, expected_answer="bug")))


def test_a_judge_failed_verify_row_is_a_failure_for_the_collector_not_a_reward() -> None:
    failsafe_row = {
        "reward": 0.0,
        "mask_sample": True,
        "_ng_failure_class": "judge_failed",
        "_ng_failure_judge_error": "judge down",
    }

    async def run(_: Request) -> Response:
        return JSONResponse(failsafe_row)

    async def scenario(url: str) -> None:
        client = CollectorClient(static_urls={"agent": url}, connect_retries=1)
        try:
            helper = RolloutCollectionHelper()
            outcome = await helper.run_one(
                {"responses_create_params": {"input": "q"}}, client=client, agent_name="agent"
            )
        finally:
            await client.close()
        assert outcome.result is None
        assert outcome.failure_class == "judge_failed"
        assert "judge down" in (outcome.error or "")

    # The collector prefixes the path with the rollout id (/ng-rollout/<id>/run).
    routes = [Route("/run", run, methods=["POST"]), Route("/ng-rollout/{rid}/run", run, methods=["POST"])]
    with running_app(Starlette(routes=routes)) as url:
        asyncio.run(scenario(url))


def rollouts(*rewards: float, answers: list[Any] | None = None) -> list[dict[str, Any]]:
    answers = answers or [None] * len(rewards)
    return [{"reward": r, "answer": a} for r, a in zip(rewards, answers, strict=True)]


def test_compute_pass_majority_metrics_values() -> None:
    tasks = [
        rollouts(1, 0, 0, 1, answers=["a", "b", "b", "a"]),
        rollouts(0, 0, 0, 0, answers=["c", None, "c", "d"]),
    ]
    metrics, scores, names, max_k = compute_pass_majority_metrics(tasks, answer_key="answer")
    assert (names, max_k) == (["accuracy", "no_answer"], 4)
    assert scores[1][1] == {"accuracy": 0, "no_answer": 1}
    # task 1: 2 of 4 correct -> pass@2 = 1 - C(2,2)/C(4,2) = 5/6; task 2: 0.
    assert metrics["pass@2/accuracy"] == pytest.approx(100 * (5 / 6) / 2)
    assert metrics["pass@1/accuracy"] == pytest.approx(25.0)
    assert metrics["pass@1[avg-of-4]/accuracy"] == pytest.approx(25.0)
    assert metrics["pass@1[avg-of-1]/accuracy"] == pytest.approx(50.0)
    # majority@4: task 1 ties a (2, score 1) and b (2, score 0) -> 0.5; task 2 votes c -> 0.
    assert metrics["majority@4/accuracy"] == pytest.approx(25.0)
    assert metrics["pass@1/no_answer"] == pytest.approx(12.5)
    assert metrics["per_sample_aggregate"]["accuracy"] == [50.0, 0.0, 0.0, 50.0]
    runs = [50.0, 0.0, 0.0, 50.0]
    assert metrics["pass@1[avg-of-4]/accuracy/std_dev_across_runs"] == pytest.approx(_stdev(runs))
    assert metrics["pass@1[avg-of-4]/accuracy/std_err_across_runs"] == pytest.approx(_stdev(runs) / 2)
    add_avg_sample_std_dev(metrics, scores, names, max_k)
    assert metrics["pass@1[avg-of-2]/accuracy/avg_sample_std_dev"] == pytest.approx(_stdev([1, 0]) / 2)
    # A continuous score's pass@k is the best of the first k.
    cont, _, _, _ = compute_pass_majority_metrics([rollouts(0.2, 0.7, 0.5)])
    assert cont["pass@2/accuracy"] == pytest.approx(70.0) and cont["pass@1/accuracy"] == pytest.approx(20.0)
    assert compute_pass_majority_metrics([]) == ({}, [], [], 0)


def _stdev(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_subset_and_highest_k_metrics() -> None:
    tasks = [
        [{"reward": 1, "level": "easy"}, {"reward": 1, "level": "easy"}],
        [{"reward": 0}, {"reward": 0, "level": "hard"}],
        [{"reward": 1}],
    ]
    subsets = compute_subset_metrics(tasks, "level", score_fn=lambda r: {"correct": r["reward"] == 1})
    assert subsets["easy/pass@1/correct"] == 100.0 and subsets["hard/pass@2/correct"] == 0.0
    assert not any(k.startswith("None/") or "per_sample_aggregate" in k for k in subsets)
    metrics = {
        "pass@1/accuracy": 1.0,
        "pass@8/accuracy": 2.0,
        "pass@8/no_answer": 3.0,
        "pass@1[avg-of-8]/accuracy": 4.0,
        "pass@1[avg-of-8]/accuracy/std_dev_across_runs": 5.0,
        "majority@8/accuracy": 6.0,
    }
    assert highest_k_metrics(metrics, "pass@{k}") == {"pass@8/accuracy": 2.0, "pass@8/no_answer": 3.0}
    assert highest_k_metrics(metrics, "pass@{k}", exclude_names=["no_answer"]) == {"pass@8/accuracy": 2.0}
    assert highest_k_metrics(metrics, "pass@1[avg-of-{k}]") == {"pass@1[avg-of-8]/accuracy": 4.0}
    assert highest_k_metrics(metrics, "majority@{k}", score_names=["other"]) == {}


def test_aggregate_metrics_mixin_defaults() -> None:
    mixin = AggregateMetricsMixin()
    assert mixin.compute_metrics([[{"reward": 1}]]) == {} and mixin.compute_repeat_metrics([]) == {}
    assert mixin.get_key_metrics({"mean/reward": 0.5, "pass@1/accuracy": 1.0}) == {"mean/reward": 0.5}


def test_episode_types_and_failure_kinds(caplog: pytest.LogCaptureFixture) -> None:
    assert EpisodeId(rollout_id="r.1", attempt=2).capture_key == "r.1-a2"
    assert EpisodeId(rollout_id="r1").capture_key == "r1"
    for bad in ({"rollout_id": "r-a3"}, {"rollout_id": "-x"}, {"rollout_id": "r", "attempt": -1}):
        with pytest.raises(ValidationError):
            EpisodeId(**bad)
    task = TaskId(taskset="env:train", task_id="7")
    failure = EpisodeFailure(failure_reason="sandbox died", terminal=False)
    assert failure.model_dump() == {"failure_reason": "sandbox died", "terminal": False}
    assert (
        BaseEpisodeResponse[dict](episode_id=EpisodeId(rollout_id="r"), task_id=task, failure=failure).result
        is None
    )
    with pytest.raises(ValidationError, match="exactly one of result or failure"):
        BaseEpisodeResponse[dict](episode_id=EpisodeId(rollout_id="r"), task_id=task)
    assert len(FAILURE_KINDS) == 22 and JUDGE_FAILED in FAILURE_KINDS
    assert is_namespaced("my_env:bad_tool") and not is_namespaced("Bad:x")
    with caplog.at_level(logging.WARNING, logger="nemo_gym.failure_kinds"):
        assert validate_failure_kind("odd_kind_xyz") == "odd_kind_xyz"
        validate_failure_kind("odd_kind_xyz")
    assert sum("odd_kind_xyz" in r.getMessage() for r in caplog.records) == 1


def test_prompt_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "p.yaml").write_text("system: 'Answer {{in braces}}.'\nuser: 'Q: {question}'\n")
    monkeypatch.chdir(tmp_path)
    config = load_prompt_config("p.yaml")
    assert config == PromptConfig(system="Answer {{in braces}}.", user="Q: {question}")
    row = {"question": "2+2?", "responses_create_params": {"temperature": 0.5}}
    assert fill_prompt(config, row) == [
        {"role": "system", "content": "Answer {in braces}."},
        {"role": "user", "content": "Q: 2+2?"},
    ]
    applied = apply_prompt_to_row(row, config)
    assert applied["responses_create_params"]["temperature"] == 0.5
    assert applied["responses_create_params"]["input"][1]["content"] == "Q: 2+2?"
    assert "input" not in row["responses_create_params"]  # the row itself is left alone
    with pytest.raises(KeyError, match="needs field 'question'"):
        fill_prompt(config, {"other": 1})
    with pytest.raises(ValueError, match=r"rows: \[1\]"):
        validate_prompt_compatibility([row, {"responses_create_params": {"input": "x"}}], config)


def test_package_level_names() -> None:
    assert nemo_gym.PARENT_DIR == Path(nemo_gym.__file__).resolve().parent.parent
    assert nemo_gym.CACHE_DIR.name == "cache" and nemo_gym.RESULTS_DIR.name == "results"
    assert nemo_gym._resolve_under_cwd_or_install("pyproject.toml").is_file()
    assert nemo_gym._resolve_under_cwd_or_install("/abs/x") == Path("/abs/x")


class ScoreRequest(BaseModel):
    answer: str
    expected: str


class ExactScorer:
    """A scorer for the fixture tests: 1.0 when the answer matches, 0.0 otherwise."""

    async def verify(self, request: ScoreRequest) -> dict[str, float]:
        return {"reward": 1.0 if request.answer == request.expected else 0.0}


def write_cases(path: Path, *cases: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(case) + "\n" for case in cases))
    return path


FULL = {
    "name": "right",
    "kind": "full_reward",
    "request": {"answer": "4", "expected": "4"},
    "expected_reward": 1.0,
}
ZERO = {
    "name": "wrong",
    "kind": "zero_reward",
    "request": {"answer": "5", "expected": "4"},
    "expected_reward": 0.0,
}
BAD = {"name": "no answer", "kind": "malformed", "request": {"expected": "4"}, "expected_error": "answer"}
SAME = {
    "name": "same",
    "kind": "determinism",
    "request": {"answer": "4", "expected": "4"},
    "expected_reward": 1.0,
}


def test_verifier_fixture_runs_the_cases_and_names_what_does_not_hold(tmp_path: Path) -> None:
    cases = write_cases(tmp_path / "cases.jsonl", FULL, ZERO, BAD, SAME)
    fixture = VerifierFixture(server_factory=ExactScorer, request_model=ScoreRequest, cases_path=cases)
    results = asyncio.run(exercise_verifier_fixture(fixture, reward_range=(0.0, 1.0), determinism="unknown"))
    assert [(r.name, r.observed_rewards) for r in results] == [
        ("right", (1.0,)),
        ("wrong", (0.0,)),
        ("no answer", ()),
    ]
    seeded = VerifierFixture(ExactScorer, ScoreRequest, cases, reseed=lambda server, request: None)
    results = asyncio.run(exercise_verifier_fixture(seeded, reward_range=(0.0, 1.0), determinism="seeded"))
    assert results[-1].observed_rewards == (1.0, 1.0)

    def fails(*lines: dict[str, Any], **options: Any) -> str:
        path = write_cases(tmp_path / "bad.jsonl", *lines)
        with pytest.raises(VerifierFixtureError) as info:
            asyncio.run(
                exercise_verifier_fixture(
                    VerifierFixture(ExactScorer, ScoreRequest, path),
                    **{"reward_range": (0.0, 1.0), "determinism": "unknown", **options},
                )
            )
        return str(info.value)

    assert "reward: expected 0.5, observed 1.0" in fails({**FULL, "expected_reward": 0.5}, ZERO, BAD)
    assert "lacks case kinds: malformed" in fails(FULL, ZERO)
    assert "must reach the best reward" in fails(FULL, ZERO, BAD, higher_is_better=False)
    assert "raised no error" in fails(FULL, ZERO, {**BAD, "request": {"answer": "1", "expected": "4"}})
    assert "line 1: " in fails({"name": "x", "kind": "malformed", "request": {}, "expected_reward": 1.0})

    # update_expected rewrites the expected rewards from what was observed.
    stale = write_cases(tmp_path / "stale.jsonl", {**FULL, "expected_reward": 0.25}, ZERO, BAD)
    asyncio.run(
        exercise_verifier_fixture(
            VerifierFixture(ExactScorer, ScoreRequest, stale),
            reward_range=(0, 1),
            determinism="unknown",
            update_expected=True,
        )
    )
    assert json.loads(stale.read_text().splitlines()[0])["expected_reward"] == 1.0


def test_tool_access_path_utils_and_deliverables(tmp_path: Path) -> None:
    from pydantic import TypeAdapter

    access = TypeAdapter(ToolAccess).validate_python(
        {"kind": "mcp", "name": "weather", "required": True, "connection": {"url": "http://127.0.0.1:9/mcp"}}
    )
    assert isinstance(access, MCPToolAccess) and access.connection.transport == "streamable_http"
    with pytest.raises(ValidationError):
        DirectHTTPToolAccess(name="-bad", required=False, base_url="http://127.0.0.1:1")
    out = Path("results/run.jsonl")
    assert failures_path_for(out) == Path("results/run_failures.jsonl")
    assert materialized_path_for(out) == Path("results/run_materialized_inputs.jsonl")
    assert aggregate_metrics_path_for(out) == Path("results/run_aggregate_metrics.json")
    (tmp_path / "report.md").write_text("x")
    (tmp_path / "history.json").write_text("[]")
    assert is_deliverable(tmp_path / "report.md") and not is_deliverable(tmp_path / "history.json")
    assert not is_deliverable(tmp_path / "missing.txt")


def test_rollout_correlation() -> None:
    import httpx

    from nemo_gym.rollout_correlation import (
        RolloutContextMiddleware,
        current_rollout_id,
        maybe_rollout_id_from_run_body,
        rollout_context,
    )

    async def where(request: Request) -> Response:
        return JSONResponse({"path": request.url.path, "rollout": current_rollout_id()})

    app = RolloutContextMiddleware(Starlette(routes=[Route("/tool", where, methods=["POST"])]))
    with running_app(app) as url:
        assert httpx.post(f"{url}/ng-rollout/t3-r1/tool").json() == {"path": "/tool", "rollout": "t3-r1"}
        assert httpx.post(f"{url}/tool").json() == {"path": "/tool", "rollout": None}
    assert current_rollout_id() is None
    with rollout_context("r9"):
        assert current_rollout_id() == "r9"
    assert current_rollout_id() is None
    assert maybe_rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 1}) == "3-1"
    assert (
        maybe_rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 2})
        == "3-1-a2"
    )
    assert maybe_rollout_id_from_run_body({"_ng_rollout_id": "abc"}) == "abc"
    assert maybe_rollout_id_from_run_body({"x": 1}) is None and maybe_rollout_id_from_run_body(None) is None
    with pytest.raises(ValueError, match="_ng_rollout_id must be"):
        maybe_rollout_id_from_run_body({"_ng_rollout_id": "../x"})


def test_files_named_from_the_project_root_are_found_under_extra_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "resources_servers" / "env" / "prompts").mkdir(parents=True)
    (tmp_path / "resources_servers" / "env" / "prompts" / "p.yaml").write_text("user: '{q}'\n")
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(tmp_path))
    found = nemo_gym._resolve_under_cwd_or_install("resources_servers/env/prompts/p.yaml")
    assert found == tmp_path / "resources_servers/env/prompts/p.yaml"
    assert load_prompt_config("resources_servers/env/prompts/p.yaml").user == "{q}"


def test_session_conformance_check() -> None:
    class Stateless(SimpleResourcesServer):
        pass

    class Remembering(SimpleResourcesServer):
        """Keeps sessions, but (the bug the check exists for) lets a late seed reopen a closed one."""

        async def seed_session(self, body: ResourcesSeedSessionRequest) -> ResourcesSeedSessionResponse:  # type: ignore[override]
            return ResourcesSeedSessionResponse(resources_session_id=body.resources_session_id)

        async def close_resources_session(
            self, body: ResourcesCloseSessionRequest
        ) -> ResourcesCloseSessionResponse:
            return ResourcesCloseSessionResponse(resources_session_id=body.resources_session_id)

    seed = ResourcesSeedSessionRequest(
        resources_session_id="s1",
        episode_id=EpisodeId(rollout_id="r1"),
        task_id=TaskId(taskset="t", task_id="1"),
        task_data={},
    )
    config = BaseResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="", name="env")
    check_resources_session_contract(
        Stateless(config=config, server_client=MagicMock()).setup_webserver(), seed, keeps_state=False
    )
    app = Remembering(config=config, server_client=MagicMock()).setup_webserver()
    with pytest.raises(AssertionError, match="a seed after close brought session 's1' back"):
        check_resources_session_contract(app, seed, keeps_state=True)


def test_compute_aggregate_metrics_with_an_environments_hooks() -> None:
    from nemo_gym.reward_profile import compute_aggregate_metrics

    rows = [
        {"reward": 1.0, "tier": "B", "_ng_task_index": 0, "_ng_rollout_index": 0},
        {"reward": 0.0, "tier": "B", "_ng_task_index": 0, "_ng_rollout_index": 1},
        {"reward": 1.0, "tier": "C", "_ng_task_index": 1, "_ng_rollout_index": 0},
        {"reward": 1.0, "tier": "C", "_ng_task_index": 1, "_ng_rollout_index": 1},
    ]
    seen: list[list[list[dict[str, Any]]]] = []

    def compute_metrics(tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        seen.append(tasks)
        return {**compute_subset_metrics(tasks, "tier"), "per_task_metrics": {0: {"hard": True}}}

    def repeat_metrics(tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        return {"solved": sum(r["reward"] for t in tasks for r in t)}

    result = compute_aggregate_metrics(
        rows,
        compute_metrics_fn=compute_metrics,
        get_key_metrics_fn=lambda m: {k: v for k, v in m.items() if k.startswith(("B/", "C/"))},
        compute_repeat_metrics_fn=repeat_metrics,
    )
    assert [[r["_ng_rollout_index"] for r in task] for task in seen[0]] == [[0, 1], [0, 1]]
    assert result.agent_metrics["mean/reward"] == 0.75
    assert (
        result.agent_metrics["B/pass@1/accuracy"] == 50.0
        and result.agent_metrics["C/pass@2/accuracy"] == 100.0
    )
    assert result.agent_metrics["mean_across_repeats/solved"] == 1.5
    assert result.agent_metrics["std_across_repeats/solved"] == pytest.approx(math.sqrt(0.5))
    assert "mean/reward" not in result.key_metrics and result.key_metrics["B/pass@2/accuracy"] == 100.0
    assert result.group_level_metrics[0]["hard"] is True and "hard" not in result.group_level_metrics[1]
    assert compute_aggregate_metrics([]).agent_metrics == {}


def test_rollout_observability_records() -> None:
    from nemo_gym.rollout_observability import (
        AgentInvocation,
        AgentObservationBundle,
        ModelCallRef,
        ToolCallObservation,
        TrajectoryRecord,
        TrajectoryTurn,
    )

    call = ModelCallRef(model_ref={"type": "responses_api_models", "name": "policy"}, response_id="resp_1")
    bundle = AgentObservationBundle.model_validate(
        {
            "source": "harness",
            "records": [
                {"kind": "agent_invocation", "invocation_id": "a", "model_calls": [call.model_dump()]},
                {"kind": "agent_invocation", "invocation_id": "b", "parent_invocation_id": "a"},
                {
                    "kind": "tool_call",
                    "invocation_id": "b",
                    "tool_call_id": "t1",
                    "started_at": 1.0,
                    "completed_at": 2.0,
                },
                {"kind": "sandbox", "role": "agent", "outcome": "oom"},
            ],
        }
    )
    assert isinstance(bundle.records[0], AgentInvocation) and isinstance(
        bundle.records[2], ToolCallObservation
    )
    for bad in (
        {"model_call_id": None},  # no way to join it
    ):
        with pytest.raises(ValidationError, match="model_call_id, or both model_ref and response_id"):
            ModelCallRef(**bad)
    with pytest.raises(ValidationError, match="must not form a cycle"):
        AgentObservationBundle(
            source="x",
            records=[
                AgentInvocation(invocation_id="a", parent_invocation_id="b"),
                AgentInvocation(invocation_id="b", parent_invocation_id="a"),
            ],
        )
    with pytest.raises(ValidationError, match="completed_at must not be before started_at"):
        ToolCallObservation(invocation_id="a", tool_call_id="t", started_at=2.0, completed_at=1.0)
    with pytest.raises(ValidationError, match="extra"):
        AgentInvocation(invocation_id="a", typo_field=1)  # type: ignore[call-arg]
    turn = {
        "invocation_id": "a",
        "task_id": "t",
        "rollout_id": "r",
        "turn_no": 1,
        "timestamp": 0.0,
        "step_count": 1,
    }
    TrajectoryRecord(task_id="t", rollout_id="r", turns=[TrajectoryTurn(**turn)])
    with pytest.raises(ValidationError, match="turn numbers must be unique"):
        TrajectoryRecord(task_id="t", rollout_id="r", turns=[TrajectoryTurn(**turn), TrajectoryTurn(**turn)])


class _JudgedVerifyRequest(BaseVerifyRequest):
    expected_answer: str = ""


def _failing_judge_servers() -> list[SimpleResourcesServer]:
    """A resources server whose judge call fails, in our style and in NeMo Gym's FastAPI style."""

    class OurStyle(SimpleResourcesServer):
        async def verify(self, body: _JudgedVerifyRequest) -> BaseVerifyResponse:
            if body.expected_answer == "bug":
                raise KeyError("not a judge failure")
            raise JudgeError("judge 'judge'/v1/responses answered HTTP 503: busy")

    class FastAPIStyle(OurStyle):
        def setup_webserver(self) -> Any:
            return super().setup_webserver()

    config = BaseResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="judged")
    return [OurStyle(config=config), FastAPIStyle(config=config)]


@pytest.mark.parametrize("index", [0, 1], ids=["our_style", "fastapi_style"])
def test_every_verify_route_answers_a_failed_judge_as_a_judge_failed_row(index: int) -> None:
    """NeMo Gym's base wraps every /verify in judge_failsafe: a JudgeError raised by verify is
    a 200 row (the request's fields, reward 0, masked, judge_failed), over real HTTP in both
    server styles; any other error stays a 500."""
    from nemo_gym.testing import running_server

    server = _failing_judge_servers()[index]
    assert server.uses_setup_webserver() is (index == 1)
    body = {"response": {"output": []}, "expected_answer": "4", "instance_config": {"seed": 7}}
    with running_server(server) as url, SyncClient() as client:
        status, row = client.post(f"{url}/verify", body)
        assert status == 200, row
        assert row["_ng_failure_class"] == row["failure_kind"] == JUDGE_FAILED
        assert (
            row["failure_reason"]
            == row["_ng_failure_judge_error"]
            == "judge 'judge'/v1/responses answered HTTP 503: busy"
        )
        assert row["reward"] == 0.0 and row["mask_sample"] is True
        assert row["instance_config"] == {"seed": 7, "mask_sample": True}
        assert row["expected_answer"] == "4"
        status, error = client.post(f"{url}/verify", {**body, "expected_answer": "bug"})
        assert status == 500 and "not a judge failure" in str(error)


class _AliasedVerifyRequest(BaseVerifyRequest):
    rollout_index: int | None = Field(default=None, alias="_ng_rollout_index")


class _AliasedVerifyResponse(BaseVerifyResponse):
    rollout_index: int | None = Field(default=None, alias="_ng_rollout_index")


@pytest.mark.parametrize("fastapi_style", [False, True])
def test_an_answer_model_is_sent_by_its_fields_wire_names(fastapi_style: bool) -> None:
    """FastAPI answers a pydantic model by its aliases, so NeMo Gym's environments (genrm_compare's
    ``rollout_index`` is ``_ng_rollout_index`` on the wire) and their callers expect those names:
    our servers answer the same way, in both styles."""
    from nemo_gym.testing import running_server

    class Aliased(SimpleResourcesServer):
        async def verify(self, body: _AliasedVerifyRequest) -> _AliasedVerifyResponse:
            return _AliasedVerifyResponse(**body.model_dump(by_alias=True), reward=1.0)

    class AliasedFastAPI(Aliased):
        def setup_webserver(self) -> Any:
            return super().setup_webserver()

    config = BaseResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="aliased")
    server = (AliasedFastAPI if fastapi_style else Aliased)(config=config)
    with running_server(server) as url, SyncClient() as client:
        status, row = client.post(f"{url}/verify", {"response": {"output": []}, "_ng_rollout_index": 3})
    assert status == 200 and row["_ng_rollout_index"] == 3 and "rollout_index" not in row
