"""Asking an LLM judge whether two answers are equivalent, and failing loudly when it cannot say.

Any environment can use it (``equivalence_llm_judge`` and ``math_with_judge`` do). The verdict
is read as NeMo Gym reads it: from the text of the judge's last output message, whichever label
occurs FIRST. A judge that is unreachable or answers with an error is a *failed verification*,
not a wrong answer: :class:`JudgeFailedError` makes ``/verify`` answer HTTP 502 with
``{"error", "server", "failure_class": "judge_failed"}``, so the collector records a failure row
instead of a reward of 0. So is an answer without a verdict label, unless
``judge_no_verdict: not_equal`` asks for NeMo Gym's behaviour (such an answer means "not equal").
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass
from typing import Any, Literal, Self

from pydantic import BaseModel, Field, model_validator

from nemo_gym.failure_classes import JUDGE_FAILED
from nemo_gym.serving.server import HTTPError
from nemo_gym.serving.server_client import ServerCallError


class JudgeSettings(BaseModel):
    """Config fields every judging environment shares (NeMo Gym's names); mix into a server config.

    The prompt defaults differ per environment, so ``judge_system_message`` and
    ``judge_prompt_template`` stay with each environment's config. ``judge_no_verdict`` says what
    a judge answer without a verdict label means: ``fail`` (a ``judge_failed`` failure, the
    default) or ``not_equal`` (NeMo Gym's behaviour: the answers differ).
    """

    judge_responses_create_params: dict[str, Any] = Field(default_factory=dict)
    judge_endpoint_max_concurrency: int | None = 64
    judge_timeout_s: float = 300.0
    judge_equal_label: str = "[[A=B]]"
    judge_not_equal_label: str = "[[A!=B]]"
    # "fail": an answer without a label is judge_failed (ours); "not_equal": NeMo Gym's reading.
    judge_no_verdict: Literal["fail", "not_equal"] = "fail"

    @model_validator(mode="after")
    def _check_judge_settings(self) -> Self:
        if self.judge_equal_label == self.judge_not_equal_label:
            raise ValueError("judge_equal_label and judge_not_equal_label must differ")
        if self.judge_endpoint_max_concurrency is not None and self.judge_endpoint_max_concurrency < 1:
            raise ValueError("judge_endpoint_max_concurrency must be >= 1 (or null for no limit)")
        return self

    def judge_semaphore(self) -> asyncio.Semaphore | None:
        """The cap on concurrent judge calls (None: no cap)."""
        limit = self.judge_endpoint_max_concurrency
        return asyncio.Semaphore(limit) if limit is not None else None


JUDGE_FAILED_STATUS = 502


class JudgeFailedError(HTTPError):
    """The judge gave no usable verdict; ``/verify`` answers 502 with ``failure_class: judge_failed``."""

    def __init__(self, judge_server: str, message: str) -> None:
        # The class is named in the text too: an agent relaying this error keeps only the text.
        super().__init__(
            JUDGE_FAILED_STATUS,
            f"judge {judge_server!r} failed (failure_class: {JUDGE_FAILED}): {message}",
            failure_class=JUDGE_FAILED,
        )
        self.judge_server = judge_server


@dataclass(frozen=True)
class JudgeVerdict:
    """One judge call: whether it said "equal", the label it gave (None: none), and the call for the record.

    ``evaluation`` is ``{"responses_create_params", "response", "verdict_label"}``, the shape of
    NeMo Gym's ``judge_evaluations`` entries.
    """

    equal: bool
    label: str | None
    evaluation: dict[str, Any]


def parse_verdict(text: str, equal_label: str, not_equal_label: str) -> str | None:
    """The verdict label in a judge's text: whichever label occurs FIRST (None if neither does).

    This is NeMo Gym's rule (its judge prompts ask for the label alone, so the first one is the
    verdict). A label inside the other ("equal" in "not equal") starts later: the longer wins.
    """
    positions = {label: text.find(label) for label in (equal_label, not_equal_label)}
    found = {label: pos for label, pos in positions.items() if pos >= 0}
    if not found:
        return None
    return min(found, key=lambda label: (found[label], -len(label)))


def verdict_text(response: dict[str, Any]) -> str:
    """The text NeMo Gym reads a verdict from: the last content part of the last output item,
    when that item is a message ('' otherwise: a trailing reasoning item or refusal gives none)."""
    output = response.get("output") or []
    if not output or output[-1].get("type") != "message":
        return ""
    content = output[-1].get("content")
    if isinstance(content, str):
        return content
    return (content[-1].get("text") or "") if content and isinstance(content[-1], dict) else ""


async def ask_judge(
    server_client: Any,
    judge_server: str,
    create_params: dict[str, Any],
    messages: list[dict[str, Any]],
    *,
    equal_label: str,
    not_equal_label: str,
    timeout_s: float,
    semaphore: asyncio.Semaphore | None = None,
    no_verdict: str = "fail",
) -> JudgeVerdict:
    """Send ``messages`` to the judge model server and read its verdict.

    Raises :class:`JudgeFailedError` when the judge cannot be asked, and when its answer has no
    label unless ``no_verdict`` is ``"not_equal"`` (then the verdict is "not equal", label None).
    """
    params = {**create_params, "input": messages}
    limit = semaphore if semaphore is not None else contextlib.nullcontext()
    async with limit:
        try:
            response = await server_client.post_json(
                judge_server, "/v1/responses", params, timeout_s=timeout_s
            )
        except ServerCallError as exc:
            raise JudgeFailedError(judge_server, f"{exc.kind}: {exc}") from exc
    if not isinstance(response, dict):
        raise JudgeFailedError(judge_server, f"answered {type(response).__name__}, not a Responses object")
    if response.get("error"):
        raise JudgeFailedError(judge_server, f"answered with an error: {response['error']}")
    text = verdict_text(response)
    label = parse_verdict(text, equal_label, not_equal_label)
    if label is None and no_verdict == "not_equal":
        return JudgeVerdict(
            equal=False,
            label=None,
            evaluation={"responses_create_params": params, "response": response, "verdict_label": None},
        )
    if label is None:
        raise JudgeFailedError(
            judge_server,
            f"no verdict label ({equal_label} or {not_equal_label}) in its answer {text[-300:]!r}"
            + (
                f" (status {response.get('status')!r})"
                if response.get("status") not in (None, "completed")
                else ""
            ),
        )
    evaluation = {"responses_create_params": params, "response": response, "verdict_label": label}
    return JudgeVerdict(equal=label == equal_label, label=label, evaluation=evaluation)


def judge_messages(system_message: str | None, prompt: str) -> list[dict[str, Any]]:
    """The judge's input: an optional system message, then the filled prompt as the user message."""
    messages = [{"role": "system", "content": system_message, "type": "message"}] if system_message else []
    return messages + [{"role": "user", "content": prompt, "type": "message"}]


def fill_template(template: str, **values: str) -> str:
    """``template`` with ``{name}`` placeholders replaced; other braces (LaTeX, JSON) are left alone.

    One pass over the template: a value is never searched for placeholders, so a model answer
    that contains ``{expected_answer}`` or ``{second_answer}`` stays that text instead of being
    expanded into the gold answer (judge prompt injection).
    """
    if not values:
        return template
    pattern = re.compile("|".join(re.escape("{" + name + "}") for name in values))
    return pattern.sub(lambda match: values[match.group(0)[1:-1]], template)
