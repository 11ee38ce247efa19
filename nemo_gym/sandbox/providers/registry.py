"""Provider names → provider classes.

Lookup order: classes given to :func:`register_provider`, then the providers shipped here
(imported only when asked for, so an optional SDK is needed only by its provider), then entry
points in the ``nemo_gym.sandbox_providers`` group published by other installed packages.

NeMo Gym's other back ends (:data:`NOT_SHIPPED`: cloud services and cluster runtimes) are
names here too, as in NeMo Gym, where a provider's SDK is imported only when a sandbox is made:
a config naming one validates (an agent checks its ``sandbox_provider`` at start), and making a
sandbox with it fails, saying the provider is not part of this project and what to use instead.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from nemo_gym.sandbox.providers.base import SandboxCreateError, SandboxProvider

logger = logging.getLogger("nemo_gym.sandbox")

ENTRY_POINT_GROUP = "nemo_gym.sandbox_providers"

# name → "module:Class", imported on first use.
BUILTIN_PROVIDERS = {
    "local": "nemo_gym.sandbox.providers.local:LocalProvider",
    "docker": "nemo_gym.sandbox.providers.docker:DockerProvider",
    "podman": "nemo_gym.sandbox.providers.docker:PodmanProvider",
    "apptainer": "nemo_gym.sandbox.providers.apptainer:ApptainerProvider",
}

# NeMo Gym's provider names this project does not implement: name → what the back end is.
NOT_SHIPPED = {
    "daytona": "Daytona's cloud sandboxes",
    "e2b": "E2B's cloud sandboxes",
    "ecs_fargate": "AWS ECS Fargate tasks",
    "enroot": "NVIDIA enroot containers",
    "opensandbox": "an OpenSandbox server",
    "openshell": "an OpenShell gateway",
}

_registered: dict[str, type] = {}


def _not_shipped(name: str) -> type:
    """A provider class for NeMo Gym's ``name`` whose construction names what to use instead."""

    def refuse(self: object, **config: Any) -> None:
        raise SandboxCreateError(
            f"sandbox provider {name!r} (NeMo Gym's, for {NOT_SHIPPED[name]}) is not implemented "
            f"in this project: use one of {', '.join(sorted(BUILTIN_PROVIDERS))}, or install a package "
            f"publishing {name!r} in the entry point group {ENTRY_POINT_GROUP!r}"
        )

    doc = (
        f"NeMo Gym's {name!r} provider ({NOT_SHIPPED[name]}): not implemented here; constructing it says so."
    )
    return type(
        f"NotShipped_{name}", (SandboxProvider,), {"__init__": refuse, "__doc__": doc, "__module__": __name__}
    )


def _entry_points() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found:
            raise ValueError(
                f"two installed packages publish the sandbox provider {ep.name!r}; uninstall one"
            )
        found[ep.name] = ep
    return found


def register_provider(name: str, provider_class: type, *, override: bool = False) -> None:
    """Make ``provider_class`` available as ``name`` in this process."""
    if not name:
        raise ValueError("Provider name must be non-empty")
    if not override and (name in _registered or name in BUILTIN_PROVIDERS):
        raise ValueError(
            f"Sandbox provider {name!r} is already registered (pass override=True to replace it)"
        )
    _registered[name] = provider_class


def get_provider_class(name: str) -> type:
    """The class of provider ``name``; an unknown name lists the known ones."""
    if name in _registered:
        return _registered[name]
    if name in BUILTIN_PROVIDERS:
        module_name, class_name = BUILTIN_PROVIDERS[name].split(":")
        cls: type = getattr(importlib.import_module(module_name), class_name)
        return cls
    ep = _entry_points().get(name)
    if ep is not None:
        loaded: type = ep.load()
        return loaded
    if name in NOT_SHIPPED:
        return _not_shipped(name)
    raise ValueError(f"Unknown sandbox provider {name!r}. Available providers: {', '.join(list_providers())}")


def create_provider(config: Mapping[str, Any]) -> SandboxProvider:
    """Instantiate a provider from ``{name: {constructor keyword arguments}}``."""
    if not isinstance(config, Mapping) or len(config) != 1:
        raise ValueError(
            f"Sandbox provider config must have exactly one key, the provider name, got {list(config or {})!r}"
        )
    name, kwargs = next(iter(config.items()))
    if not isinstance(name, str) or not name:
        raise ValueError("Sandbox provider name must be a non-empty string")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"Sandbox provider {name!r} config must be a mapping, got {type(kwargs).__name__}")
    provider: SandboxProvider = get_provider_class(name)(**dict(kwargs))
    return provider


def list_providers() -> list[str]:
    """Every provider name this process can create."""
    return sorted({*_registered, *BUILTIN_PROVIDERS, *_entry_points()})
