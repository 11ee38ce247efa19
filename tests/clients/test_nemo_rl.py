"""NeMo RL's calling pattern (``nemo_rl/environments/nemo_gym.py``), step by step, inside a Ray actor.

As NeMo RL does: the Gym stack is started by ``RunHelper`` inside a Ray actor from an OmegaConf
config (policy endpoints, ``default_host`` = the node's IP, a port range, aiohttp limits, the
Ray address, a head server on 0.0.0.0 and a port the trainer picked), the actor reaches it with
``BaseServerConfig(host=node_ip, port=...)``, runs a batch with ``run_examples`` and returns
rewards and per-call token IDs, ``health_check`` is ``RunHelper.poll``, and a failed rollout's
error crosses the actor boundary with its integer ``.status``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import pytest

from nemo_gym.launch.launcher import free_port
from nemo_gym.rollout_collection import RolloutFailedError

from .conftest import AGENT, ENV_CONFIG, TRAINING_MODEL_CONFIG, assert_contiguous, example_rows

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


class NemoGymActor:
    """The shape of NeMo RL's ``NemoGym`` actor: spin up, run rollouts, health check, shut down."""

    def __init__(self, base_urls: list[str], port_range: tuple[int, int]) -> None:
        self.base_urls = base_urls
        self.port_range = port_range
        self.rh: Any = None
        self.rch: Any = None
        self.head_server_config: Any = None

    def spinup(self) -> dict[str, Any]:
        from omegaconf import DictConfig

        from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper
        from nemo_gym.rollout_collection import RolloutCollectionHelper
        from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig

        node_ip = ray.util.get_node_ip_address()
        head_port = free_port(node_ip)
        initial: dict[str, Any] = {
            "config_paths": [ENV_CONFIG, TRAINING_MODEL_CONFIG],
            "policy_model_name": "tiny-chatml",
            "policy_api_key": "dummy_key",
            "policy_base_url": self.base_urls,
            "default_host": node_ip,
            "port_range_low": self.port_range[0],
            "port_range_high": self.port_range[1],
            "global_aiohttp_connector_limit_per_host": 16_384,
            "global_aiohttp_connector_limit": 65_536,
            "ray_head_node_address": ray.get_runtime_context().gcs_address,
            HEAD_SERVER_KEY_NAME: {"host": "0.0.0.0", "port": head_port},
        }
        self.rh = RunHelper()
        self.rh.start(
            global_config_dict_parser_config=GlobalConfigDictParserConfig(
                dotenv_path=os.path.join(os.getcwd(), "nemo_gym_env.yaml"),
                initial_global_config_dict=DictConfig(initial),
                skip_load_from_cli=True,
            )
        )
        self.head_server_config = BaseServerConfig(host=node_ip, port=head_port)
        self.rch = RolloutCollectionHelper()
        return {"node_ip": node_ip, "head_port": head_port}

    async def server_instances(self) -> list[dict[str, Any]]:
        from nemo_gym.serving.server_client import ServerClient

        client = ServerClient(f"http://{self.head_server_config.host}:{self.head_server_config.port}")
        try:
            return [vars(info) for info in await client.server_instances()]
        finally:
            await client.close()

    async def run_rollouts(self, examples: list[dict]) -> list[tuple[int, dict]]:
        results = []
        for task in self.rch.run_examples(examples=examples, head_server_config=self.head_server_config):
            row, result = await task  # a failed rollout raises here and crosses the actor boundary
            results.append((row["_rowidx"], result))
        return results

    def health_check(self) -> None:
        self.rh.poll()

    def shutdown(self) -> None:
        rh, self.rh = self.rh, None
        if rh is not None:
            rh.shutdown()


@pytest.fixture(scope="module")
def ray_session():
    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    # The actor class lives in this test module, which Ray workers cannot import by name.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield
    finally:
        ray.shutdown()


def test_training_batch_in_a_ray_actor(ray_session, engine_base_url: str) -> None:
    low = 20000 + os.getpid() % 20000
    actor = ray.remote(NemoGymActor).remote([engine_base_url], (low, low + 999))
    try:
        where = ray.get(actor.spinup.remote(), timeout=300)
        instances = ray.get(actor.server_instances.remote(), timeout=60)
        ours = [i for i in instances if not i["external"]]
        assert ours and all(i["host"] == where["node_ip"] for i in ours), instances
        assert all(low <= i["port"] <= low + 999 for i in ours), instances

        rows = [
            {**row, "agent_ref": {"type": "responses_api_agents", "name": AGENT}, "_rowidx": index}
            for index, row in enumerate(example_rows(2))
        ]
        results = ray.get(actor.run_rollouts.remote(rows), timeout=600)
        assert sorted(index for index, _ in results) == [0, 1]
        for _, result in results:
            assert result["reward"] == 1.0
            calls = assert_contiguous(result["response"]["output"])
            assert len(calls) == 3

        # A malformed row: the error crosses the actor boundary, keeps its class and a 4xx status.
        bad = {"responses_create_params": {"input": 5}, "agent_ref": rows[0]["agent_ref"], "_rowidx": 0}
        with pytest.raises(ray.exceptions.RayTaskError) as raised:
            ray.get(actor.run_rollouts.remote([bad]), timeout=120)
        cause = raised.value.cause
        assert isinstance(cause, RolloutFailedError), repr(cause)
        assert isinstance(cause.status, int) and 400 <= cause.status < 500, cause.status

        ray.get(actor.health_check.remote(), timeout=30)
        (env,) = [i for i in instances if i["name"] == "example_single_tool_call"]
        os.kill(env["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            try:
                ray.get(actor.health_check.remote(), timeout=30)
            except ray.exceptions.RayTaskError as exc:
                assert "example_single_tool_call" in str(exc)
                break
            assert time.monotonic() < deadline, "poll() never reported the dead server"
            time.sleep(0.2)
    finally:
        ray.get(actor.shutdown.remote(), timeout=60)
