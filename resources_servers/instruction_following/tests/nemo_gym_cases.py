"""NeMo Gym's instruction_following verify test cases (its tests/test_app.py), as data:
inputs, rewards, ``follow_all_instructions`` and ``follow_instruction_list``, in its order."""

from typing import Any

from nemo_gym.response_items import message_item
from nemo_gym.testing import ParityCase

TITLE, NO_COMMA, WORDS = "detectable_format:title", "punctuation:no_comma", "length_constraints:number_words"
TITLED = "<<My Title>>\n\nThis is the content of my response."
COMMA_HERE = "<<My Great Title>>\n\n with a comma here, okay."


def case(
    name: str,
    ids: list[str],
    prompt: str,
    kwargs: list[dict[str, Any]],
    text: str,
    follows: list[bool],
    reward: float,
    grading_mode: str = "binary",
) -> ParityCase:
    """A row in NeMo Gym's current layout (``verifier_metadata``)."""
    row = {
        "id": 1,
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "verifier_metadata": {
            "instruction_id_list": ids,
            "prompt": prompt,
            "kwargs": kwargs,
            "grading_mode": grading_mode,
        },
    }
    return legacy(name, row, text, follows, reward)


def legacy(name: str, row: dict[str, Any], text: str, follows: list[bool], reward: float) -> ParityCase:
    """A case from a prepared row (top-level fields for NeMo Gym's older layout)."""
    expect = {"follow_all_instructions": all(follows), "follow_instruction_list": follows}
    return ParityCase(name, row, [message_item(text)], reward, expect)


TITLE_PROMPT = "Write the entire response with a title."
BOTH_PROMPT = "Write a response with a title and no commas."
LEGACY_BASE = {"id": 1, "responses_create_params": {"input": [{"role": "user", "content": "prompt"}]}}

CASES = [
    case("title present", [TITLE], TITLE_PROMPT, [{}], TITLED, [True], 1.0),
    case("title missing", [TITLE], TITLE_PROMPT, [{}], "This response has no title.", [False], 0.0),
    case(
        "no comma kept",
        [NO_COMMA],
        "The output should not contain any commas.",
        [{}],
        "Hello world without commas at all",
        [True],
        1.0,
    ),
    case(
        "comma used",
        [NO_COMMA],
        "The output should not contain any commas.",
        [{}],
        "Hello, world with commas",
        [False],
        0.0,
    ),
    case(
        "at least 6 words",
        [WORDS],
        "The response must contain at least 6 words.",
        [{"num_words": 6, "relation": "at least"}],
        "This response has exactly six words.",
        [True],
        1.0,
    ),
    case(
        "fewer than 10 words",
        [WORDS],
        "The response must contain at least 10 words.",
        [{"num_words": 10, "relation": "at least"}],
        "Too short.",
        [False],
        0.0,
    ),
    case(
        "two instructions kept",
        [TITLE, NO_COMMA],
        BOTH_PROMPT,
        [{}, {}],
        "<<My Great Title>>\n\nThis is a response without any commas at all.",
        [True, True],
        1.0,
    ),
    case(
        "one of two broken",
        [TITLE, NO_COMMA],
        BOTH_PROMPT,
        [{}, {}],
        "<<My Great Title>>\n\nThis response has commas, which should fail.",
        [True, False],
        0.0,
    ),
    case(
        "fraction: half", [TITLE, NO_COMMA], BOTH_PROMPT, [{}, {}], COMMA_HERE, [True, False], 0.5, "fraction"
    ),
    legacy(
        "legacy top-level fields",
        {**LEGACY_BASE, "instruction_id_list": [TITLE], "prompt": TITLE_PROMPT, "kwargs": [{}]},
        TITLED,
        [True],
        1.0,
    ),
    legacy(
        "legacy top-level grading_mode",
        {
            **LEGACY_BASE,
            "instruction_id_list": [TITLE, NO_COMMA],
            "prompt": BOTH_PROMPT,
            "kwargs": [{}, {}],
            "grading_mode": "fraction",
        },
        COMMA_HERE,
        [True, False],
        0.5,
    ),
    legacy(
        "verifier_metadata wins over top-level fields",
        {
            **LEGACY_BASE,
            "instruction_id_list": [NO_COMMA],
            "prompt": "stale top-level prompt",
            "kwargs": [{}],
            "verifier_metadata": {"instruction_id_list": [TITLE], "prompt": TITLE_PROMPT, "kwargs": [{}]},
        },
        TITLED,
        [True],
        1.0,
    ),
]

# test_missing_verifier_metadata_fields_raises: such a row is refused (a 422 over HTTP).
MISSING_FIELDS_ROW = {**LEGACY_BASE, "verifier_metadata": {"prompt": "some prompt"}}
