"""NeMo Gym's converter modules at their NeMo Gym paths: nemo_gym.responses_converter,
nemo_gym.chat_streaming and nemo_gym.responses_streaming, as NeMo Gym's model adapters and
agents call them (typed objects in, typed objects out)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from nemo_gym.chat_streaming import sanitize_streaming_chat_body, synthesize_chat_completion_sse
from nemo_gym.models.chat_stream import ChatCompletionAccumulator
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseReasoningItem,
)
from nemo_gym.response_items import ENVELOPE_DEFAULTS
from nemo_gym.responses_converter import (
    ResponsesConverter,
    VLLMConverter,
    _usage_detail,
    split_responses_input_output_items,
)
from nemo_gym.responses_streaming import (
    restore_namespace_tool_calls,
    sanitize_streaming_responses_body,
    synthesize_responses_failure_sse,
    synthesize_responses_sse,
    validate_streaming_responses_params,
)

TOKENS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.5, -0.25]}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}
IMAGE = "data:image/png;base64,iVBORw0KGgo="


def conversation() -> list[dict[str, Any]]:
    """A two-call trajectory: system, a user turn with an image, reasoning + a tool call, its output."""
    return [
        {"role": "developer", "content": "Use metric units."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather where this photo was taken?"},
                {"type": "input_image", "image_url": IMAGE, "detail": "low"},
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Looks like Paris."}],
        },
        {
            "type": "function_call",
            "id": "call_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            **TOKENS,
        },
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp_c": 21}'},
    ]


def completion(message: dict[str, Any], finish_reason: str = "stop", **extra: Any) -> NeMoGymChatCompletion:
    return NeMoGymChatCompletion.model_validate(
        {
            "id": "chatcmpl-7",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "engine-model",
            "choices": [
                {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}
            ],
            **extra,
        }
    )


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    # NeMo Gym's adapters' tests fix ids this way: the module's uuid4 is looked up per id.
    monkeypatch.setattr("nemo_gym.responses_converter.uuid4", lambda: SimpleNamespace(hex="123"))


# ---- Responses -> Chat Completions -----------------------------------------------------------


def test_request_becomes_chat_messages_with_reasoning_tool_call_image_and_token_ids() -> None:
    params = NeMoGymResponseCreateParamsNonStreaming(
        instructions="You are a weather bot.",
        input=conversation(),
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        model="policy",
        max_output_tokens=64,
        temperature=0.3,
        reasoning={"effort": "low"},
        metadata={"run": "7"},
        seed=11,  # a field the conversion does not name passes through
    )

    chat = ResponsesConverter(return_token_id_information=True).responses_to_chat_completion_create_params(
        params
    )

    assert isinstance(chat, NeMoGymChatCompletionCreateParamsNonStreaming)
    system, user, assistant, tool = chat.messages
    # instructions and the leading developer message fold into one system message
    assert system == {"role": "system", "content": "You are a weather bot.\n\nUse metric units."}
    assert user["content"] == [
        {"type": "text", "text": "Weather where this photo was taken?"},
        {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}},
    ]
    assert assistant["content"] == "<think>Looks like Paris.</think>"
    assert assistant["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert {key: assistant[key] for key in TOKENS} == TOKENS
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}
    dumped = chat.model_dump(exclude_none=True)
    assert dumped["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city.",
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        }
    ]
    assert dumped["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert (dumped["max_tokens"], dumped["temperature"], dumped["reasoning_effort"]) == (64, 0.3, "low")
    assert (dumped["metadata"], dumped["seed"], dumped["model"]) == ({"run": "7"}, 11, "policy")


def test_token_ids_stay_behind_unless_asked_for() -> None:
    params = NeMoGymResponseCreateParamsNonStreaming(input=conversation(), tools=[WEATHER])
    chat = ResponsesConverter(return_token_id_information=False).responses_to_chat_completion_create_params(
        params
    )
    assistant = next(m for m in chat.messages if m["role"] == "assistant")
    assert not set(TOKENS) & set(assistant)


def test_chat_shaped_history_converts_and_omits_empty_tool_calls() -> None:
    params = {
        "input": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "calling", "tool_calls": [{"id": "c9", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c9", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [WEATHER],
    }  # fmt: skip
    chat = VLLMConverter(return_token_id_information=False).responses_to_chat_completion_create_params(params)

    assert [m["role"] for m in chat.messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert chat.messages[1]["tool_calls"][0]["id"] == chat.messages[2]["tool_call_id"] == "c9"
    assert "tool_calls" not in chat.messages[3]  # OpenAI rejects `tool_calls: []`


def test_custom_tools_and_allowed_tools_convert_both_ways() -> None:
    custom = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Apply a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
    }
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "custom", "name": "apply_patch"}],
    }
    converter = ResponsesConverter(return_token_id_information=False)
    chat = converter.responses_to_chat_completion_create_params(
        {"input": "x", "tools": [custom], "tool_choice": choice}
    )

    assert chat.tools == [
        {
            "type": "custom",
            "custom": {
                "name": "apply_patch",
                "description": "Apply a patch.",
                "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /.+/"}},
            },
        }
    ]
    assert chat.tool_choice == {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "custom", "custom": {"name": "apply_patch"}}],
        },
    }
    back = converter.chat_completion_to_responses_create_params(chat)
    assert back.tools == [custom]
    assert back.tool_choice == choice


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "web_search"),
        ({"input": [{"type": "compaction", "encrypted_content": "..."}]}, "compaction"),
        ({"input": "x", "reasoning": {"summary": "auto"}}, "summary"),
        ({"input": "x", "context_management": []}, "context_management"),
        (
            {
                "input": [
                    {
                        "type": "function_call",
                        "call_id": "c",
                        "name": "ls",
                        "arguments": "{}",
                        "namespace": "fs",
                    }
                ]
            },
            "namespace",
        ),
        (
            {
                "input": [
                    {"type": "message", "role": "assistant", "phase": "commentary", "content": "working"}
                ]
            },
            "phase",
        ),
    ],
)
def test_what_chat_cannot_express_is_refused_by_name(params: dict[str, Any], named: str) -> None:
    converter = ResponsesConverter(return_token_id_information=False)
    # NeMo Gym raises NotImplementedError; ours is also a ValueError (the caller's request: a 4xx)
    with pytest.raises(NotImplementedError, match=named):
        converter.responses_to_chat_completion_create_params(params)
    with pytest.raises(ValueError, match=named):
        converter.responses_to_chat_completion_create_params(params)


# ---- Chat Completions -> Responses -----------------------------------------------------------


@pytest.mark.usefixtures("fixed_ids")
def test_completion_becomes_response_with_reasoning_message_and_calls() -> None:
    params = NeMoGymResponseCreateParamsNonStreaming(
        input="Weather in Paris and Rome?",
        tools=[WEATHER],
        model="policy",
        temperature=0.2,
        metadata={"k": "v"},
    )
    calls = [
        {"id": f"call_{city}", "type": "function", "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}
        for city in ("Paris", "Rome")
    ]  # fmt: skip
    chat_completion = completion(
        {"content": "<think>Two cities.</think>Checking both.", "tool_calls": calls},
        finish_reason="tool_calls",
        usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 16},
    )

    response = ResponsesConverter(return_token_id_information=False).chat_completion_to_response(
        params, chat_completion
    )

    assert isinstance(response, NeMoGymResponse)
    reasoning, message, *function_calls = response.output
    assert isinstance(reasoning, NeMoGymResponseReasoningItem) and reasoning.id == "rs_123"
    assert reasoning.status is None  # OpenAI refuses a status on a replayed reasoning item
    assert [part.text for part in reasoning.summary] == ["Two cities."]
    assert isinstance(message, NeMoGymResponseOutputMessage) and message.id == "msg_123"
    assert message.content[0].text == "Checking both."
    assert all(isinstance(call, NeMoGymResponseFunctionToolCall) for call in function_calls)
    # NeMo Gym replays a call's item id as its call id
    assert [(call.id, call.call_id) for call in function_calls] == [("call_Paris",) * 2, ("call_Rome",) * 2]
    assert (response.id, response.model, response.status) == ("resp_123", "policy", "completed")
    assert (response.temperature, response.metadata, response.created_at) == (0.2, {"k": "v"}, 1700000000)
    assert response.usage is not None
    # the provider's total is kept; counts it did not report stay unknown, not 0
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (
        10,
        5,
        16,
    )
    assert response.usage.input_tokens_details.cached_tokens is None
    assert response.usage.output_tokens_details.reasoning_tokens is None


def test_length_finish_is_incomplete_and_envelope_id_can_be_kept() -> None:
    params = NeMoGymResponseCreateParamsNonStreaming(input="Count to a million.")
    chat_completion = completion({"content": "1, 2, 3"}, finish_reason="length")
    chat_completion.choices[0].native_finish_reason = "max_tokens"  # type: ignore[attr-defined]

    response = ResponsesConverter(return_token_id_information=False).chat_completion_to_response(
        params, chat_completion, preserve_envelope_id=True
    )

    assert response.status == "incomplete"
    assert (
        response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    )
    assert response.id == "chatcmpl-7"
    assert response.model_dump()["native_finish_reason"] == "max_tokens"


def test_token_ids_on_the_message_make_the_last_item_a_training_item() -> None:
    converter = ResponsesConverter(return_token_id_information=True)
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}], **TOKENS}  # fmt: skip

    (call,) = converter.postprocess_assistant_message_dict(message)

    assert isinstance(call, NeMoGymResponseFunctionToolCallForTraining)
    assert (call.prompt_token_ids, call.generation_token_ids) == (TOKENS["prompt_token_ids"], [3, 4])
    with pytest.raises(ValueError, match="generation_log_probs"):
        converter.postprocess_assistant_message_dict({"role": "assistant", "content": "x", "prompt_token_ids": [1],
                                                      "generation_token_ids": [2]})  # fmt: skip


def test_refusal_and_empty_answers_keep_a_message() -> None:
    converter = ResponsesConverter(return_token_id_information=False, uses_reasoning_parser=False)
    (refused,) = converter.postprocess_assistant_message_dict(
        {"role": "assistant", "content": None, "refusal": "No."}
    )
    assert [part.type for part in refused.content] == ["refusal"] and refused.content[0].refusal == "No."
    (empty,) = converter.postprocess_assistant_message_dict({"role": "assistant", "content": ""})
    assert empty.content[0].text == ""
    # without a reasoning parser, <think> text is the answer's text
    (raw,) = converter.postprocess_assistant_message_dict(
        {"role": "assistant", "content": "<think>a</think>b"}
    )
    assert raw.content[0].text == "<think>a</think>b"


def test_think_tag_helpers() -> None:
    converter = ResponsesConverter(return_token_id_information=False)
    text = "First.<think>Thought 1.</think>Second.<think>Thought 2.</think>Final."
    assert converter._extract_reasoning_from_content(text) == (
        ["Thought 1.", "Thought 2."],
        "First.Second.Final.",
    )
    assert ResponsesConverter._parse_think_tags("plain") == ([], "plain")
    assert (
        ResponsesConverter._wrap_reasoning_in_think_tags(["a", "", "b"]) == "<think>a</think><think>b</think>"
    )


def test_chat_request_round_trips_through_responses() -> None:
    converter = ResponsesConverter(return_token_id_information=True)
    params = NeMoGymResponseCreateParamsNonStreaming(input=conversation(), tools=[WEATHER], model="m")
    chat = converter.responses_to_chat_completion_create_params(params)

    responses_params = converter.chat_completion_to_responses_create_params(chat)
    again = converter.responses_to_chat_completion_create_params(responses_params)

    assert again.messages == chat.messages
    items = responses_params.input
    assert [item.type for item in items] == [
        "message",
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert items[1].model_dump()["content"][1] == {"type": "input_image", "image_url": IMAGE, "detail": "low"}
    assert items[3].call_id == "call_1" and items[3].generation_token_ids == [3, 4]


def test_split_cuts_where_the_models_items_begin() -> None:
    items = NeMoGymResponseCreateParamsNonStreaming(input=conversation()).input
    prompt, generated = split_responses_input_output_items(items)
    assert [getattr(item, "type", None) for item in generated][:2] == ["reasoning", "function_call"]
    assert len(prompt) == 2
    assert split_responses_input_output_items([]) == ([], [])
    user_only = [
        {"role": "user", "content": "hi"},
        {"type": "function_call_output", "call_id": "c", "output": ""},
    ]
    assert split_responses_input_output_items(user_only) == (user_only, [])


def test_usage_detail_reads_nested_then_aliases_and_ignores_junk() -> None:
    usage = {"prompt_tokens_details": {"cached_tokens": None}, "cache_read_input_tokens": 7, "bad": -1}
    assert _usage_detail(usage, "prompt_tokens_details", "cached_tokens", "cache_read_input_tokens") == 7
    assert _usage_detail(SimpleNamespace(details=SimpleNamespace(n=3)), "details", "n") == 3
    assert _usage_detail(usage, "prompt_tokens_details", "cached_tokens", "bad") is None


# ---- streaming dialects ----------------------------------------------------------------------


def _data(lines: list[str]) -> list[Any]:
    return [json.loads(chunk.removeprefix("data: ")) for chunk in lines if chunk != "data: [DONE]\n\n"]


def test_chat_stream_chunks_add_up_to_the_completion() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
        "harness_bookkeeping": 1,
    }
    cleaned, include_usage = sanitize_streaming_chat_body(body)
    assert cleaned == {"model": "m", "messages": [{"role": "user", "content": "hi"}]} and include_usage
    assert body["stream"] is True  # the caller's body is left as it was

    answer = completion(
        {"content": "It is sunny in Paris today.", "reasoning_content": "Look it up.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        finish_reason="tool_calls",
        usage={"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12},
    ).model_dump(exclude_none=True)  # fmt: skip
    stream = list(synthesize_chat_completion_sse(answer, include_usage=True))

    assert stream[-1] == "data: [DONE]\n\n"
    chunks = _data(stream)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 12
    folded = ChatCompletionAccumulator()
    for chunk in chunks:
        folded.add(chunk)
    rebuilt = folded.completion()["choices"][0]
    assert rebuilt["finish_reason"] == "tool_calls"
    for key in ("content", "reasoning_content", "tool_calls"):
        assert rebuilt["message"][key] == answer["choices"][0]["message"][key]
    assert not any(chunk["choices"] == [] for chunk in _data(list(synthesize_chat_completion_sse(answer))))


def test_responses_stream_body_flattens_namespaces_and_events_restore_them() -> None:
    body = {
        "model": "m",
        "stream": True,
        "client_metadata": {"session": "s"},
        "instructions": "Be terse.",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "Repo at /w."}]},
            {"role": "user", "content": "list files"},
            {"type": "function_call", "namespace": "fs", "name": "ls", "call_id": "c0", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c0", "output": "a.py"},
            {"type": "additional_tools", "tools": [{"type": "function", "name": "grep"}, {"type": "custom", "name": "js"}]},
            {"type": "not_a_real_item"},
        ],
        "tools": [{"type": "namespace", "name": "fs", "tools": [{"type": "function", "name": "ls", "parameters": {}}]}],
    }  # fmt: skip

    cleaned, names = sanitize_streaming_responses_body(body)
    params = validate_streaming_responses_params(cleaned)

    assert names == {"fs__ls": ("fs", "ls")}
    assert params.instructions == "Be terse.\n\nRepo at /w."
    assert [tool["name"] for tool in params.tools or []] == ["fs__ls", "grep"]
    assert [getattr(item, "type", None) for item in params.input] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert params.input[1].name == "fs__ls"
    assert "client_metadata" not in cleaned and "stream" not in cleaned

    response = NeMoGymResponse.model_validate({
        **ENVELOPE_DEFAULTS,
        "id": "resp_1",
        "model": "m",
        "output": [{"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "fs__ls", "arguments": "{}",
                    "status": "completed"}],
    }).model_dump(mode="json")  # fmt: skip
    events = [
        (chunk.split("\n", 1)[0].removeprefix("event: "), json.loads(chunk.split("\ndata: ", 1)[1]))
        for chunk in synthesize_responses_sse(response, names)
    ]
    assert [name for name, _ in events][0] == "response.created"
    assert [name for name, _ in events][-1] == "response.completed"
    assert all(name == event["type"] for name, event in events)
    assert [event["sequence_number"] for _, event in events] == list(range(len(events)))
    (done,) = [event["item"] for name, event in events if name == "response.output_item.done"]
    assert (done["namespace"], done["name"]) == ("fs", "ls")
    assert events[-1][1]["response"]["output"][0]["namespace"] == "fs"
    assert (
        restore_namespace_tool_calls([{"type": "function_call", "name": "other"}], names)[0]["name"]
        == "other"
    )


def test_failure_stream_ends_with_response_failed() -> None:
    chunks = list(synthesize_responses_failure_sse("engine died", code="upstream_error"))
    names = [chunk.split("\n", 1)[0] for chunk in chunks]
    assert names == ["event: response.created", "event: response.failed"]
    failed = json.loads(chunks[1].split("\ndata: ", 1)[1])["response"]
    assert failed["status"] == "failed" and failed["error"] == {
        "code": "upstream_error",
        "message": "engine died",
    }


def test_what_nemo_gym_agents_read_from_the_request_and_usage_types() -> None:
    from nemo_gym.openai_utils import NeMoGymResponseUsage

    body = NeMoGymResponseCreateParamsNonStreaming(input="x", store=False)
    assert (body.background, body.service_tier, body.store) == (None, None, False)
    assert "background" not in body.model_dump(exclude_unset=True)
    usages = [
        NeMoGymResponseUsage(input_tokens=5, output_tokens=2, total_tokens=7),
        NeMoGymResponseUsage.model_validate(
            {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
             "input_tokens_details": {"cached_tokens": None}, "output_tokens_details": {"reasoning_tokens": 1}}
        ),
    ]  # fmt: skip
    total = NeMoGymResponseUsage.sum_from_list(usages)
    assert (total.input_tokens, total.output_tokens, total.total_tokens) == (6, 3, 9)
    assert total.input_tokens_details.cached_tokens is None  # unknown in one: unknown in the sum
    assert total.output_tokens_details.reasoning_tokens == 1
    assert NeMoGymResponseUsage.sum_from_list([]).total_tokens == 0


def test_usage_dumps_carry_nemo_gym_keys_and_sum_cache_writes() -> None:
    """NeMo Gym's agents compare summed usage dumps with dicts of its openai version's keys: an
    unknown cache-write count is left out of the dump; a known one is kept and summed."""
    from nemo_gym.openai_utils import NeMoGymResponseUsage, accumulate_response_usage

    def usage(cached: int, writes: int | None = None) -> NeMoGymResponseUsage:
        details: dict[str, int] = {"cached_tokens": cached}
        if writes is not None:
            details["cache_write_tokens"] = writes
        return NeMoGymResponseUsage.model_validate(
            {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12,
             "input_tokens_details": details, "output_tokens_details": {"reasoning_tokens": 1}}
        )  # fmt: skip

    total = accumulate_response_usage(usage(3), usage(4))
    assert total is not None
    assert total.model_dump()["input_tokens_details"] == {"cached_tokens": 7}
    assert '"cache_write' not in total.model_dump_json()
    written = accumulate_response_usage(usage(3, 2), usage(4, 5))
    assert written is not None
    assert written.model_dump()["input_tokens_details"] == {"cached_tokens": 7, "cache_write_tokens": 7}
    assert (
        NeMoGymResponseUsage.sum_from_list([usage(1, 1), usage(1, 2)]).input_tokens_details.cache_write_tokens
        == 3
    )


def test_text_parts_stay_parts_and_part_models_validate() -> None:
    from nemo_gym.openai_utils import NeMoGymEasyInputMessage, NeMoGymResponseInputText

    converter = ResponsesConverter(return_token_id_information=False)
    chat = converter.responses_to_chat_completion_create_params({"input": "hello"})
    assert chat.messages == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    message = NeMoGymEasyInputMessage(
        role="user", content=[NeMoGymResponseInputText(text="a"), {"type": "input_text", "text": "b"}]
    )
    chat = converter.responses_to_chat_completion_create_params({"input": [message.model_dump()]})
    assert chat.messages[0]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    # a reasoning item's status is dropped (OpenAI refuses it on a replayed item)
    assert "status" not in NeMoGymResponseReasoningItem(id="rs", summary=[], status="completed").model_dump()


def test_openai_client_reads_the_synthesized_streams_over_loopback() -> None:
    """The official client, over a real socket, rebuilds both answers from our event streams."""
    from openai import OpenAI
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from nemo_gym.testing import running_app

    answer = completion(
        {"content": "<think>x</think>Sunny.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        finish_reason="tool_calls",
        usage={"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10},
    )  # fmt: skip
    params = NeMoGymResponseCreateParamsNonStreaming(input="weather?", tools=[WEATHER], model="m")
    response = ResponsesConverter(return_token_id_information=False).chat_completion_to_response(
        params, answer
    )

    async def responses(request: Any) -> StreamingResponse:
        return StreamingResponse(
            synthesize_responses_sse(response.model_dump(mode="json")), media_type="text/event-stream"
        )

    async def chat(request: Any) -> StreamingResponse:
        stream = synthesize_chat_completion_sse(
            answer.model_dump(mode="json", exclude_none=True), include_usage=True
        )
        return StreamingResponse(stream, media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"]),
                            Route("/v1/chat/completions", chat, methods=["POST"])])  # fmt: skip
    with running_app(app) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="local", timeout=10, max_retries=0)
        events = list(client.responses.create(model="m", input="weather?", stream=True))
        final = events[-1].response  # type: ignore[union-attr]
        assert events[-1].type == "response.completed"
        assert final.output_text == "Sunny." and final.output[-1].call_id == "c1"  # type: ignore[union-attr]
        chunks = list(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "w"}], stream=True
            )
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        assert text == "<think>x</think>Sunny."
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 10


def test_chat_types_as_nemo_gym_adapters_compare_them() -> None:
    from nemo_gym.openai_utils import NeMoGymChatCompletionMessageForTraining, NeMoGymChoice

    choice = NeMoGymChoice.model_validate(
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok", **TOKENS}}
    )
    assert isinstance(choice.message, NeMoGymChatCompletionMessageForTraining)
    plain = NeMoGymChoice.model_validate({"index": 0, "finish_reason": "stop", "message": {"content": "ok"}})
    assert not isinstance(plain.message, NeMoGymChatCompletionMessageForTraining)
    # an unset `async` is left out with or without aliases, so the wire and a plain dump agree
    call = NeMoGymResponseFunctionToolCall(call_id="c", name="f", arguments="{}")
    assert "async" not in call.model_dump(by_alias=True) and "async_" not in call.model_dump()
    params = NeMoGymChatCompletionCreateParamsNonStreaming(messages=[])
    assert params.model_dump()["parallel_tool_calls"] is True and params.model_dump()["audio"] is None
    assert params.model_dump(exclude_unset=True) == {"messages": []}


def test_a_chat_requests_provider_extensions_are_dumped_only_when_given() -> None:
    """NeMo Gym 0.6.0's vllm_model compares a converted request's whole dump with its release's
    keys (no ``chat_template_kwargs``, ``thinking``, ``output_config``); 0.7.0's excludes them
    from the same comparison: left out while unset, both hold. Given, they are kept."""
    params = NeMoGymChatCompletionCreateParamsNonStreaming(messages=[], thinking=None)
    for dumped in (params.model_dump(), params.model_dump(mode="json"), json.loads(params.model_dump_json())):
        assert not {"chat_template_kwargs", "thinking", "output_config"} & set(dumped)
        assert dumped["audio"] is None  # the other declared fields still dump as NeMo Gym's do
    given = NeMoGymChatCompletionCreateParamsNonStreaming(
        messages=[], chat_template_kwargs={"enable_thinking": False}, output_config={"effort": "low"}
    )
    assert given.model_dump()["chat_template_kwargs"] == {"enable_thinking": False}
    assert given.model_dump()["output_config"] == {"effort": "low"} and "thinking" not in given.model_dump()
    assert given.chat_template_kwargs == {"enable_thinking": False} and params.thinking is None


def test_chat_messages_to_items_keep_tool_parts_and_refuse_unknown_roles() -> None:
    converter = ResponsesConverter(return_token_id_information=False)
    (output,) = converter.chat_completions_messages_to_responses_items(
        [
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    assert output.model_dump()["output"] == [
        {"type": "input_text", "text": "a"},
        {"type": "input_text", "text": "b"},
    ]
    with pytest.raises(NotImplementedError, match="alien"):
        converter.chat_completions_messages_to_responses_items([{"role": "alien", "content": "x"}])
    with pytest.raises(NotImplementedError, match="Responses API through"):
        converter.responses_to_chat_completion_create_params(
            {"input": [{"type": "file_search_call", "id": "fs"}]}
        )


def test_item_dumps_carry_the_keys_of_nemo_gyms_openai_version() -> None:
    """aviary_agent's test compares a function call's dump with openai 2.44's keys: fields the
    installed openai added (``caller``, ``async``) are left out while unset, kept when set. Under
    an older openai (0.4.0's pin, ``openai<=2.7.2``), the keys that one has."""
    from openai.types.responses import ResponseFunctionToolCall, ResponseFunctionToolCallOutputItem

    from nemo_gym.openai_utils import NeMoGymResponseFunctionCallOutput, NeMoGymResponseFunctionToolCall

    def known(model: type) -> set[str]:
        return {field.alias or name for name, field in model.model_fields.items()}

    call = NeMoGymResponseFunctionToolCall(call_id="c1", name="tool_1", arguments="{}")
    keys_2_44 = {"arguments", "call_id", "name", "type", "id", "namespace", "status"}
    assert set(call.model_dump()) == keys_2_44 & known(ResponseFunctionToolCall)
    assert call.model_dump(by_alias=True) == call.model_dump()
    assert (
        NeMoGymResponseFunctionToolCall(call_id="c", name="t", arguments="{}", caller=None)
        .model_dump()
        .get("caller", "left out")
        == "left out"
    )
    output = NeMoGymResponseFunctionCallOutput(
        call_id="c1", output="x", id="o1", status="completed", type="function_call_output"
    )
    output_keys_2_44 = {"call_id", "created_by", "id", "output", "status", "type"}
    assert set(output.model_dump()) == output_keys_2_44 & known(ResponseFunctionToolCallOutputItem)
    named = output.model_copy(update={"name": "t"})
    assert named.model_dump()["name"] == "t"  # set: kept


def test_an_mcp_call_item_is_built_from_its_call_alone() -> None:
    """langchain_deepagents_agent builds ``NeMoGymResponseMcpCall(name=..., arguments=...)``."""
    from nemo_gym.openai_utils import NeMoGymResponseMcpCall

    assert NeMoGymResponseMcpCall(name="roll_dice", arguments="{}").type == "mcp_call"
