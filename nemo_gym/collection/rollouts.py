"""One rollout: send a row to its agent's ``/run`` and classify what came back.

:func:`run_one` never raises for a failed rollout: it returns a :class:`RolloutOutcome` with the
verify answer, or a failure class (``timeout``, ``unreachable``, ``agent_error``, ``judge_failed``,
...) and the error. :class:`RolloutFailedError` is how ``run_examples`` hands a failure to a
trainer: picklable, with an HTTP ``status`` and the agent's ``response_content``.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from nemo_gym.agents.agent_hops import rollout_timeout_s as default_rollout_timeout_s
from nemo_gym.collection.collection_io import (
    AGENT_REF_KEY,
    ATTEMPT_INDEX_KEY,
    FAILURE_CLASS_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    agent_name_of,
    row_key,
)
from nemo_gym.collection.row_keys import ROLLOUT_ID_KEY
from nemo_gym.failure_classes import (
    AGENT_ERROR,
    BAD_UPSTREAM_BODY,
    GENERIC_FAILURE_CLASSES,
    HTTP_ERROR,
    JUDGE_FAILED,
    TIMEOUT,
    UNREACHABLE,
    failure_class_of_call,
)
from nemo_gym.serving.server_client import ServerCallError, ServerClient, ServerResponse, raise_for_status

MAX_ERROR_CHARS = 4000
MAX_RESPONSE_CONTENT_BYTES = 64 * 1024
_ROLLOUT_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_FAILURE_CLASS_IN_TEXT = re.compile(r"failure_class[\"']?\s*[:=]\s*[\"']?([a-z][a-z0-9_]*)")
# The HTTP status a failure without one stands for: 5xx for infrastructure, 4xx for the row itself.
_FAILURE_STATUS = {TIMEOUT: 504, UNREACHABLE: 503}


@dataclass
class RolloutOutcome:
    """What became of one row: ``result`` (the agent's verify answer) or a failure class and error."""

    row: dict[str, Any]
    result: dict[str, Any] | None = None
    failure_class: str | None = None
    error: str | None = None
    elapsed_s: float = 0.0
    status: int | None = None  # the agent's HTTP status, when it answered an error
    response_content: bytes | None = None  # the agent's error body, when it answered one
    # A verify answer that named its own failure: its fields (``response`` left out), kept in
    # the failures row as NeMo Gym keeps the answer (``error``, diagnostics).
    failure_fields: dict[str, Any] | None = None


class RolloutFailedError(Exception):
    """A rollout failed; ``failure_class`` is timeout, unreachable, agent_error, judge_failed, ...

    ``status`` is an HTTP status, as trainers classify failures by it: the agent's own status
    when it answered an error (4xx: the row is at fault; 5xx: a server is), else 504 for a
    timeout, 503 for an unreachable server, 400 for a row that cannot be sent, 502 otherwise.
    ``response_content`` is the agent's error body (bytes, as NeMo Gym's errors carry it), or
    the error text when no server answered. The error pickles (it crosses Ray actor boundaries)
    with all of its fields.
    """

    def __init__(
        self,
        row: dict[str, Any],
        failure_class: str,
        error: str,
        status: int | None = None,
        response_content: bytes | None = None,
    ) -> None:
        super().__init__(f"rollout failed ({failure_class}): {error}")
        self.row = row
        self.failure_class = failure_class
        self.error = error
        self.status = status if status is not None else _FAILURE_STATUS.get(failure_class, 502)
        self.response_content = response_content if response_content is not None else error.encode()

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.row, self.failure_class, self.error, self.status, self.response_content))


def classify_error(body: Any, text: str) -> str:
    """The failure class of an agent's error answer.

    A specific class wins: the body's ``failure_class`` (servers set it, e.g. ``judge_failed``,
    or ``unreachable``/``timeout`` for a server the agent could not reach), else one named in the
    error text (where a resources server's error arrives) as ``failure_class: <name>``, else
    ``judge_failed`` if the text mentions it; then a generic body class (``upstream_error``),
    else ``agent_error``.
    """
    named = body.get("failure_class") if isinstance(body, Mapping) else None
    named = named if isinstance(named, str) and named else None
    if named is not None and named not in GENERIC_FAILURE_CLASSES:
        return named
    found = _FAILURE_CLASS_IN_TEXT.search(text)
    if found and found.group(1) not in GENERIC_FAILURE_CLASSES:
        return found.group(1)
    if JUDGE_FAILED in text:
        return JUDGE_FAILED
    return named or AGENT_ERROR


def clip(text: str) -> str:
    """``text`` cut to :data:`MAX_ERROR_CHARS`."""
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "...[truncated]"


def rollout_id_for(row: Mapping[str, Any]) -> str:
    """The rollout id a row's calls carry: the row's ``_ng_rollout_id`` when it is a valid path
    segment, else one made from its task, rollout and attempt indices (plus a random suffix)."""
    given = row.get(ROLLOUT_ID_KEY)
    if isinstance(given, str) and _ROLLOUT_ID_PATTERN.fullmatch(given):
        return given
    if row_key(row) is not None:
        return f"t{row[TASK_INDEX_KEY]}-r{row[ROLLOUT_INDEX_KEY]}-a{row.get(ATTEMPT_INDEX_KEY, 0)}-{uuid.uuid4().hex[:8]}"
    return uuid.uuid4().hex


def rollout_request_debug_summary(row: Mapping[str, Any]) -> dict[str, Any]:
    """What identifies a row in a log line (task and rollout index, agent), without its content."""
    ref = row.get(AGENT_REF_KEY) or {}
    summary = {
        TASK_INDEX_KEY: row.get(TASK_INDEX_KEY),
        ROLLOUT_INDEX_KEY: row.get(ROLLOUT_INDEX_KEY),
        "agent_name": ref.get("name") if isinstance(ref, Mapping) else None,
    }
    return {key: value for key, value in summary.items() if value is not None}


async def as_server_response(resp: Any) -> ServerResponse:
    """``resp`` as a :class:`ServerResponse`: itself, or an aiohttp-shaped answer (``status``, an
    async ``read()``, ``cookies``) that a NeMo Gym-style client returns (a helper whose
    ``setup_server_client`` is overridden, as NeMo Gym's own tests drive the collector) read whole."""
    if isinstance(resp, ServerResponse):
        return resp
    body = await resp.read()
    cookies = getattr(resp, "cookies", None) or {}
    return ServerResponse(
        int(resp.status),
        body if isinstance(body, bytes) else bytes(body),
        {str(k): str(getattr(v, "value", v)) for k, v in dict(cookies).items()},
    )


async def run_one(
    row: dict[str, Any],
    client: ServerClient,
    *,
    agent_name: str | None = None,
    timeout_s: float | None = None,
) -> RolloutOutcome:
    """Send one row to its agent's ``/run``; never raises for a failed rollout."""
    timeout_s = timeout_s or default_rollout_timeout_s()
    started = time.monotonic()
    outcome = RolloutOutcome(row)
    agent = agent_name_of(row, agent_name)
    if agent is None:
        outcome.failure_class, outcome.error = AGENT_ERROR, "row has no agent_ref.name"
        outcome.status = 400
        return outcome
    resp = None
    try:
        async with asyncio.timeout(timeout_s):
            resp = await as_server_response(
                await client.post(agent, "/run", row, timeout_s=timeout_s, rollout_id=rollout_id_for(row))
            )
        result = raise_for_status(resp, agent, "/run")
    except TimeoutError:
        outcome.failure_class = TIMEOUT
        outcome.error = f"{agent}/run: no result within the rollout deadline of {timeout_s:g}s"
    except ServerCallError as exc:
        if exc.kind == HTTP_ERROR:
            outcome.failure_class = classify_error(exc.body, str(exc))
            outcome.status = exc.status
            if resp is not None:
                outcome.response_content = resp.body[:MAX_RESPONSE_CONTENT_BYTES]
        else:
            outcome.failure_class = failure_class_of_call(exc.kind)
        outcome.error = clip(str(exc))
    except orjson.JSONDecodeError as exc:
        outcome.failure_class = BAD_UPSTREAM_BODY
        status = resp.status if resp is not None else "?"
        outcome.error = clip(f"{agent}/run answered HTTP {status} with a body that is not JSON: {exc}")
        if resp is not None:
            outcome.response_content = resp.body[:MAX_RESPONSE_CONTENT_BYTES]
    except Exception as exc:  # noqa: BLE001 - one bad row never aborts the run
        outcome.failure_class, outcome.error = AGENT_ERROR, clip(f"{type(exc).__name__}: {exc}")
    else:
        reward = result.get("reward") if isinstance(result, dict) else None
        named_failure = result.get(FAILURE_CLASS_KEY) if isinstance(result, dict) else None
        if isinstance(named_failure, str) and named_failure:
            # A verify answer that names its own failure (NeMo Gym's judge_failsafe row:
            # reward 0.0 with _ng_failure_class) is a failure, never a reward of 0.
            outcome.failure_class = named_failure
            outcome.failure_fields = {k: v for k, v in result.items() if k != "response"}
            reason = (
                result.get("_ng_failure_judge_error")
                or result.get("failure_reason")
                or result.get("error")
                or ""
            )
            outcome.error = clip(f"{agent}/run: the verifier reported {named_failure}: {reason}")
        elif isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            outcome.failure_class = AGENT_ERROR
            outcome.error = clip(f"{agent}/run answered without a numeric reward: {str(result)[:500]}")
            if resp is not None:
                outcome.response_content = resp.body[:MAX_RESPONSE_CONTENT_BYTES]
        else:
            outcome.result = result
    outcome.elapsed_s = time.monotonic() - started
    return outcome
