"""Compatibility: Console entry points: ``ng_run``, ``ng_status``, ``ng_dump_config``, ``ng_version``.

Commands that belong to one subsystem live beside it (``ng_collect_rollouts`` in
``nemo_gym.rollout_collection``); all are wrapped by :func:`nemo_gym.console.command.console_command`.

Also NeMo Gym's trainer-facing names at their NeMo Gym path (NeMo RL, verl and verifiers import
them from ``nemo_gym.cli``): :class:`RunHelper`, ``GlobalConfigDictParserConfig`` and the launch
hooks ``setup_env_command`` / ``run_command`` (see the end of this module).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from nemo_gym.console.command import console_command
from nemo_gym.console.command_help import wants_help
from nemo_gym.global_config import GlobalConfigDictParserConfig
from nemo_gym.launch.config import dump_yaml, head_url_from_config, load_config
from nemo_gym.launch.launch_hooks import LaunchHooks, run_command, setup_env_command
from nemo_gym.serving.protocol import take_auth_token_from_environment

__all__ = ["GlobalConfigDictParserConfig", "RunHelper", "run_command", "setup_env_command"]


def _run(argv: list[str]) -> int:
    from nemo_gym.launch.launcher import Stack, StackError
    from nemo_gym.launch.ray_backend import default_backend
    from nemo_gym.serving.uvicorn_factory import loop_factory

    # The token moves out of the environment before anything is started: children (and Ray's
    # processes) never inherit it; servers get it on stdin.
    take_auth_token_from_environment()
    config = load_config(argv)

    async def main() -> int:
        stack = Stack(config, backend=default_backend(config))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stack.request_stop)
        try:
            await stack.start()
            print(stack.table(), flush=True)
            print(
                f"All {stack.server_count} servers healthy in {stack.startup_seconds:.2f}s. Head server: {stack.head_url}",
                flush=True,
            )
            await stack.wait()
            print("Stopping all servers...", flush=True)
            return 0
        except StackError as exc:
            sys.stderr.write(f"ng_run: {exc}\n")
            return 1
        finally:
            await stack.stop()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main())


def _status(argv: list[str]) -> int:
    import aiohttp

    from nemo_gym.serving.server import auth_headers
    from nemo_gym.serving.server_client import ServerCallError, ServerClient

    config = load_config(argv)
    head_url = head_url_from_config(config)

    async def main() -> int:
        client = ServerClient(head_url, timeout_s=5, connect_retries=1)
        try:
            instances = await client.server_instances()
        except ServerCallError as exc:
            sys.stderr.write(
                f"ng_status: no head server at {head_url} ({exc}); start one with ng_run, or point "
                "head_server.port (or NEMO_GYM_HEAD_PORT, or env.yaml) at the running one\n"
            )
            return 1
        finally:
            await client.close()
        rows = [("NAME", "KIND", "URL", "PID", "HEALTH")]
        unhealthy = 0
        async with aiohttp.ClientSession(headers=auth_headers()) as http:
            # The head server answered the registry call above; its liveness answer names its pid.
            head_pid = "-"
            try:
                async with http.get(head_url + "/", timeout=aiohttp.ClientTimeout(total=3)) as resp:
                    head_pid = str((await resp.json()).get("pid", "-"))
            except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
                pass
            rows.append(("head_server", "head", head_url, head_pid, "healthy"))
            for info in sorted(instances, key=lambda i: i.name):
                try:
                    async with http.get(info.url + "/", timeout=aiohttp.ClientTimeout(total=3)) as resp:
                        health = "healthy" if resp.status == 200 else f"HTTP {resp.status}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    health = f"unreachable ({type(exc).__name__})"
                unhealthy += health != "healthy"
                rows.append((info.name, info.server_type, info.url, str(info.pid), health))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        print(f"head server {head_url}: {len(instances)} instances, {unhealthy} unhealthy")
        return 1 if unhealthy else 0

    return asyncio.run(main())


def _dump_config(argv: list[str]) -> int:
    config = load_config(argv)
    if not config:
        sys.stderr.write(
            f"ng_dump_config: the config is empty: no +config_paths=[...], no overrides, and no env.yaml in "
            f"{os.getcwd()}\n"
        )
        return 1
    print(dump_yaml(config), end="")
    return 0


def _version(argv: list[str]) -> int:
    import platform

    from nemo_gym import __version__

    print(f"nemo_gym {__version__} (Python {platform.python_version()})")
    return 0


_ng_run = console_command(_run, "ng_run")


def ng_run(argv: Sequence[str] | None = None) -> None:
    """``ng_run``: start a stack from config. As the process's own command (no ``argv``) it first
    re-executes itself without ``NEMO_GYM_AUTH_TOKEN`` in its environment (see
    :func:`~nemo_gym.serving.protocol.take_auth_token_from_environment`)."""
    if argv is None and not wants_help(sys.argv[1:]):
        take_auth_token_from_environment(reexec_argv=sys.orig_argv[1:])
    _ng_run(argv)


ng_run.command_name = "ng_run"  # type: ignore[attr-defined]
ng_status = console_command(_status, "ng_status")
ng_dump_config = console_command(_dump_config, "ng_dump_config")
ng_version = console_command(_version, "ng_version")


# ---- NeMo Gym's trainer-facing runner ---------------------------------------------------------
# Looked up on this module at each launch, so a trainer that replaces nemo_gym.cli.setup_env_command
# or nemo_gym.cli.run_command (verifiers, to keep its own proxy as policy_model) is honoured.
_CLI_LAUNCH_HOOKS = LaunchHooks(
    setup_env_command=lambda dir_path, config, prefix: setup_env_command(dir_path, config, prefix),
    run_command=lambda command, dir_path: run_command(command, dir_path),
)


class RunHelper:
    """NeMo Gym's in-process stack runner (NeMo RL, verl and verifiers call it), over :class:`~nemo_gym.launch.launcher.StackHandle`.

    ``start(global_config_dict_parser_config)`` composes the global config, starts the head
    server and every server through this module's launch hooks, and returns once all are
    healthy. ``poll()`` raises, naming the server, when the head server or a server process has
    died; ``shutdown()`` stops everything. ``_server_client`` (read by clients) carries
    ``head_server_config`` and ``global_config_dict``.
    """

    def __init__(self) -> None:
        self._handle: Any = None
        self._server_client: Any = None

    def start(self, global_config_dict_parser_config: GlobalConfigDictParserConfig | None = None) -> None:
        """Start every configured server; returns once all are healthy (raises naming a server that is not)."""
        from omegaconf import OmegaConf

        from nemo_gym import global_config, server_utils
        from nemo_gym.launch.launcher import StackHandle
        from nemo_gym.launch.ray_backend import default_backend

        global_config.set_global_config_dict(global_config_dict_parser_config)
        config_dict = global_config.get_global_config_dict()
        config = OmegaConf.to_container(config_dict, resolve=True)
        assert isinstance(config, dict)
        plain = {str(k): v for k, v in config.items()}
        self._handle = StackHandle.start(plain, backend=default_backend(plain, _CLI_LAUNCH_HOOKS))
        head = server_utils.BaseServerConfig(**self._handle.head_server_config)
        self._server_client = server_utils.ServerClient(
            head_server_config=head, global_config_dict=config_dict
        )

    def poll(self) -> None:
        """Raise ``StackError`` naming the server if the head server or any server process has died."""
        if self._handle is None:
            raise RuntimeError("RunHelper.poll() before start(): no servers are running")
        self._handle.poll()

    def shutdown(self) -> None:
        """Stop every server and the head server (safe to call twice, or after a failed start)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.stop()
