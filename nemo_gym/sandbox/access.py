"""A JSON-serialisable way for another component to use a sandbox that someone else owns."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue


class DirectSandboxConnection(BaseModel):
    """Reconnect through the top-level sandbox provider config named ``provider_config_ref``,
    with the provider's handle ``descriptor``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["direct"] = "direct"
    provider_config_ref: str
    descriptor: dict[str, JsonValue]


class SandboxAccess(BaseModel):
    """What a borrower of an owner-managed sandbox gets: how to connect, and where to work."""

    model_config = ConfigDict(extra="forbid")

    connection: DirectSandboxConnection
    workdir: str
