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
    _few_values,
    json_nesting_depth,
    nesting_over,
    orjson_depth_cap,
    parse_json_object,
    parsed_nesting_over,
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


def test_the_parsed_check_agrees_with_the_scan_at_every_limit() -> None:
    """parsed_nesting_over (a serialization of the parsed value, wrapped to orjson's cap) says
    exactly what the byte scan says, just under, at and over each value's depth."""
    rnd = random.Random(11)
    for _ in range(800):
        value = random_value(rnd, 0)
        raw = orjson.dumps(value)
        depth = reference_depth(value)
        for limit in {max(depth - 1, 0), depth, depth + 1, 0, MAX_JSON_DEPTH}:
            assert parsed_nesting_over(value, raw, limit) == nesting_over(raw, limit), (raw, limit)


def test_orjsons_depth_cap_is_found_exactly() -> None:
    cap = orjson_depth_cap()
    assert cap is not None and cap > MAX_JSON_DEPTH  # the pinned orjson refuses past a few hundred
    value: Any = 1
    for _ in range(cap):
        value = [value]
    orjson.dumps(value)
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps([value])


def prose_body(turns: int, deep_at: int | None = None, depth: int = 0) -> bytes:
    """A long history of prose (the parsed check's kind of body), with a nest ``depth`` deep at item
    ``deep_at`` hidden among strings holding brackets and escaped quotes."""
    items: list[Any] = []
    for n in range(turns):
        items.append(
            {
                "type": "message",
                "content": [{"type": "output_text", "text": f'Turn {n}: a [b] {{c}} \\" d. ' * 40}],
            }
        )
        items.append({"type": "function_call", "arguments": json.dumps({"city": "S[F]", "n": [n]})})
    if deep_at is None:
        return json.dumps({"input": items}).encode()
    items.insert(deep_at, "DEEP")
    levels = depth - 2  # inside the body and its "input": 2 levels around it
    deep = '{"noise": "]]}} \\" \\\\", "k": ' * levels + '"x"' + "}" * levels
    return json.dumps({"input": items}).replace('"DEEP"', deep).encode()


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 900, 2000])
def test_a_long_prose_body_is_checked_on_what_was_parsed_and_refused_past_the_limit(depth: int) -> None:
    raw = prose_body(40, deep_at=33, depth=depth)
    assert len(raw) >= 16_384 and _few_values(raw)  # the parsed check's path, not the scan's
    assert json_nesting_depth(raw) == depth
    if depth <= MAX_JSON_DEPTH:
        assert len(parse_json_object(raw)["input"]) == 81
    else:  # 2000 is past orjson's own 1024 too: still named by its depth, not as invalid JSON
        with pytest.raises(HTTPError) as refused:
            parse_json_object(raw)
        assert refused.value.status_code == 400 and f"nests {depth} levels" in refused.value.message


def test_a_long_body_of_numbers_goes_to_the_byte_scan_and_bad_json_is_named() -> None:
    tokens = orjson.dumps({"prompt_token_ids": list(range(20_000)), "logprobs": [-0.25] * 5000})
    assert not _few_values(tokens)  # serializing this many numbers costs more than the scan
    assert len(parse_json_object(tokens)["prompt_token_ids"]) == 20_000
    broken = prose_body(40)[:-1]  # long prose, one bracket short: not JSON, and not too deep
    assert _few_values(broken)
    with pytest.raises(HTTPError) as refused:
        parse_json_object(broken)
    assert refused.value.status_code == 400 and "is not valid JSON" in refused.value.message
    with pytest.raises(HTTPError) as refused:
        parse_json_object(b"[" + prose_body(40) + b"]")
    assert refused.value.status_code == 422 and "got an array" in refused.value.message
