"""Escape attempts against the ``local`` sandbox provider, each made by a real command inside it.

code_gen's adversarial programs (the same confinement) plus what a shell can try: other users'
and other sandboxes' files, the server's network and processes, namespaces, ptrace, symlinks
planted for the host to follow, fork bombs. Every case asserts the attempt failed *and* that its
effect is absent on the host.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec
from nemo_gym.sandbox.providers.local import LocalProvider

IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def provider() -> LocalProvider:
    return LocalProvider(default_timeout_s=10, processes=64, memory_mib=512, disk_mib=64)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A host directory every user may read and write: only the sandbox stops them."""
    # Not under /tmp: each sandbox has its own /tmp, which would hide the directory altogether.
    path = Path(tempfile.mkdtemp(prefix="ng_escape_", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on 127.0.0.1 that records anything that reaches it."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    got: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            got.append(b"connected")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], got
    stop.set()
    thread.join()
    server.close()


async def run(
    provider: LocalProvider, command: str, timeout_s: float = 8, **spec: object
) -> tuple[str, str, int, str | None]:
    async with AsyncSandbox(provider, SandboxSpec(**spec), owns_provider=False) as box:  # type: ignore[arg-type]
        await box.start()
        result = await box.exec(command, timeout_s=timeout_s)
    return result.stdout or "", result.stderr or "", result.return_code, result.error_type


async def test_commands_run_as_nobody_with_an_environment_of_their_own(provider: LocalProvider, monkeypatch):
    monkeypatch.setenv("NG_TEST_SECRET_TOKEN", "do-not-leak")
    out, _, code, _ = await run(provider, "id -u; env")
    expected = provider.run_as[0] if provider.run_as else os.geteuid()
    assert code == 0 and out.splitlines()[0] == str(expected)
    if IS_ROOT:
        assert provider.run_as is not None, "a root server must run sandboxes as an unprivileged user"
    assert "do-not-leak" not in out and "NG_TEST_SECRET_TOKEN" not in out


@pytest.mark.parametrize(
    "name, command, expect",
    [
        ("infinite loop", "python3 -c 'while True: pass'", "timeout"),
        ("10 GB allocation", "python3 -c 'x = bytearray(10 * 1024 ** 3); print(len(x))'", "MemoryError"),
        ("output flood", "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "output_limit"),
        ("new network namespace", "unshare -n true && echo escaped", "unshare"),
        ("mount", "mount -t tmpfs none .tmp && echo escaped", "mount"),
        ("ptrace", "strace -f true && echo escaped", "strace"),
        ("raise a limit", "ulimit -u unlimited && echo escaped", "ulimit"),
    ],
)
async def test_code_gen_style_attacks_are_contained(
    provider: LocalProvider, name: str, command: str, expect: str
):
    out, err, code, error_type = await run(provider, command, timeout_s=3)
    assert "escaped" not in out, name
    assert code != 0, name
    assert expect in f"{error_type} {err}", (name, err[-300:])


async def test_files_outside_the_tree_can_neither_be_read_nor_written(
    provider: LocalProvider, open_dir: Path
):
    secret = open_dir / "answers.txt"
    secret.write_text("the expected outputs")
    secret.chmod(0o666)
    target = open_dir / "escaped.txt"
    out, err, code, _ = await run(
        provider, f"cat {secret}; echo x > {target}; echo x >> {secret}; ls /root /etc/shadow"
    )
    assert "the expected outputs" not in out
    assert err.count("Permission denied") >= 3, err
    assert not target.exists() and secret.read_text() == "the expected outputs"


async def test_one_sandbox_cannot_see_another(provider: LocalProvider):
    async with AsyncSandbox(provider, SandboxSpec(), owns_provider=False) as first:
        await first.start()
        await first.exec("echo private > mine.txt")
        first_tree = first._require_handle().raw.tree
        out, err, code, _ = await run(provider, f"cat {first_tree}/mine.txt; ls {first_tree}")
        assert "private" not in out and code != 0 and "Permission denied" in err


async def test_the_network_is_off_unless_the_spec_asks_for_it(provider: LocalProvider, listener):
    port, got = listener
    connect = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\""
    out, err, code, _ = await run(provider, connect)
    assert "connected" not in out and code != 0 and got == []
    out, _, code, _ = await run(provider, connect, provider_options={"network": True})
    assert (out, code) == ("connected\n", 0) and got == [b"connected"]


async def test_the_server_and_other_processes_cannot_be_signalled(provider: LocalProvider):
    victim = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        out, err, code, _ = await run(provider, f"kill -9 {victim.pid} {os.getpid()} && echo escaped")
        assert "escaped" not in out and code != 0
        assert victim.returncode is None and psutil.pid_exists(victim.pid)
    finally:
        victim.kill()
        await victim.wait()


async def test_symlinks_planted_in_the_tree_are_not_followed_by_the_host(
    provider: LocalProvider, open_dir: Path, tmp_path: Path
):
    host_file = open_dir / "host.txt"
    host_file.write_text("host data")
    host_file.chmod(0o644)
    async with AsyncSandbox(provider, SandboxSpec(), owns_provider=False) as box:
        await box.start()
        plant = f"ln -s {host_file} leak.txt; ln -s {open_dir} out; mkdir -p real; ln -s /etc/passwd real/pw"
        assert (await box.exec(plant)).return_code == 0
        for remote in ("leak.txt", "real/pw", "out/host.txt"):
            with pytest.raises(PermissionError, match="symlink"):
                await box.download(remote, tmp_path / "got.txt")
        assert not (tmp_path / "got.txt").exists()
        (tmp_path / "payload").write_text("overwritten")
        for remote in ("leak.txt", "out/host.txt", "out/new.txt"):
            with pytest.raises(PermissionError, match="symlink"):
                await box.upload(tmp_path / "payload", remote)
        assert host_file.read_text() == "host data" and not (open_dir / "new.txt").exists()


@pytest.mark.skipif(
    IS_ROOT and not LocalProvider(default_timeout_s=1).run_as, reason="no unprivileged user here"
)
async def test_a_fork_bomb_is_contained_and_leaves_nothing(provider: LocalProvider):
    marker = f"bomb_{uuid.uuid4().hex[:8]}"
    out, _, code, error_type = await run(
        provider, f"cat > {marker}.sh <<'EOF'\nb() {{ b | b & }}; b\nEOF\nbash {marker}.sh", timeout_s=3
    )
    assert code != 0
    await asyncio.sleep(0.2)
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    # The bomb's processes count against the sandbox user's process limit until the kernel has
    # reaped them all (slower on a loaded machine): the provider must serve again within seconds.
    deadline = time.monotonic() + 10
    while True:
        out, _, code, _ = await run(provider, "echo still serving")
        if (out, code) == ("still serving\n", 0) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert (out, code) == ("still serving\n", 0)
