"""UsageSum (the agent loop's running usage) gives exactly add_usage's fold, errors included."""

from __future__ import annotations

import random
from typing import Any

import pytest

from nemo_gym.response_items import UsageSum, add_usage, usage_dict


def _fold(usages: list[Any]) -> tuple[Any, Any]:
    total = None
    for index, usage in enumerate(usages):
        try:
            total = add_usage(total, usage)
        except Exception as exc:
            return None, (type(exc), index)
    return total, None


def _summed(usages: list[Any]) -> tuple[Any, Any]:
    running = UsageSum()
    for index, usage in enumerate(usages):
        try:
            running.add(usage)
        except Exception as exc:
            return None, (type(exc), index)
    return running.total(), None


def _random_usage(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.2:
        return {}
    usage: dict[str, Any] = {"model_specific": 1} if rng.random() < 0.1 else {}
    for key in ("input_tokens", "output_tokens"):
        if rng.random() < 0.85:
            usage[key] = rng.choice([rng.randint(0, 99), 1.5, 0.1])
    if rng.random() < 0.7:
        usage["output_tokens_details"] = rng.choice([{"reasoning_tokens": rng.randint(0, 9)}, {}, None])
    if rng.random() < 0.7:
        usage["input_tokens_details"] = rng.choice([{"cached_tokens": rng.randint(0, 9)}, {}, None, [1]])
    if rng.random() < 0.02:
        usage["input_tokens"] = "not a number"
    return usage


def test_usage_sum_is_add_usage_folded() -> None:
    rng = random.Random(36)
    for _ in range(5000):
        usages = [_random_usage(rng) for _ in range(rng.randint(0, 6))]
        expected, expected_error = _fold(usages)
        got, error = _summed(usages)
        assert error == expected_error, usages
        assert got == expected, usages
        if expected is not None:
            assert list(got) == list(expected)  # same keys in the same order: same bytes written


@pytest.mark.parametrize(
    ("usages", "total"),
    [
        ([], None),
        ([None, {}], None),
        ([{"input_tokens": 3, "extra": True}], {"input_tokens": 3, "extra": True}),
        (
            [usage_dict(10, 2, 1, 4), None, usage_dict(20, 3, 0, 5), usage_dict(1, 1, 1, 1)],
            usage_dict(31, 6, 2, 10),
        ),
    ],
)
def test_usage_sum_examples(usages: list[Any], total: Any) -> None:
    assert _summed(usages) == (total, None)
