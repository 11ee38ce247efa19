"""Turn a server's ``sandbox_provider`` field into the provider config it names.

A server config says which sandbox to use either by name (``sandbox_provider: sandbox``), naming a
top-level block of the merged config such as::

    sandbox:
      local: {workspace_root: /tmp/sandboxes}
      default_metadata: {sandbox-api: local}

or inline, as a one-key mapping ``{local: {...}}``. Switching providers is then switching which
provider config file is in ``config_paths``. ``default_metadata`` is reserved: its entries are
defaults for every sandbox's ``SandboxSpec.metadata`` (see :func:`resolve_provider_metadata`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_METADATA_KEY = "default_metadata"
RESERVED_KEYS = frozenset({DEFAULT_METADATA_KEY})


def _plain(value: Any) -> Any:
    """OmegaConf containers and other mappings as a plain ``dict``."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is installed with the project
        DictConfig = None  # type: ignore[assignment,misc]
    if DictConfig is not None and isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return dict(value) if isinstance(value, Mapping) else value


def _provider_names(block: Mapping[str, Any]) -> list[str]:
    return [key for key in block if key not in RESERVED_KEYS]


def _sandbox_blocks(named: Mapping[str, Any] | None) -> list[str]:
    """Top-level names whose block looks like a sandbox block (for the error message)."""
    names = []
    for key, value in (named or {}).items():
        plain = _plain(value)
        if isinstance(plain, Mapping) and len(_provider_names(plain)) == 1:
            names.append(str(key))
    return sorted(names)


def _block(sandbox_provider: str | Mapping[str, Any], named: Mapping[str, Any] | None) -> tuple[Any, str]:
    if isinstance(sandbox_provider, str):
        if not sandbox_provider:
            raise ValueError("Sandbox provider reference must be a non-empty string")
        block = named.get(sandbox_provider) if named is not None else None
        if block is None:
            known = ", ".join(repr(n) for n in _sandbox_blocks(named)) or "(none)"
            raise ValueError(
                f"Sandbox provider reference {sandbox_provider!r} is not defined in the merged config. "
                f"Add a top-level {sandbox_provider!r} block (for example by putting "
                f"nemo_gym/sandbox/providers/local/configs/local.yaml in config_paths). "
                f"Available sandbox configs: {known}"
            )
        return _plain(block), f"reference {sandbox_provider!r}"
    if isinstance(sandbox_provider, Mapping):
        return _plain(sandbox_provider), "inline sandbox_provider config"
    raise TypeError(
        "sandbox_provider must be a config name (str) or a one-key mapping {provider_name: config}, "
        f"got {type(sandbox_provider).__name__}"
    )


def resolve_provider_config(
    sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``{provider_name: provider_config}`` for :func:`nemo_gym.sandbox.create_provider`.

    ``sandbox_provider`` is the name of a top-level block of ``named_configs`` (usually the
    merged global config) or an inline one-key mapping. Reserved keys are left out. A missing
    name, or a block with zero or several provider keys, is a ``ValueError`` that says which.
    """
    block, source = _block(sandbox_provider, named_configs)
    if not isinstance(block, Mapping):
        raise ValueError(f"Sandbox provider config from {source} must be a mapping, got: {block!r}")
    names = _provider_names(block)
    if len(names) != 1:
        raise ValueError(
            f"Sandbox provider config from {source} must have exactly one provider key "
            f"{{provider_name: config}}, got keys: {names!r}"
        )
    return {names[0]: block[names[0]]}


def resolve_provider_metadata(
    sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The block's ``default_metadata`` (``{}`` when it has none): defaults that a server merges
    under its own ``SandboxSpec.metadata``."""
    block, source = _block(sandbox_provider, named_configs)
    if not isinstance(block, Mapping):
        raise ValueError(f"Sandbox provider config from {source} must be a mapping, got: {block!r}")
    metadata = block.get(DEFAULT_METADATA_KEY) or {}
    if not isinstance(metadata, Mapping):
        raise ValueError(
            f"Sandbox {DEFAULT_METADATA_KEY!r} from {source} must be a mapping, got: {metadata!r}"
        )
    return dict(metadata)
