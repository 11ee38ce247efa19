"""NeMo Gym's task-data, task-materialization, skills and dataset-config modules, and the
``RewardProfiler`` helpers, at their NeMo Gym paths: real files, real schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.config_types import DatasetConfig
from nemo_gym.reward_profile import RewardProfiler
from nemo_gym.skills import hash_skill_dir, load_skill_directory, parse_skill_md, stage_skills
from nemo_gym.task_data import (
    TaskDataSchemaError,
    TaskDataValidator,
    find_server_dir,
    load_task_data_schema,
    normalize_task_fields,
    validate_jsonl_rows,
)
from nemo_gym.task_materialization import materialize_task

SCHEMA = """
from pydantic import BaseModel, ConfigDict, Field

class TaskData(BaseModel):
    model_config = ConfigDict(extra="allow")
    expected_answer: str
    difficulty: int = 0
    gold: str | None = Field(default=None, json_schema_extra={"legacy_location": "verifier_metadata"})
"""


@pytest.fixture
def server_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "resources_servers" / "my_env"
    folder.mkdir(parents=True)
    (folder / "task_data.py").write_text(SCHEMA)
    return folder


def test_schema_loads_and_a_server_without_one_has_none(server_dir: Path, tmp_path: Path) -> None:
    adapter = load_task_data_schema(server_dir)
    assert adapter is not None
    assert adapter.validate_python({"expected_answer": "4"}).difficulty == 0
    assert load_task_data_schema(tmp_path) is None


def test_broken_schemas_are_named(tmp_path: Path) -> None:
    (tmp_path / "task_data.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(TaskDataSchemaError, match=r"task_data\.py: importing it failed: boom"):
        load_task_data_schema(tmp_path)
    (tmp_path / "task_data.py").write_text("X = 1\n")
    with pytest.raises(TaskDataSchemaError, match="defines no `TaskData`"):
        load_task_data_schema(tmp_path)


def test_find_server_dir_uses_the_extra_roots(server_dir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(tmp_path))
    assert find_server_dir("my_env") == server_dir
    assert find_server_dir("no_such_env") is None


def test_normalize_lifts_containers_and_reports_conflicts() -> None:
    row = {
        "responses_create_params": {"input": "x"},
        "_ng_task_index": 3,
        "a": 1,
        "verifier_metadata": {"a": 1, "b": 2},
        "task_data": {"a": 9, "c": 3},
    }
    fields, conflicts = normalize_task_fields(row)
    assert fields == {"a": 1, "b": 2, "c": 3}
    assert conflicts == ["a"]
    # A container that is not a mapping stays for the schema to reject.
    assert normalize_task_fields({"verifier_metadata": "oops"}) == ({"verifier_metadata": "oops"}, [])


def test_validator_reports_failures_unknown_conflicting_and_misplaced_keys(server_dir: Path) -> None:
    validator = TaskDataValidator("my_env", load_task_data_schema(server_dir), "data.jsonl")
    validator.validate_row(0, {"expected_answer": "4", "verifier_metadata": {"gold": "4"}})
    assert validator.report.clean, validator.report.summary()
    validator.validate_row(1, {"difficulty": 2})  # no expected_answer
    validator.validate_row(2, {"expected_answer": "4", "typo_field": 1})
    validator.validate_row(3, {"expected_answer": "4", "gold": "4"})  # read from verifier_metadata only
    validator.validate_row(4, {"expected_answer": "4", "verifier_metadata": {"expected_answer": "5"}})
    report = validator.report
    assert (report.rows, report.error_rows) == (5, 1)
    assert report.errors[0].startswith("1: ") and "expected_answer" in report.errors[0]
    assert report.unknown_keys == {"typo_field": 1}
    assert report.misplaced_keys == {"gold": 1}
    assert report.conflicting_keys == {"expected_answer": 1}
    summary = report.summary()
    assert "data.jsonl: 1/5 rows failed" in summary and "`my_env`" in summary
    assert "typo_field (1 rows)" in summary and "gold (1 rows)" in summary


def test_validator_flattens_materialized_tasks(server_dir: Path) -> None:
    validator = TaskDataValidator("my_env", load_task_data_schema(server_dir), "tasks.jsonl")
    task = materialize_task({"expected_answer": "4", "problem_id": "p7"}, taskset="my_env:train")
    validator.validate_row(0, task)
    validator.validate_row(
        1, {"task_id": {"taskset": "t", "task_id": "1"}, "task_input": ["not", "a", "dict"]}
    )
    assert validator.report.error_rows == 1
    assert validator.report.errors == ["1: task_input must be an object, got list"]


def test_validate_jsonl_rows_skips_blank_lines(server_dir: Path) -> None:
    lines = [json.dumps({"expected_answer": "1"}), "", json.dumps({"nothing": True})]
    report = validate_jsonl_rows("my_env", load_task_data_schema(server_dir), "f.jsonl", lines)
    assert (report.rows, report.error_rows) == (2, 1)
    assert report.errors[0].startswith("2: ")


def test_materialize_task_ids_and_routing_fields() -> None:
    row = {
        "responses_create_params": {"input": "2+2"},
        "agent_ref": {"type": "responses_api_agents", "name": "a"},
        "task_source": "x",
        "skills_ref": {"path": "s"},
        "_ng_task_index": 4,
        "_ng_rollout_index": 1,
        "expected_answer": "4",
    }
    task = materialize_task(row, taskset="math:train")
    assert task == {
        "task_id": {"taskset": "math:train", "task_id": "4"},
        "task_input": {"responses_create_params": {"input": "2+2"}, "expected_answer": "4"},
    }
    assert materialize_task({"instance_id": 12}, taskset="t", task_index=0)["task_id"]["task_id"] == "12"
    assert materialize_task({"x": 1}, taskset="t", task_index=7)["task_id"]["task_id"] == "7"
    with pytest.raises(ValueError, match="non-negative task_index"):
        materialize_task({"x": 1}, taskset="t")
    with pytest.raises(ValueError, match="non-negative task_index"):
        materialize_task({"x": 1}, taskset="t", task_index=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already a materialized task"):
        materialize_task(task, taskset="t")
    assert row["_ng_task_index"] == 4  # the source row is untouched


def test_dataset_config_has_nemo_gym_preparation_fields() -> None:
    config = DatasetConfig.model_validate(
        {
            "name": "v",
            "type": "validation",
            "jsonl_fpath": "data/v.jsonl",
            "prepare_script": "environments/x/prepare.py",
            "taskset": "x:validation",
        }
    )
    assert config.prepare_script == Path("environments/x/prepare.py")
    assert config.taskset == "x:validation" and config.prepare_dependencies == []
    with pytest.raises(ValueError, match="taskset"):
        DatasetConfig.model_validate({"name": "v", "type": "example", "jsonl_fpath": "a", "taskset": ""})


def _skill(root: Path, name: str, header: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(header)
    return folder


def test_skill_directory_loads_hashes_and_stages(tmp_path: Path) -> None:
    skills = tmp_path / "skills"
    _skill(skills, "b_skill", "---\nname: beta\n---\nbody\n")
    helper = _skill(
        skills, "a_skill", "\ufeff---\nname: alpha\ndescription: Adds.\nmetadata: {version: 2}\n---\n"
    )
    ref = load_skill_directory(str(skills))
    assert [s.name for s in ref.skills] == ["alpha", "beta"]
    assert ref.skills[0].description == "Adds." and ref.skills[0].version == "2"
    assert ref.path == str(skills) and len(ref.hash) == 12
    first = ref.hash
    (helper / "notes.txt").write_text("more")
    assert hash_skill_dir(skills) != first  # a new file changes the identity
    dest = tmp_path / "home" / "skills"
    stage_skills(str(skills), dest)
    assert (dest / "a_skill" / "notes.txt").read_text() == "more"
    with pytest.raises(FileExistsError):
        stage_skills(str(skills), dest)


def test_bad_skills_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_skill_directory(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="holds no skill folders"):
        load_skill_directory(str(tmp_path))
    (tmp_path / "empty_skill").mkdir()
    with pytest.raises(ValueError, match="has no SKILL.md"):
        load_skill_directory(str(tmp_path))
    for text, message in [
        ("name: x\n", "must start with a '---' line"),
        ("---\nname: x\n", "never closed"),
        ("---\n- a\n---\n", "must be a mapping"),
        ("---\ndescription: d\n---\n", "has no 'name'"),
        ("---\nname: [\n---\n", "does not parse"),
    ]:
        path = tmp_path / "SKILL.md"
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            parse_skill_md(path)
    with pytest.raises(ValueError, match="is a file"):
        stage_skills(str(tmp_path / "SKILL.md"), tmp_path / "dest")


def _row(task: int, rollout: int, **extra) -> dict:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, **extra}


def test_reward_profiler_aligns_and_summarises_completion() -> None:
    profiler = RewardProfiler()
    rows = [_row(0, 0), _row(0, 1), _row(1, 0), _row(2, 0)]
    results = [_row(0, 1, reward=1.0), _row(0, 0, reward=0.0), _row(1, 0, reward=1.0)]
    with pytest.raises(
        ValueError, match=r"1 materialized input rows have no result; first keys: \[\(2, 0\)\]"
    ):
        profiler.align_rows_and_results(rows, results)
    pairs = profiler.align_rows_and_results(rows, results, allow_partial_rollouts=True)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"], res["reward"]) for r, res in pairs] == [
        (0, 0, 0.0),
        (0, 1, 1.0),
        (1, 0, 1.0),
    ]
    with pytest.raises(ValueError, match="match no materialized input row"):
        profiler.align_rows_and_results(rows[:1], results)
    with pytest.raises(ValueError, match=r"two result rows have the rollout key"):
        profiler.align_rows_and_results(rows, [*results, _row(0, 0)])
    summary = profiler.profile_completion_summary(rows, results[1:])
    assert summary == {
        "expected_rollout_rows": 4,
        "completed_rollout_rows": 2,
        "missing_rollout_rows": 2,
        "extra_rollout_rows": 0,
        "reward_profile_completion_pct": 50.0,
        "total_input_rows": 3,
        "complete_input_rows": 1,
        "partial_input_rows": 1,
        "missing_input_rows": 1,
    }


def test_rollout_info_keeps_numbers_and_drops_bookkeeping() -> None:
    result = _row(
        2,
        1,
        reward=0.5,
        passed=True,
        label="text",
        _ng_group_attempt=3,
        response={"usage": {"input_tokens": 10, "output_tokens": 4, "input_tokens_details": {"cached": 1}}},
    )
    assert RewardProfiler().rollout_info_from_result(result) == {
        "rollout_id": "2:1",
        "_ng_task_index": 2,
        "_ng_rollout_index": 1,
        "reward": 0.5,
        "input_tokens": 10,
        "output_tokens": 4,
        "passed": 1,
    }


def test_head_server_config_and_num_workers(monkeypatch) -> None:
    from nemo_gym.base_resources_server import BaseResourcesServerConfig
    from nemo_gym.server_utils import ServerClient

    monkeypatch.setenv("NEMO_GYM_HEAD_URL", "http://10.1.2.3:18000")
    head = ServerClient.load_head_server_config()
    assert (head.host, head.port) == ("10.1.2.3", 18000)
    monkeypatch.delenv("NEMO_GYM_HEAD_URL")
    assert (ServerClient.load_head_server_config().port) == 11000
    assert BaseResourcesServerConfig(name="x").num_workers is None
    assert BaseResourcesServerConfig(name="x", num_workers=1).num_workers == 1


async def test_raise_for_status_reads_the_body_stream() -> None:
    import aiohttp
    from aiohttp import web

    from nemo_gym.server_utils import raise_for_status
    from nemo_gym.testing import serving_aiohttp_app

    async def offline(request: web.Request) -> web.Response:
        return web.json_response({"error": "judge offline"}, status=503)

    app = web.Application()
    app.router.add_post("/v1/responses", offline)
    async with serving_aiohttp_app(app) as url, aiohttp.ClientSession() as session:
        response = await session.post(f"{url}/v1/responses", json={})
        with pytest.raises(aiohttp.ClientResponseError) as caught:
            await raise_for_status(response)
        assert caught.value.status == 503
        assert json.loads(caught.value.response_content) == {"error": "judge offline"}  # type: ignore[attr-defined]


def test_a_bad_skills_path_is_a_config_error(tmp_path: Path) -> None:
    from nemo_gym.collection.settings import RolloutCollectionConfig
    from nemo_gym.launch.config import ConfigError

    config = RolloutCollectionConfig.model_validate(
        {
            "input_jsonl_fpath": "in.jsonl",
            "output_jsonl_fpath": str(tmp_path / "out.jsonl"),
            "agent_name": "a",
            "skills": {"path": str(tmp_path / "nope")},
        }
    )
    with pytest.raises(ConfigError, match=r"\+skills.path: .*does not exist"):
        config.row_materializer()


def test_an_observed_conversation_keeps_typed_items() -> None:
    # claude_code_agent finds its tool results in an invocation's conversation with isinstance.
    from nemo_gym.openai_utils import NeMoGymFunctionCallOutput
    from nemo_gym.rollout_observability import AgentInvocation

    output = NeMoGymFunctionCallOutput(
        call_id="c", output="o", status="incomplete", type="function_call_output"
    )
    invocation = AgentInvocation(invocation_id="i", conversation=[output, {"role": "user", "content": "hi"}])
    assert invocation.conversation[0] is output
    assert invocation.conversation[1].type == "message" and invocation.conversation[1].role == "user"
    dumped = invocation.model_dump(mode="json")["conversation"]
    assert dumped[0]["status"] == "incomplete" and dumped[1] == {
        "type": "message",
        "role": "user",
        "content": "hi",
    }


def test_openai_model_answers_to_nemo_gyms_class_names() -> None:
    # gdpval builds judge proxies as openai_model's SimpleModelServer(config=SimpleModelServerConfig(...)).
    from responses_api_models.openai_model import app

    config = app.SimpleModelServerConfig(
        name="judge", openai_base_url="http://127.0.0.1:9/v1", openai_model="m"
    )
    assert isinstance(config, app.OpenAIModelConfig) and app.SimpleModelServer is app.OpenAIModel
