"""Rollout collection against real agent servers on 127.0.0.1 (purpose-built, in-process).

Covers: indices and repeats, seeds and parameter overrides, prompt configs, malformed input
(strict and not), failure classes and deadlines, resume with attempt counting and a torn last
line, bounded in-flight rows, progress output, pass@k in the metrics file (via the agent and
the local fallback), shard merging, and the trainer API (run_examples).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
from nemo_gym.collection.collection_io import CollectionInputError, CollectionPaths
from nemo_gym.collection.metrics import pass_at_k
from nemo_gym.launch.config import ConfigError
from nemo_gym.launch.launcher import free_port
from nemo_gym.rollout_collection import (
    RolloutCollectionConfig,
    RolloutCollectionHelper,
    RolloutFailedError,
    classify_error,
    ng_aggregate_rollouts,
)
from nemo_gym.serving.server import HTTPError
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import running_server


class ProbeAgent(SimpleResponsesAPIAgent):
    """An agent whose behaviour per row comes from the row's ``mode`` field; counts its calls."""

    def __init__(self, *args: Any, broken_metrics: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.broken_metrics = broken_metrics

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(body)
        finally:
            self.in_flight -= 1

    async def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        mode = body.get("mode", "ok")
        await asyncio.sleep(float(body.get("sleep", 0)))
        attempt = body.get("_ng_attempt_index", 0)
        if mode == "judge":
            raise HTTPError(
                500, "ServerCallError: judge/verify: HTTP 500: judge_failed: the judge model timed out"
            )
        if mode == "crash":
            raise ValueError("the agent fell over")
        if mode == "hang":  # far past the test's deadline (bounded so the server can shut down)
            await asyncio.sleep(3.0)
        if mode == "noreward":
            return {**body, "response": {"output": []}}
        if mode in ("timeout_exceeded", "skipped"):  # NeMo Gym agents' own failure rows
            return {
                **body,
                "reward": 0.0,
                "_ng_failure_class": mode,
                "_ng_failure_terminal": mode != "skipped",
            }
        if mode == "invalid_judge" and not attempt:  # an old GDPVal verdict: a reward-0 result
            return {**body, "response": {"output": []}, "reward": 0.0, "invalid_judge_response": True}
        if mode == "always_fail" or (mode == "flaky" and not attempt):
            raise HTTPError(500, f"transient trouble on attempt {attempt}")
        rewards = body.get("rewards")
        reward = float(rewards[body["_ng_rollout_index"]]) if rewards else 1.0
        return {**body, "response": {"output": [], "usage": {"output_tokens": 3}}, "reward": reward}

    async def aggregate_metrics(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.broken_metrics:
            raise HTTPError(503, "metrics are down")
        self.calls.append({"aggregate_rows": len(body["verify_responses"])})
        return await super().aggregate_metrics(body)


class FailureClassAgent(SimpleResponsesAPIAgent):
    """An agent whose /run answers 500 with a ``failure_class`` in the JSON body."""

    async def _run(self, request: Request) -> Response:
        return JSONResponse(
            {"error": "sandbox gave up", "server": self.name, "failure_class": "judge_failed"}, 500
        )

    def routes(self) -> list[Route]:
        return [Route("/run", self._run, methods=["POST"]), *super().routes()]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def row(text: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}]}, **fields}


def collect(urls: dict[str, str], timeout_s: float | None = None, **config: Any) -> Any:
    async def main() -> Any:
        client = ServerClient(static_urls=urls, connect_retries=1)
        try:
            helper = RolloutCollectionHelper(server_client=client, rollout_timeout_s=timeout_s)
            return await helper.run_from_config(config)
        finally:
            await client.close()

    return asyncio.run(main())


@pytest.fixture
def agent():
    server = ProbeAgent({"name": "probe"})
    with running_server(server) as url:
        server.url = url
        yield server


def keys(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows]


def test_indices_repeats_seeds_overrides_and_side_files(agent, tmp_path: Path):
    a, b, c = row("a", q=1), row("b", q=2), row("c", q=3)
    a["responses_create_params"]["metadata"] = {"tag": "x"}
    source = write_jsonl(tmp_path / "in.jsonl", [a, b, "", a, c])  # a blank line and a repeated line
    out = tmp_path / "res" / "x.jsonl"
    summary = collect(
        {"probe": agent.url},
        agent_name="probe",
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(out),
        num_repeats=2,
        num_repeats_add_seed=True,
        responses_create_params={"temperature": 0.3},
    )
    paths = CollectionPaths.for_output(out)
    assert paths.materialized_inputs == tmp_path / "res" / "x_materialized_inputs.jsonl"
    materialized = read_jsonl(paths.materialized_inputs)
    # The repeated line shares task 0 and continues its rollout numbering.
    assert keys(materialized) == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (2, 0), (2, 1)]
    assert [m["q"] for m in materialized] == [1, 1, 2, 2, 1, 1, 3, 3]
    for m in materialized:
        params = m["responses_create_params"]
        assert params["temperature"] == 0.3
        assert json.loads(params["metadata"]["extra_body"]) == {"seed": m["_ng_rollout_index"]}
        assert m["agent_ref"] == {"type": "responses_api_agents", "name": "probe"}
    assert materialized[0]["responses_create_params"]["metadata"]["tag"] == "x"
    assert "metadata" not in b["responses_create_params"]  # the override did not leak into inputs

    results = read_jsonl(out)
    assert sorted(keys(results)) == sorted(keys(materialized))
    assert all(r["reward"] == 1.0 and r["agent_ref"]["name"] == "probe" for r in results)
    assert summary.succeeded == 8 and summary.failed == 0
    assert paths.failures.read_text() == ""
    metrics = json.loads(paths.aggregate_metrics.read_text())
    assert [m["agent_ref"]["name"] for m in metrics] == ["probe"]
    assert set(metrics[0]) == {"agent_ref", "agent_metrics", "key_metrics", "group_level_metrics"}
    assert {g["_ng_task_index"]: g["count"] for g in metrics[0]["group_level_metrics"]} == {0: 4, 1: 2, 2: 2}

    limited = collect(
        {"probe": agent.url},
        agent_name="probe",
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(tmp_path / "limited.jsonl"),
        limit=2,
        num_repeats=3,
    )
    assert limited.succeeded == 6
    assert sorted(keys(read_jsonl(tmp_path / "limited.jsonl"))) == [(t, r) for t in (0, 1) for r in range(3)]


def test_num_repeats_per_agent_and_metrics_per_agent(agent, tmp_path: Path):
    rows = [row("a", agent_ref={"name": "alpha"}), row("b", agent_ref={"name": "beta"}), row("c")]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "x.jsonl"
    collect(
        {"alpha": agent.url, "beta": agent.url, "gamma": agent.url},
        agent_map={"_default": "gamma", "alpha": "alpha", "beta": "beta"},  # rows keep their own agent
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(out),
        num_repeats={"_default": 2, "beta": 3},
    )
    per_agent: dict[str, int] = {}
    for result in read_jsonl(out):
        per_agent[result["agent_ref"]["name"]] = per_agent.get(result["agent_ref"]["name"], 0) + 1
    assert per_agent == {"alpha": 2, "beta": 3, "gamma": 2}
    metrics = json.loads(CollectionPaths.for_output(out).aggregate_metrics.read_text())
    assert [m["agent_ref"]["name"] for m in metrics] == ["alpha", "beta", "gamma"]
    assert [m["group_level_metrics"][0]["count"] for m in metrics] == [2, 3, 2]


def test_agent_name_routes_every_row_and_warns_once_about_overridden_agents(agent, tmp_path: Path, capsys):
    rows = [
        row("a", q=1, agent_ref={"name": "alpha", "type": "responses_api_agents", "extra": "kept"}),
        row("b", q=2, agent_ref={"name": "beta"}),
        row("c", q=3),
        row("d", q=4, agent_ref={"name": "alpha"}),
        row("e", q=5, agent_ref={"name": "gamma"}),
    ]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "x.jsonl"
    summary = collect(
        {"gamma": agent.url},  # alpha and beta are not even running: no row may go there
        agent_name="gamma",
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(out),
    )
    assert summary.succeeded == 5
    results = sorted(read_jsonl(out), key=lambda r: r["q"])
    assert [r["agent_ref"]["name"] for r in results] == ["gamma"] * 5
    assert results[0]["agent_ref"]["extra"] == "kept"  # only the name changes
    assert [r["responses_create_params"] for r in results] == [r["responses_create_params"] for r in rows]
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "re-routed rows" in line]
    assert len(warnings) == 1, err
    assert "alpha -> gamma" in warnings[0] and "beta -> gamma" in warnings[0]
    assert "gamma -> gamma" not in warnings[0]


def test_agent_map_precedence_and_default(agent, tmp_path: Path, capsys):
    rows = [
        row("a", q=1, agent_ref={"name": "alpha"}),  # its own name has an entry
        row("b", q=2, task_source="ts1"),  # no agent_ref: its task_source has an entry
        row("c", q=3, agent_ref={"name": "alpha"}, task_source="ts1"),  # the agent name wins
        row("d", q=4, agent_ref={"name": "delta"}),  # no entry: _default
        row("e", q=5),  # no agent_ref, no entry: _default
    ]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    urls = {name: agent.url for name in ("alpha", "beta", "delta", "gamma", "omega")}
    mapping = {"alpha": "beta", "ts1": "omega", "_default": "gamma"}
    collect(
        urls, agent_map=mapping, input_jsonl_fpath=str(source), output_jsonl_fpath=str(tmp_path / "x.jsonl")
    )
    routed = {r["q"]: r["agent_ref"]["name"] for r in read_jsonl(tmp_path / "x.jsonl")}
    assert routed == {1: "beta", 2: "omega", 3: "beta", 4: "gamma", 5: "gamma"}
    assert "alpha -> beta" in capsys.readouterr().err

    # Without _default, a row with no entry keeps its own agent_ref; the same entry as
    # +agent_name is no conflict.
    collect(
        urls,
        agent_name="gamma",
        agent_map={"alpha": "beta", "_default": "gamma"},
        input_jsonl_fpath=str(write_jsonl(tmp_path / "one.jsonl", rows[:1])),
        output_jsonl_fpath=str(tmp_path / "y.jsonl"),
    )
    assert [r["agent_ref"]["name"] for r in read_jsonl(tmp_path / "y.jsonl")] == ["beta"]
    collect(
        urls,
        agent_map={"alpha": "beta"},
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(tmp_path / "z.jsonl"),
    )
    routed = {r["q"]: r["agent_ref"]["name"] for r in read_jsonl(tmp_path / "z.jsonl")}
    assert routed == {1: "beta", 3: "beta", 4: "delta"}  # rows 2 and 5 name no agent: malformed
    failures = read_jsonl(CollectionPaths.for_output(tmp_path / "z.jsonl").failures)
    assert sorted(f["_ng_input_line"] for f in failures) == [2, 5]


def test_agent_map_naming_an_unregistered_agent_is_a_config_error(agent, tmp_path: Path):
    source = write_jsonl(tmp_path / "in.jsonl", [row("a", agent_ref={"name": "alpha"})])
    base = {"input_jsonl_fpath": str(source), "output_jsonl_fpath": str(tmp_path / "x.jsonl")}
    with pytest.raises(ConfigError, match=r"\+agent_map\.alpha: agent 'betta' is not registered"):
        collect({"alpha": agent.url, "beta": agent.url}, agent_map={"alpha": "betta"}, **base)
    # Named by the map but used by no row: still a mistake in the command line.
    with pytest.raises(ConfigError, match=r"\+agent_map\.ts9: agent 'nowhere' is not registered"):
        collect({"alpha": agent.url}, agent_map={"ts9": "nowhere"}, **base)
    with pytest.raises(ConfigError, match=r"\+agent_name: agent 'nowhere' is not registered"):
        collect({"alpha": agent.url}, agent_name="nowhere", **base)
    with pytest.raises(ConfigError, match=r"\+agent_name='a' conflicts with \+agent_map\._default='b'"):
        RolloutCollectionConfig.from_config({**base, "agent_name": "a", "agent_map": {"_default": "b"}})
    assert agent.calls == []


def test_fan_out_runs_a_row_once_per_agent_with_its_own_rollout_indices(agent, tmp_path: Path):
    rows = [
        row("a", q=1, agent_ref={"name": "env"}),
        row("b", q=2, agent_ref={"name": "gamma"}),
        row("c", q=3, task_source="ts"),
        row("d", q=4, agent_ref={"name": "old"}),
    ]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "x.jsonl"
    summary = collect(
        {name: agent.url for name in ("alpha", "beta", "gamma", "new")},
        fan_out={"env": ["alpha", "beta"], "ts": ["alpha", "gamma"]},
        agent_map={"old": "new", "env": "gamma"},  # a fan_out entry wins over the map
        num_repeats={"alpha": 2, "old": 3, "_default": 1},  # "old": the row's own key before the map
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(out),
    )
    assert summary.succeeded == 2 + 1 + 1 + 2 + 1 + 3
    got = sorted((r["q"], r["_ng_rollout_index"], r["agent_ref"]["name"]) for r in read_jsonl(out))
    assert got == [
        (1, 0, "alpha"),
        (1, 1, "alpha"),
        (1, 2, "beta"),
        (2, 0, "gamma"),
        (3, 0, "alpha"),
        (3, 1, "alpha"),
        (3, 2, "gamma"),
        (4, 0, "new"),
        (4, 1, "new"),
        (4, 2, "new"),
    ]
    assert len({r["_ng_task_index"] for r in read_jsonl(out)}) == 4
    per_agent = {m["agent_ref"]["name"]: m for m in json.loads(summary.paths.aggregate_metrics.read_text())}
    assert sorted(per_agent) == ["alpha", "beta", "gamma", "new"]

    base = {"input_jsonl_fpath": str(source), "output_jsonl_fpath": str(tmp_path / "y.jsonl")}
    with pytest.raises(ConfigError, match=r"\+fan_out\.env: agent 'delta' is not registered"):
        collect({"alpha": agent.url, "gamma": agent.url}, fan_out={"env": ["alpha", "delta"]}, **base)
    with pytest.raises(ConfigError, match=r"\+fan_out\.env must list one or more agents"):
        RolloutCollectionConfig.from_config({**base, "fan_out": {"env": []}})


def test_prompt_config_builds_input_and_rejects_a_row_with_input(agent, tmp_path: Path):
    prompt = tmp_path / "prompt.yaml"
    prompt.write_text("system: 'You solve {topic} problems.'\nuser: 'Solve: {question}'\n")
    rows = [
        {
            "topic": "math",
            "question": "2+2",
            "responses_create_params": {"tools": [{"type": "function", "name": "f"}]},
        },
        {"topic": "logic", "question": "p or not p"},
    ]
    out = tmp_path / "x.jsonl"
    collect(
        {"probe": agent.url},
        agent_name="probe",
        input_jsonl_fpath=str(write_jsonl(tmp_path / "in.jsonl", rows)),
        output_jsonl_fpath=str(out),
        prompt_config=str(prompt),
    )
    by_task = {r["_ng_task_index"]: r["responses_create_params"] for r in read_jsonl(out)}
    assert by_task[0]["input"] == [
        {"role": "system", "content": "You solve math problems."},
        {"role": "user", "content": "Solve: 2+2"},
    ]
    assert by_task[0]["tools"] == [{"type": "function", "name": "f"}]
    assert by_task[1]["input"][1]["content"] == "Solve: p or not p"

    bad = write_jsonl(tmp_path / "bad.jsonl", [rows[1], {"question": "q", **row("baked")}, {"topic": "t"}])
    before = len(agent.calls)
    with pytest.raises(CollectionInputError) as info:
        collect(
            {"probe": agent.url},
            agent_name="probe",
            input_jsonl_fpath=str(bad),
            output_jsonl_fpath=str(tmp_path / "bad_out.jsonl"),
            prompt_config=str(prompt),
            strict=True,
        )
    message = str(info.value)
    assert f"{bad}:2: row already has responses_create_params.input" in message
    assert f"{bad}:3: prompt_config system template needs field 'topic'" not in message
    assert f"{bad}:3: prompt_config user template needs field 'question'" in message
    assert len(agent.calls) == before and not (tmp_path / "bad_out.jsonl").exists()


MALFORMED = [row("ok1"), '{"responses_create_params": ', row("ok2"), "[1, 2]", '{"x": 1}']


def test_malformed_input_with_strict_stops_the_run_before_anything_is_sent(agent, tmp_path: Path):
    source = write_jsonl(tmp_path / "in.jsonl", MALFORMED)
    out = tmp_path / "x.jsonl"
    with pytest.raises(CollectionInputError) as info:
        collect(
            {"probe": agent.url},
            agent_name="probe",
            input_jsonl_fpath=str(source),
            output_jsonl_fpath=str(out),
            strict=True,
        )
    message = str(info.value)
    assert "3 malformed input line(s); nothing was run" in message
    assert f"{source}:2: not valid JSON" in message
    assert f"{source}:4: a row must be a JSON object, got list" in message
    assert f"{source}:5: row has no responses_create_params" in message
    assert "leave out +strict=true" in message
    assert agent.calls == [] and not out.exists()
    assert not CollectionPaths.for_output(out).materialized_inputs.exists()


def test_malformed_input_is_skipped_and_recorded_by_default(agent, tmp_path: Path):
    source = write_jsonl(tmp_path / "in.jsonl", MALFORMED)
    out = tmp_path / "x.jsonl"
    summary = collect(
        {"probe": agent.url},
        agent_name="probe",
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(out),
    )
    assert summary.succeeded == 2 and summary.malformed_lines == 3
    # Each bad line keeps the task index it would have had (line 2 → task 1).
    assert sorted(keys(read_jsonl(out))) == [(0, 0), (2, 0)]
    failures = read_jsonl(CollectionPaths.for_output(out).failures)
    assert [(f["_ng_failure_class"], f["_ng_input_line"]) for f in failures] == [
        ("malformed_input", 2),
        ("malformed_input", 4),
        ("malformed_input", 5),
    ]
    assert all(f["_ng_input_fpath"] == str(source) and f["_ng_error"] for f in failures)
    assert summary.next_step() == (
        f"fix input lines 2, 4, 5 of {source} (what is wrong with each is in {summary.paths.failures}), "
        "then run the same command with +resume_from_cache=true (it collects only what is missing)"
    )


def test_fixing_a_malformed_line_and_resuming_collects_just_that_line(agent, tmp_path: Path):
    lines = [row("ok1"), '{"responses_create_params": ', row("ok2"), row("ok3")]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "x.jsonl"
    first = collect(
        {"probe": agent.url},
        agent_name="probe",
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(out),
        disable_aggregation=True,
    )
    assert (first.succeeded, first.malformed_lines) == (3, 1) and "fix input line 2 of" in (
        first.next_step() or ""
    )
    write_jsonl(source, [lines[0], row("fixed"), lines[2], lines[3]])
    calls = len(agent.calls)
    again = collect(
        {"probe": agent.url},
        agent_name="probe",
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(out),
        disable_aggregation=True,
        resume_from_cache=True,
    )
    assert (again.succeeded, again.already_done, again.malformed_lines) == (1, 3, 0)
    assert len(agent.calls) == calls + 1 and again.next_step() is None
    by_key = {
        (r["_ng_task_index"], r["_ng_rollout_index"]): r["responses_create_params"]["input"][0]["content"]
        for r in read_jsonl(out)
    }
    assert by_key == {(0, 0): "ok1", (1, 0): "fixed", (2, 0): "ok2", (3, 0): "ok3"}
    assert read_jsonl(again.paths.failures) == []


def test_failures_are_classified_recorded_and_never_scored(agent, tmp_path: Path):
    dead = f"http://127.0.0.1:{free_port()}"
    rows = [
        row("a", mode="ok"),
        row("b", mode="judge"),
        row("c", agent_ref={"name": "classbody"}),
        row("d", mode="crash"),
        row("e", mode="noreward"),
        row("f", mode="hang"),
        row("g", agent_ref={"name": "ghost"}),
    ]
    out = tmp_path / "x.jsonl"
    started = time.monotonic()
    with running_server(FailureClassAgent({"name": "classbody"})) as classbody_url:
        summary = collect(
            {"probe": agent.url, "classbody": classbody_url, "ghost": dead},
            timeout_s=0.8,
            # rows without agent_ref go to probe; c and g keep their own agent
            agent_map={"_default": "probe", "classbody": "classbody", "ghost": "ghost"},
            input_jsonl_fpath=str(write_jsonl(tmp_path / "in.jsonl", rows)),
            output_jsonl_fpath=str(out),
        )
    assert time.monotonic() - started < 2.9  # the hanging row was cut off by the deadline
    results = read_jsonl(out)
    assert [r["responses_create_params"]["input"][0]["content"] for r in results] == ["a"]
    failures = {
        f["responses_create_params"]["input"][0]["content"]: f for f in read_jsonl(summary.paths.failures)
    }
    assert {k: f["_ng_failure_class"] for k, f in failures.items()} == {
        "b": "judge_failed",
        "c": "judge_failed",
        "d": "agent_error",
        "e": "agent_error",
        "f": "timeout",
        "g": "unreachable",
    }
    assert "the agent fell over" in failures["d"]["_ng_error"]
    assert "without a numeric reward" in failures["e"]["_ng_error"]
    assert "0.8s" in failures["f"]["_ng_error"]
    assert all("reward" not in f and f["_ng_attempt_index"] == 0 for f in failures.values())
    assert summary.failures_by_class == {"judge_failed": 2, "agent_error": 2, "timeout": 1, "unreachable": 1}
    metrics = json.loads(summary.paths.aggregate_metrics.read_text())
    assert metrics[0]["agent_metrics"]["mean/reward"] == 1.0  # failures are not zeros
    assert metrics[0]["group_level_metrics"][0]["count"] == 1


def test_classify_error_reads_the_class_wherever_it_arrives():
    assert classify_error({"error": "x", "failure_class": "timeout"}, "x") == "timeout"
    assert (
        classify_error({"error": "..."}, "HTTP 500: verify: {'failure_class': 'judge_failed'}")
        == "judge_failed"
    )
    assert classify_error(None, 'HTTP 500: {"failure_class": "sandbox_error", "x": 1}') == "sandbox_error"
    assert (
        classify_error({"error": "judge_failed: no verdict"}, "HTTP 500: judge_failed: no verdict")
        == "judge_failed"
    )
    assert classify_error({"error": "KeyError: 'answer'"}, "HTTP 500: KeyError: 'answer'") == "agent_error"
    # A generic upstream class gives way to the specific one the resources server's text names.
    upstream = {"error": "env/verify: HTTP 502: judge_failed: judge down", "failure_class": "upstream_error"}
    assert classify_error(upstream, upstream["error"]) == "judge_failed"
    assert (
        classify_error({**upstream, "error": "env/verify: HTTP 500: oops"}, "HTTP 502: oops")
        == "upstream_error"
    )


def hand_pass_at_k(correct: list[int], n: int, k: int) -> float:
    from math import comb

    return 100 * sum(1 - comb(n - c, k) / comb(n, k) for c in correct) / len(correct)


@pytest.mark.parametrize("broken_metrics", [False, True])
def test_metrics_file_has_pass_at_k_of_a_hand_computed_run(tmp_path: Path, capsys, broken_metrics: bool):
    rewards = [[1, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]]
    server = ProbeAgent({"name": "probe"}, broken_metrics=broken_metrics)
    out = tmp_path / "x.jsonl"
    with running_server(server) as url:
        collect(
            {"probe": url},
            agent_name="probe",
            input_jsonl_fpath=str(
                write_jsonl(tmp_path / "in.jsonl", [row(str(i), rewards=r) for i, r in enumerate(rewards)])
            ),
            output_jsonl_fpath=str(out),
            num_repeats=4,
        )
    (entry,) = json.loads(CollectionPaths.for_output(out).aggregate_metrics.read_text())
    metrics = entry["agent_metrics"]
    # Hand-computed: correct counts 2, 1, 0, 4 of n = 4.
    expected = {
        "pass@1/reward": (50 + 25 + 0 + 100) / 4,
        "pass@2/reward": 100 * ((1 - 1 / 6) + (1 - 3 / 6) + 0 + 1) / 4,
        "pass@3/reward": 100 * (1 + (1 - 1 / 4) + 0 + 1) / 4,
        "pass@4/reward": 75.0,
        "mean/reward": 7 / 16,
    }
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value), key
        if key.startswith("pass@"):
            k = int(key[5])
            assert value == pytest.approx(hand_pass_at_k([2, 1, 0, 4], 4, k))
            assert value == pytest.approx(100 * sum(pass_at_k(4, c, k) for c in (2, 1, 0, 4)) / 4)
    assert metrics["pass@1[avg-of-4]/reward"] == pytest.approx(100 * 7 / 16)
    assert entry["key_metrics"]["mean/reward"] == pytest.approx(7 / 16)
    assert [g["mean/reward"] for g in entry["group_level_metrics"]] == [0.5, 0.25, 0.0, 1.0]
    output = capsys.readouterr()
    assert "Key metrics" in output.out and "pass@4/reward=0.7500" in output.out  # printed as a fraction
    assert ("computed metrics locally" in output.err) is broken_metrics
    assert any("aggregate_rows" in c for c in server.calls) is not broken_metrics


def test_resume_retries_failures_with_attempt_index_up_to_max_attempts(agent, tmp_path: Path):
    source = write_jsonl(
        tmp_path / "in.jsonl", [row("ok"), row("flaky", mode="flaky"), row("bad", mode="always_fail")]
    )
    out = tmp_path / "x.jsonl"
    config = {
        "agent_name": "probe",
        "input_jsonl_fpath": str(source),
        "output_jsonl_fpath": str(out),
        "max_attempts": 3,
    }
    first = collect({"probe": agent.url}, **config)
    assert (first.succeeded, first.failed) == (1, 2)
    second = collect({"probe": agent.url}, **config, resume_from_cache=True)
    assert (second.already_done, second.dispatched, second.succeeded, second.failed) == (1, 2, 1, 1)
    third = collect({"probe": agent.url}, **config, resume_from_cache=True)
    assert (third.dispatched, third.failed) == (1, 1)
    calls_before = len([c for c in agent.calls if "mode" in c])
    fourth = collect({"probe": agent.url}, **config, resume_from_cache=True)
    assert fourth.dispatched == 0 and fourth.attempts_exhausted == 1
    assert len([c for c in agent.calls if "mode" in c]) == calls_before
    assert [c.get("_ng_attempt_index", 0) for c in agent.calls if c.get("mode") == "always_fail"] == [0, 1, 2]

    results = read_jsonl(out)
    assert sorted(keys(results)) == [(0, 0), (1, 0)]
    flaky = next(r for r in results if r["_ng_task_index"] == 1)
    assert flaky["_ng_attempt_index"] == 1 and "_ng_attempt_index" not in results[0]
    failures = read_jsonl(fourth.paths.failures)  # compacted: the latest record of what still fails
    assert [(f["_ng_task_index"], f["_ng_attempt_index"]) for f in failures] == [(2, 2)]
    (entry,) = json.loads(fourth.paths.aggregate_metrics.read_text())
    assert sum(g["count"] for g in entry["group_level_metrics"]) == 2  # the whole run, not the last call


def test_resume_keeps_failures_stamped_final_unless_the_failure_contract_retries_them(agent, tmp_path: Path):
    """NeMo Gym's failure contract: a failure stamped _ng_failure_terminal is not dispatched again
    on resume; +retry_terminal_timeouts retries a stamped timeout (and keeps a skipped sample
    final, stamped or not); +retry_invalid_judge_responses moves reward-0 invalid-judge results to
    the failures file so they are judged again."""
    modes = ["timeout_exceeded", "skipped", "invalid_judge"]
    source = write_jsonl(tmp_path / "in.jsonl", [row(m, mode=m) for m in modes])
    out = tmp_path / "x.jsonl"
    config = {"agent_name": "probe", "input_jsonl_fpath": str(source), "output_jsonl_fpath": str(out)}

    def dispatched(since: int) -> list[str]:
        return [c["mode"] for c in agent.calls[since:] if "mode" in c]

    first = collect({"probe": agent.url}, **config, max_attempts=5)
    assert (first.succeeded, first.failed) == (1, 2)
    seen = len(agent.calls)
    second = collect({"probe": agent.url}, **config, max_attempts=5, resume_from_cache=True)
    assert dispatched(seen) == ["skipped"] and second.attempts_exhausted == 1  # the stamped timeout
    seen = len(agent.calls)
    third = collect(
        {"probe": agent.url},
        **config,
        max_attempts=5,
        resume_from_cache=True,
        retry_terminal_timeouts=True,
        retry_invalid_judge_responses=True,
    )
    assert sorted(dispatched(seen)) == ["invalid_judge", "timeout_exceeded"]
    assert third.attempts_exhausted == 1  # skipped: final under the contract though not stamped
    judged = [r for r in read_jsonl(out) if r["mode"] == "invalid_judge"]
    assert len(judged) == 1 and judged[0]["reward"] == 1.0 and judged[0]["_ng_attempt_index"] == 1


def test_require_complete_fails_the_run_after_its_files_are_written(agent, tmp_path: Path):
    source = write_jsonl(tmp_path / "in.jsonl", [row("ok"), row("bad", mode="always_fail")])
    out = tmp_path / "x.jsonl"
    config = {"agent_name": "probe", "input_jsonl_fpath": str(source), "output_jsonl_fpath": str(out)}
    with pytest.raises(
        RuntimeError, match=r"EVAL FAILED: 1/2 samples completed. Partial artifacts retained at"
    ):
        collect({"probe": agent.url}, **config, require_complete=True)
    assert keys(read_jsonl(out)) == [(0, 0)] and CollectionPaths.for_output(out).failures.exists()
    assert collect({"probe": agent.url}, **config, resume_from_cache=True).failed == 1  # off: no error


def test_check_completion_counts_distinct_completed_rollouts_per_stage() -> None:
    from nemo_gym.rollout_collection import SharedRolloutCollectionConfig

    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "stage_index": 0},
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "stage_index": 1},
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "stage_index": 1},  # the same rollout again
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "_ng_failure_class": "timeout"},
        {"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_no_persist": True},
    ]
    off = SharedRolloutCollectionConfig(output_jsonl_fpath="r.jsonl")
    off.check_completion(expected=99, results=rows)  # without require_complete: nothing
    on = SharedRolloutCollectionConfig(output_jsonl_fpath="r.jsonl", require_complete=True)
    on.check_completion(expected=2, results=rows)
    with pytest.raises(RuntimeError, match="2/3 samples completed"):
        on.check_completion(expected=3, results=rows)


def test_resume_drops_a_torn_last_line_and_skips_finished_rows(agent, tmp_path: Path):
    source = write_jsonl(tmp_path / "in.jsonl", [row(str(i)) for i in range(6)])
    out = tmp_path / "x.jsonl"
    config = {"agent_name": "probe", "input_jsonl_fpath": str(source), "output_jsonl_fpath": str(out)}
    collect({"probe": agent.url}, **config, num_samples_in_parallel=1)
    data = out.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    out.write_bytes(data[: last_start + 25])  # a write cut off by kill -9
    lost = json.loads(data[last_start:])
    with pytest.raises(Exception, match="already holds results"):
        collect({"probe": agent.url}, **config)
    calls = len(agent.calls)
    summary = collect({"probe": agent.url}, **config, resume_from_cache=True)
    assert summary.dispatched == 1 and len(agent.calls) == calls + 1 + 1  # one rerun + the metrics call
    results = read_jsonl(out)
    assert sorted(keys(results)) == [(i, 0) for i in range(6)]
    assert (results[-1]["_ng_task_index"], results[-1]["_ng_rollout_index"]) == (
        lost["_ng_task_index"],
        lost["_ng_rollout_index"],
    )


def test_rows_in_flight_are_bounded_and_progress_is_reported(agent, tmp_path: Path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", [row(str(i), sleep=0.05) for i in range(24)])
    summary = collect(
        {"probe": agent.url},
        agent_name="probe",
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(tmp_path / "x.jsonl"),
        num_samples_in_parallel=3,
        progress_interval_s=0.15,
        disable_aggregation=True,
    )
    assert summary.succeeded == 24 and agent.max_in_flight == 3
    assert not summary.paths.aggregate_metrics.exists()
    err = capsys.readouterr().err
    assert "rollout/s" in err
    periodic = [
        line
        for line in err.splitlines()
        if line.startswith("[ng_collect_rollouts]") and "/24 finished" in line
    ]
    assert len(periodic) >= 2 and "mean reward: probe=1.0000" in periodic[-1]


def test_run_examples_yields_futures_in_completion_order(agent):
    async def main() -> None:
        client = ServerClient(static_urls={"probe": agent.url})
        helper = RolloutCollectionHelper(server_client=client)
        rows = [
            row("slow", sleep=0.4),
            row("fast", sleep=0.0),
            row("boom", mode="crash"),
            row("mid", sleep=0.2),
        ]
        for r in rows:
            r["agent_ref"] = {"name": "probe"}
        seen, failures = [], []
        for future in helper.run_examples(rows, semaphore=asyncio.Semaphore(4)):
            assert isinstance(future, asyncio.Future)
            try:
                got_row, result = await future
            except RolloutFailedError as exc:
                failures.append(exc.failure_class)
                continue
            text = result["responses_create_params"]["input"][0]["content"]
            assert (
                any(got_row is r for r in rows)
                and got_row["responses_create_params"]["input"][0]["content"] == text
            )
            seen.append(text)
        assert failures == ["agent_error"]
        assert seen == ["fast", "mid", "slow"]
        await client.close()

    asyncio.run(main())


def test_aggregate_rollouts_merges_shards_dedups_and_sorts(agent, tmp_path: Path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", [row(str(i), rewards=[1, i % 2]) for i in range(5)])
    shards = []
    for index in range(2):
        shard = tmp_path / "results" / f"shard{index}.jsonl"
        collect(
            {"probe": agent.url},
            agent_name="probe",
            input_jsonl_fpath=str(source),
            output_jsonl_fpath=str(shard),
            num_repeats=2,
            num_shards=2,
            shard_index=index,
            disable_aggregation=True,
        )
        shards.append(read_jsonl(shard))
    assert len(shards[0]) + len(shards[1]) == 10 and not set(keys(shards[0])) & set(keys(shards[1]))
    # A third shard overlapping the first (a rerun), whose last line was cut off by a kill.
    overlap = tmp_path / "results" / "shard2.jsonl"
    overlap.write_bytes(
        (tmp_path / "results" / "shard0.jsonl").read_bytes() + b'{"_ng_task_index": 4, "_ng_ro'
    )
    merged = tmp_path / "merged" / "all.jsonl"
    with pytest.raises(SystemExit) as exited:
        ng_aggregate_rollouts(
            [
                f"+input_glob={tmp_path / 'results' / 'shard*.jsonl'}",
                f"+output_jsonl_fpath={merged}",
                f"++head_server.port={free_port()}",
            ]
        )
    assert exited.value.code == 0
    rows = read_jsonl(merged)
    assert keys(rows) == [(t, r) for t in range(5) for r in range(2)]
    out = capsys.readouterr()
    assert f"{len(shards[0])} duplicate(s) dropped" in out.out and "computing metrics locally" in out.out
    assert "skipped a cut-off last line" in out.err
    (entry,) = json.loads(CollectionPaths.for_output(merged).aggregate_metrics.read_text())
    assert entry["agent_metrics"]["mean/reward"] == pytest.approx(7 / 10)
    assert entry["agent_metrics"]["pass@2/reward"] == pytest.approx(100.0)
    assert entry["agent_metrics"]["pass@1/reward"] == pytest.approx(70.0)


def test_bad_arguments_are_named():
    base = {"input_jsonl_fpath": "in.jsonl", "output_jsonl_fpath": "out.jsonl"}
    with pytest.raises(
        ConfigError, match=r"\+num_samples_in_parallel: Input should be greater than or equal to 1"
    ):
        RolloutCollectionConfig.from_config({**base, "num_samples_in_parallel": 0})
    with pytest.raises(ConfigError, match=r"\+output_jsonl_fpath: Field required"):
        RolloutCollectionConfig.from_config({"input_jsonl_fpath": "in.jsonl"})
    with pytest.raises(ConfigError, match=r"\+num_repeats must be >= 1"):
        RolloutCollectionConfig.from_config({**base, "num_repeats": {"_default": 0}})
    with pytest.raises(ConfigError, match=r"\+shard_index=2 must be < \+num_shards=2"):
        RolloutCollectionConfig.from_config({**base, "num_shards": 2, "shard_index": 2})
