"""Servers ``ng_run`` starts get the run's global config, without other servers' secrets.

NeMo Gym-style servers read the whole run config (``get_global_config_dict()``,
``self.server_client.global_config_dict``): top-level settings, other servers' blocks, the head
server. Here the launcher hands it over in the launch payload; every other server's block is
redacted first, so one server's API key never reaches another (docs/RELIABILITY.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from nemo_gym.launch.config import server_instances
from nemo_gym.serving.secrets import REDACTED, redact_other_servers
from nemo_gym.testing import ng_run_process

ROOT = Path(__file__).resolve().parent.parent

PROBE_APP = """
from fastapi import FastAPI

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.global_config import get_global_config_dict


class ProbeConfig(BaseResourcesServerConfig):
    api_key: str = ""


class ProbeServer(SimpleResourcesServer):
    config: ProbeConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/probe")(self.probe)
        return app

    async def probe(self, body: dict) -> dict:
        from omegaconf import OmegaConf

        config = get_global_config_dict()
        client_config = self.server_client.global_config_dict
        return {
            "top": config[body["key"]],
            "client_top": client_config[body["key"]],
            "same_object": config is client_config,
            "whole": OmegaConf.to_container(config),
        }

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


if __name__ == "__main__":
    ProbeServer.run_webserver()
"""

CONFIG = """
run_label: globalcfg-run-7
probe_a:
  resources_servers:
    gc_probe:
      entrypoint: app.py
      api_key: own-secret-aaaa-1111
probe_b:
  resources_servers:
    gc_probe:
      entrypoint: app.py
      api_key: other-secret-bbbb-2222
      openai_default_headers:
        X-Other: other-header-cccc-3333
      mcp_servers:
        - command: npx
          args: [mcp-server, --api-key, argv-secret-dddd-4444]
          env: {SERVICE_CONFIG: env-secret-eeee-5555}
      judge_url: https://judge.example/v1?api-key=query-secret-ffff-6666&model=m
      harness_command: "codex --hf-token=flag-secret-gggg-7777 --max-tokens 512"
      note: uses hf_0123456789abcdefghijklmn for downloads
      upstream_auth: Bearer sh0rt
"""
# Secrets of probe_b found by their shape, not by their key's name.
SHAPED = [
    "argv-secret-dddd-4444",
    "env-secret-eeee-5555",
    "query-secret-ffff-6666",
    "flag-secret-gggg-7777",
    "hf_0123456789abcdefghijklmn",
    "sh0rt",
]


def test_each_block_but_the_servers_own_is_redacted() -> None:
    config = {
        "hf_token": "run-wide-token-123",
        "a": {"resources_servers": {"x": {"api_key": "aaaa-secret"}}},
        "b": {"responses_api_models": {"y": {"api_key": "bbbb-secret", "model": "m1"}}},
    }
    names = server_instances(config)
    for_a = redact_other_servers(config, "a", names)
    assert for_a["a"] == config["a"]  # its own block whole
    assert for_a["hf_token"] == "run-wide-token-123"  # top-level: run-wide
    assert for_a["b"]["responses_api_models"]["y"] == {"api_key": REDACTED, "model": "m1"}
    assert config["b"]["responses_api_models"]["y"]["api_key"] == "bbbb-secret"  # a copy


@pytest.mark.slow
def test_a_nemo_gym_style_server_under_ng_run_reads_the_runs_config(tmp_path: Path) -> None:
    app_dir = tmp_path / "resources_servers" / "gc_probe"
    app_dir.mkdir(parents=True)
    (app_dir / "app.py").write_text(PROBE_APP)
    (tmp_path / "probe.yaml").write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with ng_run_process(["probe.yaml"], env=env, timeout_s=60, cwd=tmp_path) as (_, head_url):
        with urllib.request.urlopen(head_url + "/server_instances", timeout=10) as resp:
            urls = {i["name"]: i["url"] for i in json.load(resp)}
        request = urllib.request.Request(
            urls["probe_a"] + "/probe",
            json.dumps({"key": "run_label"}).encode(),
            {"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            answer = json.load(resp)

    # The run's values, by both of NeMo Gym's ways of asking, one object.
    assert answer["top"] == "globalcfg-run-7"
    assert answer["client_top"] == "globalcfg-run-7"
    assert answer["same_object"] is True
    whole = answer["whole"]
    head_port = int(head_url.rsplit(":", 1)[1])
    assert whole["head_server"]["port"] == head_port  # where the head server listens, not 0
    # Its own block whole; the other server's secrets never reach it, its other fields do.
    assert whole["probe_a"]["resources_servers"]["gc_probe"]["api_key"] == "own-secret-aaaa-1111"
    other = whole["probe_b"]["resources_servers"]["gc_probe"]
    assert other["api_key"] == REDACTED
    assert other["openai_default_headers"] == {"X-Other": REDACTED}
    assert other["entrypoint"] == "app.py"
    text = json.dumps(answer)
    assert "other-secret-bbbb-2222" not in text and "other-header-cccc-3333" not in text
    for secret in SHAPED:
        assert secret not in text, secret
    # What is not a secret stays readable.
    assert other["mcp_servers"][0]["args"][:2] == ["mcp-server", "--api-key"]
    assert other["harness_command"].endswith("--max-tokens 512")
    assert other["judge_url"].endswith("&model=m")
    # And ng_dump_config shows none of them either.
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "from nemo_gym.cli import ng_dump_config; ng_dump_config()",
            "+config_paths=[probe.yaml]",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "mcp-server" in shown and "judge.example" in shown
    for secret in [*SHAPED, "other-secret-bbbb-2222", "own-secret-aaaa-1111"]:
        assert secret not in shown, secret


class _RecordingBackend:
    """A process backend that starts nothing: it keeps each spec's stdin payload, as the Ray
    backend would hand it on, and then fails the start."""

    def __init__(self) -> None:
        self.payloads: dict[str, dict] = {}

    async def start(self, spec, log):  # noqa: ANN001, ANN201 - the ProcessBackend protocol
        self.payloads[spec.instance.name] = json.loads(spec.stdin_payload)
        raise RuntimeError("recorded")

    async def stop(self, proc, grace_s):  # noqa: ANN001, ANN201
        return None


def test_every_backend_is_handed_the_redacted_config_per_server(tmp_path: Path) -> None:
    import asyncio

    import yaml

    from nemo_gym.launch.launcher import Stack

    app_dir = tmp_path / "resources_servers" / "gc_probe"
    app_dir.mkdir(parents=True)
    (app_dir / "app.py").write_text(PROBE_APP)
    config = {**yaml.safe_load(CONFIG), "head_server": {"host": "127.0.0.1", "port": 0}}
    backend = _RecordingBackend()

    async def run(order: list[str]) -> None:
        # The stack stops at its first failed start: start it twice, each server first once.
        stack = Stack(
            {k: config[k] for k in [*order, "run_label", "head_server"]},
            backend=backend,
            cwd=tmp_path,
            log=lambda name, line: None,
        )
        with pytest.raises(RuntimeError, match="recorded"):
            await stack.start()

    asyncio.run(run(["probe_a", "probe_b"]))
    asyncio.run(run(["probe_b", "probe_a"]))
    assert set(backend.payloads) == {"probe_a", "probe_b"}
    for own, other in (("probe_a", "probe_b"), ("probe_b", "probe_a")):
        received = backend.payloads[own]["global_config"]
        assert received["run_label"] == "globalcfg-run-7"
        assert received["head_server"]["port"] > 0
        assert received[own] == config[own]
        assert received[other]["resources_servers"]["gc_probe"]["api_key"] == REDACTED
        assert (
            backend.payloads[own]["server_config"]["api_key"]
            == config[own]["resources_servers"]["gc_probe"]["api_key"]
        )


def test_the_launch_payload_is_one_type_written_and_read_with_its_keys_checked() -> None:
    from nemo_gym.serving.launch_payload import LaunchPayload

    payload = LaunchPayload({"name": "env", "port": 0}, "token", "secret", {"env": {}})
    assert LaunchPayload.from_json(payload.to_json()) == payload
    assert b"global_config" not in LaunchPayload({"name": "env"}).to_json()
    # The Ray backend's adjustment: the node's address only where the config names no host.
    assert payload.on_host("10.0.0.2").server_config["host"] == "10.0.0.2"
    assert LaunchPayload({"host": "127.0.0.1"}).on_host("10.0.0.2").server_config["host"] == "127.0.0.1"
    for raw, message in (
        (b"[1]", "must be a JSON object"),
        (b"{", "not JSON"),
        (b'{"server_config": {}, "secrets": 1}', "unknown keys ['secrets']"),
        (b'{"server_config": []}', "server_config must be a JSON object"),
        (b'{"auth_token": 3}', "auth_token must be a string"),
    ):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            LaunchPayload.from_json(raw)
