"""equivalence_llm_judge: an LLM judge decides whether the generated answer matches the expected one.

The judge is a model server named in config; the flow is NeMo Gym's, under its config names:

1. The answer is the last assistant message (its text parts joined by newlines), cut by the
   row's ``template_metadata.output_regex`` (with ``use_per_record_regex``) or by
   ``response_extract_regex``: the first non-empty group of the LAST match, the whole text when
   nothing matches, ``msg_extraction_failure`` when there is no text. A row regex is ignored
   when ``expected_answer`` is longer than ``extraction_length_threshold``.
2. The judge is asked once with the prompt template (``{question}``, ``{expected_answer}``,
   ``{generated_answer}``); its verdict is the first label in its last message.
3. "Different" with a row regex: with ``check_full_generation_on_fail`` the judge is asked again
   with the whole answer; "equal" then scores ``reward_if_full_generation_succeeds``.
4. "Equal" with ``check_twice_swap``: the judge is asked again with the answers swapped;
   "different" then scores ``reward_if_swap_fails``.

A judge that cannot be asked is never a reward: ``/verify`` answers 502 with ``failure_class:
judge_failed``; so is a verdict without a label unless ``judge_no_verdict: not_equal``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, model_validator

from nemo_gym import PARENT_DIR
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ServerRef,
    SimpleResourcesServer,
)
from nemo_gym.llm_judge import (
    JudgeSettings,
    ask_judge,
    fill_template,
    judge_messages,
)
from nemo_gym.response_items import input_items

HERE = Path(__file__).resolve().parent


class EquivalenceLLMJudgeConfig(BaseResourcesServerConfig, JudgeSettings):
    """Judge settings, NeMo Gym's names and defaults.

    The prompt is ``judge_prompt_template`` when set, else the file at
    ``judge_prompt_template_fpath`` (relative paths: this environment's folder, the working
    directory, then the project root).
    """

    judge_model_server: ServerRef
    judge_system_message: str | None = None
    judge_prompt_template: str | None = None
    judge_prompt_template_fpath: str = "prompt_templates/equivalence_llm_judge.txt"
    check_twice_swap: bool = False
    reward_if_swap_fails: float = 0.0
    question_extract_regex: str | None = None
    response_extract_regex: str | None = None
    msg_extraction_failure: str = "[NO VALID ANSWER EXTRACTED]"
    use_per_record_regex: bool = True
    extraction_length_threshold: int | None = 120
    check_full_generation_on_fail: bool = True
    reward_if_full_generation_succeeds: float = 0.5

    @model_validator(mode="after")
    def _check(self) -> EquivalenceLLMJudgeConfig:
        for field in ("question_extract_regex", "response_extract_regex"):
            pattern = getattr(self, field)
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"{field} is not a valid regex: {exc}") from exc
        return self


class EquivalenceRunRequest(BaseRunRequest):
    """A row: ``expected_answer`` (required); ``question`` (default: the last user message)."""

    expected_answer: str
    question: str | None = None
    template_metadata: dict[str, Any] | None = None


class EquivalenceVerifyRequest(EquivalenceRunRequest, BaseVerifyRequest):
    """The row plus the model's response."""


class EquivalenceVerifyResponse(BaseVerifyResponse):
    """``judge_evaluations``: every judge call made (request, response, ``verdict_label``)."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    expected_answer: str
    generated_answer: str
    judge_evaluations: list[dict[str, Any]]


def last_match(pattern: str | None, text: str) -> str | None:
    """The first non-empty group of the LAST match of ``pattern`` (or the whole match), stripped.

    None when there is no pattern, no match, or the pattern is not a valid regex.
    """
    if not pattern:
        return None
    try:
        matches = list(re.finditer(pattern, text, re.MULTILINE | re.DOTALL))
    except re.error:
        return None
    if not matches:
        return None
    last = matches[-1]
    return next((g.strip() for g in last.groups() if g and g.strip()), last.group(0).strip())


def part_texts(content: Any) -> str:
    """A message's text parts joined by newlines (image and other parts skipped)."""
    if isinstance(content, str):
        return content
    return "\n".join(
        part["text"] for part in content or [] if isinstance(part, dict) and isinstance(part.get("text"), str)
    )


def last_assistant_text(response: dict[str, Any]) -> str:
    """The last assistant message's text, stripped ('' if there is none)."""
    for item in reversed(response.get("output") or []):
        if item.get("type") == "message" and item.get("role") == "assistant":
            return part_texts(item.get("content")).strip()
    return ""


class EquivalenceLLMJudgeServer(SimpleResourcesServer):
    """Scores an answer by asking a judge model whether it is equivalent to the expected answer."""

    config: EquivalenceLLMJudgeConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.judge_semaphore = self.config.judge_semaphore()
        self.prompt_template = self.config.judge_prompt_template or self._read_template()

    def _read_template(self) -> str:
        path = Path(self.config.judge_prompt_template_fpath)
        candidates = [path] if path.is_absolute() else [HERE / path, Path.cwd() / path, PARENT_DIR / path]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise FileNotFoundError(
                f"judge_prompt_template_fpath {str(path)!r} not found (looked in {', '.join(map(str, candidates))})"
            )
        return found.read_text().strip()

    def question_of(self, body: EquivalenceVerifyRequest) -> str:
        """The row's ``question``, else the last user message (optionally cut by ``question_extract_regex``)."""
        if body.question:
            return body.question
        text = next(
            (
                part_texts(item.get("content"))
                for item in reversed(input_items(body.responses_create_params))
                if item.get("role") == "user"
            ),
            "",
        ).strip()
        return (last_match(self.config.question_extract_regex, text) or text) if text else text

    def row_regex(self, body: EquivalenceVerifyRequest) -> str | None:
        """The row's ``template_metadata.output_regex`` when per-row regexes are on."""
        if not self.config.use_per_record_regex:
            return None
        return (body.template_metadata or {}).get("output_regex") or None

    def too_long_for_row_regex(self, body: EquivalenceVerifyRequest, expected: str) -> bool:
        """A row regex is set but ``expected_answer`` is past ``extraction_length_threshold``."""
        threshold = self.config.extraction_length_threshold
        return self.row_regex(body) is not None and threshold is not None and len(expected) > threshold

    def generated_answer_of(
        self, body: EquivalenceVerifyRequest, expected: str, *, full: bool = False
    ) -> str:
        """The answer shown to the judge (see the module docstring); ``full``: no regex cut."""
        text = last_assistant_text(body.response)
        if not text:
            return self.config.msg_extraction_failure
        pattern = self.row_regex(body) or self.config.response_extract_regex
        if full or self.too_long_for_row_regex(body, expected):
            pattern = None
        return last_match(pattern, text) or text

    async def judge(self, question: str, expected: str, generated: str) -> tuple[bool, dict[str, Any]]:
        """One judge call with the configured prompt; ``(equal, evaluation)``."""
        prompt = fill_template(
            self.prompt_template, question=question, expected_answer=expected, generated_answer=generated
        )
        verdict = await ask_judge(
            self.server_client,
            self.config.judge_model_server.name,
            self.config.judge_responses_create_params,
            judge_messages(self.config.judge_system_message, prompt),
            equal_label=self.config.judge_equal_label,
            not_equal_label=self.config.judge_not_equal_label,
            timeout_s=self.config.judge_timeout_s,
            semaphore=self.judge_semaphore,
            no_verdict=self.config.judge_no_verdict,
        )
        return verdict.equal, verdict.evaluation

    async def verify(self, body: EquivalenceVerifyRequest) -> EquivalenceVerifyResponse:  # type: ignore[override]
        """The judge's verdict as a reward: 1.0 equal, 0.0 different, or the configured partial
        rewards of the rescue and swap checks. Judge failures raise :class:`JudgeFailedError`."""
        config = self.config
        expected = body.expected_answer.strip()
        question = self.question_of(body)
        generated = self.generated_answer_of(body, expected)
        equal, evaluation = await self.judge(question, expected, generated)
        evaluations = [evaluation]
        skip_second = self.too_long_for_row_regex(body, expected)
        if not equal:
            reward = 0.0
            if config.check_full_generation_on_fail and self.row_regex(body) and not skip_second:
                full = self.generated_answer_of(body, expected, full=True)
                rescued, evaluation = await self.judge(question, expected, full)
                evaluations.append(evaluation)
                reward = config.reward_if_full_generation_succeeds if rescued else 0.0
        else:
            reward = 1.0
            if config.check_twice_swap and not skip_second:
                swapped_equal, evaluation = await self.judge(question, generated, expected)
                evaluations.append(evaluation)
                reward = 1.0 if swapped_equal else config.reward_if_swap_fails
        return EquivalenceVerifyResponse(
            **body.model_dump(exclude={"expected_answer"}),
            reward=reward,
            expected_answer=expected,
            generated_answer=generated,
            judge_evaluations=evaluations,
        )


if __name__ == "__main__":
    EquivalenceLLMJudgeServer.run_webserver()
