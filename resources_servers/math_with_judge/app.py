"""math_with_judge: math answers checked symbolically with math-verify, with an optional LLM judge.

The answer (the last ``\\boxed{}`` of the response's text, or the whole text when it has no box;
the text is every assistant text part joined, as NeMo Gym reads it) is compared with
``expected_answer`` by math-verify in a pool of killable worker processes, each check with a CPU
budget (see :mod:`symbolic_pool`). An answer that makes the check use up its CPU seconds is the
policy's doing: reward 0 with ``library_reason: cpu_budget_exhausted`` (as NeMo Gym, which
answers promptly with a reward). What the machine did is not a verdict: the wall-clock backstop
makes ``/verify`` answer 504 (``failure_class: verifier_timeout``) and a worker that died 502
(``failure_class: verifier_error``), so no reward depends on how busy the machine is. When the symbolic check does not say "equivalent" and a judge model is
configured, the judge is asked in both orders; a judge that fails makes ``/verify`` answer 502
(``failure_class: judge_failed``), never reward 0.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import ConfigDict, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    HTTPError,
    ServerRef,
    SimpleResourcesServer,
)
from nemo_gym.failure_classes import VERIFIER_ERROR, VERIFIER_TIMEOUT
from nemo_gym.llm_judge import (
    JudgeSettings,
    ask_judge,
    fill_template,
    judge_messages,
)
from nemo_gym.response_items import all_output_text, content_text, input_items
from resources_servers.math_with_judge.symbolic_pool import (
    TIMEOUT,
    WORKER_DIED,
    SymbolicCheckPool,
    SymbolicResult,
)

DEFAULT_JUDGE_SYSTEM_MESSAGE = (
    "You check whether two answers to a math problem are mathematically the same. Ignore how they "
    "are written (LaTeX or plain text, fractions or decimals that are exactly equal, factored or "
    "expanded forms, the order of a set); only the mathematical value matters. Give a one-line "
    "reason, then end with exactly one label: [[A=B]] if the answers are equivalent, [[A!=B]] if not."
)
DEFAULT_JUDGE_PROMPT_TEMPLATE = (
    "PROBLEM:\n{question}\n\nANSWER A:\n{first_answer}\n\nANSWER B:\n{second_answer}\n\n"
    "Are answer A and answer B mathematically equivalent?"
)


class MathWithJudgeConfig(BaseResourcesServerConfig, JudgeSettings):
    """Symbolic check settings, and the optional judge (NeMo Gym's names where they exist).

    ``judge_model_server`` names a model server; the judge is used only when it is set and
    ``should_use_judge`` is true. ``judge_prompt_template`` may use ``{question}``,
    ``{first_answer}`` and ``{second_answer}``.
    """

    # CPU seconds one symbolic check may use (NeMo Gym's name; there a wall-clock limit of 10 s,
    # which a loaded machine can hit on a row that needs 3-4 s of SymPy).
    library_verifier_timeout_seconds: float = Field(default=60.0, gt=0)
    # Wall-clock backstop of one check (default: ten times the CPU budget).
    library_verifier_wall_timeout_seconds: float | None = Field(default=None, gt=0)
    library_verifier_max_concurrency: int = Field(
        default_factory=lambda: max(1, min(4, os.cpu_count() or 1)), ge=1
    )
    library_verifier_memory_limit_mb: int | None = 4096
    judge_model_server: ServerRef | None = None
    should_use_judge: bool = True
    judge_system_message: str | None = DEFAULT_JUDGE_SYSTEM_MESSAGE
    judge_prompt_template: str = DEFAULT_JUDGE_PROMPT_TEMPLATE


class MathRunRequest(BaseRunRequest):
    """A math row: ``expected_answer`` (LaTeX or plain); ``question`` is shown to the judge."""

    expected_answer: str
    question: str | None = None


class MathVerifyRequest(MathRunRequest, BaseVerifyRequest):
    """The row plus the model's response."""


class MathVerifyResponse(BaseVerifyResponse):
    """``library_reward`` (symbolic) and ``library_reason``; ``judge_evaluations`` when the judge was asked."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    expected_answer: str
    extracted_answer: str | None
    library_reward: float
    library_reason: str
    judge_evaluations: list[dict[str, Any]] | None


def last_boxed(text: str) -> str | None:
    r"""The content of the last complete ``\boxed{...}`` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        depth, index = 1, start + len("\\boxed{")
        while index < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            index += 1
        if not depth:
            return text[start + len("\\boxed{") : index - 1]
        start = text.rfind("\\boxed{", 0, start)  # unterminated: try the box before it
    return None


class MathWithJudgeServer(SimpleResourcesServer):
    """Scores math answers by symbolic equivalence, falling back to a judge model when configured."""

    config: MathWithJudgeConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts
    answer_field = "extracted_answer"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool = SymbolicCheckPool(
            size=self.config.library_verifier_max_concurrency,
            cpu_s=self.config.library_verifier_timeout_seconds,
            wall_s=self.config.library_verifier_wall_timeout_seconds,
            memory_limit_mb=self.config.library_verifier_memory_limit_mb,
        )
        self.judge_semaphore = self.config.judge_semaphore()

    async def on_shutdown(self) -> None:
        """Kill the worker processes when the server stops."""
        await self.pool.close()

    @property
    def judge_enabled(self) -> bool:
        """Whether a judge is configured and switched on."""
        return self.config.judge_model_server is not None and self.config.should_use_judge

    async def verify(self, body: MathVerifyRequest) -> MathVerifyResponse:  # type: ignore[override]
        """``reward``: 1.0 if math-verify finds the answer equivalent to ``expected_answer``;
        otherwise (judge configured, an answer present) 1.0 only if the judge says equivalent in
        both orders; else 0.0. A check past its CPU budget scores 0 (the answer's doing); one past
        the wall-clock backstop is a 504 ``verifier_timeout``, a dead worker a 502."""
        text = all_output_text(body.response)
        boxed = last_boxed(text)
        if not text.strip() or (boxed is not None and not boxed.strip()):
            result = SymbolicResult(0.0, None, "no_answer", "empty answer")
        else:
            candidate = "\\boxed{" + boxed + "}" if boxed is not None else text
            result = await self.pool.check(body.expected_answer, candidate)
        if result.reason == TIMEOUT:
            # Not a verdict: the machine gave the check no time. The collector files a failure row.
            raise HTTPError(
                504,
                f"the symbolic check did not finish: {result.detail} (failure_class: {VERIFIER_TIMEOUT}); "
                "raise library_verifier_wall_timeout_seconds if the machine is this busy",
                failure_class=VERIFIER_TIMEOUT,
            )
        if result.reason == WORKER_DIED:
            raise HTTPError(
                502,
                f"the symbolic check's worker died: {result.detail} (failure_class: {VERIFIER_ERROR})",
                failure_class=VERIFIER_ERROR,
            )
        reward = result.reward
        evaluations = None
        has_answer = boxed is not None or result.extracted_answer is not None
        if reward < 1.0 and self.judge_enabled and has_answer:
            # As NeMo Gym: the judge sees what math-verify extracted, else the answer itself.
            generated = result.extracted_answer or (boxed if boxed is not None else text)
            reward, evaluations = await self.judge_both_orders(
                self.question_of(body), body.expected_answer, generated.strip()
            )
        return MathVerifyResponse(
            **body.model_dump(exclude={"expected_answer"}),
            reward=reward,
            expected_answer=body.expected_answer,
            extracted_answer=result.extracted_answer,
            library_reward=result.reward,
            library_reason=result.reason,
            judge_evaluations=evaluations,
        )

    def question_of(self, body: MathVerifyRequest) -> str:
        """The row's ``question``, else the last user message."""
        if body.question:
            return body.question
        return next(
            (
                content_text(item.get("content"))
                for item in reversed(input_items(body.responses_create_params))
                if item.get("role") == "user"
            ),
            "",
        )

    async def judge_both_orders(
        self, question: str, expected: str, generated: str
    ) -> tuple[float, list[dict[str, Any]]]:
        """Ask (expected, generated), then — if "equal" — (generated, expected): 1.0 only if both agree."""
        evaluations = []
        for first, second in ((expected, generated), (generated, expected)):
            assert self.config.judge_model_server is not None
            prompt = fill_template(
                self.config.judge_prompt_template, question=question, first_answer=first, second_answer=second
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
            evaluations.append(verdict.evaluation)
            if not verdict.equal:
                return 0.0, evaluations
        return 1.0, evaluations


if __name__ == "__main__":
    MathWithJudgeServer.run_webserver()
