"""Kept conversations: a long rollout sends only what is new, and the engine sees exactly the same requests.

Real servers on loopback: simple_agent, a resources server, openai_model, and a fake OpenAI
Responses endpoint (aiohttp, in a thread) that records the raw bytes of every request. The same
rollout is run with conversations kept (the default) and with the model server keeping none
(``kept_conversations_max: 0``, so every call carries the whole history): the upstream must get
byte-identical requests either way.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.models.conversation_store import ConversationStore, KeptConversation
from nemo_gym.response_items import build_response, usage_dict
from nemo_gym.testing import SyncClient, fake_openai_responses, running_agent, running_server
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.openai_model.app import OpenAIModel

TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


class Env(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    @tool
    async def lookup(self, body: dict) -> dict:
        return {"found": "x" * 50}

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


class Recorder:
    """A fake OpenAI Responses endpoint: ``turns`` tool calls (with token-ID fields), then an answer."""

    def __init__(self, turns: int, token_ids: bool = True) -> None:
        self.turns = turns
        self.token_ids = token_ids
        self.raw: list[bytes] = []
        self.answered: list[bytes] = []
        self.url = ""

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        n = len(self.raw)
        done = sum(1 for item in body["input"] if item.get("type") == "function_call_output")
        if done >= self.turns:
            output = [
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}],
                }
            ]
        else:
            output = [
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": f"turn {done} " * 20, "annotations": []}],
                },
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": "lookup",
                    "arguments": "{}",
                    "status": "completed",
                    "prompt_token_ids": [1, 2, n],
                    "generation_token_ids": [3, n],
                    "generation_log_probs": [-0.5, -0.25],
                },
            ]
        if not self.token_ids:
            output = _stripped(output)
        response = build_response(output, body, model=body.get("model") or "m", usage=usage_dict(1, 1))
        return {**response, "id": f"resp_{n}"}


@contextlib.contextmanager
def recording_upstream(turns: int, token_ids: bool = True) -> Iterator[Recorder]:
    state = Recorder(turns, token_ids)

    async def responses(request: web.Request) -> web.Response:
        raw = await request.read()
        answer = state.answer(orjson.loads(raw))
        state.raw.append(raw)
        state.answered.append(orjson.dumps(answer))
        return web.Response(body=state.answered[-1], content_type="application/json")

    with fake_openai_responses(responses) as state.url:
        yield state


class RecordingModel(OpenAIModel):
    """openai_model, noting how many input items each request carried and what it continued."""

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        object.__setattr__(self, "requests", [])

    async def _serve_responses(self, body: Any) -> Any:
        self.requests.append((len(body["input"]), body.get("previous_response_id")))
        return await super()._serve_responses(body)


def run_rollout(
    turns: int, token_ids: bool = True, **model_fields: Any
) -> tuple[list[bytes], dict[str, Any], RecordingModel]:
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "look it up"}],
            "tools": [TOOL],
            "temperature": 0.5,
        }
    }
    with recording_upstream(turns, token_ids) as upstream:
        model = RecordingModel({"name": "model", "openai_base_url": upstream.url, **model_fields})
        with (
            running_agent(
                Env({"name": "env"}), model, max_steps=turns + 5, agent_class=SimpleAgent
            ) as agent_url,
            SyncClient() as http,
        ):
            status, body = http.post(agent_url + "/run", row)
        assert status == 200, body
        return upstream.raw, body, model


@pytest.mark.parametrize("turns", [1, 2, 12])
def test_the_upstream_gets_the_same_bytes_with_and_without_kept_conversations(turns: int) -> None:
    kept_raw, kept_body, kept_model = run_rollout(turns)
    full_raw, full_body, full_model = run_rollout(turns, kept_conversations_max=0)
    # Without token IDs the kept items' JSON is sent as the conversation encoded it.
    plain_raw, _, _ = run_rollout(turns, token_ids=False)
    assert plain_raw == run_rollout(turns, token_ids=False, kept_conversations_max=0)[0]
    assert len(kept_raw) == turns + 1
    assert kept_raw == full_raw
    assert kept_body["response"]["output"] == full_body["response"]["output"]
    # The third call asks to keep the conversation; each later one sends only the tool's output.
    continued = [n for n, previous in kept_model.requests if previous is not None]
    assert continued == [1] * max(0, turns - 2)
    assert all(previous is None for _, previous in full_model.requests)
    # Token-ID fields reach the agent's result but never the upstream (openai_model strips them).
    assert kept_body["response"]["output"][1]["prompt_token_ids"] == [1, 2, 0]
    assert all(b"prompt_token_ids" not in raw for raw in kept_raw)
    # The rollout's kept conversation was deleted when it ended.
    assert kept_model.conversations.stats() == {"conversations": 0, "bytes": 0}
    assert full_model.conversations.stats() == {"conversations": 0, "bytes": 0}


def test_a_lost_conversation_falls_back_to_the_whole_history() -> None:
    # Every kept conversation expires at once: each continuation is answered 400
    # previous_response_not_found, and the agent sends the whole history again.
    kept_raw, kept_body, model = run_rollout(6, kept_conversations_ttl_s=1e-9)
    full_raw, full_body, _ = run_rollout(6, kept_conversations_max=0)
    assert kept_raw == full_raw
    assert kept_body["reward"] == full_body["reward"] == 1.0


def test_continuations_send_only_new_items_and_unknown_ids_are_a_400() -> None:
    with recording_upstream(turns=3) as upstream:
        model = OpenAIModel({"name": "model", "openai_base_url": upstream.url})
        with running_server(model) as url, SyncClient() as http:
            first = {"input": [{"role": "user", "content": "hi"}], "tools": [TOOL], "store": True}
            status, answer = http.post(url + "/ng-rollout/r1/v1/responses", first)
            assert status == 200, answer
            assert model.conversations.stats()["conversations"] == 1
            call = answer["output"][-1]
            new = [{"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}]
            second = {"input": new, "tools": [TOOL], "previous_response_id": answer["id"], "store": True}
            # Another rollout cannot continue it.
            status, refused = http.post(url + "/ng-rollout/r2/v1/responses", second)
            assert status == 400
            assert refused["error"]["code"] == "previous_response_not_found"
            assert refused["error"]["param"] == "previous_response_id"
            status, answer2 = http.post(url + "/ng-rollout/r1/v1/responses", second)
            assert status == 200, answer2
            sent = orjson.loads(upstream.raw[-1])
            assert "previous_response_id" not in sent and "store" not in sent
            assert sent["input"] == [first["input"][0], *_stripped(answer["output"]), *new]
            # The conversation moved to the new answer's id: the old one is gone.
            status, _ = http.post(url + "/ng-rollout/r1/v1/responses", second)
            assert status == 400
            status, deleted = http.request("DELETE", url + f"/ng-rollout/r1/v1/responses/{answer2['id']}")
            assert status == 200 and deleted["deleted"] is True
            status, _ = http.request("DELETE", url + f"/ng-rollout/r1/v1/responses/{answer2['id']}")
            assert status == 404
            assert model.conversations.stats() == {"conversations": 0, "bytes": 0}


def test_a_kept_turns_answer_is_the_upstreams_answer_byte_for_byte() -> None:
    """The answer of a kept turn (its output encoded once, for the conversation and the answer)
    has exactly the bytes of the upstream's answer, token IDs included, on every turn."""
    import urllib.request

    def post(url: str, body: dict[str, Any]) -> tuple[bytes, str | None]:
        request = urllib.request.Request(url, orjson.dumps(body), {"content-type": "application/json"})
        with urllib.request.urlopen(request) as answer:
            return answer.read(), answer.headers.get("x-nemo-gym-conversation")

    with recording_upstream(turns=4) as upstream:
        model = OpenAIModel({"name": "model", "openai_base_url": upstream.url})
        with running_server(model) as url:
            history: list[Any] = [{"role": "user", "content": "hi"}]
            body: dict[str, Any] = {"input": history, "tools": [TOOL], "store": True}
            for _ in range(4):
                raw, kept = post(url + "/ng-rollout/r1/v1/responses", body)
                assert kept == "kept" and raw == upstream.answered[-1]
                # Each turn sent on what was kept: the whole history, stripped of token IDs.
                assert orjson.loads(upstream.raw[-1])["input"] == history
                answer = orjson.loads(raw)
                new = [
                    {
                        "type": "function_call_output",
                        "call_id": answer["output"][-1]["call_id"],
                        "output": "ok",
                    }
                ]
                history = [*history, *_stripped(answer["output"]), *new]
                body = {"input": new, "tools": [TOOL], "previous_response_id": answer["id"], "store": True}


def _stripped(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    drop = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
    return [{k: v for k, v in item.items() if k not in drop} for item in items]


def _conversation(nbytes_items: int) -> KeptConversation:
    conversation = KeptConversation()
    conversation.extend([{"text": "x" * nbytes_items}])
    return conversation


def test_the_store_is_bounded_by_count_bytes_and_age() -> None:
    store = ConversationStore(max_conversations=3, max_bytes=10_000, ttl_s=60)
    for i in range(5):
        assert store.put("r", f"id{i}", _conversation(100))
    assert len(store) == 3 and store.take("r", "id0") is None and store.take("r", "id4") is not None
    assert store.put("r", "big", _conversation(6_000))
    assert store.put("r", "big2", _conversation(6_000))  # pushes out everything older
    assert store.stats()["conversations"] == 1 and store.stats()["bytes"] <= 10_000
    assert not store.put("r", "huge", _conversation(20_000))  # over the bound alone: not kept
    assert store.put("r", "big2", _conversation(10)) is False  # the id is taken
    aged = ConversationStore(ttl_s=0.05)
    aged.put("r", "a", _conversation(10))
    time.sleep(0.1)
    assert aged.take("r", "a") is None and aged.stats() == {"conversations": 0, "bytes": 0}


def _history(turns: int) -> list[dict[str, Any]]:
    """A conversation as an agent builds it: reasoning, text, calls (the last call of some turns
    carrying token IDs, others not: a turn left open at the end), tool outputs, chat-shaped items."""
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "go"}]},
    ]
    for t in range(turns):
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{t}",
                "summary": [{"type": "summary_text", "text": f"think {t}"}],
            }
        )
        items.append(message_item_of(f"text {t}"))
        call = {
            "type": "function_call",
            "call_id": f"c{t}",
            "name": "lookup",
            "arguments": "{}",
            "id": f"fc{t}",
        }
        if t % 2 == 0:
            call.update(prompt_token_ids=[1, t], generation_token_ids=[2], generation_log_probs=[-0.1])
        items.append(call)
        items.append({"type": "function_call_output", "call_id": f"c{t}", "output": f"out {t}"})
        if t % 3 == 2:
            items.append({"role": "tool", "tool_call_id": f"c{t}", "content": "chat-shaped"})
    return items


def message_item_of(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


@pytest.mark.parametrize("think_tags", [True, False])
def test_a_kept_conversation_converts_only_new_items_and_gets_the_same_chat_request(think_tags: bool) -> None:
    from nemo_gym.models.conversation_store import reset_current_conversation, set_current_conversation
    from nemo_gym.models.conversion import responses_to_chat_request

    history = _history(9)
    conversation = KeptConversation()
    # Every prefix a turn might send: cut anywhere, including inside one model call's items.
    for end in range(1, len(history) + 1):
        conversation.items[:] = history[:end]
        params = {"input": list(history[:end]), "instructions": "sys", "tools": [TOOL]}
        token = set_current_conversation(conversation)
        try:
            kept = responses_to_chat_request(params, think_tags=think_tags)
        finally:
            reset_current_conversation(token)
        assert kept == responses_to_chat_request(params, think_tags=think_tags), end
    (built,) = conversation.derived.values()
    assert built.items == history  # fed once each, in order
    # A request that does not start with the converted items (an agent rebuilt its history) is
    # converted whole.
    changed = [dict(item) for item in history]
    changed[3] = message_item_of("rewritten")
    token = set_current_conversation(conversation)
    try:
        kept = responses_to_chat_request({"input": changed}, think_tags=think_tags)
    finally:
        reset_current_conversation(token)
    assert kept == responses_to_chat_request({"input": changed}, think_tags=think_tags)


def test_the_encoded_input_is_each_items_json_without_nemo_gyms_fields_turn_after_turn() -> None:
    """openai_model's encoded input of a kept conversation (its first turn's items encoded one by
    one, later ones taken from the conversation's own JSON of what each extend added, or encoded
    again where they hold token IDs) is always the JSON of the items without nemo_gym's fields,
    also after a failed turn is undone."""
    from responses_api_models.openai_model.app import _encoded_items
    from responses_api_models.openai_model.app import strip_nemo_gym_fields as strip

    history = _history(9)
    conversation = KeptConversation()
    conversation.extend(history[:3])
    steps = [
        (3, 4, False),
        (4, 7, True),
        (7, 7, False),
        (7, 12, False),
        (12, 13, True),
        (13, len(history), True),
    ]
    for number, (start, end, round_trip) in enumerate(steps):
        mark = (len(conversation.items), conversation.nbytes)
        conversation.extend(history[start:end], round_trip=round_trip)
        if number == 3:  # this turn fails: undone, then made again
            conversation.truncate(*mark)
            assert (
                b"".join(_encoded_items(conversation))
                == orjson.dumps(list(map(strip, history[:start])))[1:-1]
            )
            conversation.extend(history[start:end])
        expected = orjson.dumps([strip(item) for item in conversation.items])
        assert b"[" + b"".join(_encoded_items(conversation)) + b"]" == expected, number
    assert conversation.items == history
    # A long conversation is a few pieces to write (merged as they come), not one per turn.
    for turn in range(200):
        conversation.extend([{"type": "function_call_output", "call_id": f"x{turn}", "output": "o" * turn}])
        pieces = _encoded_items(conversation)
        assert b"[" + b"".join(pieces) + b"]" == orjson.dumps(list(map(strip, conversation.items)))
        assert len(pieces) <= 10, turn
    # A turn adds two entries (its new input, then the answer's output), taken together: the
    # same bytes whether none, one or both hold nemo_gym's fields.
    for turn, (first, second) in enumerate([(0, 1), (1, 2), (2, 3), (3, 3), (4, 6), (6, 8)]):
        conversation.extend(history[first:second] or history[:1], round_trip=turn % 2 == 0)
        conversation.extend(history[second : second + 1])
        pieces = _encoded_items(conversation)
        assert b"[" + b"".join(pieces) + b"]" == orjson.dumps(list(map(strip, conversation.items))), turn
    first_use = KeptConversation()
    first_use.extend([])
    assert _encoded_items(first_use) == []
    first_use.extend(history[:2])
    assert b"[" + b"".join(_encoded_items(first_use)) + b"]" == orjson.dumps(history[:2])


def test_a_handlers_own_answer_objects_are_kept_as_json_gives_them_back() -> None:
    """A handler answering with objects of its own (a tuple, an item it changes afterwards) gets
    them back on the next turn as a client parsing the answer would: copied through JSON. Only
    an output a passthrough parsed itself (openai_model's) is kept as it is."""
    from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel

    class OwnObjects(SimpleResponsesAPIModel):
        config: BaseResponsesAPIModelConfig

        def model_post_init(self, context: Any) -> None:
            super().model_post_init(context)
            object.__setattr__(self, "inputs", [])
            object.__setattr__(self, "answered", [])

        async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
            self.inputs.append(body["input"])
            for item in self.answered:
                item["status"] = "changed afterwards"
            item = {"type": "message", "role": "assistant", "status": "completed", "content": ("a", "b")}
            self.answered.append(item)
            return build_response([item], body, model="m")

    model = OwnObjects({"name": "own"})
    with running_server(model) as url, SyncClient() as http:
        status, answer = http.post(url + "/ng-rollout/r/v1/responses", {"input": "hi", "store": True})
        assert status == 200, answer
        body = {
            "input": [{"role": "user", "content": "next"}],
            "previous_response_id": answer["id"],
            "store": True,
        }
        status, _ = http.post(url + "/ng-rollout/r/v1/responses", body)
        assert status == 200
    kept = model.inputs[-1][1]
    assert kept == {"type": "message", "role": "assistant", "status": "completed", "content": ["a", "b"]}


def test_store_is_served_as_without_it_when_nothing_can_be_kept_or_the_answer_is_streamed() -> None:
    """``store: true`` on a server keeping no conversations (``kept_conversations_max: 0``) builds
    none: the handler gets the request without ``store``, outside any conversation, and the answer
    is not marked kept. With ``stream: true`` the answer is the event stream asked for."""
    import urllib.request

    from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
    from nemo_gym.models.conversation_store import current_conversation

    class Noting(SimpleResponsesAPIModel):
        config: BaseResponsesAPIModelConfig

        def model_post_init(self, context: Any) -> None:
            super().model_post_init(context)
            object.__setattr__(self, "seen", [])

        async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
            self.seen.append((sorted(body), current_conversation() is not None))
            item = {"type": "message", "role": "assistant", "status": "completed", "content": []}
            return build_response([item], body, model="m")

    def post(url: str, body: dict[str, Any]) -> tuple[str, str | None, bytes]:
        request = urllib.request.Request(url, orjson.dumps(body), {"content-type": "application/json"})
        with urllib.request.urlopen(request) as answer:
            return (
                answer.headers["content-type"],
                answer.headers.get("x-nemo-gym-conversation"),
                answer.read(),
            )

    body = {"input": [{"role": "user", "content": "hi"}], "store": True, "previous_response_id": None}
    for kept_max, expected in ((0, False), (8, True)):
        model = Noting({"name": "m", "kept_conversations_max": kept_max})
        with running_server(model) as url:
            kind, kept, _ = post(url + "/ng-rollout/r/v1/responses", body)
            assert kind.startswith("application/json") and (kept == "kept") is expected
            status = post(url + "/ng-rollout/r/v1/responses", {**body, "stream": True})
            assert status[0].startswith("text/event-stream") and status[1] is None
            assert status[2].startswith(b"event: response.created")
        assert model.seen[0] == (["input"], expected), model.seen
        assert model.conversations.stats()["conversations"] == int(expected)


def test_a_string_input_reaches_the_upstream_as_sent_whether_or_not_it_is_kept() -> None:
    """openai_model sends a kept conversation's first turn on as the request the client made (a
    string ``input`` stays a string, without ``store``), whatever the server keeps; the next turn
    continues it with the string as the user message it stands for."""
    raw: list[bytes] = []

    async def responses(request: web.Request) -> web.Response:
        raw.append(await request.read())
        item = {"type": "message", "id": "m", "role": "assistant", "status": "completed", "content": []}
        answer = build_response([item], {"model": "m"}, model="m", usage=usage_dict(1, 1))
        return web.Response(
            body=orjson.dumps({**answer, "id": f"resp_{len(raw)}"}), content_type="application/json"
        )

    with fake_openai_responses(responses) as upstream:
        for kept_max in (0, 8):
            model = OpenAIModel(
                {"name": "model", "openai_base_url": upstream, "kept_conversations_max": kept_max}
            )
            with running_server(model) as url, SyncClient() as http:
                status, answer = http.post(url + "/ng-rollout/r/v1/responses", {"input": "hi", "store": True})
                assert status == 200, answer
                assert orjson.loads(raw[-1]) == {"input": "hi"}
                if kept_max:
                    follow = {
                        "input": [{"role": "user", "content": "more"}],
                        "previous_response_id": answer["id"],
                    }
                    status, _ = http.post(url + "/ng-rollout/r/v1/responses", follow)
                    assert status == 200
                    history = [{"role": "user", "content": "hi"}, *answer["output"], *follow["input"]]
                    assert orjson.loads(raw[-1]) == {"input": history}
