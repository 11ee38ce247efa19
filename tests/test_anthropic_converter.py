"""nemo_gym.anthropic_converter: Anthropic's Messages API ⇄ the Responses API, both directions."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from nemo_gym.anthropic_converter import SUPPORTED_ANTHROPIC_IMAGE_MEDIA_TYPES, AnthropicConverter
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.response_items import ENVELOPE_DEFAULTS

PNG = "iVBORw0KGgo="
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {"type": "object"},
}


def trajectory() -> list[dict[str, Any]]:
    return [
        {"role": "developer", "content": "Metric units."},
        {"role": "user", "content": [{"type": "input_text", "text": "Where is this?"},
                                     {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Paris."}],
         "encrypted_content": "sig"},
        {"type": "function_call", "call_id": "toolu_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "toolu_1", "output": "21 C"},
    ]  # fmt: skip


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("nemo_gym.anthropic_converter.uuid4", lambda: SimpleNamespace(hex="9"))


def test_responses_request_becomes_alternating_messages_turns() -> None:
    body = NeMoGymResponseCreateParamsNonStreaming(
        instructions="Be brief.", input=trajectory(), tools=[WEATHER], tool_choice="required", temperature=0.5
    )
    request = AnthropicConverter().responses_to_anthropic(
        body,
        model="claude-x",
        max_tokens=256,
        thinking=None,
        thinking_budget_tokens=1024,
        extra_body={"top_k": 5},
    )

    assert request["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Metric units."},
    ]
    user, assistant, tool_turn = request["messages"]
    assert user["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
    }
    # reasoning and the call it led to share one assistant turn
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Paris.", "signature": "sig"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    }
    assert tool_turn["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"}]
    assert request["tools"] == [
        {"name": "get_weather", "input_schema": {"type": "object"}, "description": "Weather."}
    ]
    assert request["tool_choice"] == {"type": "any"}
    assert (request["max_tokens"], request["temperature"], request["top_k"]) == (256, 0.5, 5)
    assert request["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_egress_refuses_what_anthropic_refuses() -> None:
    converter = AnthropicConverter()
    body = NeMoGymResponseCreateParamsNonStreaming(input="hi", temperature=0.2)
    with pytest.raises(ValueError, match="sampling"):
        converter.responses_to_anthropic(body, "claude-opus-4-7", 10, None, None, {})
    with pytest.raises(ValueError, match="one place"):
        converter.responses_to_anthropic(body, "claude-x", 10, {"type": "enabled"}, 100, {})
    remote = NeMoGymResponseCreateParamsNonStreaming(
        input=[{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]
    )
    with pytest.raises(ValueError, match="base64 data: URLs"):
        converter.responses_to_anthropic(remote, "claude-x", 10, None, None, {})
    assert "image/webp" in SUPPORTED_ANTHROPIC_IMAGE_MEDIA_TYPES


@pytest.mark.usefixtures("fixed_ids")
def test_anthropic_answer_becomes_response() -> None:
    body = NeMoGymResponseCreateParamsNonStreaming(input="weather?", tools=[WEATHER], metadata={"k": "v"})
    answer = {
        "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": "s1"},
            {"type": "text", "text": "Checking"},
            {"type": "text", "text": " now."},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
        ],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 12, "output_tokens": 30, "cache_read_input_tokens": 4},
    }

    response = AnthropicConverter().anthropic_to_responses(answer, body, model="claude-x")

    reasoning, message, call = response.output
    assert (reasoning.id, reasoning.encrypted_content, reasoning.summary[0].text) == (
        "rs_9",
        "s1",
        "Look it up.",
    )
    assert (message.id, message.content[0].text) == ("msg_9", "Checking now.")
    assert (call.call_id, json.loads(call.arguments)) == ("toolu_2", {"city": "Rome"})
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert (response.usage.total_tokens, response.usage.input_tokens_details.cached_tokens) == (42, 4)
    assert (response.id, response.model, response.metadata) == ("resp_9", "claude-x", {"k": "v"})


def test_client_request_round_trips_through_responses_and_back() -> None:
    converter = AnthropicConverter()
    body = NeMoGymResponseCreateParamsNonStreaming(
        instructions="Be brief.", input=trajectory()[1:], tools=[WEATHER]
    )
    messages_request = converter.responses_to_anthropic(body, "claude-x", 64, None, None, {})
    messages_request["tool_choice"] = {"type": "tool", "name": "get_weather"}

    params = converter.anthropic_request_to_responses(messages_request)

    assert params.instructions == "Be brief."
    assert (params.model, params.max_output_tokens) == ("claude-x", 64)
    assert params.tool_choice == {"type": "function", "name": "get_weather"}
    assert [getattr(item, "type", None) for item in params.input] == [
        "message", "reasoning", "function_call", "function_call_output",
    ]  # fmt: skip
    again = converter.responses_to_anthropic(params, "claude-x", 64, None, None, {})
    assert again["messages"] == messages_request["messages"]


def test_response_streams_as_messages_events() -> None:
    converter = AnthropicConverter()
    envelope = {k: v for k, v in ENVELOPE_DEFAULTS.items() if k not in ("id", "output")}
    response = NeMoGymResponse(
        **envelope,
        id="resp_7",
        output=[
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Hmm."}]},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Calling.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "toolu_3", "name": "get_weather", "arguments": "{}"},
        ],
        usage={"input_tokens": 5, "output_tokens": 7, "total_tokens": 12},
    )  # fmt: skip
    answer = converter.responses_to_anthropic_response(response, model="served")

    assert (answer["id"], answer["model"], answer["stop_reason"]) == ("resp_7", "served", "tool_use")
    assert [block["type"] for block in answer["content"]] == ["thinking", "text", "tool_use"]
    assert answer["usage"] == {"input_tokens": 5, "output_tokens": 7}

    events = [chunk.split("\n", 1) for chunk in converter.anthropic_response_to_sse(answer)]
    names = [head.removeprefix("event: ") for head, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    block = ["content_block_start", "content_block_delta", "content_block_stop"]
    # A thinking block's signature comes in a delta of its own, as Anthropic streams it.
    assert names[2:-2] == [*block[:2], "content_block_delta", block[2], *block, *block]
    data = [json.loads(body.removeprefix("data: ")) for _, body in events]
    assert data[0]["message"]["content"] == [] and data[0]["message"]["stop_reason"] is None
    assert data[0]["message"]["usage"] == {"input_tokens": 5, "output_tokens": 0}
    assert data[4]["delta"] == {"type": "signature_delta", "signature": ""}
    assert data[10]["delta"] == {"type": "input_json_delta", "partial_json": "{}"}
    assert data[-2]["delta"]["stop_reason"] == "tool_use" and data[-2]["usage"] == {"output_tokens": 7}
