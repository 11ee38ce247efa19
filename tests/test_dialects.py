"""Every model server speaks Anthropic's Messages API and Google's Gemini API to the real clients.

The ``anthropic`` and ``google-genai`` packages talk to servers on loopback: ``vllm_model`` in
front of the CPU engine (a tiny locally built model, made to emit a tool call and then an
answer), the CPU engine itself, ``scripted_model`` and ``openai_model``. Streaming and not; a
tool round over two turns whose prompt token IDs extend the previous turn's prompt + generation
although the clients drop the token-ID fields when they echo the conversation.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from nemo_gym.testing import running_server
from responses_api_models.local_hf_model.app import LocalHFModel
from responses_api_models.openai_model.app import OpenAIModel
from responses_api_models.scripted_model.app import ScriptedModel
from responses_api_models.vllm_model.app import VLLMModel

pytestmark = pytest.mark.slow

genai = pytest.importorskip("google.genai", reason="google-genai (the dev extra) is not installed")
from google.genai import types as genai_types  # noqa: E402

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CLAUDE_TOOLS = [{"name": "get_weather", "description": "Weather for a city.", "input_schema": WEATHER_SCHEMA}]
GEMINI_TOOLS = [{"functionDeclarations": [{"name": "get_weather", "description": "Weather for a city.",
                                           "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}]}]  # fmt: skip
SCRIPTS = [{"match": "weather", "turns": [{"call_tool": "get_weather", "arguments": {"city": "Oslo"}},
                                         {"text": "It is {tool_output}."}]}]  # fmt: skip
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    """The servers, on loopback."""
    with contextlib.ExitStack() as stack:
        engine = LocalHFModel(
            {"name": "engine", "tiny": True, "default_max_tokens": 48, "return_token_id_information": True,
             "forced_completions": [TOOL_CALL, "It is sunny in Oslo."]}
        )  # fmt: skip
        engine_url = stack.enter_context(running_server(engine))
        vllm = VLLMModel(
            {"name": "policy", "base_url": engine_url + "/v1", "model": "tiny-chatml",
             "return_token_id_information": True}
        )  # fmt: skip
        scripted_url = stack.enter_context(
            running_server(ScriptedModel({"name": "scripted", "scripts": SCRIPTS}))
        )
        openai_model = OpenAIModel(
            {"name": "openai", "openai_base_url": scripted_url + "/v1", "openai_api_key": "sk-x",
             "openai_model": "scripted-model", "max_retries": 0}
        )  # fmt: skip
        yield {
            "engine": engine_url,
            "vllm": stack.enter_context(running_server(vllm)),
            "scripted": scripted_url,
            "openai": stack.enter_context(running_server(openai_model)),
        }


def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def claude(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)


def extends(earlier: dict[str, Any], later: dict[str, Any]) -> bool:
    sequence = list(earlier["prompt_token_ids"]) + list(earlier["generation_token_ids"])
    return list(later["prompt_token_ids"][: len(sequence)]) == sequence


def messages_call(client: anthropic.Anthropic, stream: bool, **request: Any) -> tuple[Any, dict[str, Any]]:
    """One Messages call: the message and its token-ID fields (from the last event when streamed)."""
    request = {"model": "claude-opus-4-8", "max_tokens": 64, "tools": CLAUDE_TOOLS, **request}
    if not stream:
        message = client.messages.create(**request)
        return message, {key: (message.model_extra or {}).get(key) for key in TOKEN_FIELDS}
    tokens: dict[str, Any] = {}
    with client.messages.stream(**request) as events:
        names = []
        for event in events:
            names.append(event.type)
            if event.type == "message_delta":
                tokens = {key: (event.model_extra or {}).get(key) for key in TOKEN_FIELDS}
        message = events.get_final_message()
    assert names[0] == "message_start" and names[-1] == "message_stop"
    return message, tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("prefix", ["", "/ng-rollout/messages-{stream}"], ids=["no_rollout", "rollout"])
def test_messages_tool_round_extends_the_token_ids(urls: dict[str, str], stream: bool, prefix: str) -> None:
    client = claude(urls["vllm"] + prefix.format(stream=stream))
    history: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first, first_tokens = messages_call(client, stream, system="Be brief.", messages=history)

    assert first.model == "claude-opus-4-8" and first.stop_reason == "tool_use"
    call = first.content[-1]
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Oslo"})
    assert all(first_tokens[key] for key in TOKEN_FIELDS)
    assert len(first_tokens["generation_token_ids"]) == len(first_tokens["generation_log_probs"])

    # The client echoes the turn without our fields; a system turn comes mid-conversation.
    history += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]},
    ]
    second, second_tokens = messages_call(client, stream, system="Be brief.", messages=history)

    assert second.stop_reason == "end_turn" and second.content[0].text == "It is sunny in Oslo."
    assert extends(first_tokens, second_tokens)


def test_messages_system_turn_mid_conversation_and_thinking_blocks(urls: dict[str, str]) -> None:
    client = claude(urls["vllm"] + "/ng-rollout/system-turn")
    history: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first, first_tokens = messages_call(client, False, messages=history)
    history += [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": ""},
                                          *[b.model_dump(exclude_none=True) for b in first.content]]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[-1].id,
                                      "content": [{"type": "text", "text": "sunny"}]}]},
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "And?"},
    ]  # fmt: skip
    second, _ = messages_call(client, False, messages=history)
    assert second.content[0].type == "text"


@pytest.mark.parametrize("server", ["engine", "scripted", "openai"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_messages_on_every_model_server(urls: dict[str, str], server: str, stream: bool) -> None:
    client = claude(urls[server])
    message, tokens = messages_call(
        client, stream, messages=[{"role": "user", "content": "What is the weather in Oslo?"}]
    )
    assert message.model == "claude-opus-4-8"
    assert message.content[-1].type == "tool_use" and message.content[-1].input == {"city": "Oslo"}
    # Only engines with return_token_id_information give token IDs.
    assert bool(tokens["prompt_token_ids"]) == (server == "engine")


def test_head_and_refusals_in_messages(urls: dict[str, str]) -> None:
    request = urllib.request.Request(urls["vllm"] + "/", method="HEAD")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    status, body = post(urls["vllm"] + "/v1/messages?beta=true", {"model": "m", "max_tokens": 8,
                                                                   "messages": [{"role": "tool", "content": "x"}]})  # fmt: skip
    assert status == 400 and b"messages[0]" in body
    status, body = post(
        urls["vllm"] + "/v1/messages",
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
         "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
    )  # fmt: skip
    assert status == 400 and b"web_search" in body


def gemini_client(base_url: str) -> Any:
    return genai.Client(
        api_key="x", http_options=genai_types.HttpOptions(base_url=base_url, api_version="v1beta")
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_gemini_tool_round_through_the_sdk(urls: dict[str, str], stream: bool) -> None:
    client = gemini_client(urls["vllm"] + f"/ng-rollout/gemini-{stream}")
    config = genai_types.GenerateContentConfig(
        system_instruction="Be brief.", tools=[genai_types.Tool.model_validate(GEMINI_TOOLS[0])]
    )
    contents: list[Any] = [
        genai_types.Content(role="user", parts=[genai_types.Part(text="Weather in Oslo?")])
    ]

    def call() -> genai_types.Content:
        if not stream:
            answer = client.models.generate_content(model="gemini-2.5-pro", contents=contents, config=config)
            assert answer.model_version == "gemini-2.5-pro"
            return answer.candidates[0].content
        parts: list[genai_types.Part] = []
        for chunk in client.models.generate_content_stream(
            model="gemini-2.5-pro", contents=contents, config=config
        ):
            parts += chunk.candidates[0].content.parts or []
        return genai_types.Content(role="model", parts=parts)

    first = call()
    function_call = first.parts[-1].function_call
    assert (function_call.name, function_call.args) == ("get_weather", {"city": "Oslo"})
    contents += [first, genai_types.Content(role="user", parts=[genai_types.Part(function_response=genai_types.FunctionResponse(
        id=function_call.id, name="get_weather", response={"output": "sunny"}))])]  # fmt: skip
    second = call()
    assert "".join(part.text or "" for part in second.parts) == "It is sunny in Oslo."


def test_gemini_token_ids_extend_across_turns_over_http(urls: dict[str, str]) -> None:
    base = urls["vllm"] + "/ng-rollout/gemini-http/v1beta/models/gemini-2.5-flash"
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Weather in Oslo?"}]}]
    status, raw = post(base + ":generateContent", {"contents": contents, "tools": GEMINI_TOOLS})
    assert status == 200, raw
    first = json.loads(raw)
    parts = first["candidates"][0]["content"]["parts"]
    call = parts[-1]["functionCall"]
    # Echoed as a client that keeps only Gemini's own fields.
    contents += [{"role": "model", "parts": parts},
                 {"role": "user", "parts": [{"functionResponse": {"id": call["id"], "name": call["name"],
                                                                  "response": {"output": "sunny"}}}]}]  # fmt: skip
    status, raw = post(base + ":streamGenerateContent?alt=sse", {"contents": contents, "tools": GEMINI_TOOLS})
    assert status == 200, raw
    chunks = [json.loads(line[len(b"data: ") :]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert extends(first, chunks[-1])


def test_gemini_routing_side_call_is_answered_from_its_schema(urls: dict[str, str]) -> None:
    client = gemini_client(urls["vllm"])
    schema = {"type": "object", "properties": {"complexity_reasoning": {"type": "string"},
                                               "complexity_score": {"type": "integer", "minimum": 1, "maximum": 100}},
              "required": ["complexity_reasoning", "complexity_score"]}  # fmt: skip
    answer = client.models.generate_content(
        model="gemini-2.5-flash-lite",
        contents="Route this: list the files.",
        config=genai_types.GenerateContentConfig(
            response_mime_type="application/json", response_json_schema=schema
        ),
    )
    assert json.loads(answer.text) == {"complexity_reasoning": "", "complexity_score": 1}


def test_gemini_refusals(urls: dict[str, str]) -> None:
    status, body = post(urls["vllm"] + "/v1beta/models/gemini-2.5-pro:embedContent", {"contents": []})
    assert status == 404 and b"generateContent" in body
    status, body = post(
        urls["vllm"] + "/v1beta/models/g:generateContent", {"contents": [{"role": "bot", "parts": []}]}
    )
    assert status == 400 and b"contents[0].role" in body
    status, body = post(
        urls["vllm"] + "/v1beta/models/g:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": [{"googleSearch": {}}]},
    )
    assert status == 400 and b"googleSearch" in body


OPENAI_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city.", "parameters": WEATHER_SCHEMA}]  # fmt: skip
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": WEATHER_SCHEMA}}]  # fmt: skip


def test_streamed_responses_like_codex_extend_the_token_ids(urls: dict[str, str]) -> None:
    """Codex: streaming Responses, echoing its items without our fields."""
    client = openai.OpenAI(base_url=urls["vllm"] + "/ng-rollout/codex/v1", api_key="x", max_retries=0)

    def call(items: list[dict[str, Any]]) -> dict[str, Any]:
        stream = client.responses.create(model="gpt-5-codex", input=items, tools=OPENAI_TOOLS, stream=True)
        final = [event for event in stream if event.type == "response.completed"]
        assert len(final) == 1
        return final[0].response.model_dump()

    items: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = call(items)
    function_call = first["output"][-1]
    assert function_call["type"] == "function_call" and function_call["prompt_token_ids"]
    echoed = {key: function_call[key] for key in ("type", "call_id", "name", "arguments")}
    items += [echoed, {"type": "function_call_output", "call_id": echoed["call_id"], "output": "sunny"}]
    second = call(items)
    assert extends(function_call, second["output"][-1])


def test_streamed_chat_like_opencode_extends_the_token_ids(urls: dict[str, str]) -> None:
    """OpenCode: streaming Chat Completions that asks for no token IDs and echoes plain messages."""
    client = openai.OpenAI(base_url=urls["vllm"] + "/ng-rollout/opencode/v1", api_key="x", max_retries=0)

    def call(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        chunks = list(
            client.chat.completions.create(
                model="tiny-chatml", messages=messages, tools=CHAT_TOOLS, stream=True
            )
        )
        last = chunks[-1].model_dump()
        token_ids = [i for chunk in chunks for choice in chunk.choices for i in (choice.model_extra or {}).get("token_ids") or []]  # fmt: skip
        prompt = next(
            c.model_extra["prompt_token_ids"] for c in chunks if (c.model_extra or {}).get("prompt_token_ids")
        )
        calls = [tc for chunk in chunks for choice in chunk.choices for tc in choice.delta.tool_calls or []]
        message = {"role": "assistant", "content": None,
                   "tool_calls": [{"id": calls[0].id, "type": "function", "function": {"name": calls[0].function.name, "arguments": calls[0].function.arguments}}]} if calls else {}  # fmt: skip
        assert last["choices"] == [] or last["choices"][0]["finish_reason"]
        return message, {"prompt_token_ids": prompt, "generation_token_ids": token_ids}

    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    assistant, first = call(messages)
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    messages += [
        assistant,
        {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "sunny"},
    ]
    _, second = call(messages)
    assert extends(first, second)


def test_three_turn_scripted_claude_rollout_is_one_exact_training_sequence() -> None:
    """Claude Code's shape over teacher-forced scripts: two Bash calls, then the answer. Every
    turn's prompt extends the one before, and one forward pass over the last turn's prompt +
    generation reproduces every turn's logprobs: the rollout trains token-exact."""
    import torch

    bash = {"name": "Bash", "description": "Run a shell command.",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                                                              "description": {"type": "string"}}, "required": ["command"]}}  # fmt: skip
    script = [{"match": "failing test", "turns": [
        {"tool_call": {"name": "Bash", "arguments": {"command": "pytest -q", "description": "Run the tests"}}},
        {"tool_call": {"name": "Bash", "arguments": {"command": "sed -i s/1/2/ a.py", "description": "Fix it"}}},
        {"text": "Fixed: the test passes."}]}]  # fmt: skip
    engine = LocalHFModel({"name": "engine", "tiny": True, "return_token_id_information": True, "teacher_forced_scripts": script})  # fmt: skip
    with running_server(engine) as engine_url:
        policy = VLLMModel({"name": "policy", "base_url": engine_url + "/v1", "model": "tiny-chatml", "return_token_id_information": True})  # fmt: skip
        with running_server(policy) as url:
            client = claude(url + "/ng-rollout/claude-scripted")
            history: list[dict[str, Any]] = [{"role": "user", "content": "Please fix the failing test."}]
            calls = []
            for output in ("1 failed", "patched", None):
                message, tokens = messages_call(client, True, system="You are Claude Code.", messages=history, tools=[bash], max_tokens=32000)  # fmt: skip
                calls.append(tokens)
                if output is None:
                    break
                use = message.content[-1]
                assert use.type == "tool_use" and use.name == "Bash"
                history += [
                    {
                        "role": "assistant",
                        "content": [b.model_dump(exclude_none=True) for b in message.content],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": use.id, "content": output}],
                    },
                ]
    assert message.content[0].text == "Fixed: the test passes."
    assert all(extends(earlier, later) for earlier, later in zip(calls, calls[1:], strict=False))
    sequence = calls[-1]["prompt_token_ids"] + calls[-1]["generation_token_ids"]
    with torch.inference_mode():
        logits = engine.lm.model(input_ids=torch.tensor([sequence])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    for call in calls:
        start = len(call["prompt_token_ids"])
        rescored = [
            float(logprobs[start - 1 + i, token]) for i, token in enumerate(call["generation_token_ids"])
        ]
        assert call["generation_log_probs"] == pytest.approx(rescored, abs=1e-4)


@pytest.mark.parametrize("server", ["vllm", "engine", "scripted", "openai"])
def test_messages_count_tokens(urls: dict[str, str], server: str) -> None:
    """Claude Code counts its prompts with ``/v1/messages/count_tokens?beta=true``."""
    request = {"model": "claude-opus-4-8", "system": "Be brief.", "tools": CLAUDE_TOOLS,
               "messages": [{"role": "user", "content": "What is the weather in Oslo?"}]}  # fmt: skip
    if server == "openai":
        status, body = post(urls[server] + "/v1/messages/count_tokens?beta=true", request)
        assert status == 404 and b"cannot count tokens" in body
        return
    counted = claude(urls[server]).messages.count_tokens(**request).input_tokens
    if server in ("vllm", "engine"):
        # Exactly the prompt the engine feeds for this request.
        message, tokens = messages_call(claude(urls[server]), False, **{**request, "max_tokens": 1})
        assert counted == len(tokens["prompt_token_ids"] or []) > 0
    else:
        assert counted == len("What is the weather in Oslo?") // 4


def test_gemini_count_tokens_is_the_engines_prompt_length(urls: dict[str, str]) -> None:
    client = gemini_client(urls["vllm"])
    counted = client.models.count_tokens(
        model="gemini-2.5-pro", contents="What is the weather in Oslo?"
    ).total_tokens
    status, raw = post(urls["vllm"] + "/v1beta/models/g:generateContent",
                       {"contents": [{"role": "user", "parts": [{"text": "What is the weather in Oslo?"}]}],
                        "generationConfig": {"maxOutputTokens": 1}})  # fmt: skip
    assert status == 200 and counted == len(json.loads(raw)["prompt_token_ids"]) > 0


BAD_MESSAGES = [
    {"messages": "x"}, {"messages": [5]}, {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
    {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]},
    {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": 5}]}]},
    {"messages": [{"role": "user", "content": [5]}]},
    {"messages": [{"role": "user", "content": "hi"}], "system": [5]},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f", "input_schema": 5}]},
    {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url"}}]}]},
    {"messages": [{"role": "user", "content": "hi"}], "stream": True, "tools": [5]},
]  # fmt: skip
BAD_GEMINI = [
    {}, {"contents": 5}, {"contents": [{"parts": [5]}]}, {"contents": [{"parts": [{"functionCall": 5}]}]},
    {"contents": [{"parts": [{"functionResponse": {"name": "x"}}]}]},
    {"contents": [{"parts": [{"text": "hi"}]}], "tools": [{"functionDeclarations": [5]}]},
    {"contents": [{"parts": [{"text": "hi"}]}], "toolConfig": 5},
    {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": 5}},
    {"contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": "!!"}}]}]},
]  # fmt: skip


def test_malformed_dialect_requests_are_4xx_naming_what_is_wrong(urls: dict[str, str]) -> None:
    for body in BAD_MESSAGES:
        status, answer = post(urls["scripted"] + "/v1/messages", {"model": "m", "max_tokens": 5, **body})
        assert 400 <= status < 500, (body, status, answer)
    for body in BAD_GEMINI:
        # countTokens reads the contents, tools and system instruction only.
        for action in (
            ("generateContent",) if "generationConfig" in body else ("generateContent", "countTokens")
        ):
            status, answer = post(urls["scripted"] + f"/v1beta/models/g:{action}", body)
            assert 400 <= status < 500, (body, action, status, answer)
