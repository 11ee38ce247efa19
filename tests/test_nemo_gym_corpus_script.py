"""scripts/nemo_gym_corpus.py on a small wheel tree built here: the script's own behaviour.

The real corpus (NeMo Gym's wheel from the package index) is tests/test_nemo_gym_corpus_sample.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nemo_gym

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "nemo_gym_corpus.py"


def write_folder(root: Path, kind: str, name: str, app: str, test: str, requirements: str = "") -> None:
    folder = root / kind / name
    (folder / "tests").mkdir(parents=True)
    (folder / "app.py").write_text(app)
    (folder / "tests" / "test_app.py").write_text(test)
    (folder / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n" + requirements)


def build_wheel_tree(root: Path) -> None:
    # A folder whose test checks it got *our* nemo_gym (the scratch tree's copy of it, so that
    # PARENT_DIR is that tree as in NeMo Gym), not the one from the wheel tree.
    write_folder(
        root,
        "resources_servers",
        "good_env",
        "import nemo_gym\nORIGIN = nemo_gym.__file__\n",
        "import os\nfrom pathlib import Path\nfrom resources_servers.good_env.app import ORIGIN\n\n"
        "def test_ours():\n    assert Path(os.environ['EXPECTED_NEMO_GYM']).read_bytes() == Path(ORIGIN).read_bytes()\n\n"
        "async def test_async_without_marker():\n    assert True\n",
    )
    (root / "nemo_gym").mkdir()  # the wheel's own package: must never be imported
    (root / "nemo_gym" / "__init__.py").write_text("raise ImportError('the wheel nemo_gym was imported')\n")
    write_folder(
        root,
        "resources_servers",
        "bad_env",
        "X = 1\n",
        "def test_one():\n    assert 1 == 2, 'one is not two'\n\ndef test_two():\n    pass\n",
    )
    write_folder(
        root,
        "responses_api_agents",
        "broken_agent",
        "from nemo_gym.no_such_module import thing\n",
        "def test_x():\n    pass\n",
        requirements="pytest-e nemo-gym[dev] @ ../../\nno-such-distribution-corpus==1.0\n",
    )
    write_folder(
        root,
        "resources_servers",
        "gpu_env",
        "import vllm\n",
        "def test_x():\n    pass\n",
    )


def test_corpus_script_table_summary_and_json(tmp_path: Path) -> None:
    wheel = tmp_path / "wheel"
    build_wheel_tree(wheel)
    out_json = tmp_path / "out.json"
    env = dict(os.environ, EXPECTED_NEMO_GYM=nemo_gym.__file__, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--wheel-dir", str(wheel), "--cache-dir", str(tmp_path / "cache"),
         "--install", "none", "--timeout", "60", "--jobs", "2", "--json", str(out_json)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "corpus: 1/4 folders pass their own tests"
    assert lines[0].split()[:5] == ["folder", "imports", "passed", "failed", "needs"]
    results = {f["folder"]: f for f in json.loads(out_json.read_text())["folders"]}
    good = results["resources_servers/good_env"]
    assert good["passes"] and good["imports"] and good["tests_passed"] == 2
    bad = results["resources_servers/bad_env"]
    assert not bad["passes"] and bad["imports"] and (bad["tests_passed"], bad["tests_failed"]) == (1, 1)
    assert bad["first_failure"].startswith("test_one:") and "one is not two" in bad["first_failure"]
    broken = results["responses_api_agents/broken_agent"]
    assert not broken["imports"] and "nemo_gym.no_such_module" in broken["import_error"]
    # The self-reference is dropped; the glued line is split; the missing one is reported.
    assert broken["requirements_missing"] == ["no-such-distribution-corpus==1.0"]
    assert broken["install"] == "skipped (--install none)"
    assert results["resources_servers/gpu_env"]["needs"] == {"gpu": "imports vllm (app.py:1: import vllm)"}


def test_corpus_script_list_and_selection(tmp_path: Path) -> None:
    wheel = tmp_path / "wheel"
    build_wheel_tree(wheel)
    base = [sys.executable, str(SCRIPT), "--wheel-dir", str(wheel), "--list"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    listed = subprocess.run([*base, "--runnable"], capture_output=True, text=True, timeout=60, env=env)
    names = [line.split("\t")[0] for line in listed.stdout.splitlines()]
    assert names == [
        "resources_servers/bad_env",
        "resources_servers/good_env",
        "responses_api_agents/broken_agent",
    ]
    unknown = subprocess.run(
        [*base, "--folders", "nope"], capture_output=True, text=True, timeout=60, env=env
    )
    assert unknown.returncode != 0 and "unknown folder(s) in --folders: nope" in unknown.stderr


def test_pyproject_requirements_shared_trees_and_repository_files(tmp_path: Path) -> None:
    """A folder with only a pyproject.toml (NeMo Gym's code_fim): its git-sourced dependency is
    what it needs (and makes it need the network); the wheel's `benchmarks/` tree is the one its
    tests import, not this repository's `benchmarks` package."""
    wheel = tmp_path / "wheel"
    folder = wheel / "resources_servers" / "fim_env"
    (folder / "tests").mkdir(parents=True)
    (folder / "app.py").write_text("X = 1\n")
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "fim"\ndependencies = ["nemo-gym[dev]", "human-eval-infilling", "json-repair==0.53.0"]\n'
        '[tool.uv]\ntorch-backend = "cpu"\n'
        '[tool.uv.sources]\nnemo-gym = { path = "../..", editable = true }\n'
        'human-eval-infilling = { git = "https://github.com/example/human-eval-infilling.git" }\n'
    )
    (folder / "tests" / "test_app.py").write_text(
        "from benchmarks.wheel_only.prepare import ANSWER\nfrom resources_servers.helper_env.app import HELP\n\n"
        "def test_shared_tree_and_sibling():\n    assert (ANSWER, HELP) == (42, 'help')\n"
    )
    # A sibling folder it imports: copied into the scratch tree with it, not run.
    (wheel / "resources_servers" / "helper_env").mkdir()
    (wheel / "resources_servers" / "helper_env" / "app.py").write_text("HELP = 'help'\n")
    (wheel / "benchmarks" / "wheel_only").mkdir(parents=True)
    (wheel / "benchmarks" / "wheel_only" / "prepare.py").write_text("ANSWER = 42\n")
    out_json = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--wheel-dir", str(wheel), "--cache-dir", str(tmp_path / "cache"),
         "--install", "none", "--timeout", "60", "--jobs", "1", "--json", str(out_json), "--folders", "fim_env"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(out_json.read_text())["folders"]
    assert result["passes"], result["first_failure"]
    assert result["needs"] == {
        "network": "clones a repository (pyproject.toml:8: "
        'human-eval-infilling = { git = "https://github.com/example/human-eval-infilling.git" })'
    }
    missing = result["requirements_missing"]
    assert "human-eval-infilling @ git+https://github.com/example/human-eval-infilling.git" in missing
    assert not any(r.startswith(("nemo-gym", "-e")) for r in missing)

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from nemo_gym_corpus_report import classify
    finally:
        sys.path.remove(str(REPO / "scripts"))
    docs_failure = {
        "imports": True, "import_error": "", "needs": {}, "install": "none needed", "pytest_exit": 1,
        "first_failure": "test_documented_tool_count_matches_get_tools: FileNotFoundError: [Errno 2] No such file "
        "or directory: 'fern/versions/latest/pages/evaluation/environment-list.mdx'",
    }  # fmt: skip
    expected = (
        "needs NeMo Gym's repository",
        "reads fern/versions/latest/pages/evaluation/environment-list.mdx, which the wheel does not ship",
    )
    assert classify(docs_failure) == expected
    # As the corpus run reports it: under the scratch tree's root.
    rooted = docs_failure["first_failure"].replace("'fern/", "'/tmp/nemo_gym_corpus.x1/fern/")
    assert classify({**docs_failure, "first_failure": rooted}) == expected
    # A folder's own docs are not NeMo Gym's repository.
    own = docs_failure["first_failure"].replace("'fern/", "'/tmp/s/resources_servers/x/docs/")
    assert classify({**docs_failure, "first_failure": own})[0] != "needs NeMo Gym's repository"


def test_a_grouped_folder_runs_as_one_folder(tmp_path: Path) -> None:
    """A folder with one server per subfolder (NeMo Gym's conversational_tool_use) is one corpus row."""
    wheel = tmp_path / "wheel"
    group = wheel / "responses_api_agents" / "staged_agent"
    for stage, body in (("plan", "STAGE = 'plan'\n"), ("act", "from nemo_gym.no_such_module import x\n")):
        (group / stage / "tests").mkdir(parents=True)
        (group / stage / "__init__.py").touch()
        (group / stage / "tests" / "__init__.py").touch()
        (group / stage / "app.py").write_text(body)
        (group / stage / "tests" / "test_app.py").write_text("def test_stage():\n    pass\n")
    (group / "__init__.py").touch()
    out_json = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--wheel-dir", str(wheel), "--cache-dir", str(tmp_path / "cache"),
         "--install", "none", "--timeout", "60", "--folders", "staged_agent", "--json", str(out_json)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out_json.read_text())["folders"]
    assert row["folder"] == "responses_api_agents/staged_agent" and row["tests_passed"] == 2
    # every stage's app.py must import: the `act` stage does not
    assert not row["imports"] and "nemo_gym.no_such_module" in row["import_error"]


def test_an_agent_gets_the_resources_server_folder_it_imports(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("nemo_gym_corpus_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    corpus = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = corpus  # its dataclasses look their module up
    try:
        spec.loader.exec_module(corpus)
    finally:
        del sys.modules[spec.name]
    wheel = tmp_path / "wheel"
    write_folder(wheel, "resources_servers", "shop", "X = 1\n", "def test_x():\n    pass\n")
    write_folder(wheel, "resources_servers", "unrelated", "X = 1\n", "def test_x():\n    pass\n")
    write_folder(
        wheel,
        "responses_api_agents",
        "shop_agent",
        "from resources_servers.shop.app import X\n",
        "def test_x():\n    pass\n",
    )
    scratch = tmp_path / "scratch"
    corpus.prepare_scratch(wheel, scratch, [("responses_api_agents", "shop_agent")])
    assert (scratch / "resources_servers" / "shop" / "app.py").is_file()
    assert not (scratch / "resources_servers" / "unrelated").exists()


def _user_module():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "nemo_gym_corpus_user", REPO / "scripts" / "nemo_gym_corpus_user.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_user_path_judges_are_scripted_and_eligibility_is_counted(tmp_path: Path) -> None:
    """--user-path's run config serves every model server but policy_model (declared or only named)
    with a one-turn scripted model; its summary counts eligible folders per kind."""
    import yaml

    user = _user_module()
    config = tmp_path / "env.yaml"
    config.write_text(
        "env:\n  resources_servers:\n    env:\n      judge_model_server: {type: responses_api_models, name: judge}\n"
        "      other: {type: responses_api_models, name: genrm}\n"
        "judge:\n  responses_api_models:\n    openai_model: {openai_base_url: '${judge_base_url}'}\n"
        "policy_model:\n  responses_api_models:\n    openai_model: {}\n"
    )
    data = yaml.safe_load(user.scripted_config(config, tmp_path / "out.yaml").read_text())
    for name in ("judge", "genrm"):
        assert list(data[name]["responses_api_models"]) == ["scripted_model"]
        assert data[name]["responses_api_models"]["scripted_model"]["scripts"][0]["turns"][0]["text"]
    assert data["policy_model"] == {"responses_api_models": {"openai_model": {}}}
    assert data["env"]["resources_servers"]["env"]["judge_model_server"]["name"] == "judge"

    R = user.UserPathResult
    results = [
        R("resources_servers", "a", pulled=True, tested=True, ran=True),
        R("resources_servers", "b", pulled=True, tested=False, test_note="boom"),
        R("resources_servers", "c", needs={"gpu": "imports vllm"}, pulled=True),
        R("responses_api_agents", "d", pulled=False, pull_note="pip failed"),
        R("responses_api_agents", "e", pulled=True, tested=True),
    ]
    assert user.user_path_summary(results, "9.9") == (
        "nemo-gym 9.9 through the user's path: resources_servers: 1/2 eligible pass (50.0%; 3 run); "
        "responses_api_agents: 1/1 eligible pass (100.0%; 2 run)"
    )
    table = user.user_path_table(results)
    assert "| resources_servers/b | - | ok | FAIL | - | test: boom |" in table
    path = tmp_path / "r.jsonl"
    for r in results:
        user.append_jsonl(path, r)
    assert [r.folder for r in user.read_jsonl(path)] == [r.folder for r in results]


def test_user_path_sends_a_full_cohort_when_the_config_declares_one(tmp_path: Path) -> None:
    """A resources server that scores n rollouts of a row together (genrm_compare's
    ``num_rollouts_per_prompt: 16``) never answers a run of single rollouts: the eval run sends n
    repeats of each row, all in flight; the pull's advice says the same. Other configs get nothing."""
    from nemo_gym.tools.env_pull import next_steps

    user = _user_module()
    folder = tmp_path / "resources_servers" / "cohort"
    (folder / "configs").mkdir(parents=True)
    config = folder / "configs" / "cohort.yaml"
    config.write_text(
        "cohort:\n  resources_servers:\n    cohort:\n      entrypoint: app.py\n"
        "      num_rollouts_per_prompt: 4\n      num_judges_per_comparison: 3\n"
    )
    assert user.cohort_overrides(config, rows=2) == ["+num_repeats=4", "+num_samples_in_parallel=8"]
    run = next(
        ln
        for ln in next_steps({"kind": "resources_servers", "name": "cohort"}, folder)
        if "gym eval run" in ln
    )
    assert run.endswith("+limit=5 +num_repeats=4 +num_samples_in_parallel=20")
    for body in (
        "num_rollouts_per_prompt: 1",
        "num_judges_per_comparison: 3",
        "num_rollouts_per_prompt: true",
    ):
        config.write_text(f"cohort:\n  resources_servers:\n    cohort:\n      {body}\n")
        assert user.cohort_overrides(config, rows=2) == []
