"""A real container engine for tests and benchmarks: Debian's ``podman`` serving the Docker
Engine API on a private unix socket, with an image built offline from ``busybox-static``.

:func:`podman_engine` writes a ``containers.conf`` (``runc``, ``cgroupfs``, ulimits a container
without ``CAP_SYS_RESOURCE`` can apply) and a ``storage.conf`` (overlay storage under the given
directory), imports a busybox root file system as ``localhost/nemo-gym-test-busybox:latest``,
starts ``podman system service`` on ``<dir>/podman.sock`` and, on exit, stops it, kills the
``conmon`` processes it left (they linger ~300 s after an exec) by pid, unmounts and removes the
storage. Nothing is pulled: no registry is needed. :func:`why_no_podman` says why it cannot run
on this machine (``scripts/test.sh`` installs ``podman runc busybox-static`` as root when missing).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import struct
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

IMAGE = "localhost/nemo-gym-test-busybox:latest"
BUSYBOX_APPLETS = (
    "sh", "cat", "echo", "sleep", "ls", "mkdir", "rm", "head", "env", "id", "true", "false",
    "test", "tar", "wc", "kill", "ps", "dd", "seq", "touch", "df", "du", "chmod", "cp", "mv",
)  # fmt: skip


@dataclass(frozen=True)
class PodmanEngine:
    """A running engine: its API ``socket`` and a local ``image`` with busybox's tools."""

    socket: str
    image: str
    directory: str


def _busybox() -> str | None:
    for path in ("/bin/busybox", "/usr/bin/busybox"):
        if os.path.exists(path) and _is_static(path):
            return path
    return None


def _is_static(path: str) -> bool:
    """Whether an ELF executable needs no dynamic loader (no ``PT_INTERP`` program header)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return False
            (phoff,) = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))


def why_no_podman() -> str | None:
    """Why a podman engine cannot be started here, or None."""
    missing = [name for name in ("podman", "runc") if shutil.which(name) is None]
    if _busybox() is None:
        missing.append("busybox-static")
    if missing:
        return f"needs {' '.join(missing)} (apt-get install podman runc busybox-static; scripts/test.sh does as root)"
    if os.geteuid() != 0:
        return "the podman engine for tests runs as root (rootless podman needs subuid ranges set up)"
    return None


def _write_configs(directory: Path) -> dict[str, str]:
    (directory / "containers.conf").write_text(
        "[containers]\n"
        'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'tmp_dir = "{directory}/tmp"\n'
    )
    (directory / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{directory}/graph"\nrunroot = "{directory}/run"\n'
    )
    return {
        **os.environ,
        "CONTAINERS_CONF": str(directory / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(directory / "storage.conf"),
    }


def _image_tarball(directory: Path, busybox: str) -> Path:
    tarball = directory / "busybox-rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        for name in ("bin", "tmp", "work"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, "bin/busybox")
        for applet in BUSYBOX_APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    return tarball


def _ping(sock: str) -> bool:
    import socket as socket_module

    with contextlib.suppress(OSError), socket_module.socket(socket_module.AF_UNIX) as s:
        s.settimeout(1)
        s.connect(sock)
        s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
        return b" 200 " in s.recv(64)
    return False


@contextlib.contextmanager
def podman_engine(directory: str | os.PathLike[str], start_timeout_s: float = 30.0) -> Iterator[PodmanEngine]:
    """Start a private podman engine under ``directory`` (see the module docstring); raises
    ``RuntimeError`` naming the step that failed."""
    reason = why_no_podman()
    if reason is not None:
        raise RuntimeError(reason)
    root = Path(directory).resolve()
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    env = _write_configs(root)
    busybox = _busybox()
    assert busybox is not None
    imported = subprocess.run(
        ["podman", "import", str(_image_tarball(root, busybox)), IMAGE],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if imported.returncode != 0:
        raise RuntimeError(f"podman import failed: {imported.stderr.strip()[-500:]}")
    sock = str(root / "podman.sock")
    log = open(root / "service.log", "wb")  # noqa: SIM115 - closed below
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _ping(sock):
            if service.poll() is not None or time.monotonic() > deadline:
                text = (root / "service.log").read_text(errors="replace")[-500:]
                raise RuntimeError(f"podman system service did not come up: {text}")
            time.sleep(0.05)
        yield PodmanEngine(sock, IMAGE, str(root))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.pid, signal.SIGKILL)
        service.wait()
        log.close()
        _stop_leftovers(root, env)


def _stop_leftovers(root: Path, env: dict[str, str]) -> None:
    """Remove what the engine left: containers, ``conmon`` processes, overlay mounts, files."""
    subprocess.run(["podman", "rm", "-fa", "-t", "0"], env=env, capture_output=True, timeout=60)
    marker = str(root).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
    with contextlib.suppress(OSError):
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted(mounts, reverse=True):
            if mount.startswith(str(root) + "/"):
                subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
    shutil.rmtree(root, ignore_errors=True)
