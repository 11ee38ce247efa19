"""A NeMo Gym-style agent's typed bodies and a handler's exception, as NeMo Gym's agents expect.

NeMo Gym's agents (``tool_simulation_agent``) read ``body.responses_create_params`` as its typed
model and post it on as it is; build their verify request from the model's answer (a body that
is not a response fails validation); and their tests expect a handler's exception to come out of
starlette's ``TestClient`` as FastAPI lets it. Our error answers stay what they are on a real
socket: a classified JSON error on a connection that stays open.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from pydantic import ConfigDict, ValidationError

from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyRequest
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.openai_utils import NeMoGymEasyInputMessage, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.serving.protocol import auth_headers
from nemo_gym.testing import running_server


class EchoRunRequest(BaseRunRequest):
    model_config = ConfigDict(extra="allow")


class EchoVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")


class TypedAgent(SimpleResponsesAPIAgent):
    """Answers what a NeMo Gym agent sees of its ``/run`` body; fails as the row asks."""

    config: BaseResponsesAPIAgentConfig

    async def run(self, body: EchoRunRequest) -> dict[str, Any]:
        params = body.responses_create_params
        fail = body.model_extra.get("fail") if body.model_extra else None
        if fail == "runtime":
            raise RuntimeError("the agent broke")
        if fail == "verify_request":  # a model "answer" that is no response
            EchoVerifyRequest.model_validate(body.model_dump() | {"response": {"id": "no_model"}})
        return {
            "typed": isinstance(params, NeMoGymResponseCreateParamsNonStreaming),
            "equals_model": params
            == NeMoGymResponseCreateParamsNonStreaming(
                input=[NeMoGymEasyInputMessage(role="user", content="hi")]
            ),
            "get_input": params.get("input"),
        }


ROW = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}}


def typed_agent() -> TypedAgent:
    return TypedAgent(config={"name": "typed_agent"})


def test_run_body_params_are_the_typed_model_and_still_read_as_a_dict() -> None:
    with running_server(typed_agent()) as url:
        status, answer = post(url, "/run", ROW)
    assert status == 200, answer
    assert answer == {
        "typed": True,
        "equals_model": True,
        "get_input": [{"role": "user", "content": "hi"}],  # as sent
    }


def test_a_bad_run_body_is_still_a_422_naming_the_field() -> None:
    with running_server(typed_agent()) as url:
        status, answer = post(url, "/run", {"responses_create_params": {"input": 5}})
    assert status == 422
    assert "responses_create_params" in answer["error"] and answer["server"] == "typed_agent"


def test_a_verify_request_needs_a_response_not_just_an_id() -> None:
    with pytest.raises(ValidationError, match="EchoVerifyRequest"):
        EchoVerifyRequest.model_validate({**ROW, "response": {"id": "no_model"}})
    # A response given by its output alone is still one (the envelope is filled in).
    request = EchoVerifyRequest.model_validate({**ROW, "response": {"output": []}})
    assert request.response.output == []
    assert EchoVerifyRequest.model_validate({**ROW, "response": {}}).response.output == []


@pytest.mark.parametrize(("fail", "error"), [("runtime", RuntimeError), ("verify_request", ValidationError)])
def test_test_client_raises_a_handlers_exception(fail: str, error: type[Exception]) -> None:
    client = TestClient(typed_agent().setup_webserver())
    with pytest.raises(error):
        client.post("/run", json={**ROW, "fail": fail})
    # Asked not to raise, the client gets our classified JSON answer.
    answered = TestClient(typed_agent().setup_webserver(), raise_server_exceptions=False)
    response = answered.post("/run", json={**ROW, "fail": fail})
    assert response.status_code == (500 if fail == "runtime" else 422)
    assert response.json()["server"] == "typed_agent"


def test_a_real_socket_gets_the_json_answer_on_a_connection_kept_open() -> None:
    with running_server(typed_agent()) as url:
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            status, answer = request(conn, "/run", {**ROW, "fail": "runtime"})
            assert status == 500
            assert answer == {"error": "RuntimeError: the agent broke", "server": "typed_agent"}
            sock = conn.sock
            assert sock is not None
            # The same connection answers the next request: an exception escaping to uvicorn
            # after the answer would have closed it.
            status, answer = request(conn, "/run", ROW)
            assert status == 200 and answer["typed"] is True
            assert conn.sock is sock
        finally:
            conn.close()


def request(conn: http.client.HTTPConnection, path: str, body: Any) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **auth_headers()}
    conn.request("POST", path, body=json.dumps(body), headers=headers)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def post(url: str, path: str, body: Any) -> tuple[int, Any]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        return request(conn, path, body)
    finally:
        conn.close()
