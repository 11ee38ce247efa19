"""NeMo Gym's structured_outputs verify test cases (its tests/test_app.py), as data.

Inputs, expected rewards and ``error_type`` values are NeMo Gym's, in its test file's order.
``server``: ``default`` or ``no_xml_coercion`` (``xml_coerce_types: false``).
"""

import copy
import json
from typing import Any

import yaml

from nemo_gym.response_items import function_call_item, message_item
from nemo_gym.testing import ParityCase

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
ALICE = {"name": "Alice", "age": 30}


def _object(properties: dict[str, Any], *, strict: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if strict:
        schema.update(required=list(properties), additionalProperties=False)
    return schema


STRING, INTEGER, NUMBER, BOOLEAN = ({"type": t} for t in ("string", "integer", "number", "boolean"))
STRINGS = {"type": "array", "items": STRING}
STUDY_PLAN = _object(
    {
        "studentId": STRING,
        "examSubject": STRING,
        "plannedStudyHours": INTEGER,
        "isFullTimeStudent": BOOLEAN,
        "studyMaterials": _object(
            {
                "textbooks": STRINGS,
                "onlineResources": STRINGS,
                "practiceExams": _object(
                    {
                        "completedCount": INTEGER,
                        "averageScore": NUMBER,
                        "mostRecentDate": {"type": "string", "format": "date"},
                    },
                    strict=True,
                ),
            },
            strict=True,
        ),
        "studySchedule": _object(
            {
                "weeklyHours": INTEGER,
                "sessionsPerWeek": INTEGER,
                "preferredTimeOfDay": {"type": "string", "enum": ["morning", "afternoon", "evening"]},
                "studyDays": STRINGS,
                "breakSchedule": _object(
                    {
                        "shortBreakMinutes": INTEGER,
                        "longBreakMinutes": INTEGER,
                        "breakFrequencyMinutes": INTEGER,
                    },
                    strict=True,
                ),
            },
            strict=True,
        ),
        "preparationStatus": {
            "type": "string",
            "enum": ["not_started", "in_progress", "review_only", "ready"],
        },
    }
)
PLAN = {
    "studentId": "STU12345",
    "examSubject": "Calculus II",
    "plannedStudyHours": 120,
    "isFullTimeStudent": True,
    "studyMaterials": {
        "textbooks": ["Calculus: Early Transcendentals", "Schaum\u2019s Outline of Calculus"],
        "onlineResources": ["Khan Academy", "Coursera Calculus Course"],
        "practiceExams": {"completedCount": 8, "averageScore": 87.5, "mostRecentDate": "2024-05-10"},
    },
    "studySchedule": {
        "weeklyHours": 15,
        "sessionsPerWeek": 5,
        "preferredTimeOfDay": "evening",
        "studyDays": ["Monday", "Wednesday", "Friday"],
        "breakSchedule": {"shortBreakMinutes": 10, "longBreakMinutes": 25, "breakFrequencyMinutes": 50},
    },
    "preparationStatus": "in_progress",
}


def plan_variants() -> list[tuple[str, Any, float]]:
    """NeMo Gym's six JSON/YAML variants: valid, (unparseable), missing, extra, wrong type, nested extra."""
    nested = copy.deepcopy(PLAN)
    nested["studyMaterials"]["practiceExams"]["extraNestedField"] = "bad value"
    return [
        ("valid", PLAN, 1.0),
        ("missing field", {k: v for k, v in PLAN.items() if k != "studentId"}, 0.0),
        ("extra field", {**PLAN, "extraField": "some value"}, 0.0),
        ("wrong type", {**PLAN, "plannedStudyHours": "one hundred"}, 0.0),
        ("nested extra field", nested, 0.0),
    ]


def text_case(
    name: str,
    schema: dict,
    schema_type: str,
    text: str,
    reward: float,
    error: Any = ...,
    server: str = "default",
) -> ParityCase:
    """A text-mode case; ``error`` (when given) is NeMo Gym's ``error_type``."""
    row = {
        "responses_create_params": {"input": []},
        "schema_str": json.dumps(schema),
        "schema_type": schema_type,
    }
    expect = {} if error is ... else {"error_type": error}
    return ParityCase(name, row, [message_item(text)], reward, expect, server)


def tool_case(
    name: str, calls: list[tuple[str, str]] | None, reward: float, error: Any, **row: Any
) -> ParityCase:
    """A tool-call case: ``calls`` are (name, arguments) function calls; None: a text answer instead."""
    base = {
        "responses_create_params": {"input": []},
        "schema_str": json.dumps(PERSON),
        "response_mode": "tool_call",
        "tool_name": "extract_record",
        "tool_schema_mode": "direct",
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        **row,
    }
    output = (
        [message_item("I cannot extract that.")]
        if calls is None
        else [function_call_item(n, a) for n, a in calls]
    )
    return ParityCase(name, base, output, reward, {"error_type": error})


def _toml(*, drop: str = "", extra: str = "", nested_extra: str = "", build: str = "42") -> str:
    top = [
        'name = "my-project"',
        'version = "1.2.3"',
        f"buildNumber = {build}",
        "isStable = true",
        "score = 98.5",
        'tags = ["python", "ml"]',
        extra,
    ]
    lines = [line for line in top if line and not line.startswith(drop or "\0")]
    settings = ["[settings]", "debug = false", "timeout = 30", 'logLevel = "info"', nested_extra]
    return "\n".join(lines) + "\n\n" + "\n".join(line for line in settings if line) + "\n"


PROJECT = _object(
    {
        "name": STRING,
        "version": STRING,
        "buildNumber": INTEGER,
        "isStable": BOOLEAN,
        "score": NUMBER,
        "settings": _object({"debug": BOOLEAN, "timeout": INTEGER, "logLevel": STRING}, strict=True),
        "tags": STRINGS,
    }
)
XML_SCHEMA = _object(
    {"root": _object({"name": STRING, "age": INTEGER, "score": NUMBER, "active": BOOLEAN, "tag": STRINGS})}
)
XML_HEAD = '<?xml version="1.0" encoding="utf-8"?>\n'
VALID_XML = (
    XML_HEAD
    + "<root><name>Alice</name><age>25</age><score>95.5</score><active>true</active><tag>python</tag><tag>ml</tag></root>"
)
PEOPLE = {
    "type": "array",
    "items": _object({"name": STRING, "age": INTEGER, "score": NUMBER, "active": BOOLEAN}),
}
NULLABLE_PEOPLE = {"type": "array", "items": _object({"name": STRING, "age": {"type": ["integer", "null"]}})}

CASES = [
    # test_verify_tool_call_modes
    tool_case("tool direct", [("extract_record", json.dumps(ALICE))], 1.0, None),
    tool_case(
        "tool extraction wrapper",
        [("extract_record", json.dumps({"extraction": ALICE}))],
        1.0,
        None,
        tool_schema_mode="extraction_wrapper",
        tool_payload_key="extraction",
    ),
    tool_case(
        "tool random wrapper",
        [("extract_record", json.dumps({"summary": ALICE}))],
        1.0,
        None,
        tool_schema_mode="random_wrapper",
        tool_payload_key="summary",
    ),
    tool_case("tool distractor called", [("distractor_tool", json.dumps(ALICE))], 0.0, "wrong_tool_name"),
    tool_case("tool not called", None, 0.0, "missing_tool_call"),
    tool_case(
        "tool target and distractor",
        [("extract_record", json.dumps(ALICE)), ("distractor_tool", json.dumps(ALICE))],
        0.0,
        "multiple_tool_calls",
    ),
    tool_case("tool arguments not JSON", [("extract_record", '{"name":')], 0.0, "tool_arguments_parse_error"),
    tool_case(
        "tool wrapper key missing",
        [("extract_record", json.dumps({"result": ALICE}))],
        0.0,
        "missing_tool_payload_key",
        tool_schema_mode="extraction_wrapper",
        tool_payload_key="extraction",
    ),
    tool_case(
        "tool payload wrong type",
        [("extract_record", json.dumps({"name": "Alice", "age": "thirty"}))],
        0.0,
        "validation_error",
    ),
    # test_verify_json
    *[
        text_case(f"json {name}", STUDY_PLAN, "json", json.dumps(doc), reward)
        for name, doc, reward in plan_variants()[:1]
    ],
    text_case("json unparseable", STUDY_PLAN, "json", '{"studentId":"STU12345", ', 0.0),
    *[
        text_case(f"json {name}", STUDY_PLAN, "json", json.dumps(doc), reward)
        for name, doc, reward in plan_variants()[1:]
    ],
    # test_verify_yaml
    *[
        text_case(f"yaml {name}", STUDY_PLAN, "yaml", yaml.dump(doc, default_flow_style=False), reward)
        for name, doc, reward in plan_variants()[:1]
    ],
    text_case("yaml unparseable", STUDY_PLAN, "yaml", "key: value\n  bad_indent: oops\n notvalid", 0.0),
    *[
        text_case(f"yaml {name}", STUDY_PLAN, "yaml", yaml.dump(doc, default_flow_style=False), reward)
        for name, doc, reward in plan_variants()[1:]
    ],
    # test_verify_xml
    text_case("xml valid, types coerced", XML_SCHEMA, "xml", VALID_XML, 1.0),
    text_case("xml malformed", XML_SCHEMA, "xml", "<root><name>Alice</name><age>25", 0.0),
    text_case(
        "xml missing field",
        XML_SCHEMA,
        "xml",
        XML_HEAD
        + "<root><name>Alice</name><score>95.5</score><active>true</active><tag>python</tag><tag>ml</tag></root>",
        0.0,
    ),
    text_case(
        "xml extra field",
        XML_SCHEMA,
        "xml",
        VALID_XML.replace("</root>", "<extraField>bad</extraField></root>"),
        0.0,
    ),
    text_case("xml without coercion", XML_SCHEMA, "xml", VALID_XML, 0.0, server="no_xml_coercion"),
    # test_verify_toml
    text_case("toml valid", PROJECT, "toml", _toml(), 1.0),
    text_case("toml unparseable", PROJECT, "toml", 'name = "hello\n[invalid', 0.0, "parse_error"),
    text_case("toml missing field", PROJECT, "toml", _toml(drop="name ="), 0.0, "validation_error"),
    text_case(
        "toml extra field", PROJECT, "toml", _toml(extra='extraField = "some value"'), 0.0, "validation_error"
    ),
    text_case("toml wrong type", PROJECT, "toml", _toml(build='"forty-two"'), 0.0, "validation_error"),
    text_case(
        "toml nested extra field",
        PROJECT,
        "toml",
        _toml(nested_extra='extraNestedField = "bad value"'),
        0.0,
        "validation_error",
    ),
    # test_verify_csv
    text_case(
        "csv valid, types coerced",
        PEOPLE,
        "csv",
        "name,age,score,active\nAlice,30,95.5,true\nBob,25,88.0,false\n",
        1.0,
    ),
    text_case("csv blank", PEOPLE, "csv", "   ", 0.0, "empty_response"),
    text_case(
        "csv missing column",
        PEOPLE,
        "csv",
        "age,score,active\n30,95.5,true\n25,88.0,false\n",
        0.0,
        "validation_error",
    ),
    text_case(
        "csv extra column",
        PEOPLE,
        "csv",
        "name,age,score,active,bonus\nAlice,30,95.5,true,extra\nBob,25,88.0,false,extra\n",
        0.0,
        "validation_error",
    ),
    text_case(
        "csv wrong type",
        PEOPLE,
        "csv",
        "name,age,score,active\nAlice,not_a_number,95.5,true\n",
        0.0,
        "validation_error",
    ),
    text_case("csv nullable empty value", NULLABLE_PEOPLE, "csv", "name,age\nAlice,\nBob,25\n", 1.0),
]

SERVERS: dict[str, dict[str, Any]] = {"default": {}, "no_xml_coercion": {"xml_coerce_types": False}}
