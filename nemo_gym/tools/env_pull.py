"""``ng_pull_environment`` (``gym env pull NAME[==VERSION]``): bring one of NeMo Gym's environments
(or agents, or model adapters) into this project by name, ready to test and run.

The ``nemo-gym`` wheel on the package index ships NeMo Gym's server folders. It is fetched with
``pip download`` into a cache (``~/.cache/nemo_gym/wheels``, or ``$NEMO_GYM_WHEEL_CACHE``) and
only unpacked there, never installed: its ``nemo_gym`` package would shadow this one. The named
folder is copied to ``resources_servers/NAME`` (``responses_api_agents/NAME``,
``responses_api_models/NAME`` for the other kinds, or ``+dir=PATH``), together with every folder
of the wheel it imports or names that this project lacks (helper packages such as
``resources_servers/gymnasium``, the environment an agent builds on). What those folders'
``requirements.txt`` lists and NeMo Gym's own dependencies that their code imports without
listing them are installed with pip into the current environment, after the versions the
release's own dependency list pins where it excludes what is installed (0.4.0's
``openai<=2.7.2``; within this package's own ranges: :mod:`nemo_gym.tools.env_pull_pins`).
Where the project already has
a folder of a needed name that does not define what the pulled code imports from it, the pull
stops and says so; ``+replace_bundled=true`` puts NeMo Gym's folder in its place.

Every copied folder is marked as pulled: ``.nemo_gym_source.json`` records where it came from
(with the wheel's licence beside it), and a ``ruff.toml`` keeps it out of the project's lint;
the project's test run skips it too (``conftest.py``). The pull ends with the commands that test
and run the folder, and says what it needs that this machine may not have (a GPU, the network, a
data-preparation step).

``gym list environments --available`` lists what a wheel offers.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, parse_overrides, project_root
from nemo_gym.tools.env_example_run import declared_cohort
from nemo_gym.tools.env_pull_closure import SOURCE_RECORD, clashes, folder_closure, named_files, project_users
from nemo_gym.tools.env_pull_needs import folder_needs
from nemo_gym.tools.env_pull_pins import (
    ReleasePin,
    apply_release_pins,
    own_ranges,
    plan_release_pins,
    release_requirements,
)
from nemo_gym.tools.env_pull_requirements import (
    GPU_REQUIREMENTS,
    folder_requirements,
    index_alternatives,
    install_requirements,
    installed_conflicts,
    nemo_gym_dependencies,
    pip_arguments,
    pkg_resources_setuptools,
    protected_versions,
    read_requirements,
    requirement_name,
    runtime_requirements,
    unmet_requirements,
)
from nemo_gym.tools.env_pull_wheel import (
    KINDS,
    PACKAGE,
    PullError,
    default_cache_dir,
    download_wheel,
    fetch_wheel,
    find_folder,
    list_folders,
    unpack_wheel,
    wheel_license,
    wheel_version,
)

__all__ = [
    "GPU_REQUIREMENTS",
    "KINDS",
    "PullError",
    "default_cache_dir",
    "fetch_wheel",
    "folder_requirements",
    "list_folders",
    "pip_arguments",
    "pull_environment",
    "pull_summary",
    "read_requirements",
    "requirement_name",
    "unmet_requirements",
]

# Written into every pulled folder: ruff reads the closest config, so this keeps the folder out
# of the project's own `ruff check .` / `ruff format --check .` (NeMo Gym's code follows NeMo
# Gym's lint rules, not this project's).
RUFF_TOML = """# Pulled from NeMo Gym by `gym env pull` (see .nemo_gym_source.json): not linted as part of this project.
exclude = ["*"]
"""


def _copy_folder(source: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".venv", "__pycache__", "*.pyc"))
    (target / "ruff.toml").write_text(RUFF_TOML)


def _plan(
    root: Path, kind: str, name: str, project: Path, replace_bundled: bool
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """``(copied, kept, replaced)``: the folders the pull copies besides ``kind/name``, the
    project's own folders it uses, and the project's folders NeMo Gym's replace. Raises
    :class:`PullError` naming every clash unless ``replace_bundled``."""
    replace: set[str] = set()
    while True:
        copied, kept = folder_closure(root, kind, name, project, frozenset(replace))
        found = clashes([root / kind / name, *(root / k / n for k, n in copied)], project, kept)
        if not found:
            replaced = [(k, n) for k, n in copied if (project / k / n).is_dir()]
            # A project folder kept for the pull that imports from one NeMo Gym's replaces must
            # find its names in NeMo Gym's (the project's local_vllm_model imports
            # check_on_policy_settings from its vllm_model, which 0.4.0's lacks): else it goes too.
            stale = {f"{k}/{n}" for k, n in kept if clashes([project / k / n], root, replaced)}
            if not stale - replace:
                return copied, kept, replaced
            replace |= stale
            continue
        if not replace_bundled:
            lines = [f"{kind}/{name} imports from NeMo Gym folders that this project has in another form:"]
            for clash in found:
                users = project_users(project, clash.kind, clash.name, skip=set())
                lines.append(
                    f"  {clash.kind}/{clash.name}: the project's folder does not define {clash.describe()}"
                    + (
                        f" (the project's {', '.join(users[:4])}{' ...' if len(users) > 4 else ''} use it)"
                        if users
                        else ""
                    )
                )
            lines.append(
                "Rerun with +replace_bundled=true to put NeMo Gym's "
                + ", ".join(f"{c.kind}/{c.name}" for c in found)
                + " in place of the project's (git checkout restores the project's own)."
            )
            raise PullError("\n".join(lines))
        replace |= {f"{c.kind}/{c.name}" for c in found}


def _install(
    target: Path,
    companions: list[Path],
    dependencies: dict[str, list[str]],
    install: bool,
    install_gpu_requirements: bool,
    index_url: str | None,
) -> tuple[list[str], list[str]]:
    """Install what the pulled folder needs (its requirements and NeMo Gym's dependencies that any
    copied folder's code imports: a failure is a :class:`PullError`), then each companion folder's
    own requirements, one folder at a time: a companion whose requirements cannot be installed
    here (a git clone, a GPU stack) is reported, not fatal, since the pulled folder may never
    start it. ``(installed, not installed with why)``."""

    # What this package runs on stays as it is: a folder's pin of another version is not
    # installed, and pip is constrained to the installed versions.
    keep = protected_versions()

    def split(reqs: list[str]) -> tuple[list[str], list[str]]:
        missing = unmet_requirements(reqs)
        gpu = [r for r in missing if requirement_name(r) in GPU_REQUIREMENTS and not install_gpu_requirements]
        kept = [r for r in installed_conflicts(missing, keep) if r not in gpu]
        wanted = [r for r in missing if r not in gpu and r not in kept]
        return (wanted if install else []), [
            *(r for r in missing if r in gpu or (not install and r in wanted)),
            *(
                f"{r} (kept {requirement_name(r)} {keep[requirement_name(r)]}, which this package uses)"
                for r in kept
            ),
        ]

    own: list[str] = list(folder_requirements(target))
    for folder in [target, *companions]:
        own += [r for r in runtime_requirements(folder, dependencies) if r not in own]
    own = pkg_resources_setuptools(target, own, importlib.util.find_spec("pkg_resources") is not None)
    installed, skipped = split(own)
    if installed:
        ok, last = install_requirements(installed, index_url, keep)
        if not ok:
            served = index_alternatives(installed, index_url)
            raise PullError(
                f"pip could not install {target.name}'s requirements {installed}: {last}"
                + "".join(f"\n  {line}" for line in served)
            )
    for folder in companions:
        extra, more_skipped = split([r for r in folder_requirements(folder) if r not in own])
        skipped += [r for r in more_skipped if r not in skipped]
        if extra:
            ok, last = install_requirements(extra, index_url, keep)
            if ok:
                installed += extra
            else:
                skipped.append(f"{folder.parent.name}/{folder.name}: {' '.join(extra)} (pip: {last})")
    return installed, skipped


def _release_pins(
    root: Path, install: bool, release_pins: bool, index_url: str | None
) -> tuple[list[ReleasePin], list[str]]:
    """Install the versions the release's own dependency list pins where it excludes what is
    installed, within this package's own ranges (:mod:`nemo_gym.tools.env_pull_pins`):
    ``(applied, not applied with why)``. With ``+install=false`` or ``+release_pins=false``,
    every pin is listed as not applied, saying which."""
    keep = protected_versions()
    pins, refused = plan_release_pins(release_requirements(root), own_ranges(), keep)
    if not (install and release_pins):
        why = "+install=false" if not install else "+release_pins=false"
        return [], [f"{p.release} (kept {p.name} {p.installed}: {why})" for p in pins] + refused
    applied, failed = apply_release_pins(pins, keep, index_url)
    return applied, failed + refused


def pull_environment(
    name: str,
    version: str | None = None,
    *,
    dest: Path | None = None,
    kind: str | None = None,
    install: bool = True,
    install_gpu_requirements: bool = False,
    force: bool = False,
    replace_bundled: bool = False,
    cache_dir: Path | None = None,
    index_url: str | None = None,
    project: Path | None = None,
    release_pins: bool = True,
) -> dict[str, Any]:
    """Pull one folder and what it needs; returns the source record written to
    ``<dest>/.nemo_gym_source.json``. With ``release_pins``, the release's own dependency
    ranges are honoured where they exclude what is installed (:mod:`nemo_gym.tools.env_pull_pins`).

    Raises :class:`PullError` when the wheel or the folder cannot be found, when ``dest`` exists
    (unless ``force``), when a folder of the project clashes (unless ``replace_bundled``), or
    when pip cannot install a requirement.
    """
    wheel = download_wheel(version, cache_dir or default_cache_dir(), index_url)
    root = unpack_wheel(wheel)
    found_kind, source = find_folder(root, name, kind)
    project = dest.resolve().parent.parent if dest else (project or project_root())
    target = dest or project / found_kind / name
    if target.exists() and not force:
        raise PullError(
            f"{target} already exists; pass +force=true to replace it or +dir=PATH to put it elsewhere"
        )
    copied, kept, replaced = _plan(root, found_kind, name, project, replace_bundled)

    folders = [target, *(project / k / n for k, n in copied)]
    _copy_folder(source, target)
    for k, n in copied:
        _copy_folder(root / k / n, project / k / n)
    brought = named_files(root, folders, kept, project)
    for relative in brought:
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / relative, project / relative)

    applied, refused = _release_pins(root, install, release_pins, index_url)
    to_install, not_installed = _install(
        target, folders[1:], nemo_gym_dependencies(root), install, install_gpu_requirements, index_url
    )

    declared, licence_files = wheel_license(root)
    common = {
        "package": PACKAGE,
        "version": wheel_version(wheel),
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "index_url": index_url or "pip's configured index",
        "license": declared,
        "license_files": [p.name for p in licence_files],
        "pulled_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    record = {
        **common,
        "kind": found_kind,
        "name": name,
        "source_path": f"{found_kind}/{name}",
        "also_pulled": [f"{k}/{n}" for k, n in copied],
        "replaced_project_folders": [f"{k}/{n}" for k, n in replaced],
        "uses_project_folders": [f"{k}/{n}" for k, n in kept],
        "files_into_project_folders": brought,
        "needs": folder_needs(target, project),
        "requirements_installed": to_install,
        "requirements_not_installed": not_installed,
        "release_pins": [
            {"distribution": p.name, "release": p.release, "was": p.installed, "now": p.now} for p in applied
        ],
        "release_pins_not_applied": refused,
    }
    for folder, (k, n) in [(target, (found_kind, name)), *zip(folders[1:], copied, strict=True)]:
        for licence in licence_files:
            shutil.copy2(licence, folder / licence.name)
        entry = record if folder == target else {
            **common, "kind": k, "name": n, "source_path": f"{k}/{n}", "pulled_for": f"{found_kind}/{name}"
        }  # fmt: skip
        (folder / SOURCE_RECORD).write_text(json.dumps(entry, indent=2) + "\n")
    return record


def next_steps(record: dict[str, Any], where: Path) -> list[str]:
    """The commands that test and run a pulled folder (and what to do first, if anything), with
    paths relative to the working directory when the folder is under it."""
    kind, name = record["kind"], record["name"]
    try:
        where = where.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        where = where.resolve()
    lines = []
    needs = record.get("needs") or {}
    if "data_step" in needs:
        lines.append(f"before it runs, prepare its data: {needs['data_step']}")
    for key, word in (
        ("gpu", "a GPU"),
        ("network", "the network"),
        ("private_data", "data not in the wheel"),
    ):
        if key in needs:
            lines.append(f"it needs {word}: {needs[key]}")
    # A group of servers (an agent per stage, sharing one requirements.txt) is tested server by server.
    group = [] if (where / "app.py").is_file() else sorted(p.parent for p in where.glob("*/app.py"))
    lines += [f"test it:  gym env test {folder}" for folder in group or [where]]
    if kind == "resources_servers":
        configs = sorted((where / "configs").glob("*.yaml"))
        config = where / "configs" / f"{name}.yaml"
        config = config if config.is_file() else (configs[0] if configs else config)
        cohort = declared_cohort(config) if config.is_file() else None
        # A server scoring n rollouts of a row together waits for all n: send them, at once.
        repeats = f" +num_repeats={cohort[0]} +num_samples_in_parallel={5 * cohort[0]}" if cohort else ""
        lines.append(
            f"run it:   gym eval run +config_paths=[{config},"
            "responses_api_models/openai_model/configs/openai_model.yaml] "
            f"+input_jsonl_fpath={where / 'data' / 'example.jsonl'} "
            f"+output_jsonl_fpath=results/{name}_rollouts.jsonl +limit=5{repeats}"
        )
        if cohort:
            lines.append(
                f"          ({cohort[1]}: {cohort[0]} in its config: it scores {cohort[0]} rollouts of a row together)"
            )
    return lines


_NAME_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]*?)(==(?P<version>[0-9][^=\s]*))?$")


def _pull_command(argv: list[str]) -> int:
    """Pull one of NeMo Gym's environments (or agents, model adapters) by name, with the folders
    it imports or names, and install what they need.

    ng_pull_environment NAME[==VERSION] [+dir=PATH] [+kind=KIND] [+install=false]
        [+force=true] [+replace_bundled=true] [+install_gpu_requirements=true] [+index_url=URL]
        [+project_dir=PATH] [+release_pins=false]
    """
    specs = [a for a in argv if not a.startswith("+") and _NAME_SPEC.match(a)]
    overrides = {o.path: o.value for o in parse_overrides([a for a in argv if a not in specs])}
    if len(specs) > 1:
        raise ConfigError(f"name one environment to pull, got {specs}")
    match = _NAME_SPEC.match(specs[0]) if specs else None
    name = (match.group("name") if match else None) or overrides.get("name")
    version = (match.group("version") if match else None) or overrides.get("version")
    if not name:
        raise ConfigError("name the environment to pull: ng_pull_environment NAME[==VERSION] (or +name=NAME)")
    kind = overrides.get("kind")
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"+kind must be one of {', '.join(KINDS)}, got {kind!r}")
    dest = Path(str(overrides["dir"])) if overrides.get("dir") else None
    project = Path(str(overrides["project_dir"])).resolve() if overrides.get("project_dir") else None
    try:
        record = pull_environment(
            str(name),
            str(version) if version is not None else None,
            dest=dest,
            kind=kind,
            install=overrides.get("install", True) is not False,
            install_gpu_requirements=overrides.get("install_gpu_requirements") is True,
            force=overrides.get("force") is True,
            replace_bundled=overrides.get("replace_bundled") is True,
            index_url=overrides.get("index_url"),
            project=project,
            release_pins=overrides.get("release_pins", True) is not False,
        )
    except PullError as exc:
        sys.stderr.write(f"ng_pull_environment: {exc}\n")
        return 1
    where = dest or (project / record["source_path"] if project else Path(record["source_path"]))
    print(
        f"pulled {record['source_path']} from nemo-gym {record['version']} ({record['license']}) into {where}"
    )
    for line in pull_summary(record):
        print(line)
    for line in next_steps(record, where):
        print(line)
    return 0


def pull_summary(record: dict[str, Any]) -> list[str]:
    """What a pull did besides copying the folder, a line each (``label: what``), from its
    record; what it did not do is left out."""
    pins = "; ".join(
        f"{p['distribution']} {p['was']} -> {p['now']} ({p['release']})" for p in record["release_pins"]
    )
    parts = [
        ("also pulled (it imports or names them)", ", ".join(record["also_pulled"])),
        ("replaced the project's own", ", ".join(record["replaced_project_folders"])),
        ("uses the project's own", ", ".join(record["uses_project_folders"])),
        ("copied into them (it names these files)", ", ".join(record.get("files_into_project_folders", []))),
        (f"pinned as nemo-gym {record['version']} pins them", pins),
        ("release pins not applied", "; ".join(record["release_pins_not_applied"])),
        ("installed", ", ".join(record["requirements_installed"])),
        ("not installed (install them yourself if needed)", ", ".join(record["requirements_not_installed"])),
    ]
    return [f"{label}: {text}" for label, text in parts if text]


ng_pull_environment = console_command(_pull_command, "ng_pull_environment")

if __name__ == "__main__":
    ng_pull_environment(None)
