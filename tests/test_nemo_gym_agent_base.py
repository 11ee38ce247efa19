"""NeMo Gym's agent-side helpers on our agent base: rollout-correlated paths and model URLs.

NeMo Gym agents route their downstream calls through ``url_path_for_run`` (a ``/run`` body),
``url_path_for_request`` (an inbound request), ``base_url_for_run`` and
``resolve_model_base_url``; a rollout's prefix is added only when the run records model calls
(``observability_enabled``) or captures training token IDs for this agent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from fastapi import Body, FastAPI, Request, Response
from omegaconf import OmegaConf

from nemo_gym import server_utils
from nemo_gym.base_responses_api_agent import (
    AgentCloseSessionResponse,
    AgentSeedSessionRequest,
    AgentSessionState,
    AggregateMetricsRequest,
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
)
from nemo_gym.config_types import AggregateMetricsRequest as ConfigAggregateMetricsRequest
from nemo_gym.config_types import OmegaConf as ConfigOmegaConf
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import SyncClient, running_server

RUN_BODY = {"responses_create_params": {"input": "hi"}, "_ng_task_index": 4, "_ng_rollout_index": 1}
MODEL_BLOCK = {
    "policy_model": {"responses_api_models": {"openai_model": {"host": "127.0.0.1", "port": 8123}}}
}


class PathAgent(SimpleResponsesAPIAgent):
    """A NeMo Gym-style agent whose route answers the downstream path it would call."""

    config: BaseResponsesAPIAgentConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/downstream_path")(self.downstream_path)
        return app

    async def downstream_path(self, request: Request, body: dict = Body()) -> dict:  # noqa: B008 - FastAPI's style
        return {"path": self.url_path_for_request("/v1/responses", request)}


def agent(global_config: dict[str, Any], **config: Any) -> PathAgent:
    client = ServerClient(head_server_config=None, global_config_dict=OmegaConf.create(global_config))
    return PathAgent(config={"name": "path_agent", **config}, server_client=client)


def test_no_prefix_unless_a_capture_is_enabled() -> None:
    plain = agent({})
    assert plain.rollout_id_from_run(RUN_BODY) is None
    assert plain.url_path_for_run("/v1/responses", RUN_BODY) == "/v1/responses"
    assert plain.base_url_for_run("http://m:1", RUN_BODY) == "http://m:1"


def test_observability_prefixes_every_call_of_the_rollout() -> None:
    observed = agent({"observability_enabled": True})
    assert observed.rollout_id_from_run(RUN_BODY) == "4-1"
    assert observed.url_path_for_run("/v1/responses", RUN_BODY) == "/ng-rollout/4-1/v1/responses"
    assert observed.base_url_for_run("http://m:1/", RUN_BODY) == "http://m:1/ng-rollout/4-1"
    # An explicit rollout id wins over the indices; a retry's attempt is part of it.
    body = {**RUN_BODY, "_ng_rollout_id": "r9", "_ng_attempt_index": 2}
    assert observed.url_path_for_run("/x", body) == "/ng-rollout/r9-a2/x"
    # A body naming no rollout leaves the path alone.
    assert observed.url_path_for_run("/x", {"responses_create_params": {}}) == "/x"


def test_token_capture_needs_the_run_switch_and_the_agent_or_all_agents() -> None:
    capture = {"token_id_capture": {"enabled": True}}
    assert agent(capture).url_path_for_run("/v1/responses", RUN_BODY) == "/v1/responses"
    opted_in = agent(capture, token_id_capture=True)
    assert (
        opted_in.url_path_for_run("/v1/responses", RUN_BODY)
        == "/ng-rollout/4-1/training-token-capture/v1/responses"
    )
    everyone = agent({"token_id_capture": {"enabled": True, "all_agents": True}})
    assert (
        everyone.base_url_for_run("http://m:1", RUN_BODY)
        == "http://m:1/ng-rollout/4-1/training-token-capture"
    )
    switched_off = agent({"token_id_capture": {"enabled": False, "all_agents": True}}, token_id_capture=True)
    assert switched_off.url_path_for_run("/v1/responses", RUN_BODY) == "/v1/responses"


def test_resolve_model_base_url_reads_the_global_config() -> None:
    observed = agent(MODEL_BLOCK)
    assert observed.resolve_model_base_url("policy_model") == "http://127.0.0.1:8123/v1"
    assert observed.resolve_model_base_url("policy_model", "7-0") == "http://127.0.0.1:8123/ng-rollout/7-0/v1"
    # The client's URL builder is the one NeMo Gym's tests patch.
    assert (
        ServerClient._build_server_base_url(observed.server_client, {"host": "h", "port": 1}) == "http://h:1"
    )


def test_url_path_for_request_carries_the_inbound_prefix_through_a_real_server() -> None:
    with running_server(agent({})) as url, SyncClient() as client:
        assert client.post(url + "/downstream_path", {}) == (200, {"path": "/v1/responses"})
        # Our servers strip the prefix before routing; the handler still sees the rollout.
        assert client.post(url + "/ng-rollout/r7/downstream_path", {}) == (
            200,
            {"path": "/ng-rollout/r7/v1/responses"},
        )


def test_re_exported_names() -> None:
    assert AggregateMetricsRequest is ConfigAggregateMetricsRequest
    assert ConfigOmegaConf is OmegaConf


def test_request_debug_flag_follows_the_global_client() -> None:
    async def setup() -> None:
        server_utils.set_global_aiohttp_client(
            server_utils.GlobalAIOHTTPAsyncClientConfig(global_aiohttp_client_request_debug=True)
        )

    assert server_utils.is_global_aiohttp_client_request_debug_enabled() is False
    asyncio.run(setup())
    try:
        assert server_utils.is_global_aiohttp_client_request_debug_enabled() is True
    finally:
        server_utils.global_aiohttp_client_exit()
    assert server_utils.is_global_aiohttp_client_request_debug_enabled() is False


class SessionAgent(SimpleResponsesAPIAgent):
    """A NeMo Gym-style agent: FastAPI-bound ``responses`` and agent sessions."""

    config: BaseResponsesAPIAgentConfig

    async def responses(self, request: Request, response: Response, body: dict = Body()) -> dict:  # noqa: B008
        session_id = self._agent_session_id_from_request(request)
        if session_id is not None:
            self._require_agent_session(session_id).request  # noqa: B018 - 409 when closed
        response.set_cookie("seen", "1")
        return {"rollout_id": request.path_params.get("rollout_id"), "session": session_id}

    async def _seed_agent_session_state(self, body: AgentSeedSessionRequest) -> AgentSessionState:
        return AgentSessionState(request=body)

    async def _close_agent_session_state(self, state: AgentSessionState) -> AgentCloseSessionResponse:
        return AgentCloseSessionResponse(agent_session_id=state.request.agent_session_id)


def test_fastapi_bound_responses_and_agent_sessions_through_a_real_server() -> None:
    episode = {"rollout_id": "4-1"}
    seed = {"agent_session_id": "s1", "episode_id": episode, "task_id": {"taskset": "env:x", "task_id": "t1"}}
    with running_server(SessionAgent(config={"name": "s"})) as url, SyncClient() as client:
        assert client.post(url + "/v1/responses", {"input": "hi"}) == (
            200,
            {"rollout_id": None, "session": None},
        )
        # The prefix is stripped before routing, its id kept where NeMo Gym handlers read it.
        assert client.post(url + "/ng-rollout/r3/v1/responses", {})[1]["rollout_id"] == "r3"
        assert client.post(url + "/v1/agent_sessions", seed) == (200, {"agent_session_id": "s1"})
        assert client.post(url + "/v1/agent_sessions", seed)[0] == 200  # the same seed again
        assert client.post(url + "/v1/responses", {})[1]["session"] == "s1"  # the cookie names it
        status, body = client.post(
            url + "/v1/agent_sessions", {**seed, "task_id": {"taskset": "env:x", "task_id": "t2"}}
        )
        assert status == 409 and "session cookie" not in body["error"]
        close = {"agent_session_id": "s1", "episode_id": episode}
        assert client.post(url + "/v1/agent_sessions/close", close)[1]["agent_session_id"] == "s1"
        assert client.post(url + "/v1/agent_sessions/close", close)[0] == 200  # a retried close
        assert client.post(url + "/v1/responses", {})[0] == 409  # a closed session does not run
        assert client.post(url + "/v1/agent_sessions", {"agent_session_id": ""})[0] == 422


def test_request_labels_its_destination_and_bounds_retries(monkeypatch) -> None:
    from nemo_gym.telemetry import connection_pool

    seen: list[tuple[str, str]] = []

    class Client:
        async def request(self, method: str, url: str, **kwargs: object) -> str:
            seen.append((connection_pool.current_server_name(), url))
            if len(seen) == 1:
                raise aiohttp.ServerDisconnectedError()
            return "answer"

    monkeypatch.setattr(server_utils, "get_global_aiohttp_client", lambda: Client())
    answer = asyncio.run(server_utils.request("POST", "http://x/y", _server_name="remote", json={"a": 1}))
    assert answer == "answer" and seen == [("remote", "http://x/y")] * 2
    assert connection_pool.current_server_name() == "external"  # restored after the call
    seen.clear()
    with pytest.raises(aiohttp.ServerDisconnectedError):
        asyncio.run(server_utils.request("GET", "http://x/z", _max_connection_retries=1))
    assert seen == [("external", "http://x/z")]


def test_profiler_writes_its_files(tmp_path) -> None:
    from nemo_gym.profiling import Profiler

    with pytest.raises(ValueError, match="spaces"):
        Profiler(name="a b", base_profile_dir=tmp_path)
    profiler = Profiler(
        name="run-1", base_profile_dir=tmp_path / "prof", required_str="test_nemo_gym_agent_base"
    )
    profiler.start()
    sorted(range(1000), key=lambda n: -n)
    profiler.stop()
    log = (tmp_path / "prof" / "run-1.log").read_text()
    assert "test_nemo_gym_agent_base" in log and "ncalls" in log
    assert (tmp_path / "prof" / "run-1.prof").stat().st_size > 0


def test_server_client_model_construct_as_nemo_gym_tests_build_it() -> None:
    client = ServerClient.model_construct(global_config_dict=MODEL_BLOCK)
    assert isinstance(client, ServerClient) and client.global_config_dict == MODEL_BLOCK
    assert PathAgent(config={"name": "a"}, server_client=client).resolve_model_base_url("policy_model") == (
        "http://127.0.0.1:8123/v1"
    )


class MetricsAgent(SimpleResponsesAPIAgent):
    """An agent with NeMo Gym's metric hooks: it aggregates itself, never forwarding."""

    config: BaseResponsesAPIAgentConfig

    def compute_metrics(self, tasks: list[list[dict]]) -> dict:
        # NeMo Gym's shape: a list of per-task dicts naming their task index.
        return {"task_count": len(tasks), "per_task_metrics": [{"_ng_task_index": 1, "hard": True}]}

    def get_key_metrics(self, agent_metrics: dict) -> dict:
        return {"task_count": agent_metrics["task_count"]}


def test_agent_metric_hooks_directly_and_through_a_real_server() -> None:
    rows = [
        {"_ng_task_index": t, "_ng_rollout_index": r, "reward": float(t == r)} for t in (0, 1) for r in (0, 1)
    ]
    # A resources server is configured but never called: the hooks make the agent aggregate.
    metrics_agent = MetricsAgent(
        config={"name": "m", "resources_server": {"type": "resources_servers", "name": "x"}}
    )
    answer = asyncio.run(metrics_agent.aggregate_metrics(AggregateMetricsRequest(verify_responses=rows)))
    assert answer.agent_metrics["task_count"] == 2 and answer.key_metrics == {"task_count": 2}
    assert answer.agent_metrics["mean/reward"] == 0.5
    groups = {group["_ng_task_index"]: group for group in answer.group_level_metrics}
    assert groups[1]["hard"] is True and "hard" not in groups[0]
    with running_server(metrics_agent) as url, SyncClient() as client:
        status, body = client.post(url + "/aggregate_metrics", {"verify_responses": rows})
        assert (status, body["key_metrics"]) == (200, {"task_count": 2})


def test_a_mocked_client_reads_as_its_global_config_dict() -> None:
    from unittest.mock import MagicMock

    client = MagicMock(spec=ServerClient)  # as NeMo Gym agents' tests build their client
    client.global_config_dict = {"observability_enabled": False}
    mocked = PathAgent(config={"name": "m"}, server_client=client)
    assert mocked.url_path_for_run("/v1/responses", RUN_BODY) == "/v1/responses"
    client.global_config_dict = {"observability_enabled": True}
    assert mocked.url_path_for_run("/v1/responses", RUN_BODY) == "/ng-rollout/4-1/v1/responses"


def test_resolve_model_base_url_asks_the_head_server_when_the_config_has_no_address() -> None:
    """A model server started on port 0 has no address in the config its peers were launched
    with; the head server's registry has it (NeMo Gym's verifiers_agent resolves this way)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from nemo_gym.testing import running_app

    instances = [{"name": "policy_model", "url": "http://127.0.0.1:8999", "host": "127.0.0.1", "port": 8999}]
    head = Starlette(routes=[Route("/server_instances", lambda request: JSONResponse(instances))])
    unaddressed = {"policy_model": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py"}}}}
    with running_app(head) as head_url:
        client = ServerClient(head_url=head_url, global_config_dict=unaddressed)
        observed = PathAgent(config={"name": "a"}, server_client=client)
        assert observed.resolve_model_base_url("policy_model") == "http://127.0.0.1:8999/v1"
        with pytest.raises(ValueError, match="no server named 'judge' is registered"):
            client.registered_base_url("judge")
