"""The bodies of ``ng_collect_rollouts``, ``ng_aggregate_rollouts`` and ``ng_e2e_collect_rollouts``.

Each takes the command line (``+name=value`` overrides) and returns an exit code; the public
module :mod:`nemo_gym.rollout_collection` wraps them as console commands.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from nemo_gym.collection.collection_io import AGENT_KIND, CollectionPaths, scan_results
from nemo_gym.collection.collector import CollectionSummary
from nemo_gym.collection.helper import RolloutAggregationHelper, RolloutCollectionHelper
from nemo_gym.collection.settings import (
    E2ERolloutCollectionConfig,
    RolloutAggregationConfig,
    RolloutCollectionConfig,
)
from nemo_gym.launch.config import ConfigError, load_config, server_instances

EXIT_TOO_MANY_FAILURES = 3


def run_async(coro: Any) -> Any:
    """Run ``coro`` on a fresh event loop of the kind the servers use."""
    from nemo_gym.serving.uvicorn_factory import loop_factory

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)


def failure_exit_code(summary: CollectionSummary, max_failure_ratio: float) -> int:
    """0, or :data:`EXIT_TOO_MANY_FAILURES` (with a line on stderr) when more than
    ``max_failure_ratio`` of this run's rollouts failed."""
    ratio = summary.failure_ratio
    if ratio <= max_failure_ratio:
        return 0
    classes = ", ".join(f"{k}: {v}" for k, v in sorted(summary.failures_by_class.items()))
    if summary.malformed_lines:
        classes += (", " if classes else "") + f"malformed input lines: {summary.malformed_lines}"
    sys.stderr.write(
        f"ng_collect_rollouts: {ratio:.1%} of what this run tried failed ({classes}), above "
        f"+max_failure_ratio={max_failure_ratio:g}. Next: {summary.next_step()}.\n"
    )
    return EXIT_TOO_MANY_FAILURES


EXIT_INTERRUPTED = 130
_RESUME_OVERRIDE = re.compile(r"\+{0,2}resume_from_cache=")


def resume_command(argv: list[str]) -> str:
    """The command line that finishes an interrupted ``ng_collect_rollouts argv`` run, ready to paste."""
    kept = [arg for arg in argv if not _RESUME_OVERRIDE.match(arg)]
    return shlex.join(["ng_collect_rollouts", *kept, "+resume_from_cache=true"])


def interrupted_summary(argv: list[str], output_jsonl_fpath: str) -> str:
    """What a Ctrl-C left behind: the rows kept, where, and the exact command that resumes."""
    paths = CollectionPaths.for_output(output_jsonl_fpath)
    try:
        kept = scan_results(paths.output, repair=False).rows
    except (OSError, ValueError, ConfigError):  # a torn or foreign file: say nothing about rows
        kept = 0
    return (
        f"ng_collect_rollouts: interrupted; {kept} finished rollout(s) are kept in {paths.output}.\n"
        f"Resume (collects only what is missing):\n  {resume_command(argv)}\n"
    )


def collect_command(argv: list[str]) -> int:
    """``ng_collect_rollouts``: collect rollouts from a running stack."""
    config = load_config(argv)
    settings = RolloutCollectionConfig.from_config(config)
    try:
        summary = run_async(RolloutCollectionHelper().run_from_config(config))
    except KeyboardInterrupt:
        sys.stderr.write(interrupted_summary(argv, settings.output_jsonl_fpath))
        return EXIT_INTERRUPTED
    return failure_exit_code(summary, settings.max_failure_ratio)


def aggregate_command(argv: list[str]) -> int:
    """``ng_aggregate_rollouts``: merge result shards and compute their metrics."""
    config = load_config(argv)
    if not config.get("input_glob") or not config.get("output_jsonl_fpath"):
        raise ConfigError(
            "ng_aggregate_rollouts needs +input_glob='results/shard*.jsonl' and +output_jsonl_fpath=..."
        )
    settings = RolloutAggregationConfig.from_config(config)
    head = {"head_server": config.get("head_server") or {}}
    run_async(RolloutAggregationHelper(head).run_from_config(settings))
    return 0


def prepared_split(argv: list[str], settings: E2ERolloutCollectionConfig) -> Path:
    """The collated ``<split>.jsonl`` of the config's agent datasets, prepared as NeMo Gym does it:
    ``ng_prepare_data +mode=train_preparation`` into ``<output stem>/preprocessed_datasets`` (kept
    when ``reuse_existing_data_preparation`` and the file exists)."""
    folder = Path(settings.output_jsonl_fpath).with_suffix("") / "preprocessed_datasets"
    prepared = folder / f"{settings.split}.jsonl"
    if settings.reuse_existing_data_preparation and prepared.exists():
        print(f"Reusing the prepared {settings.split} data at {prepared}", flush=True)
        return prepared
    # ng_prepare_data is an application command (a layer above this one): run it as one.
    command = "from nemo_gym.tools.prepare_data import ng_prepare_data; ng_prepare_data()"
    options = ["+mode=train_preparation", f"++output_dirpath={folder}", "++should_download=true"]
    done = subprocess.run([sys.executable, "-c", command, *argv, *options], check=False)
    if done.returncode != 0:
        raise ConfigError(
            f"+split={settings.split}: preparing the data failed (ng_prepare_data exit {done.returncode}, above)"
        )
    if not prepared.exists():
        raise ConfigError(
            f"+split={settings.split}: no agent in this config lists a dataset of type {settings.split} "
            f"(nothing at {prepared}); add one to an agent's datasets, or pass +input_jsonl_fpath"
        )
    return prepared


def e2e_command(argv: list[str]) -> int:
    """``ng_e2e_collect_rollouts``: start the stack from ``config_paths``, collect, stop it."""
    from nemo_gym.launch.launcher import StackError, StackHandle
    from nemo_gym.launch.ray_backend import default_backend

    config = load_config(argv)
    if config.get("split") is not None and not config.get("input_jsonl_fpath"):
        config["input_jsonl_fpath"] = str(
            prepared_split(argv, E2ERolloutCollectionConfig.from_config(config))
        )
    agents = [i.name for i in server_instances(config).values() if i.type == AGENT_KIND]
    if not config.get("agent_name") and len(agents) == 1:
        config["agent_name"] = agents[0]  # rows without agent_ref go to the only agent
    settings = RolloutCollectionConfig.from_config(config)  # fail on bad arguments before starting anything
    head = dict(config.get("head_server") or {})
    head.setdefault("port", 0)  # a one-shot stack takes a free port unless told otherwise
    config["head_server"] = head
    # The same backend choice as ng_run: a config that asks for Ray places its servers on Ray.
    try:
        handle = StackHandle.start(config, backend=default_backend(config))
    except StackError as exc:
        # A server that dies at start is the config's or the environment's problem: say which
        # server and what it printed, as ng_run does, not a traceback of the launcher.
        sys.stderr.write(f"ng_e2e_collect_rollouts: {exc}\n")
        return 1
    try:
        config["head_server"] = handle.head_server_config
        summary = run_async(RolloutCollectionHelper().run_from_config(config))
    finally:
        handle.stop()
    return failure_exit_code(summary, settings.max_failure_ratio)
