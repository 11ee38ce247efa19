"""NeMo Gym's code_gen verify test cases (its tests/test_app.py), as data, in its order."""

from typing import Any

from nemo_gym.response_items import message_item
from nemo_gym.testing import ParityCase


def case(
    name: str, text: str, inputs: list[str], outputs: list[str], reward: float, **expect: Any
) -> ParityCase:
    """A row whose ``verifier_metadata.unit_tests`` are stdin/stdout pairs, answered with ``text``."""
    row = {
        "responses_create_params": {"temperature": 0},
        "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs}},
    }
    return ParityCase(name, row, [message_item(text)], reward, expect)


CASES = [
    case("squares pass", "```python\nn=int(input())\nprint(n*n)\n```", ["2\n", "5\n"], ["4", "25"], 1.0),
    case("wrong answer", "```python\nn=int(input())\nprint(n+1)\n```", ["3\n"], ["9"], 0.0),
    # Only fenced code counts: the raw text is kept, no code is extracted.
    case(
        "no code block",
        "n=int(input())\nprint(n*n)",
        ["2\n"],
        ["4"],
        0.0,
        extracted_model_output="n=int(input())\nprint(n*n)",
        extracted_model_code=None,
    ),
    case(
        "syntax error", "```python\nprint('hello'  # Missing closing parenthesis\n```", ["\n"], ["hello"], 0.0
    ),
    case("runtime error", "```python\nn=int(input())\nprint(n/0)\n```", ["5\n"], ["error"], 0.0),
]
