"""Names every hop between nemo_gym processes shares, and the process settings they need.

The environment variables a launched server reads, the session cookie, the rollout path prefix,
the auth header, the open-file limit, and how an on-by-default switch is read from the environment. Both the server base (``nemo_gym.serving.server``) and the
client (``nemo_gym.serving.server_client``) build on these, so neither has to import the other's
internals: the server uses the client, never the reverse.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Sequence

ENV_SERVER_CONFIG = "NEMO_GYM_SERVER_CONFIG"
ENV_INSTANCE_NAME = "NEMO_GYM_INSTANCE_NAME"
ENV_HEAD_URL = "NEMO_GYM_HEAD_URL"
ENV_AUTH_TOKEN = "NEMO_GYM_AUTH_TOKEN"
# Set to "stdin" by the launcher: the child reads its config and secrets as JSON from stdin
# (never from its environment, which other processes of the same user can read in /proc).
ENV_LAUNCH_PAYLOAD = "NEMO_GYM_LAUNCH_PAYLOAD"
# Set by the Ray backend: the node a server process runs on, registered with the head server.
ENV_NODE_ID = "NEMO_GYM_NODE_ID"
ENV_NODE_IP = "NEMO_GYM_NODE_IP"
# Set by a launcher that re-executed itself to drop the token from its environment: the number
# of an inherited pipe holding the token (read once, then closed).
ENV_AUTH_TOKEN_FD = "NEMO_GYM_AUTH_TOKEN_FD"
REGISTRATION_SECRET_HEADER = "X-NeMo-Gym-Registration-Secret"
AUTH_HEADER = "authorization"
SESSION_COOKIE = "session_id"
ROLLOUT_PATH_SEGMENT = "ng-rollout"
ROLLOUT_PREFIX = f"/{ROLLOUT_PATH_SEGMENT}/"
# ``/ng-rollout/<id>/training-token-capture/v1/...``: NeMo Gym's path asking a model server to
# capture the call's training tokens (nemo_gym.token_id_capture).
TOKEN_CAPTURE_PATH_SEGMENT = "training-token-capture"
# A resources server's tools over MCP (NeMo Gym's names): /seed_session answers
# {"mcp": {"url_path": "/mcp", "headers": {MCP_SESSION_TOKEN_HEADER: token}, ...}}.
MCP_METADATA_KEY = "mcp"
MCP_SESSION_TOKEN_HEADER = "X-NeMo-Gym-Session-Token"
MCP_URL_PATH = "/mcp"
# In an MCP tool error's _meta: the failure class of an infrastructure fault behind the tool.
MCP_FAILURE_CLASS_META = "nemo_gym/failure_class"
# An ASGI scope key naming the session of an in-process request (an MCP tool call run through
# the server's own route); scopes are built in-process only, never from the wire.
SESSION_SCOPE_KEY = "nemo_gym.session_id"
RESERVED_MCP_TOOL_NAMES = frozenset({"verify", "seed_session", "close_session", "aggregate_metrics", "mcp"})


def normalize_tool_name(name: str, server_name: str | None = None) -> str:
    """The bare tool name of a namespaced one (``mcp__<server>__<tool>`` → ``<tool>``).

    MCP-native agents record tool names namespaced per server; verifiers compare bare names.
    With ``server_name`` only that server's prefix is removed. Other names pass unchanged.
    """
    if not name.startswith("mcp__"):
        return name
    if server_name is not None:
        prefix = f"mcp__{server_name}__"
        return name[len(prefix) :] if name.startswith(prefix) else name
    _, sep, bare = name[len("mcp__") :].partition("__")
    return bare if sep else name


# Secrets this process was handed at start-up (see ENV_LAUNCH_PAYLOAD); kept out of os.environ
# so that child processes (sandboxes, engines) do not inherit them.
_handed: dict[str, str] = {}


def set_process_secrets(auth_token: str | None = None, registration_secret: str | None = None) -> None:
    """Record the auth token and registration secret this process was handed (not in its environment)."""
    if auth_token:
        _handed["auth_token"] = auth_token
    if registration_secret:
        _handed["registration_secret"] = registration_secret


def auth_token() -> str | None:
    """The shared auth token: the one handed at start-up, else ``NEMO_GYM_AUTH_TOKEN``."""
    return _handed.get("auth_token") or os.environ.get(ENV_AUTH_TOKEN) or None


def take_auth_token_from_environment(reexec_argv: Sequence[str] | None = None) -> None:
    """Move ``NEMO_GYM_AUTH_TOKEN`` out of this process's environment into its handed secrets.

    Removing it from ``os.environ`` hides it from every process started later, but not from
    ``/proc/<pid>/environ``, which shows the environment the process was started with. With
    ``reexec_argv`` (a command's own argv, after the interpreter) the process then re-executes
    itself without the variable, handing the token over an inherited pipe: the same pid, and no
    copy of the token left in its start-up environment. A re-executed process finds the pipe
    through ``NEMO_GYM_AUTH_TOKEN_FD``. If the re-exec fails the process goes on, the variable
    removed from ``os.environ`` only.
    """
    fd_text = os.environ.pop(ENV_AUTH_TOKEN_FD, None)
    if fd_text is not None and fd_text.isdigit():
        with os.fdopen(int(fd_text), "rb") as pipe:
            set_process_secrets(auth_token=pipe.read().decode() or None)
    token = os.environ.pop(ENV_AUTH_TOKEN, None)
    if not token:
        return
    set_process_secrets(auth_token=token)
    if reexec_argv is None:
        return
    read, write = os.pipe()
    os.write(write, token.encode())  # a pipe holds 64 KiB: never blocks for a token
    os.close(write)
    os.set_inheritable(read, True)
    env = {**os.environ, ENV_AUTH_TOKEN_FD: str(read)}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *reexec_argv], env)
    except OSError:
        os.close(read)


def registration_secret() -> str | None:
    """The stack's registration secret, when this process was handed one."""
    return _handed.get("registration_secret")


def auth_headers() -> dict[str, str]:
    """The auth header for outbound calls when an auth token is set."""
    token = auth_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def raise_fd_limit() -> int:
    """Raise the soft open-file limit to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def switched_on(name: str) -> bool:
    """Whether the on-by-default switch in environment variable ``name`` is on: unset or anything
    but ``0``, ``false``, ``no`` or ``off`` (in any case, spaces around ignored)."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")
