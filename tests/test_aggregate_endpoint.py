"""/aggregate_metrics over real HTTP: one verify response per line streams through agent and
environment in bounded memory; NeMo Gym's compact body still works; errors name the line."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer
from nemo_gym.collection.aggregate_endpoint import line_layout_chunks
from nemo_gym.collection.metrics import compute_aggregate_metrics
from nemo_gym.testing import SyncClient, running_agent, running_server
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.scripted_model.app import ScriptedModel
from tests.test_streaming_metrics import mixed_rows


class QuizEnv(SimpleResourcesServer):
    """Majority voting on ``extracted_answer``; its own key metric on top of the default ones."""

    answer_field = "extracted_answer"

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)

    def get_key_metrics(self, agent_metrics: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
        return {**default, "quiz/max_reward": agent_metrics.get("max/reward", 0.0)}


class OwnMetricsEnv(QuizEnv):
    """An environment with its own compute_metrics: it receives every row as a list."""

    def compute_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        assert isinstance(verify_responses, list)
        return {
            "agent_metrics": {"rows": len(verify_responses)},
            "key_metrics": {},
            "group_level_metrics": [],
        }


def expected_for(rows: list[dict[str, Any]]) -> dict[str, Any]:
    metrics = compute_aggregate_metrics(rows, answer_field="extracted_answer")
    metrics["key_metrics"]["quiz/max_reward"] = metrics["agent_metrics"].get("max/reward", 0.0)
    return orjson.loads(orjson.dumps(metrics))  # type: ignore[no-any-return]


def post_raw(url: str, body: bytes) -> tuple[int, Any]:
    async def call() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                return resp.status, orjson.loads(await resp.read())

    return asyncio.run(call())


def line_body(rows: list[dict[str, Any]], tmp_path: Path) -> bytes:
    spool = tmp_path / "rows.jsonl"
    spool.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return b"".join(line_layout_chunks(spool))


@pytest.fixture(scope="module")
def agent_url() -> Any:
    env = QuizEnv({"name": "env", "max_body_bytes": 20_000})
    with running_agent(env, ScriptedModel({"name": "model"}), agent_class=SimpleAgent) as url:
        yield url


def test_line_layout_through_the_agent_equals_the_list_computation(agent_url: str, tmp_path: Path) -> None:
    rows = mixed_rows(3, 400)
    body = line_body(rows, tmp_path)
    assert len(body) > 20_000  # past the env's max_body_bytes: only the line layout gets through
    status, answer = post_raw(agent_url + "/aggregate_metrics", body)
    assert status == 200, answer
    assert answer == expected_for(rows)
    assert orjson.loads(body) == {"verify_responses": rows}  # the layout is plain JSON


def test_compact_body_within_the_limit_gives_the_same_answer(agent_url: str) -> None:
    rows = mixed_rows(4, 40)
    with SyncClient() as client:
        status, answer = client.post(agent_url + "/aggregate_metrics", {"verify_responses": rows})
    assert status == 200, answer
    assert answer == expected_for(rows)


def test_compact_body_past_the_limit_is_a_413_that_says_how_to_send_it(agent_url: str) -> None:
    rows = mixed_rows(3, 400)
    status, answer = post_raw(agent_url + "/aggregate_metrics", orjson.dumps({"verify_responses": rows}))
    assert status == 413
    assert "one verify response per line" in answer["error"] and answer["server"] == "env"


def test_empty_and_malformed_bodies(agent_url: str, tmp_path: Path) -> None:
    status, answer = post_raw(agent_url + "/aggregate_metrics", line_body([], tmp_path))
    assert (status, answer) == (200, expected_for([]))
    rows = mixed_rows(5, 40)
    lines = line_body(rows, tmp_path).split(b"\n")
    lines[3] = b'{"reward": 1.0,,'
    status, answer = post_raw(agent_url + "/aggregate_metrics", b"\n".join(lines))
    assert status == 400 and "line 4" in answer["error"], answer
    lines[3] = b"[1, 2],"
    status, answer = post_raw(agent_url + "/aggregate_metrics", b"\n".join(lines))
    assert status == 422 and "verify_responses.2" in answer["error"], answer  # small: parsed whole
    status, answer = post_raw(agent_url + "/aggregate_metrics", b'{"verify_responses": 3}')
    assert status == 422 and "verify_responses" in answer["error"], answer


def test_an_environment_with_its_own_compute_metrics_gets_a_list(tmp_path: Path) -> None:
    with running_server(OwnMetricsEnv({"name": "env"})) as url:
        rows = mixed_rows(6, 40)
        status, answer = post_raw(url + "/aggregate_metrics", line_body(rows, tmp_path))
        assert (status, answer["agent_metrics"]) == (200, {"rows": len(rows)})
        with SyncClient() as client:
            status, answer = client.post(url + "/aggregate_metrics", {"verify_responses": rows})
        assert (status, answer["agent_metrics"]) == (200, {"rows": len(rows)})


def test_aggregate_metrics_bodies_get_their_own_upload_deadline() -> None:
    """A million rows take longer to upload than the per-request body deadline: that path has its own."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    from nemo_gym.serving.request_guard import RequestGuard
    from nemo_gym.serving.server import (
        AGGREGATE_BODY_TIMEOUT_S,
        bind_socket,
        json_error_handlers,
        make_uvicorn_server,
    )

    async def read_all(request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"bytes": len(await request.body())})

    routes = [
        Route("/aggregate_metrics", read_all, methods=["POST"]),
        Route("/verify", read_all, methods=["POST"]),
    ]
    guard = RequestGuard(
        Starlette(routes=routes, exception_handlers=json_error_handlers("env")),
        "env",
        1 << 20,
        body_timeout_s=0.3,
        path_body_timeouts={"/aggregate_metrics": 10},
    )

    async def slow_body() -> Any:
        for _ in range(6):
            yield b" " * 100
            await asyncio.sleep(0.15)
        yield b"{}"

    async def run() -> dict[str, int]:
        sock = bind_socket("127.0.0.1", 0)
        server = make_uvicorn_server(guard, embedded=True)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        statuses = {}
        async with aiohttp.ClientSession() as http:
            for path in ("/aggregate_metrics", "/verify"):
                url = f"http://127.0.0.1:{sock.getsockname()[1]}{path}"
                async with http.post(url, data=slow_body()) as resp:
                    statuses[path] = resp.status
        server.should_exit = True
        await task
        return statuses

    assert asyncio.run(run()) == {"/aggregate_metrics": 200, "/verify": 408}
    app = QuizEnv({"name": "env"}).build_app()
    while not isinstance(app, RequestGuard):
        app = app.app  # type: ignore[attr-defined]
    assert app.path_body_timeouts == {"/aggregate_metrics": AGGREGATE_BODY_TIMEOUT_S}


def test_no_temporary_files_are_left_behind(agent_url: str, tmp_path: Path) -> None:
    import tempfile

    before = {p.name for p in Path(tempfile.gettempdir()).glob("ng_metrics_*")}
    status, _ = post_raw(agent_url + "/aggregate_metrics", line_body(mixed_rows(7, 400), tmp_path))
    status_bad, _ = post_raw(agent_url + "/aggregate_metrics", b'{"verify_responses":[\n{"reward": 1.0,,\n]}')
    assert (status, status_bad) == (200, 400)
    assert {p.name for p in Path(tempfile.gettempdir()).glob("ng_metrics_*")} == before
