"""The run's ``token_id_capture:`` block (NeMo Gym's field names and defaults).

```yaml
token_id_capture:
  enabled: true
  dir: /tmp/token_captures        # the file store, shared by writer and consumer (absolute)
  sink: my_pkg.sinks:MySink       # optional: a TokenSink class replacing the file store
  lineage_store: my_pkg.sinks:MyResolver   # needed with a custom sink (same backend)
  delta_records: true             # resolved continuations store only their new prompt suffix
```

Training capture applies to calls on ``/ng-rollout/<id>/training-token-capture/...``, which an
agent sends when its config sets ``token_id_capture: true`` or the block sets ``all_agents``.
The top-level ``model_call_capture_dir`` is the fallback directory. ``rebuild_response`` (default
on) has the collector rebuild each rollout's ``response.output`` from the capture; set it off
when a trainer reads through its own source. ``external_staging`` hands the tokens to the
inference worker (``vllm_worker`` or ``megatron_worker``) and the model server keeps only a
token-free ledger, read through a bearer-protected manifest route.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.token_id_capture.non_generating import NonGeneratingRequest
from nemo_gym.token_id_capture.protocols import (
    LineageResolver,
    TokenSink,
    installed_lineage_store,
    installed_token_sink,
)

__all__ = [
    "TOKEN_ID_CAPTURE_BLOCK",
    "ExternalStagingBackend",
    "NonGeneratingRequest",
    "TokenIdCaptureConfig",
    "TokenIdCaptureSettings",
    "token_id_capture_config",
    "token_id_capture_enabled_for_agent",
]

logger = logging.getLogger(__name__)

TOKEN_ID_CAPTURE_BLOCK = "token_id_capture"
ExternalStagingBackend = Literal["vllm_worker", "megatron_worker"]


class TokenIdCaptureSettings(BaseModel):
    """The ``token_id_capture`` block."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    all_agents: bool = False
    dir: Path | None = None
    sink: str | None = None
    sink_kwargs: dict[str, Any] = Field(default_factory=dict)
    lineage_store: str | None = None
    lineage_store_kwargs: dict[str, Any] = Field(default_factory=dict)
    rebuild_response: bool = True
    allow_unresolved_continuations: bool = False
    delta_records: bool = False
    max_mask_fraction: float | None = None
    mask_fraction_min_samples: int = 50
    external_staging: bool = False
    external_staging_backend: ExternalStagingBackend = "vllm_worker"
    # The environment variable holding the manifest route's bearer token (never in the config).
    control_auth_token_env: str = Field(default="NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN", min_length=1)

    def resolve_control_auth_token(self) -> str:
        """The manifest route's bearer token, from the environment."""
        token = os.environ.get(self.control_auth_token_env)
        if not token:
            raise ValueError(
                f"token_id_capture.external_staging needs a control bearer token in the environment "
                f"variable {self.control_auth_token_env}"
            )
        return token


class TokenIdCaptureConfig(BaseModel):
    """The capture block and the top-level directory it falls back to."""

    model_config = ConfigDict(extra="ignore")

    token_id_capture: TokenIdCaptureSettings = Field(default_factory=TokenIdCaptureSettings)
    model_call_capture_dir: Path | None = None

    @model_validator(mode="after")
    def _usable(self) -> TokenIdCaptureConfig:
        block = self.token_id_capture
        if block.external_staging and not block.enabled:
            raise ValueError("token_id_capture.external_staging requires token_id_capture.enabled")
        if block.external_staging and block.rebuild_response:
            raise ValueError(
                "token_id_capture.external_staging requires rebuild_response=false: the framework "
                "finalizes staged records itself"
            )
        if block.external_staging_backend == "megatron_worker" and not block.external_staging:
            raise ValueError("token_id_capture.external_staging_backend requires external_staging=true")
        if not block.enabled:
            return self
        if block.sink is not None or (self.resolved_dir() is None and installed_token_sink() is not None):
            if block.sink is not None and block.dir is not None:
                logger.warning(
                    "token_id_capture.dir %s is unused: token_id_capture.sink replaces the file store",
                    block.dir,
                )
            self._require_resolver(block)
            return self
        directory = self.resolved_dir()
        if directory is None:
            if not block.rebuild_response:
                return self
            raise ValueError(
                "token_id_capture is enabled but has nowhere to write: set token_id_capture.dir (or "
                "model_call_capture_dir) to an absolute directory, or token_id_capture.sink"
            )
        if not directory.is_absolute():
            raise ValueError(f"token_id_capture.dir must be an absolute path, got {str(directory)!r}")
        return self

    @staticmethod
    def _require_resolver(block: TokenIdCaptureSettings) -> None:
        if block.lineage_store is not None or installed_lineage_store() is not None:
            return
        if block.allow_unresolved_continuations:
            logger.warning(
                "token_id_capture has a custom sink and no lineage_store: multi-call rollouts will be masked"
            )
            return
        raise ValueError(
            "token_id_capture has a custom sink but no lineage_store, so no continuation can find its "
            "parent and every multi-call rollout would be masked; set token_id_capture.lineage_store "
            "(same backend as the sink) or token_id_capture.allow_unresolved_continuations: true"
        )

    @property
    def enabled(self) -> bool:
        """Whether training-token capture is on."""
        return self.token_id_capture.enabled

    def resolved_dir(self) -> Path | None:
        """The file store's directory (``dir``, else ``model_call_capture_dir``)."""
        return self.token_id_capture.dir or self.model_call_capture_dir

    def build_sink(self) -> TokenSink | None:
        """The configured sink, built in this process (None: the file store is used)."""
        block = self.token_id_capture
        if not block.enabled or block.sink is None:
            return None
        return _build_endpoint(block.sink, block.sink_kwargs, TokenSink, "sink")  # type: ignore[no-any-return]

    def build_lineage_store(self) -> LineageResolver | None:
        """The configured lineage resolver, built in this process (None when not configured)."""
        block = self.token_id_capture
        if not block.enabled or block.lineage_store is None:
            return None
        return _build_endpoint(
            block.lineage_store, block.lineage_store_kwargs, LineageResolver, "lineage_store"
        )  # type: ignore[no-any-return]


def _build_endpoint(target: str, kwargs: dict[str, Any], protocol: type, kind: str) -> Any:
    module_path, colon, class_name = target.partition(":")
    if not colon:
        raise ValueError(f"token_id_capture.{kind} must be 'module.path:ClassName', got {target!r}")
    try:
        factory = getattr(import_module(module_path), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load token_id_capture.{kind} {target!r}: {exc}") from exc
    try:
        endpoint = factory(**kwargs)
    except TypeError as exc:
        raise ValueError(
            f"cannot build token_id_capture.{kind} {target!r} with {kind}_kwargs={sorted(kwargs)}: {exc}"
        ) from exc
    required = {
        name
        for cls in protocol.__mro__
        if cls.__module__.startswith("nemo_gym.")
        for name, value in vars(cls).items()
        if not name.startswith("_") and callable(value)
    }
    missing = sorted(name for name in required if not callable(getattr(endpoint, name, None)))
    if missing or not isinstance(endpoint, protocol):
        raise ValueError(
            f"token_id_capture.{kind} {target!r} is not a {protocol.__name__}: it lacks {', '.join(missing) or 'a required method'}"
        )
    return endpoint


def token_id_capture_config(global_config_dict: Any) -> TokenIdCaptureConfig:
    """The capture settings of a run's global config (anything but a mapping reads as no config)."""
    from nemo_gym.models.fastapi_dispatch import plain_config

    config = plain_config(global_config_dict)
    return TokenIdCaptureConfig.model_validate(config if isinstance(config, Mapping) else {})


def token_id_capture_enabled_for_agent(global_config_dict: Any, agent_name: str | None) -> bool:
    """Whether the named agent's calls are captured (``all_agents``, or its own ``token_id_capture``)."""
    settings = token_id_capture_config(global_config_dict).token_id_capture
    if not settings.enabled:
        return False
    if settings.all_agents:
        return True
    entry = (
        global_config_dict.get(agent_name) if agent_name and isinstance(global_config_dict, Mapping) else None
    )
    agents = entry.get("responses_api_agents") if isinstance(entry, Mapping) else None
    if not isinstance(agents, Mapping):
        return False
    return any(isinstance(c, Mapping) and bool(c.get("token_id_capture", False)) for c in agents.values())
