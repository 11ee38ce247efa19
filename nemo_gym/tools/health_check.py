"""``gym eval health-check RUN_DIR`` (``ng_health_check``): rollout health of a finished run.

Reads ``RUN_DIR/rollouts.jsonl`` (or ``+rollout_file``), runs NeMo Gym's rollout health checks
(:mod:`nemo_gym.rollout_health`) and writes ``quality_summary.json`` and
``rollout_verdicts.jsonl`` into ``RUN_DIR``. A missing folder or file, or an unknown check id, is
a usage error naming it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_gym.console.settings_command import settings_command
from nemo_gym.launch.config import ConfigError
from nemo_gym.rollout_health import health_check_run_dir


class HealthCheckSettings(BaseModel):
    """The arguments of ``gym eval health-check``."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    run_dir: str = Field(description="The run's folder (gym: the RUN_DIR argument).")
    rollout_file: str | None = Field(
        default=None,
        description="Rollouts JSONL, relative to run_dir.",
        json_schema_extra={"help_default": "rollouts.jsonl"},
    )
    workers: int | None = Field(
        default=None, ge=1, description="Worker processes.", json_schema_extra={"help_default": "up to 8"}
    )
    ignored_checks: list[str] = Field(
        default_factory=list,
        description="Check ids to leave out of the verdicts (a list, or comma-separated).",
        json_schema_extra={"metavar": "CHECK[,CHECK]"},
    )
    json_output: bool = Field(
        default=False,
        alias="json",
        description="Print the summary as JSON.",
        json_schema_extra={"help_key": "json"},
    )

    @field_validator("ignored_checks", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return [part for part in value.split(",") if part.strip()] if isinstance(value, str) else value


def _health_check(settings: HealthCheckSettings) -> int:
    try:
        health_check_run_dir(
            settings.run_dir,
            rollout_file=settings.rollout_file,
            workers=settings.workers,
            ignored_checks=settings.ignored_checks,
            json_output=settings.json_output,
        )
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return 0


ng_health_check = settings_command(
    _health_check,
    HealthCheckSettings,
    "ng_health_check",
    "Check the rollouts of a finished run (their ng_trajectory turns and captured model calls): each "
    "rollout healthy, unhealthy (with findings) or unobserved; writes quality_summary.json and "
    "rollout_verdicts.jsonl into the run folder.",
    examples=("ng_health_check +run_dir=results/run1 +rollout_file=rollouts.jsonl",),
)
