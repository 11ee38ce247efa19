"""A response's tools are the SDK's typed tools, as in NeMo Gym (whose response is the SDK's)."""

from __future__ import annotations

from openai.types.responses import FunctionTool

from nemo_gym.models.openai_types import NeMoGymResponse


def _response(tools: list) -> NeMoGymResponse:
    return NeMoGymResponse(
        id="r", created_at=1, model="m", object="response", output=[],
        parallel_tool_calls=False, tool_choice="auto", tools=tools,
    )  # fmt: skip


def test_a_function_tool_given_as_a_dict_is_a_function_tool() -> None:
    response = _response([{"type": "function", "name": "f", "parameters": {}, "async": True}])
    assert isinstance(response.tools[0], FunctionTool)
    assert response.tools[0].async_ is True


def test_a_response_rebuilt_from_its_dump_equals_the_original() -> None:
    """NeMo Gym 0.4.0's single_step_tool_use_with_argument_comparison: verify answers
    ``**body.model_dump()`` and its test compares the response with the one it sent."""
    response = _response([FunctionTool(name="f", parameters={"type": "object"}, type="function")])
    assert NeMoGymResponse(**response.model_dump()) == response
    assert NeMoGymResponse.model_validate_json(response.model_dump_json()) == response


def test_a_tool_the_sdk_does_not_know_is_kept_as_given() -> None:
    chat_style = {"type": "function", "function": {"name": "f", "parameters": {}}}
    unknown = {"type": "a_tool_of_tomorrow", "x": 1}
    assert _response([chat_style, unknown]).tools == [chat_style, unknown]


def test_a_tool_given_as_a_dict_dumps_as_it_was_given() -> None:
    """0.7.0's vllm_model compares a response's dump with the tools it sent: typing a tool must
    not add ``strict: null`` / ``description: null`` to it."""
    given = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    response = _response([dict(given)])
    assert response.model_dump()["tools"] == [given]
    assert response.model_dump(mode="json")["tools"] == [given]
    with_async = {"type": "function", "name": "g", "parameters": {}, "async": True}
    assert _response([dict(with_async)]).model_dump(mode="json", by_alias=True)["tools"] == [with_async]
