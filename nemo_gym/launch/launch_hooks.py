"""How one server process is started: NeMo Gym's two launch hooks, ``setup_env_command`` and ``run_command``.

The launcher builds a shell command for each server,
``<setup_env_command(...)> && NEMO_GYM_CONFIG_PATH=<instance> exec <python> <app.py>``, and hands
it to ``run_command(command, server_dir)``, which returns the started ``subprocess.Popen``. A
trainer can replace either hook (verifiers replaces both on ``nemo_gym.cli`` to keep its own
proxy as ``policy_model``): a ``run_command`` that returns anything but a ``Popen`` gives that
instance no process, and the launcher registers it at its configured host:port as an
external endpoint.

NeMo Gym's ``run_command`` has no parameter for the process environment, so the launcher sets
the environment and working directory of the server being launched in :data:`current_launch`
around the call; a replacement hook that calls the original still starts the server correctly.
"""

from __future__ import annotations

import contextvars
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_CONFIG_PATH = "NEMO_GYM_CONFIG_PATH"  # NeMo Gym's variable naming the instance a process serves


@dataclass(frozen=True)
class LaunchSettings:
    """The environment and working directory of the server process being launched.

    ``stdin_payload`` (config and secrets as JSON) is written to the process's stdin, which is
    then closed: secrets never sit in its environment. A replacement ``run_command`` that starts
    the process itself must deliver it the same way.
    """

    env: Mapping[str, str]
    cwd: str
    stdin_payload: bytes | None = None


current_launch: contextvars.ContextVar[LaunchSettings | None] = contextvars.ContextVar(
    "nemo_gym_current_launch", default=None
)


@dataclass(frozen=True)
class LaunchHooks:
    """The two functions every server start goes through (NeMo Gym's signatures)."""

    setup_env_command: Callable[[Path, Any, str], str]
    run_command: Callable[[str, Path], Any]


def setup_env_command(dir_path: Path, global_config_dict: Any, prefix: str) -> str:
    """The shell command that prepares a server's Python environment: nothing to do here.

    Every bundled server runs in this process's own environment (one ``pip install`` serves
    them all), so NeMo Gym's per-server venv keys ``uv_venv_dir``, ``uv_cache_dir`` and
    ``skip_venv_if_present`` have no effect. Returns a no-op command.
    """
    return "true"


def server_command(setup: str, instance_name: str, python: str, entrypoint: Path) -> str:
    """The full shell command that starts one server (setup first, then the server itself)."""
    return (
        f"{setup} && {ENV_CONFIG_PATH}={shlex.quote(instance_name)} "
        f"exec {shlex.quote(python)} {shlex.quote(str(entrypoint))}"
    )


def die_with_parent() -> None:
    """In the child before exec: SIGTERM it if the launching process dies (even by kill -9)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_command(command: str, working_dir_path: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` with bash in its own process group; output (stdout + stderr) is piped.

    Environment and working directory come from the launch in progress (:data:`current_launch`);
    called on its own it runs in ``working_dir_path`` with that folder on ``PYTHONPATH``.
    """
    launch = current_launch.get()
    if launch is None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(working_dir_path), env.get("PYTHONPATH", "")) if p
        )
        launch = LaunchSettings(env, str(working_dir_path))
    process = subprocess.Popen(
        ["/bin/bash", "-c", command],
        env=dict(launch.env),
        cwd=launch.cwd,
        stdin=subprocess.DEVNULL if launch.stdin_payload is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
    )
    if launch.stdin_payload is not None:
        write_stdin_payload(process, launch.stdin_payload)
    return process


def write_stdin_payload(process: subprocess.Popen[bytes], payload: bytes) -> None:
    """Write ``payload`` to the process's stdin and close it, in a thread (a payload larger than
    the pipe buffer waits for the child to start reading; the launcher must not)."""

    def write() -> None:
        assert process.stdin is not None
        try:
            process.stdin.write(payload)
            process.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the child died first: the launcher reports that

    threading.Thread(target=write, name="nemo_gym-launch-payload", daemon=True).start()


DEFAULT_HOOKS = LaunchHooks(setup_env_command=setup_env_command, run_command=run_command)
