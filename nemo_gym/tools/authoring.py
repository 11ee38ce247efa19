"""``ng_test``: check one environment (or all of them) before shipping it.

``ng_test +entrypoint=resources_servers/<name>`` does two things:

1. validates the environment's files: ``configs/*.yaml`` parse and declare the server,
   every row of ``data/example.jsonl`` is a run request (``responses_create_params`` with
   ``input``), every tool a row offers the model is a route of the server class in
   ``app.py`` (instantiated from its config, routes read from the instance), and
   ``data/example_metrics.json``, when present, still matches the rows' statistics;
2. runs the folder's tests the way NeMo Gym runs them: pytest in a subprocess whose working
   directory is the folder, with the folder and its project root on ``PYTHONPATH`` (so both
   ``from app import ...`` and ``resources_servers.<name>`` import) and NeMo Gym's pytest
   settings instead of this project's.

An agent or model folder (``+entrypoint=responses_api_agents/<name>``) gets the config check and
its tests; the route and example-data checks are a resources server's.

``ng_test`` without an entrypoint does this for every folder of ``resources_servers/`` and prints
a summary table. A folder pulled from NeMo Gym is checked as NeMo Gym's ``ng_test`` checks it:
by its tests, its data findings printed as notes (``+should_validate_data=true`` makes them
count). The exit code is non-zero when anything failed. ``+timeout_s`` (default 1800)
bounds each folder's pytest run.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, load_config, load_yaml_file, project_root, server_instances
from nemo_gym.launch.datasets import DatasetConfig
from nemo_gym.launch.offline_env import with_offline_switches
from nemo_gym.tools import reaping_runner
from nemo_gym.tools.dataset_statistics import DatasetStatistics, metrics_drift, metrics_path_for
from nemo_gym.tools.env_pull_closure import SOURCE_RECORD
from nemo_gym.tools.prepare_data import iter_json_lines, tool_names, validate_row

KIND_FOLDER = "resources_servers"
SERVER_KINDS = ("resources_servers", "responses_api_agents", "responses_api_models")
EXAMPLE_DATA = Path("data") / "example.jsonl"
DEFAULT_TEST_TIMEOUT_S = 1800.0
PYTEST_SUMMARY = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")


@dataclass
class ServerCheck:
    """The outcome of ``ng_test`` on one environment folder."""

    name: str
    folder: Path
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Findings that do not fail the check (a pulled folder's data, unless +should_validate_data=true)."""
    rows: int = 0
    pytest_returncode: int | None = None
    pytest_counts: dict[str, int] = field(default_factory=dict)
    pytest_output: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No data/config problem and the tests passed."""
        return not self.problems and self.pytest_returncode == 0

    @property
    def tests_summary(self) -> str:
        """``3 passed, 1 skipped``-style counts, or why pytest did not report any."""
        if self.pytest_returncode is None:
            return "not run"
        if not self.pytest_counts:
            return "no tests" if self.pytest_returncode == 5 else f"exit {self.pytest_returncode}"
        return ", ".join(f"{n} {kind}" for kind, n in self.pytest_counts.items())


def find_server_folder(entrypoint: str, cwd: Path | None = None) -> Path:
    """``resources_servers/<name>`` under the working directory, else under the project."""
    relative = Path(entrypoint.rstrip("/"))
    if relative.name == "app.py":
        relative = relative.parent
    for root in (cwd or Path.cwd(), project_root()):
        candidate = relative if relative.is_absolute() else root / relative
        if (candidate / "app.py").is_file():
            return candidate.resolve()
    raise ConfigError(
        f"+entrypoint={entrypoint!r}: no app.py in {relative} under {cwd or Path.cwd()} or {project_root()}"
    )


def check_server(
    folder: Path,
    run_tests: bool = True,
    timeout_s: float = DEFAULT_TEST_TIMEOUT_S,
    validate_data: bool | None = None,
) -> ServerCheck:
    """Validate one environment folder and run its tests (pytest stopped after ``timeout_s``).

    ``validate_data`` (default: yes, except for a folder pulled from NeMo Gym, which NeMo Gym's
    ng_test checks by its tests alone unless ``+should_validate_data=true``): whether a problem
    with its configs, the server built from them or the example rows (a tool without a route, stale
    statistics) fails the check or is a note.
    """
    started = time.monotonic()
    check = ServerCheck(name=folder.name, folder=folder)
    if validate_data is None:
        validate_data = not (folder / ".nemo_gym_source.json").is_file()
    routes = None
    if not (folder / "app.py").is_file():
        check.problems.append(f"{folder}/app.py does not exist (the server class goes there)")
    before = len(check.problems)
    # A pulled folder without a config of its own (NeMo Gym's harness_agent) is judged by its tests.
    config_fields = _check_configs(check)
    if folder.parent.name == KIND_FOLDER:
        if (folder / "app.py").is_file():
            routes = _server_routes(check, config_fields)
        _check_example_data(check, routes)
    if not validate_data:  # the server built from its config, its routes, its example rows
        check.notes += check.problems[before:]
        del check.problems[before:]
    if run_tests:
        _run_pytest(check, timeout_s)
    check.seconds = time.monotonic() - started
    return check


def _check_configs(check: ServerCheck) -> dict[str, Any]:
    """Every config file parses; returns the fields of this server's resources_servers instance."""
    configs = sorted((check.folder / "configs").glob("*.yaml"))
    if not configs:
        check.problems.append(f"{check.folder}/configs: no YAML config (expected configs/{check.name}.yaml)")
        return {}
    found: dict[str, Any] | None = None
    # A server one level inside a group (responses_api_agents/conversational_tool_use/simulation)
    # is declared by its path below the kind folder: conversational_tool_use/simulation.
    kind_dir = next((p for p in check.folder.parents if p.name in SERVER_KINDS), check.folder.parent)
    impl = check.folder.relative_to(kind_dir).as_posix()
    for path in configs:
        try:
            instances = server_instances(load_yaml_file(path))
        except ConfigError as exc:
            check.problems.append(str(exc))
            continue
        for instance in instances.values():
            if instance.type == kind_dir.name and instance.impl == impl and found is None:
                found = {**instance.fields, "name": instance.name}
    if found is None:
        check.problems.append(
            f"{check.folder}/configs: no config declares a {kind_dir.name}.{impl} server instance"
        )
        return {"name": check.name}
    return found


def _import_app(folder: Path) -> ModuleType:
    """Import ``app.py`` as ``resources_servers.<name>.app`` from the folder's project root.

    When that name already means another folder in this process (a different project's
    ``resources_servers``), the file is loaded under a private name instead.
    """
    # The folder too, as NeMo Gym's servers have it: their app.py imports sibling modules (from util import ...).
    added = [p for p in (str(folder.parent.parent), str(folder)) if p not in sys.path]
    for path in added:
        sys.path.insert(0, path)
    try:
        return _load_app_module(folder)
    finally:
        for path in added:
            sys.path.remove(path)


def _load_app_module(folder: Path) -> ModuleType:
    app_path = folder / "app.py"
    try:
        module = importlib.import_module(f"{folder.parent.name}.{folder.name}.app")
        if module.__file__ and Path(module.__file__).resolve() == app_path.resolve():
            return module
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(f"_ng_test_{folder.name}_app", app_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {app_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _server_routes(check: ServerCheck, config_fields: dict[str, Any]) -> list[Any] | None:
    """The routes of the environment's server, instantiated from its config (None on failure)."""
    from nemo_gym.base_resources_server import SimpleResourcesServer

    try:
        module = _import_app(check.folder)
    except Exception as exc:  # noqa: BLE001 - any import failure is reported, not raised
        check.problems.append(f"{check.folder}/app.py does not import: {type(exc).__name__}: {exc}")
        return None
    # A class bound to two names (an alias kept for NeMo Gym's spelling) counts once.
    classes = list(
        dict.fromkeys(
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj)
            and issubclass(obj, SimpleResourcesServer)
            and obj is not SimpleResourcesServer
        )
    )
    # The server is the most derived class: a base imported from elsewhere is subclassed by it.
    leaves = [c for c in classes if not any(other is not c and issubclass(other, c) for other in classes)]
    own = [c for c in leaves if c.__module__ == module.__name__] or leaves
    if len(own) != 1:
        names = ", ".join(c.__name__ for c in own) or "none"
        check.problems.append(
            f"{check.folder}/app.py: expected one SimpleResourcesServer subclass, found {names}"
        )
        return None
    try:
        server = own[0](config_fields)  # type: ignore[call-arg,arg-type]
        # NeMo Gym's servers add their tool routes in setup_webserver(); ours declare routes().
        return [*server.routes(), *server.setup_webserver().routes]
    except Exception as exc:  # noqa: BLE001 - a server that cannot be built from its config is a finding
        check.problems.append(
            f"{own[0].__name__} cannot be built from its config {config_fields}: {type(exc).__name__}: {exc}"
        )
        return None


def _has_route(routes: list[Any], path: str) -> bool:
    from starlette.routing import Match

    scope = {"type": "http", "path": path, "method": "POST", "root_path": ""}
    return any(route.matches(scope)[0] == Match.FULL for route in routes)


def _check_example_data(check: ServerCheck, routes: list[Any] | None) -> None:
    path = check.folder / EXAMPLE_DATA
    if not path.is_file():
        check.problems.append(f"{path} does not exist (five example rows are expected)")
        return
    missing_tools: dict[str, list[int]] = {}
    for number, row, error in iter_json_lines(path):
        if error is not None:
            check.problems.append(f"{path}:{number}: {error}")
            continue
        check.rows += 1
        problems = validate_row(row)
        check.problems += [f"{path}:{number}: {p}" for p in problems]
        # A gymnasium-style server takes every tool call through its /step route.
        if problems or routes is None or _has_route(routes, "/step"):
            continue
        for name in tool_names(row):
            if not _has_route(routes, f"/{name}"):
                missing_tools.setdefault(name, []).append(number)
    for name, lines in missing_tools.items():
        check.problems.append(
            f"{path}:{','.join(map(str, lines))}: the rows offer tool {name!r} but the server has no "
            f"POST /{name} route (add an @tool method named {name})"
        )
    if check.rows == 0:
        check.problems.append(f"{path} has no rows")
    _check_example_metrics(check, path)


def _check_example_metrics(check: ServerCheck, path: Path) -> None:
    """``data/example_metrics.json``, when there is one, must still describe ``data/example.jsonl``."""
    metrics_path = metrics_path_for(path)
    if not metrics_path.is_file():
        return
    try:
        committed = json.loads(metrics_path.read_text())
    except json.JSONDecodeError as exc:
        check.problems.append(
            f"{metrics_path} is not valid JSON ({exc}); delete it and rerun ng_prepare_data"
        )
        return
    if not isinstance(committed, dict):
        check.problems.append(f"{metrics_path} must hold a JSON object")
        return
    stats = DatasetStatistics()
    with path.open("rb") as f:
        for line in f:
            try:
                row = orjson.loads(line) if line.strip() else None
            except orjson.JSONDecodeError:
                continue
            if row is not None and not validate_row(row):
                stats.add(row)
    # The dataset's config fields (name, type, jsonl_fpath, ...) open the file; only statistics count.
    header = set(DatasetConfig.model_fields)
    drift = metrics_drift({k: v for k, v in committed.items() if k not in header}, stats.as_dict())
    if drift:
        shown = "; ".join(drift[:5]) + (f"; ... {len(drift) - 5} more" if len(drift) > 5 else "")
        check.problems.append(
            f"{metrics_path} no longer matches {path.name} ({shown}); if the new rows are right, "
            f"update it with: {metrics_update_command(check.folder)}"
        )


def metrics_update_command(folder: Path) -> str:
    """The command, ready to paste, that rewrites an environment's ``data/example_metrics.json``."""
    configs = sorted((folder / "configs").glob("*.yaml"))
    own = folder / "configs" / f"{folder.name}.yaml"
    config = own if own.is_file() else (configs[0] if configs else own)
    root = folder.resolve().parent.parent  # the folder holding resources_servers/<name>
    relative = config.resolve().relative_to(root)
    command = shlex.join(
        [
            "ng_prepare_data",
            f"+config_paths=[{relative}]",
            "+mode=example_validation",
            "+overwrite_metrics_conflicts=true",
        ]
    )
    return command if root == Path.cwd().resolve() else f"cd {shlex.quote(str(root))} && {command}"


# What NeMo Gym's repository configures for its folders' tests (its pyproject's pytest section).
NEMO_GYM_PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings = ignore::DeprecationWarning
markers =
    unit: NeMo Gym marker
    integration: NeMo Gym marker
    system: NeMo Gym marker
    acceptance: NeMo Gym marker
    docs: NeMo Gym marker
    sandbox: NeMo Gym marker
    skipduringci: NeMo Gym marker
    pleasefixme: NeMo Gym marker
    slow: slower end-to-end tests
"""


def pytest_command(
    folder: Path, ini: Path, extra: list[str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``folder``'s tests as NeMo Gym does: from inside the
    folder, the folder and its project root first on ``PYTHONPATH``, NeMo Gym's pytest settings
    (``ini``, holding :data:`NEMO_GYM_PYTEST_INI`) and no conftest above the folder; the
    environment carries :data:`~nemo_gym.launch.offline_env.OFFLINE_SWITCHES` where it does not
    set them itself."""
    root = folder.parent.parent
    # Libraries the tests import use what is installed, never a fetch of their own (offline_env.py).
    env = with_offline_switches(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), str(root), env.get("PYTHONPATH", "")) if p)
    # Paths the tests name from the project root (configs, benchmarks/...) resolve against the
    # folder's project even where nemo_gym is installed elsewhere.
    roots = env.get("NEMO_GYM_EXTRA_ROOTS", "")
    env["NEMO_GYM_EXTRA_ROOTS"] = os.pathsep.join(p for p in (str(root), roots) if p)
    # Our options go in PYTEST_ADDOPTS, not on the command line: NeMo Gym runs a bare `pytest`,
    # and code under test that composes the global config from sys.argv (0.4.0's browsecomp_agent
    # calls get_global_config_dict()) must see no pytest flags there.
    options = [
        "-c",
        str(ini),
        "--rootdir",
        str(folder),
        "--confcutdir",
        str(folder),
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    if (folder / SOURCE_RECORD).is_file():
        # A pulled folder: a test that only fails on a file of NeMo Gym's repository the wheel
        # does not ship (a docs page) is a skip naming it (nemo_gym/testing/pulled_tests.py).
        options[:0] = ["-p", "nemo_gym.testing.pulled_tests"]
        env["NEMO_GYM_PULLED_PROJECT"] = str(root)
    env["PYTEST_ADDOPTS"] = " ".join([*map(shlex.quote, options), env.get("PYTEST_ADDOPTS", "")]).strip()
    return [sys.executable, "-m", "pytest", *(extra or [])], env


def _run_pytest(check: ServerCheck, timeout_s: float) -> None:
    if not any(check.folder.rglob("test_*.py")):
        check.problems.append(f"{check.folder}/tests does not exist (put the environment's tests there)")
        return
    with tempfile.TemporaryDirectory(prefix="ng_test.") as scratch:
        ini = Path(scratch) / "pytest.ini"
        ini.write_text(NEMO_GYM_PYTEST_INI)
        command, env = pytest_command(check.folder, ini)
        # Under the reaping runner: what the tests orphan is reaped at once and what they leave
        # running is killed at the end, whatever this machine's PID 1 does (reaping_runner.py).
        command = [sys.executable, "-I", reaping_runner.__file__, "--", *command]
        process = subprocess.Popen(
            command, cwd=check.folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # SIGTERM: the runner stops pytest and kills what it started, then exits.
            process.terminate()
            try:
                stdout, stderr = process.communicate(timeout=reaping_runner.LEFTOVER_GRACE_S + 10)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            check.pytest_returncode = -1
            check.pytest_output = _text(stdout) + _text(stderr)
            check.problems.append(
                f"{check.folder}: the tests did not finish within {timeout_s:g}s (+timeout_s=... to wait longer)"
            )
            return
    check.pytest_returncode = process.returncode
    check.pytest_output = stdout + stderr
    summary_lines = [line for line in stdout.splitlines() if " in " in line and PYTEST_SUMMARY.search(line)]
    if summary_lines:
        for count, kind in PYTEST_SUMMARY.findall(summary_lines[-1]):
            check.pytest_counts[kind] = int(count)


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value or ""


def format_table(checks: list[ServerCheck]) -> str:
    """The summary table ``ng_test`` prints for many environments."""
    rows = [("ENVIRONMENT", "RESULT", "TESTS", "ROWS", "PROBLEMS", "TIME")]
    for c in checks:
        rows.append(
            (
                c.name,
                "ok" if c.ok else "FAILED",
                c.tests_summary,
                str(c.rows),
                str(len(c.problems)),
                f"{c.seconds:.1f}s",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _report(check: ServerCheck) -> None:
    for note in check.notes:
        print(f"[{check.name}] note: {note}")
    for problem in check.problems:
        print(f"[{check.name}] {problem}")
    if check.pytest_returncode not in (0, None):
        print(check.pytest_output.rstrip())
    print(
        f"[{check.name}] {'ok' if check.ok else 'FAILED'}: {check.rows} example rows, tests: {check.tests_summary}"
    )


def all_server_folders(cwd: Path | None = None) -> list[Path]:
    """Every environment folder under ``resources_servers/`` (the working directory's, else the project's)."""
    base = (cwd or Path.cwd()) / KIND_FOLDER
    if not base.is_dir():
        base = project_root() / KIND_FOLDER
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def _test_command(argv: list[str]) -> int:
    config = load_config(argv)
    entrypoint = config.get("entrypoint")
    timeout_s = float(config.get("timeout_s") or DEFAULT_TEST_TIMEOUT_S)
    validate = config.get("should_validate_data")
    validate_data = None if validate is None else validate is True
    if entrypoint:
        check = check_server(
            find_server_folder(str(entrypoint)), timeout_s=timeout_s, validate_data=validate_data
        )
        _report(check)
        return 0 if check.ok else 1
    checks = []
    for folder in all_server_folders():
        print(f"ng_test: {folder.name} ...", flush=True)
        check = check_server(folder, timeout_s=timeout_s, validate_data=validate_data)
        if not check.ok:
            _report(check)
        checks.append(check)
    print(format_table(checks))
    failed = [c.name for c in checks if not c.ok]
    print(
        f"{len(checks) - len(failed)}/{len(checks)} environments passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


ng_test = console_command(_test_command, "ng_test")
