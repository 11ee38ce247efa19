"""Server processes placed on a Ray cluster: one small actor per server process starts, watches and stops it.

Chosen by :func:`default_backend` when the config asks for it: ``server_backend: ray``, or
``ray_head_node_address`` (an address, or ``auto`` for the cluster this process is in) together
with a ``ray_placement`` block on at least one server. NeMo RL and verl set
``ray_head_node_address`` for their own cluster only; without placement their servers stay local
child processes, as under NeMo Gym. Ray is imported only on this path.

Per server, in its config block (defaults shown)::

    ray_placement: {num_cpus: 0.5, memory_mb: null, resources: {}, strategy: SPREAD, max_restarts: 3}
    num_workers: 1

Each replica gets its own actor, scheduled by Ray's resources (``num_cpus``, ``memory_mb``,
custom ``resources``) and strategy: ``SPREAD`` (Ray's spread scheduling) or ``PACK`` (a placement
group holding all replicas of the server, packed). The actor starts the server with the
launch payload on stdin, sets the node's address as the server's host when the config gives
none, and the server registers its node (``node_id``, ``node_ip``) with the head server.

A replica whose process or node is lost leaves the registry within about 3 s (the backend
probes it every ``PROBE_INTERVAL_S``); rollouts in flight on it fail ``unreachable``
and a resume retries them; the backend starts it again wherever Ray can place it, up to
``max_restarts`` times, before the stack reports it dead. Stopping the stack stops every actor
and process it started, on every node; actors are owned by the launching process, so Ray
removes them if it dies.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from nemo_gym.launch.config import RAY_HEAD_NODE_ADDRESS_KEY_NAME, ConfigError, server_instances
from nemo_gym.launch.head_server import Registry
from nemo_gym.launch.launch_hooks import DEFAULT_HOOKS, LaunchHooks, die_with_parent
from nemo_gym.launch.server_processes import LaunchSpec, LocalProcessBackend, ProcessBackend, ServerProcess
from nemo_gym.serving.launch_payload import LaunchPayload
from nemo_gym.serving.protocol import ENV_NODE_ID, ENV_NODE_IP

BACKEND_KEY = "server_backend"
PLACEMENT_KEY = "ray_placement"
PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 1.0
# Consecutive unanswered probes that make a replica lost (a certain sign counts as both).
LOST_AFTER_PROBES = 2
PLACE_TIMEOUT_S = 120.0
RESTART_TIMEOUT_S = 20.0
STRATEGIES = ("SPREAD", "PACK")


def wants_ray(config: Mapping[str, Any]) -> bool:
    """Whether servers go on a Ray cluster (see the module docstring)."""
    choice = config.get(BACKEND_KEY)
    if choice is not None:
        if choice not in ("local", "ray"):
            raise ConfigError(f"{BACKEND_KEY} must be 'local' or 'ray', got {choice!r}")
        return choice == "ray"
    if not config.get(RAY_HEAD_NODE_ADDRESS_KEY_NAME):
        return False
    return any(PLACEMENT_KEY in instance.fields for instance in server_instances(config).values())


def default_backend(config: Mapping[str, Any], hooks: LaunchHooks = DEFAULT_HOOKS) -> ProcessBackend:
    """The Ray backend when the config asks for it, else local child processes started by ``hooks``."""
    if wants_ray(config):
        return RayBackend(str(config.get(RAY_HEAD_NODE_ADDRESS_KEY_NAME) or "auto"))
    return LocalProcessBackend(hooks)


@dataclass(frozen=True)
class Placement:
    """Where and how the replicas of one server are placed (its ``ray_placement`` block)."""

    num_cpus: float = 0.5
    memory_mb: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    strategy: str = "SPREAD"
    max_restarts: int = 3

    @classmethod
    def of(cls, name: str, fields: Mapping[str, Any]) -> Placement:
        """The placement of server ``name``; a bad value is a :class:`ConfigError` naming the field."""
        block = fields.get(PLACEMENT_KEY) or {}
        where = f"server {name!r}: {PLACEMENT_KEY}"
        if not isinstance(block, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {block!r}")
        unknown = set(block) - {"num_cpus", "memory_mb", "resources", "strategy", "max_restarts"}
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
        num_cpus = block.get("num_cpus", cls.num_cpus)
        if isinstance(num_cpus, bool) or not isinstance(num_cpus, int | float) or num_cpus < 0:
            raise ConfigError(f"{where}.num_cpus must be a number >= 0, got {num_cpus!r}")
        memory_mb = block.get("memory_mb")
        if memory_mb is not None and (not isinstance(memory_mb, int) or memory_mb <= 0):
            raise ConfigError(f"{where}.memory_mb must be a positive integer, got {memory_mb!r}")
        resources = block.get("resources") or {}
        if not isinstance(resources, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int | float) and v > 0 for k, v in resources.items()
        ):
            raise ConfigError(
                f"{where}.resources must map resource names to positive amounts, got {resources!r}"
            )
        strategy = str(block.get("strategy", cls.strategy)).upper()
        if strategy not in STRATEGIES:
            raise ConfigError(f"{where}.strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        restarts = block.get("max_restarts", cls.max_restarts)
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise ConfigError(f"{where}.max_restarts must be an integer >= 0, got {restarts!r}")
        return cls(
            float(num_cpus), memory_mb, {k: float(v) for k, v in resources.items()}, strategy, restarts
        )

    def bundle(self) -> dict[str, float]:
        """The resources of one replica, as a placement-group bundle."""
        bundle = {"CPU": self.num_cpus, **self.resources}
        if self.memory_mb:
            bundle["memory"] = float(self.memory_mb * 1024 * 1024)
        return {k: v for k, v in bundle.items() if v > 0}


class ServerHost:
    """The body of the per-process actor: runs one server process on its node.

    Runs inside a Ray worker; :class:`RayBackend` wraps it with ``ray.remote``.
    """

    def __init__(self, command: list[str], env: dict[str, str], cwd: str, payload: bytes | None) -> None:
        self.command = command
        self.env = env
        self.cwd = cwd
        self.payload = payload
        self.process: subprocess.Popen[bytes] | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=2000)

    def start(self) -> dict[str, Any]:
        """Start the server process; ``{pid, node_id, node_ip}``."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        node_ip = ray.util.get_node_ip_address()
        env = {**self.env, ENV_NODE_ID: node_id, ENV_NODE_IP: node_ip}
        payload = self.payload
        if payload is not None:
            # A server whose config names no host listens on the node's address: reachable from the others.
            payload = LaunchPayload.from_json(payload).on_host(node_ip).to_json()
        self.process = subprocess.Popen(
            self.command,
            env=env,
            cwd=self.cwd if os.path.isdir(self.cwd) else None,
            stdin=subprocess.PIPE if payload is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # the actor's worker dies (node lost): the server goes too
        )
        if payload is not None and self.process.stdin is not None:
            self.process.stdin.write(payload)
            self.process.stdin.close()
        threading.Thread(target=self._read_output, daemon=True).start()
        return {"pid": self.process.pid, "node_id": node_id, "node_ip": node_ip}

    def _read_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def poll(self) -> tuple[int | None, list[str]]:
        """The exit code (None while running) and the output lines since the last poll."""
        lines = list(self.lines)
        self.lines.clear()
        return (self.process.poll() if self.process else None), lines

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the server's process group, SIGKILL after ``grace_s``; its exit code."""
        process = self.process
        if process is None or process.poll() is not None:
            return process.poll() if process else None
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                return process.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        return process.poll()


class RayReplica:
    """The launcher's view of one replica on Ray: ``poll()`` like a ``Popen``, replaced on loss."""

    def __init__(self, spec: LaunchSpec, placement: Placement) -> None:
        self.spec = spec
        self.placement = placement
        self.actor: Any = None
        self.info: dict[str, Any] = {}
        self.code: int | None = None
        self.restarts = 0
        self.stopping = False

    def poll(self) -> int | None:
        return self.code


class RayBackend:
    """Starts each server process through a Ray actor placed by the server's ``ray_placement``."""

    def __init__(self, address: str = "auto", namespace: str | None = None) -> None:
        import ray

        self._ray: Any = ray
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        remote: Any = ray.remote
        self._actor_class = remote(max_restarts=0, max_concurrency=4)(ServerHost)
        self._groups: dict[str, Any] = {}
        self._group_next: dict[str, int] = {}
        self._registry: Registry | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._lost_nodes: set[str] = set()
        self._next_node = 0
        self.replicas: list[RayReplica] = []

    def bind_registry(self, registry: Registry) -> None:
        """The head server's registry: lost replicas are removed from it at once."""
        self._registry = registry

    async def start(self, spec: LaunchSpec, log: Callable[[str, str], None]) -> ServerProcess | None:
        placement = Placement.of(spec.instance.name, spec.instance.fields)
        replica = RayReplica(spec, placement)
        await self._place(replica)
        proc = ServerProcess(spec.instance.name, spec.instance.type, replica.info["pid"], replica)
        self.replicas.append(replica)
        self._watchers.append(asyncio.create_task(self._watch(proc, replica, log)))
        return proc

    async def _place(self, replica: RayReplica, timeout_s: float = PLACE_TIMEOUT_S) -> None:
        options: dict[str, Any] = {"num_cpus": replica.placement.num_cpus}
        if replica.placement.resources:
            options["resources"] = dict(replica.placement.resources)
        if replica.placement.memory_mb:
            options["memory"] = replica.placement.memory_mb * 1024 * 1024
        options["scheduling_strategy"] = (
            self._replacement_strategy(replica) if replica.restarts else self._strategy(replica)
        )
        spec = replica.spec
        replica.actor = self._actor_class.options(**options).remote(
            list(spec.command), dict(spec.env), spec.cwd, spec.stdin_payload
        )
        try:
            replica.info = await asyncio.wait_for(replica.actor.start.remote(), timeout_s)
        except TimeoutError as exc:
            self._ray.kill(replica.actor, no_restart=True)
            raise RuntimeError(
                f"server {spec.instance.name!r}: Ray could not place it within {timeout_s:g}s "
                f"(needs {replica.placement.bundle()}); check the cluster's resources"
            ) from exc

    def _strategy(self, replica: RayReplica) -> Any:
        if replica.placement.strategy == "SPREAD":
            return "SPREAD"
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        name = replica.spec.instance.name
        group = self._groups.get(name)
        if group is None:
            workers = int(replica.spec.instance.fields.get("num_workers", 1))
            group = placement_group([replica.placement.bundle()] * workers, strategy="PACK")
            self._groups[name] = group
        index = self._group_next.get(name, 0)
        self._group_next[name] = index + 1
        return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)

    async def _watch(self, proc: ServerProcess, replica: RayReplica, log: Callable[[str, str], None]) -> None:
        """Relay output, notice loss (process exit, actor or node gone, port closed), restart."""
        failures = 0
        async with aiohttp.ClientSession() as http:
            while not replica.stopping:
                await asyncio.sleep(PROBE_INTERVAL_S)
                weight = await self._probe(replica, proc, log, http)
                failures = failures + weight if weight else 0
                if failures < LOST_AFTER_PROBES or replica.stopping:
                    continue
                failures = 0
                self._forget(replica)
                if not await self._restart(proc, replica, log):
                    replica.code = -1
                    return

    async def _restart(
        self, proc: ServerProcess, replica: RayReplica, log: Callable[[str, str], None]
    ) -> bool:
        """Start a lost replica again on another live node; False once ``max_restarts`` are spent."""
        self._lost_nodes.add(str(replica.info.get("node_id")))
        try:
            self._ray.kill(replica.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - the actor may already be gone with its node
            pass
        while replica.restarts < replica.placement.max_restarts:
            replica.restarts += 1
            log(proc.name, f"lost on node {replica.info.get('node_id')}: restart {replica.restarts}")
            try:
                await self._place(replica, timeout_s=RESTART_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - try again elsewhere, then report
                proc.log_tail.append(f"restart {replica.restarts} failed: {exc}")
                continue
            proc.pid = replica.info["pid"]
            return True
        proc.log_tail.append(f"lost; no restarts left after {replica.restarts}")
        return False

    def _replacement_strategy(self, replica: RayReplica) -> Any:
        """Hard affinity to a live node (not one a replica was lost on) that has the resources."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        def fits(node: Mapping[str, Any]) -> bool:
            have = node.get("Resources", {})
            return have.get("CPU", 0.0) >= replica.placement.num_cpus and all(
                have.get(k, 0.0) >= v for k, v in replica.placement.resources.items()
            )

        nodes = [
            n
            for n in self._ray.nodes()
            if n.get("Alive") and n.get("NodeID") not in self._lost_nodes and fits(n)
        ]
        if not nodes:
            return "SPREAD"  # Ray places it when capacity comes back (or the timeout reports it)
        self._next_node += 1
        return NodeAffinitySchedulingStrategy(
            node_id=nodes[self._next_node % len(nodes)]["NodeID"], soft=False
        )

    async def _probe(
        self, replica: RayReplica, proc: ServerProcess, log: Callable[[str, str], None], http: Any
    ) -> int:
        """How lost the replica looks: 0 fine, 1 suspect (no answer in time), 2 certain.

        Certain: its process exited, Ray reports the actor dead, or its port refuses connections.
        The actor and the server's port are asked at the same time.
        """
        actor_says, port_says = await asyncio.gather(
            self._ask_actor(replica, proc, log), self._knock(replica, http)
        )
        return max(actor_says, port_says)

    async def _ask_actor(
        self, replica: RayReplica, proc: ServerProcess, log: Callable[[str, str], None]
    ) -> int:
        try:
            code, lines = await asyncio.wait_for(replica.actor.poll.remote(), PROBE_TIMEOUT_S)
        except TimeoutError:
            return 1  # a node that went away often answers nothing until Ray notices
        except Exception:  # noqa: BLE001 - the actor is dead (with its node, or on its own)
            return LOST_AFTER_PROBES
        for line in lines:
            proc.log_tail.append(line)
            log(proc.name, line)
        return 0 if code is None else LOST_AFTER_PROBES

    async def _knock(self, replica: RayReplica, http: Any) -> int:
        url = self._url(replica)
        if url is None:
            return 0  # not registered yet
        try:
            async with http.get(url + "/", timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)):
                return 0
        except aiohttp.ClientConnectorError:
            return LOST_AFTER_PROBES  # nothing listens there any more
        except (aiohttp.ClientError, TimeoutError):
            return 1

    def _url(self, replica: RayReplica) -> str | None:
        if self._registry is None:
            return None
        for registered in self._registry.all():
            if registered.pid == replica.info.get("pid") and registered.node_id == replica.info.get(
                "node_id"
            ):
                return registered.url
        return None

    def _forget(self, replica: RayReplica) -> None:
        if self._registry is None:
            return
        for registered in self._registry.all():
            if registered.pid == replica.info.get("pid") and registered.node_id == replica.info.get(
                "node_id"
            ):
                self._registry.remove_where(registered.host, registered.pid)

    async def stop(self, proc: ServerProcess, grace_s: float) -> None:
        replica = proc.process
        assert isinstance(replica, RayReplica)
        replica.stopping = True
        try:
            code = await asyncio.wait_for(replica.actor.stop.remote(grace_s), grace_s + 10.0)
            replica.code = replica.code if replica.code is not None else (code if code is not None else 0)
        except Exception:  # noqa: BLE001 - the actor or its node is already gone
            replica.code = replica.code if replica.code is not None else -1
        try:
            self._ray.kill(replica.actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass

    async def close(self) -> None:
        """Stop watching and remove the placement groups this backend made."""
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        from ray.util.placement_group import remove_placement_group

        for group in self._groups.values():
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001
                pass
        self._groups.clear()

    def node_of(self, proc: ServerProcess) -> dict[str, Any]:
        """``{pid, node_id, node_ip}`` of a started replica."""
        replica = proc.process
        assert isinstance(replica, RayReplica)
        return dict(replica.info)
