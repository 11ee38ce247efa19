"""Streams follow the engine: the first event arrives while the answer is still being generated.

- local_hf_model (the CPU engine, a tiny model, a 200-token answer): the first text delta
  arrives before the engine's generation ends (event arrival times compared with the engine's
  own end-of-generation time, same clock), on Chat Completions and Responses, and the chunks
  add up to the non-streaming answer, token IDs included.
- vllm_model in front of that engine: the same, through its Responses conversion.
- openai_model and vllm_model in front of a loopback fake upstream that streams slowly: events
  (tool-call deltas included) are passed on before the upstream has finished, the ``openai``
  client's stream helpers rebuild the answer, and an upstream that breaks off mid-stream ends
  the stream with an error the client raises.
- A client that goes away mid-stream stops the engine's generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from nemo_gym.models.chat_stream import ChatCompletionAccumulator, ThinkSplitter
from nemo_gym.serving.sse import SSEParser
from nemo_gym.testing import SyncClient, running_app, running_server
from responses_api_models.local_hf_model.app import LocalHFModel
from responses_api_models.openai_model.app import OpenAIModel
from responses_api_models.vllm_model.app import VLLMModel

ANSWER_TOKENS = 200  # the measure: a 200-token answer on the CPU engine
SHORT_ANSWER_TOKENS = 40  # elsewhere: long enough to tell streaming from buffering, cheaper on CI
GREEDY_200 = {"temperature": 0, "ignore_eos": True}


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[LocalHFModel, str, str]]:
    """The CPU engine (tiny model) and a vllm_model in front of it."""
    server = LocalHFModel({"name": "engine", "tiny": True, "return_token_id_information": True})
    with running_server(server) as url:
        policy = VLLMModel(
            {
                "name": "policy",
                "base_url": url + "/v1",
                "model": "tiny-chatml",
                "return_token_id_information": True,
            }
        )
        with running_server(policy) as policy_url:
            yield server, url, policy_url


@pytest.mark.slow
def test_engine_chat_stream_starts_before_generation_ends(engine) -> None:
    server, url, _ = engine
    messages = [{"role": "user", "content": "Tell me a long story."}]
    started = time.monotonic()
    arrivals: list[float] = []
    chunks = []
    for chunk in client(url).chat.completions.create(
        model="tiny-chatml",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=ANSWER_TOKENS,
        stream=True,
        extra_body={**GREEDY_200, "return_token_ids": True, "logprobs": True},
    ):
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())
    generation_end = server.last_generation_end
    assert generation_end is not None and arrivals
    # The first token's text arrived while the other ~199 were still being generated.
    assert arrivals[0] < generation_end, (arrivals[0] - started, generation_end - started)
    assert len([t for t in arrivals if t < generation_end]) > 10
    print(
        f"\nlocal_hf chat: first text delta {1000 * (arrivals[0] - started):.0f} ms, "
        f"generation end {1000 * (generation_end - started):.0f} ms, {len(arrivals)} text deltas"
    )
    # The chunks add up to the non-streaming answer, token IDs and logprobs included.
    whole = client(url).chat.completions.create(
        model="tiny-chatml",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=ANSWER_TOKENS,
        extra_body={**GREEDY_200, "return_token_ids": True, "logprobs": True},
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    last = chunks[-1].model_dump()
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["choices"][0]["token_ids"] == whole.model_dump()["choices"][0]["token_ids"]
    assert len(last["choices"][0]["token_ids"]) == ANSWER_TOKENS
    assert len(last["choices"][0]["logprobs"]["content"]) == ANSWER_TOKENS
    assert last["prompt_token_ids"]


@pytest.mark.parametrize("through", ["engine", "vllm_model"])
def test_responses_stream_starts_before_generation_ends(engine, through: str) -> None:
    server, engine_url, policy_url = engine
    url = engine_url if through == "engine" else policy_url
    params: dict[str, Any] = {
        "model": "tiny-chatml",
        "input": "Tell me a long story.",
        "max_output_tokens": SHORT_ANSWER_TOKENS,
        "temperature": 0,
        "metadata": {"extra_body": '{"ignore_eos": true}'},
    }
    started = time.monotonic()
    arrivals: list[float] = []
    events = []
    # A length-capped answer ends in response.incomplete, which the stream() helper does not take.
    for event in client(url).responses.create(**params, stream=True):
        events.append(event)
        if event.type == "response.output_text.delta":
            arrivals.append(time.monotonic())
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    generation_end = server.last_generation_end
    assert generation_end is not None and arrivals
    assert arrivals[0] < generation_end, (arrivals[0] - started, generation_end - started)
    print(
        f"\n{through} responses: first text delta {1000 * (arrivals[0] - started):.0f} ms, "
        f"generation end {1000 * (generation_end - started):.0f} ms"
    )
    assert [event.sequence_number for event in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == final.output_text and final.status == "incomplete"
    whole = client(url).responses.create(**params)
    assert final.output_text == whole.output_text
    # Token IDs ride on the final event's last item, as in the non-streaming answer.
    last, whole_last = final.output[-1].model_dump(), whole.output[-1].model_dump()
    assert len(last["generation_token_ids"]) == SHORT_ANSWER_TOKENS
    assert last["generation_token_ids"] == whole_last["generation_token_ids"]
    assert last["prompt_token_ids"] == whole_last["prompt_token_ids"]
    # Ids of the items sent live are the ids of the final response's items.
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [item.id for item in final.output]


def test_a_client_that_goes_away_stops_the_generation(engine) -> None:
    server, url, _ = engine
    server.last_generation_end = None
    body = {
        "model": "tiny-chatml",
        "messages": [{"role": "user", "content": "Go on forever."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }

    async def read_a_little() -> None:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        raw = orjson.dumps(body)
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
        )
        writer.write(head.encode() + raw)
        seen = b""
        while seen.count(b"data:") < 4:
            got = await asyncio.wait_for(reader.read(4096), 30)
            assert got, f"the stream ended early: {seen[:500]!r}"
            seen += got
        assert seen.startswith(b"HTTP/1.1 200"), seen[:300]
        writer.close()

    asyncio.run(read_a_little())
    closed = time.monotonic()
    deadline = closed + 20
    while server.last_generation_end is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.last_generation_end is not None, "the generation went on for nobody"
    # The engine is free again: a short call is answered at once.
    with SyncClient(timeout_s=30) as http:
        status, _ = http.post(
            url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
    assert status == 200


# ---- a slow fake upstream ----------------------------------------------------------------
TOOL_CALL_CHUNKS = [
    {"role": "assistant", "content": ""},
    {"reasoning_content": "The user wants "},
    {"reasoning_content": "the weather."},
    {"content": "Let me check."},
    {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    },
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]},
]


class SlowUpstream:
    """Streams a Responses answer and a chat answer (reasoning, text, a tool call) one event per ``gap_s``."""

    def __init__(self, gap_s: float = 0.15) -> None:
        self.gap_s = gap_s
        self.finished_at: float | None = None
        self.break_after: int | None = None
        self.plain = False  # answer one JSON object, ignoring stream=true

    async def _paced(self, events: list[bytes]) -> AsyncIterator[bytes]:
        for number, event in enumerate(events):
            if self.break_after is not None and number == self.break_after:
                raise RuntimeError("upstream dies mid-stream")
            if number == len(events) - 1:
                self.finished_at = time.monotonic()  # the moment the last event leaves
            else:
                await asyncio.sleep(self.gap_s)
            yield event

    def app(self) -> Any:
        async def chat(request: Request) -> StreamingResponse:
            body = orjson.loads(await request.body())
            head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
            chunks = []
            for number, delta in enumerate(TOOL_CALL_CHUNKS):
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
                choice["logprobs"] = {
                    "content": [{"token": f"token_id:{number}", "logprob": -0.5, "top_logprobs": []}]
                }
                choice["token_ids"] = [100 + number]
                chunk = {**head, "choices": [choice]}
                if number == 0:
                    chunk["prompt_token_ids"] = [1, 2, 3]
                chunks.append(chunk)
            chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}
                chunks.append({**head, "choices": [], "usage": usage})
            events = [b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks] + [b"data: [DONE]\n\n"]
            return StreamingResponse(self._paced(events), media_type="text/event-stream")

        async def responses(request: Request) -> Response:
            await request.body()
            text = ["It ", "is ", "sunny ", "in ", "Oslo."]
            item = {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
            done_part = {**part, "text": "".join(text)}
            done_item = {**item, "status": "completed", "content": [done_part]}
            response = {
                "id": "resp_1",
                "object": "response",
                "created_at": 1.0,
                "model": "m",
                "status": "in_progress",
                "output": [],
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
            }
            events: list[dict[str, Any]] = [
                {"type": "response.created", "response": response},
                {"type": "response.output_item.added", "output_index": 0, "item": item},
                {"type": "response.content_part.added", **where, "part": part},
                *(
                    {"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []}
                    for piece in text
                ),
                {"type": "response.output_text.done", **where, "text": done_part["text"], "logprobs": []},
                {"type": "response.content_part.done", **where, "part": done_part},
                {"type": "response.output_item.done", "output_index": 0, "item": done_item},
                {
                    "type": "response.completed",
                    "response": {**response, "status": "completed", "output": [done_item]},
                },
            ]
            raw = [
                f"event: {event['type']}\n".encode()
                + b"data: "
                + orjson.dumps({**event, "sequence_number": number})
                + b"\n\n"
                for number, event in enumerate(events)
            ]
            if self.plain:
                final = {**response, "status": "completed", "output": [done_item]}
                return JSONResponse(final)
            return StreamingResponse(self._paced(raw), media_type="text/event-stream")

        return Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/responses", responses, methods=["POST"]),
            ]
        )


@pytest.fixture(scope="module")
def slow() -> Iterator[tuple[SlowUpstream, dict[str, str]]]:
    upstream = SlowUpstream()
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(running_app(upstream.app())) + "/v1"
        openai_url = stack.enter_context(
            running_server(OpenAIModel({"name": "openai", "openai_base_url": base, "max_retries": 0}))
        )
        vllm_url = stack.enter_context(
            running_server(
                VLLMModel(
                    {"name": "vllm", "base_url": base, "model": "m", "return_token_id_information": True}
                )
            )
        )
        yield upstream, {"openai": openai_url, "vllm": vllm_url}


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("server", ["openai", "vllm"])
def test_chat_stream_is_passed_through_as_it_arrives(slow, server: str) -> None:
    upstream, urls = slow
    upstream.finished_at, upstream.break_after = None, None
    arrivals = []
    with client(urls[server]).chat.completions.stream(
        model="m",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    ) as stream:
        for event in stream:
            if event.type == "chunk":
                arrivals.append(time.monotonic())
        completion = stream.get_final_completion()
    assert upstream.finished_at is not None and arrivals[0] < upstream.finished_at - 0.2
    call = completion.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_1",
        "get_weather",
        '{"city": "Oslo"}',
    )
    assert completion.choices[0].message.content == "Let me check."
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.total_tokens == 10


def test_openai_model_passes_the_responses_stream_through(slow) -> None:
    upstream, urls = slow
    upstream.finished_at, upstream.break_after = None, None
    arrivals = []
    with client(urls["openai"]).responses.stream(model="m", input="Weather?") as stream:
        for event in stream:
            arrivals.append((time.monotonic(), event.type))
        final = stream.get_final_response()
    assert upstream.finished_at is not None
    first_delta = next(t for t, kind in arrivals if kind == "response.output_text.delta")
    assert first_delta < upstream.finished_at - 0.2
    assert final.output_text == "It is sunny in Oslo." and final.id == "resp_1"


def test_vllm_model_streams_responses_from_chat_chunks(slow) -> None:
    upstream, urls = slow
    upstream.finished_at, upstream.break_after = None, None
    arrivals = []
    events = []
    with client(urls["vllm"]).responses.stream(
        model="m",
        input="Weather in Oslo?",
        tools=[
            {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": False}
        ],
    ) as stream:
        for event in stream:
            arrivals.append(time.monotonic())
            events.append(event)
        final = stream.get_final_response()
    assert upstream.finished_at is not None
    kinds = [event.type for event in events]
    first_text = arrivals[kinds.index("response.reasoning_summary_text.delta")]
    first_arguments = arrivals[kinds.index("response.function_call_arguments.delta")]
    assert first_text < first_arguments < upstream.finished_at
    assert first_text < upstream.finished_at - 0.2
    reasoning, message, call = final.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "The user wants the weather."
    assert message.type == "message" and final.output_text == "Let me check."
    assert call.type == "function_call" and call.arguments == '{"city": "Oslo"}' and call.call_id == "call_1"
    # Token IDs and logprobs of every chunk, folded onto the final event's last item.
    last = call.model_dump()
    assert last["prompt_token_ids"] == [1, 2, 3]
    assert last["generation_token_ids"] == [100 + n for n in range(len(TOOL_CALL_CHUNKS))]
    assert last["generation_log_probs"] == [-0.5] * len(TOOL_CALL_CHUNKS)
    assert [e.item.id for e in events if e.type == "response.output_item.added"] == [
        i.id for i in final.output
    ]


@pytest.mark.parametrize(
    ("server", "api"), [("openai", "chat"), ("openai", "responses"), ("vllm", "responses")]
)
def test_an_upstream_that_breaks_off_ends_the_stream_with_an_error(slow, server: str, api: str) -> None:
    upstream, urls = slow
    upstream.break_after = 4
    try:
        with pytest.raises(openai.APIError) as raised:
            if api == "chat":
                for _ in client(urls[server]).chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}], stream=True
                ):
                    pass
            else:
                for _ in client(urls[server]).responses.create(model="m", input="x", stream=True):
                    pass
    finally:
        upstream.break_after = None
    assert "stream" in raised.value.message


def test_an_upstream_that_ignores_stream_is_sent_as_events(slow) -> None:
    upstream, urls = slow
    upstream.plain = True
    try:
        events = list(client(urls["openai"]).responses.create(model="m", input="Weather?", stream=True))
    finally:
        upstream.plain = False
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert (
        "".join(e.delta for e in events if e.type == "response.output_text.delta") == "It is sunny in Oslo."
    )


# ---- the pieces ---------------------------------------------------------------------------
def test_sse_parser_and_accumulator_on_split_input() -> None:
    raw = b'event: a\r\ndata: {"x":\r\ndata: 1}\r\n\r\n: comment\n\ndata: [DONE]\n\n'
    parser = SSEParser()
    events = [event for index in range(len(raw)) for event in parser.feed(raw[index : index + 1])]
    assert [(e.name, e.data) for e in events] == [("a", '{"x":\n1}'), (None, "[DONE]")]
    folded = ChatCompletionAccumulator()
    folded.add({"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]})
    folded.add({"id": "c", "choices": [{"index": 0, "delta": {"content": "b"}, "token_ids": [5]}]})
    folded.add({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [6]}]})
    choice = folded.completion()["choices"][0]
    assert choice["message"]["content"] == "ab" and choice["token_ids"] == [5, 6]
    assert choice["finish_reason"] == "stop"


def test_think_splitter_holds_back_what_may_be_a_tag() -> None:
    splitter = ThinkSplitter()
    pieces = []
    for piece in ["<th", "ink>why", " not</th", "ink>\n\nAns", "wer <", "b>"]:
        pieces += splitter.feed(piece)
    assert pieces == [
        ("reasoning", "why"),
        ("reasoning", " not"),
        ("message", "\n\nAns"),
        ("message", "wer "),
        ("message", "<b>"),
    ]
