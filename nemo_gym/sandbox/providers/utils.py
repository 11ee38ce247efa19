"""Small pieces the providers share."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any


def coerce_config(value: Any, config_cls: type[Any]) -> Any:
    """A provider's config section as ``config_cls``: given as one, as a mapping (YAML) or absent."""
    if value is None:
        return config_cls()
    if isinstance(value, config_cls):
        return value
    if isinstance(value, Mapping):
        return config_cls(**value)
    raise TypeError(f"{config_cls.__name__} must be a mapping or {config_cls.__name__} instance")


def path_under_mount(mount_point: str, path: str) -> str | None:
    """``path`` relative to ``mount_point`` when it lies beneath it (``""`` for the mount point
    itself), else None. Only absolute POSIX paths are considered."""
    if not path.startswith("/"):
        return None
    mount = posixpath.normpath(mount_point.rstrip("/") or "/")
    target = posixpath.normpath(path)
    if target == mount:
        return ""
    if mount == "/":
        return target.lstrip("/")
    return target[len(mount) + 1 :] if target.startswith(mount + "/") else None
