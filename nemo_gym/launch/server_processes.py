"""One server process: what starts it (its launch spec) and where it runs (the process backend).

:func:`launch_spec` turns a configured instance into the command, environment and stdin payload
that start it; :class:`ProcessBackend` places the process (:class:`LocalProcessBackend`: a child
of this one, through the launch hooks of :mod:`nemo_gym.launch.launch_hooks`; the Ray backend
implements the same two methods). :class:`~nemo_gym.launch.launcher.Stack` drives both.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nemo_gym.launch.config import (
    ConfigError,
    ServerInstance,
    project_root,
)
from nemo_gym.launch.head_server import allowed_hosts_setting
from nemo_gym.launch.launch_hooks import (
    DEFAULT_HOOKS,
    LaunchHooks,
    LaunchSettings,
    current_launch,
    server_command,
)
from nemo_gym.launch.offline_env import with_offline_switches
from nemo_gym.serving.launch_payload import LaunchPayload
from nemo_gym.serving.server import (
    ENV_AUTH_TOKEN,
    ENV_HEAD_URL,
    ENV_INSTANCE_NAME,
    ENV_LAUNCH_PAYLOAD,
    ENV_SERVER_CONFIG,
    auth_token,
)

LOG_TAIL_LINES = 40


@dataclass
class LaunchSpec:
    """What a backend needs to start one server process.

    ``command`` is the argv of the server itself; ``server_dir`` holds its ``app.py`` (which may
    not exist when a launch hook replaces the process); ``global_config`` is what NeMo Gym's
    ``setup_env_command`` hook receives; ``stdin_payload`` is what the process reads on stdin at
    start-up (its config, the auth token, the registration secret: never in its environment).
    """

    instance: ServerInstance
    command: list[str]
    env: dict[str, str]
    cwd: str
    server_dir: Path = Path()
    global_config: Mapping[str, Any] = field(default_factory=dict)
    # Config and secrets as JSON for the process's stdin (the env only says to read it). Every
    # backend must deliver it: LocalProcessBackend writes it to the child's stdin and closes it.
    stdin_payload: bytes | None = None


@dataclass
class ServerProcess:
    """A started server process: its pid, its recent log lines, and a way to wait for it.

    ``process`` is anything with ``poll() -> exit code or None`` (a ``subprocess.Popen``).
    """

    name: str
    type: str  # the server's type, as its ServerInstance's
    pid: int
    process: Any
    log_tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES))
    reader: asyncio.Task[None] | None = None

    async def wait(self) -> int:
        """Wait for the process to exit; its exit code."""
        # Polling keeps this cancellable and free of threads; a few servers at 10 Hz cost nothing.
        while (code := self.process.poll()) is None:
            await asyncio.sleep(0.1)
        return int(code)

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs."""
        return self.process.poll()


class ProcessBackend(Protocol):
    """Where server processes run. ``start`` launches one (None: it runs elsewhere); ``stop`` ends one."""

    async def start(self, spec: LaunchSpec, log: Callable[[str, str], None]) -> ServerProcess | None: ...

    async def stop(self, proc: ServerProcess, grace_s: float) -> None: ...


class LocalProcessBackend:
    """Servers as child processes of this one, in the same Python environment, started by launch hooks.

    ``hooks`` default to :data:`nemo_gym.launch.launch_hooks.DEFAULT_HOOKS`; ``nemo_gym.cli.RunHelper``
    passes hooks that call whatever ``nemo_gym.cli.setup_env_command`` / ``run_command`` are at
    launch time, so a trainer can replace them.
    """

    def __init__(self, hooks: LaunchHooks = DEFAULT_HOOKS) -> None:
        self.hooks = hooks

    async def start(self, spec: LaunchSpec, log: Callable[[str, str], None]) -> ServerProcess | None:
        """Start one server; its output lines go to ``log(name, line)``.

        Returns None when the ``run_command`` hook started no process of ours (it returned no
        ``subprocess.Popen``): the instance then runs elsewhere, at its configured host:port.
        """
        name = spec.instance.name
        setup = self.hooks.setup_env_command(spec.server_dir, spec.global_config, name)
        python, entrypoint = spec.command[0], Path(spec.command[-1])
        command = server_command(setup, name, python, entrypoint)
        token = current_launch.set(LaunchSettings(spec.env, spec.cwd, spec.stdin_payload))
        try:
            process = self.hooks.run_command(command, spec.server_dir)
        finally:
            current_launch.reset(token)
        if not isinstance(process, subprocess.Popen):
            return None
        proc = ServerProcess(name, spec.instance.type, process.pid, process)
        proc.reader = asyncio.create_task(_pump_lines(proc, log))
        if not entrypoint.is_file():
            await self.stop(proc, 1.0)
            raise ConfigError(f"server {name!r}: entrypoint {str(entrypoint)!r} not found")
        return proc

    async def stop(self, proc: ServerProcess, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; the whole process group."""
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        if proc.reader is not None:
            try:
                await asyncio.wait_for(proc.reader, 1.0)
            except TimeoutError:
                proc.reader.cancel()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


async def _pump_lines(proc: ServerProcess, log: Callable[[str, str], None]) -> None:
    pipe = proc.process.stdout
    if pipe is None:
        return
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader(limit=1 << 20, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), pipe)
    try:
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # one line over the limit: drop it, keep reading
                continue
            if not line:
                return
            text = line.decode(errors="replace").rstrip("\n")
            proc.log_tail.append(text)
            log(proc.name, text)
    finally:
        transport.close()


def locate_entrypoint(instance: ServerInstance, cwd: Path | None = None) -> Path | None:
    """The server's ``app.py``: ``<kind>/<impl>/<entrypoint>`` under the working directory or the project."""
    entrypoint = str(instance.fields.get("entrypoint", "app.py"))
    relative = Path(instance.type) / instance.impl / entrypoint
    for root in (cwd or Path.cwd(), project_root()):
        candidate = root / relative
        if candidate.is_file():
            return candidate.resolve()
    return None


def launch_spec(
    instance: ServerInstance,
    head_url: str,
    cwd: Path | None = None,
    global_config: Mapping[str, Any] | None = None,
    registration_secret: str | None = None,
) -> LaunchSpec:
    """The command and environment that start one configured server.

    A missing entrypoint is not an error yet: a replaced launch hook may start no process for
    it (the backend reports a missing file when it does start one).
    """
    found = locate_entrypoint(instance, cwd)
    path = found or project_root() / instance.type / instance.impl / str(
        instance.fields.get("entrypoint", "app.py")
    )
    root = path.parent.parent.parent  # the folder holding <kind>/<impl>/app.py
    # What the server imports uses what is installed, never a fetch of its own (offline_env.py).
    env = with_offline_switches(os.environ)
    # Secrets go on stdin, never in the environment (readable in /proc/<pid>/environ and
    # inherited by every process the server starts).
    env.pop(ENV_AUTH_TOKEN, None)
    env.pop(ENV_SERVER_CONFIG, None)
    env[ENV_LAUNCH_PAYLOAD] = "stdin"
    env[ENV_INSTANCE_NAME] = instance.name
    env[ENV_HEAD_URL] = head_url
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(root), str(project_root()), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    workdir = cwd or Path.cwd()
    if (path.parent / ".nemo_gym_source.json").is_file():
        # A folder pulled from NeMo Gym runs as NeMo Gym runs it: from inside the folder (its code
        # opens folder-relative paths such as prompt_templates/x.txt); the project root stays
        # where paths named from the root resolve (NEMO_GYM_EXTRA_ROOTS).
        roots = env.get("NEMO_GYM_EXTRA_ROOTS", "")
        env["NEMO_GYM_EXTRA_ROOTS"] = os.pathsep.join(p for p in (str(workdir), str(root), roots) if p)
        workdir = path.parent
    return LaunchSpec(
        instance,
        [sys.executable, str(path)],
        env,
        str(workdir),
        server_dir=path.parent,
        global_config=dict(global_config or {}),
        stdin_payload=launch_payload(instance, registration_secret),
    )


def launch_payload(
    instance: ServerInstance,
    registration_secret: str | None = None,
    global_config: Mapping[str, Any] | None = None,
) -> bytes:
    """What a launched server reads on stdin: its config, the auth token, the registration secret
    and the run's global config (other servers' secrets already redacted: :meth:`Stack.global_config_for`)."""
    return LaunchPayload(
        server_config={**instance.fields, "name": instance.name},
        auth_token=auth_token(),
        registration_secret=registration_secret,
        global_config=dict(global_config) if global_config is not None else None,
    ).to_json()


def num_workers(instance: ServerInstance) -> int:
    """How many processes serve an instance (``num_workers``, default 1; external endpoints: their URLs).

    Replicas register under one name; the client keeps each rollout on one replica, so
    per-rollout session state stays correct with several workers.
    """
    external = instance.fields.get("external_url")
    if external:
        return 1 if isinstance(external, str) else len(external)
    workers = instance.fields.get("num_workers", 1)
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(
            f"server {instance.name!r}: num_workers must be a positive integer, got {workers!r}"
        )
    return workers


def port_range(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(port_range_low, port_range_high)`` from the config, or None when neither is set."""
    low, high = config.get("port_range_low"), config.get("port_range_high")
    if low is None and high is None:
        return None
    if not isinstance(low, int) or not isinstance(high, int) or not 0 < low <= high < 65536:
        raise ConfigError(
            f"port_range_low/port_range_high must both be ports 1-65535 with low <= high, got {low!r}/{high!r}"
        )
    return low, high


def apply_global_server_settings(config: Mapping[str, Any], instances: Iterable[ServerInstance]) -> None:
    """Give every server the global ``default_host``, port range and ``allowed_hosts`` unless it sets its own."""
    default_host = config.get("default_host")
    bounds = port_range(config)
    extra_hosts = allowed_hosts_setting(config)
    for instance in instances:
        if extra_hosts and "allowed_hosts" not in instance.fields:
            instance.fields["allowed_hosts"] = list(extra_hosts)
        if default_host and "host" not in instance.fields:
            instance.fields["host"] = str(default_host)
        if bounds is not None and "port_range_low" not in instance.fields:
            instance.fields["port_range_low"], instance.fields["port_range_high"] = bounds


def print_log_line(name: str, line: str) -> None:
    """Default log sink: each server line prefixed with its instance name."""
    sys.stdout.write(f"({name}) {line}\n")
    sys.stdout.flush()
