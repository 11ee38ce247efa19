"""Same-host hops over Unix sockets: each server also listens on a socket file named after its
loopback address and port, and a client calling that address uses the file when it is there.

A hop over a Unix socket skips the kernel's TCP/IP path (measured in docs/PERFORMANCE.md: about
a fifth of a hop's CPU, client and server together). Nothing else changes: the server still
binds and registers its TCP port, Host headers still name it, other nodes (and Ray actors bound
to a node's address) use TCP. The files live in a directory only this user can enter
(``$TMPDIR/nemo_gym-<uid>-<network namespace>``, mode 0700; each file 0600), so no other user of the machine can
connect through them. A file left by a killed server refuses connections; the client then uses
TCP. A program of this same user could still replace a file with a listener of its own, so a
client sends nothing on a new Unix connection until the kernel says (``SO_PEERCRED``) that the
process listening is the server registered for that address (:func:`nemo_gym.serving.hop_client.
check_unix_peer`); otherwise it uses TCP. Untrusted programs the stack runs (harness_agent's)
do not see these directories at all. ``NEMO_GYM_UNIX_SOCKETS=0`` turns both sides off.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import tempfile
from dataclasses import dataclass

from nemo_gym.serving.protocol import switched_on

ENV_UNIX_SOCKETS = "NEMO_GYM_UNIX_SOCKETS"
# Loopback names a client may be given for a server on this machine; "localhost" is looked up
# under the address servers bind.
_LOOPBACK = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1", "::1": "::1"}


def enabled() -> bool:
    """Whether servers bind, and clients use, Unix sockets for same-host hops."""
    return switched_on(ENV_UNIX_SOCKETS)


def socket_dir() -> str | None:
    """This user's private directory of socket files (created 0700), or None when it is not private."""
    # Named after the network namespace too: 127.0.0.1 of another namespace (a container sharing
    # this /tmp) is another machine's loopback.
    path = os.path.join(tempfile.gettempdir(), f"nemo_gym-{os.getuid()}-{_network_namespace()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    private = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077
    return path if private else None


def socket_dirs() -> list[str]:
    """Every socket directory of this user on this machine (any network namespace, under
    ``/tmp`` or ``$TMPDIR``): what an untrusted program run by this user must not see."""
    found = set()
    for place in {"/tmp", tempfile.gettempdir()}:
        with contextlib.suppress(OSError):
            for name in os.listdir(place):
                if name.startswith(f"nemo_gym-{os.getuid()}-"):
                    found.add(os.path.join(place, name))
    return sorted(found)


def _network_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return 0


def socket_path(directory: str, host: str, port: int) -> str:
    """The socket file of the server bound to ``host:port``."""
    return os.path.join(directory, f"{host.replace(':', '_')}-{port}.sock")


@dataclass(frozen=True)
class LocalSocket:
    """A server's listening Unix socket, its file, and the file's inode (to remove only its own)."""

    sock: socket.socket
    path: str
    inode: int

    def unlink(self) -> None:
        """Remove the file on shutdown, unless another server has replaced it since."""
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)


def bind(host: str, port: int) -> LocalSocket | None:
    """A listening Unix socket for the server bound to loopback ``host:port``, and its path.

    None when turned off, when ``host`` is not a loopback address, or when the file cannot be
    made (the server then serves TCP only). A stale file of the same name (a killed server
    that held this port before) is replaced: this process holds the port now.
    """
    if not enabled() or host not in ("127.0.0.1", "::1"):
        return None
    directory = socket_dir()
    if directory is None:
        return None
    remove_stale(directory)
    path = socket_path(directory, host, port)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(4096)
        sock.setblocking(False)
        inode = os.stat(path).st_ino
    except OSError:
        sock.close()
        return None
    return LocalSocket(sock, path, inode)


def remove_stale(directory: str, limit: int = 256) -> None:
    """Remove socket files nobody listens on any more (servers killed with SIGKILL leave them)."""
    try:
        names = [name for name in os.listdir(directory) if name.endswith(".sock")][:limit]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.setblocking(False)  # a live server with a full backlog: EAGAIN, not a wait
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            with contextlib.suppress(OSError):
                os.unlink(path)
        except OSError:
            pass
        finally:
            probe.close()


def path_for(host: str, port: int) -> str | None:
    """The socket file to reach loopback ``host:port`` through, when one is there; else None."""
    bound = _LOOPBACK.get(host)
    if bound is None or not enabled():
        return None
    directory = socket_dir()
    if directory is None:
        return None
    path = socket_path(directory, bound, port)
    return path if os.path.exists(path) else None
