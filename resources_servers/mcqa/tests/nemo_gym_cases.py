"""NeMo Gym's mcqa verify test cases (resources_servers/mcqa/tests/test_app.py), as data.

Inputs and expected rewards/letters are NeMo Gym's; the order follows its test file. ``server``
names the ``grading_mode`` set in the server config (``default``: none, the row's mode applies).
"""

from typing import Any

from nemo_gym.response_items import message_item
from nemo_gym.testing import ParityCase

A_TO_D_PROMPT = "Q?\nA: optA\nB: optB\nC: optC\nD: optD"
# Options A-J with text, as in NeMo Gym's LaTeX-extraction tests.
A_TO_J_TEXT = [{chr(ord("A") + i): f"option {chr(ord('A') + i)} text"} for i in range(10)]


def row(
    expected: str,
    *,
    letters: str = "ABCD",
    options: list[dict[str, str]] | None = None,
    prompt: str = "Q?",
    **fields: Any,
) -> dict[str, Any]:
    """An mcqa row: options ``opt<letter>`` for each of ``letters`` unless ``options`` is given."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "options": options if options is not None else [{letter: f"opt{letter}"} for letter in letters],
        "expected_answer": expected,
        **fields,
    }


def case(
    name: str, text: str, row_: dict[str, Any], reward: float, letter: Any = ..., server: str = "default"
) -> ParityCase:
    """A case with one assistant message; ``letter`` (when given) is NeMo Gym's ``extracted_answer``."""
    expect = {} if letter is ... else {"extracted_answer": letter}
    return ParityCase(name, row_, [message_item(text)], reward, expect, server)


def regex_row(pattern: Any, *, prompt: str = "Question?\nA: optA\nB: optB", **fields: Any) -> dict[str, Any]:
    """A two-option row (expected B) with a per-row ``template_metadata.output_regex``."""
    return row("B", letters="AB", prompt=prompt, template_metadata={"output_regex": pattern}, **fields)


C_ROW = row("C", prompt=A_TO_D_PROMPT, grading_mode="strict_single_letter_boxed")

CASES = [
    # test_verify_correct
    case("strict needs a box", "The answer is C.", C_ROW, 0.0),
    case("strict padded box", "Final: \\boxed{ [C] }", C_ROW, 1.0),
    case(
        "lenient_boxed option text", "Final: \\boxed{ optC }", {**C_ROW, "grading_mode": "lenient_boxed"}, 1.0
    ),
    case("answer colon lowercase", "Answer: c", {**C_ROW, "grading_mode": "lenient_answer_colon"}, 1.0),
    case("answer colon option text", "Answer: optC", {**C_ROW, "grading_mode": "lenient_answer_colon"}, 1.0),
    # test_template_metadata_*
    case("regex basic", "Option Selected: B", regex_row(r"Option Selected:\s*([A-Za-z])"), 1.0, "B"),
    case("regex case-insensitive", "ANSWER IS b", regex_row(r"ANSWER IS\s*([A-Za-z])"), 1.0, "B"),
    case(
        "regex list",
        "Antwort: B",
        regex_row([r"Answer\s*:\s*([A-Za-z])", r"Antwort\s*:\s*([A-Za-z])"], prompt="Question?"),
        1.0,
        "B",
    ),
    case(
        "regex Arabic letter", "الإجابة: ب", regex_row([r"الإجابة:\s*([أ-د])"], prompt="Question?"), 1.0, "B"
    ),
    case(
        "regex rightmost match",
        "Maybe Answer: A? Let me reconsider. Final Answer: B",
        regex_row(r"Answer:\s*([A-Za-z])"),
        1.0,
        "B",
    ),
    case("regex over grading mode", "Final Choice: B", regex_row(r"Final Choice:\s*([A-Za-z])"), 1.0, "B"),
    case("invalid regex falls back", "\\boxed{B}", regex_row(r"(["), 1.0, "B"),
    case(
        "regex without options",
        "Selected: B",
        {**regex_row(r"Selected:\s*([A-Za-z])", prompt="Question?"), "options": []},
        1.0,
        "B",
    ),
    # TestGradingModeConfig
    case(
        "config mode overrides row",
        "I think the answer is B.\n\nAnswer: B",
        row("B", grading_mode="strict_single_letter_boxed"),
        1.0,
        "B",
        server="lenient_answer_colon",
    ),
    case(
        "no config mode: row mode",
        "I think the answer is B.\n\nAnswer: B",
        row("B", grading_mode="strict_single_letter_boxed"),
        0.0,
        None,
    ),
    # TestGradingModeAnswerColonMD
    case("md plain", "The answer is B.\n\nAnswer: B", row("B"), 1.0, "B", "lenient_answer_colon_md"),
    case("md bold", "Reasoning here.\n\n**Answer: C**", row("C"), 1.0, "C", "lenient_answer_colon_md"),
    case("plain colon mode ignores bold", "**Answer: C**", row("C"), 0.0, None, "lenient_answer_colon"),
    case("md underscores", "__Answer__: A", row("A"), 1.0, "A", "lenient_answer_colon_md"),
    case(
        "md leading letter", "Answer: B because C is not valid", row("B"), 1.0, "B", "lenient_answer_colon_md"
    ),
    case("md repeated letter", "Answer: B/B", row("B"), 1.0, "B", "lenient_answer_colon_md"),
    case("md dollars", "Answer: $D$", row("D"), 1.0, "D", "lenient_answer_colon_md"),
    case("md parentheses", "Answer: (D)", row("D"), 1.0, "D", "lenient_answer_colon_md"),
    case(
        "md boxed text",
        r"\boxed{\text{Answer: G}}",
        row("G", letters="ABCDEFGHIJ"),
        1.0,
        "G",
        "lenient_answer_colon_md",
    ),
    case("md unknown", "Answer: unknown", row("B"), 0.0, None, "lenient_answer_colon_md"),
    case("md letter not an option", "Answer: G", row("B"), 0.0, None, "lenient_answer_colon_md"),
    case("md list slash", "Answer: A/B/C", row("A"), 0.0, None, "lenient_answer_colon_md"),
    case("md list B/I", "Answer: B/I", row("B", letters="ABCDEFGHIJ"), 0.0, None, "lenient_answer_colon_md"),
    case(
        "md list bold",
        "**Answer: D/H**",
        row("D", letters="ABCDEFGHIJ"),
        0.0,
        None,
        "lenient_answer_colon_md",
    ),
    case("md list or", "Answer: A or B", row("A"), 0.0, None, "lenient_answer_colon_md"),
    case("md list and", "Answer: A and B", row("A"), 0.0, None, "lenient_answer_colon_md"),
    case("md list comma", "Answer: A, B", row("A"), 0.0, None, "lenient_answer_colon_md"),
    case("md rightmost", "Answer: A\nAnswer: B", row("B"), 1.0, "B", "lenient_answer_colon_md"),
    case("md past unknown", "Answer: B\nAnswer: unknown", row("B"), 1.0, "B", "lenient_answer_colon_md"),
    case("md past bad letter", "Answer: B\nAnswer: G", row("B"), 1.0, "B", "lenient_answer_colon_md"),
    case("md past list", "Answer: B\nAnswer: A/B/C", row("B"), 1.0, "B", "lenient_answer_colon_md"),
    case(
        "md no answer line",
        "I think it might be B but I'm not sure",
        row("B"),
        0.0,
        None,
        "lenient_answer_colon_md",
    ),
    # TestStrictBoxedLatexExtraction
    case(
        "strict text-wrapped letter", r"\boxed{\text{E}}", row("E", options=A_TO_J_TEXT), 1.0, "E", "strict"
    ),
    case(
        "strict text-wrapped label",
        r"\boxed{\text{I: NGS can detect both coding and non-coding regions of the genome.}}",
        row("I", options=A_TO_J_TEXT),
        1.0,
        "I",
        "strict",
    ),
    case(
        "strict label then text",
        r"\[ \boxed{E: \text{A polygenic risk score can provide a probability.}} \]",
        row("E", options=A_TO_J_TEXT),
        1.0,
        "E",
        "strict",
    ),
    case("strict plain box", r"\boxed{B}", row("B"), 1.0, "B", "strict"),
    case("strict bracketed", r"Final: \boxed{ [C] }", row("C"), 1.0, "C", "strict"),
    case(
        "strict bare option text",
        r"\boxed{A polygenic risk score can provide a probability.}",
        row("A", options=A_TO_J_TEXT),
        0.0,
        None,
        "strict",
    ),
    case(
        "lenient_boxed text-wrapped letter",
        r"\boxed{\text{E}}",
        row("E", options=A_TO_J_TEXT, grading_mode="lenient_boxed"),
        1.0,
        "E",
        "lenient_boxed",
    ),
    case("strict unbalanced box", r"\boxed{B", row("B"), 0.0, None, "strict"),
    case(
        "strict last box wins",
        r"Candidate is \boxed{C}, but on reflection the answer is \boxed{E}",
        row("E", options=A_TO_J_TEXT),
        1.0,
        "E",
        "strict",
    ),
    case(
        "strict non-letter box before the answer",
        r"Thinking: \boxed{\text{some idea}}. Final answer: \boxed{E}",
        row("E", options=A_TO_J_TEXT),
        1.0,
        "E",
        "strict",
    ),
]

# The grading_mode set in server config for each case's `server` name.
SERVER_MODES = {
    "default": None,
    "strict": "strict_single_letter_boxed",
    "lenient_boxed": "lenient_boxed",
    "lenient_answer_colon": "lenient_answer_colon",
    "lenient_answer_colon_md": "lenient_answer_colon_md",
}
