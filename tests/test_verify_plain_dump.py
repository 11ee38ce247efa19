"""A plain body's ``response`` is dumped and re-checked once per /verify, with the same answers.

``Answer(**body.model_dump(), ...)`` (NeMo Gym's verify idiom) hands the answer model the very
dict the request model checked: ``model_dump()`` gives the same keys, order and values as
pydantic's, the dict itself instead of a copy, and the answer's field check recognises it
unless the handler changed the list it walks. Real servers on 127.0.0.1 for the end-to-end
parts.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym.serving.request_context import PlainBodies, plain_bodies_in_effect
from nemo_gym.testing import running_server
from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer


def long_response(turns: int = 8) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    for i in range(turns):
        output.append(
            {"type": "function_call", "call_id": f"c{i}", "name": "get_weather", "arguments": '{"city": "x"}'}
        )
        output.append({"type": "function_call_output", "call_id": f"c{i}", "output": "cold " * 50})
    output.append(
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "done", "annotations": []}],
        }
    )
    return {"id": "resp_1", "output": output, "usage": {"input_tokens": 3}}


def row() -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "weather?"}]},
        "task": {"nested": [1, 2]},
        "response": long_response(),
        "_ng_rollout_id": "r-1",
    }


def test_bare_model_dump_is_pydantics_with_the_plain_dict_itself():
    token = plain_bodies_in_effect.set(PlainBodies())
    try:
        body = BaseVerifyRequest.model_validate(row())
        dumped = body.model_dump()
        full = BaseModel.model_dump(body)  # pydantic's own, a copy
        assert dumped == full and list(dumped) == list(full) == [
            "responses_create_params",
            "response",
            "task",
        ]
        assert dumped["response"] is body.response  # no copy of the long response
        assert dumped["responses_create_params"] is body.responses_create_params
        assert dumped["task"] == {"nested": [1, 2]}
        # Any argument: pydantic's own dump, copies and all.
        assert body.model_dump(exclude={"task"})["response"] is not body.response
        assert body.model_dump(mode="json") == full
    finally:
        plain_bodies_in_effect.reset(token)


def test_typed_bodies_dump_as_before():
    # Plain bodies off (NeMo Gym-style routes, direct calls): a typed model, dumped by pydantic.
    body = BaseVerifyRequest.model_validate(row())
    assert not isinstance(body.response, dict)
    dumped = body.model_dump()
    assert dumped == BaseModel.model_dump(body)
    assert isinstance(dumped["response"], dict) and dumped["response"]["output"][0]["name"] == "get_weather"


def test_answer_recheck_is_skipped_only_for_the_unchanged_dict():
    record = PlainBodies()
    token = plain_bodies_in_effect.set(record)
    try:
        body = BaseVerifyRequest.model_validate(row())
        answer = BaseVerifyResponse(**body.model_dump(), reward=1.0)
        assert answer.response is body.response
        # The walked list changed after the check: checked again, and the bad item named.
        body.response["output"].append(5)
        with pytest.raises(ValueError, match=r"response\.output\.17: must be an object, got int"):
            BaseVerifyResponse(**body.model_dump(), reward=1.0)
        # A dict equal to the checked one but not it: checked again as well.
        other = copy.deepcopy(body.response)
        other["output"][0] = "not an item"
        with pytest.raises(ValueError, match=r"response\.output\.0: must be an object"):
            BaseVerifyResponse(**{**body.model_dump(), "response": other}, reward=1.0)
    finally:
        plain_bodies_in_effect.reset(token)
    # Another request has its own record: nothing carries over.
    token = plain_bodies_in_effect.set(PlainBodies())
    try:
        with pytest.raises(ValueError, match=r"response\.output\.17"):
            BaseVerifyResponse(**{**row(), "response": body.response}, reward=1.0)
    finally:
        plain_bodies_in_effect.reset(token)


class MutatingVerify(ExampleSingleToolCallServer):
    """A verify that breaks the response it was given before answering with it."""

    async def verify(self, body: BaseVerifyRequest) -> Any:
        body.response["output"].append("oops")
        return BaseVerifyResponse(**body.model_dump(), reward=0.0)


def test_verify_answers_over_http_are_unchanged():
    response = long_response()
    sent = {**row(), "response": response}
    with running_server(ExampleSingleToolCallServer({"name": "weather"})) as url:
        answer = httpx.post(f"{url}/verify", json=sent).json()
        assert answer["response"] == response and answer["task"] == {"nested": [1, 2]}
        assert answer["reward"] == 1.0 and answer["called_tool"] and answer["answered"]
        assert list(answer)[:2] == ["responses_create_params", "response"]
        # A malformed response is still the caller's 422 naming the field.
        bad = copy.deepcopy(sent)
        bad["response"]["output"][3] = {"type": "message", "content": 7}
        refused = httpx.post(f"{url}/verify", json=bad)
        assert refused.status_code == 422 and "response.output.3.content" in refused.text
    with running_server(MutatingVerify({"name": "mutating"})) as url:
        broken = httpx.post(f"{url}/verify", json=sent)
        # The answer's own check still sees what the handler broke (never a 200 carrying it).
        assert broken.status_code >= 400 and "response.output.17" in broken.text, broken.text


def test_json_answer_bytes_are_pydantics():
    import datetime

    import orjson

    from nemo_gym.serving.error_answers import dumps

    token = plain_bodies_in_effect.set(PlainBodies())
    try:
        body = BaseVerifyRequest.model_validate(row())
        answer = BaseVerifyResponse(**body.model_dump(), reward=0.5, failure_reason="x")
        pydantics = orjson.dumps(answer.__pydantic_serializer__.to_python(answer, mode="json", by_alias=True))
        assert dumps(answer) == pydantics
        # Something that is not plain JSON in the dict: pydantic's form of it, as before.
        body.response["created"] = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
        body.response["ids"] = {1, 2}
        answer = BaseVerifyResponse(**body.model_dump(), reward=0.5)
        pydantics = orjson.dumps(answer.__pydantic_serializer__.to_python(answer, mode="json", by_alias=True))
        assert dumps(answer) == pydantics and b'"2026-01-02T00:00:00Z"' in pydantics
    finally:
        plain_bodies_in_effect.reset(token)


def test_a_model_with_its_own_serializers_dumps_its_own_way():
    from pydantic import field_serializer

    from nemo_gym.serving.error_answers import dumps

    class Trimmed(BaseVerifyResponse):
        @field_serializer("response")
        def _trim(self, value: Any) -> Any:
            return {"output": len(value["output"])}

    token = plain_bodies_in_effect.set(PlainBodies())
    try:
        body = BaseVerifyRequest.model_validate(row())
        answer = Trimmed(**body.model_dump(), reward=1.0)
        assert answer.model_dump()["response"] == {"output": 17}
        assert b'"response":{"output":17}' in dumps(answer)
    finally:
        plain_bodies_in_effect.reset(token)


def test_the_benchmarks_verify_body_scores_as_a_rollout_end():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "bench_request_cpu.py"
    spec = importlib.util.spec_from_file_location("_bench_request_cpu", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    body = bench.verify_body(4, bytes_per_turn=100)
    with running_server(ExampleSingleToolCallServer({"name": "weather"})) as url:
        answer = httpx.post(
            f"{url}/verify", content=body, headers={"content-type": "application/json"}
        ).json()
    assert answer["reward"] == 1.0 and len(answer["response"]["output"]) == 13


def test_answers_with_non_string_keys_or_numpy_are_still_written():
    from nemo_gym.serving.error_answers import dumps

    assert dumps({"a": [1, "x", None, 1.5]}) == b'{"a":[1,"x",null,1.5]}'
    assert dumps({1: "one", "b": {2: True}}) == b'{"1":"one","b":{"2":true}}'
    numpy = pytest.importorskip("numpy", reason="numpy answers need numpy installed")
    assert dumps({"x": numpy.float64(1.5), "ids": numpy.array([1, 2])}) == b'{"x":1.5,"ids":[1,2]}'
    with pytest.raises(TypeError):
        dumps({"x": object()})
