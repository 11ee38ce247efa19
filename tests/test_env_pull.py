"""``gym env pull`` / ``ng_pull_environment`` and ``gym list environments --available`` against a
package index on loopback: a ``nemo-gym`` wheel built here (with an environment folder and a
requirement that is itself a wheel on the same index), served the way PyPI's simple API serves
files. No network; pip itself does the downloading and installing, in real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym.launch.config import project_root
from nemo_gym.testing import write_files
from nemo_gym.testing.package_index import build_wheel, dist_info, layered_python, package_index, pip_env

REPO = project_root()
ENV_NAME = "pulled_weather"
DEP = "corpus-fake-dep"
GYM = [sys.executable, "-c", "from nemo_gym.tools.gym_cli import main; main()"]
LICENSE = "Apache License\nVersion 2.0 (test copy)\n"


def wheel_metadata(dist: str, version: str, requires_python: str = ">=3.8") -> dict[str, str]:
    return dist_info(dist, version, requires_python=requires_python, license_text=LICENSE)


def nemo_gym_wheel(dest: Path) -> Path:
    """A nemo-gym 9.9.9 wheel whose one environment is a renamed copy of example_single_tool_call."""
    source = REPO / "resources_servers" / "example_single_tool_call"
    rename = lambda text: text.replace("example_single_tool_call", ENV_NAME)  # noqa: E731
    folder = f"resources_servers/{ENV_NAME}"
    files = {
        # NeMo Gym's own Requires-Python, which this interpreter does not meet.
        **wheel_metadata("nemo-gym", "9.9.9", ">=3.13.14"),
        # The wheel's own nemo_gym must never be imported: it would shadow ours.
        "nemo_gym/__init__.py": "raise ImportError('the nemo-gym wheel was imported')\n",
        f"{folder}/__init__.py": "",
        f"{folder}/app.py": rename((source / "app.py").read_text()),
        f"{folder}/configs/{ENV_NAME}.yaml": rename(
            (source / "configs" / "example_single_tool_call.yaml").read_text()
        ),
        f"{folder}/data/example.jsonl": rename((source / "data" / "example.jsonl").read_text()),
        f"{folder}/README.md": "# pulled_weather\n\nA weather tool environment pulled by name.\n",
        f"{folder}/requirements.txt": f"-e nemo-gym[dev] @ ../../\n{DEP}==1.0\n",
        "responses_api_agents/other_agent/app.py": "",
    }
    return build_wheel(dest / "nemo_gym-9.9.9-py3-none-any.whl", files)


def dep_wheel(dest: Path) -> Path:
    files = {**wheel_metadata(DEP, "1.0"), "corpus_fake_dep.py": "VALUE = 42\n"}
    return build_wheel(dest / "corpus_fake_dep-1.0-py3-none-any.whl", files)


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PEP 503 simple index on loopback serving the two wheels."""
    files = tmp_path_factory.mktemp("index")
    wheels = [nemo_gym_wheel(files), dep_wheel(files)]
    with package_index({"nemo-gym": [wheels[0]], DEP: [wheels[1]]}) as url:
        yield url


def env_for(index: str, cache: Path) -> dict[str, str]:
    return pip_env(index, PYTHONPATH=str(REPO), NEMO_GYM_WHEEL_CACHE=str(cache))


@pytest.mark.slow
def test_pull_installs_records_and_runs_end_to_end(index_url: str, tmp_path: Path) -> None:
    project = tmp_path / "project"
    target = project / "resources_servers" / ENV_NAME
    env = env_for(index_url, tmp_path / "cache")
    python = layered_python(tmp_path / "venv")
    pull = [str(python), "-c", "from nemo_gym.tools.gym_cli import main; main()", "env", "pull"]
    done = subprocess.run(
        [*pull, f"{ENV_NAME}==9.9.9", f"+dir={target}"],
        cwd=project.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"pulled resources_servers/{ENV_NAME} from nemo-gym 9.9.9 (Apache-2.0)" in done.stdout
    assert f"installed: {DEP}==1.0" in done.stdout
    record = json.loads((target / ".nemo_gym_source.json").read_text())
    assert record["version"] == "9.9.9" and record["license"] == "Apache-2.0"
    assert record["requirements_installed"] == [f"{DEP}==1.0"] and record["license_files"] == ["LICENSE"]
    assert (target / "LICENSE").read_text().startswith("Apache License")
    assert (target / "app.py").is_file() and not (project / "nemo_gym").exists()
    # The requirement went into the environment that ran the pull, not into ours.
    probe = "import corpus_fake_dep; print(corpus_fake_dep.VALUE)"
    assert (
        subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip()
        == "42"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60).returncode != 0

    # A second pull into the same place is refused; +force=true replaces it.
    again = subprocess.run(
        [*pull, ENV_NAME, f"+dir={target}"], env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 1 and "already exists; pass +force=true" in again.stderr

    # The pulled environment runs like a bundled one: gym eval run on the scripted model.
    out = tmp_path / "rollouts.jsonl"
    configs = f"resources_servers/{ENV_NAME}/configs/{ENV_NAME}.yaml,responses_api_models/scripted_model/configs/scripted_model.yaml"
    run = subprocess.run(
        [*GYM, "eval", "run", f"+config_paths=[{configs}]", f"+input_jsonl_fpath=resources_servers/{ENV_NAME}/data/example.jsonl",
         f"+output_jsonl_fpath={out}", "+limit=2"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(row["reward"] == 1.0 for row in rows)


def test_unknown_name_and_available_listing(index_url: str, tmp_path: Path) -> None:
    env = env_for(index_url, tmp_path / "cache")
    wrong = subprocess.run(
        [*GYM, "env", "pull", "puled_weather==9.9.9", f"+dir={tmp_path / 'x'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert wrong.returncode == 1
    assert "no server folder named 'puled_weather'; did you mean 'pulled_weather'" in wrong.stderr
    assert not (tmp_path / "x").exists()
    listed = subprocess.run(
        [*GYM, "list", "environments", "--available", "9.9.9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "nemo-gym 9.9.9: 1 resources_servers" in listed.stdout
    # What it needs beyond this machine (nothing), then the config's description.
    assert f"  {ENV_NAME}  runs here  One get_weather tool" in listed.stdout
    agents = subprocess.run(
        [*GYM, "list", "agents", "--available", "9.9.9"], env=env, capture_output=True, text=True, timeout=120
    )
    assert "1 responses_api_agents" in agents.stdout and "other_agent" in agents.stdout
    missing = subprocess.run(
        [*GYM, "env", "pull", "x==1.2.3"], env=env, capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 1 and "pip download nemo-gym==1.2.3 failed" in missing.stderr


def test_a_pull_keeps_what_this_package_runs_on_and_names_the_index_version(index_url: str) -> None:
    """A folder's pin of another version of a distribution this package uses (NeMo Gym's cvdp
    pins pydantic==2.13.4) is not installed (pip is constrained to what is installed); a
    requirement from a git clone whose distribution is on the index is reported with that version."""
    from importlib import metadata

    from nemo_gym.tools.env_pull_requirements import (
        index_alternatives,
        installed_conflicts,
        protected_versions,
    )

    keep = protected_versions()
    assert keep["pydantic"] == metadata.version("pydantic")
    assert keep["pydantic-core"] == metadata.version("pydantic-core")  # pydantic's own, transitively
    assert installed_conflicts(["pydantic==1.0", f"{DEP}==1.0"], keep) == ["pydantic==1.0"]
    cloned = f"{DEP} @ git+https://example.invalid/dep.git@abc123"
    unknown = "unheard-of @ git+https://example.invalid/unheard.git"
    assert index_alternatives([cloned, unknown, "plain-name"], index_url) == [
        f"{cloned}: on the index as {DEP}==1.0"
    ]


def test_requirement_lines_of_a_nemo_gym_folder(tmp_path: Path) -> None:
    from nemo_gym.tools.env_pull import pip_arguments, read_requirements, unmet_requirements

    (tmp_path / "nemo_gym").mkdir()  # the project root a folder's "-e ../../" points at
    folder = tmp_path / "resources_servers" / "env"
    (folder / "vendored").mkdir(parents=True)
    (folder / "requirements.txt").write_text(
        "-e nemo-gym[dev,sandbox] @ ../..\n-e ../../\ntiktoken-e nemo-gym[dev] @ ../../\n"
        "pyyaml>=1.0  # a comment\n-e ./vendored[fast]\n./missing_dir\n--extra-index-url https://x\n"
    )
    reqs = read_requirements(folder / "requirements.txt")
    assert reqs == ["tiktoken", "pyyaml>=1.0", f"-e {folder / 'vendored'}[fast]"]
    assert (
        unmet_requirements(reqs)[-1] == f"-e {folder / 'vendored'}[fast]"
    )  # a local project: always installed
    assert pip_arguments(reqs)[-2:] == ["-e", f"{folder / 'vendored'}[fast]"]
    # A fresh project without nemo_gym/ beside it (nemo_gym installed): "../../" is still NeMo Gym.
    (tmp_path / "nemo_gym").rmdir()
    assert read_requirements(folder / "requirements.txt") == reqs


def test_closure_brings_helpers_and_benchmarks_and_names_a_clash(tmp_path: Path) -> None:
    """What a pull copies besides the folder, what it leaves to the project, and a clash named
    name by name when the project's folder of a needed name lacks what the pulled code imports."""
    from nemo_gym.tools.env_pull_closure import clashes, folder_closure

    wheel, project = tmp_path / "wheel", tmp_path / "project"
    files = {
        wheel / "resources_servers/game/app.py": "from resources_servers.helper import Base\n"
        "from resources_servers.judge.app import JudgeServer, judge_helper\n",
        wheel / "resources_servers/game/tests/test_app.py": 'CONFIG = "benchmarks/game_bench/config.yaml"\n',
        wheel / "resources_servers/helper/__init__.py": "from resources_servers.helper.base import Base\n",
        wheel / "resources_servers/helper/base.py": "class Base: ...\n",
        wheel / "resources_servers/judge/app.py": "class JudgeServer: ...\ndef judge_helper(): ...\n",
        wheel / "benchmarks/game_bench/config.yaml": "x: 1\n",
        project / "resources_servers/judge/app.py": "class JudgeServer: ...\n",
    }
    write_files(files)
    copied, kept = folder_closure(wheel, "resources_servers", "game", project)
    assert copied == [("resources_servers", "helper"), ("benchmarks", "game_bench")]
    assert kept == [("resources_servers", "judge")]
    found = clashes([wheel / "resources_servers/game"], project, kept)
    assert [(c.name, c.missing) for c in found] == [
        ("judge", {"resources_servers.judge.app": ["judge_helper"]})
    ]
    (project / "resources_servers/judge/app.py").write_text("class JudgeServer: ...\njudge_helper = None\n")
    assert clashes([wheel / "resources_servers/game"], project, kept) == []
    replaced, _ = folder_closure(
        wheel, "resources_servers", "game", project, frozenset({"resources_servers/judge"})
    )
    assert ("resources_servers", "judge") in replaced


def test_a_group_of_servers_is_one_folder_to_pull_and_tested_server_by_server(tmp_path: Path) -> None:
    """NeMo Gym's ``conversational_tool_use``: an agent per stage one level down, one
    requirements.txt, configs naming ``conversational_tool_use/<stage>``. It is listed and found
    by its name, brings its helper but not its own stages, and is tested stage by stage."""
    from nemo_gym.tools.authoring import ServerCheck, _check_configs
    from nemo_gym.tools.env_pull import next_steps
    from nemo_gym.tools.env_pull_closure import folder_closure
    from nemo_gym.tools.env_pull_wheel import find_folder, list_folders

    wheel = tmp_path / "wheel"
    group = wheel / "responses_api_agents/group"
    files = {
        group / "requirements.txt": "-e nemo-gym[dev] @ ../../\n",
        group / "stage/app.py": "from resources_servers.helper import Base\n",
        group / "stage/configs/stage.yaml": "group_stage:\n  responses_api_agents:\n    group/stage:\n      entrypoint: app.py\n",
        group / "other/app.py": "",
        wheel / "resources_servers/helper/__init__.py": "class Base: ...\n",
    }  # fmt: skip
    write_files(files)
    assert ("responses_api_agents", "group") in list_folders(wheel)
    assert find_folder(wheel, "group", None) == ("responses_api_agents", group)
    assert folder_closure(wheel, "responses_api_agents", "group") == ([("resources_servers", "helper")], [])
    steps = next_steps({"kind": "responses_api_agents", "name": "group"}, group)
    assert [s.split()[-1] for s in steps if s.startswith("test it")] == [
        str(group / "other"),
        str(group / "stage"),
    ]
    check = ServerCheck(name="stage", folder=group / "stage")
    assert _check_configs(check)["name"] == "group_stage" and check.problems == []


def test_a_module_resolves_to_its_file_or_package_under_a_tree(tmp_path: Path) -> None:
    from nemo_gym.tools.env_pull_wheel import module_source

    write_files({tmp_path / "a/b.py": "", tmp_path / "a/c/__init__.py": "", tmp_path / "a/d/e.py": ""})
    assert module_source(tmp_path, "a.b") == tmp_path / "a/b.py"
    assert module_source(tmp_path, "a.c") == tmp_path / "a/c/__init__.py"
    assert module_source(tmp_path, "a.d") is None  # a namespace package has no file
    assert module_source(tmp_path, "a.missing") is None


def test_a_file_the_pulled_folder_names_in_a_project_folder_it_keeps_is_copied_in(tmp_path: Path) -> None:
    """A pulled folder's test reads a config file of a companion folder by its path; the project
    keeps its own folder of that name, which lacks the file: the pull names it to copy from the
    wheel (data and configs only, never a module; nothing the project already has)."""
    from nemo_gym.tools.env_pull_closure import folder_closure, named_files

    wheel, project = tmp_path / "wheel", tmp_path / "project"
    serving = "responses_api_models/engine/configs/vendor/Big-1.5.yaml"
    files = {
        wheel / "resources_servers/judged/app.py": "import responses_api_models.engine.app\n",
        wheel / "resources_servers/judged/tests/test_configs.py": f'SERVING = ROOT / "{serving}"\n'
        'CODE = "responses_api_models/engine/app.py"\nOWN = "responses_api_models/engine/configs/engine.yaml"\n',
        wheel / "resources_servers/judged/configs/judged.yaml": f"# copies {serving}.\nx: 1\n",
        wheel / "responses_api_models/engine/app.py": "class Engine: ...\n",
        wheel / serving: "policy_model: {}\n",
        wheel / "responses_api_models/engine/configs/engine.yaml": "theirs: 1\n",
        project / "responses_api_models/engine/app.py": "class Engine: ...\n",
        project / "responses_api_models/engine/configs/engine.yaml": "ours: 1\n",
    }
    write_files(files)
    copied, kept = folder_closure(wheel, "resources_servers", "judged", project)
    assert (copied, kept) == ([], [("responses_api_models", "engine")])
    assert named_files(wheel, [wheel / "resources_servers/judged"], kept, project) == [serving]
    assert named_files(wheel, [wheel / "resources_servers/judged"], [], project) == []


def test_the_pulls_summary_names_what_it_did_and_nothing_it_did_not() -> None:
    from nemo_gym.tools.env_pull import pull_summary

    record = {
        "version": "0.4.0",
        "also_pulled": ["resources_servers/gymnasium", "benchmarks/wordle"],
        "replaced_project_folders": [],
        "uses_project_folders": ["responses_api_models/vllm_model"],
        "files_into_project_folders": ["responses_api_models/vllm_model/configs/x.yaml"],
        "release_pins": [
            {"distribution": "openai", "was": "3.57.0", "now": "2.7.2", "release": "openai<=2.7.2"}
        ],
        "release_pins_not_applied": ["math-verify==0.8.0 (kept math-verify 0.9.0)", "x<1 (why)"],
        "requirements_installed": [],
        "requirements_not_installed": ["vllm"],
    }
    assert pull_summary(record) == [
        "also pulled (it imports or names them): resources_servers/gymnasium, benchmarks/wordle",
        "uses the project's own: responses_api_models/vllm_model",
        "copied into them (it names these files): responses_api_models/vllm_model/configs/x.yaml",
        "pinned as nemo-gym 0.4.0 pins them: openai 3.57.0 -> 2.7.2 (openai<=2.7.2)",
        "release pins not applied: math-verify==0.8.0 (kept math-verify 0.9.0); x<1 (why)",
        "not installed (install them yourself if needed): vllm",
    ]


def test_closure_follows_path_joins_to_other_folders(tmp_path: Path) -> None:
    """A folder's tests name companions as path joins too (cline_agent reads
    ``Path(__file__).parents[2] / "anyswe_agent" / "configs" / ...``): a join onto a kind and a
    name, or onto the name of a server folder of the same kind, brings that folder."""
    from nemo_gym.tools.env_pull_closure import folder_closure

    wheel = tmp_path / "wheel"
    files = {
        wheel / "responses_api_agents/mine/app.py": "",
        wheel / "responses_api_agents/mine/tests/test_app.py": "ROOT = Path(__file__).parents[3]\n"
        'A = Path(__file__).parents[2] / "sibling" / "configs" / "x.yaml"\n'
        'B = ROOT / "resources_servers" / "env" / "data"\n'
        'C = ROOT / "data" / "not_a_server"\n',
        wheel / "responses_api_agents/sibling/app.py": "",
        wheel / "responses_api_agents/data/README.md": "",
        wheel / "resources_servers/env/app.py": "",
    }
    write_files(files)
    copied, _ = folder_closure(wheel, "responses_api_agents", "mine")
    assert copied == [("resources_servers", "env"), ("responses_api_agents", "sibling")]


def test_replacing_a_folder_replaces_the_project_folders_it_would_break(tmp_path: Path) -> None:
    """0.4.0's genrm_model uses the project's local_vllm_model and NeMo Gym's vllm_model; the
    project's local_vllm_model imports a name NeMo Gym's vllm_model lacks, so it is replaced too."""
    from nemo_gym.tools.env_pull import _plan

    wheel, project = tmp_path / "wheel", tmp_path / "project"
    files = {
        wheel / "responses_api_models/genrm/app.py": "from responses_api_models.local.app import Local\n"
        "from responses_api_models.vllm.app import Converter\n",
        wheel / "responses_api_models/local/app.py": "from responses_api_models.vllm.app import Converter\nclass Local: ...\n",
        wheel / "responses_api_models/vllm/app.py": "class Converter: ...\n",
        project / "responses_api_models/local/app.py": "from responses_api_models.vllm.app import ours_only\nclass Local: ...\n",
        project / "responses_api_models/vllm/app.py": "def ours_only(): ...\n",
    }  # fmt: skip
    write_files(files)
    copied, kept, replaced = _plan(wheel, "responses_api_models", "genrm", project, replace_bundled=True)
    both = [("responses_api_models", "local"), ("responses_api_models", "vllm")]
    assert (copied, kept, replaced) == (both, [], both)


def test_a_folder_with_only_a_pyproject_toml(tmp_path: Path) -> None:
    from nemo_gym.tools.env_pull import folder_requirements

    (tmp_path / "nemo_gym").mkdir()
    folder = tmp_path / "resources_servers" / "env"
    (folder / "vendored").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "env"\ndependencies = [\n  "nemo-gym[dev]",\n  "human-eval-infilling",\n'
        '  "lib-at-url",\n  "vendored",\n  "json-repair==0.53.0",\n]\n'
        "[tool.uv.sources]\n"
        'nemo-gym = { path = "../..", editable = true }\n'
        'human-eval-infilling = { git = "https://github.com/o/human-eval-infilling.git", rev = "abc123" }\n'
        'lib_at_url = { url = "https://example.org/lib-1.0.tar.gz" }\n'
        'vendored = { path = "vendored", editable = true }\n'
    )
    assert folder_requirements(folder) == [
        "human-eval-infilling @ git+https://github.com/o/human-eval-infilling.git@abc123",
        "lib-at-url @ https://example.org/lib-1.0.tar.gz",
        f"-e {folder / 'vendored'}",
        "json-repair==0.53.0",
    ]
    # requirements.txt, when there is one, is what counts.
    (folder / "requirements.txt").write_text("pyyaml\n")
    assert folder_requirements(folder) == ["pyyaml"]


def test_config_paths_resolve_under_nemo_gym_extra_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nemo_gym.launch.config import ConfigError, resolve_config_path

    config = tmp_path / "resources_servers" / "env" / "configs" / "env.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("{}\n")
    with pytest.raises(ConfigError):
        resolve_config_path("resources_servers/env/configs/env.yaml")
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(tmp_path))
    assert resolve_config_path("resources_servers/env/configs/env.yaml") == config


def test_needs_marks_gpu_network_and_a_data_step(tmp_path: Path) -> None:
    """The listing's rule, on folders that need a GPU, the network, and a data file a script writes."""
    from nemo_gym.tools.env_pull_needs import folder_needs, needs_label

    words = tmp_path / "resources_servers" / "words"
    (words / "data").mkdir(parents=True)
    (words / "app.py").write_text('WORDS = Path(__file__).parent / "data" / "words.txt"\n')
    (words / "generate_data.py").write_text('open("data/words.txt", "w").write(download())\n')
    gpu = tmp_path / "resources_servers" / "gpu"
    gpu.mkdir()
    (gpu / "app.py").write_text("from vllm import LLM\nkey = os.environ['OPENAI_API_KEY']\n")
    plain = tmp_path / "resources_servers" / "plain"
    plain.mkdir()
    (plain / "app.py").write_text('PROMPT = "prompt.txt"\n')
    (plain / "prompt.txt").write_text("hi\n")

    assert folder_needs(words, tmp_path) == {
        "data_step": "python resources_servers/words/generate_data.py (it writes words.txt: the server's "
        "code names it, the folder does not ship it)"
    }
    assert needs_label(folder_needs(gpu)) == "needs GPU, network"
    assert needs_label(folder_needs(plain)) == "runs here"
    (words / "data" / "words.txt").write_text("crane\n")
    assert folder_needs(words) == {}


def test_needs_sees_a_companion_server_the_example_config_starts(tmp_path: Path) -> None:
    """0.4.0's rdkit_chemistry: its rows go through ns_tools, a resources server its example
    config also starts, whose requirement is cloned from git: the folder needs the network, and
    the reason names the companion, the config and the requirement's line."""
    from nemo_gym.tools.env_pull_needs import folder_needs

    servers = tmp_path / "resources_servers"
    (servers / "tools_srv").mkdir(parents=True)
    (servers / "tools_srv" / "app.py").write_text("")
    (servers / "tools_srv" / "requirements.txt").write_text("skills @ git+https://host.org/skills.git@abc\n")
    chem = servers / "chem"
    (chem / "configs").mkdir(parents=True)
    (chem / "data").mkdir()
    (chem / "app.py").write_text("")
    (chem / "data" / "example.jsonl").write_text("{}\n")
    config = (
        "chem:\n  resources_servers:\n    chem: {entrypoint: app.py}\n"
        "chem_tools:\n  resources_servers:\n    tools_srv: {entrypoint: app.py}\n"
        "chem_agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n"
        "      resources_server: {type: resources_servers, name: chem_tools}\n"
    )
    (chem / "configs" / "chem.yaml").write_text(config)
    assert folder_needs(chem) == {
        "network": "its example config (configs/chem.yaml) also starts resources server tools_srv, which "
        "clones a repository (requirements.txt:1: skills @ git+https://host.org/skills.git@abc)"
    }
    (servers / "tools_srv" / "requirements.txt").write_text("numpy\n")
    assert folder_needs(chem) == {}


def test_needs_follow_the_modules_of_other_folders_a_folder_imports(tmp_path: Path) -> None:
    """0.7.0's genrm_model builds on local_vllm_model.app, which imports vllm: it needs a GPU,
    and the reason names both lines. Only imported modules count: an agent importing an
    environment's schemas (whose server reads an API key) or its data script needs nothing."""
    from nemo_gym.tools.env_pull_needs import folder_needs

    models, servers = tmp_path / "responses_api_models", tmp_path / "resources_servers"
    write_files(
        {
            models
            / "local/app.py": "import json\n\ndef start():\n    from vllm.entrypoints import api_server\n",
            models / "genrm/app.py": "from responses_api_models.local.app import start\n",
            servers / "env/app.py": 'import os\nKEY = os.getenv("ENV_API_KEY")\n',
            servers / "env/schemas.py": "class Row: ...\n",
            servers / "env/prepare_data.py": "from datasets import load_dataset\nrows = load_dataset('x')\n",
            tmp_path / "responses_api_agents/agent/app.py": "from resources_servers.env.schemas import Row\n"
            "from resources_servers.env.prepare_data import rows\n",
        }
    )
    assert folder_needs(models / "genrm") == {
        "gpu": "imports responses_api_models.local.app (app.py:1: from responses_api_models.local.app import start), "
        "which imports vllm (responses_api_models/local/app.py:4: from vllm.entrypoints import api_server)"
    }
    assert folder_needs(tmp_path / "responses_api_agents/agent") == {}
    # The same import of the server's own module carries its need.
    (tmp_path / "responses_api_agents/agent/app.py").write_text("import resources_servers.env.app\n")
    assert "network" in folder_needs(tmp_path / "responses_api_agents/agent")


def test_needs_sees_downloads_images_agents_and_row_media(tmp_path: Path) -> None:
    """What the static rule reads besides code patterns: a clone spelled as an argv list, a
    requirement from a URL, an NLTK download, rows naming a registry image, an example agent
    that reads an API key, and rows naming media a prepare script fetches; each reason names
    its file and line, and a URL in a comment is not a call."""
    from nemo_gym.tools.env_pull_needs import folder_needs

    def folder(name: str, files: dict[str, str]) -> Path:
        root = tmp_path / "resources_servers" / name
        write_files({root / rel: text for rel, text in files.items()})
        return root

    clone = folder(
        "clone", {"setup_x.py": 'import subprocess\nsubprocess.run(\n    ["git", "clone", URL])\n'}
    )
    assert folder_needs(clone)["network"] == 'clones a repository (setup_x.py:3: ["git", "clone", URL]))'
    url = folder(
        "url", {"requirements.txt": "absl-py\nhttps://host.org/releases/download/m-1.0-py3-none-any.whl\n"}
    )
    assert folder_needs(url)["network"].startswith("installs a requirement from a URL (requirements.txt:2: ")
    nltk = folder("nltk", {"app.py": "import nltk\n\nnltk.download('wordnet')\n"})
    assert folder_needs(nltk)["network"].startswith("downloads NLTK or spaCy data (app.py:3:")
    image = folder("image", {"app.py": "", "data/example.jsonl": '{"image_ref": "docker.io/org/task:v1"}\n'})
    assert folder_needs(image)["network"] == (
        "runs each task in a container image from a registry (data/example.jsonl:1: image_ref = docker.io/org/task:v1)"
    )
    agent = tmp_path / "responses_api_agents" / "cloud_agent"
    agent.mkdir(parents=True)
    (agent / "app.py").write_text('import os\nKEY = os.environ["CLOUD_API_KEY"]\n')
    config = (
        "srv:\n  resources_servers:\n    uses_agent: {entrypoint: app.py}\n"
        "srv_agent:\n  responses_api_agents:\n    cloud_agent:\n      entrypoint: app.py\n"
        "      datasets: [{name: example, type: example, jsonl_fpath: resources_servers/uses_agent/data/example.jsonl}]\n"
    )
    uses = folder(
        "uses_agent", {"app.py": "", "configs/uses_agent.yaml": config, "data/example.jsonl": "{}\n"}
    )
    assert folder_needs(uses)["network"] == (
        "its example agent cloud_agent (configs/uses_agent.yaml) reads an API key "
        '(app.py:2: KEY = os.environ["CLOUD_API_KEY"])'
    )
    media = folder("media", {"app.py": "", "data/example.jsonl": '{"doc": "test_media/a/manifest.json"}\n'})
    (tmp_path / "benchmarks" / "media").mkdir(parents=True)
    (tmp_path / "benchmarks" / "media" / "prepare.py").write_text('MEDIA = "test_media"\n')
    assert folder_needs(media, tmp_path) == {
        "data_step": "python benchmarks/media/prepare.py (example rows name test_media/a/manifest.json, which "
        "the folder does not ship: the script writes test_media/)"
    }
    hosted = folder(
        "hosted",
        {
            "app.py": 'DB = os.path.join(DATA, "db.json")\n',
            "README.md": "Fetch once:\n\n    hf download org/repo db.json \\\n",
        },
    )
    assert folder_needs(hosted)["data_step"] == (
        "hf download org/repo db.json (resources_servers/hosted/README.md:3: it fetches db.json: the server's code "
        "names it, "
        "the folder does not ship it)"
    )
    hidden = folder("hidden", {"app.py": 'class Config:\n    test_file: str = "data/tests.jsonl"\n'})
    assert folder_needs(hidden) == {
        "private_data": "reads data/tests.jsonl, which the folder does not ship and no script of it writes "
        '(app.py:2: test_file: str = "data/tests.jsonl")'
    }
    search_config = "search:\n  resources_servers:\n    search:\n      entrypoint: app.py\n      search_api_key: ${search_api_key}\n"
    search = folder("search", {"app.py": "", "configs/search.yaml": search_config})
    assert folder_needs(search) == {
        "network": "its server is given an API key (configs/search.yaml:5: search_api_key: ${search_api_key})"
    }
    cited = folder("cited", {"app.py": "# see https://github.com/org/repo/blob/main/v1/eval.py\nX = 1\n"})
    assert folder_needs(cited) == {}


def test_a_pulled_folders_test_reading_nemo_gyms_repository_files_is_a_skip_naming_them(
    tmp_path: Path,
) -> None:
    """gym env test on a pulled folder: a test failing only because it opens a file under a
    top-level directory neither the wheel nor the project has (fern/ docs) is skipped with the
    file named; a missing file in a tree the project has is still a failure."""
    import subprocess

    from nemo_gym.tools.authoring import NEMO_GYM_PYTEST_INI, pytest_command
    from nemo_gym.tools.env_pull_closure import SOURCE_RECORD

    folder = tmp_path / "resources_servers" / "docs_env"
    (folder / "tests").mkdir(parents=True)
    (folder / SOURCE_RECORD).write_text("{}\n")
    (folder / "tests" / "test_docs.py").write_text(
        "from pathlib import Path\n"
        "ROOT = Path(__file__).resolve().parents[3]\n"
        "def test_docs_page():\n    (ROOT / 'fern' / 'pages' / 'list.mdx').read_text()\n"
        "def test_own_file():\n    (ROOT / 'resources_servers' / 'docs_env' / 'missing.txt').read_text()\n"
        # NeMo Gym runs a bare `pytest`: code composing its config from sys.argv sees no flags of ours.
        "def test_argv():\n    import sys\n    assert sys.argv[1:] == ['-rs']\n"
    )
    ini = tmp_path / "pytest.ini"
    ini.write_text(NEMO_GYM_PYTEST_INI)
    command, env = pytest_command(folder, ini, ["-rs"])
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert "1 failed, 1 passed, 1 skipped" in done.stdout, done.stdout + done.stderr
    assert "reads fern/pages/list.mdx, a file of NeMo Gym's source repository" in done.stdout
