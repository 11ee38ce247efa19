"""The ``local`` provider: a confined working tree on this machine, started in milliseconds.

Each sandbox is a fresh directory (its *working tree*) under ``workspace_root``. Each
:meth:`LocalProvider.exec` runs ``shell -c command`` through the confinement that code_gen uses
(:mod:`nemo_gym.sandbox.isolation`): an unprivileged user (``nobody`` when the server is
root), rlimits (CPU seconds, address space, file size, processes), writes only inside the tree
(Landlock), reads only system paths and the tree, no network unless the spec asks for it (an
empty network namespace + seccomp + Landlock), no ptrace/mount/namespace/privilege changes
(seccomp, ``no_new_privs``), a disk and file-count quota on the whole tree, a process count
per sandbox, and a wall-clock deadline after which the command's whole process group is
killed. Processes a command leaves behind are killed when it returns: a sandbox holds files
between commands, not processes.

Quotas are the kernel's where the machine allows (:mod:`nemo_gym.sandbox.isolation.kernel_limits`):
the tree is a tmpfs mounted with ``size=disk`` and ``nr_inodes=inodes`` (a root server), and
the sandbox's processes share a pids cgroup with ``pids.max=processes`` (a writable pids
hierarchy). Without them the tree is walked every 20 ms in a worker thread and processes are
``RLIMIT_NPROC`` of the shared unprivileged user (``kernel_limits: required`` refuses to start
a sandbox instead).

Paths: relative paths, and absolute paths beneath ``SandboxSpec.workdir`` (the tree's name
inside the sandbox, e.g. ``/workspace``), are inside the tree; other absolute paths are refused
for uploads, downloads and ``cwd``. Files are copied in and out without following symlinks the
code may have planted.

Config (``local:`` block, NeMo Gym's names first): ``workspace_root``, ``shell`` (``/bin/bash``),
``default_timeout_s`` (180), ``concurrency`` (8 commands at once in the process, shared by
every provider with that value), then ``network`` (false),
``memory_mib`` (4096, per process), ``disk_mib`` (2048, the whole tree), ``inodes`` (65536,
files and directories of the tree), ``processes`` (256, per sandbox), ``uid`` (``auto``),
``extra_read_roots``, ``require_layers``, ``kernel_limits`` (``auto``, ``required`` or ``off``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import posixpath
import shutil
import signal
import sys
import tempfile
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.isolation import kernel_limits as kl
from nemo_gym.sandbox.isolation.runner import (
    ConfinedOutcome,
    Confinement,
    ProcessLimits,
    _reachable_by_others,
    kill_group,
    read_roots,
    remove_tree,
    resolve_run_as,
    run_confined,
)
from nemo_gym.sandbox.isolation.tree import TreeEscapeError, copy_into_tree, copy_out_of_tree, split_inside
from nemo_gym.sandbox.lifecycle import LEDGER, current_rollout_id
from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)

logger = logging.getLogger("nemo_gym.sandbox")

# Not the command's exit status: the sandbox could not run it to the end.
SANDBOX_RUNTIME_RETURN_CODE = 125
# error_type of a result the sandbox itself failed (an infrastructure failure, not the command's)
SANDBOX_FAILURE = "sandbox"
MIB = 1024 * 1024
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


@dataclass
class _LocalSandbox:
    root: str  # holds the tree; removed at close
    tree: str
    alias: str | None  # SandboxSpec.workdir: the tree's name inside the sandbox
    env: dict[str, str]
    network: bool
    limits: ProcessLimits
    cpu: float
    mounted: bool = False  # the tree is a sized tmpfs
    cgroup: str | None = None  # the sandbox's pids cgroup
    groups: set[int] = field(default_factory=set)
    running: int = 0  # commands in progress (they share the cgroup)
    emptying: asyncio.Future[Any] | None = None  # the cgroup being emptied after the last one
    paused: bool = False
    closed: bool = False

    def __getitem__(self, key: str) -> Any:
        """NeMo Gym's local handles are dicts: ``handle.raw["workspace"]`` (the working tree, a
        ``Path``), ``["env"]`` and ``["owned"]`` (whether close deletes the tree: always here)."""
        if key == "workspace":
            return Path(self.tree)
        if key == "env":
            return self.env
        if key == "owned":
            return True
        raise KeyError(f"{key!r}: a local sandbox handle has 'workspace', 'env' and 'owned'")


def _child_python() -> str:
    """An interpreter the unprivileged user can run: this one, else the system's python3
    (the child needs the standard library only)."""
    for candidate in (sys.executable, shutil.which("python3") or "", "/usr/bin/python3"):
        if candidate and _reachable_by_others(os.path.realpath(candidate)):
            return candidate
    return sys.executable


class LocalProvider:
    """Confined working trees on this machine (see the module docstring)."""

    name = "local"

    def __init__(
        self,
        workspace_root: str | None = None,
        shell: str = "/bin/bash",
        default_timeout_s: float = 180.0,
        concurrency: int = 8,
        *,
        network: bool = False,
        memory_mib: int = 4096,
        disk_mib: int = 2048,
        processes: int = 256,
        uid: int | str = "auto",
        extra_read_roots: list[str] | tuple[str, ...] = (),
        require_layers: list[str] | tuple[str, ...] = (),
        inodes: int = 65536,
        kernel_limits: str = "auto",
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"local sandbox concurrency must be >= 1, got {concurrency}")
        if kernel_limits not in ("auto", "required", "off"):
            raise ValueError(
                f"local sandbox kernel_limits must be 'auto', 'required' or 'off', got {kernel_limits!r}"
            )
        if not os.path.isabs(shell) or not os.access(shell, os.X_OK):
            raise ValueError(f"local sandbox shell {shell!r} is not an executable absolute path")
        # Not under /tmp by default: each sandbox gets its own /tmp, which would hide the trees.
        default_parent = "/var/tmp" if os.path.isdir("/var/tmp") else tempfile.gettempdir()
        root = Path(workspace_root or Path(default_parent) / "nemo_gym_sandbox_trees").expanduser()
        root.mkdir(parents=True, exist_ok=True)
        # The unprivileged user must traverse to its tree; the tree itself is its own.
        with contextlib.suppress(OSError):
            root.chmod(root.stat().st_mode | 0o711)
        self._root = str(root.resolve())
        self._shell = shell
        self._default_timeout_s = float(default_timeout_s)
        self._concurrency = concurrency
        self._network = bool(network)
        self._memory_mib, self._disk_mib, self._processes = int(memory_mib), int(disk_mib), int(processes)
        self._inodes = int(inodes)
        self._tmpfs, self._pids_root = self._kernel_limits(kernel_limits)
        self._python = _child_python()
        self._run_as = resolve_run_as(uid, [self._python, shell], self._root)
        unprivileged = self._run_as is not None or os.geteuid() != 0
        self._extra_read_roots = tuple(extra_read_roots)
        self._require = tuple(require_layers)
        # Each sandbox sees its own /tmp (a bind mount in a private mount namespace): needs root.
        self._private_tmp = (
            os.geteuid() == 0
            and sys.platform.startswith("linux")
            and not (self._root + "/").startswith("/tmp/")
        )
        self._warned_user = False
        self._confinement = {
            net: Confinement(
                network=net,
                allow_processes=True,
                allow_chmod=unprivileged,
                require=self._require,
                read_roots=tuple(read_roots(self._python, self._extra_read_roots, shell=True, network=net)),
                private_tmp=self._private_tmp,
            )
            for net in (False, True)
        }
        LEDGER.register_reaper(self.name, _reap_local)
        LEDGER.sweep()

    @staticmethod
    def _kernel_limits(mode: str) -> tuple[bool, str | None]:
        """(sized tmpfs trees, the pids cgroup root) this provider uses."""
        if mode == "off":
            return False, None
        support = kl.machine_support()
        if mode == "required" and support.why_not:
            raise ValueError(
                "local sandbox kernel_limits: required, but this machine lacks: "
                + "; ".join(f"{name}: {why}" for name, why in support.why_not.items())
                + " (run the server as root on Linux with a pids cgroup, or set kernel_limits: auto)"
            )
        return support.tmpfs, support.pids_root

    @property
    def kernel_limits(self) -> dict[str, Any]:
        """Which quotas the kernel holds here: ``{"tmpfs": bool, "pids_cgroup": path or None}``."""
        return {"tmpfs": self._tmpfs, "pids_cgroup": self._pids_root}

    def _slots(self) -> asyncio.Semaphore:
        """The process-wide bound on running commands: shared by every provider with the same
        ``concurrency`` on this event loop, because servers usually build a provider per sandbox."""
        per_loop = _SLOTS.setdefault(asyncio.get_running_loop(), {})
        return per_loop.setdefault(self._concurrency, asyncio.Semaphore(self._concurrency))

    @property
    def run_as(self) -> tuple[int, int] | None:
        """The (uid, gid) commands run as, or None for this process's own user."""
        return self._run_as

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Make a fresh working tree (a sized tmpfs where the machine allows, and a pids cgroup),
        in a worker thread; nothing runs until ``exec``."""
        sandbox_id = f"local-{uuid.uuid4().hex[:12]}"
        root = os.path.join(self._root, sandbox_id)
        tree = os.path.join(root, "work")
        resources = spec.resources if isinstance(spec.resources, SandboxResources) else SandboxResources()
        network = bool((spec.provider_options or {}).get("network", self._network))
        memory_mib = resources.memory_mib or self._memory_mib
        disk_mib = int((resources.disk_gib or 0) * 1024) or self._disk_mib
        cgroup = os.path.join(self._pids_root, sandbox_id) if self._pids_root else None
        limits = ProcessLimits(
            cpu_time_s=self._default_timeout_s,
            memory_bytes=memory_mib * MIB,
            file_size_bytes=disk_mib * MIB,
            open_files=1024,
            processes=None if cgroup else self._processes,
            max_output_bytes=16 * MIB,
            disk_bytes=None if self._tmpfs else disk_mib * MIB,
            disk_files=None if self._tmpfs else self._inodes,
        )
        record = {"root": root, "tree": tree, "cgroup": cgroup, "rollout": current_rollout_id()}
        try:
            await asyncio.to_thread(self._make_tree, sandbox_id, record, disk_mib * MIB)
        except OSError as exc:
            await asyncio.to_thread(_reap_local, record)
            LEDGER.forget(sandbox_id)
            raise SandboxCreateError(f"local sandbox {sandbox_id}: {exc}") from exc
        alias = posixpath.normpath(spec.workdir) if spec.workdir and spec.workdir.startswith("/") else None
        env = {
            "PATH": SAFE_PATH,
            "HOME": tree,
            "TMPDIR": "/tmp" if self._private_tmp else os.path.join(tree, ".tmp"),
            "LANG": "C.UTF-8",
            **spec.env,
        }
        inst = _LocalSandbox(
            root, tree, alias, env, network, limits, max(1.0, resources.cpu or 1.0), self._tmpfs, cgroup
        )
        return SandboxHandle(sandbox_id=sandbox_id, provider_name=self.name, raw=inst)

    def _make_tree(self, sandbox_id: str, record: dict[str, Any], disk_bytes: int) -> None:
        """Record the sandbox, then make its tree (mounted), its private /tmp and its cgroup."""
        LEDGER.record(sandbox_id, self.name, **record)
        root, tree = record["root"], record["tree"]
        os.makedirs(tree, mode=0o700)
        os.chmod(root, 0o711)
        if self._tmpfs:
            kl.mount_tmpfs(tree, disk_bytes, self._inodes, self._run_as)
        os.mkdir(os.path.join(tree, ".tmp"), mode=0o700)
        if self._run_as is not None:
            for path in (tree, os.path.join(tree, ".tmp")):
                os.chown(path, *self._run_as)
        if record["cgroup"]:
            kl.create_pids_cgroup(self._pids_root or "", sandbox_id, self._processes)

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        """Run ``shell -c command`` confined to the tree; the deadline kills the whole group."""
        inst = self._live(handle)
        if user is not None and not self._warned_user:
            # Running as less than asked is safe; a command that truly needs root fails visibly.
            self._warned_user = True
            logger.warning("local sandbox: user=%r ignored; every command runs as the sandbox's user", user)
        if inst.paused:
            raise RuntimeError(f"sandbox {handle.sandbox_id} is paused; resume() it first")
        timeout = float(timeout_s if timeout_s is not None else self._default_timeout_s)
        workdir = inst.tree if cwd is None else self._inside(inst, cwd, "cwd")
        # CPU seconds per process: the wall deadline times the cores the sandbox may use.
        limits = dataclasses.replace(
            inst.limits, cpu_time_s=max(1.0, timeout * inst.cpu), wall_time_s=timeout
        )
        run = {
            "kind": "exec",
            "argv": [self._shell, "-c", command],
            "env": {**inst.env, "PWD": workdir, **(env or {})},
            "cwd": workdir,
        }

        def spawned(pgid: int) -> None:
            inst.groups.add(pgid)
            LEDGER.add_group(pgid)
            if inst.paused:  # paused while this command waited for a slot or was starting
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGSTOP)

        def ended(pgid: int) -> None:
            inst.groups.discard(pgid)
            LEDGER.remove_group(pgid)

        inst.running += 1
        try:
            if inst.emptying is not None:  # what the last command left is still being killed
                await asyncio.shield(inst.emptying)
            outcome = await self._run(inst, run, limits, spawned, ended)
        finally:
            inst.running -= 1
            if inst.cgroup is not None and inst.running == 0:
                # Nothing of this sandbox may run between commands: kill whatever is left in its
                # cgroup (escaped its group or not), once no other command shares it.
                inst.emptying = asyncio.ensure_future(asyncio.to_thread(kl.kill_cgroup, inst.cgroup))
                await asyncio.shield(inst.emptying)
        return self._result(inst, outcome, timeout)

    async def _run(
        self,
        inst: _LocalSandbox,
        run: dict[str, Any],
        limits: ProcessLimits,
        spawned: Callable[[int], None],
        ended: Callable[[int], None],
    ) -> ConfinedOutcome:
        async with self._slots():
            return await run_confined(
                run,
                workdir=inst.tree,
                confinement=self._confinement[inst.network],
                limits=limits,
                python=self._python,
                run_as=self._run_as,
                on_spawn=spawned,
                on_exit=ended,
                cgroup=inst.cgroup,
            )

    def _result(self, inst: _LocalSandbox, outcome: ConfinedOutcome, timeout: float) -> SandboxExecResult:
        """The exec result of a confined run (the sandbox's own failure is never an exit status)."""
        stdout = outcome.stdout.decode("utf-8", errors="replace")
        stderr = outcome.stderr.decode("utf-8", errors="replace")
        failure = outcome.sandbox_failure
        if failure is not None:
            # The sandbox's own failure (fork refused, quota machinery, setup): never the
            # command's exit status. error_type "sandbox" is failure kind "sandbox_failed".
            return SandboxExecResult(
                None, f"sandbox setup failed: {failure}", SANDBOX_RUNTIME_RETURN_CODE, SANDBOX_FAILURE
            )
        if outcome.timed_out:
            message = f"{stderr}\nlocal command timed out after {timeout:g}s".lstrip()
            return SandboxExecResult(stdout, message, SANDBOX_RUNTIME_RETURN_CODE, "timeout")
        if outcome.disk_full:
            message = (
                f"disk quota exceeded: the sandbox's files passed {(inst.limits.disk_bytes or 0) // MIB} MiB "
                f"or {inst.limits.disk_files} files"
            )
            return SandboxExecResult(stdout, message, SANDBOX_RUNTIME_RETURN_CODE, "disk_quota")
        if outcome.output_overflow:
            message = f"output passed {inst.limits.max_output_bytes // MIB} MiB; the command was killed"
            return SandboxExecResult(stdout, message, SANDBOX_RUNTIME_RETURN_CODE, "output_limit")
        code = outcome.returncode if outcome.returncode >= 0 else 128 - outcome.returncode
        return SandboxExecResult(stdout, stderr, code, None)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """Copy a host file into the tree (parents created; no symlink in the tree followed)."""
        inst = self._live(handle)
        parts = self._parts(inst, target_path)
        await asyncio.to_thread(copy_into_tree, inst.tree, parts, str(source_path), self._run_as)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        """Copy a regular file out of the tree (a symlink or a path outside is refused)."""
        inst = self._live(handle)
        parts = self._parts(inst, source_path)
        await asyncio.to_thread(copy_out_of_tree, inst.tree, parts, str(target_path))

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """RUNNING while the tree exists, PAUSED between pause and resume, else STOPPED."""
        inst: _LocalSandbox = handle.raw
        if inst.closed or not os.path.isdir(inst.tree):
            return SandboxStatus.STOPPED
        return SandboxStatus.PAUSED if inst.paused else SandboxStatus.RUNNING

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """``http://127.0.0.1:<port>`` for a sandbox started with network (it shares the host's)."""
        inst = self._live(handle)
        if not inst.network:
            raise ValueError(
                f"sandbox {handle.sandbox_id} has no network; start it with provider_options={{'network': True}} "
                "(or network: true in the local provider config) to serve a port"
            )
        return SandboxEndpoint(f"http://127.0.0.1:{port}")

    async def pause(self, handle: SandboxHandle) -> None:
        """Stop running commands where they are (SIGSTOP) and refuse new ones until resume."""
        inst = self._live(handle)
        inst.paused = True
        for pgid in list(inst.groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGSTOP)

    async def resume(self, handle: SandboxHandle) -> None:
        """Let paused commands continue (SIGCONT) and accept new ones."""
        inst = self._live(handle)
        for pgid in list(inst.groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGCONT)
        inst.paused = False

    async def close(self, handle: SandboxHandle) -> None:
        """Kill whatever still runs and delete the tree."""
        inst: _LocalSandbox = handle.raw
        if inst.closed:
            return
        inst.closed = True
        for pgid in list(inst.groups):
            kill_group(pgid)
        record = {"root": inst.root, "tree": inst.tree, "cgroup": inst.cgroup}
        await asyncio.to_thread(_reap_local, record)
        LEDGER.forget(handle.sandbox_id)

    async def aclose(self) -> None:
        """Nothing provider-wide to free."""

    # ---- paths -------------------------------------------------------------------------------
    def _live(self, handle: SandboxHandle) -> _LocalSandbox:
        inst = handle.raw
        if not isinstance(inst, _LocalSandbox) or inst.closed:
            raise RuntimeError(f"sandbox {handle.sandbox_id} is stopped")
        return inst

    def _relative(self, inst: _LocalSandbox, path: str) -> str:
        if not path.startswith("/"):
            return path
        normalized = posixpath.normpath(path)
        if self._private_tmp and (normalized == "/tmp" or normalized.startswith("/tmp/")):
            return ".tmp" + normalized[len("/tmp") :]
        for base in (inst.tree, inst.alias):
            if base and (normalized == base or normalized.startswith(base.rstrip("/") + "/")):
                return normalized[len(base) :].lstrip("/")
        raise TreeEscapeError(
            13,
            f"{path!r} is outside the local sandbox's working tree"
            + (f" (paths beneath {inst.alias} map into it)" if inst.alias else " (use a relative path)")
            + (" or its private /tmp" if self._private_tmp else ""),
        )

    def _parts(self, inst: _LocalSandbox, path: str) -> list[str]:
        return split_inside(self._relative(inst, path))

    def _inside(self, inst: _LocalSandbox, path: str, what: str) -> str:
        parts = self._parts(inst, path)
        full = os.path.join(inst.tree, *parts)
        real = os.path.realpath(full)
        if real != inst.tree and not real.startswith(inst.tree + "/"):
            raise TreeEscapeError(13, f"{what} {path!r} resolves outside the sandbox's working tree")
        return full


def _reap_local(record: dict[str, Any]) -> None:
    """Remove a local sandbox (at close, at exit, in a sweep): kill what is in its cgroup and
    remove the cgroup, unmount its tree's file system, delete the tree. Synchronous."""
    if record.get("cgroup"):
        kl.remove_cgroup(record["cgroup"])
    root = record.get("root")
    tree = record.get("tree") or (os.path.join(root, "work") if root else None)
    if tree:
        kl.unmount(tree)
    if root and os.path.isdir(root):
        remove_tree(root)
