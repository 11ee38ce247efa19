"""Starting a stack: the head server in this process, every configured server as a child process.

Process placement sits behind :class:`~nemo_gym.launch.server_processes.ProcessBackend`
(``LocalProcessBackend``, or the Ray backend); each server's command, environment and stdin
payload come from :func:`~nemo_gym.launch.server_processes.launch_spec`. :class:`Stack` starts the head server, launches
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
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from nemo_gym.launch.config import (
    ConfigError,
    ServerInstance,
    head_server_address,
    server_instances,
)
from nemo_gym.launch.head_server import HeadServer, Replica
from nemo_gym.launch.server_processes import (
    LocalProcessBackend,
    ProcessBackend,
    ServerProcess,
    apply_global_server_settings,
    launch_payload,
    launch_spec,
    num_workers,
    port_range,
    print_log_line,
)
from nemo_gym.serving.secrets import redact_other_servers, remember_secret_values, secret_values
from nemo_gym.serving.server import (
    ENV_HEAD_URL,
    auth_headers,
    auth_token,
    bind_socket,
    bind_socket_in_range,
    make_uvicorn_server,
)
from nemo_gym.serving.server_client import connection_error_text


class StackError(RuntimeError):
    """A stack failed to start or a server in it died; the message names the server."""


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
                        instance.name, instance.type, parsed.hostname, port, 0, time.time(), external_url=url
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
                    f"server {proc.name!r} ({proc.type}, pid {proc.pid}) exited with code {proc.returncode}"
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
                f"server {dead.name!r} ({dead.type}, pid {dead.pid}) died with exit code {dead.returncode}"
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


def wait_for_port(port: int, timeout_s: float = 20.0, host: str = "127.0.0.1") -> None:
    """Return once something accepts connections on ``host:port``; raise ``TimeoutError`` naming
    the address when nothing does within ``timeout_s`` (for scripts that start a server process
    on a :func:`free_port` and must not measure or drive it before it listens)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"nothing listening on {host}:{port} after {timeout_s:g} s: the server meant to "
                "bind it did not start (see its output above)"
            )
        time.sleep(0.05)
