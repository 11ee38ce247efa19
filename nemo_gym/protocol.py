"""Names every hop between nemo_gym processes shares, and the two process settings they need.

The environment variables a launched server reads, the session cookie, the rollout path prefix,
the auth header, and the open-file limit. Both the server base (``nemo_gym.server``) and the
client (``nemo_gym.server_client``) build on these, so neither has to import the other's
internals: the server uses the client, never the reverse.
"""

from __future__ import annotations

import os
import resource

ENV_SERVER_CONFIG = "NEMO_GYM_SERVER_CONFIG"
ENV_INSTANCE_NAME = "NEMO_GYM_INSTANCE_NAME"
ENV_HEAD_URL = "NEMO_GYM_HEAD_URL"
ENV_AUTH_TOKEN = "NEMO_GYM_AUTH_TOKEN"
AUTH_HEADER = "authorization"
SESSION_COOKIE = "session_id"
ROLLOUT_PREFIX = "/ng-rollout/"


def auth_headers() -> dict[str, str]:
    """The auth header for outbound calls when ``NEMO_GYM_AUTH_TOKEN`` is set."""
    token = os.environ.get(ENV_AUTH_TOKEN)
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
