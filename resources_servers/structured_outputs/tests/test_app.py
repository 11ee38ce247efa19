"""structured_outputs: text and tool-call answers, typed errors, adversarial documents, the answer
tool acknowledgement, NeMo Gym rows and replay, and one collection end to end."""

import json
import time
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.response_items import function_call_item, message_item
from nemo_gym.testing import (
    SyncClient,
    collect_examples,
    compat_dir,
    post_verify,
    read_jsonl,
    running_server,
    verify_text,
)
from resources_servers.structured_outputs.app import StructuredOutputsServer, strictify

HERE = Path(__file__).resolve().parent.parent
COMPAT = compat_dir("structured_outputs")
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
BOOK_ROW, CITY_ROW, EVENT_ROW, RECIPE_ROW, SERVICE_ROW = ROWS
BOOK = {"title": "The Left Hand of Darkness", "author": "Ursula K. Le Guin", "year": 1969, "genres": ["sf"]}
CITY = {"name": "Lisbon", "country": "Portugal", "population": 545796, "landmarks": ["Belem Tower"]}
RECIPE = {
    "dish": "pancakes",
    "servings": 4,
    "ingredients": [{"item": "flour", "grams": 250}],
    "vegetarian": True,
}
SERVICE_YAML = "service: api\nport: 8080\nreplicas: 3\nenv:\n  - name: LOG_LEVEL\n    value: info\n"


@pytest.fixture(scope="module")
def url():
    with running_server(StructuredOutputsServer({"name": "structured_outputs"})) as base:
        yield base


def verify_output(url: str, row: dict, output: list, status: int = 200) -> dict:
    return post_verify(url, row, {"output": output}, status)


def verify_call(url: str, row: dict, name: str, arguments: Any) -> dict:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return verify_output(url, row, [function_call_item(name, raw), message_item("Done.")])


def outcome(body: dict) -> tuple[float, str | None]:
    return body["reward"], body["error_type"]


def test_valid_json_text_scores_one(url: str):
    body = verify_text(url, RECIPE_ROW, json.dumps(RECIPE))
    assert outcome(body) == (1.0, None) and body["error_message"] is None
    assert body["schema_str"] == RECIPE_ROW["schema_str"] and body["source_record_id"] == "so-ex-0004"


def test_schema_violations_are_typed_and_located(url: str):
    body = verify_text(url, RECIPE_ROW, json.dumps({**RECIPE, "servings": "four"}))
    assert outcome(body) == (0.0, "validation_error") and "servings" in body["error_message"]
    nested = {**RECIPE, "ingredients": [{"item": "flour", "grams": -1}]}
    assert "ingredients/0/grams" in verify_text(url, RECIPE_ROW, json.dumps(nested))["error_message"]
    # Strict schemas: every declared property is required and no others are allowed.
    extra = verify_text(url, RECIPE_ROW, json.dumps({**RECIPE, "notes": "yum"}))
    assert outcome(extra) == (0.0, "validation_error")
    missing = verify_text(url, RECIPE_ROW, json.dumps({k: v for k, v in RECIPE.items() if k != "vegetarian"}))
    assert outcome(missing) == (0.0, "validation_error")


def test_strict_schema_rule_and_its_switch():
    loose = json.dumps(
        {"type": "object", "properties": {"a": {"type": "integer"}, "properties": {"type": "string"}}}
    )
    strict = strictify(json.loads(loose))
    assert strict["required"] == ["a", "properties"] and strict["additionalProperties"] is False
    assert "required" not in strict["properties"]["properties"]  # a property named "properties" is data
    row = {"responses_create_params": {"input": "x"}, "schema_str": loose}
    with running_server(StructuredOutputsServer({"name": "so", "strict_schema": False})) as base:
        assert verify_text(base, row, '{"a": 1, "b": 2}')["reward"] == 1.0


def test_malformed_and_fenced_text_are_parse_errors(url: str):
    for text in ("{'dish': 'pancakes'}", '{"dish": "pancakes"', "```json\n" + json.dumps(RECIPE) + "\n```"):
        assert outcome(verify_text(url, RECIPE_ROW, text)) == (0.0, "parse_error"), text


def test_empty_responses_are_typed_empty(url: str):
    for output in ([], [message_item("")], [message_item("  \n")], [{"type": "reasoning", "summary": []}]):
        assert outcome(verify_output(url, RECIPE_ROW, output)) == (0.0, "empty_response")
        assert outcome(verify_output(url, BOOK_ROW, output)) == (0.0, "missing_tool_call")


def test_deeply_nested_documents_fail_fast(url: str):
    started = time.monotonic()
    assert outcome(verify_text(url, RECIPE_ROW, "[" * 100_000 + "]" * 100_000)) == (0.0, "too_deep")
    assert outcome(verify_text(url, RECIPE_ROW, '{"a":' * 150 + "1" + "}" * 150)) == (0.0, "too_deep")
    assert time.monotonic() - started < 10


def test_huge_documents_are_bounded(url: str):
    many = "[" + ",".join(["0"] * 1_100_000) + "]"  # under the character limit, over the value budget
    body = verify_text(url, RECIPE_ROW, many)
    assert outcome(body) == (0.0, "too_large")
    assert outcome(verify_text(url, RECIPE_ROW, '"' + "x" * 4_100_000 + '"')) == (0.0, "too_large")
    with SyncClient() as client:
        assert client.get(url + "/")[0] == 200


def test_yaml_answers_dates_stay_strings_and_alias_bombs_are_bounded(url: str):
    assert outcome(verify_text(url, SERVICE_ROW, SERVICE_YAML)) == (1.0, None)
    assert outcome(verify_text(url, SERVICE_ROW, "service: [unclosed")) == (0.0, "parse_error")
    dated = {
        **SERVICE_ROW,
        "schema_str": json.dumps({"type": "object", "properties": {"day": {"type": "string"}}}),
    }
    assert verify_text(url, dated, "day: 2024-05-01")["reward"] == 1.0
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)
    )
    started = time.monotonic()
    assert outcome(verify_text(url, SERVICE_ROW, bomb)) == (0.0, "too_large")
    assert time.monotonic() - started < 10


def test_xml_toml_and_csv_answers(url: str):
    xml_row = {
        **RECIPE_ROW,
        "schema_type": "XML",
        "schema_str": json.dumps(
            {
                "type": "object",
                "properties": {
                    "service": {
                        "type": "object",
                        "properties": {
                            "port": {"type": "integer"},
                            "public": {"type": "boolean"},
                            "tags": {"type": "array", "items": {"type": "string"}},
                        },
                    }
                },
            }
        ),
    }
    good = "<service><port>8080</port><public>true</public><tags><tag>a</tag><tag>b</tag></tags></service>"
    assert outcome(verify_text(url, xml_row, good)) == (1.0, None)
    assert outcome(verify_text(url, xml_row, good.replace("8080", "eighty"))) == (0.0, "validation_error")
    assert outcome(verify_text(url, xml_row, "<service><port>8080</service>")) == (0.0, "parse_error")
    toml_row = {**SERVICE_ROW, "schema_type": "toml"}
    toml = 'service = "api"\nport = 8080\nreplicas = 3\n[[env]]\nname = "LOG_LEVEL"\nvalue = "info"\n'
    assert outcome(verify_text(url, toml_row, toml)) == (1.0, None)
    csv_row = {
        **RECIPE_ROW,
        "schema_type": "csv",
        "schema_str": json.dumps(
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"item": {"type": "string"}, "grams": {"type": "number"}},
                },
            }
        ),
    }
    assert outcome(verify_text(url, csv_row, "item,grams\nflour,250\nmilk,500\n")) == (1.0, None)
    assert outcome(verify_text(url, csv_row, "item,grams\nflour,lots\n")) == (0.0, "validation_error")


def test_tool_call_answers(url: str):
    assert outcome(verify_call(url, BOOK_ROW, "record_book", BOOK)) == (1.0, None)
    assert outcome(verify_call(url, CITY_ROW, "extract_city", {"extraction": CITY})) == (1.0, None)
    event = {
        "event_name": "Tour",
        "year": 1989,
        "location": {"city": "Paris", "country": "France"},
        "winner": None,
    }
    assert outcome(verify_call(url, EVENT_ROW, "summary_tool", {"event_info": event})) == (1.0, None)
    # The distractor tool, a prose answer, a missing wrapper key, and broken JSON arguments.
    assert outcome(verify_call(url, BOOK_ROW, "record_movie", BOOK)) == (0.0, "wrong_tool_name")
    assert outcome(verify_text(url, BOOK_ROW, json.dumps(BOOK))) == (0.0, "missing_tool_call")
    assert outcome(verify_call(url, CITY_ROW, "extract_city", CITY)) == (0.0, "missing_tool_payload_key")
    assert outcome(verify_call(url, EVENT_ROW, "summary_tool", {"person_info": event})) == (
        0.0,
        "missing_tool_payload_key",
    )
    assert outcome(verify_call(url, BOOK_ROW, "record_book", '{"title": ')) == (
        0.0,
        "tool_arguments_parse_error",
    )
    assert outcome(
        verify_call(url, CITY_ROW, "extract_city", {"extraction": {**CITY, "population": "545,796"}})
    ) == (
        0.0,
        "validation_error",
    )
    # Exactly one call (NeMo Gym's rule): a second one, even to the answer tool or a distractor, scores 0.
    for second in ("record_book", "record_movie"):
        calls = [
            function_call_item("record_book", json.dumps(BOOK)),
            function_call_item(second, json.dumps(BOOK)),
        ]
        assert outcome(verify_output(url, BOOK_ROW, calls)) == (0.0, "multiple_tool_calls")
    # Without tool_name, the one call made is the answer, whatever its name.
    assert outcome(verify_call(url, {**BOOK_ROW, "tool_name": None}, "record_movie", BOOK)) == (1.0, None)
    # A response that carries an error is api_error.
    errored = post_verify(url, BOOK_ROW, {"output": [], "error": {"code": "server_error", "message": "boom"}})
    assert (errored["reward"], errored["error_type"]) == (0.0, "api_error")


def test_bad_rows_get_422_naming_the_field(url: str):
    body = verify_text(url, {**RECIPE_ROW, "schema_str": "{not json"}, "{}", status=422)
    assert "schema_str is not valid JSON" in body["error"]
    body = verify_text(url, {**RECIPE_ROW, "schema_str": '{"type": 12}'}, "{}", status=422)
    assert "schema_str is not a valid JSON Schema" in body["error"]
    body = verify_text(url, {**RECIPE_ROW, "schema_type": "pdf"}, "{}", status=422)
    assert body["detail"][0]["field"] == "schema_type"
    missing = {k: v for k, v in RECIPE_ROW.items() if k != "schema_str"}
    assert verify_text(url, missing, "{}", status=422)["detail"][0]["field"] == "schema_str"


def test_answer_tools_are_acknowledged_for_their_rollout_only(url: str):
    with SyncClient() as client:
        assert client.post(url + "/seed_session", BOOK_ROW)[0] == 200
        status, body = client.post(url + "/record_book", BOOK)
        assert status == 200 and body["status"] == "received"
        assert client.post(url + "/not_a_tool", {})[0] == 404
    with SyncClient() as fresh:  # no session: nothing was offered to it
        assert fresh.post(url + "/record_book", BOOK)[0] == 404


def instance_of(schema: dict) -> Any:
    """A minimal instance of the simple schemas NeMo Gym's rows use (type/properties/items)."""
    declared = schema.get("type")
    kinds = declared if isinstance(declared, list) else [declared]
    kind = str(next((k for k in kinds if k != "null"), "null"))
    if kind == "object":
        return {k: instance_of(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [instance_of(schema.get("items") or {})]
    return {"string": "x", "integer": 1, "number": 1.5, "boolean": True}.get(kind)


def prompt_schema(recorded: dict) -> dict:
    """NeMo Gym's recorded rollouts keep no schema field; its prompt shows the properties map."""
    text = "\n".join(m["content"] for m in recorded["responses_create_params"]["input"])
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if text.startswith('{"', i)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and all(isinstance(v, dict) and "type" in v for v in value.values()):
            return {"type": "object", "properties": value}
    raise AssertionError("no schema in the recorded prompt")


@pytest.mark.skipif(not COMPAT.exists(), reason="compat corpus not present")
def test_nemo_gym_rows_run_unchanged_and_recorded_rollouts_replay(url: str):
    examples = read_jsonl(COMPAT / "example.jsonl")
    with SyncClient() as client:
        for row in examples:
            assert client.post(url + "/seed_session", row)[0] == 200
            assert outcome(verify_output(url, row, [])) == (0.0, "missing_tool_call")
            assert outcome(verify_call(url, row, "not_the_answer_tool", {})) == (0.0, "wrong_tool_name")
            payload = instance_of(json.loads(row["schema_str"]))
            arguments = {row["tool_payload_key"]: payload} if row["tool_payload_key"] else payload
            assert outcome(verify_call(url, row, row["tool_name"], arguments)) == (1.0, None)
    for recorded in read_jsonl(COMPAT / "example_rollouts.jsonl"):
        replay = {**recorded, "schema_str": json.dumps(prompt_schema(recorded)), "schema_type": "json"}
        with SyncClient() as client:
            status, ours = client.post(url + "/verify", replay)
        assert status == 200, ours
        assert ours["reward"] == recorded["reward"], ours["error_message"]


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl", route_by_agent_ref=True)
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["source_record_id"]: r for r in rows}
    assert {k: (r["reward"], r["error_type"]) for k, r in results.items()} == {
        "so-ex-0001": (1.0, None),
        "so-ex-0002": (0.0, "validation_error"),
        "so-ex-0003": (1.0, None),
        "so-ex-0004": (1.0, None),
        "so-ex-0005": (1.0, None),
    }
    # The tool call was acknowledged by the environment, then the model finished.
    book_output = results["so-ex-0001"]["response"]["output"]
    assert [item["type"] for item in book_output] == ["function_call", "function_call_output", "message"]
    assert "Received" in book_output[1]["output"]
