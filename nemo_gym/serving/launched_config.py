"""The run's global config as the launcher handed it to this server process.

``ng_run`` puts the composed run config in each server's launch payload (stdin, or the Ray
actor's copy of it), with every other server's secrets redacted
(:func:`nemo_gym.serving.secrets.redact_other_servers`). ``BaseServer.from_env`` installs it here;
``nemo_gym.global_config.get_global_config_dict()`` and a NeMo Gym-style server's
``server_client.global_config_dict`` then answer it instead of composing a config from argv.

Kept as plain JSON until someone asks for the OmegaConf form: our own servers never do, and
omegaconf stays out of their processes (tests/test_lean_server_imports.py).
"""

from __future__ import annotations

from typing import Any

_plain: dict[str, Any] | None = None
_dict_config: Any = None


def install_launched_global_config(config: dict[str, Any] | None) -> None:
    """Make ``config`` this process's launched global config (None forgets it)."""
    global _plain, _dict_config
    _plain = dict(config) if config is not None else None
    _dict_config = None


def launched_global_config() -> dict[str, Any] | None:
    """The launched global config as plain JSON, or None when this process was not launched with one."""
    return _plain


def launched_global_config_dict_config() -> Any:
    """The launched global config as one shared OmegaConf ``DictConfig`` (built on first call), or None."""
    global _dict_config
    if _plain is None:
        return None
    if _dict_config is None:
        from omegaconf import OmegaConf

        _dict_config = OmegaConf.create(_plain)
    return _dict_config
