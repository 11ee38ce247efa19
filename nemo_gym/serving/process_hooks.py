"""Process-wide hooks of a server process: liveness counters and cleanups run when it stops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Process-wide extras that code running inside a server process adds (the sandbox ledger):
# counters shown in the liveness answer, and cleanups run when it stops, of a server that is its own process
# (uvicorn re-raises SIGTERM after its graceful shutdown, so atexit handlers never run;
# an embedded server leaves them to its host process).
LIVENESS_METRICS: dict[str, Callable[[], Any]] = {}
SHUTDOWN_CLEANUPS: dict[str, Callable[[], None]] = {}
