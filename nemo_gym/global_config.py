"""Compatibility: NeMo Gym's ``nemo_gym.global_config`` names, for trainers that import them (NeMo RL, verl, verifiers).

A compatibility layer with no logic of its own: the key-name constants clients use,
:class:`GlobalConfigDictParserConfig` (how a trainer describes the config it wants), and the
process's current global config, which ``nemo_gym.cli.RunHelper.start`` sets and verifiers
resets between stacks. Composition is :func:`nemo_gym.launch.config.load_config`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from nemo_gym.launch.config import (
    RAY_HEAD_NODE_ADDRESS_KEY_NAME,  # noqa: F401  (NeMo Gym's name, defined down in config)
    load_config,
    redact,
)
from nemo_gym.launch.launch_hooks import ENV_CONFIG_PATH
from nemo_gym.serving.launched_config import launched_global_config_dict_config

if TYPE_CHECKING:
    from omegaconf import DictConfig

# omegaconf (~5 MiB, ~0.1 s) is imported where a config is composed, not here: every server
# process imports this module (through server_utils and rollout_correlation) and never needs it.

NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME = ENV_CONFIG_PATH
CONFIG_PATHS_KEY_NAME = "config_paths"
ENTRYPOINT_KEY_NAME = "entrypoint"
DEFAULT_HOST_KEY_NAME = "default_host"
HEAD_SERVER_KEY_NAME = "head_server"
PORT_RANGE_LOW_KEY_NAME = "port_range_low"
PORT_RANGE_HIGH_KEY_NAME = "port_range_high"
# Accepted and ignored: every server runs in this one Python environment (no per-server venvs).
UV_VENV_DIR_KEY_NAME = "uv_venv_dir"
UV_CACHE_DIR_KEY_NAME = "uv_cache_dir"
SKIP_VENV_IF_PRESENT_KEY_NAME = "skip_venv_if_present"
DRY_RUN_KEY_NAME = "dry_run"
POLICY_BASE_URL_KEY_NAME = "policy_base_url"
POLICY_API_KEY_KEY_NAME = "policy_api_key"  # noqa: S105 - a key name, not a secret
POLICY_MODEL_NAME_KEY_NAME = "policy_model_name"
POLICY_MODEL_KEY_NAME = "policy_model"
TASK_INDEX_KEY_NAME = "_ng_task_index"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
RESPONSES_CREATE_PARAMS_KEY_NAME = "responses_create_params"
RESPONSE_KEY_NAME = "response"
AGENT_REF_KEY_NAME = "agent_ref"
# Where NeMo Gym 0.4.0 put server logs (its browsecomp_agent reads this key of the global config).
NEMO_GYM_LOG_DIR_KEY_NAME = "nemo_gym_log_dir"

_GLOBAL_CONFIG_DICT: DictConfig | None = None


class _NoModelConfig:
    """``NO_MODEL_GLOBAL_CONFIG_DICT``: a ``DictConfig`` built on first access (omegaconf then)."""

    _value: Any = None

    def __get__(self, instance: Any, owner: Any) -> DictConfig:
        if self._value is None:
            from omegaconf import DictConfig

            _NoModelConfig._value = DictConfig(
                {
                    "policy_base_url": "",
                    "policy_api_key": "",
                    "policy_model_name": "",
                    "policy_model": {"responses_api_models": {"dummy_model": {"entrypoint": "app.py"}}},
                }
            )
        return self._value  # type: ignore[no-any-return]


class GlobalConfigDictParserConfig(BaseModel):
    """Where the global config comes from (NeMo Gym's fields).

    ``initial_global_config_dict`` (a dict or an OmegaConf ``DictConfig``) is the trainer's own
    config; its ``config_paths`` are followed and it wins over them and over the env file.
    ``dotenv_path`` names the env.yaml to read (default: ``env.yaml`` in the working directory);
    ``skip_load_from_dotenv`` skips it; ``skip_load_from_cli`` ignores ``sys.argv``;
    ``hide_secrets`` redacts secret values in the result.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    dotenv_path: Path | None = None
    initial_global_config_dict: Any = None
    skip_load_from_cli: bool = False
    skip_load_from_dotenv: bool = False
    hide_secrets: bool = False
    # Accepted for NeMo Gym's signature: composing never reaches the network here.
    offline: bool = False

    # What NeMo Gym's tests merge in to compose a stack without a policy model.
    NO_MODEL_GLOBAL_CONFIG_DICT: ClassVar[DictConfig] = _NoModelConfig()  # type: ignore[assignment]

    def load(self) -> dict[str, Any]:
        """The composed config as a plain dict."""
        from omegaconf import DictConfig, OmegaConf

        initial = self.initial_global_config_dict
        if isinstance(initial, DictConfig):
            initial = OmegaConf.to_container(initial, resolve=False)
        if initial is not None and not isinstance(initial, Mapping):
            raise TypeError(
                f"initial_global_config_dict must be a dict or a DictConfig, got {type(initial).__name__}"
            )
        config = load_config(
            [] if self.skip_load_from_cli else sys.argv[1:],
            initial=initial,
            env_yaml=self.dotenv_path,
            read_env_yaml=not self.skip_load_from_dotenv,
        )
        return redact(config) if self.hide_secrets else config


def set_global_config_dict(
    global_config_dict_parser_config: GlobalConfigDictParserConfig | None = None,
) -> None:
    """Compose the global config and make it this process's current one."""
    from omegaconf import OmegaConf

    global _GLOBAL_CONFIG_DICT
    parser_config = global_config_dict_parser_config or GlobalConfigDictParserConfig()
    _GLOBAL_CONFIG_DICT = OmegaConf.create(parser_config.load())


def get_global_config_dict(
    global_config_dict_parser_config: GlobalConfigDictParserConfig | None = None,
) -> DictConfig:
    """The current global config: in a server ``ng_run`` started, the run's config it was
    launched with (other servers' secrets redacted); elsewhere composed on first use."""
    global _GLOBAL_CONFIG_DICT
    if _GLOBAL_CONFIG_DICT is None and global_config_dict_parser_config is None:
        _GLOBAL_CONFIG_DICT = launched_global_config_dict_config()
    if _GLOBAL_CONFIG_DICT is None:
        set_global_config_dict(global_config_dict_parser_config)
    assert _GLOBAL_CONFIG_DICT is not None
    return _GLOBAL_CONFIG_DICT


ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"
# A caller-chosen id for one rollout (NeMo RL stamps one per row): the rollout's calls carry it as
# their /ng-rollout/<id> prefix, and the row comes back with it.
ROLLOUT_ID_KEY_NAME = "_ng_rollout_id"
CACHE_DIR_KEY_NAME = "cache_dir"
RESULTS_DIR_KEY_NAME = "results_dir"
OBSERVABILITY_ENABLED_KEY_NAME = "observability_enabled"
DISALLOWED_PORTS_KEY_NAME = "disallowed_ports"
TOKEN_ID_CAPTURE_BLOCK = "token_id_capture"
TASK_SOURCE_KEY_NAME = "task_source"
SKILLS_REF_KEY_NAME = "skills_ref"
REWARD_KEY_NAME = "reward"
HF_TOKEN_KEY_NAME = "hf_token"  # noqa: S105 - a key name, not a secret


def get_hf_token() -> str | None:
    """The Hugging Face token in the global config (``hf_token``), if any."""
    return get_global_config_dict().get(HF_TOKEN_KEY_NAME)


def get_first_server_config_dict(global_config_dict: Any, top_level_path: str) -> Any:
    """The fields of instance ``top_level_path``: the block two levels below its name (kind, then implementation)."""
    block = global_config_dict[top_level_path]
    block = next(iter(block.values()))
    return next(iter(block.values()))


def maybe_get_global_config_dict() -> DictConfig | None:
    """The current global config, or None when none was composed (or launched with) in this process."""
    if _GLOBAL_CONFIG_DICT is None:
        return launched_global_config_dict_config()  # type: ignore[no-any-return]
    return _GLOBAL_CONFIG_DICT


def find_open_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (the socket is released: prefer binding port 0 yourself)."""
    from nemo_gym.launch.launcher import free_port

    return free_port(host)


class GlobalConfigDictParser:
    """NeMo Gym's config composer: ``GlobalConfigDictParser().parse(GlobalConfigDictParserConfig(...))``."""

    def parse(self, parse_config: GlobalConfigDictParserConfig | None = None) -> DictConfig:
        """The composed config (see :meth:`GlobalConfigDictParserConfig.load`) as a ``DictConfig``."""
        from omegaconf import OmegaConf

        return OmegaConf.create((parse_config or GlobalConfigDictParserConfig()).load())


def __getattr__(name: str) -> Any:
    # omegaconf's names, which NeMo Gym's module also exposes here, imported when asked for.
    if name in ("DictConfig", "OmegaConf"):
        import omegaconf

        return getattr(omegaconf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
