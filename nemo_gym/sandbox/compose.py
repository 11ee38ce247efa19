"""Compose services as sandboxes (NeMo Gym's ``nemo_gym.sandbox.AsyncSandboxCompose``).

A Compose YAML file, already resolved (prebuilt images, mapping-shaped fields), becomes one
sandbox per service on one provider: each sandbox is started with a keep-alive entrypoint, then
the service's ``entrypoint + command`` runs inside it as a long ``exec`` (its output in
``/tmp/<project>/<service>/log``, its exit status in ``.../exit``), in dependency order.
``depends_on`` conditions (``service_started``, ``service_healthy``,
``service_completed_successfully``) and ``healthcheck`` (``CMD``/``CMD-SHELL``/``NONE``,
``interval``, ``timeout``, ``retries``, ``start_period``, ``start_interval``) are honoured.

Services find each other by name and ``networks.default.aliases``: the provider reports each
sandbox's address and writes the host table into every sandbox (``x-sandbox: {hosts: []}`` opts a
service out; ``x-sandbox.resolve_environment`` lists environment variables holding URLs whose
host is a service, rewritten to its address). That needs a provider with
``SupportsSandboxNetwork`` when there is more than one service; a single service runs on any
provider. What cannot be honoured is refused before anything starts, naming the field: restart
policies, custom networks, ``network_mode``, published host ports, volumes (no provider here
shares storage between sandboxes), and ``cap_add``/``shm_size`` on providers without
``SupportsSandboxRuntimeRequirements``.

Everything starts within ``timeout_s``; any failure stops what was started and re-raises.
``stop()`` cancels the service commands, stops the sandboxes (dependents first) and closes the
provider when the collection created it from a config mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from nemo_gym.sandbox.api import AsyncSandbox
from nemo_gym.sandbox.providers import SandboxProvider, SandboxSpec, create_provider
from nemo_gym.sandbox.providers.base import SupportsSandboxNetwork, SupportsSandboxRuntimeRequirements

_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_TOP_LEVEL = {"name", "services", "networks", "volumes"}
_SERVICE_FIELDS = {
    "image", "entrypoint", "command", "environment", "working_dir", "user", "depends_on", "healthcheck",
    "expose", "ports", "networks", "volumes", "cpus", "mem_limit", "labels", "restart", "network_mode",
    "cap_add", "shm_size", "x-sandbox",
}  # fmt: skip
_HEALTH_FIELDS = {"test", "disable", "interval", "timeout", "retries", "start_period", "start_interval"}
_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
KEEPALIVE = ["/bin/sh", "-c", "while :; do sleep 3600; done"]


def compose_duration_s(value: str | int | float) -> float:
    """A Compose duration (``1m30s``, ``500ms``, or a number of seconds) in seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Compose duration: {value!r} (e.g. '30s', '1m30s', '500ms')")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


@dataclass
class _Plan:
    """How one service is run."""

    name: str
    spec: SandboxSpec
    command: str
    user: str | int | None
    health: dict[str, Any]
    depends_on: dict[str, str]
    aliases: list[str]
    hosts: bool
    resolve_environment: list[str]
    runtime: str
    runtime_requirements: dict[str, Any] = field(default_factory=dict)
    resolved_env: dict[str, str] = field(default_factory=dict)
    started_at: float = 0.0


class AsyncSandboxCompose:
    """Start the services of a Compose file as sandboxes and own their lifecycle (see the module
    docstring). ``services`` maps each service name to its :class:`AsyncSandbox`; ``project``
    names this collection (also a metadata label of every sandbox). ``service_specs`` gives a
    service's base :class:`SandboxSpec` (deployment settings); Compose fields override it."""

    def __init__(
        self,
        provider: Mapping[str, Any] | SandboxProvider,
        compose_file: str | Path | None,
        *,
        service_specs: Mapping[str, SandboxSpec] | None = None,
        timeout_s: float = 1200,
        poll_interval_s: float = 0.5,
        volume_init_image: str = "alpine:3.22",
        volume_sources: Mapping[str, str] | None = None,
    ) -> None:
        if timeout_s <= 0 or poll_interval_s <= 0:
            raise ValueError("AsyncSandboxCompose timeout_s and poll_interval_s must be > 0")
        self._owns_provider = isinstance(provider, Mapping)
        self.provider: SandboxProvider = (
            create_provider(provider) if isinstance(provider, Mapping) else provider
        )
        self.compose_file = Path(compose_file).resolve() if compose_file is not None else None
        self.service_specs = dict(service_specs or {})
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        # Accepted for NeMo Gym's signature; volumes are refused (no shared storage here).
        self.volume_init_image = volume_init_image
        self.volume_sources = dict(volume_sources or {})
        self.project = f"compose-{uuid.uuid4().hex[:12]}"
        self.document: dict[str, Any] = {}
        self.services: dict[str, AsyncSandbox] = {}
        self._plans: dict[str, _Plan] = {}
        self._commands: dict[str, asyncio.Task[Any]] = {}
        self._started = self._ready = self._closed = False
        self._stop_task: asyncio.Task[None] | None = None

    # ---- reading the file --------------------------------------------------------------------
    def _validated_order(self) -> list[str]:
        doc = self.document
        if not isinstance(doc, Mapping):
            raise ValueError(f"{self.compose_file}: a Compose file must be a mapping")
        if unknown := sorted(set(doc) - _TOP_LEVEL):
            raise NotImplementedError(f"{self.compose_file}: unsupported top-level Compose fields {unknown}")
        services = doc.get("services")
        if not isinstance(services, Mapping) or not services:
            raise ValueError(f"{self.compose_file}: 'services' must be a non-empty mapping")
        networks = doc.get("networks") or {}
        if not isinstance(networks, Mapping) or set(networks) - {"default"}:
            raise NotImplementedError("only the default Compose network is supported (no custom networks)")
        if set(networks.get("default") or {}) - {"name"}:
            raise NotImplementedError("the default network takes only a 'name' here (no ipam, driver, ...)")
        graph: dict[str, set[str]] = {}
        for name, service in services.items():
            graph[name] = set(self._validate_service(str(name), service, services))
        try:
            order = list(TopologicalSorter(graph).static_order())
        except CycleError as exc:
            raise ValueError(f"Compose depends_on has a cycle: {exc.args[1]}") from None
        if len(services) > 1:
            if not isinstance(self.provider, SupportsSandboxNetwork):
                raise NotImplementedError(
                    f"sandbox provider {getattr(self.provider, 'name', type(self.provider).__name__)!r} cannot "
                    "connect sandboxes to each other, which a Compose file with several services needs"
                )
            self.provider.validate_networking()
        return order

    def _validate_service(self, name: str, service: Any, services: Mapping[str, Any]) -> list[str]:
        where = f"Compose service {name!r}"
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid Compose service name {name!r}")
        if not isinstance(service, Mapping):
            raise ValueError(f"{where} must be a mapping")
        if unknown := sorted(set(service) - _SERVICE_FIELDS):
            raise NotImplementedError(f"{where}: unsupported fields {unknown}")
        if not service.get("image"):
            raise ValueError(f"{where} needs a prebuilt 'image' (building is not supported)")
        for key in ("environment", "depends_on", "healthcheck", "labels", "networks", "x-sandbox"):
            if not isinstance(service.get(key) or {}, Mapping):
                raise ValueError(f"{where}: resolve '{key}' to a mapping before starting")
        if service.get("restart", "no") not in ("no", None):
            raise NotImplementedError(f"{where}: restart policies are not supported")
        if service.get("network_mode"):
            raise NotImplementedError(f"{where}: network_mode is not supported")
        if service.get("volumes"):
            raise NotImplementedError(
                f"{where}: volumes need storage shared between sandboxes, which no provider here offers"
            )
        for port in service.get("ports") or []:
            if not isinstance(port, Mapping) or "target" not in port:
                raise ValueError(f"{where}: resolve 'ports' to mappings with a 'target' before starting")
            if port.get("published") not in (None, 0, "0") or port.get("host_ip"):
                raise NotImplementedError(
                    f"{where}: fixed published ports cannot be honoured; use the sandbox endpoint"
                )
        if (service.get("cap_add") or service.get("shm_size") is not None) and not isinstance(
            self.provider, SupportsSandboxRuntimeRequirements
        ):
            raise NotImplementedError(
                f"{where}: cap_add/shm_size need a provider with runtime requirements support"
            )
        nets = service.get("networks") or {}
        if set(nets) - {"default"} or set(nets.get("default") or {}) - {"aliases"}:
            raise NotImplementedError(f"{where}: only networks.default.aliases is supported")
        options = service.get("x-sandbox") or {}
        if set(options) - {"hosts", "resolve_environment"} or options.get("hosts", []) != []:
            raise ValueError(
                f"{where}: x-sandbox takes hosts: [] (no host table) and resolve_environment: [names]"
            )
        health = service.get("healthcheck") or {}
        if unknown := sorted(set(health) - _HEALTH_FIELDS):
            raise NotImplementedError(f"{where}: unsupported healthcheck fields {unknown}")
        retries = health.get("retries", 3)
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 1:
            raise ValueError(f"{where}: healthcheck.retries must be a positive integer")
        for key in ("interval", "timeout", "start_period", "start_interval"):
            if key in health:
                compose_duration_s(health[key])
        dependencies = dict(service.get("depends_on") or {})
        for dependency, config in dependencies.items():
            if dependency not in services:
                raise ValueError(f"{where} depends on unknown service {dependency!r}")
            condition = (config or {}).get("condition", "service_started")
            if condition not in _CONDITIONS:
                raise ValueError(
                    f"{where}: depends_on condition {condition!r} is not one of {sorted(_CONDITIONS)}"
                )
        return list(dependencies)

    def _plan(self, name: str, service: Mapping[str, Any]) -> _Plan:
        where = f"Compose service {name!r}"
        argv = _argv(service.get("entrypoint")) + _argv(service.get("command"))
        if not argv:
            raise ValueError(
                f"{where} has neither entrypoint nor command; resolve the image's defaults first"
            )
        test = (service.get("healthcheck") or {}).get("test") or ["NONE"]
        if (service.get("healthcheck") or {}).get("disable"):
            test = ["NONE"]
        if isinstance(test, str):
            test = ["CMD-SHELL", test]
        if test[0] not in ("CMD", "CMD-SHELL", "NONE") or (test[0] != "NONE" and len(test) < 2):
            raise ValueError(f"{where}: healthcheck.test must be [CMD, ...], [CMD-SHELL, cmd] or [NONE]")
        env = {k: str(v) for k, v in (service.get("environment") or {}).items() if v is not None}
        options = service.get("x-sandbox") or {}
        for key in options.get("resolve_environment", []):
            url = urlsplit(env.get(key, ""))
            if not url.scheme or url.hostname not in self.document["services"]:
                raise ValueError(
                    f"{where}: environment {key!r} must be a URL whose host is a Compose service"
                )
        base = self.service_specs.get(name) or SandboxSpec(ttl_s=self.timeout_s + 3600)
        resources = dict(vars(base.resources))
        if "cpus" in service:
            resources["cpu"] = float(service["cpus"])
        if "mem_limit" in service:
            resources["memory_mib"] = -(-int(service["mem_limit"]) // (1 << 20))
        ports = [int(str(p).split("/")[0]) for p in service.get("expose") or []]
        ports += [int(p["target"]) for p in service.get("ports") or []]
        user = service.get("user") or None
        if isinstance(user, str) and user.isdecimal():
            user = int(user)
        spec = replace(
            base,
            image=service["image"],
            env={**base.env, **env},
            workdir=service.get("working_dir", base.workdir),
            resources=resources,
            ports=tuple(dict.fromkeys(ports)),
            entrypoint=list(KEEPALIVE),
            metadata={**base.metadata, **{str(k): str(v) for k, v in (service.get("labels") or {}).items()},
                      "nemo_gym.compose.project": self.project, "nemo_gym.compose.service": name},
        )  # fmt: skip
        requirements = {}
        if service.get("cap_add") or service.get("shm_size") is not None:
            requirements = {
                "cap_add": tuple(service.get("cap_add") or ()),
                "shm_size": service.get("shm_size"),
            }
        return _Plan(
            name=name,
            spec=spec,
            command=shlex.join(argv),
            user=user,
            health={**(service.get("healthcheck") or {}), "test": test},
            depends_on={
                d: (c or {}).get("condition", "service_started")
                for d, c in (service.get("depends_on") or {}).items()
            },
            aliases=list(((service.get("networks") or {}).get("default") or {}).get("aliases") or []),
            hosts=options.get("hosts") != [],
            resolve_environment=list(options.get("resolve_environment", [])),
            runtime=f"/tmp/{self.project}/{name}",
            runtime_requirements=requirements,
        )

    # ---- starting ----------------------------------------------------------------------------
    async def start(self) -> AsyncSandboxCompose:
        """Start every service (see the module docstring); returns ``self``."""
        if self._started or self._closed:
            raise RuntimeError("this Compose collection was already started or stopped")
        if self.compose_file is None:
            raise ValueError("starting a Compose collection needs a Compose file")
        self._started = True
        try:
            async with asyncio.timeout(self.timeout_s):
                self.document = yaml.safe_load(self.compose_file.read_text(encoding="utf-8"))
                order = self._validated_order()
                self._plans = {name: self._plan(name, self.document["services"][name]) for name in order}
                for name in order:
                    await self._start_sandbox(self._plans[name])
                await self._connect_services()
                for name in order:
                    plan = self._plans[name]
                    for dependency, condition in plan.depends_on.items():
                        await self._wait(dependency, condition)
                    await self._launch(plan)
                for name in order:
                    if self._plans[name].health["test"][0] != "NONE":
                        await self._wait(name, "service_healthy")
        except BaseException:
            await self.stop()
            raise
        self._ready = True
        return self

    async def _start_sandbox(self, plan: _Plan) -> None:
        if plan.runtime_requirements and isinstance(self.provider, SupportsSandboxRuntimeRequirements):
            labels = self.provider.validate_runtime_requirements(**plan.runtime_requirements) or {}
            plan.spec = replace(plan.spec, metadata={**plan.spec.metadata, **labels})
        sandbox = AsyncSandbox(self.provider, plan.spec, owns_provider=False)
        self.services[plan.name] = sandbox
        await sandbox.start()
        if plan.runtime_requirements and isinstance(self.provider, SupportsSandboxRuntimeRequirements):
            await self.provider.configure_runtime(sandbox._require_handle(), **plan.runtime_requirements)

    async def _connect_services(self) -> None:
        if len(self.services) < 2 or not isinstance(self.provider, SupportsSandboxNetwork):
            return
        hosts: dict[str, str] = {}
        for name, sandbox in self.services.items():
            address = await self.provider.network_address(sandbox._require_handle())
            for alias in (name, *self._plans[name].aliases):
                hosts[alias] = address
        for name, sandbox in self.services.items():
            plan = self._plans[name]
            for key in plan.resolve_environment:
                url = urlsplit(plan.spec.env[key])
                address = hosts[str(url.hostname)]
                netloc = f"[{address}]" if ":" in address else address
                if url.port is not None:
                    netloc += f":{url.port}"
                if "@" in url.netloc:
                    netloc = url.netloc.rsplit("@", 1)[0] + "@" + netloc
                plan.resolved_env[key] = url._replace(netloc=netloc).geturl()
            if plan.hosts:
                await self.provider.set_hosts(sandbox._require_handle(), hosts)

    async def _launch(self, plan: _Plan) -> None:
        sandbox = self.services[plan.name]
        made = await sandbox.exec(f"mkdir -p {plan.runtime} && chmod 777 {plan.runtime}", timeout_s=60)
        if made.return_code != 0:
            raise RuntimeError(
                f"Compose service {plan.name!r}: cannot prepare {plan.runtime}: {made.stderr or made.stdout}"
            )
        script = f"touch {plan.runtime}/started\n{plan.command}\nprintf '%s' \"$?\" > {plan.runtime}/exit\n"
        with tempfile.TemporaryDirectory(prefix="nemo_gym_compose_") as tmp:
            (Path(tmp) / "run.sh").write_text(script)
            await sandbox.upload(Path(tmp) / "run.sh", f"{plan.runtime}/run.sh")
        # The command runs as an exec that stays open: some providers end what an exec leaves behind.
        self._commands[plan.name] = asyncio.create_task(
            sandbox.exec(
                f"sh {plan.runtime}/run.sh >{plan.runtime}/log 2>&1 </dev/null",
                user=plan.user,
                env=plan.resolved_env or None,
                timeout_s=None,
            )
        )
        while (await sandbox.exec(f"test -f {plan.runtime}/started", timeout_s=60)).return_code != 0:
            command = self._commands[plan.name]
            if command.done():
                result = command.result()
                raise RuntimeError(
                    f"Compose service {plan.name!r} did not start: {result.stderr or result.stdout}"
                )
            await asyncio.sleep(self.poll_interval_s)
        plan.started_at = asyncio.get_running_loop().time()

    async def _exit_status(self, name: str) -> str | None:
        plan, sandbox = self._plans[name], self.services[name]
        done = await sandbox.exec(f"cat {plan.runtime}/exit 2>/dev/null || true", timeout_s=60)
        status = (done.stdout or "").strip()
        return status or None

    async def _log_tail(self, name: str) -> str:
        log = await self.services[name].exec(f"tail -c 4096 {self._plans[name].runtime}/log", timeout_s=60)
        return (log.stdout or "").strip()

    async def _wait(self, name: str, condition: str) -> None:
        """Until service ``name`` meets ``condition``; ``RuntimeError`` when it exits (unless
        completing successfully was the condition) or its healthcheck fails ``retries`` times."""
        if condition == "service_started":
            return
        plan = self._plans[name]
        health = plan.health
        failures = 0
        while True:
            status = await self._exit_status(name)
            if status is not None:
                if condition == "service_completed_successfully" and status == "0":
                    return
                raise RuntimeError(
                    f"Compose service {name!r} exited with status {status}: {await self._log_tail(name)}"
                )
            if condition == "service_completed_successfully":
                await asyncio.sleep(self.poll_interval_s)
                continue
            test = health["test"]
            if test[0] == "NONE":
                raise RuntimeError(f"Compose service {name!r} is awaited as healthy but has no healthcheck")
            command = shlex.join(test[1:]) if test[0] == "CMD" else shlex.join(["/bin/sh", "-c", test[1]])
            result = await self.services[name].exec(
                command,
                timeout_s=compose_duration_s(health.get("timeout", "30s")),
                user=plan.user,
                env=plan.resolved_env or None,
            )
            if result.return_code == 0 and result.error_type is None:
                return
            elapsed = asyncio.get_running_loop().time() - plan.started_at
            starting = elapsed < compose_duration_s(health.get("start_period", 0))
            if not starting:
                failures += 1
                if failures >= health.get("retries", 3):
                    detail = (result.stderr or result.stdout or result.error_type or "").strip()
                    raise RuntimeError(
                        f"Compose service {name!r} is unhealthy after {failures} checks: {detail}"
                    )
            interval = health.get("start_interval", "5s") if starting else health.get("interval", "30s")
            await asyncio.sleep(compose_duration_s(interval))

    # ---- reconnecting and stopping -----------------------------------------------------------
    async def serialize(self, *, scope: str | None = None) -> dict[str, Any]:
        """``{"services": {name: descriptor}}`` for :meth:`connect` (providers that can reconnect).
        The creating process keeps the service commands and must still call :meth:`stop`."""
        if not self._ready or self._closed:
            raise RuntimeError("only a running Compose collection can be serialized")
        return {"services": {name: await box.serialize(scope=scope) for name, box in self.services.items()}}

    @classmethod
    async def connect(
        cls, descriptor: Mapping[str, Any], *, provider: SandboxProvider
    ) -> AsyncSandboxCompose:
        """Attach to a running collection from :meth:`serialize`'s descriptor, starting nothing."""
        members = descriptor.get("services") if isinstance(descriptor, Mapping) else None
        if set(descriptor or {}) != {"services"} or not isinstance(members, Mapping) or not members:
            raise ValueError("a Compose descriptor is {'services': {name: sandbox descriptor, ...}}")
        collection = cls(provider, None)
        for name, member in members.items():
            collection.services[str(name)] = await AsyncSandbox.connect(
                member, provider=provider, owns_provider=False
            )
        collection._started = collection._ready = True
        return collection

    async def stop(self) -> None:
        """Stop everything (idempotent, safe to call concurrently); errors are raised together."""
        if self._closed:
            return
        if self._stop_task is None or self._stop_task.done():
            self._stop_task = asyncio.create_task(self._stop())
        await asyncio.shield(self._stop_task)

    async def _stop(self) -> None:
        for task in self._commands.values():
            task.cancel()
        await asyncio.gather(*self._commands.values(), return_exceptions=True)
        errors: list[Exception] = []
        for sandbox in reversed(list(self.services.values())):
            try:
                await sandbox.stop()
            except Exception as exc:
                errors.append(exc)
        if self._owns_provider:
            with contextlib.suppress(Exception):
                await self.provider.aclose()
        if errors:
            raise ExceptionGroup(f"stopping Compose project {self.project} failed", errors)
        self._closed = True

    async def __aenter__(self) -> AsyncSandboxCompose:
        return self if self._ready and not self._closed else await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
