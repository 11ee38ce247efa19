"""The arguments of the collection commands, as NeMo Gym's config classes (same names and fields).

``SharedRolloutCollectionConfig`` holds what every collection takes; ``RolloutCollectionConfig``
(``ng_collect_rollouts``) and ``E2ERolloutCollectionConfig`` (``ng_e2e_collect_rollouts``) extend
it; ``RolloutAggregationConfig`` is ``ng_aggregate_rollouts``. Fields beyond NeMo Gym's are this
project's own options (deadlines, failure ratio, shards, trackers). A config is validated from the
whole global config dict, so unknown keys (server blocks, ``head_server``) are ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from nemo_gym.agents.skills import SkillsConfig, load_skill_directory
from nemo_gym.collection.collection_io import CollectionPaths, PromptConfig, RowMaterializer
from nemo_gym.collection.row_keys import FAILURE_CLASS_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from nemo_gym.collection.row_materializer import DEFAULT_ROUTE
from nemo_gym.launch.config import ConfigError

# A result row its producer asks not to be written (NeMo Gym's name).
NO_PERSIST_KEY = "_ng_no_persist"
# ng_collect_rollouts exits non-zero when more than this share of the rollouts it ran failed.
DEFAULT_MAX_FAILURE_RATIO = 0.1

_Config = TypeVar("_Config", bound="BaseNeMoGymCLIConfig")


class BaseNeMoGymCLIConfig(BaseModel):
    """The base of a command's arguments (``+name=value`` on the command line).

    Built from the whole global config: keys that are not fields (server blocks, ``head_server``)
    are ignored. :meth:`from_config` turns validation errors into a :class:`ConfigError` naming
    each ``+argument``.
    """

    model_config = ConfigDict(extra="ignore")

    @classmethod
    def from_config(cls: type[_Config], config: Mapping[str, Any] | BaseModel) -> _Config:
        """Validate a config dict (or pass an instance of this class through)."""
        if isinstance(config, cls):
            return config
        data = config.model_dump() if isinstance(config, BaseModel) else dict(config)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(_describe(err) for err in exc.errors()[:5])
            raise ConfigError(f"invalid collection arguments: {problems}") from exc


def _describe(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    return message if message.startswith("+") else f"+{where}: {message}" if where else message


class SharedRolloutCollectionConfig(BaseNeMoGymCLIConfig):
    """What every collection takes: where results go, concurrency, request overrides, trackers."""

    output_jsonl_fpath: str = Field(description="The results file; side files are named after it.")
    require_complete: bool = Field(
        default=False,
        description=(
            "Fail the run (after its files are written) when any of its rollouts has no result "
            "(see check_completion)."
        ),
    )
    num_samples_in_parallel: int | None = Field(
        default=None,
        ge=1,
        description="Rollouts in flight at once.",
        json_schema_extra={"help_default": "32"},
    )
    responses_create_params: dict[str, Any] = Field(
        default_factory=dict,
        description="Deep-merged into every row's responses_create_params (these values win).",
    )
    upload_rollouts_to_wandb: bool = Field(
        default=True,
        json_schema_extra={"help_default": "off unless set, or a wandb_project is configured"},
        description=(
            "Log the rollouts table to Weights & Biases with the metrics. W&B is used when this is "
            "set explicitly to true or when the config names a wandb_project; false keeps only the metrics."
        ),
    )
    disable_aggregation: bool = Field(
        default=False, description="Skip /aggregate_metrics (shards; see ng_aggregate_rollouts)."
    )
    upload_rollouts_to_mlflow: bool = Field(
        default=False,
        description="Log the metrics and the rollouts to MLflow (mlflow_tracking_uri, default ./mlruns).",
    )
    wandb_project: str | None = None
    wandb_name: str | None = None
    wandb_api_key: str | None = None  # else W&B's own login ($WANDB_API_KEY, ~/.netrc)
    mlflow_tracking_uri: str | None = None
    mlflow_experiment_name: str | None = None

    @property
    def use_wandb(self) -> bool:
        """Whether this collection logs to W&B: asked for explicitly, or a project is configured."""
        explicit = "upload_rollouts_to_wandb" in self.model_fields_set and self.upload_rollouts_to_wandb
        return bool(explicit or self.wandb_project)

    @property
    def use_mlflow(self) -> bool:
        """Whether this collection logs to MLflow."""
        return self.upload_rollouts_to_mlflow

    def check_completion(self, *, expected: int, results: Iterable[Mapping[str, Any]]) -> None:
        """With ``require_complete``, raise ``RuntimeError`` unless ``results`` hold ``expected``
        completed rollouts: distinct ``(stage_index, task, rollout)`` of rows that name no failure
        class and are not marked not to be persisted. Call it once the run's files are written,
        so the partial results survive the error. Without ``require_complete`` it does nothing."""
        if not self.require_complete:
            return
        completed = {
            (row.get("stage_index"), row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY])
            for row in results
            if row.get(FAILURE_CLASS_KEY) is None and not row.get(NO_PERSIST_KEY)
        }
        if len(completed) < expected:
            raise RuntimeError(
                f"EVAL FAILED: {len(completed)}/{expected} samples completed. "
                f"Partial artifacts retained at {self.output_jsonl_fpath}."
            )


class RolloutCollectionConfig(SharedRolloutCollectionConfig):
    """The ``ng_collect_rollouts`` arguments (each given as ``+name=value``)."""

    input_jsonl_fpath: str = Field(description="The input rows (JSONL).")
    agent_name: str | None = Field(
        default=None,
        description=(
            "The agent every row goes to, overriding a row's own agent_ref (a warning lists the "
            "overridden values); shorthand for agent_map={_default: NAME}."
        ),
    )
    agent_map: dict[str, str] | None = Field(
        default=None,
        description=(
            "Re-route rows by their agent_ref.name or task_source, e.g. {old_agent: new_agent}; the key "
            "_default covers every other row, those without agent_ref too. Precedence: agent_map[row's "
            "name] > agent_map._default > the row's agent_ref."
        ),
    )
    fan_out: dict[str, list[str]] | None = Field(
        default=None,
        description=(
            "Run each row whose agent_ref.name or task_source is a key once per listed agent, e.g. "
            "{my_env_agent: [agent_a, agent_b]}: each copy has its own rollout index, and num_repeats "
            "applies per agent."
        ),
    )
    limit: int | None = Field(default=None, ge=0, description="Use only the first N valid rows.")
    num_repeats: int | dict[str, int] = Field(
        default=1,
        description=(
            "Rollouts per row: an int, or {agent: n} keyed by the agent a row goes to or by its own "
            "agent_ref.name / task_source (the agent wins), with an optional _default (else 1)."
        ),
    )
    num_repeats_add_seed: bool = Field(
        default=False, description="Give each repeat its own seed through metadata.extra_body."
    )
    resume_from_cache: bool = Field(
        default=False, description="Finish an interrupted run with the same arguments (only what is missing)."
    )
    force_resume: bool = Field(
        default=False,
        description="Resume even when the run's lock (x_lock.json) differs from what the stack runs now.",
    )
    write_lock: bool = Field(
        default=True,
        description="Record what the run was made from in x_lock.json and check it on resume.",
    )
    prompt_config: str | None = Field(
        default=None, description="A YAML of system/user templates that build each row's input."
    )
    skills: SkillsConfig | None = Field(
        default=None,
        json_schema_extra={"help_key": "skills.path", "metavar": "PATH"},
        description="A folder of agent skills (skills.path) for this run: every row carries its skills_ref.",
    )
    strict: bool = Field(
        default=False,
        description="Refuse the whole input on a malformed line (false: record it, collect the rest).",
    )
    rollout_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Deadline of one rollout.",
        json_schema_extra={"help_default": "$NEMO_GYM_ROLLOUT_TIMEOUT_S, else 1200"},
    )
    max_failure_ratio: float = Field(
        default=DEFAULT_MAX_FAILURE_RATIO,
        ge=0,
        le=1,
        description="Exit with status 3 when more than this share of the rollouts failed (0-1).",
    )
    max_attempts: int = Field(default=3, ge=1, description="Most attempts per rollout across resumed runs.")
    retry_terminal_timeouts: bool = Field(
        default=False,
        description=(
            "On resume, dispatch again a failure stamped final (_ng_failure_terminal) when it is a "
            "per-task timeout (timeout_exceeded) or an environment fault that can be repaired between "
            "runs (reference_missing, eval_missing, transport_ineligible), up to +max_attempts; a "
            "skipped sample stays final. Off: a failure is final exactly when it is stamped so."
        ),
    )
    retry_invalid_judge_responses: bool = Field(
        default=False,
        description=(
            "On resume, move results marked invalid_judge_response to the failures file (class "
            "judge_invalid) so they are judged again instead of counting as a reward of 0."
        ),
    )
    progress_interval_s: float = Field(default=30.0, gt=0, description="Seconds between progress lines.")
    num_shards: int = Field(default=1, ge=1, description="Split the rows into this many shards.")
    shard_index: int = Field(
        default=0, ge=0, description="Run only rows whose position % num_shards is this."
    )

    @model_validator(mode="before")
    @classmethod
    def _null_repeats_mean_one(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "num_repeats" in data and data["num_repeats"] is None:
            data = {**data, "num_repeats": 1}
        return data

    @model_validator(mode="after")
    def _check(self) -> RolloutCollectionConfig:
        repeats = self.num_repeats
        if any(n < 1 for n in ([repeats] if isinstance(repeats, int) else repeats.values())):
            raise ValueError(f"+num_repeats must be >= 1 (or a map of agent name → n >= 1), got {repeats!r}")
        if self.shard_index >= self.num_shards:
            raise ValueError(f"+shard_index={self.shard_index} must be < +num_shards={self.num_shards}")
        for key, agents in (self.fan_out or {}).items():
            if not agents:
                raise ValueError(f"+fan_out.{key} must list one or more agents, got {agents!r}")
        if self.agent_name is not None:
            # +agent_name is shorthand for agent_map._default: fold it in so one map routes every row.
            default = (self.agent_map or {}).get(DEFAULT_ROUTE)
            if default is not None and default != self.agent_name:
                raise ValueError(
                    f"+agent_name={self.agent_name!r} conflicts with +agent_map.{DEFAULT_ROUTE}={default!r}: "
                    "give only one of them"
                )
            self.agent_map = {**(self.agent_map or {}), DEFAULT_ROUTE: self.agent_name}
        return self

    _materialized_jsonl_fpath: Path | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _take_materialized_path(cls, data: Any, handler: Any) -> Any:
        # NeMo Gym's API reads and sets materialized_jsonl_fpath; given as a key, it is set too.
        given = data.get("materialized_jsonl_fpath") if isinstance(data, Mapping) else None
        if given is not None:
            data = {k: v for k, v in data.items() if k != "materialized_jsonl_fpath"}
        config = handler(data)
        if given is not None:
            config.materialized_jsonl_fpath = given
        return config

    @property
    def materialized_jsonl_fpath(self) -> Path:
        """Where the materialized input rows go: as set, else ``x_materialized_inputs.jsonl`` next
        to the results file ``x.jsonl``."""
        if self._materialized_jsonl_fpath is not None:
            return self._materialized_jsonl_fpath
        return CollectionPaths.for_output(self.output_jsonl_fpath).materialized_inputs

    @materialized_jsonl_fpath.setter
    def materialized_jsonl_fpath(self, value: str | Path) -> None:
        self._materialized_jsonl_fpath = Path(value)

    def collection_paths(self) -> CollectionPaths:
        """The collection's files: the results file's side files, with the materialized inputs
        where :attr:`materialized_jsonl_fpath` says."""
        paths = CollectionPaths.for_output(self.output_jsonl_fpath)
        return dataclasses.replace(paths, materialized_inputs=self.materialized_jsonl_fpath)

    def row_materializer(self) -> RowMaterializer:
        """How this collection prepares each input row (agent, repeats, seeds, overrides, prompt)."""
        return RowMaterializer(
            agent_name=self.agent_name,  # folded into agent_map._default too; kept to name it in errors
            agent_map={
                k: v for k, v in (self.agent_map or {}).items() if (k, v) != (DEFAULT_ROUTE, self.agent_name)
            },
            fan_out=dict(self.fan_out or {}),
            num_repeats=self.num_repeats,
            add_seed=self.num_repeats_add_seed,
            responses_create_params=self.responses_create_params,
            prompt=PromptConfig.load(self.prompt_config) if self.prompt_config else None,
            skills_ref=self._skills_ref(),
        )

    def _skills_ref(self) -> dict[str, Any] | None:
        if self.skills is None:
            return None
        try:
            return load_skill_directory(self.skills.path).model_dump()
        except ValueError as exc:
            raise ConfigError(f"+skills.path: {exc}") from exc


class E2ERolloutCollectionConfig(SharedRolloutCollectionConfig):
    """``ng_e2e_collect_rollouts``: start the servers of ``config_paths``, collect, stop them.

    ``split`` names the datasets NeMo Gym prepares (train, validation, benchmark);
    ``reuse_existing_data_preparation`` keeps an already prepared file.
    """

    split: Literal["train", "validation", "benchmark"]
    reuse_existing_data_preparation: bool = False


class RolloutAggregationConfig(BaseNeMoGymCLIConfig):
    """``ng_aggregate_rollouts``: merge the shards a glob matches and compute their metrics.

    ``input_glob`` is a glob or comma-separated globs (side files skipped); ``merge_shards``
    writes the merged rows to ``output_jsonl_fpath``; the metrics go next to it
    (``<stem>_aggregate_metrics.json``) either way.
    """

    input_glob: str
    output_jsonl_fpath: str
    merge_shards: bool = True
