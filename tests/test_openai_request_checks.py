"""The fast path of the Responses request check accepts exactly what the full checks accept.

``check_responses_request`` first compares exact types without a call per field; whatever it
does not accept goes through the full checks, which name the field. Here every field of a rich
request is replaced by values of every JSON type (and subclasses a JSON parser never makes):
the outcome, accepted or the 400's message, is the full checks' own each time.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import pytest

from nemo_gym.models.openai_request_checks import check_responses_request, check_responses_request_fully
from nemo_gym.serving.server import HTTPError


class Text(str):
    pass


class Items(list):  # type: ignore[type-arg]
    pass


REQUEST: dict[str, Any] = {
    "model": "m",
    "stream": False,
    "metadata": {"k": "v"},
    "temperature": 0.5,
    "top_p": 1,
    "max_output_tokens": 64,
    "tools": [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
        {"name": "no_type", "parameters": None},
        {"type": "web_search"},
    ],
    "input": [
        {"role": "user", "content": "hi"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "x", "refusal": None}],
        },
        {"type": "reasoning", "summary": [], "prompt_token_ids": [1, 2], "generation_token_ids": None},
        {"type": "function_call", "name": "get_weather", "arguments": "{}", "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": None, "output": [{"type": "input_text", "text": "t"}]},
        {"type": "custom_thing"},
    ],
}
VALUES = [None, 5, 1.5, True, "s", [], {}, [5], [{}], {"a": 5}, Text("t"), Items(), OrderedDict(), Items([5])]


def paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside a request (dict keys and list indexes)."""
    found = [path] if path else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += paths(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += paths(inner, (*path, index))
    return found


def replaced(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(REQUEST)
    holder: Any = body
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = value
    return body


def outcome(check: Any, body: Any) -> str | None:
    try:
        check(body)
    except HTTPError as exc:
        assert exc.status_code == 400
        return str(exc.message)
    return None


def test_the_rich_request_is_accepted_on_the_fast_path() -> None:
    from nemo_gym.models.openai_request_checks import responses_request_fine

    assert outcome(check_responses_request, REQUEST) is None
    assert responses_request_fine(REQUEST)  # the comparisons below cover it


@pytest.mark.parametrize("path", paths(REQUEST), ids=lambda p: ".".join(map(str, p)))
def test_every_replaced_field_gets_the_full_checks_outcome(path: tuple[Any, ...]) -> None:
    for value in VALUES:
        body = replaced(path, value)
        assert outcome(check_responses_request, body) == outcome(check_responses_request_fully, body), (
            path,
            value,
        )


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "x",
        {},
        {"input": None},
        {"input": 5},
        {"input": Text("x")},
        OrderedDict(input="x"),
        {"input": []},
    ],
)
def test_odd_bodies_get_the_full_checks_outcome(body: Any) -> None:
    assert outcome(check_responses_request, body) == outcome(check_responses_request_fully, body)
