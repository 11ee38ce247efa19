"""What every console command says to ``--help``: what it does, its options with defaults, an example.

One renderer (:meth:`CommandHelp.render`) and one table of commands (:data:`COMMANDS`), so
``ng_run --help``, ``gym env start --help`` and ``ng_run help`` print the same text. A command
with no entry here (a new one registered without a name) still answers ``--help`` with its
docstring.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

HELP_WORDS = ("--help", "-h", "help")


@dataclass(frozen=True)
class Option:
    """One command-line option: ``key`` as typed (``+agent_name``), its default, what it does."""

    key: str
    text: str
    default: str = ""


@dataclass(frozen=True)
class CommandHelp:
    """The help of one command."""

    name: str
    summary: str
    options: tuple[Option, ...] = ()
    examples: tuple[str, ...] = ()
    details: str = ""
    config_options: bool = True
    """Whether the command reads the composed config (``+config_paths``, ``env.yaml``, ``key=value``)."""
    head_port_default: str = "11000"
    """What ``head_server.port`` is when not set (a one-shot stack takes a free port)."""

    def render(self, prog: str | None = None, extra: str = "") -> str:
        """The help text, with ``prog`` as the name shown in the usage line (default: ``name``).

        ``extra`` (more sections) goes before the closing line.
        """
        prog = prog or self.name
        takes_args = self.config_options or bool(self.options)
        usage = f"usage: {prog}" + (" [key=value | +key=value | ++key=value ...]" if takes_args else "")
        lines = [usage, "", *textwrap.wrap(self.summary, width=100)]
        if self.details:
            lines += ["", textwrap.dedent(self.details).strip()]
        options = list(self.options)
        if self.config_options:
            options += [
                dataclasses.replace(o, default=self.head_port_default) if o.key == "head_server.port=N" else o
                for o in COMMON_OPTIONS
            ]
        if options:
            lines += ["", "options:"]
            width = min(max(len(o.key) for o in options), 34)
            for option in options:
                if option.default == "required":
                    text = f"{option.text} (required)"
                else:
                    text = option.text + (f" (default: {option.default})" if option.default else "")
                wrapped = textwrap.wrap(text, width=100 - width - 4) or [""]
                key = option.key.ljust(width)
                lines.append(f"  {key}  {wrapped[0]}")
                lines += [f"  {'':{width}}  {more}" for more in wrapped[1:]]
        if self.examples:
            lines += ["", "example:" if len(self.examples) == 1 else "examples:"]
            # Shown under another name (gym eval run), the example uses that name: same arguments.
            lines += [
                f"  {prog}{example[len(self.name) :]}"
                if example.startswith(self.name + " ")
                else f"  {example}"
                for example in self.examples
            ]
        if extra:
            lines += ["", extra.strip("\n")]
        lines += ["", f"{prog} --help, -h or help prints this text."]
        return "\n".join(lines) + "\n"


COMMON_OPTIONS = (
    Option("+config_paths=[a.yaml,...]", "config files to compose, in order (then env.yaml, then overrides)"),
    Option(
        "head_server.port=N",
        "head server port; also NEMO_GYM_HEAD_PORT or head_server.port in env.yaml",
        "11000",
    ),
    Option("head_server.host=H", "head server host; also NEMO_GYM_HEAD_HOST", "127.0.0.1"),
)


def _metavar(name: str, annotation: Any) -> str:
    """What a value of an option looks like in the usage: N, S, R, BOOL, PATH, NAME, {...}."""
    text = str(annotation)
    if "bool" in text:
        return "BOOL"
    if "dict" in text and "int" not in text:
        return "{...}"
    if "int" in text:
        return "N"
    if "float" in text:
        return "S" if name.endswith("_s") else "R"
    if "fpath" in name or name.endswith(("_config", "path")):
        return "PATH"
    return "NAME" if name.endswith("name") else "VALUE"


def settings_options(settings: type[BaseModel]) -> tuple[Option, ...]:
    """The options of a command, generated from its settings model: one per field with a
    description, its default the field's own (or the ``help_default`` a field names when its
    default is computed at run time), ``required`` for a field without one."""
    options = []
    for name, field in settings.model_fields.items():
        if not field.description:
            continue  # an internal or pass-through field: not advertised
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if field.is_required():
            default = "required"
        elif "help_default" in extra:
            default = str(extra["help_default"])
        elif isinstance(field.default, bool):
            default = str(field.default).lower()
        elif field.default is None or field.default is PydanticUndefined:
            default = ""
        else:
            default = f"{field.default:g}" if isinstance(field.default, float) else str(field.default)
        text = field.description.rstrip(".")
        key = str(extra.get("help_key", name))
        metavar = str(extra.get("metavar", _metavar(name, field.annotation)))
        options.append(Option(f"+{key}={metavar}", text[:1].lower() + text[1:], default))
    # What must be given first, then the rest in the settings' own order.
    return tuple(sorted(options, key=lambda option: option.default != "required"))


def _collect_options() -> tuple[Option, ...]:
    from nemo_gym.collection.settings import RolloutCollectionConfig

    return settings_options(RolloutCollectionConfig)


_EXAMPLE_CONFIGS = (
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
    "responses_api_models/scripted_model/configs/scripted_model.yaml"
)

COMMANDS: dict[str, CommandHelp] = {
    help.name: help
    for help in (
        CommandHelp(
            "ng_run",
            "Start every server in the config and the head server, wait until all are healthy, print a "
            "table, stream their logs, and stop them all on Ctrl-C (naming any server that dies).",
            examples=(f'ng_run "+config_paths=[{_EXAMPLE_CONFIGS}]"',),
        ),
        CommandHelp(
            "main_job",
            "The README's main job: start a stack on the embedded CPU model (local_hf_model behind "
            "vllm_model, token IDs on), collect rollouts on example data, print metrics, stop. "
            "Without +model it builds a tiny random-weights model locally (no downloads; rewards near 0).",
            options=(
                Option(
                    "+model=NAME_OR_PATH", "a real model for the CPU engine (Hugging Face name or local path)"
                ),
                Option("+agent_name=NAME", "agent to collect with", "example_single_tool_call_simple_agent"),
                Option(
                    "+input_jsonl_fpath=PATH",
                    "input rows",
                    "resources_servers/example_single_tool_call/data/example.jsonl",
                ),
                Option("+output_jsonl_fpath=PATH", "results file", "results/main_job_rollouts.jsonl"),
                Option("+num_repeats=N", "rollouts per row (every ng_collect_rollouts option works)", "1"),
            ),
            examples=("bash scripts/main_job.sh +num_repeats=2",),
        ),
        CommandHelp(
            "ng_status",
            "List the head server and every server registered with it, with a health check of each. "
            "Exits 1 when the head server is unreachable or a server is unhealthy.",
            examples=("ng_status", "NEMO_GYM_HEAD_PORT=11300 ng_status"),
        ),
        CommandHelp(
            "ng_dump_config",
            "Print the composed config (config files, env.yaml, overrides) as YAML, secrets redacted.",
            examples=(f'ng_dump_config "+config_paths=[{_EXAMPLE_CONFIGS}]"',),
        ),
        CommandHelp(
            "ng_version",
            "Print the nemo_gym version and the Python version.",
            examples=("ng_version",),
            config_options=False,
        ),
        CommandHelp(
            "ng_collect_rollouts",
            "Run every input row through its agent on a running stack (ng_run) and write one result "
            "line per rollout, with failures, metrics and a resumable cache beside the output.",
            options=_collect_options(),
            examples=(
                "ng_collect_rollouts +agent_name=example_single_tool_call_simple_agent "
                "+input_jsonl_fpath=resources_servers/example_single_tool_call/data/example.jsonl "
                "+output_jsonl_fpath=results/weather.jsonl +num_repeats=4",
            ),
        ),
        CommandHelp(
            "ng_e2e_collect_rollouts",
            "Start the stack from +config_paths, collect rollouts (the ng_collect_rollouts options), "
            "and stop the stack, in one command. With a single agent, +agent_name defaults to it; the "
            "head server takes a free port unless head_server.port is set.",
            options=_collect_options(),
            head_port_default="a free port",
            examples=(
                f'ng_e2e_collect_rollouts "+config_paths=[{_EXAMPLE_CONFIGS}]" '
                "+input_jsonl_fpath=resources_servers/example_single_tool_call/data/example.jsonl "
                "+output_jsonl_fpath=results/e2e.jsonl",
            ),
        ),
        CommandHelp(
            "ng_aggregate_rollouts",
            "Merge result shards into one file (duplicates dropped) and compute its metrics, through "
            "each agent's /aggregate_metrics when a head server is up, else locally.",
            options=(
                Option("+input_glob=GLOB", "shard files to merge", "required"),
                Option("+output_jsonl_fpath=PATH", "merged results file", "required"),
            ),
            examples=(
                "ng_aggregate_rollouts +input_glob='results/shard*.jsonl' +output_jsonl_fpath=results/all.jsonl",
            ),
        ),
        CommandHelp(
            "ng_export_training_data",
            "Turn rollouts that carry token IDs into training sequences (token IDs with a loss mask "
            "over the model's own tokens), skipping rows that cannot be spliced, with the reason.",
            options=(
                Option("+input_jsonl_fpath=PATH", "rollouts JSONL", "required"),
                Option("+output_jsonl_fpath=PATH", "training sequences JSONL", "required"),
                Option("+turn_end_token_ids=[...]", "turn-end token IDs of the chat template", "auto"),
            ),
            examples=(
                "ng_export_training_data +input_jsonl_fpath=results/rollouts.jsonl "
                "+output_jsonl_fpath=results/train.jsonl",
            ),
        ),
        CommandHelp(
            "ng_certify_harness",
            "A certificate of RL fidelity for a harness on an engine: N rollouts (collected on the "
            "running stack, or read), checked call by call: each prompt extends the previous prompt + "
            "generation (or the break is named: call, token range, cause), the loss mask covers exactly "
            "the sampled tokens, and the engine's re-scoring reproduces the sampled log-probs. Writes a "
            "JSON report and an HTML page; exit code 1 when the verdict is 'failed'.",
            options=(
                Option("+rollouts_jsonl_fpath=PATH", "rollouts already collected", "collect them"),
                Option("+input_jsonl_fpath=PATH", "rows to collect from (with +agent_name)"),
                Option("+agent_name=NAME", "the harness's agent on the running stack"),
                Option("+num_rollouts=N", "rollouts per row", "3"),
                Option("+limit=N", "rows used", "1"),
                Option("+engine_server=NAME", "the engine's server name (re-scoring, /detokenize)"),
                Option("+engine_base_url=URL", "or the engine's URL (a vLLM server)"),
                Option("+logprob_tolerance=X", "largest |sampled - re-scored| log-prob", "0.001"),
                Option(
                    "+output_json_fpath=PATH",
                    "the report (the HTML page beside it)",
                    "<rollouts>.certificate.json",
                ),
                Option("+output_dir=PATH", "where collected rollouts go", "results/certificate"),
            ),
            examples=(
                "ng_certify_harness +agent_name=code_gen_codex_agent "
                "+input_jsonl_fpath=resources_servers/code_gen/data/example.jsonl +engine_server=local_hf_engine",
            ),
        ),
        CommandHelp(
            "ng_init_resources_server",
            "Create a new environment folder (app.py, configs, example data, tests, README) that runs "
            "and passes ng_test as created.",
            options=(
                Option("+entrypoint=resources_servers/NAME", "the folder to create", "required"),
                Option("+description=TEXT", "what the environment does, written into its config and README"),
            ),
            examples=(
                "ng_init_resources_server +entrypoint=resources_servers/my_env "
                "'+description=Arithmetic with a calculator tool'",
            ),
        ),
        CommandHelp(
            "ng_init_agent",
            "Create a new agent folder (app.py, config, tests, README) that passes ng_test as created: "
            "seed the environment, one model call, verify (docs/WRITING_AGENTS_AND_MODELS.md).",
            options=(Option("+entrypoint=responses_api_agents/NAME", "the folder to create", "required"),),
            examples=("ng_init_agent +entrypoint=responses_api_agents/my_agent",),
        ),
        CommandHelp(
            "ng_init_model",
            "Create a new model adapter folder (app.py, config, tests, README) that passes ng_test as "
            "created: an echo engine to replace (docs/WRITING_AGENTS_AND_MODELS.md).",
            options=(Option("+entrypoint=responses_api_models/NAME", "the folder to create", "required"),),
            examples=("ng_init_model +entrypoint=responses_api_models/my_model",),
        ),
        CommandHelp(
            "ng_test",
            "Check an environment: its example rows validate, data/example_metrics.json matches them, "
            "and its tests pass. Without +entrypoint, checks every environment and prints a table.",
            options=(
                Option("+entrypoint=resources_servers/NAME", "the environment to check", "all of them"),
                Option("+timeout_s=S", "time limit of one environment's tests", "600"),
            ),
            examples=("ng_test +entrypoint=resources_servers/example_single_tool_call",),
            details="""
                The tests run as NeMo Gym runs them (from inside the folder, `from app import`
                works), with libraries kept off the network: LITELLM_LOCAL_MODEL_COST_MAP=True,
                HF_HUB_DISABLE_TELEMETRY=1, RAY_USAGE_STATS_ENABLED=0 unless the environment sets
                them (docs/NEMO_GYM_ENVIRONMENTS.md, Offline by default).
            """,
        ),
        CommandHelp(
            "ng_prepare_data",
            "Validate the datasets of every agent in the config and collate them into one JSONL per "
            "dataset type with statistics. example_validation without +output_dirpath only checks "
            "and writes nothing.",
            options=(
                Option("+mode=MODE", "example_validation | train_preparation", "required"),
                Option("+output_dirpath=DIR", "where collated files go (required but in example_validation)"),
                Option("+should_download=BOOL", "fetch missing datasets from Hugging Face", "false"),
                Option("+overwrite_metrics_conflicts=BOOL", "accept drifted committed statistics", "false"),
                Option("+hf_token=TOKEN", "Hugging Face token for private datasets"),
            ),
            examples=(f'ng_prepare_data "+config_paths=[{_EXAMPLE_CONFIGS}]" +mode=example_validation',),
        ),
        CommandHelp(
            "ng_list_benchmarks",
            "List the bundled benchmarks (benchmarks/<name>/config.yaml) with their environment and rows.",
            examples=("ng_list_benchmarks",),
        ),
        CommandHelp(
            "ng_prepare_benchmark",
            "Write a benchmark's rows as NeMo Gym JSONL and print the commands that run it.",
            options=(
                Option("+benchmark=NAME", "benchmark name (see ng_list_benchmarks)", "required"),
                Option("+output_jsonl_fpath=PATH", "where to write the rows", "the benchmark's data folder"),
            ),
            examples=("ng_prepare_benchmark +benchmark=aime24",),
        ),
        CommandHelp(
            "ng_reverify_rollouts",
            "Re-score existing rollouts with the current environment: replay each recorded response "
            "through its environment's /verify and report which rewards changed. Starts the config's "
            "stack on a free port unless +use_running_stack=true.",
            options=(
                Option("+input_jsonl_fpath=PATH", "rollouts JSONL (ng_collect_rollouts output)", "required"),
                Option("+output_jsonl_fpath=PATH", "re-scored rollouts", "<input>.reverified.jsonl"),
                Option("+agent_name=NAME", "agent whose environment verifies rows without agent_ref"),
                Option(
                    "+use_running_stack=BOOL", "use the stack at head_server instead of starting one", "false"
                ),
                Option("+num_samples_in_parallel=N", "verify calls in flight", "32"),
            ),
            examples=(
                f'ng_reverify_rollouts "+config_paths=[{_EXAMPLE_CONFIGS}]" '
                "+input_jsonl_fpath=results/weather.jsonl",
            ),
        ),
        CommandHelp(
            "ng_reward_profile",
            "Profile rewards per task across repeats: pass rate, mean and variance of the reward, and "
            "the tasks always or never solved. Prints a table and writes a JSON file.",
            options=(
                Option("+input_jsonl_fpath=PATH", "rollouts JSONL (ng_collect_rollouts output)", "required"),
                Option("+output_json_fpath=PATH", "the profile as JSON", "<input>.reward_profile.json"),
                Option("+pass_threshold=X", "a rollout passes when reward >= X", "1.0"),
                Option("+max_rows_shown=N", "table rows printed (the JSON file has every task)", "20"),
            ),
            examples=("ng_reward_profile +input_jsonl_fpath=results/weather.jsonl",),
            config_options=False,
        ),
        CommandHelp(
            "ng_viewer",
            "Open rollout collections in a local web viewer: Overview (failures, mean reward, pass@k, "
            "plots), Tasks (filters, prompt search), Rollout (the conversation, repeats side by side), "
            "Tokens (the training sequence by loss mask) and Compare (two collections, flipped tasks).",
            options=(
                Option(
                    "+input=PATH[,PATH]",
                    "rollouts JSONL file(s); their _failures/_aggregate_metrics side files are read too",
                    "required",
                ),
                Option("+port=N", "port to serve on; 0 takes a free one (printed)", "0"),
                Option("+host=H", "address to bind", "127.0.0.1"),
                Option(
                    "+tokenizer=PATH", "Hugging Face tokenizer that decodes the Tokens page", "token IDs only"
                ),
                Option("+turn_end_token_ids=[...]", "as for ng_export_training_data"),
                Option("+solved_threshold=X", "a rollout solves its task when reward >= X", "1.0"),
            ),
            details="""
                An index of each file is kept beside it (<file>.ngindex) and extended as a running
                collection appends. With NEMO_GYM_AUTH_TOKEN set, every request needs the token: open
                the URL ng_viewer prints (it carries ?token=...).
            """,
            examples=("ng_viewer +input=results/main_job_rollouts.jsonl",),
            config_options=False,
        ),
        CommandHelp(
            "ng_pull_environment",
            "Bring one of NeMo Gym's environments (or agents, model adapters) into this project by "
            "name: the nemo-gym wheel is fetched with pip download (never installed), the folder is "
            "copied, its requirements installed, and its source, version and licence recorded in "
            ".nemo_gym_source.json.",
            options=(
                Option("NAME[==VERSION]", "the folder to pull; the newest wheel when no version", "required"),
                Option("+dir=PATH", "where to put it", "resources_servers/NAME (agents, models: their kind)"),
                Option(
                    "+kind=KIND",
                    "look only in resources_servers, responses_api_agents or responses_api_models",
                ),
                Option("+install=false", "do not pip install the folder's requirements", "true"),
                Option(
                    "+install_gpu_requirements=true", "also install torch/vllm-sized requirements", "false"
                ),
                Option("+force=true", "replace an existing folder", "false"),
                Option("+index_url=URL", "the package index to download from", "pip's configured index"),
            ),
            examples=(
                "ng_pull_environment example_multi_step==0.7.0",
                "gym env pull mcqa +dir=my_envs/mcqa",
            ),
            details="""
                The wheel is cached in ~/.cache/nemo_gym/wheels ($NEMO_GYM_WHEEL_CACHE). gym list
                environments --available [VERSION] lists what a wheel offers.
            """,
            config_options=False,
        ),
    )
}


def wants_help(argv: Sequence[str]) -> bool:
    """Whether a command line asks for help: ``--help`` or ``-h`` anywhere, or ``help`` first."""
    return bool(argv) and (argv[0] in HELP_WORDS or any(arg in ("--help", "-h") for arg in argv))


def help_text(
    name: str | None,
    docstring: str | None = None,
    prog: str | None = None,
    extra: str = "",
    config_options: bool = True,
) -> str:
    """The help of command ``name``; a command with no entry gets its docstring as the summary.

    ``config_options`` says whether such a command reads the composed config.
    """
    known = COMMANDS.get(name or "")
    if known is not None:
        return known.render(prog, extra)
    summary = textwrap.dedent(docstring or "").strip() or "(no description)"
    return CommandHelp(prog or name or "command", summary, config_options=config_options).render(prog, extra)
