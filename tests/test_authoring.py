"""ng_init_resources_server and ng_test: scaffold an environment, check it, run it end to end."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import nemo_gym
from nemo_gym.launch.config import ConfigError, project_root
from nemo_gym.tools.authoring import check_server, format_table
from nemo_gym.tools.scaffold import init_resources_server, ng_init_resources_server, scaffold_files


def run_command(module: str, command: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A console command in a fresh interpreter, the way a user runs it."""
    code = f"from {module} import {command}; {command}({args!r})"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_scaffold_validates_the_name_and_never_overwrites(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for bad in ("MyEnv", "2fast", "my-env", "class", "resources_servers/a/b", "responses_api_models/x"):
        entry = bad if "/" in bad else f"resources_servers/{bad}"
        with pytest.raises(SystemExit) as exit_info:
            ng_init_resources_server([f"+entrypoint={entry}"])
        assert exit_info.value.code == 2
    assert "lowercase Python identifier" in capsys.readouterr().err
    assert not (tmp_path / "resources_servers").exists()

    with pytest.raises(SystemExit) as exit_info:
        ng_init_resources_server(["+entrypoint=resources_servers/weather_env"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "ng_test +entrypoint=resources_servers/weather_env" in printed and "ng_run" in printed
    folder = tmp_path / "resources_servers" / "weather_env"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == sorted(
        [*scaffold_files("weather_env"), "data/example_metrics.json"]
    )
    app = (folder / "app.py").read_text()
    assert "class WeatherEnvServer(SimpleResourcesServer)" in app and "@tool" in app
    config = (folder / "configs" / "weather_env.yaml").read_text()
    assert "weather_env_simple_agent:" in config and "name: policy_model" in config
    assert len((folder / "data" / "example.jsonl").read_text().splitlines()) == 5

    (folder / "README.md").write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        init_resources_server("resources_servers/weather_env", cwd=tmp_path)
    assert (folder / "README.md").read_text() == "mine"


def test_ng_test_names_bad_rows_and_tools_without_routes(tmp_path: Path):
    folder = init_resources_server("resources_servers/broken_env", cwd=tmp_path)
    data = folder / "data" / "example.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[1]["responses_create_params"]["tools"][0]["name"] = "subtract_numbers"
    del rows[3]["responses_create_params"]["input"]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n")

    check = check_server(folder, run_tests=False)
    assert not check.ok
    problems = "\n".join(check.problems)
    assert f"{data}:2: the rows offer tool 'subtract_numbers'" in problems
    assert "POST /subtract_numbers" in problems
    assert f"{data}:4: responses_create_params.input: field required" in problems
    assert f"{data}:6: not valid JSON" in problems
    assert "add_numbers" not in problems  # the tool the server does serve is fine


def test_ng_test_accepts_catch_all_tool_routes():
    # xlam_fc serves any offered tool through one /{tool_name} route: its rows must pass.
    from nemo_gym.launch.config import project_root

    folder = project_root() / "resources_servers" / "xlam_fc"
    if not folder.exists():
        pytest.skip("xlam_fc is not in this checkout")
    check = check_server(folder, run_tests=False)
    assert check.problems == [] and check.rows == 5


@pytest.mark.slow
def test_ng_test_without_entrypoint_runs_every_environment(tmp_path: Path):
    init_resources_server("resources_servers/good_env", cwd=tmp_path)
    bad = init_resources_server("resources_servers/bad_env", cwd=tmp_path)
    tests = bad / "tests" / "test_app.py"
    tests.write_text(tests.read_text() + "\n\ndef test_fails():\n    assert 1 == 2\n")

    done = run_command("nemo_gym.tools.authoring", "ng_test", [], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    table = done.stdout[done.stdout.index("ENVIRONMENT") :]
    assert "bad_env" in table and "FAILED" in table and "1 failed, 3 passed" in table
    assert "good_env" in table and "3 passed" in table
    assert "1/2 environments passed; failed: bad_env" in done.stdout
    assert "assert 1 == 2" in done.stdout  # the failing test's output is shown


@pytest.mark.slow
def test_scaffolded_environment_passes_ng_test_and_collects_rollouts(tmp_path: Path, monkeypatch):
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.testing import running_stack

    init_resources_server("resources_servers/adder_env", cwd=tmp_path)
    done = run_command(
        "nemo_gym.tools.authoring", "ng_test", ["+entrypoint=resources_servers/adder_env"], tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[adder_env] ok: 5 example rows, tests: 3 passed" in done.stdout

    monkeypatch.chdir(tmp_path)
    configs = [
        "resources_servers/adder_env/configs/adder_env.yaml",
        "responses_api_models/scripted_model/configs/scripted_model.yaml",
        "resources_servers/adder_env/configs/scripted_policy.yaml",
    ]
    output = tmp_path / "rollouts.jsonl"
    with running_stack(configs) as handle:
        summary = asyncio.run(
            RolloutCollectionHelper().run_from_config(
                {
                    "agent_name": "adder_env_simple_agent",
                    "input_jsonl_fpath": "resources_servers/adder_env/data/example.jsonl",
                    "output_jsonl_fpath": str(output),
                    "head_server": handle.head_server_config,
                },
                verbose=False,
            )
        )
    assert (summary.succeeded, summary.failed) == (5, 0)
    metrics = summary.metrics[0]
    assert metrics["agent_metrics"]["mean/reward"] == 1.0 and metrics["key_metrics"]
    rollouts = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rollouts) == 5
    expected = sorted(
        json.loads(line)["expected_answer"]
        for line in (tmp_path / "resources_servers/adder_env/data/example.jsonl").read_text().splitlines()
    )
    assert sorted(r["extracted_answer"] for r in rollouts) == expected
    assert all(r["reward"] == 1.0 and r["used_tool"] for r in rollouts)
    # The committed statistics match the rows: ng_prepare_data validates them without drift.
    from nemo_gym.launch.config import load_config
    from nemo_gym.tools.prepare_data import prepare_data

    report = io.StringIO()
    argv = [
        f"+config_paths=[{','.join(configs[:2])}]",
        "+output_dirpath=prepared",
        "+mode=example_validation",
    ]
    assert prepare_data(load_config(argv), out=report) == 0, report.getvalue()
    assert "drift" not in report.getvalue()
    assert len((tmp_path / "prepared" / "example.jsonl").read_text().splitlines()) == 5
    # The tool really ran: its output went back to the model and into the final answer.
    outputs = [
        item["output"]
        for r in rollouts
        for item in r["response"]["output"]
        if item["type"] == "function_call_output"
    ]
    assert len(outputs) == 5 and all('"sum"' in o for o in outputs)


def test_format_table_lists_each_environment(tmp_path: Path):
    folder = init_resources_server("resources_servers/table_env", cwd=tmp_path)
    check = check_server(folder, run_tests=False)
    table = format_table([check])
    assert table.splitlines()[0].split() == ["ENVIRONMENT", "RESULT", "TESTS", "ROWS", "PROBLEMS", "TIME"]
    assert table.splitlines()[1].split()[:5] == ["table_env", "FAILED", "not", "run", "5"]


# ---- the tutorial's environment (docs/WRITING_ENVIRONMENTS.md) runs as written -------------------
DOC = Path(__file__).resolve().parent.parent / "docs" / "WRITING_ENVIRONMENTS.md"


def doc_block(after: str, language: str) -> str:
    """The first ```<language> block after the text ``after`` in the tutorial."""
    text = DOC.read_text()
    start = text.index(f"```{language}\n", text.index(after)) + len(language) + 4
    return text[start : text.index("\n```", start)]


def test_tutorial_and_guides_import_the_public_surface_only(tmp_path: Path):
    from tests.test_import_graph import framework_import_problem, imported_names

    top_level = {p.stem for p in Path(nemo_gym.__file__).parent.glob("*.py")}
    docs = [DOC, DOC.with_name("WRITING_AGENTS_AND_MODELS.md")]
    blocks = [b.split("\n```")[0] for doc in docs for b in doc.read_text().split("```python\n")[1:]]
    assert len(blocks) > 5
    problems = []
    for number, block in enumerate(blocks):
        path = tmp_path / f"block{number}.py"
        path.write_text(block)
        try:
            names = imported_names(path)
        except SyntaxError:
            continue  # a fragment (an indented method), not a module
        problems += [f"{name}: {why}" for name in names if (why := framework_import_problem(name, top_level))]
    assert problems == []


def test_tutorial_environment_runs_as_written(tmp_path: Path):
    import importlib.util

    from nemo_gym.response_items import function_call_item, message_item
    from nemo_gym.serving.server_client import ServerClient
    from nemo_gym.testing import SyncClient, running_server
    from responses_api_models.scripted_model.app import ScriptedModel

    app = tmp_path / "capital_quiz_app.py"
    app.write_text(doc_block("<!-- tutorial-app", "python"))
    spec = importlib.util.spec_from_file_location("_tutorial_capital_quiz", app)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    row = json.loads(doc_block("## 3. Rows", "json"))
    # The row's tools are what the row builder makes from the tool method: nothing pasted by hand.
    built = module.CapitalQuizServer.build_row(
        row["responses_create_params"]["input"][1]["content"],
        instructions=row["responses_create_params"]["input"][0]["content"],
        **{k: v for k, v in row.items() if k != "responses_create_params"},
    )
    assert built == row

    judge_scripts = [
        {"match": "Given answer: Sydney", "turns": [{"text": "Sydney is another city. [[DIFFERENT]]"}]},
        {"match": "Given answer: Atlantis", "turns": [{"text": "I cannot say."}]},
        {"match": None, "turns": [{"text": "Same place. [[SAME]]"}]},
    ]
    with running_server(ScriptedModel({"name": "judge", "scripts": judge_scripts})) as judge_url:
        server = module.CapitalQuizServer(
            {"name": "capital_quiz", "judge_model_server": {"type": "responses_api_models", "name": "judge"}},
            server_client=ServerClient(static_urls={"judge": judge_url}, connect_retries=1, timeout_s=10),
        )
        with running_server(server) as url:

            def rollout(final_text: str, hints: int = 0) -> dict:
                with SyncClient() as client:  # one client, one session: as one rollout
                    assert client.post(url + "/seed_session", row)[0] == 200
                    for n in range(hints):
                        status, body = client.post(url + "/get_hint", {})
                        assert status == 200
                        assert body["hint"] == (row["hints"][n] if n < len(row["hints"]) else None)
                    output = [function_call_item("get_hint", "{}")] * hints + [message_item(final_text)]
                    status, body = client.post(url + "/verify", {**row, "response": {"output": output}})
                assert status == 200, body
                return body

            exact = rollout("It is Canberra.\nAnswer: Canberra", hints=1)
            assert (exact["reward"], exact["hints_used"], exact["judged"]) == (0.75, 1, False)
            assert exact["reward_components"] == {"correct": 1.0, "format": 1.0, "hint_factor": 0.75}
            judged = rollout("Answer: Canberra City.")
            assert (judged["reward"], judged["judged"], judged["extracted_answer"]) == (
                1.0,
                True,
                "Canberra City",
            )
            wrong = rollout("Answer: Sydney", hints=3)
            assert (wrong["reward"], wrong["judged"], wrong["hints_used"]) == (0.0, True, 2)
            with SyncClient() as client:  # a judge without a verdict fails the rollout, not reward 0
                assert client.post(url + "/seed_session", row)[0] == 200
                response = {"output": [message_item("Answer: Atlantis")]}
                status, body = client.post(url + "/verify", {**row, "response": response})
            assert status == 502 and body["failure_class"] == "judge_failed", body
            unformatted = rollout("Canberra, I believe.")
            assert unformatted["reward_components"]["format"] == 0.0 and unformatted["reward"] == 0.0
            with SyncClient() as client:
                status, body = client.post(url + "/get_hint", {"level": 2})
                assert status == 422 and "level" in json.dumps(body)
                results = [exact, judged, wrong, unformatted]
                for index, result in enumerate(results):
                    result["_ng_task_index"], result["_ng_rollout_index"] = index // 2, index % 2
                status, metrics = client.post(url + "/aggregate_metrics", {"verify_responses": results})
    assert status == 200, metrics
    assert metrics["key_metrics"]["mean/reward_components/correct"] == 0.5
    assert metrics["key_metrics"]["mean/hints_used"] == 0.75
    assert metrics["agent_metrics"]["pass@2/reward_components/correct"] == 50.0


@pytest.mark.slow
def test_tutorial_walkthrough_collects_rollouts_with_metrics(tmp_path: Path, monkeypatch):
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.testing import running_stack

    folder = init_resources_server("resources_servers/capital_quiz", cwd=tmp_path)
    (folder / "app.py").write_text(doc_block("<!-- tutorial-app", "python") + "\n")
    row = json.loads(doc_block("## 3. Rows", "json"))
    (folder / "data" / "example.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "configs" / "scripted_policy.yaml").write_text(doc_block("<!-- tutorial-policy", "yaml") + "\n")

    monkeypatch.chdir(tmp_path)
    output = tmp_path / "results" / "capital_quiz.jsonl"
    configs = [
        "resources_servers/capital_quiz/configs/capital_quiz.yaml",
        "responses_api_models/scripted_model/configs/scripted_model.yaml",
        "resources_servers/capital_quiz/configs/scripted_policy.yaml",
    ]
    with running_stack(configs) as handle:
        summary = asyncio.run(
            RolloutCollectionHelper().run_from_config(
                {
                    "agent_name": "capital_quiz_simple_agent",
                    "input_jsonl_fpath": "resources_servers/capital_quiz/data/example.jsonl",
                    "output_jsonl_fpath": str(output),
                    "num_repeats": 2,
                    "head_server": handle.head_server_config,
                },
                verbose=False,
            )
        )
    assert (summary.succeeded, summary.failed) == (2, 0)
    rollouts = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(r["reward"], r["hints_used"], r["extracted_answer"]) for r in rollouts] == [
        (0.75, 1, "Canberra")
    ] * 2
    metrics = json.loads((tmp_path / "results" / "capital_quiz_aggregate_metrics.json").read_text())[0]
    assert metrics["key_metrics"]["mean/reward_components/correct"] == 1.0
    assert metrics["key_metrics"]["mean/hints_used"] == 1.0
    assert metrics["agent_metrics"]["pass@2/reward_components/correct"] == 100.0


@pytest.mark.slow
def test_ng_test_stops_tests_that_hang(tmp_path: Path):
    folder = init_resources_server("resources_servers/slow_env", cwd=tmp_path)
    (folder / "tests" / "test_app.py").write_text("import time\n\n\ndef test_hangs():\n    time.sleep(60)\n")
    check = check_server(folder, timeout_s=4)
    assert not check.ok and check.seconds < 30
    assert any("did not finish within 4s" in p for p in check.problems), check.problems


def test_ng_test_fails_when_example_metrics_no_longer_match_the_rows(tmp_path: Path):
    folder = init_resources_server("resources_servers/drift_env", cwd=tmp_path)
    assert check_server(folder, run_tests=False).problems == []
    data = folder / "data" / "example.jsonl"
    lines = data.read_text().splitlines()
    data.write_text("\n".join([*lines, lines[0]]) + "\n")  # a sixth row: the statistics drift

    check = check_server(folder, run_tests=False)
    assert not check.ok
    (problem,) = check.problems
    assert f"{folder / 'data' / 'example_metrics.json'} no longer matches example.jsonl" in problem
    assert "Number of examples: 5 → 6" in problem and "+overwrite_metrics_conflicts=true" in problem
    # The command in the message, pasted into a shell as it is, updates the statistics.
    command = problem.split("update it with: ", 1)[1]
    assert command.startswith(
        f"cd {tmp_path} && ng_prepare_data '+config_paths=[resources_servers/drift_env/"
    )
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert check_server(folder, run_tests=False).problems == []


def test_scaffold_takes_a_description(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    description = 'Unit conversions: the model converts "5 km" to miles with a tool.'
    with pytest.raises(SystemExit) as exit_info:
        ng_init_resources_server(["+entrypoint=resources_servers/units_env", f"+description={description}"])
    assert exit_info.value.code == 0
    folder = tmp_path / "resources_servers" / "units_env"
    config = yaml.safe_load((folder / "configs" / "units_env.yaml").read_text())
    assert config["units_env"]["resources_servers"]["units_env"]["description"] == description
    assert (folder / "README.md").read_text().splitlines()[2] == description
    assert check_server(folder, run_tests=False).problems == []
    with pytest.raises(SystemExit) as exit_info:
        ng_init_resources_server(["+entrypoint=resources_servers/other_env", "+description="])
    assert exit_info.value.code == 2 and "+description must be a non-empty text" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["weather_env", "a_forty_character_environment_name_abcde"])
def test_scaffolded_files_pass_the_projects_lint_and_format_as_generated(tmp_path: Path, name: str):
    """A new environment must not stop scripts/test.sh at its ruff steps (the longest name allowed too)."""
    pytest.importorskip("ruff")
    init_resources_server(f"resources_servers/{name}", cwd=tmp_path)
    config = str(project_root() / "pyproject.toml")
    for check in (["check"], ["format", "--check", "--diff"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *check, "--config", config, "--no-cache", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_name_too_long_for_the_generated_code_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="at most 40"):
        init_resources_server("resources_servers/" + "x" * 41, cwd=tmp_path)
    assert not (tmp_path / "resources_servers").exists()


def test_a_pulled_folder_is_checked_by_its_tests_and_its_data_findings_are_notes(tmp_path: Path) -> None:
    """As NeMo Gym's ng_test: a folder pulled from NeMo Gym fails on its tests, not on a data
    finding of ours (a tool its rows offer without a route), unless validate_data is asked for."""
    import shutil

    folder = tmp_path / "resources_servers" / "example_single_tool_call"
    shutil.copytree(project_root() / "resources_servers" / "example_single_tool_call", folder)
    rows = folder / "data" / "example.jsonl"
    rows.write_text(rows.read_text().replace('"get_weather"', '"get_forecast"'))
    assert any("get_forecast" in p for p in check_server(folder, run_tests=False).problems)
    (folder / ".nemo_gym_source.json").write_text("{}\n")
    pulled = check_server(folder, run_tests=False)
    assert pulled.problems == [] and any("get_forecast" in n for n in pulled.notes)
    strict = check_server(folder, run_tests=False, validate_data=True)
    assert any("get_forecast" in p for p in strict.problems)


from pydantic import BaseModel as _BaseModel  # noqa: E402
from pydantic import ConfigDict as _ConfigDict  # noqa: E402

from nemo_gym.base_resources_server import SimpleResourcesServer as _Server  # noqa: E402
from nemo_gym.base_resources_server import tool as _tool  # noqa: E402


# The row builder's example server: type hints resolve at module level, as in an app.py.
class LookupRequest(_BaseModel):
    """Author notes: not for the model."""

    model_config = _ConfigDict(extra="forbid")
    city: str
    days: int


class LooseRequest(_BaseModel):
    city: str
    units: str = "metric"


class Weather(_Server):
    @_tool
    async def lookup(self, body: LookupRequest) -> dict:
        """The forecast for a city.

        Longer notes for authors stay out of the description."""
        return {}

    @_tool(name="loose")
    async def loose_lookup(self, body: LooseRequest) -> dict:
        """A forecast, units optional."""
        return {}

    @_tool
    async def anything(self, body: dict) -> dict:
        return {}


def test_the_row_builder_makes_tool_schemas_from_the_tool_methods():
    from nemo_gym.response_items import create_params_shape_errors

    tools = {t["name"]: t for t in Weather.tool_schemas()}
    assert list(tools) == ["anything", "lookup", "loose"]
    assert tools["lookup"] == {
        "type": "function",
        "name": "lookup",
        "description": "The forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
        "strict": True,
    }
    # Not every field required, extra fields allowed: a schema strict mode cannot hold, so not strict.
    assert "strict" not in tools["loose"] and tools["loose"]["parameters"]["required"] == ["city"]
    assert tools["anything"]["parameters"] == {"type": "object", "properties": {}}
    row = Weather.build_row("Rain in Oslo?", instructions="Be brief.", expected="yes")
    assert row["expected"] == "yes" and row["responses_create_params"]["tools"] == Weather.tool_schemas()
    assert [i["role"] for i in row["responses_create_params"]["input"]] == ["developer", "user"]
    assert create_params_shape_errors(row["responses_create_params"]) == []


# ---- ng_init_agent and ng_init_model: the agent and model adapter scaffolds --------------------
@pytest.mark.parametrize(
    ("command", "entrypoint"),
    [("ng_init_agent", "responses_api_agents/my_agent"), ("ng_init_model", "responses_api_models/my_model")],
)
def test_a_scaffolded_agent_or_model_passes_its_own_tests_and_the_lint(
    tmp_path: Path, command: str, entrypoint: str
):
    done = run_command("nemo_gym.tools.scaffold_servers", command, [f"+entrypoint={entrypoint}"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ng_test +entrypoint={entrypoint}" in done.stdout
    name = entrypoint.split("/")[1]
    assert sorted(str(p.relative_to(tmp_path / entrypoint)) for p in (tmp_path / entrypoint).rglob("*.*")) == [
        "README.md", "__init__.py", "app.py", f"configs/{name}.yaml", "tests/test_app.py"
    ]  # fmt: skip
    done = run_command("nemo_gym.tools.authoring", "ng_test", [f"+entrypoint={entrypoint}"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"[{name}] ok: 0 example rows, tests: 2 passed" in done.stdout
    pytest.importorskip("ruff")
    config = str(project_root() / "pyproject.toml")
    for check in (["check"], ["format", "--check", "--diff"]):
        linted = subprocess.run(
            [sys.executable, "-m", "ruff", *check, "--config", config, "--no-cache", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert linted.returncode == 0, linted.stdout + linted.stderr
    # Run again: the folder exists, and nothing is overwritten.
    again = run_command("nemo_gym.tools.scaffold_servers", command, [f"+entrypoint={entrypoint}"], tmp_path)
    assert again.returncode == 2 and "already exists" in again.stdout + again.stderr


def test_the_agent_and_model_scaffolds_refuse_a_bad_name_or_folder(tmp_path: Path):
    from nemo_gym.tools.scaffold_servers import init_server

    for kind, entrypoint in (
        ("responses_api_agents", "responses_api_agents/MyAgent"),
        ("responses_api_agents", "resources_servers/my_agent"),
        ("responses_api_models", "responses_api_models/class"),
    ):
        with pytest.raises(ConfigError):
            init_server(kind, entrypoint, cwd=tmp_path)
    assert not any(tmp_path.iterdir())
