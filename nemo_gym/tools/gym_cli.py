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
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from nemo_gym.console.command_help import HELP_WORDS, help_text, wants_help
from nemo_gym.launch.config import ConfigError, project_root
from nemo_gym.tools.gym_commands import FLAGS, GROUPS, Flag, Subcommand

__all__ = ["FLAGS", "GROUPS", "Flag", "Subcommand", "main", "translate"]

_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s")


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
    if command.positional == "entrypoint":
        lines.append(f"  {'NAME':<26} an environment by name: +entrypoint=resources_servers/NAME")
    elif isinstance(command.positional, tuple):
        for key in command.positional:
            lines.append(f"  {key.upper():<26} +{key}")
    keys = dict(command.keys)
    for flag in command.flags or FLAGS:
        shown = ", ".join((*flag.aliases, flag.flag)) + (" VALUE" if flag.takes_value else "")
        text = "+" + keys[flag.flag] if flag.flag in keys else flag.text or "+" + flag.key
        lines.append(f"  {shown:<26} {text}")
    return "\n".join(lines) + "\n"


def _flag_table(command: Subcommand) -> dict[str, Flag]:
    return {name: flag for flag in command.flags or FLAGS for name in (flag.flag, *flag.aliases)}


def translate(args: Sequence[str], command: Subcommand) -> tuple[list[str], bool]:
    """Hydra-style arguments for ``args``; also whether ``--no-serve`` was given."""
    out: list[str] = []
    config_paths: list[str] = []
    positionals: list[str] = []
    no_serve = False
    table = _flag_table(command)
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg.startswith("-") and not arg.lstrip("-").replace(".", "").isdigit():
            name, has_inline, inline = arg.partition("=")
            flag = table.get(name)
            if flag is None:
                raise ConfigError(
                    f"unknown flag {name!r}{_suggest(name, list(table))} (gym ... --help lists them)"
                )
            if not flag.takes_value:
                if name == "--no-serve":
                    no_serve = True
                else:
                    out.append(f"+{flag.key}={flag.const}")
                continue
            if has_inline:
                value = inline
            elif index < len(args):
                value = args[index]
                index += 1
            else:
                raise ConfigError(f"flag {name} needs a value")
            if flag.key == "entrypoint":
                out.append(f"+entrypoint={value if '/' in value else 'resources_servers/' + value}")
            elif flag.key != "config_paths":
                value = json.dumps(value) if flag.quote else value
                out.append(f"+{dict(command.keys).get(flag.flag, flag.key)}={value}")
            elif flag.flag == "--resources-server":
                config_paths.append(_component_config("resources_servers", value))
            elif flag.flag == "--model-type":
                config_paths.append(_component_config("responses_api_models", value))
            else:
                config_paths += [part for part in value.split(",") if part]
        elif "=" not in arg and command.positional == "entrypoint":
            out.append(f"+entrypoint={arg if '/' in arg else 'resources_servers/' + arg}")
        elif "=" not in arg and isinstance(command.positional, tuple):
            positionals.append(arg)
        else:
            out.append(arg)
    if positionals:
        keys = command.positional if isinstance(command.positional, tuple) else ()
        if len(positionals) > len(keys):
            raise ConfigError(f"takes at most {len(keys)} positional arguments ({', '.join(keys)})")
        out += [
            f"+{key}={value}"
            for key, value in zip(keys[len(keys) - len(positionals) :], positionals, strict=True)
        ]
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
        generated = getattr(entry, "command_help", None)
        if generated is not None:
            sys.stdout.write(generated.render(prog, flags_help(command)))
            return 0
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
        return list_available(kind, argv[1:])
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


def list_available(kind: str, argv: list[str]) -> int:
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
    needs = {name: folder_needs(root / kind / name, root) for name in names}
    labels = {name: needs_label(needs[name]) for name in names}
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
        for category, reason in sorted(needs[name].items()):
            print(f"      {category}: {reason}")  # the file and line that triggered the rule
    print(
        "runs here: needs no GPU, network or data step by the static rule (under each other entry: "
        "what needs it, with the file and line)"
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
