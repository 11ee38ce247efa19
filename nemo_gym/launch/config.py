"""Configuration: NeMo Gym's YAML shape and Hydra-style command-line overrides.

A config is a dict. Top-level keys whose value has the shape
``{<server kind>: {<implementation folder>: {fields}}}`` are server instances; every other
top-level key is a global (``policy_base_url``, ``head_server``, collector arguments, ...).

Composition order: ``+config_paths=[a.yaml,b.yaml]`` (merged in order), ``env.yaml`` in the working
directory, then command-line overrides (``key=value``, ``+key=value``, ``++key=value``).
``${name}`` interpolation is resolved after composition.
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Redaction lives in nemo_gym.serving.secrets; these names stay importable from here.
from nemo_gym.serving.secrets import REDACTED, SECRET_KEY_PARTS, is_secret_key, redact, secret_values  # noqa: F401

SERVER_KINDS = ("resources_servers", "responses_api_models", "responses_api_agents")
DEFAULT_HEAD_HOST = "127.0.0.1"
DEFAULT_HEAD_PORT = 11000
ENV_YAML = "env.yaml"
ENV_HEAD_HOST = "NEMO_GYM_HEAD_HOST"
ENV_HEAD_PORT = "NEMO_GYM_HEAD_PORT"
# Settings every command knows, so ``head_server.port=11300`` works without a leading ``+``.
BUILT_IN_KEYS = ("head_server.host", "head_server.port")


# The config key naming a Ray cluster to place servers on (NeMo Gym's name; re-exported by global_config).
RAY_HEAD_NODE_ADDRESS_KEY_NAME = "ray_head_node_address"


class ConfigError(ValueError):
    """A configuration problem; the message names the key, file or server at fault."""


@dataclass(frozen=True)
class Override:
    """One command-line override: ``path`` is dotted, ``mode`` is '', '+' or '++'."""

    path: str
    value: Any
    mode: str


@dataclass
class ServerInstance:
    """One configured server: ``name`` (instance), ``type`` (``resources_servers``,
    ``responses_api_agents`` or ``responses_api_models``), ``impl`` (its folder under ``type``).

    ``name`` and ``type`` are a :class:`~nemo_gym.serving.server.ServerRef`'s fields (:attr:`ref`).
    """

    name: str
    type: str
    impl: str
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> dict[str, str]:
        """The ``{type, name}`` reference other servers use to reach this one."""
        return {"type": self.type, "name": self.name}


def project_root() -> Path:
    """The folder holding ``nemo_gym/`` and the bundled server folders."""
    return Path(__file__).resolve().parents[2]


def parse_value(text: str) -> Any:
    """Parse an override value the way Hydra users expect: YAML scalars, lists and maps."""
    if text == "":
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_overrides(argv: Sequence[str]) -> list[Override]:
    """Turn ``key=value`` / ``+key=value`` / ``++key=value`` arguments into overrides."""
    overrides = []
    for arg in argv:
        mode = "++" if arg.startswith("++") else "+" if arg.startswith("+") else ""
        body = arg[len(mode) :]
        if "=" not in body:
            raise ConfigError(f"argument {arg!r} is not of the form key=value (or +key=value, ++key=value)")
        path, _, raw = body.partition("=")
        if not path or any(not part for part in path.split(".")):
            raise ConfigError(f"argument {arg!r} has an empty key")
        overrides.append(Override(path=path, value=parse_value(raw), mode=mode))
    return overrides


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``extra`` into a copy of ``base``: maps merge recursively, everything else replaces."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve_config_path(path: str | os.PathLike[str]) -> Path:
    """Find a config file relative to the working directory, the ``NEMO_GYM_EXTRA_ROOTS``
    folders, then the project root."""
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        if not candidate.exists():
            raise ConfigError(f"config file {str(path)!r} does not exist{_did_you_mean_config(candidate)}")
        return candidate
    # NeMo Gym's NEMO_GYM_EXTRA_ROOTS: more project roots to look in (a tree of NeMo Gym folders).
    extra = [Path(p) for p in os.environ.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if p]
    for root in [*extra, project_root()]:
        if (root / candidate).exists():
            return root / candidate
    folders = list(dict.fromkeys([str(Path.cwd().resolve()), *map(str, extra), str(project_root())]))
    raise ConfigError(
        f"config file {str(path)!r} not found in {' or '.join(folders)}{_did_you_mean_config(candidate)}"
    )


def _did_you_mean_config(missing: Path) -> str:
    """``; did you mean '...'?`` for the nearest existing config file, or ``""``."""
    pool: set[str] = set()
    for base in dict.fromkeys([Path.cwd(), project_root()]):
        for pattern in ("*/*/configs/*.yaml", "benchmarks/*/*.yaml"):
            pool.update(str(p.relative_to(base)) for p in base.glob(pattern))
    # Files beside the nearest folder of the path that exists (a typo in the file name).
    folder = missing.parent if missing.is_absolute() else Path.cwd() / missing.parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    if folder.is_dir():
        shown = missing.parent if missing.is_absolute() else None
        for found in folder.glob("*.y*ml"):
            pool.add(str(found) if shown is not None else os.path.relpath(found))
    close = difflib.get_close_matches(str(missing), sorted(pool), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def load_yaml_file(path: Path) -> dict[str, Any]:
    """Read one YAML config file; an empty file is an empty config."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping at top level, got {type(data).__name__}"
        )
    return data


def _as_path_list(value: Any, source: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.strip("[]").split(",") if part.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"config_paths from {source} must be a list of file paths, got {value!r}")


def apply_override(config: dict[str, Any], override: Override) -> None:
    """Apply one override in place. Plain ``key=value`` must name an existing key."""
    parts = override.path.split(".")
    if override.path in BUILT_IN_KEYS and not override.mode:
        override = Override(path=override.path, value=override.value, mode="+")
    node = config
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            if not override.mode:
                raise ConfigError(_missing_key_message(config, override.path))
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(
                f"cannot set {override.path!r}: {where!r} is a {type(child).__name__}, not a mapping"
            )
        node = child
    leaf = parts[-1]
    if not override.mode and leaf not in node:
        raise ConfigError(_missing_key_message(config, override.path))
    node[leaf] = copy.deepcopy(override.value)


def _all_dotted_keys(config: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        yield dotted
        if isinstance(value, Mapping):
            yield from _all_dotted_keys(value, dotted + ".")


def _missing_key_message(config: Mapping[str, Any], path: str) -> str:
    message = f"key {path!r} is not in the config; use +{path}=... to add it"
    close = difflib.get_close_matches(path, [*_all_dotted_keys(config), *BUILT_IN_KEYS], n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    return message


def resolve_interpolations(config: dict[str, Any]) -> dict[str, Any]:
    """Resolve ``${key}`` interpolations with OmegaConf, naming the key that is missing."""
    if "${" not in repr(config):
        return config
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        resolved = OmegaConf.to_container(OmegaConf.create(config), resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"config interpolation failed: {exc}".replace("\n", " ")) from exc
    assert isinstance(resolved, dict)
    return {str(k): v for k, v in resolved.items()}


def load_config_file(path: str | os.PathLike[str], _including: tuple[Path, ...] = ()) -> dict[str, Any]:
    """One config file with the files its own ``config_paths`` lists merged in first.

    A benchmark overlay lists the environment config it builds on; the overlay's own keys win.
    Included paths are found beside the including file, then as :func:`resolve_config_path` does.
    """
    resolved = resolve_config_path(path).resolve()
    if resolved in _including:
        chain = " -> ".join(str(p) for p in (*_including, resolved))
        raise ConfigError(f"config files include each other in a cycle: {chain}")
    data = load_yaml_file(resolved)
    merged: dict[str, Any] = {}
    for include in _as_path_list(data.pop("config_paths", None), str(resolved)):
        beside = resolved.parent / include
        target = beside if not Path(include).is_absolute() and beside.exists() else include
        merged = deep_merge(merged, load_config_file(target, (*_including, resolved)))
    return deep_merge(merged, data)


def load_config(
    argv: Sequence[str] = (),
    *,
    base: Mapping[str, Any] | None = None,
    initial: Mapping[str, Any] | None = None,
    cwd: Path | None = None,
    env_yaml: Path | None = None,
    read_env_yaml: bool = True,
    validate_refs: bool = True,
) -> dict[str, Any]:
    """Compose the global config: ``base`` < config files < ``env.yaml`` < ``initial`` < ``argv``.

    ``base`` holds defaults the config files override; ``initial`` is a trainer's own config dict
    (NeMo Gym's ``initial_global_config_dict``): it overrides the files and ``env.yaml``, and only
    command-line overrides win over it. Both may list ``config_paths``. ``env_yaml`` names the
    env file (default: ``env.yaml`` in ``cwd``); ``read_env_yaml=False`` skips it.
    ``validate_refs=False`` skips the server-ref check, for commands that start no server
    (data preparation) and so need not configure every server a ref names.
    """
    overrides = parse_overrides(argv)
    cwd = cwd or Path.cwd()
    env_path = env_yaml or cwd / ENV_YAML
    env_config = load_yaml_file(env_path) if read_env_yaml and env_path.exists() else {}

    paths: list[str] = []
    if base and "config_paths" in base:
        paths += _as_path_list(base["config_paths"], "the base config")
    paths += _as_path_list(env_config.get("config_paths"), ENV_YAML)
    if initial and "config_paths" in initial:
        paths += _as_path_list(initial["config_paths"], "the initial config")
    for override in overrides:
        if override.path == "config_paths":
            paths += _as_path_list(override.value, "the command line")

    config: dict[str, Any] = dict(base or {})
    kinds: dict[str, tuple[str, str]] = {}
    for path in paths:
        loaded = load_config_file(path)
        check_kind_clashes(loaded, str(path), kinds)
        config = deep_merge(config, loaded)
    config = deep_merge(config, env_config)
    config = deep_merge(config, {k: v for k, v in (initial or {}).items() if k != "config_paths"})
    if paths:
        config["config_paths"] = paths
    for override in overrides:
        if override.path != "config_paths":
            apply_override(config, override)
    config = resolve_inheritance(config)
    config = resolve_interpolations(config)
    if validate_refs:
        validate_server_refs(config)
    return config


INHERIT_KEY = "_inherit_from"


def resolve_inheritance(config: Mapping[str, Any]) -> dict[str, Any]:
    """NeMo Gym's ``_inherit_from: <instance>``: an instance is the named one's block with its own
    keys merged over it (a benchmark's copy of an environment, renamed). Chains are followed;
    a cycle or a missing name is a config error naming the instances."""
    resolved: dict[str, Any] = dict(config)

    def block(name: str, chain: tuple[str, ...]) -> Any:
        value = resolved.get(name)
        if not isinstance(value, Mapping) or INHERIT_KEY not in value:
            return value
        parent = value[INHERIT_KEY]
        if parent in chain or parent == name:
            raise ConfigError(f"{INHERIT_KEY} runs in a cycle: {' -> '.join((*chain, name, str(parent)))}")
        if parent not in resolved:
            raise ConfigError(
                f"instance {name!r} has {INHERIT_KEY}: {parent!r}, but no instance {parent!r} is configured"
                + "".join(
                    f" (did you mean {c!r}?)"
                    for c in difflib.get_close_matches(str(parent), list(resolved), n=1)
                )
            )
        own = {k: v for k, v in value.items() if k != INHERIT_KEY}
        merged = deep_merge(copy.deepcopy(block(str(parent), (*chain, name))), own)
        resolved[name] = merged
        return merged

    for name in list(resolved):
        block(str(name), ())
    return resolved


def check_kind_clashes(loaded: Mapping[str, Any], where: str, seen: dict[str, tuple[str, str]]) -> None:
    """Fail when a config file gives an instance name a server kind another file gave a different
    one (merged, the instance would hold two kinds and be dropped). ``seen``: name → (kind, file)."""
    for name, value in loaded.items():
        if not isinstance(value, Mapping):
            continue
        for kind in (k for k in value if k in SERVER_KINDS):
            before = seen.setdefault(str(name), (str(kind), where))
            if before[0] != kind:
                raise ConfigError(
                    f"server instance {name!r} is a {before[0]} in {before[1]} and a {kind} in {where}: "
                    "one instance name can be only one server kind (rename one of them)"
                )


def server_instances(config: Mapping[str, Any]) -> dict[str, ServerInstance]:
    """All server instances in a config, by instance name."""
    instances = {}
    for name, value in config.items():
        if isinstance(value, Mapping) and sum(k in SERVER_KINDS for k in value) > 1:
            raise ConfigError(
                f"server instance {name!r} has more than one server kind: "
                f"{sorted(str(k) for k in value if k in SERVER_KINDS)} (one instance name, one kind: "
                "rename one of them)"
            )
        if not isinstance(value, Mapping) or len(value) != 1:
            continue
        ((kind, body),) = value.items()
        if kind not in SERVER_KINDS:
            continue
        if not isinstance(body, Mapping) or len(body) != 1:
            raise ConfigError(
                f"server instance {name!r}: under {kind!r} give exactly one implementation folder, "
                f"e.g. {name}: {{{kind}: {{<folder>: {{entrypoint: app.py}}}}}}"
            )
        ((impl, fields),) = body.items()
        if fields is None:
            fields = {}
        if not isinstance(fields, Mapping):
            raise ConfigError(f"server instance {name!r}: the fields of {kind}.{impl} must be a mapping")
        instances[str(name)] = ServerInstance(name=str(name), type=kind, impl=str(impl), fields=dict(fields))
    return instances


def iter_server_refs(value: Any, path: str = "") -> Iterable[tuple[str, dict[str, Any]]]:
    """Yield ``(dotted path, ref)`` for every ``{type: <server kind>, name: ...}`` inside ``value``."""
    if isinstance(value, Mapping):
        if value.get("type") in SERVER_KINDS and "name" in value:
            yield path, dict(value)
        for key, child in value.items():
            yield from iter_server_refs(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from iter_server_refs(child, f"{path}[{index}]")


def validate_server_refs(config: Mapping[str, Any]) -> None:
    """Fail on a server ref that names no configured instance of that kind, with a suggestion."""
    instances = server_instances(config)
    for instance in instances.values():
        for where, ref in iter_server_refs(instance.fields):
            target = instances.get(ref["name"])
            if target is not None and target.type == ref["type"]:
                continue
            if target is not None:
                raise ConfigError(
                    f"server ref {ref['name']!r} at {instance.name}.{where} has type {ref['type']!r}, "
                    f"but {ref['name']!r} is a {target.type} instance"
                )
            same_kind = [i.name for i in instances.values() if i.type == ref["type"]]
            message = f"server ref {ref['name']!r} at {instance.name}.{where} not found"
            close = difflib.get_close_matches(ref["name"], same_kind, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
            elif same_kind:
                message += f"; configured {ref['type']}: {', '.join(sorted(same_kind))}"
            else:
                message += f"; no {ref['type']} instance is configured (add its config to +config_paths)"
            raise ConfigError(message)


def dump_yaml(config: Mapping[str, Any]) -> str:
    """The config as YAML, secrets redacted."""
    return yaml.safe_dump(redact(config, secret_values(config)), sort_keys=False)


def head_server_address(config: Mapping[str, Any]) -> tuple[str, int]:
    """The head server's (host, port): ``head_server.host`` / ``head_server.port`` in the config
    (command line or ``env.yaml``), else ``NEMO_GYM_HEAD_HOST`` / ``NEMO_GYM_HEAD_PORT``, else
    127.0.0.1:11000. One setting in ``env.yaml`` or the environment serves every command."""
    head = config.get("head_server") or {}
    if not isinstance(head, Mapping):
        raise ConfigError("head_server must be a mapping with host and port")
    host = str(head.get("host") or os.environ.get(ENV_HEAD_HOST) or DEFAULT_HEAD_HOST)
    if "port" in head:
        port, where = head["port"], "head_server.port"
    elif os.environ.get(ENV_HEAD_PORT, "").strip():
        raw, where = os.environ[ENV_HEAD_PORT].strip(), ENV_HEAD_PORT
        port = int(raw) if raw.isdigit() else raw
    else:
        port, where = DEFAULT_HEAD_PORT, "head_server.port"
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
        raise ConfigError(f"{where} must be an integer 0-65535, got {port!r}")
    return host, port


def head_url_from_config(config: Mapping[str, Any]) -> str:
    """The head server URL named by ``head_server`` in a config (default 127.0.0.1:11000)."""
    host, port = head_server_address(config)
    return f"http://{host}:{port}"
