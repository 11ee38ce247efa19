"""The ``apptainer`` provider, driven through the sandbox API against a fake ``apptainer`` on
``PATH`` (Apptainer is not installed here): a real executable that keeps instances in a state
folder, runs ``exec`` commands with ``sh`` on this machine (bind mounts emulated by rewriting
their in-container paths to the host folders) and logs every command line it was given."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, SandboxStatus, create_provider
from nemo_gym.sandbox.providers.apptainer import (
    ApptainerCreateError,
    ApptainerCreateVerificationError,
    ApptainerProvider,
)

FAKE_APPTAINER = r"""#!PYTHON
import json, os, shlex, subprocess, sys
from pathlib import Path

state = Path(os.environ["FAKE_APPTAINER_STATE"])
(state / "instances").mkdir(parents=True, exist_ok=True)
args = sys.argv[1:]
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps(args) + "\n")
VALUED = {"--bind", "--cpus", "--memory", "--env-file", "--pwd", "--no-mount"}

def fatal(message):
    print(f"FATAL:   {message}", file=sys.stderr)
    sys.exit(255)

def parse(rest):
    flags, positional, i = {}, [], 0
    while i < len(rest):
        if rest[i] in VALUED:
            flags.setdefault(rest[i], []).append(rest[i + 1])
            i += 2
        elif rest[i].startswith("--"):
            flags.setdefault(rest[i], []).append(True)
            i += 1
        else:
            positional = rest[i:]
            break
    return flags, positional

if args[:2] == ["instance", "start"]:
    flags, (image, name) = parse(args[2:])
    if "broken" in image:
        fatal(f"could not open image {image}")
    binds = [b.split(":")[:2] for b in flags.get("--bind", [])]
    (state / "instances" / f"{name}.json").write_text(json.dumps({"image": image, "binds": binds}))
elif args[:2] == ["instance", "list"]:
    names = [p.stem for p in (state / "instances").glob("*.json")]
    print(json.dumps({"instances": [{"instance": n, "pid": 1, "img": ""} for n in names]}))
elif args[:2] == ["instance", "stop"]:
    record = state / "instances" / f"{args[2]}.json"
    if not record.exists():
        fatal(f"no instance found with name {args[2]}")
    record.unlink()
elif args[0] == "exec":
    flags, positional = parse(args[1:])
    name = positional[0].removeprefix("instance://")
    record = state / "instances" / f"{name}.json"
    if not record.exists():
        fatal(f"no instance found with name {name}")
    binds = sorted(json.loads(record.read_text())["binds"], key=lambda b: -len(b[1]))
    def host(text):
        for source, target in binds:
            text = text.replace(target, source)
        return text
    env = {"PATH": os.environ["PATH"]}
    for env_file in flags.get("--env-file", []):
        for line in Path(env_file).read_text().splitlines():
            key, _, value = line.partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    if "--fakeroot" in flags:
        env["FAKEROOT"] = "1"
    cwd = host(flags["--pwd"][0]) if "--pwd" in flags else None
    if cwd is not None and not os.path.isdir(cwd):
        fatal(f"could not set working directory {flags['--pwd'][0]}")
    sys.exit(subprocess.run(["sh", "-c", host(positional[-1])], cwd=cwd, env=env).returncode)
else:
    fatal(f"unexpected command {args}")
"""


@pytest.fixture
def fake_apptainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apptainer"
    script.write_text(FAKE_APPTAINER.replace("PYTHON", sys.executable, 1))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    state = tmp_path / "state"
    monkeypatch.setenv("FAKE_APPTAINER_STATE", str(state))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return state


def _calls(state: Path) -> list[list[str]]:
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def test_without_apptainer_the_provider_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="needs the `apptainer` command, and there is none on PATH"):
        create_provider({"apptainer": {}})
    with pytest.raises(RuntimeError, match=r"none in bin_path='/nowhere'"):
        ApptainerProvider(bin_path="/nowhere")


async def test_a_sandbox_lifecycle_through_the_cli(fake_apptainer: Path, tmp_path: Path):
    opt = tmp_path / "opt"
    opt.mkdir()
    config = {
        "apptainer": {
            "exec": {"default_binds": [f"{opt}:/opt"], "extra_exec_args": ["--cleanenv"]},
            "create": {"extra_start_args": ["--writable-tmpfs"]},
        }
    }
    spec = SandboxSpec(
        image="ubuntu:22.04",
        workdir="/sandbox/work",
        env={"API_TOKEN": "s3cret value"},
        files={"in.txt": "hello"},
        resources={"cpu": 2, "memory_mib": 512},
    )
    box = AsyncSandbox(config, spec)
    await box.start()
    name = box.sandbox_id
    staging = box._require_handle().raw.staging_dir
    try:
        start = next(c for c in _calls(fake_apptainer) if c[:2] == ["instance", "start"])
        assert start[-2:] == ["docker://ubuntu:22.04", name]
        assert start[2:6] == ["--bind", f"{staging}:/sandbox", "--bind", f"{opt}:/opt"]
        assert (
            ["--cpus", "2"] == start[6:8]
            and ["--memory", "512M"] == start[8:10]
            and "--writable-tmpfs" in start
        )
        assert (staging / "work" / "in.txt").read_text() == "hello"  # written on the host side
        result = await box.exec('cat in.txt; echo " $API_TOKEN"; echo err >&2; exit 3')
        assert (result.stdout, result.stderr, result.return_code) == ("hello s3cret value\n", "err\n", 3)
        assert all("s3cret" not in " ".join(c) for c in _calls(fake_apptainer))  # never on a command line
        assert "--cleanenv" in _calls(fake_apptainer)[-1]
        root = await box.exec("echo $FAKEROOT", user="root")
        assert root.stdout == "1\n"
        other = await box.exec("true", user="alice")
        assert other.error_type == "sandbox" and "user='alice'" in (other.stderr or "")
        # Outside the staging folder: through the folder and a cp inside the instance.
        source = tmp_path / "up.txt"
        source.write_text("payload")
        await box.upload(source, "/opt/data/up.txt")
        assert (opt / "data" / "up.txt").read_text() == "payload"
        await box.download("/opt/data/up.txt", tmp_path / "back.txt")
        assert (tmp_path / "back.txt").read_text() == "payload"
        assert not list(staging.glob(".transfer-*"))
        with pytest.raises(OSError, match="download of /opt/missing.txt failed"):
            await box.download("/opt/missing.txt", tmp_path / "x.txt")
        (staging / "leak").symlink_to("/etc/hostname")
        with pytest.raises(PermissionError, match="leads out of the sandbox's staging folder"):
            await box.download("/sandbox/leak", tmp_path / "leak.txt")
        started = time.monotonic()
        slow = await box.exec("sleep 30", timeout_s=0.5)
        assert slow.error_type == "timeout" and slow.return_code == 125 and time.monotonic() - started < 20
        assert await box.status() is SandboxStatus.RUNNING
    finally:
        await box.stop()
    assert ["instance", "stop", name] in _calls(fake_apptainer)
    assert not staging.exists() and not list((fake_apptainer / "instances").iterdir())


async def test_failures_to_start_or_answer_are_create_errors(fake_apptainer: Path, tmp_path: Path):
    with pytest.raises(
        ApptainerCreateError, match=r"instance start of '/images/broken.sif' failed \(exit 255: FATAL"
    ):
        await AsyncSandbox({"apptainer": {}}, SandboxSpec(image="/images/broken.sif")).start()
    provider = ApptainerProvider(probe={"command": "echo not-ready", "deadline_s": 0.5})
    with pytest.raises(ApptainerCreateVerificationError, match="did not pass the readiness probe"):
        await AsyncSandbox(provider, SandboxSpec(image="docker://busybox")).start()
    # A failed start leaves no instance and no staging folder behind.
    assert not list((fake_apptainer / "instances").iterdir())
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("nemo-gym-*-*/"))
    with pytest.raises(ApptainerCreateError, match="needs SandboxSpec.image"):
        await provider.create(SandboxSpec())


def test_config_sections_are_checked():
    with pytest.raises(ValueError, match="mount_point must be an absolute path"):
        ApptainerProvider(create={"mount_point": "sandbox"})
    with pytest.raises(TypeError):
        ApptainerProvider(exec={"no_such_field": 1})
