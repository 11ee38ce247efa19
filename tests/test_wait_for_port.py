"""``wait_for_port``: the one wait the benchmark scripts use before driving a server they start."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
import time

import pytest

from nemo_gym.launch.config import project_root
from nemo_gym.launch.launcher import free_port, wait_for_port


def test_it_returns_once_a_late_server_listens() -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", f"import socket, time; time.sleep(0.5); s = socket.create_server(('127.0.0.1', {port})); time.sleep(30)"]
    )  # fmt: skip
    try:
        started = time.monotonic()
        wait_for_port(port, timeout_s=20)
        assert time.monotonic() - started >= 0.3  # it waited for the bind, not returned early
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        server.kill()
        server.wait()


def test_it_raises_naming_the_address_when_nothing_listens() -> None:
    port = free_port()
    with pytest.raises(TimeoutError, match=f"nothing listening on 127.0.0.1:{port} after 0.3 s"):
        wait_for_port(port, timeout_s=0.3)


def test_no_script_keeps_a_copy_of_its_own() -> None:
    """The scripts import it (one copy returned silently on a timeout, another raised)."""
    copies = [
        path.name
        for path in sorted((project_root() / "scripts").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name in ("wait_for_port", "free_port")
    ]
    assert copies == []
