"""tool_call_match: typed call comparison, schema checks, tool routes, empty answers, end to end."""

import json
from pathlib import Path

import pytest

from nemo_gym.response_items import function_call_item, message_item
from nemo_gym.testing import (
    SyncClient,
    collect_examples,
    post_verify,
    read_jsonl,
    running_agent,
    running_server,
)
from resources_servers.tool_call_match.app import ExpectedCall, ToolCallMatchServer, json_equal, match_calls
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.scripted_model.app import ScriptedModel

HERE = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
WEATHER, CURRENCY, STOCKS, TIMER, BOOKS = ROWS


@pytest.fixture(scope="module")
def url():
    with running_server(ToolCallMatchServer({"name": "tool_call_match"})) as base:
        yield base


def calls(*pairs: tuple[str, object]) -> dict:
    """A response whose output holds these calls (arguments given as objects or raw strings)."""
    return {
        "output": [
            function_call_item(name, args if isinstance(args, str) else json.dumps(args))
            for name, args in pairs
        ]
    }


def components(body: dict) -> tuple[float, float, float]:
    c = body["reward_components"]
    return c["name_correct"], c["arguments_correct"], c["schema_valid"]


def test_typed_json_equality():
    assert json_equal({"a": 1, "b": [1.0, "x"]}, {"b": [1, "x"], "a": 1.0})
    assert not json_equal(1, True) and not json_equal("14", 14) and not json_equal(None, 0)
    assert not json_equal([1, 2], [2, 1]) and not json_equal({"a": 1}, {"a": 1, "b": None})


def test_correct_calls_score_one_in_any_order(url: str):
    body = post_verify(url, WEATHER, calls(("get_weather", '{"unit": "celsius", "city": "Paris"}')))
    assert body["reward"] == 1.0 and components(body) == (1.0, 1.0, 1.0)
    assert body["predicted_calls"] == [
        {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris"}}
    ]
    assert (body["num_expected"], body["num_predicted"], body["num_correct"]) == (1, 1, 1)
    assert body["mismatches"] == [] and body["expected_calls"] == WEATHER["expected_calls"]
    two = post_verify(
        url, STOCKS, calls(("get_stock_price", {"symbol": "MSFT"}), ("get_stock_price", {"symbol": "AAPL"}))
    )
    assert two["reward"] == 1.0 and two["num_correct"] == 2
    # 250.0 and 250 are the same JSON number.
    assert (
        post_verify(
            url,
            CURRENCY,
            calls(("convert_currency", {"amount": 250.0, "from_currency": "USD", "to_currency": "EUR"})),
        )["reward"]
        == 1.0
    )


def test_wrong_calls_and_what_the_diagnostics_say(url: str):
    wrong_name = post_verify(url, WEATHER, calls(("convert_currency", {"city": "Paris", "unit": "celsius"})))
    assert wrong_name["reward"] == 0.0 and components(wrong_name)[:2] == (0.0, 0.0)
    assert wrong_name["mismatches"] == [
        "get_weather: expected call not made",
        "convert_currency: unexpected call",
    ]
    wrong_value = post_verify(url, WEATHER, calls(("get_weather", {"city": "Lyon", "unit": "celsius"})))
    assert components(wrong_value) == (1.0, 0.0, 1.0)
    assert wrong_value["mismatches"] == [
        'get_weather: argument \'city\': expected "Paris" (string), got "Lyon" (string)'
    ]
    as_string = post_verify(url, TIMER, calls(("set_timer", {"minutes": "15", "label": "tea"})))
    assert as_string["reward"] == 0.0 and components(as_string) == (1.0, 0.0, 0.0)
    assert 'expected 15 (integer), got "15" (string)' in as_string["mismatches"][0]
    assert as_string["schema_errors"] == ["call 0 'set_timer': minutes: '15' is not of type 'integer'"]
    one_of_two = post_verify(url, STOCKS, calls(("get_stock_price", {"symbol": "AAPL"})))
    assert (one_of_two["reward"], one_of_two["num_correct"], components(one_of_two)[0]) == (0.0, 1, 0.0)
    assert one_of_two["mismatches"] == ["get_stock_price: expected call not made"]
    repeated = post_verify(url, WEATHER, calls(*[("get_weather", {"city": "Paris", "unit": "celsius"})] * 2))
    assert (repeated["reward"], repeated["num_correct"], repeated["mismatches"]) == (
        0.0,
        1,
        ["get_weather: unexpected call"],
    )


def test_extra_arguments_and_schema_requirement_follow_the_config(url: str):
    extra = calls(("get_weather", {"city": "Paris", "unit": "celsius", "days": 1}))
    strict = post_verify(url, WEATHER, extra)
    assert strict["reward"] == 0.0 and strict["mismatches"] == [
        "get_weather: unexpected argument(s) ['days']"
    ]
    assert components(strict)[2] == 0.0  # the schema forbids additional properties
    with running_server(ToolCallMatchServer({"name": "lenient", "allow_extra_arguments": True})) as lenient:
        assert post_verify(lenient, WEATHER, extra)["reward"] == 1.0
    row = {**TIMER, "expected_calls": [{"name": "set_timer", "arguments": {"minutes": 0, "label": "tea"}}]}
    below_minimum = calls(("set_timer", {"minutes": 0, "label": "tea"}))
    assert post_verify(url, row, below_minimum)["reward"] == 1.0
    with running_server(ToolCallMatchServer({"name": "schema", "require_schema_valid": True})) as schema:
        body = post_verify(schema, row, below_minimum)
    assert body["reward"] == 0.0 and body["schema_errors"] == [
        "call 0 'set_timer': minutes: 0 is less than the minimum of 1"
    ]


def test_malformed_calls_and_rows(url: str):
    broken = post_verify(url, WEATHER, calls(("get_weather", '{"city": "Paris", ')))
    assert broken["reward"] == 0.0 and components(broken) == (1.0, 0.0, 0.0)
    assert broken["predicted_calls"] == [{"name": "get_weather", "arguments": '{"city": "Paris", '}]
    assert broken["mismatches"] == ["get_weather: arguments are not a JSON object"]
    with SyncClient() as client:
        no_field = {k: v for k, v in WEATHER.items() if k != "expected_calls"}
        status, body = client.post(url + "/verify", {**no_field, "response": {}})
        assert status == 422 and "expected_calls: field required" in body["error"]
        status, body = client.post(
            url + "/verify", {**WEATHER, "expected_calls": [{"arguments": {}}], "response": {}}
        )
        assert status == 422 and "expected_calls.0.name" in body["error"]
        status, body = client.post(
            url + "/verify",
            {**WEATHER, "expected_calls": [{"name": "x", "arguments": "[1]"}], "response": {}},
        )
        assert status == 422 and "expected_calls.0.arguments: not a JSON object" in body["error"]


@pytest.mark.parametrize("response", [{}, {"output": []}, {"output": [message_item("It is sunny.")]}])
def test_no_call_scores_zero_unless_none_is_expected(url: str, response: dict):
    body = post_verify(url, WEATHER, response)
    assert (
        body["reward"] == 0.0
        and body["num_predicted"] == 0
        and body["mismatches"] == ["get_weather: expected call not made"]
    )
    assert post_verify(url, {**WEATHER, "expected_calls": []}, response)["reward"] == 1.0


def test_tool_routes_validate_arguments_but_run_nothing(url: str):
    with SyncClient() as rollout:
        status, body = rollout.post(url + "/get_weather", {"city": "Paris", "unit": "celsius"})
        assert status == 404 and "seed_session" in body["error"]
        assert rollout.post(url + "/seed_session", WEATHER) == (200, {})
        status, body = rollout.post(url + "/get_weather", {"city": "Paris", "unit": "celsius"})
        assert status == 200 and body["status"] == "not_executed"
        status, body = rollout.post(url + "/get_weather", {"city": 5, "unit": "kelvin"})
        assert (
            status == 422
            and "city: 5 is not of type 'string'" in body["error"]
            and "unit: 'kelvin'" in body["error"]
        )
        status, body = rollout.post(url + "/get_weather", {"town": "Paris", "unit": "celsius"})
        assert (
            status == 422
            and "city: 'city' is a required property" in body["error"]
            and "'town' was unexpected" in body["error"]
        )
        status, body = rollout.post(url + "/set_timer", {"minutes": 1})
        assert status == 404 and "['convert_currency', 'get_weather']" in body["error"]
        rollout.post(url + "/verify", {**WEATHER, "response": {}})
        status, _ = rollout.post(url + "/get_weather", {"city": "Paris", "unit": "celsius"})
        assert status == 404  # the session was freed by verify


def test_bad_tool_arguments_reach_the_model_as_text_through_simple_agent():
    scripts = [{"turns": [{"call_tool": "set_timer", "arguments": {"minutes": "15", "label": "tea"}}]}]
    env, model = ToolCallMatchServer({"name": "env"}), ScriptedModel({"name": "model", "scripts": scripts})
    with running_agent(env, model, max_steps=1, agent_class=SimpleAgent) as agent_url, SyncClient() as http:
        status, body = http.post(agent_url + "/run", TIMER)
    assert status == 200, body
    kinds = [i["type"] for i in body["response"]["output"]]
    assert kinds == ["function_call", "function_call_output"]
    assert (
        "HTTP 422" in body["response"]["output"][1]["output"]
        and "minutes" in body["response"]["output"][1]["output"]
    )
    assert body["reward"] == 0.0 and body["reward_components"]["schema_valid"] == 0.0


def test_matching_is_one_to_one_and_maximal():
    # The first predicted call fits both expected calls; a greedy pairing could waste it.
    expected = [ExpectedCall(name="f", arguments={}), ExpectedCall(name="f", arguments={"a": 1})]
    predicted = [{"name": "f", "arguments": '{"a": 1}'}, {"name": "f", "arguments": "{}"}]
    result = match_calls(predicted, expected, {"f": {"type": "object"}}, allow_extra=True)
    assert result.num_correct == 2 and result.arguments_correct


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl")
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["id"]: r for r in rows}
    assert {i for i, r in results.items() if r["reward"] == 1.0} == {0}
    assert results[3]["reward_components"] == {
        "name_correct": 1.0,
        "arguments_correct": 0.0,
        "schema_valid": 0.0,
    }
    assert "HTTP 422" in results[3]["response"]["output"][1]["output"]
