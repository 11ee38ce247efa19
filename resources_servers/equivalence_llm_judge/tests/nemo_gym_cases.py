"""NeMo Gym's equivalence_llm_judge verify test cases (its tests/test_app.py), as data.

Each case's ``judge`` is the sequence of answers NeMo Gym's mocked judge gives, in call order;
``server`` names the config changes the case's NeMo Gym test makes (``SERVERS``). Inputs and
expected rewards are NeMo Gym's, in its test file's order.
"""

from typing import Any

from pydantic import Field

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.response_items import build_response, content_text, input_items, message_item
from nemo_gym.testing import ParityCase

SERVERS: dict[str, dict[str, Any]] = {
    "default": {},
    "swap": {"check_twice_swap": True},
    "swap_fails_minus_one": {"check_twice_swap": True, "reward_if_swap_fails": -1.0},
    "custom_failure_message": {"msg_extraction_failure": "[CUSTOM EXTRACTION FAILURE]"},
    "no_verdict_not_equal": {"judge_no_verdict": "not_equal"},
    "threshold_50": {"extraction_length_threshold": 50},
}

PHOTOSYNTHESIS = "Photosynthesis is the process by which plants convert light energy into chemical energy stored in glucose."


class SequenceJudgeConfig(BaseResponsesAPIModelConfig):
    """``answers``: a marker found in the judge prompt → the judge's answers, one per call in order."""

    answers: dict[str, list[str]] = Field(default_factory=dict)


class SequenceJudge(SimpleResponsesAPIModel):
    """A judge model that answers each case's calls in a fixed order, like NeMo Gym's mocked judge."""

    config: SequenceJudgeConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: dict[str, int] = {}

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """The next answer for the first marker found in the prompt ('no marker' if none)."""
        prompt = "\n".join(content_text(item.get("content")) for item in input_items(body))
        marker = next((m for m in self.config.answers if m in prompt), None)
        if marker is None:
            return build_response([message_item("no marker")], body, model="judge")
        answers = self.config.answers[marker]
        index = self.calls.get(marker, 0)
        self.calls[marker] = index + 1
        return build_response([message_item(answers[min(index, len(answers) - 1)])], body, model="judge")


def case(
    name: str,
    marker: str,
    judge: list[str],
    question: str | None,
    output: list[dict[str, Any]],
    expected: str,
    reward: float,
    server: str = "default",
    **fields: Any,
) -> tuple[ParityCase, str, list[str]]:
    """A case plus its judge answers; ``marker`` (unique per case) is in the prompt the judge sees."""
    user = [] if question is None else [{"role": "user", "content": question}]
    row = {"responses_create_params": {"input": user}, "expected_answer": expected, "case": marker, **fields}
    return ParityCase(name, row, output, reward, {}, server), marker, judge


def msg(text: str) -> list[dict[str, Any]]:
    """One assistant message."""
    return [message_item(text)]


_CASES = [
    # test_verify_equal_then_confirm
    case(
        "equal, no swap by default",
        "Q: 1+1? #1",
        ["some text [[A=B]] trailing"],
        "Q: 1+1? #1",
        msg("It is 2."),
        "2",
        1.0,
    ),
    case(
        "equal in both orders",
        "Q: 1+1? #2",
        ["[[A=B]]", "[[A=B]]"],
        "Q: 1+1? #2",
        msg("It is 2."),
        "2",
        1.0,
        "swap",
    ),
    # test_verify_not_equal_first
    case("different", "Q: 1+1? #3", ["[[A!=B]]"], "Q: 1+1? #3", msg("It is 3."), "2", 0.0),
    # test_unexpected_judge_output_defaults_to_not_equal (NeMo Gym's no-verdict reading)
    case("no label", "text #4", ["no label present"], None, msg("text #4"), "x", 0.0, "no_verdict_not_equal"),
    # test_missing_assistant_text_uses_configured_failure_message
    case(
        "no answer text",
        "[CUSTOM EXTRACTION FAILURE]",
        ["[[A!=B]]"],
        None,
        [],
        "x",
        0.0,
        "custom_failure_message",
    ),
    # test_swap_fails_uses_configured_reward
    case(
        "swap fails", "Q? #6", ["[[A=B]]", "[[A!=B]]"], "Q? #6", msg("A"), "B", -1.0, "swap_fails_minus_one"
    ),
    # test_per_record_regex_extraction
    case(
        "row regex cuts the answer",
        "What is 2+2? #7",
        ["[[A=B]]"],
        "What is 2+2? #7",
        msg("Let me explain: The answer is \\boxed{4} because 2+2=4."),
        "4",
        1.0,
        template_metadata={"output_regex": r"\\boxed\{(.*?)\}"},
    ),
    # test_full_generation_rescue_on_extraction_failure
    case(
        "full generation rescue",
        "What is 2+2? #8",
        ["[[A!=B]]", "[[A=B]]"],
        "What is 2+2? #8",
        msg("The final answer is clearly 4"),
        "4",
        0.5,
        template_metadata={"output_regex": r"ANSWER:\s*(.+)"},
    ),
    # test_extraction_length_threshold_skips_regex
    case(
        "long answers skip the row regex",
        "Explain photosynthesis. #9",
        ["[[A=B]]", "[[A!=B]]"],
        "Explain photosynthesis. #9",
        msg(PHOTOSYNTHESIS),
        PHOTOSYNTHESIS,
        1.0,
        "threshold_50",
        template_metadata={"output_regex": r"\\boxed\{(.*?)\}"},
    ),
]

CASES = [c for c, _, _ in _CASES]
JUDGE_ANSWERS = {marker: judge for _, marker, judge in _CASES}
