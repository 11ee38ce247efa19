"""The ``apptainer`` provider: one Apptainer instance per sandbox, driven through the
``apptainer`` command line (no daemon; the runtime HPC clusters offer where Docker is not).

| step | command |
|---|---|
| create | ``apptainer instance start --bind <staging>:<mount_point> [binds] [limits] [args] IMAGE NAME`` |
| exec | ``apptainer exec [--pwd DIR] [--env-file F] [args] instance://NAME sh -c COMMAND`` |
| status | ``apptainer instance list --json`` |
| close | ``apptainer instance stop NAME`` |

Each sandbox gets a host *staging* folder bind-mounted at ``create.mount_point`` (``/sandbox``):
files whose in-sandbox path lies beneath it are copied on the host directly; other paths pass
through it with a ``cp`` inside the instance. Environment variables travel in a private
(0600) env file, never on a command line. A bare image name (``ubuntu:22.04``) means
``docker://ubuntu:22.04``; a ``.sif`` path or any ``scheme://`` URI is used as given.

Config (``apptainer:`` block, NeMo Gym's names): ``bin_path`` (a folder holding ``apptainer``),
``create`` (:class:`ApptainerCreateConfig`), ``exec`` (:class:`ApptainerExecConfig`), ``probe``
(:class:`ApptainerProbeConfig`). Building a provider without ``apptainer`` on ``PATH`` (or in
``bin_path``) fails at once, saying so. Commands run as the calling user; ``user="root"`` (or 0)
adds ``--fakeroot`` (``exec.fakeroot_for_root``), any other user is refused in the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import posixpath
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.lifecycle import LEDGER
from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxCreateVerificationError,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)
from nemo_gym.sandbox.providers.utils import coerce_config, path_under_mount

logger = logging.getLogger("nemo_gym.sandbox")

SANDBOX_RUNTIME_RETURN_CODE = 125
READY_PROBE_COMMAND = "printf apptainer-sandbox-ready"
READY_PROBE_EXPECTED = "apptainer-sandbox-ready"
# Apptainer's own failures (as opposed to the command's) start with this on stderr.
_APPTAINER_FATAL = "FATAL:"


class ApptainerCreateError(SandboxCreateError):
    """``apptainer instance start`` failed."""


class ApptainerCreateVerificationError(SandboxCreateVerificationError):
    """The instance started but never answered the readiness probe."""


def _require_apptainer(bin_path: str | None = None) -> str:
    """The ``apptainer`` executable (in ``bin_path`` when given, else on ``PATH``);
    ``RuntimeError`` saying how to fix it when there is none."""
    found = shutil.which("apptainer", path=bin_path) if bin_path else shutil.which("apptainer")
    if found is None:
        where = f"in bin_path={bin_path!r}" if bin_path else "on PATH"
        raise RuntimeError(
            f"the apptainer sandbox provider needs the `apptainer` command, and there is none {where}. "
            "Install Apptainer (https://apptainer.org/docs/admin/main/installation.html), set the provider's "
            "bin_path to the folder holding it, or pick another sandbox provider (local, docker)."
        )
    return found


@dataclass(frozen=True)
class ApptainerCreateConfig:
    """``instance start``: where the staging folder appears inside (``mount_point``), how long
    starting may take, extra flags, and whether the spec's CPU/memory become ``--cpus``/``--memory``."""

    mount_point: str = "/sandbox"
    start_timeout_s: float | None = 600
    extra_start_args: list[str] = field(default_factory=list)
    apply_resource_limits: bool = True

    def __post_init__(self) -> None:
        if not self.mount_point.startswith("/"):
            raise ValueError(f"create.mount_point must be an absolute path, got {self.mount_point!r}")
        if self.start_timeout_s is not None and self.start_timeout_s <= 0:
            raise ValueError(f"create.start_timeout_s must be > 0, got {self.start_timeout_s}")


@dataclass(frozen=True)
class ApptainerExecConfig:
    """``exec``: default deadline, SIGTERM-to-SIGKILL grace, ``--fakeroot`` for root, binds added
    at start (``default_binds``), flags added to every exec, and how many ``apptainer``
    processes may run at once."""

    default_timeout_s: float | None = 180
    timeout_grace_s: float = 15
    fakeroot_for_root: bool = True
    default_binds: list[str] = field(default_factory=list)
    extra_exec_args: list[str] = field(default_factory=list)
    concurrency: int = 32

    def __post_init__(self) -> None:
        if self.default_timeout_s is not None and self.default_timeout_s <= 0:
            raise ValueError(f"exec.default_timeout_s must be > 0, got {self.default_timeout_s}")
        if self.timeout_grace_s < 0:
            raise ValueError(f"exec.timeout_grace_s must be >= 0, got {self.timeout_grace_s}")
        if self.concurrency < 1:
            raise ValueError(f"exec.concurrency must be >= 1, got {self.concurrency}")


@dataclass(frozen=True)
class ApptainerProbeConfig:
    """The readiness probe run after start: ``command`` (``None``: no probe) must print
    ``expected_stdout`` ``stable_count`` times in a row within ``deadline_s``."""

    command: str | None = READY_PROBE_COMMAND
    expected_stdout: str | None = READY_PROBE_EXPECTED
    timeout_s: float = 30
    deadline_s: float | None = None
    stable_count: int = 1
    stable_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or (self.deadline_s is not None and self.deadline_s <= 0):
            raise ValueError("probe.timeout_s and probe.deadline_s must be > 0")
        if self.stable_count < 1 or self.stable_delay_s < 0:
            raise ValueError("probe.stable_count must be >= 1 and probe.stable_delay_s >= 0")


@dataclass
class _Instance:
    """What the provider keeps in ``SandboxHandle.raw``."""

    name: str
    staging_dir: Path
    mount_point: str
    image: str
    workdir: str | None
    env: dict[str, str] = field(default_factory=dict)


def _image_uri(image: str) -> str:
    if "://" in image or image.endswith(".sif") or os.path.exists(image):
        return image
    return f"docker://{image}"


def _binds(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise SandboxCreateError(
        f"provider_options['binds'] must be 'src:dst[:opts]' or a list of them, got {value!r}"
    )


def _env_file_text(env: Mapping[str, str]) -> str:
    lines = []
    for key, value in env.items():
        if not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ValueError(f"environment variable name {key!r} is not a valid shell name")
        lines.append(f"{key}={shlex.quote(str(value))}")
    return "\n".join(lines) + "\n"


def _stop_instance_sync(record: dict[str, Any]) -> None:
    """The sweep's reaper: stop a dead owner's instance and remove its staging folder."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [record["binary"], "instance", "stop", record["sandbox_id"]],
            capture_output=True,
            timeout=60,
            check=False,
        )
    shutil.rmtree(record.get("staging_dir", ""), ignore_errors=True)


class ApptainerProvider:
    """Apptainer instances through the ``apptainer`` CLI (see the module docstring)."""

    name = "apptainer"

    def __init__(
        self,
        *,
        bin_path: str | None = None,
        exec: ApptainerExecConfig | Mapping[str, Any] | None = None,  # noqa: A002 - NeMo Gym's config key
        create: ApptainerCreateConfig | Mapping[str, Any] | None = None,
        probe: ApptainerProbeConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self._exec_config: ApptainerExecConfig = coerce_config(exec, ApptainerExecConfig)
        self._create_config: ApptainerCreateConfig = coerce_config(create, ApptainerCreateConfig)
        self._probe: ApptainerProbeConfig = coerce_config(probe, ApptainerProbeConfig)
        self._binary = _require_apptainer(bin_path)
        self._env = dict(os.environ)
        if bin_path:
            self._env["PATH"] = f"{bin_path}{os.pathsep}{self._env.get('PATH', '')}"
        self._semaphore = asyncio.Semaphore(self._exec_config.concurrency)
        LEDGER.register_reaper(self.name, _stop_instance_sync)

    # ---- running apptainer -------------------------------------------------------------------
    async def _run(
        self, argv: list[str], *, timeout_s: float | None, detached_output: bool = False
    ) -> tuple[int | None, str, str]:
        """``(exit status, stdout, stderr)``; ``None`` as status when the deadline passed (the
        process group got SIGTERM, then SIGKILL after the grace)."""
        async with self._semaphore:
            with contextlib.ExitStack() as stack:
                if detached_output:
                    # `instance start` leaves the instance holding its stdio: pipes would never
                    # close, so the output goes to files and only the launcher is waited for.
                    out = stack.enter_context(tempfile.TemporaryFile())
                    err = stack.enter_context(tempfile.TemporaryFile())
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        env=self._env,
                        start_new_session=True,
                    )
                else:
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        env=self._env,
                        start_new_session=True,
                    )
                try:
                    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout_s)
                except TimeoutError:
                    await self._stop_process(proc)
                    return None, "", ""
                if detached_output:
                    out.seek(0)
                    err.seek(0)
                    stdout, stderr = out.read(), err.read()
        return proc.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")

    async def _stop_process(self, proc: asyncio.subprocess.Process) -> None:
        for sig, wait in ((signal.SIGTERM, self._exec_config.timeout_grace_s), (signal.SIGKILL, 10.0)):
            if proc.returncode is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), wait)

    # ---- lifecycle ---------------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Start an instance of ``spec.image``; returns once the readiness probe passes."""
        if not spec.image:
            raise ApptainerCreateError(
                "the apptainer provider needs SandboxSpec.image (a .sif, a URI or an image name)"
            )
        if spec.ttl_s:
            logger.debug("apptainer: ttl_s is enforced by the sandbox API's deadline, not by apptainer")
        config = self._create_config
        name = f"nemo-gym-{uuid.uuid4().hex[:12]}"
        staging = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        instance = _Instance(
            name, staging, config.mount_point, _image_uri(spec.image), spec.workdir, dict(spec.env)
        )
        argv = [self._binary, "instance", "start", "--bind", f"{staging}:{config.mount_point}"]
        for bind in [*self._exec_config.default_binds, *_binds((spec.provider_options or {}).get("binds"))]:
            argv += ["--bind", bind]
        resources = spec.resources if isinstance(spec.resources, SandboxResources) else SandboxResources()
        if config.apply_resource_limits:
            argv += ["--cpus", f"{resources.cpu:g}"] if resources.cpu else []
            argv += ["--memory", f"{resources.memory_mib}M"] if resources.memory_mib else []
        argv += ["--nv"] if resources.gpu else []
        argv += [*config.extra_start_args, instance.image, name]
        LEDGER.record(name, self.name, binary=self._binary, staging_dir=str(staging))
        handle = SandboxHandle(sandbox_id=name, provider_name=self.name, raw=instance)
        try:
            code, out, err = await self._run(argv, timeout_s=config.start_timeout_s, detached_output=True)
            if code != 0:
                why = (
                    f"timed out after {config.start_timeout_s:g}s"
                    if code is None
                    else f"exit {code}: {(err or out).strip()[-2000:]}"
                )
                raise ApptainerCreateError(f"apptainer instance start of {instance.image!r} failed ({why})")
            if spec.workdir:
                made = await self.exec(handle, f"mkdir -p {shlex.quote(spec.workdir)}", cwd="/", timeout_s=60)
                if made.return_code != 0:
                    raise ApptainerCreateError(f"cannot create workdir {spec.workdir!r}: {made.stderr}")
            await self._wait_ready(handle)
        except BaseException:
            await self.close(handle)
            raise
        return handle

    async def _wait_ready(self, handle: SandboxHandle) -> None:
        probe = self._probe
        if probe.command is None:
            return
        deadline = time.monotonic() + probe.deadline_s if probe.deadline_s else None
        passes, last = 0, ""
        while passes < probe.stable_count:
            result = await self.exec(handle, probe.command, timeout_s=probe.timeout_s)
            ok = result.return_code == 0 and (
                probe.expected_stdout is None or (result.stdout or "").strip() == probe.expected_stdout
            )
            passes = passes + 1 if ok else 0
            last = f"exit {result.return_code}, stdout {result.stdout!r}, stderr {result.stderr!r}"
            if passes >= probe.stable_count:
                return
            if not ok and (deadline is None or time.monotonic() >= deadline):
                raise ApptainerCreateVerificationError(
                    f"apptainer instance {handle.sandbox_id} did not pass the readiness probe {probe.command!r}: {last}"
                )
            await asyncio.sleep(probe.stable_delay_s if ok else min(1.0, probe.stable_delay_s or 0.2))

    async def close(self, handle: SandboxHandle) -> None:
        """Stop the instance and remove its staging folder (download what you need first)."""
        instance: _Instance = handle.raw
        code, out, err = await self._run([self._binary, "instance", "stop", instance.name], timeout_s=60)
        shutil.rmtree(instance.staging_dir, ignore_errors=True)
        LEDGER.forget(instance.name)
        missing = "no instance found" in err.lower() or "not found" in err.lower()
        if code not in (0, None) and not missing:
            logger.warning("apptainer instance stop %s: exit %s: %s", instance.name, code, err.strip()[-500:])

    async def aclose(self) -> None:
        """Nothing to release: every instance is closed on its own."""

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """RUNNING while ``instance list`` shows the instance, STOPPED once it does not."""
        code, out, err = await self._run([self._binary, "instance", "list", "--json"], timeout_s=60)
        if code != 0:
            return SandboxStatus.ERROR
        try:
            listed = json.loads(out or "{}").get("instances") or []
        except (json.JSONDecodeError, AttributeError):
            return SandboxStatus.ERROR
        names = {entry.get("instance") for entry in listed if isinstance(entry, dict)}
        return SandboxStatus.RUNNING if handle.raw.name in names else SandboxStatus.STOPPED

    # ---- commands and files ------------------------------------------------------------------
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
        """Run ``sh -c command`` in the instance (the spec's env, then ``env``; ``cwd`` or the
        spec's workdir). Past the deadline: ``error_type: timeout``; an Apptainer failure (not
        the command's): ``error_type: runtime``; both with return code 125."""
        instance: _Instance = handle.raw
        flags: list[str] = []
        if user is not None and str(user) not in ("root", "0"):
            return SandboxExecResult(
                None,
                f"apptainer runs commands as the calling user; user={user!r} is not supported",
                125,
                "sandbox",
            )
        if user is not None and self._exec_config.fakeroot_for_root:
            flags.append("--fakeroot")
        directory = cwd or instance.workdir
        if directory:
            flags += ["--pwd", directory]
        merged = {**instance.env, **(env or {})}
        env_file = None
        if merged:
            env_file = instance.staging_dir.parent / f"{instance.name}.env.{uuid.uuid4().hex[:8]}"
            fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(_env_file_text(merged))
            flags += ["--env-file", str(env_file)]
        argv = [self._binary, "exec", *flags, *self._exec_config.extra_exec_args]
        argv += [f"instance://{instance.name}", "sh", "-c", command]
        timeout = timeout_s if timeout_s is not None else self._exec_config.default_timeout_s
        try:
            code, out, err = await self._run(argv, timeout_s=timeout)
        finally:
            if env_file is not None:
                env_file.unlink(missing_ok=True)
        if code is None:
            return SandboxExecResult(None, f"apptainer command timed out after {timeout:g}s", 125, "timeout")
        if code != 0 and err.lstrip().startswith(_APPTAINER_FATAL):
            return SandboxExecResult(out, err, SANDBOX_RUNTIME_RETURN_CODE, "runtime")
        return SandboxExecResult(out, err, code)

    def _staged(self, instance: _Instance, path: str) -> Path | None:
        """The host path of in-sandbox ``path`` when it lies in the staging folder (symlinks that
        lead out of it are refused)."""
        inside = path_under_mount(instance.mount_point, path)
        if inside is None:
            return None
        host = (instance.staging_dir / inside).resolve()
        if not host.is_relative_to(instance.staging_dir.resolve()):
            raise PermissionError(f"{path} leads out of the sandbox's staging folder")
        return host

    async def _copy_inside(self, handle: SandboxHandle, command: str, what: str) -> None:
        # As the calling user, who owns the staging folder on the host.
        result = await self.exec(handle, command, timeout_s=300)
        if result.return_code != 0:
            raise OSError(
                f"apptainer {what} failed (exit {result.return_code}): {(result.stderr or '').strip()}"
            )

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """Copy a host file to ``target_path`` in the sandbox."""
        instance: _Instance = handle.raw
        if not posixpath.isabs(target_path):
            target_path = posixpath.join(instance.workdir or instance.mount_point, target_path)
        host = self._staged(instance, target_path)
        if host is not None:
            host.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source_path, host)
            return
        transfer = f".transfer-{uuid.uuid4().hex[:12]}"
        shutil.copyfile(source_path, instance.staging_dir / transfer)
        try:
            staged = shlex.quote(posixpath.join(instance.mount_point, transfer))
            target = shlex.quote(target_path)
            parent = shlex.quote(posixpath.dirname(target_path) or "/")
            await self._copy_inside(
                handle, f"mkdir -p {parent} && cp {staged} {target}", f"upload to {target_path}"
            )
        finally:
            (instance.staging_dir / transfer).unlink(missing_ok=True)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        """Copy ``source_path`` in the sandbox to a host file."""
        instance: _Instance = handle.raw
        if not posixpath.isabs(source_path):
            source_path = posixpath.join(instance.workdir or instance.mount_point, source_path)
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        host = self._staged(instance, source_path)
        if host is not None:
            if not host.is_file():
                raise FileNotFoundError(f"{source_path} is not a file in the sandbox")
            shutil.copyfile(host, target_path)
            return
        transfer = f".transfer-{uuid.uuid4().hex[:12]}"
        staged = posixpath.join(instance.mount_point, transfer)
        try:
            await self._copy_inside(
                handle,
                f"test -f {shlex.quote(source_path)} && cp {shlex.quote(source_path)} {shlex.quote(staged)}",
                f"download of {source_path}",
            )
            shutil.copyfile(instance.staging_dir / transfer, target_path)
        finally:
            (instance.staging_dir / transfer).unlink(missing_ok=True)
