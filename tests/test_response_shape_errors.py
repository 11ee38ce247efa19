"""response_shape_errors names the same problems with its fast path for well-formed items as
without it: random output items, good and bad, checked against the full item checks."""

from __future__ import annotations

import random
from typing import Any

from nemo_gym import response_items
from nemo_gym.response_items import response_shape_errors

VALUES: list[Any] = [None, "text", "", 3, 2.5, True, [], {}, ["a"], [{"type": "output_text", "text": "x"}]]


class Text(str):
    """A str subclass: fine for the checks, but not the fast path's exact type."""


def random_item(rnd: random.Random) -> Any:
    if rnd.random() < 0.05:
        return rnd.choice(["not an item", 7, None, ["x"]])
    item: dict[str, Any] = {}
    for key in ("type", "role", "name", "arguments", "call_id", "id", "status"):
        if rnd.random() < 0.6:
            item[key] = rnd.choice(["message", Text("subclassed"), *VALUES] if rnd.random() < 0.2 else ["v"])
    roll = rnd.random()
    if roll < 0.3:
        item["content"] = "plain"
    elif roll < 0.8:
        parts: list[Any] = []
        for _ in range(rnd.randint(0, 3)):
            part = rnd.choice(
                [{"type": "output_text", "text": "ok"}, {"type": "x"}, {"text": rnd.choice(VALUES)}, "bad", 1]
            )
            parts.append(part)
        item["content"] = parts
    elif roll < 0.9:
        item["content"] = rnd.choice(VALUES)
    return item


def test_the_fast_path_changes_no_answer(monkeypatch) -> None:
    rnd = random.Random(11)
    responses = [{"output": [random_item(rnd) for _ in range(rnd.randint(0, 6))]} for _ in range(3000)]
    fast = [response_shape_errors(r) for r in responses]
    monkeypatch.setattr(response_items, "_item_shape_fine", lambda item: False)
    slow = [response_shape_errors(r) for r in responses]
    assert fast == slow
    assert sum(1 for errors in slow if errors) > 300  # bad items were among them
    assert sum(1 for errors in slow if not errors) > 300  # and good ones
