"""verifiers' ``NeMoGymHarness`` calling pattern (PR 1396, ``packages/harnesses/harnesses/nemo_gym.py``), step by step.

As the harness's persistent runner does: an OpenAI-compatible proxy of its own on loopback is
started first and registered as ``policy_model`` (an instance whose entrypoint does not exist,
with the proxy's host and port); the runner resets the global config, replaces
``nemo_gym.cli.setup_env_command`` / ``run_command`` so that ``policy_model`` gets no process,
starts the stack with ``RunHelper.start`` in a worker thread, sets up the process-wide aiohttp
client from ``_server_client.global_config_dict``, and runs each rollout with its own routing
model name through ``run_examples``. Two rollouts run at once; the proxy routes each one's model
calls to its upstream by that name. The upstream is our scripted model server.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from omegaconf import OmegaConf

from nemo_gym.launch.launcher import free_port
from nemo_gym.testing import running_stack

from .conftest import AGENT, ENV_CONFIG, example_rows

pytestmark = pytest.mark.slow

POLICY = "policy_model"


class RoutingProxy:
    """An outside OpenAI-compatible proxy: routes each request by its ``model`` to that rollout's upstream."""

    def __init__(self) -> None:
        self.port = free_port()
        self.routes: dict[str, str] = {}  # routing model -> upstream base URL (with /v1)
        self.seen: list[tuple[str, str]] = []  # (routing model, request path)
        self.both_arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self._http = aiohttp.ClientSession()

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        payload = await request.json() if request.can_read_body else None
        model = payload.get("model") if isinstance(payload, dict) else None
        self.seen.append((str(model), request.path))
        upstream = self.routes.get(str(model))
        if upstream is None or not request.path.startswith("/v1/"):
            return web.json_response({"error": f"no route for model {model!r} at {request.path}"}, status=409)
        if len({m for m, _ in self.seen if m in self.routes}) < 2:
            # Hold the first rollout's call until the second one arrives: proves they overlap.
            await asyncio.wait_for(self.both_arrived.wait(), 60)
        self.both_arrived.set()
        assert self._http is not None
        async with self._http.post(
            upstream + request.path.removeprefix("/v1"), json={**payload, "model": "scripted"}
        ) as resp:
            return web.Response(status=resp.status, body=await resp.read(), content_type="application/json")


@contextlib.contextmanager
def skip_policy_model_process(nemo_cli: Any) -> Iterator[None]:
    """Replace the launch hooks so that policy_model gets no process (as the harness does)."""
    original_setup, original_run = nemo_cli.setup_env_command, nemo_cli.run_command

    class NoProcess:
        pid = 0

        def poll(self) -> None:
            return None

    def setup_env_command(dir_path: Any, global_config_dict: Any, prefix: str) -> str:
        return "true" if prefix == POLICY else original_setup(dir_path, global_config_dict, prefix)

    def run_command(command: str, working_dir_path: Any) -> Any:
        if f"NEMO_GYM_CONFIG_PATH={POLICY}" in command:
            return NoProcess()
        return original_run(command, working_dir_path)

    nemo_cli.setup_env_command, nemo_cli.run_command = setup_env_command, run_command
    try:
        yield
    finally:
        nemo_cli.setup_env_command, nemo_cli.run_command = original_setup, original_run


async def test_verifiers_harness_pattern() -> None:
    from nemo_gym import cli as nemo_cli
    from nemo_gym import global_config as nemo_global_config
    from nemo_gym import server_utils as nemo_server_utils
    from nemo_gym.global_config import GlobalConfigDictParserConfig
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.server_utils import (
        GlobalAIOHTTPAsyncClientConfig,
        is_global_aiohttp_client_setup,
        set_global_aiohttp_client,
    )
    from nemo_gym.serving.server_client import fd_connection_cap

    with running_stack(["responses_api_models/scripted_model/configs/scripted_model.yaml"]) as upstream:
        (replica,) = upstream.stack.head.registry.replicas[POLICY]
        upstream_url = replica.url + "/v1"
        proxy = RoutingProxy()
        await proxy.start()
        config: dict[str, Any] = {
            "config_paths": [ENV_CONFIG],
            "policy_base_url": f"http://127.0.0.1:{proxy.port}/v1",
            "policy_api_key": secrets.token_urlsafe(16),
            "policy_model_name": "verifiers-nemo-gym-proxy",
            POLICY: {
                "responses_api_models": {
                    "verifiers_proxy": {
                        "entrypoint": "__verifiers_external_policy_model__.py",
                        "host": "127.0.0.1",
                        "port": proxy.port,
                    }
                }
            },
            "global_aiohttp_connector_limit": 65_536,
            "head_server": {"host": "127.0.0.1", "port": free_port()},
        }
        parser_config = GlobalConfigDictParserConfig(
            initial_global_config_dict=OmegaConf.create(config),
            skip_load_from_cli=True,
            skip_load_from_dotenv=True,
        )
        helper = nemo_cli.RunHelper()
        nemo_global_config._GLOBAL_CONFIG_DICT = None
        try:
            with skip_policy_model_process(nemo_cli):
                await asyncio.to_thread(helper.start, parser_config)
            if not is_global_aiohttp_client_setup():
                client = set_global_aiohttp_client(
                    GlobalAIOHTTPAsyncClientConfig.model_validate(helper._server_client.global_config_dict)
                )
                assert client.connector is not None
                assert client.connector.limit == min(65_536, fd_connection_cap())
            collector = RolloutCollectionHelper()
            head = helper._server_client.head_server_config

            async def run_once(row: dict, upstream_base: str) -> dict:
                helper.poll()
                routing_model = f"verifiers-nemo-gym-proxy-{secrets.token_urlsafe(8)}"
                proxy.routes[routing_model] = upstream_base
                try:
                    request_row = {**row, "agent_ref": {"type": "responses_api_agents", "name": AGENT}}
                    request_row["responses_create_params"] = {
                        **row["responses_create_params"],
                        "model": routing_model,
                    }
                    futures = collector.run_examples([request_row], head_server_config=head)
                    _, result = await next(futures)
                    return {"routing_model": routing_model, **result}
                finally:
                    proxy.routes.pop(routing_model, None)

            rows = example_rows(2)
            first, second = await asyncio.gather(
                run_once(rows[0], upstream_url), run_once(rows[1], upstream_url)
            )
            await collector.close()
        finally:
            await asyncio.to_thread(helper.shutdown)
            session = nemo_server_utils._GLOBAL_AIOHTTP_CLIENT
            if session is not None:
                await session.close()
                nemo_server_utils._GLOBAL_AIOHTTP_CLIENT = None
            nemo_global_config._GLOBAL_CONFIG_DICT = None
            await proxy.stop()

    assert first["reward"] == 1.0 and second["reward"] == 1.0
    for result in (first, second):
        calls = [path for model, path in proxy.seen if model == result["routing_model"]]
        # A tool call, then the answer: both model calls of this rollout went through its route,
        # at the plain OpenAI path (no /ng-rollout/ prefix to an outside endpoint).
        assert calls == ["/v1/responses", "/v1/responses"], proxy.seen
    # Besides the launcher's one reachability probe (GET /), every request was a routed model call.
    model_calls = [(m, p) for m, p in proxy.seen if p != "/"]
    assert len(model_calls) == 4 and len(proxy.seen) == 5, proxy.seen
