"""Starting a stack: the head server in this process, every configured server as a child process.

Process placement sits behind :class:`ProcessBackend` (``LocalProcessBackend`` here; a Ray
backend can implement the same two methods). ``LocalProcessBackend`` starts each server through
the launch hooks of :mod:`nemo_gym.launch.launch_hooks` (NeMo Gym's ``setup_env_command`` and
``run_command``), which a trainer may replace. :class:`Stack` starts the head server, launches
every server, waits until each has registered the port it bound and answers ``GET /``, and
watches the children: when one dies it says which, shows its last log lines and stops the rest.
An instance with ``external_url``, or one the launch hooks gave no process, is registered as an
external endpoint instead.

Config keys the launcher reads: ``default_host`` (the address servers bind and register when
they set no ``host``), ``port_range_low``/``port_range_high`` (the range servers and a port-0
head server pick their port from), ``head_server.host``/``head_server.port``.
"""

from __future__ import annotations

import asyncio
import collections
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from nemo_gym.launch.config import (
    ConfigError,
    ServerInstance,
    head_server_address,
    project_root,
    server_instances,
)
from nemo_gym.launch.head_server import HeadServer, Replica, allowed_hosts_setting
from nemo_gym.launch.launch_hooks import (
    DEFAULT_HOOKS,
    LaunchHooks,
    LaunchSettings,
    current_launch,
    server_command,
)
from nemo_gym.serving.launch_payload import LaunchPayload
from nemo_gym.serving.secrets import redact_other_servers, remember_secret_values, secret_values
from nemo_gym.serving.server import (
    ENV_AUTH_TOKEN,
    ENV_HEAD_URL,
    ENV_INSTANCE_NAME,
    ENV_LAUNCH_PAYLOAD,
    ENV_SERVER_CONFIG,
    auth_headers,
    auth_token,
    bind_socket,
    bind_socket_in_range,
    make_uvicorn_server,
)
from nemo_gym.serving.server_client import connection_error_text

LOG_TAIL_LINES = 40


class StackError(RuntimeError):
    """A stack failed to start or a server in it died; the message names the server."""


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
    kind: str
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
        proc = ServerProcess(name, spec.instance.kind, process.pid, process)
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
    relative = Path(instance.kind) / instance.impl / entrypoint
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
    path = found or project_root() / instance.kind / instance.impl / str(
        instance.fields.get("entrypoint", "app.py")
    )
    root = path.parent.parent.parent  # the folder holding <kind>/<impl>/app.py
    env = dict(os.environ)
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


class Stack:
    """A running stack: head server + one process per configured server.

    Use ``await stack.start()``, then ``await stack.wait()`` (returns when stopped, raises
    :class:`StackError` when a server dies), and ``await stack.stop()``.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        backend: ProcessBackend | None = None,
        log: Callable[[str, str], None] = print_log_line,
        cwd: Path | None = None,
        startup_timeout_s: float = 120.0,
    ) -> None:
        self.config = dict(config)
        self.instances = server_instances(self.config)
        self.port_range = port_range(self.config)
        apply_global_server_settings(self.config, self.instances.values())
        self.backend = backend or LocalProcessBackend()
        self.log = log
        self.cwd = cwd
        self.startup_timeout_s = startup_timeout_s
        # Per stack: only the servers this stack starts (handed it on stdin) may register.
        self.registration_secret = secrets.token_urlsafe(32)
        self.head = HeadServer(self.config, registration_secret=self.registration_secret)
        bind_registry = getattr(self.backend, "bind_registry", None)
        if bind_registry is not None:  # a backend that restarts replicas keeps the registry current
            bind_registry(self.head.registry)
        remember_secret_values({*secret_values(self.config), auth_token(), self.registration_secret})
        self.processes: dict[str, ServerProcess] = {}
        self.head_url = ""
        self.startup_seconds: float | None = None
        self.failure: StackError | None = None
        self._unlaunched: set[str] = set()
        self._head_server: Any = None
        self._head_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._redacted_blocks: dict[str, Any] = {}

    async def start(self) -> None:
        """Start everything and return once every server is registered and healthy."""
        started = time.monotonic()
        if not self.instances:
            raise ConfigError("no server instances in the config; pass +config_paths=[...]")
        external = {n: i for n, i in self.instances.items() if i.fields.get("external_url")}
        specs = [
            launch_spec(i, "http://placeholder", self.cwd, self.config, self.registration_secret)
            for n, i in self.instances.items()
            if n not in external
        ]
        await self._start_head()
        try:
            for instance in external.values():
                await self._register_external(instance, instance.fields["external_url"])
            for spec in specs:
                spec.env[ENV_HEAD_URL] = self.head_url
                spec.stdin_payload = launch_payload(
                    spec.instance, self.registration_secret, self.global_config_for(spec.instance.name)
                )
                workers = num_workers(spec.instance)
                for index in range(workers):
                    proc = await self.backend.start(spec, self.log)
                    if proc is None:
                        await self._register_unlaunched(spec.instance)
                        break
                    if workers > 1:
                        proc.name = f"{spec.instance.name}[{index}]"
                    self.processes[proc.name] = proc
            await self._wait_until_healthy(started)
        except BaseException:
            await self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def global_config_for(self, name: str) -> dict[str, Any]:
        """The run's global config as server ``name`` receives it: other servers' blocks redacted
        (docs/RELIABILITY.md), ``head_server`` where the head server listens."""
        config = redact_other_servers(self.config, name, self.instances, self._redacted_blocks)
        head = urlsplit(self.head_url)
        if head.hostname and head.port:
            config["head_server"] = {
                **(config.get("head_server") or {}),
                "host": head.hostname,
                "port": head.port,
            }
        return config

    async def _start_head(self) -> None:
        host, port = head_server_address(self.config)
        try:
            if port == 0 and self.port_range is not None:
                sock = bind_socket_in_range(host, *self.port_range)
            else:
                sock = bind_socket(host, port)
        except OSError as exc:
            raise StackError(
                f"head server cannot bind {host}:{port}: {exc.strerror or exc}. "
                "Is another ng_run using it? Set head_server.port=<free port> (0 picks one)."
            ) from exc
        bound_host, bound_port = sock.getsockname()[:2]
        if bound_host in ("0.0.0.0", "::"):
            # Bound on every interface: servers and clients reach it at the configured default_host.
            bound_host = str(self.config.get("default_host") or "127.0.0.1")
        bound_host = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.head_url = f"http://{bound_host}:{bound_port}"
        self._head_server = make_uvicorn_server(self.head.build_app(), embedded=True)
        self._head_task = asyncio.create_task(self._head_server.serve(sockets=[sock]))

    async def _register_unlaunched(self, instance: ServerInstance) -> None:
        """Register an instance the launch hooks gave no process at its configured host:port."""
        host, port = instance.fields.get("host"), instance.fields.get("port")
        if not host or not isinstance(port, int) or port <= 0:
            raise ConfigError(
                f"server {instance.name!r}: its launch started no process, so it must run elsewhere; "
                f"give it host and port (got host={host!r}, port={port!r})"
            )
        self._unlaunched.add(instance.name)
        host = f"[{host}]" if ":" in str(host) else str(host)
        await self._register_external(instance, f"http://{host}:{port}")

    async def _register_external(self, instance: ServerInstance, urls: str | list[str]) -> None:
        """Register an existing endpoint (a trainer's own server) under its instance name, no process.

        ``urls`` (``external_url``: one URL or a list of replicas) is the server root: agents post
        ``/v1/responses`` and ``/v1/chat/completions`` under it. Each URL must answer HTTP.
        The launcher registers it itself (callers never register with the head server for it).
        """
        urls = [urls] if isinstance(urls, str) else list(urls)
        async with aiohttp.ClientSession(headers=auth_headers()) as http:
            for raw_url in urls:
                url = str(raw_url).rstrip("/").removesuffix("/v1")
                parsed = urlsplit(url)
                if parsed.scheme not in ("http", "https") or not parsed.hostname:
                    raise ConfigError(
                        f"server {instance.name!r}: external_url {raw_url!r} is not an http(s) URL"
                    )
                try:
                    async with http.get(url + "/", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                        reachable = resp.status < 500
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise StackError(
                        f"server {instance.name!r}: external endpoint {url} is unreachable: {connection_error_text(exc)}"
                    ) from exc
                if not reachable:
                    raise StackError(
                        f"server {instance.name!r}: external endpoint {url} answered HTTP {resp.status}"
                    )
                port = parsed.port or (443 if parsed.scheme == "https" else 80)
                self.head.registry.register(
                    Replica(
                        instance.name, instance.kind, parsed.hostname, port, 0, time.time(), external_url=url
                    )
                )

    async def _wait_until_healthy(self, started: float) -> None:
        deadline = started + self.startup_timeout_s
        expected = {
            name: 1 if name in self._unlaunched else num_workers(instance)
            for name, instance in self.instances.items()
        }
        waiting = set(self.instances)
        while waiting:
            self._raise_if_died()
            waiting = {n for n in waiting if len(self.head.registry.replicas.get(n, [])) < expected[n]}
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise StackError(
                    f"servers did not register within {self.startup_timeout_s:g}s: {', '.join(sorted(waiting))}"
                    + self._tails(sorted(waiting))
                )
            await self.head.registry.wait_changed(0.05)
        async with aiohttp.ClientSession(headers=auth_headers()) as http:
            for replica in self.head.registry.all():
                while replica.external_url is None:
                    self._raise_if_died()
                    try:
                        async with http.get(
                            replica.url + "/", timeout=aiohttp.ClientTimeout(total=5)
                        ) as resp:
                            if resp.status == 200:
                                break
                    except (aiohttp.ClientError, TimeoutError):
                        pass
                    if time.monotonic() > deadline:
                        raise StackError(
                            f"server {replica.name!r} at {replica.url} never answered GET / with 200"
                        )
                    await asyncio.sleep(0.05)

    def _raise_if_died(self) -> None:
        for proc in self.processes.values():
            if proc.returncode is not None:
                raise StackError(
                    f"server {proc.name!r} ({proc.kind}, pid {proc.pid}) exited with code {proc.returncode}"
                    + self._tails([proc.name])
                )

    def _tails(self, names: list[str]) -> str:
        parts = []
        for name in names:
            proc = self.processes.get(name)
            if proc and proc.log_tail:
                lines = "\n".join(f"    {line}" for line in proc.log_tail)
                parts.append(f"\n  last log lines of {name!r}:\n{lines}")
        return "".join(parts)

    @property
    def server_count(self) -> int:
        """How many servers :meth:`table` lists: the head server and every registered replica."""
        return 1 + len(self.head.registry.all())

    def table(self) -> str:
        """A table of every running server: name, kind, URL, pid."""
        rows = [("NAME", "KIND", "URL", "PID"), ("head_server", "head", self.head_url, str(os.getpid()))]
        for replica in sorted(self.head.registry.all(), key=lambda r: r.name):
            rows.append((replica.name, replica.server_type, replica.url, str(replica.pid)))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        return "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
        )

    async def wait(self) -> None:
        """Block until :meth:`request_stop` or until a server dies (then raise :class:`StackError`)."""
        waiters = {asyncio.create_task(p.wait()): p for p in self.processes.values()}
        stop_task = asyncio.create_task(self._stopping.wait())
        try:
            done, _ = await asyncio.wait([stop_task, *waiters], return_when=asyncio.FIRST_COMPLETED)
            if stop_task in done:
                return
            dead = next(waiters[t] for t in done if t in waiters)
            if dead.reader is not None:
                try:
                    await asyncio.wait_for(dead.reader, 1.0)
                except TimeoutError:
                    pass
            self.head.registry.remove_pid(dead.pid)
            self.failure = StackError(
                f"server {dead.name!r} ({dead.kind}, pid {dead.pid}) died with exit code {dead.returncode}"
                + self._tails([dead.name])
            )
            raise self.failure
        finally:
            stop_task.cancel()
            for task in waiters:
                task.cancel()

    def check(self) -> None:
        """Raise :class:`StackError` naming the server if the head server or any server process died."""
        if self.failure is not None:
            raise self.failure
        if self._head_task is not None and self._head_task.done() and not self._stopping.is_set():
            raise StackError(f"the head server at {self.head_url} stopped unexpectedly")
        self._raise_if_died()

    def request_stop(self) -> None:
        """Ask :meth:`wait` to return (signal-handler safe when called from the loop)."""
        self._stopping.set()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop every server (SIGTERM, then SIGKILL after ``grace_s``) and the head server."""
        self._stopping.set()
        await asyncio.gather(
            *(self.backend.stop(p, grace_s) for p in self.processes.values()), return_exceptions=True
        )
        close = getattr(self.backend, "close", None)
        if close is not None:
            await close()
        if self._head_server is not None:
            self._head_server.should_exit = True
        if self._head_task is not None:
            try:
                await asyncio.wait_for(self._head_task, 5.0)
            except (TimeoutError, asyncio.CancelledError):
                self._head_task.cancel()


class StackHandle:
    """A stack running on a background event loop thread, for trainers and scripts.

    ``handle = StackHandle.start(config_dict)`` returns once every server is healthy;
    ``handle.head_url`` is what ``RolloutCollectionHelper`` needs; ``handle.stop()`` ends it.
    """

    def __init__(self, stack: Stack, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self.stack = stack
        self.loop = loop
        self.thread = thread

    @property
    def head_url(self) -> str:
        """The head server's base URL."""
        return self.stack.head_url

    @property
    def head_server_config(self) -> dict[str, Any]:
        """``{host, port}`` of the head server, as ``head_server_config`` arguments expect."""
        host, _, port = self.head_url.removeprefix("http://").rpartition(":")
        return {"host": host, "port": int(port)}

    @classmethod
    def start(cls, config: Mapping[str, Any], **stack_kwargs: Any) -> StackHandle:
        """Start a stack from a config dict on a new thread; raises if it cannot start."""
        loop = asyncio.new_event_loop()
        ready: dict[str, Any] = {}
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                stack = loop.run_until_complete(_make_and_start(config, stack_kwargs))
                ready["stack"] = stack
            except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
                ready["error"] = exc
                started.set()
                return
            started.set()
            loop.run_until_complete(_wait_quietly(stack))
            loop.run_until_complete(stack.stop())

        thread = threading.Thread(target=run, name="nemo_gym-stack", daemon=True)
        thread.start()
        started.wait()
        if "error" in ready:
            thread.join()
            raise ready["error"]
        return cls(ready["stack"], loop, thread)

    def poll(self) -> None:
        """Raise :class:`StackError` naming the server if the head server or any server has died."""
        self.stack.check()
        if not self.thread.is_alive():
            raise StackError(f"the stack with head server {self.head_url} is no longer running")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every server and the head server; returns when they are gone."""
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stack.request_stop)
        self.thread.join(timeout_s)


async def _make_and_start(config: Mapping[str, Any], stack_kwargs: dict[str, Any]) -> Stack:
    stack = Stack(config, **stack_kwargs)
    await stack.start()
    return stack


async def _wait_quietly(stack: Stack) -> None:
    try:
        await stack.wait()
    except StackError as exc:
        sys.stderr.write(f"nemo_gym stack: {exc}\n")


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free port (for tests that need a fixed one; servers themselves bind port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
