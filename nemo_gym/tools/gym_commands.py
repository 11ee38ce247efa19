"""The table of ``gym``'s groups and commands: each command's ``ng_*`` target, summary and flags.

:mod:`nemo_gym.tools.gym_cli` dispatches over it. A command names its entry point as
``module:function`` (imported only when run), the ``ng_*`` command it stands for, and the NeMo Gym
0.7.0 flags it accepts (``--flag value`` becomes ``+key=value``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """A NeMo Gym style ``--flag value`` and the override it becomes."""

    flag: str
    key: str
    text: str = ""
    """What it does, in the help; none: the override it becomes (``+key``), which says it."""
    takes_value: bool = True
    aliases: tuple[str, ...] = ()
    """Other spellings (``-o`` for ``--output``)."""
    const: str = "true"
    """The value a flag without one stands for (``--json`` of ``gym env packages``: ``json``)."""
    quote: bool = False
    """Pass the value as a string, never a number (``--agent-version 1.10`` stays ``"1.10"``)."""


@dataclass(frozen=True)
class Subcommand:
    """``gym <group> <name>``: runs ``target`` (``module:function`` of an ``ng_*`` command)."""

    name: str
    target: str
    command: str
    summary: str
    positional: str | tuple[str, ...] | None = None
    """What bare positional arguments mean: ``entrypoint`` (an environment name), or the keys
    they fill (``("component_type", "query")``: one argument fills the last key)."""
    keys: tuple[tuple[str, str], ...] = ()
    """Flags whose override key differs for this command (``ng_viewer`` reads ``+input``)."""
    raw: bool = False
    """The command parses its own arguments (and ``--help``): they pass through untranslated."""
    flags: tuple[Flag, ...] = ()
    """The command's own ``--flag``s (NeMo Gym 0.7.0's); none: the shared :data:`FLAGS`."""


FLAGS = (
    Flag("--config", "config_paths", "a config file to add to +config_paths (repeatable)"),
    Flag(
        "--resources-server",
        "config_paths",
        "an environment by name: adds resources_servers/NAME/configs/NAME.yaml",
    ),
    Flag(
        "--model-type",
        "config_paths",
        "a model server by name: adds responses_api_models/NAME/configs/NAME.yaml",
    ),
    Flag("--agent", "agent_name"),
    Flag("--input", "input_jsonl_fpath"),
    Flag("--output", "output_jsonl_fpath"),
    Flag("--limit", "limit"),
    Flag("--num-repeats", "num_repeats"),
    Flag("--benchmark", "benchmark"),
    Flag(
        "--available",
        "available",
        "gym list environments/agents/models: what the nemo-gym wheel offers (optionally: VERSION)",
        False,
    ),
    Flag(
        "--no-serve",
        "",
        "gym eval run: use the running stack (ng_collect_rollouts) instead of starting one",
        False,
    ),
)
_JSON = Flag("--json", "json", "print JSON", False)
_CONFIG_FLAGS = FLAGS[:3]
_SERVER_FOLDER = Flag(
    "--resources-server", "entrypoint", "the resources server: +entrypoint=resources_servers/NAME"
)


GROUPS: dict[str, tuple[str, tuple[Subcommand, ...]]] = {
    "env": (
        "run and check environments",
        (
            Subcommand("start", "nemo_gym.cli:ng_run", "ng_run", "start the servers of a config"),
            Subcommand(
                "status", "nemo_gym.cli:ng_status", "ng_status", "show the head server and running servers"
            ),
            Subcommand(
                "test",
                "nemo_gym.tools.authoring:ng_test",
                "ng_test",
                "test environments (all if none is named)",
                "entrypoint",
            ),
            Subcommand(
                "init",
                "nemo_gym.tools.scaffold:ng_init_resources_server",
                "ng_init_resources_server",
                "scaffold a new environment",
                "entrypoint",
            ),
            Subcommand("resolve", "nemo_gym.cli:ng_dump_config", "ng_dump_config", "print the merged config"),
            Subcommand(
                "pull",
                "nemo_gym.tools.env_pull:ng_pull_environment",
                "ng_pull_environment",
                "bring one of NeMo Gym's environments in by name (NAME[==VERSION])",
            ),
            Subcommand(
                "validate",
                "nemo_gym.tools.env_validate:ng_validate",
                "ng_validate",
                "check a config, its servers and datasets without starting anything",
                flags=_CONFIG_FLAGS,
            ),
            Subcommand(
                "schema",
                "nemo_gym.tools.env_schema:ng_env_schema",
                "ng_env_schema",
                "print a resources server's task-data schema as JSON Schema",
                "entrypoint",
                flags=(_SERVER_FOLDER,),
            ),
            Subcommand(
                "packages",
                "nemo_gym.tools.env_packages:ng_pip_list",
                "ng_pip_list",
                "the Python packages a resources server runs with",
                "entrypoint",
                flags=(
                    _SERVER_FOLDER,
                    Flag("--outdated", "outdated", "only outdated packages", False),
                    Flag("--json", "format", "print JSON (+format=json)", False, const="json"),
                ),
            ),
        ),
    ),
    "eval": (
        "collect rollouts and score them",
        (
            Subcommand(
                "run",
                "nemo_gym.rollout_collection:ng_e2e_collect_rollouts",
                "ng_e2e_collect_rollouts",
                "start the servers, collect rollouts, stop (--no-serve: on a running stack)",
            ),
            Subcommand(
                "aggregate",
                "nemo_gym.rollout_collection:ng_aggregate_rollouts",
                "ng_aggregate_rollouts",
                "merge sharded rollout results and compute metrics",
            ),
            Subcommand(
                "reverify",
                "nemo_gym.tools.reverify:ng_reverify_rollouts",
                "ng_reverify_rollouts",
                "re-score rollouts with the current environment and report what changed",
            ),
            Subcommand(
                "certify",
                "nemo_gym.tools.certify_harness:ng_certify_harness",
                "ng_certify_harness",
                "certificate of RL fidelity for a harness on an engine (prefix, loss mask, log-probs)",
            ),
            Subcommand(
                "profile",
                "nemo_gym.reward_profile:ng_reward_profile",
                "ng_reward_profile",
                "per-task pass rate and reward variance; tasks always or never solved",
            ),
            Subcommand(
                "prepare",
                "nemo_gym.tools.benchmarks:ng_prepare_benchmark",
                "ng_prepare_benchmark",
                "write a benchmark's rows to disk",
            ),
            Subcommand(
                "compare",
                "nemo_gym.tools.compare_runs:ng_compare_runs",
                "ng_compare_runs",
                "a baseline run against candidate runs: metric deltas and flipped tasks",
                flags=(
                    Flag("--baseline", "baseline_rollouts_jsonl_fpath"),
                    Flag("--candidates", "candidate_rollouts_jsonl_fpaths"),
                    Flag("--baseline-agg-metrics", "baseline_aggregate_metrics_fpath"),
                    Flag("--candidates-agg-metrics", "candidate_aggregate_metrics_fpaths"),
                    Flag("--agent", "agent_name"),
                    Flag("--baseline-agent", "baseline_agent_name"),
                    Flag(
                        "--candidate-agents",
                        "candidate_agent_names",
                        "+candidate_agent_names (comma-separated)",
                    ),
                    Flag("--output-dir", "output_dirpath", aliases=("-o",)),
                    Flag("--report-format", "report_format", "+report_format (md, json, both)"),
                ),
            ),
            Subcommand(
                "health-check",
                "nemo_gym.tools.health_check:ng_health_check",
                "ng_health_check",
                "check the rollouts of a run folder; writes quality_summary.json",
                ("run_dir",),
                flags=(
                    Flag("--rollouts-file", "rollout_file", "+rollout_file (relative to RUN_DIR)"),
                    Flag("--workers", "workers"),
                    Flag(
                        "--ignore-checks",
                        "ignored_checks",
                        "+ignored_checks (comma-separated)",
                        aliases=("--ignore",),
                    ),
                    Flag("--json", "json", "print the summary as JSON", False),
                ),
            ),
            Subcommand(
                "export",
                "nemo_gym.tools.atif_export:ng_export_atif",
                "ng_export_atif",
                "export rollouts as ATIF trajectories (--format atif)",
                flags=(
                    Flag("--format", "format", "+format (atif)"),
                    Flag("--rollouts", "rollouts_jsonl_fpath"),
                    Flag("--output-dir", "output_dirpath", "+output_dirpath (a new folder)"),
                    Flag("--session-id", "session_id", quote=True),
                    Flag("--agent-version", "agent_version", quote=True),
                ),
            ),
            Subcommand(
                "submit",
                "nemo_gym.orchestration.commands:eval_submit",
                "",
                "submit a collection to Slurm (--config PATH [--dry-run])",
                raw=True,
            ),
            Subcommand(
                "status", "nemo_gym.orchestration.commands:eval_status", "", "a submission's jobs", raw=True
            ),
            Subcommand(
                "logs", "nemo_gym.orchestration.commands:eval_logs", "", "a submission's logs", raw=True
            ),
            Subcommand(
                "cancel", "nemo_gym.orchestration.commands:eval_cancel", "", "scancel a submission", raw=True
            ),
            Subcommand(
                "resume",
                "nemo_gym.orchestration.commands:eval_resume",
                "",
                "submit again what ended unfinished",
                raw=True,
            ),
        ),
    ),
    "list": (
        "discover what is bundled",
        (
            Subcommand(
                "environments",
                "nemo_gym.tools.gym_cli:list_environments",
                "",
                "environments (resources servers)",
            ),
            Subcommand(
                "resources-servers",
                "nemo_gym.tools.catalog_search:ng_list_resources_servers",
                "ng_list_resources_servers",
                "resources servers with their domain; NAME shows one",
                ("component_name",),
                flags=(
                    _JSON,
                    Flag("--available", "available", "what the nemo-gym wheel offers ([VERSION])", False),
                ),
            ),
            Subcommand("agents", "nemo_gym.tools.gym_cli:list_agents", "", "agent harnesses"),
            Subcommand("models", "nemo_gym.tools.gym_cli:list_models", "", "model servers"),
            Subcommand(
                "benchmarks",
                "nemo_gym.tools.benchmarks:ng_list_benchmarks",
                "ng_list_benchmarks",
                "benchmarks",
            ),
        ),
    ),
    "dataset": (
        "validate and collate datasets",
        (
            Subcommand(
                "collate",
                "nemo_gym.tools.prepare_data:ng_prepare_data",
                "ng_prepare_data",
                "validate a config's datasets and collate them (+mode=...)",
            ),
            Subcommand(
                "render",
                "nemo_gym.tools.dataset_render:ng_materialize_prompts",
                "ng_materialize_prompts",
                "apply a prompt template to raw rows (a dataset preview)",
                flags=(
                    Flag("--input", "input_jsonl_fpath", aliases=("-i",)),
                    Flag("--prompt-config", "prompt_config"),
                    Flag("--output", "output_jsonl_fpath", aliases=("-o",)),
                ),
            ),
            *(
                Subcommand(name, f"nemo_gym.tools.dataset_remote:{command}", command, summary)
                for name, command, summary in (
                    (
                        "upload",
                        "ng_upload_dataset_to_hf",
                        "NeMo Gym's registry upload (not here: says what to use)",
                    ),
                    ("download", "ng_download_dataset_from_hf", "NeMo Gym's registry download (not here)"),
                    ("rm", "ng_delete_dataset_from_gitlab", "NeMo Gym's registry delete (not here)"),
                    ("migrate", "ng_gitlab_to_hf_dataset", "NeMo Gym's GitLab to HF move (not here)"),
                )
            ),
        ),
    ),
    "search": (
        "find environments, agents, models or benchmarks by text",
        (
            Subcommand(
                "",
                "nemo_gym.tools.catalog_search:ng_search",
                "ng_search",
                "search components: gym search [TYPE] QUERY",
                ("component_type", "query"),
                flags=(_JSON,),
            ),
        ),
    ),
    "dev": (
        "contributor helpers",
        (
            Subcommand(
                "test",
                "nemo_gym.tools.dev_test:ng_dev_test",
                "ng_dev_test",
                "run the framework's tests with pytest",
                ("paths",),
                flags=(
                    Flag("--keyword", "keyword", "+keyword (pytest -k)", aliases=("-k",)),
                    Flag("--coverage", "coverage", "+coverage=true", False),
                ),
            ),
        ),
    ),
    "view": (
        "browse rollouts in a web page",
        (
            Subcommand(
                "",
                "nemo_gym.viewer:ng_viewer",
                "ng_viewer",
                "browse rollouts in a web page",
                keys=(("--input", "input"),),
            ),
        ),
    ),
    "version": (
        "print the version",
        (Subcommand("", "nemo_gym.cli:ng_version", "ng_version", "print the version"),),
    ),
}
