"""The nemo_gym package's import graph: no cycles and no import running up a layer.

Imports count at module level and inside functions. The layers are docs/ARCHITECTURE.md's.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import nemo_gym

PACKAGE = Path(nemo_gym.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every nemo_gym module ``path`` imports (``from nemo_gym import x`` counts x when it is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths)
    return {name: imported_modules(path, known) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    assert "nemo_gym.launch.launcher" in graph["nemo_gym.cli"]  # cli imports the launcher inside functions
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_nemo_gym_has_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


# Subpackages by layer, lowest first. Top-level (public) modules sit above every internal
# subpackage; tools/ and viewer/ are applications built on the public surface.
INTERNAL_LAYERS = {
    "nemo_gym.serving": 0,
    "nemo_gym.engine": 0,
    "nemo_gym.agents": 1,
    "nemo_gym.launch": 1,
    "nemo_gym.models": 1,
    "nemo_gym.collection": 2,
    "nemo_gym.console": 2,
}
PUBLIC_LAYER = 3
APPLICATION_LAYERS = {"nemo_gym.tools": 4, "nemo_gym.viewer": 4}


def layer(module: str, graph: dict[str, set[str]]) -> int:
    """A module's layer; a public module that imports nothing of nemo_gym is a leaf anyone may use."""
    for prefix, rank in {**INTERNAL_LAYERS, **APPLICATION_LAYERS}.items():
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return PUBLIC_LAYER if graph.get(module) else 0


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} (layer {layer(source, graph)}) imports {target} (layer {layer(target, graph)})"
        for source, targets in graph.items()
        for target in targets
        if layer(target, graph) > layer(source, graph)
    )


def test_layer_rule_sees_an_upward_import() -> None:
    graph = {"nemo_gym.serving.server": {"nemo_gym.cli"}, "nemo_gym.cli": {"nemo_gym.serving.server"}}
    assert upward_imports(graph) == ["nemo_gym.serving.server (layer 0) imports nemo_gym.cli (layer 3)"]


def test_no_import_runs_up_a_layer() -> None:
    assert upward_imports(import_graph()) == []


# The top level is the public surface: NeMo Gym's module paths (present in the nemo-gym 0.7.0
# package; trainers and environment folders import them there) and our own documented entry points.
NEMO_GYM_PUBLIC_PATHS = {
    "base_environment_server", "base_resources_server", "base_responses_api_agent", "base_responses_api_model", "cli",
    "cli_setup_command",
    "config_types", "deliverables", "episode_types", "failure_kinds", "global_config", "judge",
    "mcp_auto_exposure", "openai_utils", "path_utils", "prompt", "reward_profile",
    "rollout_collection", "rollout_correlation", "rollout_health", "rollout_observability", "server_utils", "testing", "tool_access",
    "verifier_fixture",
    "responses_converter",
    "chat_streaming",
    "responses_streaming",
    "skills",
    "task_data",
    "task_materialization",
    "token_id_capture",
    "anthropic_converter",
    "profiling",
}  # fmt: skip
OUR_ENTRY_POINTS = {
    "failure_classes",
    "gymnasium",
    "gymnasium_server",
    "llm_judge",
    "response_items",
    "train_data",
}


def test_top_level_is_the_public_surface_only() -> None:
    top = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    stray = sorted(top - NEMO_GYM_PUBLIC_PATHS - OUR_ENTRY_POINTS)
    assert not stray, (
        f"{stray} at the top of nemo_gym/: an internal module belongs in the subpackage of its "
        "responsibility (docs/ARCHITECTURE.md); a NeMo Gym module path goes in NEMO_GYM_PUBLIC_PATHS"
    )
    assert len(OUR_ENTRY_POINTS) <= 8, "our own top-level entry points stay few"
    for path in PACKAGE.glob("*.py"):
        first_line = (ast.get_docstring(ast.parse(path.read_text())) or "").strip().splitlines()
        assert first_line and first_line[0], f"{path.name} needs a docstring saying what it is for"


# ---- the environment folders -----------------------------------------------------------------
# Folders of environments, agents and model adapters: the framework serves them and never imports
# them (a missing or broken folder must not break nemo_gym); they build on the framework.
ENVIRONMENT_FOLDERS = ("resources_servers", "responses_api_agents", "responses_api_models")
# What an environment folder may import of nemo_gym: the public surface only, the top-level
# modules and NeMo Gym's public packages. The server building blocks it needs from the internals
# (serving, models, agents, engine) are served by the public modules (serving/served_names.py);
# the orchestration (launch, collection) and the applications (console, tools, viewer) run
# environments, never the reverse.
PUBLIC_PACKAGES = ("token_id_capture", "sandbox", "telemetry", "testing")


def imported_names(path: Path) -> set[str]:
    """Every module name ``path`` imports, at module level or inside functions, and every string
    handed to ``importlib.import_module`` (an import by name is an import too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def environment_imports_of(paths: list[Path]) -> list[str]:
    return sorted(
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in paths
        for name in imported_names(path)
        if name.split(".")[0] in ENVIRONMENT_FOLDERS
    )


def test_the_framework_never_imports_an_environment_folder() -> None:
    offenders = environment_imports_of(sorted(PACKAGE.rglob("*.py")))
    assert offenders == [], "nemo_gym/ must not import an environment folder: " + "; ".join(offenders)


def test_the_environment_rule_sees_an_import_inside_a_function_and_by_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import importlib\n"
        "def f():\n    from responses_api_agents.simple_agent.app import SimpleAgent\n"
        "def g():\n    return importlib.import_module('resources_servers.x.app')\n"
    )
    assert imported_names(module) >= {"responses_api_agents.simple_agent.app", "resources_servers.x.app"}


def framework_import_problem(name: str, top_level: set[str]) -> str | None:
    """Why an environment folder may not import ``name`` (a nemo_gym module), or None."""
    parts = name.split(".")
    if parts[0] != "nemo_gym" or len(parts) == 1:
        return None
    if parts[1] in top_level:
        return None  # a public module (or a name imported from one)
    if parts[1] in PUBLIC_PACKAGES:
        return None
    return (
        f"nemo_gym.{parts[1]} is internal: import the name from a public module "
        "(nemo_gym/serving/served_names.py lists what each serves; add it there)"
    )


def test_environment_folders_import_the_public_surface_only() -> None:
    top_level = {p.stem for p in PACKAGE.glob("*.py")} | NEMO_GYM_PUBLIC_PATHS | OUR_ENTRY_POINTS
    # Names of the package itself (``from nemo_gym import PARENT_DIR``).
    # (Not its submodules: which of those are attributes depends on what other tests imported.)
    top_level |= {
        name
        for name, value in vars(nemo_gym).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    assert framework_import_problem("nemo_gym.launch.config", top_level)  # the rule can fail
    assert framework_import_problem("nemo_gym.serving.server", top_level)
    assert framework_import_problem("nemo_gym.base_resources_server", top_level) is None
    problems = []
    for folder in ENVIRONMENT_FOLDERS:
        for path in sorted((PACKAGE.parent / folder).rglob("*.py")):
            if "tests" in path.relative_to(PACKAGE.parent).parts:
                continue  # tests may drive anything
            for name in sorted(imported_names(path)):
                problem = framework_import_problem(name, top_level)
                if problem:
                    problems.append(f"{path.relative_to(PACKAGE.parent)} imports {name}: {problem}")
    assert problems == [], "\n".join(problems)


def test_every_name_served_to_environments_resolves() -> None:
    import importlib

    from nemo_gym.serving.served_names import SERVED_TO_ENVIRONMENTS

    for public, table in SERVED_TO_ENVIRONMENTS.items():
        module = importlib.import_module(public)
        for names in table.values():
            for name in names.split():
                assert getattr(module, name) is not None, f"{public} serves {name}"


def test_testing_helpers_obey_the_layers_and_import_no_environment() -> None:
    graph = import_graph()
    testing = {name for name in graph if name == "nemo_gym.testing" or name.startswith("nemo_gym.testing.")}
    assert len(testing) > 3  # the package and its modules are in the graph the layer rule checks
    assert not [line for line in upward_imports(graph) if line.startswith("nemo_gym.testing")]
    assert environment_imports_of(sorted((PACKAGE / "testing").rglob("*.py"))) == []


# ---- compatibility code that looks like compatibility code -----------------------------------
# Top-level modules that are the real implementation of their idea: our entry points, and the
# contracts environments subclass (at NeMo Gym's paths, implemented here, not adapted).
OUR_IMPLEMENTATIONS = OUR_ENTRY_POINTS | {
    "base_environment_server",
    "base_resources_server",
    "base_responses_api_agent",
    "base_responses_api_model",
    "mcp_auto_exposure",
    "reward_profile",
}
# Every other top-level module is a compatibility adapter: NeMo Gym's path over our internals,
# saying so in its first line, and thin (imports and short adapters; the logic lives below).
COMPATIBILITY_MARK = "Compatibility:"
THIN_CODE_LINES = 130
# Adapters that still hold more logic than an adapter should (a ceiling each: they may shrink,
# never grow). Moving their logic into the internals is open work.
NOT_YET_THIN = {"task_data": 168, "verifier_fixture": 177}


def code_lines(path: Path) -> int:
    """Lines of a module that are neither blank, comments, docstrings nor imports."""
    source = path.read_text()
    skipped: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                skipped.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            skipped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return sum(
        1
        for number, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in skipped
    )


def compatibility_problem(path: Path) -> str | None:
    """Why a top-level module is neither ours nor a thin adapter that says what it is, or None."""
    name = path.stem
    first = ((ast.get_docstring(ast.parse(path.read_text())) or "").strip().splitlines() or [""])[0]
    if name in OUR_IMPLEMENTATIONS:
        if first.startswith(COMPATIBILITY_MARK):
            return f"{name} is listed as ours but its first line says it is a compatibility adapter"
        return None
    if not first.startswith(COMPATIBILITY_MARK):
        return f"{name} is not listed as ours; an adapter's first line starts with {COMPATIBILITY_MARK!r}"
    lines, ceiling = code_lines(path), NOT_YET_THIN.get(name, THIN_CODE_LINES)
    if lines > ceiling:
        return f"{name} holds {lines} lines of code, more than an adapter's {ceiling}: move the logic below"
    return None


def test_every_top_level_module_is_ours_or_a_thin_adapter_that_says_so() -> None:
    modules = sorted(p for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    problems = [problem for path in modules if (problem := compatibility_problem(path))]
    assert problems == [], "\n".join(problems)


def test_the_compatibility_rule_can_fail(tmp_path: Path) -> None:
    unmarked = tmp_path / "server_utils.py"
    unmarked.write_text('"""NeMo Gym\'s names."""\n')
    assert "not listed as ours" in (compatibility_problem(unmarked) or "")
    fat = tmp_path / "prompt.py"
    fat.write_text('"""Compatibility: NeMo Gym\'s prompt."""\n' + "x = 1\n" * (THIN_CODE_LINES + 1))
    assert "lines of code" in (compatibility_problem(fat) or "")


# ---- one idea per module ---------------------------------------------------------------------
# A module past ~600 lines probably holds two ideas (docs/STYLE): split it, or say in its
# docstring, on a line starting "One idea:", why what it holds is one idea.
MAX_MODULE_LINES = 600
ONE_IDEA_MARK = "One idea:"


def long_module_problem(path: Path) -> str | None:
    """Why a module is too long for what its docstring claims, or None."""
    source = path.read_text()
    lines = source.count("\n")
    if lines <= MAX_MODULE_LINES:
        return None
    docstring = ast.get_docstring(ast.parse(source)) or ""
    if any(line.startswith(ONE_IDEA_MARK) for line in docstring.splitlines()):
        return None
    return (
        f"{path.name} has {lines} lines: split it by idea, or say on a "
        f"docstring line starting {ONE_IDEA_MARK!r} why it is one idea"
    )


def test_a_module_over_600_lines_is_split_or_says_why_it_is_one_idea(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text('"""A module."""\n' + "x = 1\n" * MAX_MODULE_LINES)
    assert "split it by idea" in (long_module_problem(long) or "")
    long.write_text('"""A module.\n\nOne idea: it is.\n"""\n' + "x = 1\n" * MAX_MODULE_LINES)
    assert long_module_problem(long) is None
    problems = [
        f"{path.relative_to(PACKAGE.parent)}: {problem}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (problem := long_module_problem(path))
    ]
    assert problems == [], "\n".join(problems)


# ---- the failure vocabulary has one home -----------------------------------------------------
FAILURE_CLASSES_HOME = PACKAGE / "failure_classes.py"
# Words that are only ever failure classes ("timeout" is also plain English: it is caught where
# it names a class, as a failure_class keyword or key).
DISTINCT_FAILURE_CLASSES = {
    "unreachable", "rate_limited", "upstream_auth", "upstream_5xx", "bad_upstream_body",
    "upstream_error", "judge_failed", "verifier_timeout", "verifier_error", "sandbox_failed",
    "agent_error", "malformed_input",
}  # fmt: skip
FAILURE_CLASS_KEYS = {"failure_class", "_ng_failure_class"}
# Other vocabularies that share a word with ours, each NeMo Gym's: its failure kinds
# (``judge_failed``, ``verifier_error``) and its model-call capture's error categories.
OTHER_VOCABULARIES = {"failure_kinds.py", "call_capture.py"}


def failure_class_literals(path: Path) -> list[str]:
    """Where ``path`` spells a failure class as a string instead of naming its constant."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        values: list[ast.expr] = []
        if isinstance(node, ast.Constant) and node.value in DISTINCT_FAILURE_CLASSES:
            values.append(node)
        elif isinstance(node, ast.keyword) and node.arg in FAILURE_CLASS_KEYS:
            values.append(node.value)
        elif isinstance(node, ast.Dict):
            values += [
                v
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value in FAILURE_CLASS_KEYS
            ]
        for value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value:
                found.append(f"{path.name}:{value.lineno} spells {value.value!r}")
    return sorted(set(found))


def test_no_failure_class_is_spelled_outside_its_home(tmp_path: Path) -> None:
    spelled = tmp_path / "spelled.py"
    spelled.write_text(
        'raise HTTPError(502, "x", failure_class="timeout")\nrow = {"_ng_failure_class": "agent_error"}\n'
    )
    assert len(failure_class_literals(spelled)) == 2  # the rule can fail
    paths = [
        p for p in PACKAGE.rglob("*.py") if p != FAILURE_CLASSES_HOME and p.name not in OTHER_VOCABULARIES
    ]
    for folder in ENVIRONMENT_FOLDERS:
        paths += [
            p
            for p in (PACKAGE.parent / folder).rglob("*.py")
            if "tests" not in p.relative_to(PACKAGE.parent).parts
        ]
    problems = [line for path in sorted(paths) for line in failure_class_literals(path)]
    assert problems == [], "use the constants of nemo_gym/failure_classes.py:\n" + "\n".join(problems)
