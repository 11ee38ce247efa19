"""Every model server speaks OpenAI's dialect to the official ``openai`` client.

Streaming and not, on ``/v1/responses`` and ``/v1/chat/completions``; ``GET /v1/models``; errors
whose message the client shows; malformed requests answered 4xx. The servers run on loopback:
scripted_model, openai_model in front of a scripted_model (the fake OpenAI), local_hf_model
with a tiny locally built model, and vllm_model in front of that engine.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from nemo_gym.models.streaming import chat_completion_chunks, response_events, text_pieces
from nemo_gym.testing import SyncClient, running_server
from responses_api_models.local_hf_model.app import LocalHFModel
from responses_api_models.openai_model.app import OpenAIModel
from responses_api_models.scripted_model.app import ScriptedModel
from responses_api_models.vllm_model.app import VLLMModel

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
SCRIPTS = [
    {"match": "weather", "turns": [{"call_tool": "get_weather", "arguments": {"city": "Oslo"}}]},
    {"match": "hello", "turns": [{"text": "Hello to you too, said the scripted model: {last_user}"}]},
]
SERVERS = ("scripted", "openai", "local_hf", "vllm")


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    """Every model server, on loopback."""
    with contextlib.ExitStack() as stack:
        scripted = stack.enter_context(
            running_server(ScriptedModel({"name": "scripted", "scripts": SCRIPTS}))
        )
        upstream = stack.enter_context(
            running_server(ScriptedModel({"name": "fake_openai", "scripts": SCRIPTS}))
        )
        openai_url = stack.enter_context(
            running_server(
                OpenAIModel(
                    {
                        "name": "openai",
                        "openai_base_url": upstream + "/v1",
                        "openai_api_key": "sk-x",
                        "max_retries": 0,
                    }
                )
            )
        )
        engine = LocalHFModel(
            {"name": "local_hf", "tiny": True, "default_max_tokens": 12, "return_token_id_information": True}
        )
        local_hf = stack.enter_context(running_server(engine))
        vllm = stack.enter_context(
            running_server(
                VLLMModel(
                    {
                        "name": "vllm",
                        "base_url": local_hf + "/v1",
                        "model": "tiny-chatml",
                        "return_token_id_information": True,
                    }
                )
            )
        )
        yield {"scripted": scripted, "openai": openai_url, "local_hf": local_hf, "vllm": vllm}


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)


def model_name(kind: str) -> str:
    return "tiny-chatml" if kind in ("local_hf", "vllm") else "scripted"


@pytest.mark.parametrize("kind", SERVERS)
def test_responses_stream_events_rebuild_the_answer(kind: str, urls: dict[str, str]) -> None:
    events = list(
        client(urls[kind]).responses.create(
            model=model_name(kind), input="hello there", stream=True, max_output_tokens=12
        )
    )
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    final = events[-1].response
    # A tiny model cut off by max_output_tokens ends incomplete, as OpenAI's stream says.
    assert types[-1] == f"response.{final.status}" and final.status in ("completed", "incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    streamed = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert streamed == final.output_text and streamed
    assert "response.output_item.done" in types and "response.output_text.done" in types
    if kind == "vllm":
        # Token IDs ride in the final event where the engine gives them.
        last = final.output[-1].model_dump()
        assert last["generation_token_ids"] and last["prompt_token_ids"]


@pytest.mark.parametrize("kind", SERVERS)
def test_responses_without_streaming_and_the_model_list(kind: str, urls: dict[str, str]) -> None:
    openai_client = client(urls[kind])
    response = openai_client.responses.create(
        model=model_name(kind), input="hello there", max_output_tokens=12
    )
    assert response.status in ("completed", "incomplete") and response.output_text
    models = [model.id for model in openai_client.models.list()]
    assert len(models) == 1 and models[0]
    if kind != "openai":  # a passthrough reports its upstream's names
        assert response.model == models[0]


def test_streamed_tool_call_matches_the_call(urls: dict[str, str]) -> None:
    for kind in ("scripted", "openai"):
        events = list(
            client(urls[kind]).responses.create(model="scripted", input="weather?", tools=TOOLS, stream=True)  # type: ignore[arg-type]
        )
        arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert arguments == done.arguments == '{"city":"Oslo"}'
        assert events[-1].response.output[0].name == "get_weather"


@pytest.mark.parametrize("kind", SERVERS)
def test_chat_completion_stream(kind: str, urls: dict[str, str]) -> None:
    extra = {"return_token_ids": True} if kind == "local_hf" else {}
    chunks = list(
        client(urls[kind]).chat.completions.create(
            model=model_name(kind),
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    )
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
    if kind == "local_hf":
        last = chunks[-2].model_dump()
        assert last["choices"][0]["token_ids"] and last["prompt_token_ids"]


def test_chat_stream_helper_accumulates_a_tool_call(urls: dict[str, str]) -> None:
    tools = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
    with client(urls["scripted"]).chat.completions.stream(
        model="scripted",
        messages=[{"role": "user", "content": "weather in Oslo?"}],
        tools=tools,  # type: ignore[arg-type]
    ) as stream:
        completion = stream.get_final_completion()
    call = completion.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather" and call.function.arguments == '{"city":"Oslo"}'
    assert completion.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("kind", SERVERS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_malformed_request_is_a_400_the_client_shows(kind: str, stream: bool, urls: dict[str, str]) -> None:
    openai_client = client(urls[kind])
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.responses.create(
            model=model_name(kind),
            input=[{"role": "user", "content": 42}],  # type: ignore[list-item]
            stream=stream,
        )
    assert "input[0].content must be a string or a list of content parts" in raised.value.message
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.chat.completions.create(
            model=model_name(kind),
            messages=[{"role": "user", "content": 7}],  # type: ignore[list-item]
            stream=stream,
        )
    assert "messages[0].content" in raised.value.message


@pytest.mark.parametrize("kind", ["local_hf", "vllm"])  # the servers converting Responses to chat
@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_choice_needing_a_tool_with_no_tools_is_a_400(
    kind: str, stream: bool, urls: dict[str, str]
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client(urls[kind]).responses.create(
            model=model_name(kind), input="hello", tool_choice="required", stream=stream
        )
    assert "tool_choice='required' needs at least one tool, but 'tools' is empty" in raised.value.message


def test_error_bodies_have_openai_shape(urls: dict[str, str]) -> None:
    with SyncClient() as http:
        status, body = http.post(urls["scripted"] + "/v1/responses", {"input": "no script for this"})
    assert status == 422
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"} and "server" not in body
    assert error["code"] is None or isinstance(error["code"], str)
    assert "no script matches" in error["message"] and error["type"] == "invalid_request_error"
    for kind in SERVERS:  # every model server: OpenAI's shape, the server named in a header
        request = urllib.request.Request(
            urls[kind] + "/v1/responses", data=b'{"input": 3}', headers={"content-type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400 and refused.value.headers["x-nemo-gym-server"] == kind
        answer = json.loads(refused.value.read())
        assert "server" not in answer and set(answer["error"]) == {"message", "type", "code", "param"}
        assert answer["error"]["code"] is None or isinstance(answer["error"]["code"], str)
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client(urls["scripted"]).responses.create(model="scripted", input="no script for this", stream=True)
    assert "no script matches" in raised.value.message
    # The openai_model passes its upstream's refusal on with the upstream's message.
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client(urls["openai"]).responses.create(model="scripted", input="no script for this")
    assert "no script matches" in raised.value.message
    # Engine refusals reach the client by name, streaming or not.
    with pytest.raises(openai.NotFoundError) as raised:
        client(urls["local_hf"]).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert "gpt-4o" in raised.value.message


def test_event_builders_on_edge_cases() -> None:
    assert text_pieces("") == [""]
    assert "".join(text_pieces("one two  three four five\nsix")) == "one two  three four five\nsix"
    response = {
        "id": "resp_1",
        "status": "incomplete",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think hard"}]},
            {
                "type": "message",
                "id": "m_1",
                "role": "assistant",
                "content": [{"type": "refusal", "refusal": "no"}],
            },
        ],
    }
    types = [event["type"] for event in response_events(response)]
    assert types[-1] == "response.incomplete"
    assert "response.reasoning_summary_text.delta" in types and "response.refusal.done" in types
    chunks = chat_completion_chunks(
        {"id": "c", "created": 1, "model": "m", "choices": [], "usage": None}, include_usage=False
    )
    assert chunks == []


def test_every_error_answer_has_openai_shape(urls: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A wrong path (a base_url without /v1) is a 404 the client shows by its message.
    with pytest.raises(openai.NotFoundError) as raised:
        openai.OpenAI(base_url=urls["scripted"], api_key="x", max_retries=0).responses.create(
            model="scripted", input="hello"
        )
    assert "no route POST /responses" in raised.value.message
    # A missing auth token is a 401 with a message.
    monkeypatch.setenv("NEMO_GYM_AUTH_TOKEN", "s3cret")
    with running_server(ScriptedModel({"name": "guarded", "scripts": SCRIPTS})) as guarded:
        with pytest.raises(openai.AuthenticationError) as denied:
            client(guarded).responses.create(model="scripted", input="hello")
        assert "auth token" in denied.value.message
        answer = openai.OpenAI(base_url=guarded + "/v1", api_key="s3cret", max_retries=0).responses.create(
            model="scripted", input="hello", stream=True
        )
        assert [event.type for event in answer][-1] == "response.completed"


def test_responses_stream_helper_accumulates_the_answer(urls: dict[str, str]) -> None:
    openai_client = client(urls["openai"])
    with openai_client.responses.stream(model="scripted", input="hello you") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hello to you too, said the scripted model: hello you"
    assert len(deltas) > 1  # sent in pieces, as a stream
    with openai_client.responses.stream(model="scripted", input="weather?", tools=TOOLS) as stream:  # type: ignore[arg-type]
        call = stream.get_final_response().output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.arguments == '{"city":"Oslo"}'


MALFORMED_RESPONSES = [
    ({"input": "hi", "metadata": 5}, "metadata must be an object"),
    ({"input": "hi", "tools": [1]}, "tools[0] must be an object"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name must be a string"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
        "input[0].content[0].text",
    ),
    ({"input": [{"type": "function_call", "name": 1, "arguments": "{}"}]}, "input[0].name must be a string"),
    ({"input": [{"type": "reasoning", "summary": 5}]}, "input[0].summary must be a list"),
    (
        {"input": [{"role": "assistant", "content": "x", "prompt_token_ids": "1 2"}]},
        "prompt_token_ids must be a list",
    ),
    ({"input": "hi", "max_output_tokens": "many"}, "max_output_tokens must be an integer"),
    ({"input": 7}, "input must be a string or a list"),
    ({"tools": []}, "input is missing"),  # every model server names it the same way
]
MALFORMED_CHAT = [
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [5]}, "tools[0] must be an object"),
    ({"messages": [{"role": "assistant", "tool_calls": [1]}]}, "messages[0].tool_calls[0] must be an object"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}]}, "function.name"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature must be a number"),
    ({"messages": "hi"}, "messages must be a list"),
]


@pytest.mark.parametrize("kind", SERVERS)
def test_malformed_shapes_are_400s_naming_the_field(kind: str, urls: dict[str, str]) -> None:
    with SyncClient() as http:
        for path, cases in (("/v1/responses", MALFORMED_RESPONSES), ("/v1/chat/completions", MALFORMED_CHAT)):
            for body, field in cases:
                for stream in (False, True):
                    status, answer = http.post(urls[kind] + path, {**body, "stream": stream})
                    assert status == 400, (kind, path, body, answer)
                    assert field in answer["error"]["message"], (field, answer)


def test_stream_null_is_an_ordinary_call(urls: dict[str, str]) -> None:
    # Request models dumped with every field (stream: null) are not refused.
    with SyncClient() as http:
        status, answer = http.post(urls["scripted"] + "/v1/responses", {"input": "hello", "stream": None})
    assert status == 200 and answer["object"] == "response"
