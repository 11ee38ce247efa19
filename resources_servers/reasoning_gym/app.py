"""reasoning_gym: procedurally generated reasoning tasks, scored by the reasoning-gym package.

Rows come from ``prepare.py`` (or NeMo Gym's ``create_dataset.py``): the task's ``question``,
reference ``answer`` and ``metadata`` (``metadata.source_dataset`` names the task). The model's
answer is taken from its last ``<answer>...</answer>``, else its last ``\\boxed{...}``, else its
whole text, and scored by the task's own ``score_answer``; the score is the reward.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import re
from collections.abc import Callable
from typing import Any

import reasoning_gym
from pydantic import ConfigDict

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    HTTPError,
    SimpleResourcesServer,
)
from nemo_gym.response_items import content_text

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = "\\boxed{"


class ReasoningGymConfig(BaseResourcesServerConfig):
    """``score_timeout_s`` bounds one scorer call (scored 0 past it)."""

    score_timeout_s: float = 10.0


class ReasoningGymVerifyRequest(BaseVerifyRequest):
    """A reasoning-gym entry: ``question``, reference ``answer``, ``metadata`` with ``source_dataset``."""

    question: str | None = None
    answer: Any = None
    metadata: dict[str, Any] = {}


class ReasoningGymVerifyResponse(BaseVerifyResponse):
    """The task, the package's score, the answer extracted and where it came from."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    task_name: str
    score: float
    extracted_answer: str
    answer_source: str
    score_error: str | None = None


class ReasoningGymServer(SimpleResourcesServer):
    """Scores answers with reasoning-gym's own ``score_answer`` of the row's task."""

    config: ReasoningGymConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts
    answer_field = "extracted_answer"

    async def verify(self, body: ReasoningGymVerifyRequest) -> ReasoningGymVerifyResponse:  # type: ignore[override]
        """Extract the answer, score it with the task's scorer; reward = score."""
        task_name = _task_name(body)
        score_fn = _score_fn(task_name)
        answer, source = extract_answer(assistant_text(body.response))
        entry = {"question": body.question, "answer": body.answer, "metadata": body.metadata}
        score, error = 0.0, None
        try:
            raw = await asyncio.wait_for(
                asyncio.to_thread(score_fn, answer=answer, entry=entry), self.config.score_timeout_s
            )
            score = float(raw)
        except TimeoutError:
            error = f"scoring took longer than {self.config.score_timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - a scorer failing on an odd answer scores 0, as in NeMo Gym
            error = f"{type(exc).__name__}: {exc}"
        return ReasoningGymVerifyResponse(
            **body.model_dump(),
            reward=score,
            task_name=task_name,
            score=score,
            extracted_answer=answer,
            answer_source=source,
            score_error=error,
        )


def assistant_text(response: dict[str, Any]) -> str:
    """All assistant message text of a response, joined (reasoning items are not read)."""
    return "".join(
        content_text(item.get("content"))
        for item in response.get("output") or []
        if item.get("type") == "message" and item.get("role", "assistant") == "assistant"
    )


def extract_answer(text: str) -> tuple[str, str]:
    """The answer and its source: the last ``<answer>`` block, else the last ``\\boxed{}``
    (nested braces kept), else the whole text (``answer_tag``, ``boxed``, ``full_text``, ``empty``)."""
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip(), "answer_tag"
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip(), "boxed"
    stripped = text.strip()
    return stripped, "full_text" if stripped else "empty"


def last_boxed(text: str) -> str | None:
    """The contents of the last complete ``\\boxed{...}``, with balanced inner braces."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, index = 1, start + len(_BOXED)
        while index < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            index += 1
        if depth == 0:
            return text[start + len(_BOXED) : index - 1]
        start = text.rfind(_BOXED, 0, start)
    return None


def _task_name(body: ReasoningGymVerifyRequest) -> str:
    name = body.metadata.get("source_dataset") or (body.model_extra or {}).get("task_name")
    if not name:
        raise HTTPError(
            422, "invalid body: metadata.source_dataset: field required (the reasoning-gym task name)"
        )
    if name not in reasoning_gym.factory.DATASETS:
        close = difflib.get_close_matches(str(name), reasoning_gym.factory.DATASETS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise HTTPError(
            422, f"invalid body: metadata.source_dataset: unknown reasoning-gym task {name!r}{hint}"
        )
    return str(name)


@functools.cache
def _score_fn(task_name: str) -> Callable[..., float]:
    # Building a dataset object can be costly for some tasks: one scorer per task, reused.
    return reasoning_gym.get_score_answer_fn(task_name)


if __name__ == "__main__":
    ReasoningGymServer.run_webserver()
