"""NeMo Gym's sandbox API (``nemo_gym.sandbox``) against the ``local`` provider: real confined
processes, real files. The docker provider's contract is in ``test_sandbox_docker.py``."""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from pathlib import Path

import pytest

from nemo_gym.sandbox import (
    AsyncSandbox,
    Sandbox,
    SandboxEndpoint,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
    create_provider,
    get_provider_class,
    list_providers,
    register_provider,
    resolve_provider_config,
    resolve_provider_metadata,
    sandbox_counts,
)
from nemo_gym.sandbox.providers.local import LocalProvider
from nemo_gym.sandbox.utils import CPU_CAP_ENV_VARS, cpu_cap_env

# Where NeMo Gym 0.7.0's environments import sandbox names from.
DOCUMENTED = {
    "nemo_gym.sandbox": [
        "AsyncSandbox",
        "Sandbox",
        "SandboxSpec",
        "SandboxResources",
        "SandboxExecResult",
        "SandboxEndpoint",
        "SandboxStatus",
        "SandboxCreateError",
        "create_provider",
        "register_provider",
        "list_providers",
        "get_provider_class",
        "resolve_provider_config",
        "resolve_provider_metadata",
        "SupportsSandboxPauseResume",
        "SupportsSandboxEndpoint",
        "rewrite_image",
    ],
    "nemo_gym.sandbox.config": ["resolve_provider_config", "resolve_provider_metadata"],
    "nemo_gym.sandbox.utils": ["cpu_cap_env", "CPU_CAP_ENV_VARS", "rewrite_image"],
    "nemo_gym.sandbox.providers.base": [
        "ConnectableProvider",
        "SandboxCreateError",
        "SandboxExecResult",
        "SandboxSpec",
        "SandboxHandle",
        "SandboxProvider",
    ],
    "nemo_gym.sandbox.providers.registry": ["create_provider"],
    "nemo_gym.sandbox.providers.local": ["LocalProvider"],
    "nemo_gym.sandbox.access": ["SandboxAccess", "DirectSandboxConnection"],
}

LOCAL = {"local": {"default_timeout_s": 20}}


def test_every_documented_name_imports_from_its_path():
    missing = [
        f"{module}.{name}"
        for module, names in DOCUMENTED.items()
        for name in names
        if not hasattr(importlib.import_module(module), name)
    ]
    assert missing == []
    assert {"local", "docker", "podman"} <= set(list_providers())


def test_provider_configs_resolve_by_name_or_inline_and_errors_say_what_is_wrong():
    merged = {
        "sandbox": {"local": {"shell": "/bin/sh"}, "default_metadata": {"sandbox-api": "x"}},
        "other": 3,
    }
    assert resolve_provider_config("sandbox", merged) == {"local": {"shell": "/bin/sh"}}
    assert resolve_provider_metadata("sandbox", merged) == {"sandbox-api": "x"}
    assert resolve_provider_config({"local": {}}) == {"local": {}}
    assert resolve_provider_metadata({"local": {}}) == {}
    with pytest.raises(ValueError, match=r"'sandboxx' is not defined.*Available sandbox configs: 'sandbox'"):
        resolve_provider_config("sandboxx", merged)
    with pytest.raises(ValueError, match="exactly one provider key"):
        resolve_provider_config({"local": {}, "docker": {}})
    with pytest.raises(TypeError, match="sandbox_provider must be"):
        resolve_provider_config(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown sandbox provider 'nope'. Available providers: .*local"):
        create_provider({"nope": {}})
    with pytest.raises(ValueError, match="already registered"):
        register_provider("local", LocalProvider)


def test_spec_and_resources_validate_like_nemo_gym():
    spec = SandboxSpec(resources={"cpu": 2, "memory_mib": "512"}, ports=["8080", 9000])
    assert spec.resources == SandboxResources(cpu=2.0, memory_mib=512)
    assert spec.ports == (8080, 9000)
    with pytest.raises(ValueError, match="Unknown sandbox resource keys: ram"):
        SandboxSpec(resources={"ram": 1})
    with pytest.raises(ValueError, match="Duplicate sandbox TCP port: 80"):
        SandboxSpec(ports=[80, 80])
    with pytest.raises(ValueError, match="between 1 and 65535"):
        SandboxSpec(ports=[0])
    with pytest.raises(ValueError, match="absolute URL"):
        SandboxEndpoint("localhost")
    assert cpu_cap_env(None) == {} and set(cpu_cap_env(2.7)) == set(CPU_CAP_ENV_VARS)
    assert set(cpu_cap_env(0.5).values()) == {"1"}


async def test_local_sandbox_lifecycle_files_exec_and_counts(tmp_path: Path):
    before = sandbox_counts()
    spec = SandboxSpec(workdir="/workspace", env={"GREETING": "hi"}, files={"src/a.txt": "from spec"})
    async with AsyncSandbox(LOCAL, spec) as box:
        assert await box.status() is SandboxStatus.UNKNOWN
        started = time.perf_counter()
        await box.start()
        assert time.perf_counter() - started < 2.0  # a directory, not a container
        assert await box.status() is SandboxStatus.RUNNING
        result = await box.exec(
            "cat src/a.txt; echo; echo $GREETING $EXTRA; echo err >&2; exit 3", env={"EXTRA": "x"}
        )
        assert (result.stdout, result.stderr, result.return_code, result.error_type) == (
            "from spec\nhi x\n",
            "err\n",
            3,
            None,
        )
        (tmp_path / "in.txt").write_text("uploaded")
        await box.upload(tmp_path / "in.txt", "/workspace/deep/dir/in.txt")  # the workdir maps to the tree
        result = await box.exec("cat in.txt && cp in.txt out.txt", cwd="/workspace/deep/dir")
        assert result.stdout == "uploaded" and result.return_code == 0
        await box.download("deep/dir/out.txt", tmp_path / "got" / "out.txt")
        assert (tmp_path / "got" / "out.txt").read_text() == "uploaded"
        with pytest.raises(PermissionError, match="outside the local sandbox's working tree"):
            await box.upload(tmp_path / "in.txt", "/etc/cron.d/x")
        with pytest.raises(ValueError, match="not declared in SandboxSpec.ports"):
            await box.endpoint(8080)
        assert sandbox_counts()["active"] == before["active"] + 1
    assert await box.status() is SandboxStatus.STOPPED
    after = sandbox_counts()
    assert (after["started"] - before["started"], after["stopped"] - before["stopped"]) == (1, 1)
    with pytest.raises(RuntimeError, match="Sandbox has been stopped"):
        await box.start()


async def test_limits_from_the_spec_are_enforced():
    spec = SandboxSpec(resources={"memory_mib": 256, "disk_gib": 1})
    provider = LocalProvider(default_timeout_s=20, disk_mib=8)
    async with AsyncSandbox(provider, spec) as box:
        await box.start()
        memory = await box.exec("python3 -c 'x = bytearray(1 << 30)'")
        assert memory.return_code != 0 and "MemoryError" in (memory.stderr or "")
        started = time.perf_counter()
        nap = f"sleep {30 + os.getpid() % 1000}.{time.monotonic_ns() % 997}"  # unique to this run
        slow = await box.exec(f"{nap} & {nap}; echo never", timeout_s=1)
        assert slow.error_type == "timeout" and slow.return_code == 125 and "never" not in (slow.stdout or "")
        assert time.perf_counter() - started < 8
        assert not _processes_running(nap)  # the whole group is gone, the background one too
    # disk_gib from the spec wins over the provider's default: 1 GiB here, 8 MiB below
    async with AsyncSandbox(provider, SandboxSpec()) as small:
        await small.start()
        many = "for i in $(seq 100); do head -c 1000000 /dev/zero > f$i; sleep 0.01; done; echo done"
        full = await small.exec(many, timeout_s=20)
        if provider.kernel_limits["tmpfs"]:  # the kernel refuses the 9th MB: the command's own failure
            assert full.error_type is None and "No space left on device" in (full.stderr or "")
            used = await small.exec("du -sk . | cut -f1")
            assert int(used.stdout or "0") <= 8 * 1024
        else:  # the poll kills the command once the tree passed the quota
            assert (full.error_type, full.return_code) == ("disk_quota", 125)
            assert "done" not in (full.stdout or "") and "8 MiB" in (full.stderr or "")


async def test_pause_stops_running_commands_and_resume_lets_them_finish():
    async with AsyncSandbox(LOCAL, SandboxSpec()) as box:
        await box.start()
        run = asyncio.create_task(
            box.exec("for i in 1 2 3 4 5 6; do echo $i >> ticks; sleep 0.1; done; echo ok")
        )
        for _ in range(200):  # until the command is under way (slow on a loaded machine)
            await asyncio.sleep(0.05)
            if await asyncio.to_thread(_read_ticks, box):
                break
        await box.pause()
        assert await box.status() is SandboxStatus.PAUSED
        with pytest.raises(RuntimeError, match="paused"):
            await box.exec("true")
        await asyncio.sleep(0.5)
        ticks = (await asyncio.to_thread(_read_ticks, box)).count("\n")
        await box.resume()
        assert (await run).stdout == "ok\n"
        assert ticks < 6


def _read_ticks(box: AsyncSandbox) -> str:
    tree = box._require_handle().raw.tree
    return Path(tree, "ticks").read_text() if Path(tree, "ticks").exists() else ""


async def test_a_sandbox_is_stopped_at_its_ttl():
    box = AsyncSandbox(LOCAL, SandboxSpec(ttl_s=0.3))
    await box.start()
    tree = box._require_handle().raw.root
    for _ in range(100):
        await asyncio.sleep(0.05)
        if await box.status() is SandboxStatus.STOPPED and not os.path.exists(tree):
            break
    assert await box.status() is SandboxStatus.STOPPED
    assert not os.path.exists(tree)


def test_the_blocking_sandbox_does_the_same():
    with Sandbox(LOCAL, SandboxSpec(files={"x": "1"})) as box:
        box.start()
        assert box.exec("cat x").stdout == "1"
        assert box.status() is SandboxStatus.RUNNING
    assert box.status() is SandboxStatus.STOPPED


def _processes_running(pattern: str) -> bool:
    import psutil

    return any(pattern in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


async def test_each_local_sandbox_has_its_own_tmp():
    provider = LocalProvider(default_timeout_s=20)
    if not provider._private_tmp:
        pytest.skip("a private /tmp needs a root server on Linux with trees outside /tmp")
    marker = f"/tmp/ng_private_{os.getpid()}_{time.monotonic_ns()}"
    spec = SandboxSpec(files={f"{marker}/driver.py": "print('driver ran')"})
    async with (
        AsyncSandbox(provider, spec, owns_provider=False) as one,
        AsyncSandbox(provider, SandboxSpec()) as two,
    ):
        await one.start()
        await two.start()
        assert (
            await one.exec(f"python3 {marker}/driver.py && echo one > {marker}/x")
        ).stdout == "driver ran\n"
        assert (await two.exec(f"cat {marker}/x || echo absent")).stdout == "absent\n"
        assert not os.path.exists(marker)  # nothing reached the host's /tmp


async def test_the_command_limit_holds_across_providers_built_per_sandbox():
    boxes = [AsyncSandbox({"local": {"concurrency": 1}}, SandboxSpec()) for _ in range(2)]
    for box in boxes:
        await box.start()
    started = time.perf_counter()
    results = await asyncio.gather(*(box.exec("sleep 0.6; echo done") for box in boxes))
    assert [r.stdout for r in results] == ["done\n", "done\n"]
    assert time.perf_counter() - started >= 1.2  # one after the other
    for box in boxes:
        await box.stop()


def test_nemo_gym_providers_not_shipped_validate_by_name_and_refuse_to_make_a_sandbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.6.0's and 0.7.0's pinchbench check ``sandbox_provider: {opensandbox: {}}`` at config
    time (``get_provider_class``), as NeMo Gym's lazily imported providers allow."""
    from nemo_gym.sandbox.providers import registry
    from nemo_gym.sandbox.providers.base import SandboxCreateError

    for name in ("opensandbox", "e2b", "daytona", "enroot", "openshell", "ecs_fargate"):
        cls = get_provider_class(name)
        assert isinstance(cls, type) and name in (cls.__doc__ or "")
        with pytest.raises(
            SandboxCreateError, match=rf"'{name}' .*not implemented.*use one of apptainer, docker"
        ):
            create_provider({name: {"api_key": "x"}})
    assert "opensandbox" not in list_providers()  # listed are the ones that make sandboxes
    # A provider registered (or published) under the name is the one used.
    monkeypatch.setattr(registry, "_registered", {})
    register_provider("opensandbox", LocalProvider)
    assert get_provider_class("opensandbox") is LocalProvider


async def test_a_local_handle_answers_nemo_gyms_raw_keys(tmp_path: Path):
    # NeMo Gym's local handles are dicts; its agents' tests read handle.raw["workspace"].
    provider = LocalProvider(workspace_root=str(tmp_path))
    handle = await provider.create(SandboxSpec(image=""))
    try:
        result = await provider.exec(handle, "mkdir -p logs && echo 1 > logs/reward.txt")
        assert result.return_code == 0, result.stderr
        workspace = handle.raw["workspace"]
        assert isinstance(workspace, Path)
        assert (workspace / "logs" / "reward.txt").read_text() == "1\n"
        assert handle.raw["owned"] is True and handle.raw["env"]["HOME"].startswith(str(workspace))
        with pytest.raises(KeyError, match="'workspace', 'env' and 'owned'"):
            handle.raw["root"]
    finally:
        await provider.close(handle)
    assert not workspace.exists()
