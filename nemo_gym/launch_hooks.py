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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_CONFIG_PATH = "NEMO_GYM_CONFIG_PATH"  # NeMo Gym's variable naming the instance a process serves


@dataclass(frozen=True)
class LaunchSettings:
    """The environment and working directory of the server process being launched."""

    env: Mapping[str, str]
    cwd: str


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
    return subprocess.Popen(
        ["/bin/bash", "-c", command],
        env=dict(launch.env),
        cwd=launch.cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
    )


DEFAULT_HOOKS = LaunchHooks(setup_env_command=setup_env_command, run_command=run_command)
