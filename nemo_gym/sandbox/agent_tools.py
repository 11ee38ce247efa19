"""Helpers for agents that run their harness inside a sandbox: which URL the sandbox can reach a
server at, MCP tool servers seeded for it, and verification of what it produced."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

MCP_METADATA_KEY = "mcp"


def _server_url(name: str) -> str:
    """``http://host:port`` of server instance ``name`` in the global config
    (``name → server kind → implementation → {host, port, ...}``)."""
    from nemo_gym.global_config import get_global_config_dict

    block = get_global_config_dict().get(name)
    for kind in (block or {}).values():
        for fields in (kind or {}).values() if isinstance(kind, Mapping) else ():
            if isinstance(fields, Mapping) and "host" in fields and "port" in fields:
                return f"http://{fields['host']}:{fields['port']}"
    raise ValueError(f"server {name!r} has no host and port in the global config")


def get_server_url(name: str) -> str:
    """``http://host:port`` of server instance ``name``: NeMo Gym's module has this name (it
    imports ``nemo_gym.server_utils.get_server_url``), and its agents' tests replace it here to
    move where :func:`sandbox_server_url` points."""
    return _server_url(name)


def sandbox_server_url(name: str, *, require_reachable: bool = False) -> str:
    """The base URL of server ``name`` as a sandbox should use it. A wildcard bind address becomes
    loopback (right for a sandbox on the host's network); with ``require_reachable`` a loopback or
    wildcard address is an error, since a remote sandbox cannot reach it."""
    base = get_server_url(name).rstrip("/")
    parts = urlsplit(base)
    if require_reachable:
        reachable_host(base)
    elif parts.hostname in {"0.0.0.0", "::"}:
        host = "[::1]" if parts.hostname == "::" else "127.0.0.1"
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return base


def reachable_host(url: str) -> str:
    """The host of ``url``; a loopback, wildcard or ``localhost`` host is a ``ValueError``."""
    host = urlsplit(url).hostname
    try:
        address = ipaddress.ip_address(host) if host else None
    except ValueError:
        address = None
    if (
        not host
        or host.lower().rstrip(".") == "localhost"
        or (address and (address.is_loopback or address.is_unspecified))
    ):
        raise ValueError(
            f"{url} is not reachable from a remote sandbox: bind the server to an address the sandbox "
            "can reach (use_absolute_ip=true) instead of loopback"
        )
    return host


def restricted_network_policy(provider_name: str, urls: list[str]) -> dict[str, object]:
    """An egress policy that allows only ``urls``' hosts. Only a provider with network policies can
    enforce one; any other is refused rather than left open."""
    if provider_name != "opensandbox":
        raise ValueError(
            f"restricted network access needs a provider with network policies (OpenSandbox's, named "
            f"'opensandbox'); {provider_name!r} has none here: use network off (the default) or on"
        )
    hosts = sorted({reachable_host(url) for url in urls})
    return {"defaultAction": "deny", "egress": [{"action": "allow", "target": host} for host in hosts]}


async def _json_answer(response: Any) -> Any:
    if not getattr(response, "ok", True):
        response.raise_for_status()
    return orjson.loads(await response.read())


async def seed_mcp_servers(
    client: Any,
    servers: list[Any],
    body: Any,
    cookies: Mapping[str, str],
    *,
    timeout_s: float,
    require_reachable: bool = False,
) -> dict[str, dict[str, object]]:
    """Seed each tool server for this rollout and return MCP client entries (URL, the session's
    auth headers) for the harness inside the sandbox. A server without authenticated MCP tools
    is an error."""
    entries: dict[str, dict[str, object]] = {}
    for server in servers:
        seeded = await client.post(
            server_name=server.name, url_path="/seed_session", json=body.model_dump(), cookies=cookies
        )
        metadata = (await _json_answer(seeded)).get(MCP_METADATA_KEY)
        if not isinstance(metadata, dict) or not metadata.get("headers"):
            raise ValueError(f"Tool server {server.name} must expose authenticated MCP tools")
        url_path = str(metadata.get("url_path", "/mcp")).lstrip("/")
        entries[server.name] = {
            "url": f"{sandbox_server_url(server.name, require_reachable=require_reachable)}/{url_path}",
            "headers": metadata["headers"],
            "enabled": True,
            "timeout": int(timeout_s * 1000),
        }
    return entries


async def verify_agent_response(
    client: Any,
    server: Any,
    body: Any,
    response: Any,
    cookies: Mapping[str, str],
    *,
    force_zero_reward: bool,
) -> dict[str, Any]:
    """Verify ``response`` with the environment. With ``force_zero_reward`` (the harness failed)
    the verifier scores an empty output, so every score field is its own zero, and the row keeps
    the real response and says ``failure_kind: agent_run_error``; a verifier that does not score
    an empty answer as an unmasked zero is an error."""
    graded = response.model_copy(update={"output": []}) if force_zero_reward else response
    verified = await client.post(
        server_name=server.name,
        url_path="/verify",
        cookies=cookies,
        json=body.model_dump(mode="json") | {"response": graded.model_dump(mode="json")},
    )
    result: dict[str, Any] = await _json_answer(verified)
    if force_zero_reward:
        if result.get("reward") != 0 or result.get("mask_sample", False):
            raise ValueError(
                "execution_failure_reward_zero requires a verifier that scores an empty response as unmasked zero"
            )
        result.update(
            response=response.model_dump(mode="json"),
            failure_kind="agent_run_error",
            failure_reason="the agent's harness failed; scored as an empty response by the verifier",
        )
    return result
