"""The request guard's JSON depth scan agrees with the parsed structure, escapes and all."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from nemo_gym.serving.request_guard import (
    MAX_JSON_DEPTH,
    HTTPError,
    json_nesting_depth,
    nesting_over,
    parse_json_object,
)

# Strings full of what confuses a byte scan: brackets, quotes, escaped quotes, backslashes, and an
# escape right before a closing quote ("\n" then '"').
PIECES = ["a", "[", "]", "{", "}", '"', "\\", "\n", "\\n", '\\"', "é", "\t", "/", "\\\\"]


def reference_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((reference_depth(v) for v in value), default=0)
    return 0


def random_value(rnd: random.Random, depth: int) -> Any:
    if depth > 12 or rnd.random() < 0.4:
        text = "".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 8)))
        return rnd.choice([text, 1, None, True, 2.5])
    if rnd.random() < 0.5:
        return [random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    return {
        "".join(rnd.choice(PIECES) for _ in range(3)): random_value(rnd, depth + 1)
        for _ in range(rnd.randint(0, 3))
    }


def test_the_scan_matches_the_parsed_depth_on_random_json() -> None:
    rnd = random.Random(7)
    for _ in range(1500):
        value = random_value(rnd, 0)
        depth = reference_depth(value)
        for raw in (
            orjson.dumps(value),
            json.dumps(value).encode(),
            json.dumps(value, ensure_ascii=False).encode(),
        ):
            assert json_nesting_depth(raw) == depth, raw
            assert nesting_over(raw, depth) is None
            if depth and len(raw) > depth - 1:
                assert nesting_over(raw, depth - 1) == depth, raw


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 900])
def test_bodies_past_the_limit_are_a_400_naming_the_depth(depth: int) -> None:
    # Hidden behind strings that hold closing brackets and escaped quotes.
    inner: Any = 1
    for _ in range(depth - 1):
        inner = {"k": inner, "noise": ']]]}}} \\" \\\\'}
    raw = json.dumps({"body": inner}).encode()
    assert json_nesting_depth(raw) == depth
    if depth <= MAX_JSON_DEPTH:
        assert parse_json_object(raw)["body"]
    else:
        with pytest.raises(HTTPError) as refused:
            parse_json_object(raw)
        assert refused.value.status_code == 400 and f"nests {depth} levels" in refused.value.message


def test_a_long_tool_calling_history_is_scanned_exactly() -> None:
    """Many strings holding JSON (tool arguments and outputs: brackets and escaped quotes inside
    strings), text with escapes before closing quotes, and a deep branch among shallow ones."""
    items: list[Any] = []
    for n in range(150):
        items.append({"type": "message", "content": [{"type": "output_text", "text": f"turn {n}\n" * 20}]})
        items.append(
            {"type": "function_call", "arguments": json.dumps({"city": "S[F]", "n": [n, {"k": "}"}]})}
        )
        items.append({"type": "function_call_output", "output": json.dumps({"w": "cold\\", "q": '"]'})})
    deep: Any = "x"
    for _ in range(30):
        deep = [deep]
    items.insert(75, {"deep": deep})
    value = {"response": {"output": items}}
    depth = reference_depth(value)
    assert depth == 34
    for raw in (orjson.dumps(value), json.dumps(value, indent=1).encode()):
        assert json_nesting_depth(raw) == depth
        assert nesting_over(raw, depth) is None
        assert nesting_over(raw, depth - 1) == depth
        assert nesting_over(raw, 3) == depth
