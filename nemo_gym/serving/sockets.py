"""Listening sockets a server binds itself and keeps (no bind-then-release race)."""

from __future__ import annotations

import errno
import random
import socket


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind and listen on (host, port); port 0 takes a free port. The socket is kept, not released."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and without it every answer waits ~40 ms (Nagle holding the body behind a delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(
            exc.errno, f"cannot bind {host}:{port}: {exc.strerror} (is another server on that port?)"
        ) from exc
    sock.listen(4096)
    sock.setblocking(False)
    return sock


def bind_socket_in_range(host: str, low: int, high: int) -> socket.socket:
    """Bind a port in ``[low, high]`` (tried in random order), keeping the socket: no bind-then-release race."""
    if not 0 < low <= high < 65536:
        raise ValueError(f"port range [{low}, {high}] is not within 1-65535 with low <= high")
    ports = list(range(low, high + 1))
    random.shuffle(ports)
    for port in ports:
        try:
            return bind_socket(host, port)
        except OSError:
            continue
    raise OSError(errno.EADDRINUSE, f"no free port on {host} in the range [{low}, {high}]")
