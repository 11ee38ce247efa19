"""The failure vocabulary: the one home of every failure class a rollout can end with.

The project's central promise is that an infrastructure failure is never a reward: a rollout
that could not run to the end becomes a failure row whose ``_ng_failure_class`` says why. Every
place that names a class uses a constant from here, so the words cannot drift apart:

- infrastructure faults of a hop (:data:`INFRA_FAILURE_CLASSES`): ``unreachable`` (no connection,
  no such server), ``timeout``, ``rate_limited`` (429 after the server's own retries),
  ``upstream_auth`` (401/403), ``upstream_5xx``, ``bad_upstream_body`` (a 2xx that is not what
  the hop returns, or an answer that is not HTTP);
- ``upstream_error``: a server further down failed in a way it did not classify;
- ``judge_failed``: a judge model could not give a verdict;
- ``verifier_timeout``, ``verifier_error``, ``sandbox_failed``: a verifier ran out of wall-clock
  time because of the machine (a budget the policy's own output used up is a reward of 0, not
  this), its worker died, or the sandbox it runs code in failed for its own reasons;
- ``agent_error``: the agent server itself failed (a bug, a row it cannot run);
- ``malformed_input``: an input line the collector could not use.

:class:`~nemo_gym.serving.server_client.ServerCallError` has its own small set of *kinds*
(:data:`CallErrorKind`); :func:`failure_class_of_call` is the one map from a kind to a class.
This module is public (environment folders import it) and imports nothing, so any layer may use
it. NeMo Gym's own ``failure_kind`` words (``transport_unreachable``, ...) are a separate
vocabulary, in :mod:`nemo_gym.failure_kinds`.
"""

from __future__ import annotations

from typing import Final, Literal

UNREACHABLE: Final = "unreachable"
TIMEOUT: Final = "timeout"
RATE_LIMITED: Final = "rate_limited"
UPSTREAM_AUTH: Final = "upstream_auth"
UPSTREAM_5XX: Final = "upstream_5xx"
BAD_UPSTREAM_BODY: Final = "bad_upstream_body"
UPSTREAM_ERROR: Final = "upstream_error"
JUDGE_FAILED: Final = "judge_failed"
VERIFIER_TIMEOUT: Final = "verifier_timeout"
VERIFIER_ERROR: Final = "verifier_error"
SANDBOX_FAILED: Final = "sandbox_failed"
AGENT_ERROR: Final = "agent_error"
MALFORMED_INPUT: Final = "malformed_input"

FailureClass = Literal[
    "unreachable",
    "timeout",
    "rate_limited",
    "upstream_auth",
    "upstream_5xx",
    "bad_upstream_body",
    "upstream_error",
    "judge_failed",
    "verifier_timeout",
    "verifier_error",
    "sandbox_failed",
    "agent_error",
    "malformed_input",
]

# The classes of an infrastructure fault in one hop (never handed to the model, never verified).
INFRA_FAILURE_CLASSES: Final = (
    UNREACHABLE,
    TIMEOUT,
    RATE_LIMITED,
    UPSTREAM_AUTH,
    UPSTREAM_5XX,
    BAD_UPSTREAM_BODY,
)
# Classes too generic to win over a more specific one found in the same failure's body or text.
GENERIC_FAILURE_CLASSES: Final = frozenset({AGENT_ERROR, UPSTREAM_ERROR, UPSTREAM_5XX})

# ---- the kinds of a failed call between servers ----------------------------------------------
NOT_FOUND: Final = "not_found"
HTTP_ERROR: Final = "http_error"
HOP_FAULT: Final = "hop_fault"

# What a transport can end a call with (no usable HTTP answer).
TransportFailureKind = Literal["unreachable", "timeout", "bad_upstream_body"]
# A ServerCallError's kind: a transport failure, no such server, an error status, a classified hop fault.
CallErrorKind = Literal["unreachable", "timeout", "bad_upstream_body", "not_found", "http_error", "hop_fault"]

# The one map from a failed call's kind to the failure class of the rollout it ends.
_CLASS_OF_CALL_KIND: Final[dict[str, FailureClass]] = {
    UNREACHABLE: UNREACHABLE,
    NOT_FOUND: UNREACHABLE,  # no such server registered: nothing to connect to
    TIMEOUT: TIMEOUT,
    BAD_UPSTREAM_BODY: BAD_UPSTREAM_BODY,
}


def failure_class_of_call(kind: str, default: FailureClass = UPSTREAM_ERROR) -> FailureClass:
    """The failure class of a call that failed with ``kind`` (``default`` for ``http_error`` and others)."""
    return _CLASS_OF_CALL_KIND.get(kind, default)
