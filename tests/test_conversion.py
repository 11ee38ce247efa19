"""Tests for nemo_gym.models.conversion: Responses API <-> Chat Completions on plain dicts."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses import Response
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import TypeAdapter

from nemo_gym.models.conversion import (
    TOKEN_ID_FIELDS,
    chat_completion_to_response,
    chat_request_to_responses_params,
    response_output_to_input_items,
    response_to_chat_completion,
    responses_to_chat_request,
    split_think_tags,
)
from nemo_gym.testing import compat_root

COMPAT_DIR = compat_root()

CHAT_REQUEST = TypeAdapter(CompletionCreateParamsNonStreaming)
RESPONSES_PARAMS = TypeAdapter(ResponseCreateParamsNonStreaming)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
CALL_TOKENS = {
    "prompt_token_ids": [1, 2, 3],
    "generation_token_ids": [7, 8, 9],
    "generation_log_probs": [-0.1, -0.2, -0.3],
}
FINAL_TOKENS = {
    "prompt_token_ids": [1, 2, 3, 7, 8, 9, 4, 5],
    "generation_token_ids": [11, 12],
    "generation_log_probs": [-0.5, -0.6],
}


def conversation_params() -> dict[str, Any]:
    """System + user + reasoning + two parallel calls + outputs + reasoning + final answer, as an agent sends it."""
    return {
        "model": "policy",
        "instructions": "Answer in one line.",
        "input": [
            {"role": "system", "content": "You are a weather assistant."},  # NeMo Gym rows omit `type`
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather in Paris "},
                    {"type": "input_text", "text": "and Rome?"},
                ],
            },
            {
                "id": "rs_1",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "Two cities: two calls."}],
            },
            {
                "id": "fc_1",
                "type": "function_call",
                "call_id": "call_paris",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
                "status": "completed",
            },
            {
                "id": "fc_2",
                "type": "function_call",
                "call_id": "call_rome",
                "name": "get_weather",
                "arguments": '{"city": "Rome"}',
                "status": "completed",
                **CALL_TOKENS,
            },
            {"type": "function_call_output", "call_id": "call_paris", "output": '{"temp_c": 20}'},
            {"type": "function_call_output", "call_id": "call_rome", "output": '{"temp_c": 25}'},
            {"id": "rs_2", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Both known."}]},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Paris 20C, Rome 25C.", "annotations": []}],
                **FINAL_TOKENS,
            },
        ],
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "max_output_tokens": 512,
        "metadata": {"task": "weather"},
    }


def essential(items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What must survive a conversion: kinds, roles, texts, call fields, token IDs (ids and statuses may change)."""
    out: list[tuple[Any, ...]] = []
    for item in items:
        kind = item.get("type") or "message"
        tokens = tuple(tuple(item[key]) for key in TOKEN_ID_FIELDS if item.get(key) is not None)
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else "".join(part["text"] for part in content)
            out.append((kind, item["role"], text, tokens))
        elif kind == "reasoning":
            texts = tuple(part["text"] for part in item.get("summary") or [])
            if texts or tokens:  # an empty (e.g. encrypted-only) reasoning item has nothing to convert
                out.append((kind, texts, tokens))
        elif kind == "function_call":
            out.append((kind, item["call_id"], item["name"], item["arguments"], tokens))
        else:
            out.append((kind, item["call_id"], item["output"]))
    return out


def deep_validate(value: Any) -> Any:
    """Walk a TypeAdapter result: pydantic validates `Iterable` fields lazily, as they are consumed."""
    if isinstance(value, dict):
        return {key: deep_validate(item) for key, item in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ValidatorIterator":
        return [deep_validate(item) for item in value]
    return value


def vllm_completion(content: str | None, **message_extra: Any) -> dict[str, Any]:
    """A chat completion as vLLM returns it with return_token_ids and logprobs."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "Qwen/Qwen3-0.6B",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message_extra},
                "finish_reason": "tool_calls" if message_extra.get("tool_calls") else "stop",
                "token_ids": [7, 8, 9],
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in [(7, -0.1), (8, -0.2), (9, -0.3)]
                    ]
                },
            }
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 3,
            "total_tokens": 6,
            "prompt_tokens_details": {"cached_tokens": 2},
            "completion_tokens_details": {"reasoning_tokens": 1},
        },
    }


TWO_CALLS = [
    {
        "id": "call_paris",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    },
    {
        "id": "call_rome",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
    },
]


# ---------------------------------------------------------------------------------------------
# Responses create-params -> Chat Completions request
# ---------------------------------------------------------------------------------------------


def test_conversation_becomes_chat_messages_with_think_tags() -> None:
    request = responses_to_chat_request(conversation_params())

    assert request["messages"] == [
        {"role": "system", "content": "Answer in one line."},
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "<think>Two cities: two calls.</think>",
            "tool_calls": TWO_CALLS,
            **CALL_TOKENS,
        },
        {"role": "tool", "tool_call_id": "call_paris", "content": '{"temp_c": 20}'},
        {"role": "tool", "tool_call_id": "call_rome", "content": '{"temp_c": 25}'},
        {"role": "assistant", "content": "<think>Both known.</think>Paris 20C, Rome 25C.", **FINAL_TOKENS},
    ]
    assert request["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER_TOOL["description"],
                "parameters": WEATHER_TOOL["parameters"],
            },
        }
    ]
    assert request["max_tokens"] == 512
    assert (request["model"], request["temperature"], request["top_p"]) == ("policy", 0.6, 0.95)
    assert (request["tool_choice"], request["parallel_tool_calls"]) == ("auto", True)
    assert "metadata" not in request and "max_output_tokens" not in request
    deep_validate(CHAT_REQUEST.validate_python(request))


def test_reasoning_goes_to_reasoning_content_without_think_tags() -> None:
    request = responses_to_chat_request(conversation_params(), think_tags=False)

    first_call, final = request["messages"][3], request["messages"][6]
    assert first_call["content"] is None
    assert first_call["reasoning_content"] == "Two cities: two calls."
    assert first_call["tool_calls"] == TWO_CALLS
    assert final["content"] == "Paris 20C, Rome 25C."
    assert final["reasoning_content"] == "Both known."


def test_string_input_becomes_one_user_message() -> None:
    request = responses_to_chat_request({"input": "What is 2+2?", "model": "m"})

    assert request == {"messages": [{"role": "user", "content": "What is 2+2?"}], "model": "m"}


def test_items_without_token_ids_split_into_calls_by_item_order() -> None:
    # Two model calls back to back with no tool output between: the second reasoning starts a new call.
    params = {
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "a"}]},
            {"type": "message", "role": "assistant", "content": "first"},
            {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "content": "second"},
        ]
    }

    messages = responses_to_chat_request(params)["messages"]

    assert [m["content"] for m in messages] == ["hi", "<think>a</think>first", "<think>b</think>second"]


def test_reasoning_content_parts_are_used_when_present() -> None:
    item = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "short"}],
        "content": [{"type": "reasoning_text", "text": "the full chain"}],
    }

    messages = responses_to_chat_request({"input": [item]})["messages"]

    assert messages == [{"role": "assistant", "content": "<think>the full chain</think>"}]


def test_tool_choice_function_and_structured_output_map_to_chat() -> None:
    params = {
        "input": "x",
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {
            "format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}
        },
        "reasoning": {"effort": "low"},
    }

    request = responses_to_chat_request(params)

    assert request["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert request["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
    }
    assert request["reasoning_effort"] == "low"
    back = chat_request_to_responses_params(request)
    assert back["tool_choice"] == params["tool_choice"]
    assert back["text"] == params["text"]
    assert back["reasoning"] == {"effort": "low"}


def test_tool_choice_without_tools_is_dropped_or_passed_on() -> None:
    """``auto``/``none`` without tools say nothing and are dropped; a choice that needs a tool is
    passed on for the model server's edge (or its engine) to refuse: the conversion is NeMo Gym's
    ``ResponsesConverter`` too, and 0.4.0's inference_provider test posts ``required`` with no
    tools to a faked engine and expects the answer to echo it."""
    request = responses_to_chat_request(
        {"input": "x", "tools": [], "tool_choice": "auto", "parallel_tool_calls": True}
    )
    assert "tool_choice" not in request and "parallel_tool_calls" not in request
    assert responses_to_chat_request({"input": "x", "tool_choice": "required"})["tool_choice"] == "required"
    forced = responses_to_chat_request({"input": "x", "tool_choice": {"type": "function", "name": "f"}})
    assert forced["tool_choice"] == {"type": "function", "function": {"name": "f"}} and "tools" not in forced


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"type": "web_search_call", "id": "ws_1"}, "input item 1 has unsupported type 'web_search_call'"),
        ({"content": "no role, no type"}, "input item 1 has unsupported type None"),
        ({"role": "robot", "content": "x"}, "input item 1 has unsupported role 'robot'"),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
            "input item 1 has a content part of type 'input_audio'",
        ),
        (
            {
                "type": "function_call",
                "call_id": "c",
                "name": "f",
                "arguments": "{}",
                "prompt_token_ids": [1],
            },
            r"input item 1 carries \['prompt_token_ids'\] but not",
        ),
    ],
)
def test_bad_input_items_raise_naming_the_item(item: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        responses_to_chat_request({"input": [{"role": "user", "content": "hi"}, item]})


def test_bad_params_raise() -> None:
    with pytest.raises(ValueError, match="no 'input'"):
        responses_to_chat_request({"model": "m"})
    with pytest.raises(ValueError, match=r"tools\[0\] has type 'web_search'"):
        responses_to_chat_request({"input": "x", "tools": [{"type": "web_search"}]})


# ---------------------------------------------------------------------------------------------
# Chat completion -> Response
# ---------------------------------------------------------------------------------------------


def test_completion_with_think_tags_and_parallel_calls_becomes_response() -> None:
    params = conversation_params()
    completion = vllm_completion("<think>Two cities: two calls.</think>", tool_calls=TWO_CALLS)

    response = chat_completion_to_response(completion, request_params=params)

    Response.model_validate(response)
    assert response["id"].startswith("resp_")
    assert (response["object"], response["status"], response["incomplete_details"]) == (
        "response",
        "completed",
        None,
    )
    assert response["model"] == "Qwen/Qwen3-0.6B"
    assert response["created_at"] == 1_700_000_000.0
    output = response["output"]
    assert [item["type"] for item in output] == ["reasoning", "function_call", "function_call"]
    assert output[0]["summary"] == [{"type": "summary_text", "text": "Two cities: two calls."}]
    assert [(i["call_id"], i["name"], i["arguments"], i["status"]) for i in output[1:]] == [
        ("call_paris", "get_weather", '{"city": "Paris"}', "completed"),
        ("call_rome", "get_weather", '{"city": "Rome"}', "completed"),
    ]
    assert all(item["id"].startswith("fc_") for item in output[1:])
    # Token IDs on the last output item only, all three of them.
    assert {key: output[-1][key] for key in TOKEN_ID_FIELDS} == CALL_TOKENS
    assert not any(key in item for item in output[:-1] for key in TOKEN_ID_FIELDS)
    # Echoed request fields.
    assert response["tools"] == [WEATHER_TOOL]
    assert (response["tool_choice"], response["parallel_tool_calls"]) == ("auto", True)
    assert (response["temperature"], response["top_p"], response["max_output_tokens"]) == (0.6, 0.95, 512)
    assert response["metadata"] == {"task": "weather"}


def test_usage_is_mapped() -> None:
    response = chat_completion_to_response(vllm_completion("hi"), request_params={"input": "x"})

    assert response["usage"] == {
        "input_tokens": 3,
        "output_tokens": 3,
        "total_tokens": 6,
        "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 1},
    }
    assert response_to_chat_completion(response)["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 3,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }


def test_reasoning_content_field_becomes_reasoning_item() -> None:
    completion = vllm_completion("It is 20C.", reasoning_content="Look it up.")

    response = chat_completion_to_response(completion, request_params={"input": "x"}, think_tags=False)

    Response.model_validate(response)
    reasoning, message = response["output"]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Look it up."}]
    assert message["role"] == "assistant"
    assert message["content"] == [{"type": "output_text", "text": "It is 20C.", "annotations": []}]
    assert message["prompt_token_ids"] == [1, 2, 3]


def test_think_tags_are_left_alone_when_disabled() -> None:
    response = chat_completion_to_response(
        vllm_completion("<think>x</think>y"), request_params={}, think_tags=False
    )

    assert [item["type"] for item in response["output"]] == ["message"]
    assert response["output"][0]["content"][0]["text"] == "<think>x</think>y"


def test_length_finish_is_incomplete() -> None:
    completion = vllm_completion("<think>still thinking")
    completion["choices"][0]["finish_reason"] = "length"

    response = chat_completion_to_response(completion, request_params={"max_output_tokens": 3})

    Response.model_validate(response)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    # A thought cut off mid-way is reasoning, not an answer a verifier could parse.
    assert [item["type"] for item in response["output"]] == ["reasoning"]
    assert response["output"][0]["summary"][0]["text"] == "still thinking"
    assert response["output"][0]["generation_token_ids"] == [7, 8, 9]
    assert response_to_chat_completion(response)["choices"][0]["finish_reason"] == "length"


def test_empty_completion_still_has_an_item_for_the_token_ids() -> None:
    response = chat_completion_to_response(vllm_completion(None), request_params={})

    assert response["output"][0]["content"][0]["text"] == ""
    assert response["output"][0]["generation_log_probs"] == [-0.1, -0.2, -0.3]
    # Defaults the Response type requires.
    assert (response["tools"], response["tool_choice"], response["parallel_tool_calls"]) == ([], "auto", True)
    Response.model_validate(response)


def test_completion_without_token_ids_has_no_token_fields() -> None:
    completion = vllm_completion("plain")
    del completion["prompt_token_ids"], completion["choices"][0]["token_ids"]

    response = chat_completion_to_response(completion, request_params={})

    assert not any(key in item for item in response["output"] for key in TOKEN_ID_FIELDS)


def test_inconsistent_token_ids_raise() -> None:
    no_prompt = vllm_completion("x")
    del no_prompt["prompt_token_ids"]
    with pytest.raises(ValueError, match="only one of prompt_token_ids"):
        chat_completion_to_response(no_prompt, request_params={})
    no_logprobs = vllm_completion("x")
    no_logprobs["choices"][0]["logprobs"] = None
    with pytest.raises(ValueError, match="no choices\\[0\\].logprobs"):
        chat_completion_to_response(no_logprobs, request_params={})
    short = vllm_completion("x")
    short["choices"][0]["logprobs"]["content"].pop()
    with pytest.raises(ValueError, match="3 generated token IDs but 2 logprobs"):
        chat_completion_to_response(short, request_params={})
    with pytest.raises(ValueError, match="no choices"):
        chat_completion_to_response({"choices": []}, request_params={})


@pytest.mark.parametrize(
    ("content", "reasoning", "rest"),
    [
        ("plain answer", [], "plain answer"),
        ("<think>\nabc\n</think>\n\nanswer", ["\nabc\n"], "\n\nanswer"),
        ("opened by the template</think>answer", ["opened by the template"], "answer"),
        ("<think>a</think>mid<think>b</think>end", ["a", "b"], "midend"),
        ("<think>cut off", ["cut off"], ""),
        ("<think></think>x", [""], "x"),
    ],
)
def test_split_think_tags(content: str, reasoning: list[str], rest: str) -> None:
    assert split_think_tags(content) == (reasoning, rest)


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("think_tags", [True, False])
def test_responses_params_round_trip_through_chat(think_tags: bool) -> None:
    params = conversation_params()

    chat = responses_to_chat_request(params, think_tags=think_tags)
    back = chat_request_to_responses_params(chat, think_tags=think_tags)

    deep_validate(RESPONSES_PARAMS.validate_python(back))
    instructions = [("message", "system", "Answer in one line.", ())]
    assert essential(back["input"]) == instructions + essential(params["input"])
    assert back["tools"] == [WEATHER_TOOL]
    for key in ("model", "temperature", "top_p", "max_output_tokens", "tool_choice", "parallel_tool_calls"):
        assert back[key] == params[key]


@pytest.mark.parametrize("think_tags", [True, False])
def test_response_round_trip_through_chat_completion(think_tags: bool) -> None:
    params = conversation_params()
    reasoning = {"reasoning_content": "Two cities: two calls."} if not think_tags else {}
    content = None if reasoning else "<think>Two cities: two calls.</think>"
    response = chat_completion_to_response(
        vllm_completion(content, tool_calls=TWO_CALLS, **reasoning),
        request_params=params,
        think_tags=think_tags,
    )

    completion = response_to_chat_completion(response, think_tags=think_tags)
    ChatCompletion.model_validate(completion)
    again = chat_completion_to_response(completion, request_params=params, think_tags=think_tags)

    Response.model_validate(again)
    assert essential(again["output"]) == essential(response["output"])
    assert completion["prompt_token_ids"] == [1, 2, 3]
    assert completion["choices"][0]["token_ids"] == [7, 8, 9]
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert [e["logprob"] for e in completion["choices"][0]["logprobs"]["content"]] == [-0.1, -0.2, -0.3]
    assert (again["status"], again["model"], again["usage"]) == (
        response["status"],
        response["model"],
        response["usage"],
    )


def test_agent_loop_moves_token_ids_onto_the_assistant_message_and_back() -> None:
    params: dict[str, Any] = {
        "input": [{"role": "user", "content": "Weather in Paris and Rome?"}],
        "tools": [WEATHER_TOOL],
    }
    first = chat_completion_to_response(
        vllm_completion("<think>Two cities: two calls.</think>", tool_calls=TWO_CALLS), request_params=params
    )

    next_input = (
        params["input"]
        + response_output_to_input_items(first["output"])
        + [
            {"type": "function_call_output", "call_id": "call_paris", "output": "20"},
            {"type": "function_call_output", "call_id": "call_rome", "output": "25"},
        ]
    )
    RESPONSES_PARAMS.validate_python({"input": next_input, "model": "m"})
    messages = responses_to_chat_request({**params, "input": next_input})["messages"]

    assistant = messages[1]
    assert assistant["role"] == "assistant" and assistant["tool_calls"] == TWO_CALLS
    assert {key: assistant[key] for key in TOKEN_ID_FIELDS} == CALL_TOKENS
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    # The engine splices from the message; a server speaking Responses natively gets them back on the last item.
    items = chat_request_to_responses_params({"messages": messages})["input"]
    call_items = [item for item in items if item["type"] in ("reasoning", "function_call")]
    assert [bool(set(TOKEN_ID_FIELDS) & item.keys()) for item in call_items] == [False, False, True]
    assert {key: call_items[-1][key] for key in TOKEN_ID_FIELDS} == CALL_TOKENS


def test_response_output_to_input_items_drops_nulls_and_keeps_token_ids() -> None:
    output: list[dict[str, Any]] = [
        {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": None},
        {"type": "function_call_output", "call_id": "c", "output": "1", "id": None, "status": None},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": None}],
            **FINAL_TOKENS,
        },
    ]
    original = copy.deepcopy(output)

    items = response_output_to_input_items(output)

    assert output == original  # inputs are not mutated
    assert items[0] == {"id": "rs_1", "type": "reasoning", "summary": []}
    assert items[1] == {"type": "function_call_output", "call_id": "c", "output": "1"}
    assert items[2]["content"] == [{"type": "output_text", "text": "ok", "annotations": []}]
    assert {key: items[2][key] for key in TOKEN_ID_FIELDS} == FINAL_TOKENS
    RESPONSES_PARAMS.validate_python({"input": items, "model": "m"})
    with pytest.raises(ValueError, match="output item 0 has unsupported type 'image_generation_call'"):
        response_output_to_input_items([{"type": "image_generation_call"}])


def test_response_to_chat_completion_refuses_what_a_completion_cannot_hold() -> None:
    response = {"output": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}
    with pytest.raises(ValueError, match="output item 0 is a function_call_output item"):
        response_to_chat_completion(response)
    two_calls = {"output": [{"type": "message", "role": "assistant", "content": "a", **CALL_TOKENS}] * 2}
    with pytest.raises(ValueError, match="output item 1 carries a second model call's token IDs"):
        response_to_chat_completion(two_calls)


def test_chat_request_with_bad_role_raises() -> None:
    with pytest.raises(ValueError, match="message 0 has unsupported role 'function'"):
        chat_request_to_responses_params({"messages": [{"role": "function", "name": "f", "content": "x"}]})


# ---------------------------------------------------------------------------------------------
# NeMo Gym's recorded rollouts
# ---------------------------------------------------------------------------------------------


def recorded_rows() -> list[tuple[str, dict[str, Any]]]:
    if not COMPAT_DIR.is_dir():
        return []
    rows = []
    for path in sorted(COMPAT_DIR.glob("*/example_rollouts.jsonl")):
        for number, line in enumerate(path.read_text().splitlines()):
            rows.append((f"{path.parent.name}-{number}", json.loads(line)))
    return rows


RECORDED = recorded_rows()


@pytest.mark.skipif(not RECORDED, reason=f"compatibility corpus not found at {COMPAT_DIR}")
def test_recorded_corpus_covers_tools_and_reasoning() -> None:
    kinds = {item["type"] for _, row in RECORDED for item in row["response"]["output"]}
    assert {"reasoning", "message", "function_call", "function_call_output"} <= kinds


@pytest.mark.parametrize(("name", "row"), RECORDED, ids=[name for name, _ in RECORDED])
def test_recorded_response_survives_chat_completion_round_trip(name: str, row: dict[str, Any]) -> None:
    recorded = row["response"]
    params = row["responses_create_params"]
    # A chat completion holds one model turn: convert each run of model items between tool outputs.
    segments: list[list[dict[str, Any]]] = [[]]
    for item in recorded["output"]:
        if item["type"] == "function_call_output":
            segments.append([])
        else:
            segments[-1].append(item)

    for segment in filter(None, segments):
        completion = response_to_chat_completion({**recorded, "output": segment})
        ChatCompletion.model_validate(completion)
        again = chat_completion_to_response(completion, request_params=params)
        Response.model_validate(again)
        expected = [e for e in essential(segment) if not (e[0] == "message" and e[2] == "")]
        assert essential(again["output"]) == expected
        assert again["model"] == recorded["model"]
        assert again["tools"] == (params.get("tools") or [])
        if recorded["usage"]:
            usage = again["usage"]
            for key in ("input_tokens", "output_tokens", "total_tokens", "output_tokens_details"):
                assert usage[key] == recorded["usage"][key]
            assert (
                usage["input_tokens_details"]["cached_tokens"]
                == recorded["usage"]["input_tokens_details"]["cached_tokens"]
            )
        if recorded["status"]:
            assert again["status"] == recorded["status"]


@pytest.mark.parametrize(("name", "row"), RECORDED, ids=[name for name, _ in RECORDED])
def test_recorded_trajectory_survives_chat_request_round_trip(name: str, row: dict[str, Any]) -> None:
    params = row["responses_create_params"]
    trajectory = params["input"] + response_output_to_input_items(row["response"]["output"])

    chat = responses_to_chat_request({**params, "input": trajectory})
    deep_validate(CHAT_REQUEST.validate_python({**chat, "model": "m"}))
    back = chat_request_to_responses_params(chat)

    assert essential(back["input"]) == essential(trajectory)
    roles = [m["role"] for m in chat["messages"]]
    assert roles.count("tool") == sum(item.get("type") == "function_call_output" for item in trajectory)
    assert roles[-1] == "assistant"
