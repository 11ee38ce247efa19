"""NeMo Gym's math_with_judge verify test cases (resources_servers/math_with_judge/tests/test_app.py).

Inputs, judge answers and expected rewards are NeMo Gym's, in its test file's order. ``server``:
``library`` (no judge), ``judge`` (a scripted judge; the judge's answer for each case is keyed on
the case's question, see ``JUDGE_SCRIPTS``) or ``judge_not_equal`` (the same judge with
``judge_no_verdict: not_equal``, NeMo Gym's reading of an unlabelled verdict).
"""

from typing import Any

from nemo_gym.response_items import message_item
from nemo_gym.testing import ParityCase

# Question → the judge's answer (the same for both orders), as NeMo Gym's scripted judge mocks.
JUDGE_SCRIPTS = [
    {"match": "Simplify the expression x", "turns": [{"text": "[[A!=B]] done"}]},
    {"match": "What is 1 \\+ 1", "turns": [{"text": "Conclusion: [[A!=B]]"}]},
    {"match": "14 divided by 10", "turns": [{"text": "I say [[A=B]] as the verdict"}]},
    {"match": "What is 2 \\+ 2", "turns": [{"text": "[[A!=B]] is the evaluation"}]},
    {"match": "^(?s:.*)(?<!not_)equal_first_question", "turns": [{"text": "First [[A=B]], then [[A!=B]]"}]},
    {"match": "not_equal_first_question", "turns": [{"text": "[[A!=B]] [[A=B]]"}]},
    {"match": "no_evaluation_question", "turns": [{"text": "no evaluation"}]},
    {"match": None, "turns": [{"text": "[[A!=B]]"}]},
]


def case(
    name: str,
    question: str,
    expected: str,
    output: list[dict[str, Any]] | str,
    reward: float,
    server: str = "judge",
    **expect: Any,
) -> ParityCase:
    """A math row with ``question`` (shown to the judge) and one message unless ``output`` is a list."""
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": question}]},
        "question": question,
        "expected_answer": expected,
    }
    items = [message_item(output)] if isinstance(output, str) else output
    return ParityCase(name, row, items, reward, expect, server)


SPLIT_ANSWER = [
    message_item("$1"),
    {"id": "extra_reasoning", "type": "reasoning", "summary": []},
    message_item(" + x$"),
    {
        "id": "refusal_finish",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "refusal", "refusal": "no response"}],
    },
]
SIMPLIFY = "Simplify the expression x + 7 - 6"

CASES = [
    # test_verify
    case("judge says different", SIMPLIFY, "x + 1", "$1", 0.0, extracted_answer="1", library_reward=0.0),
    case(
        "text joined over messages, reasoning and refusal skipped",
        SIMPLIFY,
        "x + 1",
        SPLIT_ANSWER,
        1.0,
        extracted_answer="x + 1",
        library_reward=1.0,
        judge_evaluations=None,
    ),
    # test_verify_answer
    case(
        "symbolic match needs no judge",
        "What is 3 plus 5?",
        "8",
        "3 + 5 = \\boxed{8}",
        1.0,
        extracted_answer="8",
        library_reward=1.0,
        judge_evaluations=None,
    ),
    case(
        "judge confirms the miss", "What is 1 + 1?", "2", "3", 0.0, extracted_answer="3", library_reward=0.0
    ),
    case(
        "judge rescues in both orders",
        "What is 14 divided by 10?",
        "1.4",
        "Final answer: {7 / 5}",
        1.0,
        extracted_answer="5",
        library_reward=0.0,
    ),
    # test_verify_answer_with_library_async
    case("library boxed", "q", "4", "2 + 2 = \\boxed{4}", 1.0, "library", extracted_answer="4"),
    case(
        "library boxed gold", "q", "\\boxed{12}", "3 * 4 = \\boxed{12}", 1.0, "library", extracted_answer="12"
    ),
    case(
        "library boxed gold 2", "q", "\\boxed{5}", "10 - 5 = \\boxed{5}", 1.0, "library", extracted_answer="5"
    ),
    case(
        "library fraction", "q", "4.0", "2 + 2 = \\boxed{\\frac{8}{2}}", 1.0, "library", extracted_answer="4"
    ),
    case("library wrong", "q", "\\boxed{12}", "3 * 4 = 13", 0.0, "library", extracted_answer="13"),
    case("library near miss", "q", "17.001", "17", 0.0, "library", extracted_answer="17"),
    case("library empty", "q", "", "", 0.0, "library", extracted_answer=None),
    case("library plain", "q", "3", "3", 1.0, "library", extracted_answer="3"),
    # test_verify_answer_with_judge (through /verify: the symbolic check fails first)
    case("judge first order different", "What is 2 + 2?", "4", "5", 0.0, library_reward=0.0),
    # test_generate_judge_evaluation: which label counts
    case("first label equal wins", "equal_first_question", "two", "\\boxed{2}", 1.0),
    case("first label different wins", "not_equal_first_question", "two", "\\boxed{2}", 0.0),
    case("no label is not equal", "no_evaluation_question", "two", "\\boxed{2}", 0.0, "judge_not_equal"),
]
