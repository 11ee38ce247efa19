"""The destination label of outbound HTTP calls (NeMo Gym's ``telemetry.connection_pool``).

A context variable naming the logical server a call goes to (``"external"`` when none is
named), so per-destination connection metrics stay bounded whatever the URLs.
"""

from __future__ import annotations

from contextvars import ContextVar, Token

__all__ = ["reset_server_name", "set_server_name"]

_SERVER_NAME: ContextVar[str] = ContextVar("nemo_gym_http_server_name", default="external")


def set_server_name(server_name: str) -> Token[str]:
    """Label the calls made in this context (and their retries) as going to ``server_name``."""
    return _SERVER_NAME.set(server_name)


def reset_server_name(token: Token[str]) -> None:
    """Restore the label that was current before :func:`set_server_name`."""
    _SERVER_NAME.reset(token)


def current_server_name() -> str:
    """The destination label of calls made now."""
    return _SERVER_NAME.get()
