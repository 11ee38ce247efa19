"""Experiment trackers: a collection's metrics and rollouts to Weights & Biases and to MLflow.

Both are optional extras (``pip install 'nemo_gym[wandb]'`` / ``'nemo_gym[mlflow]'``); a run that
asks for one whose package is missing stops before collecting, naming the extra.

- W&B is used with ``+upload_rollouts_to_wandb=true`` or when the config names ``wandb_project``
  (NeMo Gym's key; ``wandb_name`` names the run). The metrics are logged under NeMo Gym's names
  (``<agent>/<metric>`` and ``key_metrics/<agent>/<metric>``) plus ``collection/*`` counts, and,
  unless ``upload_rollouts_to_wandb`` is false, a ``Rollouts`` table with one result row (its JSON
  line) per rollout. ``WANDB_MODE=offline`` works as W&B documents it.
- MLflow is used with ``+upload_rollouts_to_mlflow=true``: the same metrics (characters MLflow does
  not accept in a key become ``_``: ``pass@1`` is ``pass_1``), the run's settings as params, and
  the rollouts as a ``Rollouts.json`` table (``columns``/``data``) and the results file as an
  artifact. The tracking URI is ``mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else a
  local file store ``./mlruns``.

The viewer stays the way to read single rollouts. A tracker that fails after the collection
(network, quota) prints a warning; the collection's files are already complete.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from nemo_gym.collection.collection_io import AGENT_REF_KEY, warn
from nemo_gym.collection.settings import SharedRolloutCollectionConfig
from nemo_gym.launch.config import ConfigError

ROLLOUTS_TABLE_KEY = "Rollouts"
_PRIMITIVE = (bool, int, float, str, type(None))
_MLFLOW_KEY_CHARS = re.compile(r"[^\w\-. :/]")
_SECRET_NAME = re.compile(r"key|token|secret|password", re.IGNORECASE)


def require_packages(settings: SharedRolloutCollectionConfig) -> None:
    """Raise :class:`ConfigError` when a tracker the run asks for is not installed."""
    for wanted, module, extra in (
        (settings.use_wandb, "wandb", "wandb"),
        (settings.use_mlflow, "mlflow", "mlflow"),
    ):
        if not wanted:
            continue
        try:
            __import__(module)
        except ImportError as exc:
            raise ConfigError(
                f"this collection logs to {module} but the {module} package is not installed "
                f"({exc}); pip install 'nemo_gym[{extra}]', or drop the {module} options"
            ) from exc


def tracker_metrics(
    entries: list[dict[str, Any]] | None, counts: Mapping[str, int | float]
) -> dict[str, Any]:
    """NeMo Gym's flat metric names for the per-agent metrics, plus ``collection/<count>``."""
    metrics: dict[str, Any] = {f"collection/{name}": value for name, value in counts.items()}
    for entry in entries or []:
        agent = (entry.get(AGENT_REF_KEY) or {}).get("name")
        for key, value in (entry.get("agent_metrics") or {}).items():
            if isinstance(value, _PRIMITIVE):
                metrics[f"{agent}/{key}"] = value
        for key, value in (entry.get("key_metrics") or {}).items():
            if isinstance(value, _PRIMITIVE):
                metrics[f"key_metrics/{agent}/{key}"] = value
    return metrics


def _result_lines(results_path: Path) -> Iterator[str]:
    if results_path.exists():
        with results_path.open("rb") as source:
            for line in source:
                if line.strip():
                    yield line.strip().decode()


def _run_config(settings: SharedRolloutCollectionConfig) -> dict[str, Any]:
    """The run's scalar arguments, secrets left out (they are logged to a third party)."""
    return {
        key: value
        for key, value in settings.model_dump().items()
        if isinstance(value, _PRIMITIVE) and not _SECRET_NAME.search(key)
    }


def log_to_wandb(
    settings: SharedRolloutCollectionConfig, metrics: dict[str, Any], results_path: Path
) -> str | None:
    """Log ``metrics`` (and the rollouts table) to a new W&B run; returns the run's local folder."""
    import wandb

    run = wandb.init(
        project=settings.wandb_project or "nemo_gym",
        name=settings.wandb_name,
        config=_run_config(settings),
        reinit="create_new",
        settings=wandb.Settings(api_key=settings.wandb_api_key) if settings.wandb_api_key else None,
    )
    try:
        run.log(metrics)
        if settings.upload_rollouts_to_wandb:
            rows = [[line] for line in _result_lines(results_path)]
            run.log({ROLLOUTS_TABLE_KEY: wandb.Table(columns=["Rollout"], data=rows)})
        return str(run.dir)
    finally:
        run.finish()


def log_to_mlflow(
    settings: SharedRolloutCollectionConfig, metrics: dict[str, Any], results_path: Path
) -> str:
    """Log ``metrics``, params and the rollouts to a new MLflow run; returns its run id."""
    import mlflow

    uri = settings.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "./mlruns"
    if "://" not in uri or uri.startswith("file:"):
        # MLflow 3 keeps the file store behind this switch; a local folder is what a user without
        # a tracking server expects, and what needs no database package.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if "://" not in uri:
            uri = Path(uri).resolve().as_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(settings.mlflow_experiment_name or "nemo_gym")
    numeric = {
        _MLFLOW_KEY_CHARS.sub("_", key): float(value)
        for key, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    with mlflow.start_run(run_name=settings.wandb_name) as run:
        mlflow.log_metrics(numeric)
        mlflow.log_params({key: str(value)[:500] for key, value in _run_config(settings).items()})
        rows = [[line] for line in _result_lines(results_path)]
        mlflow.log_dict({"columns": ["Rollout"], "data": rows}, f"{ROLLOUTS_TABLE_KEY}.json")
        if results_path.exists():
            mlflow.log_artifact(str(results_path), artifact_path="rollouts")
        return str(run.info.run_id)


def log_collection(
    settings: SharedRolloutCollectionConfig,
    entries: list[dict[str, Any]] | None,
    counts: Mapping[str, int | float],
    results_path: Path,
) -> None:
    """Send a finished collection to every tracker it asks for; a failing tracker only warns."""
    metrics = tracker_metrics(entries, counts)
    for wanted, name, log in (
        (settings.use_wandb, "W&B", log_to_wandb),
        (settings.use_mlflow, "MLflow", log_to_mlflow),
    ):
        if not wanted:
            continue
        try:
            where = log(settings, metrics, results_path)
            print(f"Logged {len(metrics)} metrics and the rollouts to {name} ({where})", flush=True)
        except Exception as exc:  # noqa: BLE001 - the collection's own files are complete
            warn(
                f"logging to {name} failed ({type(exc).__name__}: {str(exc)[:300]}); the results files are intact"
            )
