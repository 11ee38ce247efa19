"""The server base on real loopback sockets: liveness, errors, validation, limits, sessions, auth."""

import asyncio
import os
import time

import pytest
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.serving.server import ENV_AUTH_TOKEN, HTTPError, SessionStore
from nemo_gym.testing import SyncClient, running_server


class AddRequest(BaseModel):
    amount: int


class CounterServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    async def seed_session(self, body):  # noqa: ANN001 - plain override
        self.session["count"] = int(body.model_dump().get("start", 0))
        return {}

    @tool
    async def add(self, body: AddRequest) -> dict:
        self.session["count"] = self.session.get("count", 0) + body.amount
        return {"count": self.session["count"]}

    @tool
    async def where(self, body: dict) -> dict:
        return {"rollout_id": self.rollout_id}

    @tool
    async def remember_in_thread(self, body: dict) -> dict:
        # State opened off the event loop (CPU-heavy tools do this) must still get its cookie.
        await asyncio.to_thread(lambda: self.session.__setitem__("note", body["note"]))
        return {}

    @tool
    async def recall(self, body: dict) -> dict:
        return {"note": self.session.get("note")}

    @tool
    async def explode(self, body: dict) -> dict:
        raise RuntimeError("boom")

    @tool
    async def teapot(self, body: dict) -> dict:
        raise HTTPError(418, "short and stout")

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=float(self.session.get("count", 0)))


def make_server(**config):
    return CounterServer({"name": "counter", "max_body_bytes": 4096, **config})


def test_liveness_tools_and_session_cookie_flow():
    server = make_server()
    with running_server(server) as url, SyncClient() as client:
        assert client.get(url + "/") == (200, {"status": "ok", "server": "counter"})
        assert client.post(url + "/seed_session", {"responses_create_params": {}, "start": 10})[0] == 200
        assert client.post(url + "/add", {"amount": 5}) == (200, {"count": 15})
        status, verified = client.post(
            url + "/verify", {"responses_create_params": {}, "response": {}, "start": 10, "extra": [1]}
        )
        assert status == 200 and verified["reward"] == 15.0
        assert (
            "extra" not in verified and "start" not in verified
        )  # the answer holds its declared fields (NeMo Gym's)
        assert len(server.sessions) == 0  # freed after verify


def test_two_rollouts_never_share_state():
    server = make_server()
    with running_server(server) as url, SyncClient() as a, SyncClient() as b:
        a.post(url + "/seed_session", {"start": 1})
        b.post(url + "/seed_session", {"start": 100})
        a.post(url + "/add", {"amount": 1})
        b.post(url + "/add", {"amount": 1})
        assert a.post(url + "/verify", {"response": {}})[1]["reward"] == 2.0
        assert b.post(url + "/verify", {"response": {}})[1]["reward"] == 101.0


def test_invalid_body_gets_422_with_field_path_and_server_name():
    with running_server(make_server()) as url, SyncClient() as client:
        status, body = client.post(url + "/add", {"amount": "many"})
        assert status == 422
        assert body["server"] == "counter"
        assert body["detail"][0]["field"] == "amount"
        assert "amount" in body["error"]
        status, body = client.post(url + "/add", raw=b"{not json")
        assert status == 400 and "not valid JSON" in body["error"]


def test_errors_are_json_and_name_the_server():
    with running_server(make_server()) as url, SyncClient() as client:
        assert client.post(url + "/explode", {}) == (
            500,
            {"error": "RuntimeError: boom", "server": "counter"},
        )
        assert client.post(url + "/teapot", {}) == (418, {"error": "short and stout", "server": "counter"})


def test_body_size_limit():
    with running_server(make_server()) as url, SyncClient() as client:
        status, body = client.post(url + "/add", {"amount": 1, "pad": "x" * 10_000})
        assert status == 413 and "limit" in body["error"]


def test_rollout_prefix_is_stripped_and_exposed():
    with running_server(make_server()) as url, SyncClient() as client:
        assert client.post(url + "/ng-rollout/r-42/where", {}) == (200, {"rollout_id": "r-42"})
        assert client.post(url + "/where", {}) == (200, {"rollout_id": None})


def test_auth_token_required_when_set(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ENV_AUTH_TOKEN, "s3cret")
    server = make_server()
    with running_server(server) as url:
        with SyncClient() as client:  # picks the token up from the environment
            assert client.get(url + "/")[0] == 200
        monkeypatch.delenv(ENV_AUTH_TOKEN)
        with SyncClient() as client:
            status, body = client.get(url + "/")
            assert status == 401 and "auth token" in body["error"]
    assert os.environ.get(ENV_AUTH_TOKEN) is None


def test_session_store_ttl_and_bound():
    store = SessionStore(ttl_s=0.05, max_sessions=2)
    store.get("a")["x"] = 1
    assert store.get("a") == {"x": 1}
    time.sleep(0.08)
    assert store.get("a", create=False) is None  # expired
    store.get("b")
    store.get("c")
    store.get("d")
    assert len(store) == 2 and store.get("b", create=False) is None  # oldest evicted


def test_unknown_route_and_wrong_method_are_json_naming_the_server():
    with running_server(make_server()) as url, SyncClient() as client:
        assert client.post(url + "/no_such_tool", {}) == (
            404,
            {"error": "no route POST /no_such_tool", "server": "counter"},
        )
        status, body = client.get(url + "/verify")
        assert status == 405 and body["server"] == "counter"


def test_cookie_only_when_state_is_opened_even_from_a_thread():
    with running_server(make_server()) as url, SyncClient() as client:
        client.post(url + "/where", {})
        assert client.cookies.get(url, {}) == {}  # a stateless call sets no cookie
        client.post(url + "/remember_in_thread", {"note": "kept"})
        assert client.post(url + "/recall", {}) == (200, {"note": "kept"})


def test_session_ids_are_random_128_bit_hex_and_never_repeat():
    store = SessionStore()
    ids = [store.new_id() for _ in range(2000)]  # several draws of random bytes
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len({SessionStore().new_id() for _ in range(50)}) == 50
