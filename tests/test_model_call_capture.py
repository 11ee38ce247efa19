"""NeMo Gym's model-adapter style and its per-rollout model-call capture, on our model base.

The adapter below is written as NeMo Gym's model folders are: ``responses(self, request, body:
NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse``, execution facts through
``start_model_execution``. It is driven in-process with FastAPI's test client (as NeMo Gym's own
tests do) and served by a real process on loopback, where our guards strip the rollout prefix
before the capture middleware sees the request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from nemo_gym.base_responses_api_model import (
    CaptureStore,
    ModelCallCaptureConfig,
    _reconstruct_streamed_response,
    aggregate_model_call_metrics,
    install_model_call_capture,
    merge_model_call_capture_into_record,
    model_call_capture_dirs_from_config,
    observability_enabled_from_config,
    read_model_call_records,
)
from nemo_gym.config_types import ROLLOUT_PATH_PREFIX, ModelServerRef
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import SyncClient
from nemo_gym.token_id_capture import current_capture_context

ADAPTER_SOURCE = """
from fastapi import Request

from nemo_gym.base_responses_api_model import (
    BaseResponsesAPIModelConfig,
    Body,
    SimpleResponsesAPIModel,
    start_model_execution,
)
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)


class CannedConfig(BaseResponsesAPIModelConfig):
    answer: str = "hello"


class CannedModel(SimpleResponsesAPIModel):
    config: CannedConfig

    async def responses(
        self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = Body()
    ) -> NeMoGymResponse:
        execution = start_model_execution(request, upstream_attempted=False)
        execution.update(response_source="local", local_response_reason="canned")
        if body.input == "fail":
            raise RuntimeError("engine fell over")
        return NeMoGymResponse.model_validate({
            "id": "resp_1", "created_at": 0, "model": "canned", "object": "response",
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "output": [
                {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": 1}'},
                {"id": "m1", "type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": self.config.answer, "annotations": []}]},
            ],
            "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10,
                      "input_tokens_details": {"cached_tokens": 2},
                      "output_tokens_details": {"reasoning_tokens": 1}},
        })

    async def chat_completions(
        self, body: NeMoGymChatCompletionCreateParamsNonStreaming = Body()
    ) -> NeMoGymChatCompletion:
        if body.messages[-1]["content"] == "slow":
            import asyncio

            await asyncio.sleep(0.3)
        if body.messages[-1]["content"] == "slow failure":
            import asyncio

            await asyncio.sleep(0.3)
            raise RuntimeError("engine fell over late")
        return NeMoGymChatCompletion.model_validate({
            "id": "chat_1", "created": 0, "model": "canned", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": self.config.answer}}],
        })


if __name__ == "__main__":
    import asyncio
    import sys

    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.server_utils import ServerClient
    from nemo_gym.serving.server import bind_socket

    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
        global_config_dict={"observability_enabled": True, "model_call_capture_dir": sys.argv[1]},
    )
    server = CannedModel(config={"name": "canned_model"}, server_client=client)
    sock = bind_socket("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    asyncio.run(server.serve(sock, register=False))
"""


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("canned_model")
    (folder / "canned_app.py").write_text(ADAPTER_SOURCE)
    sys.path.insert(0, str(folder))
    try:
        import canned_app

        yield folder, canned_app
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("canned_app", None)


def build(canned_app, global_config: dict):
    from unittest.mock import MagicMock

    client = MagicMock(spec=ServerClient, global_config_dict=global_config)
    return canned_app.CannedModel(config={"name": "canned_model"}, server_client=client)


def test_nemo_gym_adapter_is_served_by_fastapi_and_captures_per_rollout(adapter, tmp_path: Path) -> None:
    _, canned_app = adapter
    server = build(canned_app, {"observability_enabled": True, "model_call_capture_dir": str(tmp_path)})
    assert server.uses_setup_webserver() and server.nemo_gym_style()
    app = server.setup_webserver()
    assert isinstance(app, FastAPI)
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.post(f"/{ROLLOUT_PATH_PREFIX}/task-1/v1/responses", json={"input": "hi"})
        assert answer.status_code == 200 and answer.json()["output"][1]["content"][0]["text"] == "hello"
        chat = client.post(
            "/ng-rollout/task-1/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == "hello"
        streamed = client.post("/ng-rollout/task-1/v1/responses", json={"input": "hi", "stream": True})
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert "event: response.completed" in streamed.text
        failed = client.post("/ng-rollout/task-1/v1/responses", json={"input": "fail"})
        assert failed.status_code == 500
        # A body of the wrong shape: FastAPI's 422 naming the field, not a 500.
        bad = client.post("/ng-rollout/task-1/v1/chat/completions", json={"messages": "hi"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "messages"]
        # Without a rollout prefix nothing is recorded (no rollout to file it under).
        assert client.post("/v1/responses", json={"input": "hi"}).status_code == 200
        assert client.get("/v1/models").json()["data"][0]["id"] == "canned_model"

    calls = read_model_call_records(CaptureStore(tmp_path), "task-1")
    assert [c.dialect for c in calls] == ["responses", "chat", "responses", "responses", "chat"]
    first = calls[0]
    assert (first.tokens_in, first.tokens_out, first.tokens_total, first.tokens_reasoning) == (7, 3, 10, 1)
    assert (first.cache_hit, first.cached_tokens) == (True, 2)
    assert first.tool_calls == [{"call_id": "c1", "name": "lookup", "arguments": {"q": 1}}]
    assert (first.response_source, first.local_response_reason, first.upstream_attempted) == (
        "local",
        "canned",
        False,
    )
    assert first.model_ref == ModelServerRef(name="canned_model") and first.request == {"input": "hi"}
    assert calls[1].finish_reason == "stop" and calls[1].response_id == "chat_1"
    # The streamed call's answer is rebuilt from its events, the raw stream kept beside it.
    assert (
        calls[2].response is not None
        and calls[2].response["id"] == "resp_1"
        and calls[2].error_category is None
    )
    assert calls[2].response_raw is not None and calls[2].latency_ttft_ms is not None
    # The handler's exception passed through the capture on its way to FastAPI's 500.
    assert (calls[3].status_code, calls[3].error_category, calls[3].response) == (None, "exception", None)
    assert (calls[4].status_code, calls[4].error_category) == (422, "client_error")
    assert len({c.model_call_id for c in calls}) == 5
    metrics = aggregate_model_call_metrics(CaptureStore(tmp_path), "task-1")
    assert metrics["num_calls"] == 5 and metrics["tokens_in"] == 14  # the two complete Responses answers


def test_served_by_a_real_process_the_outer_prefix_strip_keeps_the_rollout(
    adapter, tmp_path: Path, monkeypatch
) -> None:
    folder, _ = adapter
    monkeypatch.delenv("NEMO_GYM_AUTH_TOKEN", raising=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(folder / "canned_app.py"), str(tmp_path)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        with SyncClient() as client:
            client.wait_healthy(url, timeout_s=30)
            # NeMo Gym's blocking liveness poll, which its proxy adapters wait on.
            peers = ServerClient(
                global_config_dict={
                    "canned": {"responses_api_models": {"c": {"host": "127.0.0.1", "port": port}}}
                }
            )
            assert peers.poll_for_status("canned") == "success"
            status, body = client.post(url + "/ng-rollout/r-7/v1/responses", {"input": "hi"})
            assert status == 200 and body["id"] == "resp_1"
            # NeMo Gym's training-token-capture segment routes the same (with the run's capture off,
            # an agent flag alone serves the call uncaptured, as NeMo Gym does).
            status, body = client.post(
                url + "/ng-rollout/r-7/training-token-capture/v1/responses", {"input": "hi"}
            )
            assert status == 200 and body["id"] == "resp_1"
            status, body = client.post(url + "/ng-rollout/r-7/v1/responses", {"input": 5})
            # Our OpenAI-shaped error answer, as for every model server.
            assert status == 422 and body["error"]["type"] == "invalid_request_error", body
    finally:
        proc.terminate()
        proc.wait(10)
    assert peers.poll_for_status("canned", timeout_seconds=2) == "connection_error"
    calls = read_model_call_records(CaptureStore(tmp_path), "r-7")
    assert [(c.dialect, c.status_code) for c in calls] == [
        ("responses", 200),
        ("responses", 200),
        ("responses", 422),
    ]


def test_our_own_model_servers_keep_the_lean_path() -> None:
    from responses_api_models.scripted_model.app import ScriptedModel

    server = ScriptedModel(config={"name": "scripted"})
    assert not server.nemo_gym_style() and not server.uses_setup_webserver()


def test_capture_store_refuses_unsafe_ids_and_survives_a_damaged_line(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "captures")
    for bad in ("../x", "a/b", "", "..", "naïve"):
        with pytest.raises(ValueError, match="Invalid rollout id"):
            store.path_for(bad)
    store.record("r1", {"dialect": "chat", "response": {"usage": {"prompt_tokens": 4}}})
    with store.path_for("r1").open("ab") as handle:
        handle.write(b"{not json\n")
    store.record("r1", {"dialect": "chat", "response": None})
    exchanges, bad_lines = store.read_available("r1")
    assert [i for i, _ in exchanges] == [0, 2] and bad_lines == 1

    row = {"_ng_task_index": 0, "_ng_rollout_index": 3, "reward": 1.0}
    store.record("0-3", {"dialect": "responses", "response": {"usage": {"input_tokens": 5}}})
    merged = merge_model_call_capture_into_record(dict(row), [store.root])
    capture = merged["ng_model_call_capture"]
    assert capture["rollout_id"] == "0-3" and capture["metrics"]["tokens_in"] == 5
    assert capture["metrics"]["tokens_out"] is None  # unknown, not zero
    assert "request" not in capture["calls"][0] and merged["reward"] == 1.0
    missing = merge_model_call_capture_into_record(
        {"_ng_task_index": 9, "_ng_rollout_index": 0}, [store.root]
    )
    assert missing["ng_model_call_capture"]["gaps"] == [{"code": "model_call_capture_no_records"}]
    store.mark_incomplete("0-3")
    assert {"code": "model_call_capture_incomplete"} in merge_model_call_capture_into_record(
        dict(row), [store.root]
    )["ng_model_call_capture"]["gaps"]


def test_capture_config_and_token_capture_refusal(tmp_path: Path) -> None:
    assert model_call_capture_dirs_from_config({}) == [] and not observability_enabled_from_config({})
    on = {"observability_enabled": True, "model_call_capture_dir": str(tmp_path)}
    assert model_call_capture_dirs_from_config(on) == [tmp_path] and observability_enabled_from_config(on)
    with pytest.raises(ValueError, match="model_call_capture_dir"):
        ModelCallCaptureConfig.model_validate({"observability_enabled": True})
    with pytest.raises(ValueError, match="absolute"):
        ModelCallCaptureConfig.model_validate(
            {"observability_enabled": True, "model_call_capture_dir": "rel"}
        )
    # Training-token capture asked for with nowhere to write: refused at start, naming the field.
    with pytest.raises(ValueError, match="token_id_capture.dir"):
        install_model_call_capture(
            FastAPI(), ModelCallCaptureConfig(), global_config_dict={"token_id_capture": {"enabled": True}}
        )
    assert current_capture_context() is None


def test_streamed_answers_are_rebuilt_in_each_dialect() -> None:
    chat = (
        b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"he"}}]}\n\n'
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"llo","tool_calls":[{"index":0,"id":"t",'
        b'"function":{"name":"f","arguments":"{\\"a\\":"}}]}}]}\n\n'
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]},'
        b'"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3}}\n\ndata: [DONE]\n\n'
    )
    rebuilt = _reconstruct_streamed_response(chat, "chat")
    assert rebuilt is not None
    message = rebuilt["choices"][0]["message"]
    assert message["content"] == "hello" and message["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    assert rebuilt["choices"][0]["finish_reason"] == "tool_calls" and rebuilt["usage"] == {"prompt_tokens": 3}
    events = [
        {
            "type": "message_start",
            "message": {"id": "m1", "role": "assistant", "model": "claude", "usage": {"input_tokens": 2}},
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "tu", "name": "f"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"x": 2}'},
        },
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 4}},
    ]
    raw = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    anthropic = _reconstruct_streamed_response(raw, "messages")
    assert anthropic is not None and anthropic["content"][0]["input"] == {"x": 2}
    assert anthropic["stop_reason"] == "tool_use" and anthropic["usage"] == {
        "input_tokens": 2,
        "output_tokens": 4,
    }
    assert _reconstruct_streamed_response(b"data: not json\n\n", "responses") is None


def test_nemo_gym_adapter_ingress_refuses_fields_openai_does_not_define(adapter) -> None:
    _, canned_app = adapter
    app = build(canned_app, {}).setup_webserver()
    with TestClient(app) as client:
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        # A provider extension NeMo Gym forwards is accepted; a misspelling is a 422 naming it.
        assert (
            client.post("/v1/chat/completions", json={**chat, "thinking": {"type": "adaptive"}}).status_code
            == 200
        )
        bad = client.post("/v1/chat/completions", json={**chat, "thinkng": {"type": "adaptive"}})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "thinkng"]
        assert client.post("/v1/responses", json={"input": "hi", "service_tier": "auto"}).status_code == 200
        assert (
            client.post("/v1/responses", json={"input": "hi", "required_prefix_token_ids": [1]}).status_code
            == 422
        )


def test_slow_streamed_chat_answer_keeps_the_stream_open(adapter, tmp_path: Path, monkeypatch) -> None:
    _, canned_app = adapter
    server = build(canned_app, {"observability_enabled": True, "model_call_capture_dir": str(tmp_path)})
    monkeypatch.setattr(type(server), "chat_keepalive_s", 0.05)
    with TestClient(server.setup_webserver()) as client:
        slow = {"messages": [{"role": "user", "content": "slow"}], "stream": True}
        text = client.post("/ng-rollout/k-1/v1/chat/completions", json=slow).text
        assert text.startswith(": keep-alive\n\n") and text.count(": keep-alive") >= 2
        assert '"content":"hello"' in text.replace(" ", "") and text.rstrip().endswith("data: [DONE]")
        # A failure after the stream began ends it with an error event, not a cut connection.
        late = client.post(
            "/ng-rollout/k-1/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "slow failure"}], "stream": True},
        )
        assert (
            late.status_code == 200 and "event: error" in late.text and "engine fell over late" in late.text
        )
    calls = read_model_call_records(CaptureStore(tmp_path), "k-1")
    assert calls[0].error_category is None and calls[0].response is not None
    assert calls[0].response["choices"][0]["message"]["content"] == "hello"
    # The keep-alive comments are not the first token.
    assert calls[0].latency_ttft_ms is not None and calls[0].latency_ttft_ms >= 250
    assert calls[1].error_category == "upstream_error"


def test_anthropic_messages_are_answered_through_responses(adapter, tmp_path: Path) -> None:
    _, canned_app = adapter
    server = build(canned_app, {"observability_enabled": True, "model_call_capture_dir": str(tmp_path)})
    request = {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(server.setup_webserver()) as client:
        answer = client.post("/ng-rollout/m-1/v1/messages", json=request)
        assert answer.status_code == 200, answer.text
        blocks = answer.json()["content"]
        assert {"type": "text", "text": "hello"}.items() <= next(
            b for b in blocks if b["type"] == "text"
        ).items()
        assert next(b for b in blocks if b["type"] == "tool_use")["input"] == {"q": 1}
        streamed = client.post("/ng-rollout/m-1/v1/messages", json={**request, "stream": True})
        assert "event: message_stop" in streamed.text
    calls = read_model_call_records(CaptureStore(tmp_path), "m-1")
    assert [c.dialect for c in calls] == ["messages", "messages"]
    assert calls[1].tool_calls == [
        {"call_id": calls[1].tool_calls[0]["call_id"], "name": "lookup", "arguments": {"q": 1}}
    ]
    assert calls[1].error_category is None


def test_poll_for_status_learns_a_port_0_peer_from_the_head_server() -> None:
    """NeMo Gym assigns every port up front; ours bind port 0, so a peer's block lacks host/port
    until it registers (xstest polls its judge from setup_webserver): not registered yet is
    'connection_error', registered is looked up on the head server and kept in the config."""
    import http.server
    import threading

    listed: list = []

    class Head(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps(listed).encode()
            self.send_response(200 if self.path == "/server_instances" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    head = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Head)
    threading.Thread(target=head.serve_forever, daemon=True).start()
    try:
        port = head.server_address[1]
        peers = ServerClient(
            head_server_config={"host": "127.0.0.1", "port": port},
            global_config_dict={"judge": {"responses_api_models": {"j": {"entrypoint": "app.py"}}}},
        )
        assert peers.poll_for_status("judge") == "connection_error"
        listed.append({"name": "judge", "url": f"http://127.0.0.1:{port}"})
        assert peers.poll_for_status("judge") == "success"
        assert peers.global_config_dict["judge"]["responses_api_models"]["j"]["port"] == port
    finally:
        head.shutdown()


def test_a_non_2xx_answer_is_an_aiohttp_client_response_error_that_can_be_built() -> None:
    """HTTPStatusError is both our ServerCallError and aiohttp's ClientResponseError (whose
    __init__ wants request_info and history): building one must not call the latter
    (scicode_agent's raise_for_status died with a TypeError on every non-2xx verify)."""
    import pickle

    import aiohttp

    from nemo_gym.serving.nemo_gym_client import HTTPStatusError

    error = HTTPStatusError("scicode", "/verify", 500, b'{"error": "boom"}')
    assert isinstance(error, aiohttp.ClientResponseError) and error.status == 500
    assert str(error) == "scicode/verify: HTTP 500: boom" and error.response_content == b'{"error": "boom"}'
    assert pickle.loads(pickle.dumps(error)).status == 500


def test_nemo_gyms_base_url_cache_points_a_name_at_a_server() -> None:
    """NeMo Gym's tests point a name at a server they started through the client's private
    ``_server_base_urls`` (genrm_compare's HTTP lifecycle tests): here it fills the static URLs."""
    import asyncio

    client = ServerClient(global_config_dict={})
    client._server_base_urls["judge"] = "http://127.0.0.1:9/"
    assert asyncio.run(client.resolve("judge")) == ["http://127.0.0.1:9"]
    assert dict(client._server_base_urls) == {"judge": "http://127.0.0.1:9"}


def test_a_server_named_through_the_base_url_cache_is_called_with_plain_paths() -> None:
    """A server a NeMo Gym test started itself (a plain FastAPI policy) knows nothing of our
    ``/ng-rollout/<id>`` prefix, and NeMo Gym's client never adds it without capture: a rollout's
    calls to a name set through ``_server_base_urls`` go to the plain path, while a URL given
    as the client's static URLs (one of our servers) keeps the prefix."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from nemo_gym.testing import running_app

    seen: list[str] = []

    async def anything(request: Request) -> JSONResponse:
        seen.append(request.url.path)
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/{path:path}", anything, methods=["POST"])])

    async def call(client: ServerClient) -> int:
        try:
            return (await client.rollout().post("policy", "/v1/responses", {})).status
        finally:
            await client.close()

    with running_app(app) as url:
        by_cache = ServerClient(global_config_dict={})
        by_cache._server_base_urls["policy"] = url
        assert asyncio.run(call(by_cache)) == 200
        assert seen == ["/v1/responses"]
        ours = ServerClient(static_urls={"policy": url})
        assert asyncio.run(call(ours)) == 200
        assert seen[1].startswith(f"/{ROLLOUT_PATH_PREFIX}/") and seen[1].endswith("/v1/responses")
        del by_cache._server_base_urls["policy"]
        assert url not in by_cache._external


def test_a_server_client_mock_without_a_config_is_no_config() -> None:
    """NeMo Gym 0.4.0's model adapters' tests build servers on ``MagicMock()`` clients, whose
    ``global_config_dict`` is a mock: that is no config, not a ValidationError."""
    from unittest.mock import MagicMock

    from omegaconf import OmegaConf

    from nemo_gym.models.fastapi_dispatch import plain_config

    assert plain_config(MagicMock().global_config_dict) is None
    assert plain_config(OmegaConf.create({"a": {"b": 1}})) == {"a": {"b": 1}}
    assert plain_config({"a": 1}) == {"a": 1}


def test_a_nemo_gym_style_call_fails_with_the_aiohttp_errors_nemo_gym_code_catches() -> None:
    """NeMo Gym's environments retry a judge call on aiohttp's ClientPayloadError (an answer cut
    mid-body) and ClientConnectionError (genrm_compare): through NeMo Gym's client shape those are
    the errors raised, still our ServerCallError of kind unreachable."""
    import asyncio
    import socket

    import aiohttp

    from nemo_gym.server_utils import ServerClient as NeMoGymClient
    from nemo_gym.serving.server_client import ServerCallError

    async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"output":'
        )
        await writer.drain()
        writer.close()

    async def scenario() -> list[BaseException]:
        server = await asyncio.start_server(cut_short, "127.0.0.1", 0)
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))  # reserved, never listening
        client = NeMoGymClient(global_config_dict={})
        client._server_base_urls["judge"] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        client._server_base_urls["gone"] = f"http://127.0.0.1:{closed.getsockname()[1]}"
        client.connect_retries = 0
        errors: list[BaseException] = []
        try:
            for name in ("judge", "gone"):
                try:
                    await client.post(server_name=name, url_path="/v1/responses", json={})
                except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
                    errors.append(exc)
        finally:
            await client.close()
            server.close()
            closed.close()
        return errors

    cut, gone = asyncio.run(scenario())
    assert isinstance(cut, aiohttp.ClientPayloadError) and isinstance(cut, ServerCallError)
    assert cut.kind == "unreachable" and "ClientPayloadError" in type(cut).__name__
    assert isinstance(gone, aiohttp.ClientConnectionError) and not isinstance(
        gone, aiohttp.ClientPayloadError
    )
    assert isinstance(gone, ServerCallError) and gone.kind == "unreachable"
