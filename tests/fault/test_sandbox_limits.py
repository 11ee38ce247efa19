"""code_gen's sandbox: a total disk quota per run, and an unprivileged user for the code."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from nemo_gym.sandbox.isolation import kernel_limits
from nemo_gym.sandbox.isolation.runner import resolve_run_as
from resources_servers.code_gen.sandbox import CodeSandbox, RunStatus, SandboxLimits

WRITE_MANY = (
    "data = b'x' * (4 << 20)\n"
    "for i in range(100):\n"  # 400 MB in files of 4 MB, each under the per-file limit
    "    with open(f'f{i}', 'wb') as f:\n"
    "        f.write(data)\n"
    "print('wrote everything')\n"
)


@pytest.fixture
def open_work_root():
    """A work root every user can traverse to (pytest's own tmp dirs are private to root)."""
    root = tempfile.mkdtemp(prefix="ng_fault_sandbox_", dir="/tmp")
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_program_that_fills_the_disk_is_stopped_at_the_quota_by_the_poll(open_work_root: str):
    limits = SandboxLimits(disk_mb=16, file_size_mb=8)
    sandbox = CodeSandbox(limits, work_root=open_work_root, kernel_tmpfs=False)
    result = asyncio.run(sandbox.run(WRITE_MANY))
    assert result.status is RunStatus.OUTPUT_LIMIT
    assert "disk quota exceeded (16 MB" in result.message
    assert "wrote everything" not in result.stdout
    assert os.listdir(open_work_root) == []  # the run's files are gone


FALLOCATE_MANY = (
    "import os\nmade = 0\nfor i in range(64):\n    fd = os.open(f'f{i}', os.O_CREAT | os.O_WRONLY)\n"
    "    try:\n        os.posix_fallocate(fd, 0, 8 << 20); made += 1\n    except OSError as exc:\n"
    "        print('refused:', exc.strerror); break\n    finally:\n        os.close(fd)\n"
    "print('allocated', made)\n"
)


@pytest.mark.skipif(
    not kernel_limits.machine_support().tmpfs, reason="sized tmpfs needs a root server on Linux"
)
def test_fallocate_of_many_files_cannot_pass_a_kernel_quota(open_work_root: str):
    # 64 files of 8 MB allocated at once: a poll every 20 ms would let most land (64 x 8 MB).
    sandbox = CodeSandbox(SandboxLimits(disk_mb=16, file_size_mb=8), work_root=open_work_root)
    result = asyncio.run(sandbox.run(FALLOCATE_MANY))
    assert result.ok, result.message
    assert "refused: No space left on device" in result.stdout
    assert int(result.stdout.split("allocated")[1]) <= 2  # 16 MB hold two 8 MB files at most
    result = asyncio.run(sandbox.run(WRITE_MANY))
    assert result.status is RunStatus.RUNTIME_ERROR and "No space left on device" in result.message
    assert os.listdir(open_work_root) == []  # unmounted and removed


def test_a_program_under_the_quota_runs(open_work_root: str):
    sandbox = CodeSandbox(SandboxLimits(disk_mb=16, file_size_mb=8), work_root=open_work_root)
    result = asyncio.run(sandbox.run("open('a', 'wb').write(b'x' * (1 << 20)); print('ok')"))
    assert result.ok and result.stdout == "ok\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root switches to an unprivileged user")
def test_code_runs_as_nobody_when_root_and_nobody_can_reach_it(open_work_root: str):
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None or resolve_run_as("auto", [python], open_work_root) is None:
        pytest.skip("no interpreter that user 'nobody' can reach on this machine")
    sandbox = CodeSandbox(work_root=open_work_root, python=python)
    result = asyncio.run(sandbox.run("import os; print(os.getuid(), os.geteuid())"))
    assert result.ok, result.message
    uid = sandbox.run_as[0] if sandbox.run_as else None
    assert uid not in (None, 0) and result.stdout.split() == [str(uid), str(uid)]
    kept = CodeSandbox(work_root=open_work_root, python=python, uid="keep")
    assert asyncio.run(kept.run("import os; print(os.getuid())")).stdout.strip() == "0"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root switches to an unprivileged user")
def test_root_stays_root_with_a_warning_when_nobody_cannot_reach_the_work_root(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with caplog.at_level("WARNING", logger="nemo_gym.sandbox"):
        assert resolve_run_as("auto", ["/usr/bin/python3"], str(private)) is None
    assert "cannot reach" in caplog.text
    assert resolve_run_as(12345, ["/usr/bin/python3"], str(private))[0] == 12345
    with pytest.raises(ValueError, match="sandbox uid"):
        resolve_run_as("root", ["/usr/bin/python3"], str(private))
