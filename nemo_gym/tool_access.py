"""Compatibility: NeMo Gym's tool-access descriptions (``nemo_gym.tool_access``): how an agent reaches one
named set of tools, either typed HTTP routes (``direct_http``) or an MCP server over streamable
HTTP (``mcp``). ``required`` says whether failing to connect fails the session."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class DirectHTTPToolAccess(BaseModel):
    """Tools as typed HTTP routes under ``base_url`` (for a trusted in-process agent)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["direct_http"] = "direct_http"
    name: str = Field(min_length=1, pattern=_NAME)
    required: bool
    base_url: AnyHttpUrl
    cookies: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)


class MCPStreamableHTTPConnection(BaseModel):
    """An MCP server's absolute streamable-HTTP endpoint and the headers to send it."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["streamable_http"] = "streamable_http"
    url: AnyHttpUrl
    headers: dict[str, str] = Field(default_factory=dict)


class MCPToolAccess(BaseModel):
    """One named MCP server an agent connects to for a session (names are unique per session)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["mcp"] = "mcp"
    name: str = Field(min_length=1, pattern=_NAME)
    required: bool
    connection: MCPStreamableHTTPConnection


ToolAccess = Annotated[DirectHTTPToolAccess | MCPToolAccess, Field(discriminator="kind")]
