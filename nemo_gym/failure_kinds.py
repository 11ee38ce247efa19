"""Compatibility: NeMo Gym's shared failure vocabulary (``nemo_gym.failure_kinds``) and episode stages.

A failure kind names *what* went wrong, in a few low-cardinality words that are safe as a
metric label; whether to retry, mask or tell someone lives on the failure record, not here.
An environment may add its own kinds as ``<server>:<kind>``. An unknown name is accepted and
logged once (never rejected: a dropped failure is worse than an odd label).

Our collector's own failure classes (``timeout``, ``unreachable``, ``judge_failed``, ...) are a
separate vocabulary with its home in :mod:`nemo_gym.failure_classes`; ``judge_failed`` is the same
word in both.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

logger = logging.getLogger(__name__)

FailureStage = Literal["admission", "seed", "agent", "verification", "cleanup"]

TRANSPORT_UNREACHABLE = "transport_unreachable"
TRANSPORT_PEER_DROP = "transport_peer_drop"
TRANSPORT_TIMEOUT = "transport_timeout"
TRANSPORT_LOCAL_RESOURCE = "transport_local_resource"
AGENT_RUN_ERROR = "agent_run_error"
AGENT_REQUEST_FAILED = "agent_request_failed"
AGENT_TIMEOUT = "agent_timeout"
AGENT_COMMAND_NOT_ALLOWED = "agent_command_not_allowed"
JUDGE_FAILED = "judge_failed"
JUDGE_UNPARSEABLE = "judge_unparseable"
VERIFIER_ERROR = "verifier_error"
PROVIDER_UNAVAILABLE = "provider_unavailable"
PROVIDER_QUOTA_EXHAUSTED = "provider_quota_exhausted"
PROVIDER_OOM_KILLED = "provider_oom_killed"
SESSION_LOST = "session_lost"
SESSION_EXPIRED = "session_expired"
SESSION_RELEASE_FAILED = "session_release_failed"
CANCELLED = "cancelled"
KILL_SHAPED = "kill_shaped"
SHUTDOWN = "shutdown"
PERSISTENCE_FAILED = "persistence_failed"
COHORT_INCOMPLETE = "cohort_incomplete"

FAILURE_KINDS: frozenset[str] = frozenset(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)

_NAMESPACED = re.compile(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*")
_reported_unknown: set[str] = set()


def is_registered(name: str) -> bool:
    """Whether ``name`` is one of the shared kinds."""
    return name in FAILURE_KINDS


def is_namespaced(name: str) -> bool:
    """Whether ``name`` is an environment's own ``<server>:<kind>``."""
    return _NAMESPACED.fullmatch(name) is not None


def validate_failure_kind(name: str | None) -> str | None:
    """``name`` unchanged; an unregistered, un-namespaced name is logged once per process."""
    if name is None or is_registered(name) or is_namespaced(name):
        return name
    if name not in _reported_unknown:
        _reported_unknown.add(name)
        logger.warning(
            "failure_kind %r is not a shared kind; name it '<server>:<kind>' to extend the list", name
        )
    return name
