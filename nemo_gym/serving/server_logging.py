"""A server process's logging: plain stderr, quiet on the hot path, secrets hidden."""

from __future__ import annotations

import logging
import os
import sys

from nemo_gym.serving.secrets import RedactingFilter


def configure_logging() -> None:
    """Plain stderr logging at warning level (no per-request logs on the hot path), secrets hidden."""
    level = os.environ.get("NEMO_GYM_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
