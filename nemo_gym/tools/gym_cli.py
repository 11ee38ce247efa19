"""``gym``: NeMo Gym's grouped command line, over the ``ng_*`` commands.

``gym <group> <command> [--flag value ...] [key=value ...]``. Each command runs an ``ng_*``
command (``gym env start`` is ``ng_run``); Hydra-style ``key=value`` arguments pass through
unchanged, and a few NeMo Gym flags are translated (``--agent X`` → ``+agent_name=X``, see
:data:`FLAGS`). ``--help`` works at every level; a mistyped group, command or flag gets a
"did you mean".
"""

from __future__ import annotations

import ast
import difflib
import importlib
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nemo_gym.console.command_help import HELP_WORDS, help_text, wants_help
from nemo_gym.launch.config import ConfigError, project_root


@dataclass(frozen=True)
class Subcommand:
    """``gym <group> <name>``: runs ``target`` (``module:function`` of an ``ng_*`` command)."""

    name: str
    target: str
    command: str
    summary: str
    positional: str | None = None
    """What a bare positional argument means: ``entrypoint`` (an environment name)."""
    keys: tuple[tuple[str, str], ...] = ()
    """Flags whose override key differs for this command (``ng_viewer`` reads ``+input``)."""
    raw: bool = False
    """The command parses its own arguments (and ``--help``): they pass through untranslated."""


@dataclass(frozen=True)
class Flag:
    """A NeMo Gym style ``--flag value`` and the override it becomes."""

    flag: str
    key: str
    text: str
    takes_value: bool = True


FLAGS = (
    Flag("--config", "config_paths", "a config file to add to +config_paths (repeatable)"),
    Flag(
        "--resources-server",
        "config_paths",
        "an environment by name: adds resources_servers/NAME/configs/NAME.yaml",
    ),
    Flag(
        "--model-type",
        "config_paths",
        "a model server by name: adds responses_api_models/NAME/configs/NAME.yaml",
    ),
    Flag("--agent", "agent_name", "+agent_name"),
    Flag("--input", "input_jsonl_fpath", "+input_jsonl_fpath"),
    Flag("--output", "output_jsonl_fpath", "+output_jsonl_fpath"),
    Flag("--limit", "limit", "+limit"),
    Flag("--num-repeats", "num_repeats", "+num_repeats"),
    Flag("--benchmark", "benchmark", "+benchmark"),
    Flag(
        "--available",
        "available",
        "gym list environments/agents/models: what the nemo-gym wheel offers (optionally: VERSION)",
        False,
    ),
    Flag(
        "--no-serve",
        "",
        "gym eval run: use the running stack (ng_collect_rollouts) instead of starting one",
        False,
    ),
)
_FLAGS = {flag.flag: flag for flag in FLAGS}
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s")

GROUPS: dict[str, tuple[str, tuple[Subcommand, ...]]] = {
    "env": (
        "run and check environments",
        (
            Subcommand("start", "nemo_gym.cli:ng_run", "ng_run", "start the servers of a config"),
            Subcommand(
                "status", "nemo_gym.cli:ng_status", "ng_status", "show the head server and running servers"
            ),
            Subcommand(
                "test",
                "nemo_gym.tools.authoring:ng_test",
                "ng_test",
                "test environments (all if none is named)",
                "entrypoint",
            ),
            Subcommand(
                "init",
                "nemo_gym.tools.scaffold:ng_init_resources_server",
                "ng_init_resources_server",
                "scaffold a new environment",
                "entrypoint",
            ),
            Subcommand("resolve", "nemo_gym.cli:ng_dump_config", "ng_dump_config", "print the merged config"),
            Subcommand(
                "pull",
                "nemo_gym.tools.env_pull:ng_pull_environment",
                "ng_pull_environment",
                "bring one of NeMo Gym's environments in by name (NAME[==VERSION])",
            ),
        ),
    ),
    "eval": (
        "collect rollouts and score them",
        (
            Subcommand(
                "run",
                "nemo_gym.rollout_collection:ng_e2e_collect_rollouts",
                "ng_e2e_collect_rollouts",
                "start the servers, collect rollouts, stop (--no-serve: on a running stack)",
            ),
            Subcommand(
                "aggregate",
                "nemo_gym.rollout_collection:ng_aggregate_rollouts",
                "ng_aggregate_rollouts",
                "merge sharded rollout results and compute metrics",
            ),
            Subcommand(
                "reverify",
                "nemo_gym.tools.reverify:ng_reverify_rollouts",
                "ng_reverify_rollouts",
                "re-score rollouts with the current environment and report what changed",
            ),
            Subcommand(
                "certify",
                "nemo_gym.tools.certify_harness:ng_certify_harness",
                "ng_certify_harness",
                "certificate of RL fidelity for a harness on an engine (prefix, loss mask, log-probs)",
            ),
            Subcommand(
                "profile",
                "nemo_gym.reward_profile:ng_reward_profile",
                "ng_reward_profile",
                "per-task pass rate and reward variance; tasks always or never solved",
            ),
            Subcommand(
                "prepare",
                "nemo_gym.tools.benchmarks:ng_prepare_benchmark",
                "ng_prepare_benchmark",
                "write a benchmark's rows to disk",
            ),
            Subcommand(
                "submit",
                "nemo_gym.orchestration.commands:eval_submit",
                "",
                "submit a collection to Slurm (--config PATH [--dry-run])",
                raw=True,
            ),
            Subcommand(
                "status", "nemo_gym.orchestration.commands:eval_status", "", "a submission's jobs", raw=True
            ),
            Subcommand(
                "logs", "nemo_gym.orchestration.commands:eval_logs", "", "a submission's logs", raw=True
            ),
            Subcommand(
                "cancel", "nemo_gym.orchestration.commands:eval_cancel", "", "scancel a submission", raw=True
            ),
            Subcommand(
                "resume",
                "nemo_gym.orchestration.commands:eval_resume",
                "",
                "submit again what ended unfinished",
                raw=True,
            ),
        ),
    ),
    "list": (
        "discover what is bundled",
        (
            Subcommand(
                "environments",
                "nemo_gym.tools.gym_cli:list_environments",
                "",
                "environments (resources servers)",
            ),
            Subcommand(
                "resources-servers",
                "nemo_gym.tools.gym_cli:list_environments",
                "",
                "the same list under NeMo Gym 0.7.0's name",
            ),
            Subcommand("agents", "nemo_gym.tools.gym_cli:list_agents", "", "agent harnesses"),
            Subcommand("models", "nemo_gym.tools.gym_cli:list_models", "", "model servers"),
            Subcommand(
                "benchmarks",
                "nemo_gym.tools.benchmarks:ng_list_benchmarks",
                "ng_list_benchmarks",
                "benchmarks",
            ),
        ),
    ),
    "dataset": (
        "validate and collate datasets",
        (
            Subcommand(
                "collate",
                "nemo_gym.tools.prepare_data:ng_prepare_data",
                "ng_prepare_data",
                "validate a config's datasets and collate them (+mode=...)",
            ),
        ),
    ),
    "view": (
        "browse rollouts in a web page",
        (
            Subcommand(
                "",
                "nemo_gym.viewer:ng_viewer",
                "ng_viewer",
                "browse rollouts in a web page",
                keys=(("--input", "input"),),
            ),
        ),
    ),
    "version": (
        "print the version",
        (Subcommand("", "nemo_gym.cli:ng_version", "ng_version", "print the version"),),
    ),
}


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def top_help() -> str:
    """``gym --help``: the groups and their commands."""
    lines = [
        "usage: gym <group> <command> [--flag value ...] [key=value | +key=value | ++key=value ...]",
        "",
        "NeMo Gym's grouped command line. Every command is also an ng_* command (shown on the right).",
        "",
        "groups:",
    ]
    for group, (summary, commands) in GROUPS.items():
        lines.append(f"  {group:<9} {summary}")
        for command in commands:
            if command.name:
                shown = f"{group} {command.name}"
                lines.append(
                    f"    gym {shown:<20} {command.summary}"
                    + (f"  [{command.command}]" if command.command else "")
                )
    lines += [
        "",
        "gym <group> --help lists a group's commands; gym <group> <command> --help shows its options.",
        "gym --version prints the version.",
    ]
    return "\n".join(lines) + "\n"


def group_help(group: str) -> str:
    """``gym <group> --help``."""
    summary, commands = GROUPS[group]
    lines = [f"usage: gym {group} <command> ...", "", f"{summary}.", "", "commands:"]
    lines += [f"  {c.name:<13} {c.summary}" + (f"  [{c.command}]" if c.command else "") for c in commands]
    lines += ["", f"gym {group} <command> --help shows a command's options."]
    return "\n".join(lines) + "\n"


def flags_help(command: Subcommand) -> str:
    """The translated flags, as shown under a command's help."""
    lines = ["NeMo Gym flags (translated to the overrides above):"]
    if command.positional:
        lines.append(f"  {'NAME':<26} an environment by name: +entrypoint=resources_servers/NAME")
    keys = dict(command.keys)
    for flag in FLAGS:
        shown = flag.flag + (" VALUE" if flag.takes_value else "")
        lines.append(f"  {shown:<26} {'+' + keys[flag.flag] if flag.flag in keys else flag.text}")
    return "\n".join(lines) + "\n"


def translate(args: Sequence[str], command: Subcommand) -> tuple[list[str], bool]:
    """Hydra-style arguments for ``args``; also whether ``--no-serve`` was given."""
    out: list[str] = []
    config_paths: list[str] = []
    no_serve = False
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg.startswith("--"):
            name, has_inline, inline = arg.partition("=")
            flag = _FLAGS.get(name)
            if flag is None:
                raise ConfigError(
                    f"unknown flag {name!r}{_suggest(name, list(_FLAGS))} (gym ... --help lists them)"
                )
            if not flag.takes_value:
                if name == "--no-serve":
                    no_serve = True
                else:
                    out.append(f"+{flag.key}=true")
                continue
            if has_inline:
                value = inline
            elif index < len(args):
                value = args[index]
                index += 1
            else:
                raise ConfigError(f"flag {name} needs a value")
            if name == "--config":
                config_paths += [part for part in value.split(",") if part]
            elif name == "--resources-server":
                config_paths.append(_component_config("resources_servers", value))
            elif name == "--model-type":
                config_paths.append(_component_config("responses_api_models", value))
            else:
                out.append(f"+{dict(command.keys).get(name, flag.key)}={value}")
        elif "=" not in arg and command.positional == "entrypoint":
            out.append(f"+entrypoint={arg if '/' in arg else 'resources_servers/' + arg}")
        else:
            out.append(arg)
    if config_paths:
        out.insert(0, f"+config_paths=[{','.join(config_paths)}]")
    return out, no_serve


def _component_config(kind: str, name: str) -> str:
    folder = project_root() / kind
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    if name not in names:
        raise ConfigError(f"no {kind} named {name!r}{_suggest(name, names)} (known: {', '.join(names)})")
    path = Path(kind) / name / "configs" / f"{name}.yaml"
    if not (project_root() / path).exists():
        configs = sorted(p.name for p in (folder / name / "configs").glob("*.yaml"))
        raise ConfigError(f"{kind}/{name} has no configs/{name}.yaml; use --config with one of {configs}")
    return str(path)


def _load(target: str) -> Callable[[list[str]], Any] | None:
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise


def main(argv: Sequence[str] | None = None) -> None:
    """The ``gym`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    sys.exit(_main(args))


def _main(args: list[str]) -> int:
    if not args or args[0] in HELP_WORDS:
        sys.stdout.write(top_help())
        return 0 if args else 2
    if args[0] == "--version":
        args = ["version", *args[1:]]
    group, rest = args[0], args[1:]
    if group not in GROUPS:
        sys.stderr.write(f"gym: unknown group {group!r}{_suggest(group, list(GROUPS))}\n\n{top_help()}")
        return 2
    _, commands = GROUPS[group]
    if commands[0].name == "":
        command = commands[0]
        prog = f"gym {group}"
    else:
        if not rest or rest[0] in HELP_WORDS:
            sys.stdout.write(group_help(group))
            return 0 if rest else 2
        names = [c.name for c in commands]
        if rest[0] not in names:
            sys.stderr.write(
                f"gym {group}: unknown command {rest[0]!r}{_suggest(rest[0], names)}\n\n{group_help(group)}"
            )
            return 2
        command = commands[names.index(rest[0])]
        prog = f"gym {group} {command.name}"
        rest = rest[1:]
    if command.raw:
        return _call(prog, command.target, command.target, rest)
    if wants_help(rest):
        entry = _load(command.target)
        listing = group == "list"
        doc = getattr(entry, "__doc__", None) if listing else None
        extra = "" if listing else flags_help(command)
        sys.stdout.write(
            help_text(
                command.command or None, doc or command.summary, prog, extra, config_options=not listing
            )
        )
        return 0
    try:
        translated, no_serve = translate(rest, command)
    except ConfigError as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return 2
    target = command.target
    if no_serve:
        if command.command != "ng_e2e_collect_rollouts":
            sys.stderr.write(f"{prog}: --no-serve applies to gym eval run only\n")
            return 2
        target = "nemo_gym.rollout_collection:ng_collect_rollouts"
    return _call(prog, target, command.command or target, translated)


def _call(prog: str, target: str, shown: str, args: list[str]) -> int:
    """Run the entry point ``target`` with ``args``; its exit status."""
    entry = _load(target)
    if entry is None:
        sys.stderr.write(f"{prog}: {shown} is not part of this installation\n")
        return 2
    try:
        entry(args)
    except SystemExit as done:
        return int(done.code or 0) if not isinstance(done.code, str) else 1
    return 0


# ---- gym list: what is bundled ---------------------------------------------------------------


def component_summary(folder: Path) -> str:
    """One line saying what a server folder is: its config's description, README or module docstring."""
    config = folder / "configs" / f"{folder.name}.yaml"
    if config.exists():
        try:
            data = yaml.safe_load(config.read_text()) or {}
        except yaml.YAMLError:
            data = {}
        for block in data.values() if isinstance(data, dict) else []:
            for impl in block.values() if isinstance(block, dict) else []:
                for fields in impl.values() if isinstance(impl, dict) else []:
                    if isinstance(fields, dict) and isinstance(fields.get("description"), str):
                        return fields["description"].strip()
    readme = folder / "README.md"
    if readme.exists():
        paragraph: list[str] = []
        for line in readme.read_text().splitlines():
            if line.strip() and not line.startswith(("#", "|", "```", "<")):
                paragraph.append(line.strip())
            elif paragraph:
                break
        if paragraph:
            return _first_sentence(" ".join(paragraph))
    app = folder / "app.py"
    if app.exists():
        try:
            doc = ast.get_docstring(ast.parse(app.read_text())) or ""
        except SyntaxError:
            doc = ""
        return _first_sentence(" ".join(doc.split("\n\n")[0].split())) if doc.strip() else ""
    return ""


def _first_sentence(text: str) -> str:
    end = _SENTENCE_END.search(text)
    return text[: end.start() + 1] if end else text


def _list_kind(kind: str, argv: list[str]) -> int:
    if argv and argv[0] == "+available=true":
        return _list_available(kind, argv[1:])
    if argv:
        raise ConfigError(f"takes no arguments but --available [VERSION], got {' '.join(argv)}")
    folder = project_root() / kind
    names = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    width = max((len(p.name) for p in names), default=0)
    for path in names:
        summary = component_summary(path)
        if len(summary) > 100:
            summary = summary[:97] + "..."
        print(f"{path.name:<{width}}  {summary}".rstrip())
    return 0


def _list_available(kind: str, argv: list[str]) -> int:
    """What the nemo-gym wheel (``argv``: an optional version) offers of ``kind``: pulled or
    bundled ones marked ``*``, and what each needs beyond this machine (the corpus script's rule:
    :func:`nemo_gym.tools.env_pull_needs.folder_needs`)."""
    from nemo_gym.tools.env_pull import PullError, fetch_wheel, list_folders
    from nemo_gym.tools.env_pull_needs import folder_needs, needs_label

    if len(argv) > 1 or (argv and not re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", argv[0])):
        raise ConfigError(f"--available takes an optional version (0.7.0), got {' '.join(argv)}")
    try:
        root = fetch_wheel(argv[0] if argv else None)
    except PullError as exc:
        raise ConfigError(str(exc)) from exc
    names = [name for _, name in list_folders(root, [kind])]
    labels = {name: needs_label(folder_needs(root / kind / name, root)) for name in names}
    width = max((len(n) for n in names), default=0)
    label_width = max((len(v) for v in labels.values()), default=0)
    print(
        f"nemo-gym {root.name.removeprefix('nemo_gym-')}: {len(names)} {kind} "
        "(* already here; gym env pull NAME[==VERSION])"
    )
    for name in names:
        here = "*" if (project_root() / kind / name).exists() else " "
        summary = component_summary(root / kind / name)
        summary = summary[:77] + "..." if len(summary) > 80 else summary
        print(f"{here} {name:<{width}}  {labels[name]:<{label_width}}  {summary}".rstrip())
    print(
        "runs here: needs no GPU, network or data step by the static rule; needs data step: "
        "gym env pull NAME says which command prepares it"
    )
    return 0


def _lister(kind: str, doc: str) -> Callable[[Sequence[str] | None], None]:
    from nemo_gym.console.command import console_command

    def body(argv: list[str]) -> int:
        return _list_kind(kind, argv)

    body.__doc__ = doc
    entry = console_command(body)
    entry.__doc__ = doc
    return entry


list_environments = _lister(
    "resources_servers", "List the bundled environments (resources servers) and what each does."
)
list_agents = _lister("responses_api_agents", "List the bundled agent harnesses and what each does.")
list_models = _lister("responses_api_models", "List the bundled model servers and what each does.")
