"""NeMo Gym's xlam_fc verify test cases (its tests/test_app.py), as data: inputs, rewards and
the ``num_expected`` / ``num_predicted`` / ``num_correct`` counts its tests check, in its order."""

import json
from typing import Any

from nemo_gym.response_items import function_call_item, message_item
from nemo_gym.testing import ParityCase

WEATHER = "What's the weather in San Francisco?"
GIVEAWAYS = "Where can I find live giveaways?"


def case(
    name: str,
    prompt: str,
    output: list[dict[str, Any]],
    expected: list[dict[str, Any]],
    reward: float,
    counts: tuple[int, int, int],
) -> ParityCase:
    """A row with ``expected_answers``; ``counts`` = (num_expected, num_predicted, num_correct)."""
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "expected_answers": expected,
    }
    expect = dict(zip(("num_expected", "num_predicted", "num_correct"), counts, strict=True))
    return ParityCase(name, row, output, reward, expect)


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A function_call output item."""
    return function_call_item(name, json.dumps(arguments))


def answer(name: str, **arguments: Any) -> dict[str, Any]:
    """An expected call."""
    return {"name": name, "arguments": arguments}


SF = answer("get_weather", city="San Francisco")
BETA, GAME = answer("live_giveaways_by_type", type="beta"), answer("live_giveaways_by_type", type="game")

CASES = [
    case("exact single call", WEATHER, [call("get_weather", city="San Francisco")], [SF], 1.0, (1, 1, 1)),
    case(
        "exact two calls",
        GIVEAWAYS,
        [call("live_giveaways_by_type", type="beta"), call("live_giveaways_by_type", type="game")],
        [BETA, GAME],
        1.0,
        (2, 2, 2),
    ),
    case(
        "one of two right",
        GIVEAWAYS,
        [call("live_giveaways_by_type", type="beta"), call("live_giveaways_by_type", type="loot")],
        [BETA, GAME],
        0.0,
        (2, 2, 1),
    ),
    case("wrong function", WEATHER, [call("wrong_function", city="New York")], [SF], 0.0, (1, 1, 0)),
    case("wrong arguments", WEATHER, [call("get_weather", city="New York")], [SF], 0.0, (1, 1, 0)),
    case("no call", WEATHER, [message_item("I don't know how to help with that.")], [SF], 0.0, (1, 0, 0)),
    case(
        "extra argument allowed",
        WEATHER,
        [call("get_weather", city="San Francisco", units="celsius")],
        [SF],
        1.0,
        (1, 1, 1),
    ),
    case(
        "nothing expected, nothing called",
        WEATHER,
        [message_item("Here's some information.")],
        [],
        1.0,
        (0, 0, 0),
    ),
    case(
        "several arguments",
        "q",
        [call("t3ma", symbol="ETH/BTC", interval="1h", time_period=14)],
        [answer("t3ma", symbol="ETH/BTC", interval="1h", time_period=14)],
        1.0,
        (1, 1, 1),
    ),
]
