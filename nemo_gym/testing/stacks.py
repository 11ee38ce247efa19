"""Whole stacks from config files: started with ``ng_run``'s machinery (or ``ng_run`` itself), collected on."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.launch.config import load_config, project_root
from nemo_gym.launch.launcher import StackHandle

# The deterministic scripted test model's config, relative to the project root.
SCRIPTED_MODEL_CONFIG = "responses_api_models/scripted_model/configs/scripted_model.yaml"


@contextlib.contextmanager
def running_stack(
    config_paths: Sequence[str], overrides: Sequence[str] = (), **stack_kwargs: Any
) -> Iterator[StackHandle]:
    """Start a stack from config files on a free head port; stop it when the block ends."""
    argv = ["+config_paths=[" + ",".join(config_paths) + "]", "++head_server.port=0", *overrides]
    handle = StackHandle.start(load_config(argv), **stack_kwargs)
    try:
        yield handle
    finally:
        handle.stop()


@contextlib.contextmanager
def ng_run_process(
    config_paths: Sequence[str],
    overrides: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout_s: float = 90.0,
    cwd: str | Path | None = None,
) -> Iterator[tuple[Any, str]]:
    """``ng_run`` as a real subprocess (console script of this interpreter) on a free head port,
    run in ``cwd`` (default: this project, where relative config paths and folders resolve).

    Yields ``(process, head_url)`` once it reports every server healthy; stops it (SIGINT, then
    SIGKILL) when the block ends. Its output is drained by a thread so it never blocks on a pipe.
    """
    import re
    import signal
    import subprocess

    argv = [
        str(Path(sys.executable).parent / "ng_run"),
        "+config_paths=[" + ",".join(config_paths) + "]",
        "++head_server.port=0",
        *overrides,
    ]
    proc = subprocess.Popen(
        argv, cwd=cwd or project_root(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    ready = threading.Event()
    found: list[str] = []

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            match = re.search(r"Head server: (http://\S+)", line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not ready.wait(timeout_s) or not found:
            raise AssertionError("ng_run did not report healthy:\n" + "".join(lines[-60:]))
        yield proc, found[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        reader.join(5)


def collect_with_stack(
    config_paths: Sequence[str],
    *,
    agent_name: str | None,
    input_jsonl_fpath: str | Path,
    output_jsonl_fpath: str | Path,
    **fields: Any,
) -> tuple[Any, list[dict[str, Any]]]:
    """Start a stack from config files, collect rollouts on a JSONL file, stop it.

    Returns the collection summary and the result rows. ``fields`` are further collector
    arguments (``num_repeats``, ``limit``, ...).
    """
    from nemo_gym.rollout_collection import RolloutCollectionHelper

    config = {
        "agent_name": agent_name,
        "input_jsonl_fpath": str(input_jsonl_fpath),
        "output_jsonl_fpath": str(output_jsonl_fpath),
        **fields,
    }
    with running_stack(config_paths) as handle:
        summary = asyncio.run(
            RolloutCollectionHelper().run_from_config(
                {**config, "head_server": handle.head_server_config}, verbose=False
            )
        )
    output = Path(output_jsonl_fpath)
    rows = (
        [orjson.loads(line) for line in output.read_bytes().splitlines() if line.strip()]
        if output.exists()
        else []
    )
    return summary, rows


def collect_examples(
    environment_folder: str | Path,
    output_jsonl_fpath: str | Path,
    *extra_config_paths: str | Path,
    route_by_agent_ref: bool = False,
    agent: str = "simple_agent",
    **fields: Any,
) -> tuple[Any, list[dict[str, Any]]]:
    """An environment's end-to-end check: its ``data/example.jsonl`` through the scripted model.

    The stack is ``configs/<env>.yaml``, the scripted model and ``configs/scripted_policy.yaml``
    (the environment's own scripts), then ``extra_config_paths``. Rows go to
    ``<env>_<agent>`` (``agent`` defaults to ``simple_agent``), or with ``route_by_agent_ref`` to the agent each row's ``agent_ref``
    names (no fallback). ``fields`` are further collector arguments. Returns what
    :func:`collect_with_stack` does.
    """
    folder = Path(environment_folder)
    configs = [
        str(folder / "configs" / f"{folder.name}.yaml"),
        SCRIPTED_MODEL_CONFIG,
        str(folder / "configs" / "scripted_policy.yaml"),
        *map(str, extra_config_paths),
    ]
    return collect_with_stack(
        configs,
        # None is the collector's own default: no fallback agent, rows route by agent_ref.
        agent_name=None if route_by_agent_ref else f"{folder.name}_{agent}",
        input_jsonl_fpath=folder / "data" / "example.jsonl",
        output_jsonl_fpath=output_jsonl_fpath,
        **fields,
    )


def collector_argv(head_port: int, agent: str, source: Path, out: Path, *options: str) -> list[str]:
    """The command line of ``ng_collect_rollouts`` (as a module of this Python) against a running stack."""
    return [
        sys.executable,
        "-m",
        "nemo_gym.rollout_collection",
        f"++head_server.port={head_port}",
        f"+agent_name={agent}",
        f"+input_jsonl_fpath={source}",
        f"+output_jsonl_fpath={out}",
        *options,
    ]
