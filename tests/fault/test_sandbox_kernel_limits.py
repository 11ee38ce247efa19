"""The local sandbox's disk, file and process limits hold against real commands trying to pass them.

Each attack is a shell command run in a real sandbox (a confined subprocess as user ``nobody``):
``fallocate`` of many quota-sized files, tens of thousands of empty files, a fork storm, one
sandbox holding its processes while another works, a command forging the sandbox's own failure
marker. Where the kernel holds the limits (a sized tmpfs per tree and a pids cgroup per sandbox:
a root server with a writable pids hierarchy) they must hold exactly; the polling fallback
(``kernel_limits: off``) must still count empty files, never stall the event loop, and report a
burst that passed the quota even when the server was too starved to walk the tree meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nemo_gym.sandbox.isolation import kernel_limits
from nemo_gym.sandbox.isolation.runner import _reachable_by_others
from nemo_gym.sandbox.providers.base import SandboxSpec
from nemo_gym.sandbox.providers.local.provider import LocalProvider

MIB = 1024 * 1024
SUPPORT = kernel_limits.machine_support()
needs_tmpfs = pytest.mark.skipif(not SUPPORT.tmpfs, reason=SUPPORT.why_not.get("tmpfs", ""))
needs_cgroup = pytest.mark.skipif(SUPPORT.pids_root is None, reason=SUPPORT.why_not.get("pids_cgroup", ""))


def tree_usage(path: str) -> tuple[int, int]:
    """Bytes allocated and entries under ``path``, measured from the host."""
    used = entries = 0
    for base, dirs, files in os.walk(path):
        for name in dirs + files:
            entries += 1
            st = os.lstat(os.path.join(base, name))
            used += st.st_blocks * 512
    return used, entries


async def _open(provider: LocalProvider):
    handle = await provider.create(SandboxSpec())
    return handle, handle.raw.tree


@needs_tmpfs
async def test_fallocate_of_many_quota_sized_files_cannot_pass_the_quota():
    provider = LocalProvider(default_timeout_s=30, disk_mib=16, inodes=4096)
    handle, tree = await _open(provider)
    try:
        # 64 files of 16 MiB each, allocated at once: 64x the quota if the quota were polled.
        result = await provider.exec(
            handle, "for i in $(seq 64); do fallocate -l 16M f$i; done; echo finished"
        )
        assert result.error_type is None and "finished" in (result.stdout or "")
        assert "No space left on device" in (result.stderr or "")
        used, _ = tree_usage(tree)
        assert used <= 16 * MIB
        # A single write past it fails too, and the sandbox still works afterwards.
        over = await provider.exec(handle, "head -c 20000000 /dev/zero > big; echo $?")
        assert over.stdout and over.stdout.strip() != "0" and tree_usage(tree)[0] <= 16 * MIB
        again = await provider.exec(handle, "rm -f f* big && echo ok > small && cat small")
        assert (again.stdout, again.return_code) == ("ok\n", 0)
    finally:
        await provider.close(handle)
    assert not os.path.exists(tree)


@needs_tmpfs
async def test_sixty_thousand_empty_files_stop_at_the_inode_limit():
    provider = LocalProvider(default_timeout_s=60, disk_mib=64, inodes=2000)
    handle, tree = await _open(provider)
    try:
        make = "python3 -c \"\nimport os\nn=0\nfor i in range(60000):\n    try: open(f'e{i}','w').close(); n+=1\n    except OSError as e: print('refused', e.strerror); break\nprint('made', n)\""
        result = await provider.exec(handle, make)
        assert result.error_type is None, result
        assert "refused No space left on device" in (result.stdout or "")
        made = int((result.stdout or "").split("made")[1])
        _, entries = tree_usage(tree)
        assert made < 2000 and entries <= 2000
    finally:
        await provider.close(handle)


@needs_cgroup
async def test_a_fork_storm_cannot_pass_the_sandbox_process_limit():
    provider = LocalProvider(default_timeout_s=20, processes=24)
    handle, _ = await _open(provider)
    cgroup = handle.raw.cgroup
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, len(kernel_limits.cgroup_pids(cgroup)))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        storm = (
            'python3 -c "\nimport os, time\nmade = refused = 0\nfor i in range(200):\n'
            "    try: pid = os.fork()\n    except OSError: refused += 1; continue\n"
            '    if pid == 0: time.sleep(3); os._exit(0)\n    made += 1\nprint(made, refused)"'
        )
        result = await provider.exec(handle, storm, timeout_s=15)
        made, refused = map(int, (result.stdout or "0 0").split())
        # The supervisor, the shell's python and its children share 24: the rest were refused.
        assert made < 24 and refused == 200 - made and result.error_type is None
        assert 0 < peak <= 24
        with open(os.path.join(cgroup, "pids.max")) as f:
            assert f.read().strip() == "24"
    finally:
        watcher.cancel()
        await provider.close(handle)
    assert not os.path.exists(cgroup)  # the cgroup goes with the sandbox


@needs_cgroup
async def test_one_sandbox_holding_its_processes_does_not_starve_another():
    provider = LocalProvider(default_timeout_s=30, processes=16)
    hog, _ = await _open(provider)
    other, _ = await _open(provider)
    try:
        # The hog fills its own limit with sleepers and keeps them while the other sandbox works.
        hold = asyncio.create_task(
            provider.exec(hog, "for i in $(seq 64); do sleep 8 & done 2>/dev/null; sleep 8", timeout_s=20)
        )
        deadline = time.monotonic() + 10
        while len(kernel_limits.cgroup_pids(hog.raw.cgroup)) < 16 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(kernel_limits.cgroup_pids(hog.raw.cgroup)) == 16
        for _ in range(3):
            result = await provider.exec(other, "a=$(echo x); b=$(echo y); echo $a$b")
            assert (result.stdout, result.return_code, result.error_type) == ("xy\n", 0, None)
        hold.cancel()
    finally:
        await provider.close(hog)
        await provider.close(other)


@needs_cgroup
async def test_a_refused_fork_in_the_supervisor_is_a_sandbox_failure_not_an_exit_status():
    # A limit of one process: the supervisor itself fits, the command it forks does not.
    provider = LocalProvider(default_timeout_s=10, processes=1)
    handle, _ = await _open(provider)
    try:
        result = await provider.exec(handle, "echo never")
        assert (result.return_code, result.error_type) == (125, "sandbox")
        assert "fork refused" in (result.stderr or "") and result.stdout is None
    finally:
        await provider.close(handle)


async def test_a_command_cannot_forge_the_sandbox_failure_marker():
    provider = LocalProvider(default_timeout_s=10)
    handle, _ = await _open(provider)
    try:
        forged = "echo '__NG_SANDBOX__ sandbox setup failed: not really' >&2; exit 20"
        result = await provider.exec(handle, forged)
        assert (result.return_code, result.error_type) == (20, None)  # the command's own status
    finally:
        await provider.close(handle)


async def test_the_polling_fallback_counts_empty_files_and_never_stalls_the_event_loop():
    provider = LocalProvider(default_timeout_s=60, disk_mib=512, inodes=1000, kernel_limits="off")
    assert provider.kernel_limits == {"tmpfs": False, "pids_cgroup": None}
    handle, tree = await _open(provider)
    try:
        # Empty files count: 5000 of them pass a limit of 1000 files and the command is stopped.
        many = "python3 -c \"\nimport time\nfor i in range(5000): open(f'e{i}','w').close()\ntime.sleep(5); print('kept')\""
        result = await provider.exec(handle, many)
        assert result.error_type == "disk_quota" and "kept" not in (result.stdout or "")
        # A big tree is walked every 20 ms, in a thread: the loop keeps its pace meanwhile.
        await provider.exec(handle, "rm -f e*")
        other = LocalProvider(default_timeout_s=60, disk_mib=4096, inodes=200_000, kernel_limits="off")
        big = await other.create(SandboxSpec())
        try:
            fill = "python3 -c \"\nfor i in range(60000): open(f'e{i}','w').close()\""
            assert (await other.exec(big, fill)).return_code == 0
            lags: list[float] = []

            async def ticker() -> None:
                while True:
                    before = time.monotonic()
                    await asyncio.sleep(0.01)
                    lags.append(time.monotonic() - before - 0.01)

            tick = asyncio.create_task(ticker())
            slept = await other.exec(big, "sleep 2; echo awake")
            tick.cancel()
            assert slept.stdout == "awake\n"
            lags.sort()
            assert len(lags) > 50 and lags[len(lags) // 2] < 0.05, lags[-5:]
        finally:
            await other.close(big)
    finally:
        await provider.close(handle)


async def test_a_burst_past_the_polled_quota_is_reported_even_when_the_server_misses_every_walk():
    # A starved server (a loaded machine) can miss every walk while a command passes the quota
    # and exits: the tree is checked once more when the command ends, so that is never a success.
    provider = LocalProvider(default_timeout_s=60, disk_mib=512, inodes=300, kernel_limits="off")
    handle, tree = await _open(provider)
    try:
        burst = ": > started; until [ -e go ]; do sleep 0.01; done; for i in $(seq 2000); do : > e$i; done; echo made"
        run = asyncio.create_task(provider.exec(handle, burst))
        while not os.path.exists(os.path.join(tree, "started")):
            await asyncio.sleep(0.01)
        Path(tree, "go").touch()
        deadline = time.monotonic() + 30
        # The event loop is blocked (no walk can start) until the burst has finished.
        while time.monotonic() < deadline and len(os.listdir(tree)) < 2002:
            time.sleep(0.05)
        time.sleep(0.5)
        result = await run
        assert "made" in (result.stdout or "")  # it ran to the end: no walk stopped it
        assert result.error_type == "disk_quota", result
    finally:
        await provider.close(handle)


@needs_cgroup
async def test_commands_running_at_once_in_one_sandbox_do_not_kill_each_other():
    # They share the sandbox's cgroup: it is emptied only once the last of them has returned.
    provider = LocalProvider(default_timeout_s=20)
    handle, _ = await _open(provider)
    try:
        long = asyncio.create_task(provider.exec(handle, "sleep 1.5; echo long done"))
        for _ in range(3):
            assert (await provider.exec(handle, "echo short")).stdout == "short\n"
        assert (await long).stdout == "long done\n"
        assert kernel_limits.cgroup_pids(handle.raw.cgroup) == []
    finally:
        await provider.close(handle)


NOT_ROOT_RUN = r"""
import asyncio, json, os, sys
sys.path.insert(0, sys.argv[1])
from nemo_gym.sandbox.providers.base import SandboxSpec
from nemo_gym.sandbox.providers.local.provider import LocalProvider
async def main():
    p = LocalProvider(workspace_root=sys.argv[2] + "/trees", disk_mib=8, inodes=300)
    h = await p.create(SandboxSpec())
    # Still running once past the quota (a walk must find it), then it would say so.
    many = await p.exec(h, "for i in $(seq 2000); do : > e$i; done; sleep 30; echo made")
    await p.close(h)
    print(json.dumps({"limits": p.kernel_limits, "error_type": many.error_type, "made": "made" in (many.stdout or "")}))
asyncio.run(main())
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to become nobody"
)
def test_a_server_that_is_not_root_falls_back_to_polling_and_says_so():
    repo = str(Path(__file__).resolve().parents[2])
    if not _reachable_by_others(os.path.join(repo, "nemo_gym", "__init__.py")):
        pytest.skip(f"user nobody cannot read the repository at {repo}")
    tmp_path = Path(tempfile.mkdtemp(prefix="ng_not_root_", dir="/var/tmp"))
    os.chmod(tmp_path, 0o777)
    env = {"NEMO_GYM_SANDBOX_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", NOT_ROOT_RUN]
    try:
        out = subprocess.run(
            [*argv, repo, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {
        "limits": {"tmpfs": False, "pids_cgroup": None},
        "error_type": "disk_quota",
        "made": False,
    }
    assert "sandbox tmpfs unavailable" in out.stderr and "polled every 20 ms" in out.stderr
    assert "RLIMIT_NPROC per user" in out.stderr
