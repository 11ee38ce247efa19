"""The ``token_id_capture:`` block of a run's config (NeMo Gym's ``nemo_gym.token_id_capture.config``).

The block is read with NeMo Gym's field names so configs written for it load. Turning capture on
is refused (:class:`TokenIdCaptureUnavailable`): nemo_gym returns token IDs on the response items
instead (``return_token_id_information: true``; docs/TOKEN_IDS.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.models.capture_support import TOKEN_CAPTURE_UNAVAILABLE, unserved_token_capture_switches
from nemo_gym.token_id_capture.non_generating import NonGeneratingRequest

TOKEN_ID_CAPTURE_BLOCK = "token_id_capture"
__all__ = [
    "TOKEN_ID_CAPTURE_BLOCK",
    "CaptureComponent",
    "NonGeneratingRequest",
    "TokenIdCaptureConfig",
    "TokenIdCaptureSettings",
    "TokenIdCaptureUnavailable",
    "token_id_capture_config",
    "unavailable",
]


class TokenIdCaptureUnavailable(ValueError):
    """A run asked for NeMo Gym's training-token capture, which nemo_gym does not implement."""


UNAVAILABLE_MESSAGE = TOKEN_CAPTURE_UNAVAILABLE


class TokenIdCaptureSettings(BaseModel):
    """The ``token_id_capture`` block, with NeMo Gym's fields and defaults."""

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
    external_staging_backend: Literal["vllm_worker", "megatron_worker"] = "vllm_worker"
    control_auth_token_env: str = Field(default="NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN", min_length=1)


class TokenIdCaptureConfig(BaseModel):
    """A run's capture settings: the ``token_id_capture`` block and the fallback capture directory."""

    model_config = ConfigDict(extra="ignore")

    token_id_capture: TokenIdCaptureSettings = Field(default_factory=TokenIdCaptureSettings)
    model_call_capture_dir: Path | None = None

    @property
    def enabled(self) -> bool:
        """Whether the run asks for training-token capture."""
        return self.token_id_capture.enabled or self.token_id_capture.external_staging

    @property
    def resolved_dir(self) -> Path | None:
        """Where NeMo Gym's file store would write."""
        return self.token_id_capture.dir or self.model_call_capture_dir

    def require_disabled(self) -> None:
        """Raise :class:`TokenIdCaptureUnavailable` when the run turns capture on."""
        block = {TOKEN_ID_CAPTURE_BLOCK: self.token_id_capture.model_dump()}
        for switch in unserved_token_capture_switches(block):
            raise TokenIdCaptureUnavailable(UNAVAILABLE_MESSAGE.format(what=f"{switch} is set"))

    def build_sink(self) -> None:
        """No token sink exists here (capture on is refused by :meth:`require_disabled`)."""
        self.require_disabled()

    def build_lineage_store(self) -> None:
        """No lineage store exists here (capture on is refused by :meth:`require_disabled`)."""
        self.require_disabled()


def token_id_capture_config(global_config_dict: Any) -> TokenIdCaptureConfig:
    """The capture settings of a global config dict (an OmegaConf config or a plain mapping)."""
    if global_config_dict is not None and not isinstance(global_config_dict, dict):
        try:
            from omegaconf import OmegaConf

            global_config_dict = OmegaConf.to_container(global_config_dict, resolve=True)
        except (ImportError, ValueError):
            global_config_dict = dict(global_config_dict)
    return TokenIdCaptureConfig.model_validate(global_config_dict or {})


class CaptureComponent:
    """Base of NeMo Gym's capture components that nemo_gym does not implement (stores, staging
    handlers, adapters): one can be built, so a module or config that makes one on import loads,
    and any use of it raises :class:`TokenIdCaptureUnavailable` saying what to use instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise TokenIdCaptureUnavailable(UNAVAILABLE_MESSAGE.format(what=f"{type(self).__name__}.{name}"))


def unavailable(what: str) -> TokenIdCaptureUnavailable:
    """The error a capture operation nemo_gym does not implement raises."""
    return TokenIdCaptureUnavailable(UNAVAILABLE_MESSAGE.format(what=what))
