"""NeMo Gym's ``DockerCreateConfig`` (the ``create:`` section of a docker provider config), mapped
onto the Engine API's container-create body.

NeMo Gym's provider shells out to ``docker run``; ours talks to the engine's API, so
``extra_run_args`` (``docker run`` flags) are translated: the flags below are understood, any
other flag is refused when the provider is built, naming it, rather than silently dropped.

| flag | create body |
|---|---|
| ``-v``/``--volume SRC:DST[:ro|rw]``, ``--mount type=bind,source=,target=[,readonly]`` | ``HostConfig.Binds`` |
| ``-e``/``--env K=V`` | ``Env`` |
| ``--network NAME`` | ``HostConfig.NetworkMode`` |
| ``--add-host NAME:IP`` | ``HostConfig.ExtraHosts`` |
| ``--tmpfs PATH[:OPTS]`` | ``HostConfig.Tmpfs`` |
| ``--shm-size BYTES`` (``k``/``m``/``g`` suffixes) | ``HostConfig.ShmSize`` |
| ``--cap-add``/``--cap-drop CAP``, ``--security-opt OPT`` | ``HostConfig.CapAdd``/``CapDrop``/``SecurityOpt`` |
| ``--read-only``, ``--init`` | ``HostConfig.ReadonlyRootfs``, ``HostConfig.Init`` |
| ``-u``/``--user``, ``-w``/``--workdir`` | ``User``, ``WorkingDir`` |

Both ``--flag value`` and ``--flag=value`` are accepted.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_KEEPALIVE_SHELL = "/bin/sh"
DEFAULT_KEEPALIVE_CMD = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"

# flag aliases -> canonical name; flags that take no value are listed in _SWITCHES.
_ALIASES = {
    "-v": "--volume",
    "-e": "--env",
    "-u": "--user",
    "-w": "--workdir",
    "--net": "--network",
}
_VALUED = {
    "--volume",
    "--mount",
    "--env",
    "--network",
    "--add-host",
    "--tmpfs",
    "--shm-size",
    "--cap-add",
    "--cap-drop",
    "--security-opt",
    "--user",
    "--workdir",
}
_SWITCHES = {"--read-only", "--init"}
_SIZE = re.compile(r"^(\d+)([bkmg]?)$", re.IGNORECASE)


@dataclass(frozen=True)
class DockerCreateConfig:
    """How containers are created (NeMo Gym's field names).

    ``network``: ``None`` keeps this provider's default (no network unless the provider's
    ``network: true`` or a spec's ``provider_options.network`` asks), ``"none"`` no network,
    any other value the named Docker network (``"bridge"``, ``"host"``, a user network).
    ``keepalive_shell``/``keepalive_cmd`` keep the container alive; ``use_init`` runs an init
    as PID 1; ``read_only`` makes the root file system read-only; ``cap_drop`` and
    ``security_opt`` add to the cautious defaults; ``pids_limit`` replaces the provider's;
    ``apply_resource_limits: false`` ignores the spec's CPU and memory; ``publish_host`` is the
    host address declared ports bind to; ``extra_run_args`` are ``docker run`` flags (see the
    module docstring); ``start_timeout_s`` bounds creating and starting one container.
    """

    keepalive_shell: str = DEFAULT_KEEPALIVE_SHELL
    keepalive_cmd: str = DEFAULT_KEEPALIVE_CMD
    start_timeout_s: float | None = 600
    use_init: bool = True
    network: str | None = None
    read_only: bool = False
    cap_drop: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    pids_limit: int | None = None
    extra_run_args: list[str] = field(default_factory=list)
    apply_resource_limits: bool = True
    publish_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.start_timeout_s is not None and self.start_timeout_s <= 0:
            raise ValueError(f"create.start_timeout_s must be > 0, got {self.start_timeout_s}")
        if self.pids_limit is not None and self.pids_limit <= 0:
            raise ValueError(f"create.pids_limit must be > 0, got {self.pids_limit}")
        try:
            ipaddress.ip_address(self.publish_host)
        except ValueError:
            raise ValueError(
                f"create.publish_host must be an IP address, got {self.publish_host!r}"
            ) from None
        # Parsed now so that a flag we cannot honour fails when the provider is built.
        run_args_to_create_body(list(self.extra_run_args))

    @classmethod
    def coerce(cls, value: DockerCreateConfig | Mapping[str, Any] | None) -> DockerCreateConfig:
        """A config from ``None`` (defaults), a mapping (a YAML ``create:`` block) or itself."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(
                    f"unknown docker create option(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}"
                )
            return cls(**value)
        raise TypeError(
            f"docker create config must be a mapping or DockerCreateConfig, not {type(value).__name__}"
        )


def _size_bytes(text: str) -> int:
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"--shm-size {text!r}: expected a number with an optional b/k/m/g suffix")
    scale = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[match.group(2).lower()]
    return int(match.group(1)) * scale


def _mount_bind(text: str) -> str:
    parts: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        parts[key.strip()] = value if eq else "true"
    if parts.get("type", "volume") != "bind":
        raise ValueError(f"--mount {text!r}: only type=bind mounts are supported")
    source = parts.get("source") or parts.get("src")
    target = parts.get("target") or parts.get("destination") or parts.get("dst")
    if not source or not target:
        raise ValueError(f"--mount {text!r}: needs source= and target=")
    readonly = parts.get("readonly", parts.get("ro", "false")).lower() in ("true", "1", "")
    return f"{source}:{target}{':ro' if readonly else ''}"


def _split_flags(args: list[str]) -> list[tuple[str, str | None]]:
    flags: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        raw = args[i]
        name, eq, inline = raw.partition("=") if raw.startswith("--") else (raw, "", "")
        name = _ALIASES.get(name, name)
        if name in _SWITCHES and not eq:
            flags.append((name, None))
        elif name in _VALUED:
            if eq:
                flags.append((name, inline))
            elif i + 1 < len(args):
                i += 1
                flags.append((name, args[i]))
            else:
                raise ValueError(f"docker run flag {raw!r} needs a value")
        else:
            raise ValueError(
                f"docker run flag {raw!r} in create.extra_run_args is not supported by this provider "
                f"(it uses the Engine API); supported: {sorted(_VALUED | _SWITCHES | set(_ALIASES))}"
            )
        i += 1
    return flags


def run_args_to_create_body(args: list[str]) -> dict[str, Any]:
    """The part of a container-create body that ``docker run`` flags ``args`` stand for:
    top-level keys (``Env``, ``User``, ``WorkingDir``) and a ``HostConfig`` mapping whose lists
    are to be appended to the provider's own. ``ValueError`` naming an unsupported flag."""
    body: dict[str, Any] = {}
    host: dict[str, Any] = {}
    for name, value in _split_flags(args):
        assert value is not None or name in _SWITCHES
        if name == "--volume":
            if value is None or value.count(":") < 1:
                raise ValueError(f"--volume {value!r}: expected SOURCE:TARGET[:ro|rw]")
            host.setdefault("Binds", []).append(value)
        elif name == "--mount":
            host.setdefault("Binds", []).append(_mount_bind(str(value)))
        elif name == "--env":
            body.setdefault("Env", []).append(value)
        elif name == "--network":
            host["NetworkMode"] = value
        elif name == "--add-host":
            host.setdefault("ExtraHosts", []).append(value)
        elif name == "--tmpfs":
            path, _, options = str(value).partition(":")
            host.setdefault("Tmpfs", {})[path] = options
        elif name == "--shm-size":
            host["ShmSize"] = _size_bytes(str(value))
        elif name == "--cap-add":
            host.setdefault("CapAdd", []).append(value)
        elif name == "--cap-drop":
            host.setdefault("CapDrop", []).append(value)
        elif name == "--security-opt":
            host.setdefault("SecurityOpt", []).append(value)
        elif name == "--read-only":
            host["ReadonlyRootfs"] = True
        elif name == "--init":
            host["Init"] = True
        elif name == "--user":
            body["User"] = value
        elif name == "--workdir":
            body["WorkingDir"] = value
    if host:
        body["HostConfig"] = host
    return body


def apply_create_config(body: dict[str, Any], config: DockerCreateConfig) -> dict[str, Any]:
    """``body`` (a provider's create body) with ``config``'s settings and run flags applied;
    lists (binds, capabilities, environment) are appended, single settings replaced."""
    host = body.setdefault("HostConfig", {})
    host["Init"] = config.use_init
    if config.read_only:
        host["ReadonlyRootfs"] = True
    if config.cap_drop:
        host["CapDrop"] = sorted({*host.get("CapDrop", []), *config.cap_drop})
    if config.security_opt:
        host["SecurityOpt"] = [*host.get("SecurityOpt", []), *config.security_opt]
    if config.pids_limit is not None:
        host["PidsLimit"] = config.pids_limit
    if not config.apply_resource_limits:
        host.pop("NanoCpus", None)
        host.pop("Memory", None)
    for bindings in host.get("PortBindings", {}).values():
        for binding in bindings:
            binding["HostIp"] = config.publish_host
    extra = run_args_to_create_body(list(config.extra_run_args))
    for key, value in extra.pop("HostConfig", {}).items():
        if isinstance(value, list):
            host[key] = [*host.get(key, []), *value]
        elif isinstance(value, dict):
            host[key] = {**host.get(key, {}), **value}
        else:
            host[key] = value
    if "Env" in extra:
        body["Env"] = [*body.get("Env", []), *extra.pop("Env")]
    body.update(extra)
    return body
