"""Secrets are hidden by key and by value everywhere we serve or write text, and never sit in a
child's environment.

A real stack (children on 127.0.0.1) whose policy model is ``openai_model`` in front of a fake
upstream that echoes every credential it receives in its error answer, as some providers do.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import sys

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from nemo_gym.launch.config import load_config
from nemo_gym.launch.launcher import StackHandle
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.serving.protocol import ENV_AUTH_TOKEN
from nemo_gym.serving.secrets import (
    REDACTED,
    RedactingFilter,
    redact,
    redact_text,
    remember_secret_values,
    secret_values,
)
from nemo_gym.serving.server import BaseServer, BaseServerConfig, HTTPError
from nemo_gym.testing import SyncClient, running_app, running_server

API_KEY = "sk-test-0123456789abcdefghij"
EXTRA_HEADER = "Bearer hdr-secret-4242424242"
URL_PASSWORD = "pa55-w0rd-xyz"
AUTH_TOKEN = "stack-auth-token-31337"
ENV_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
SECRETS = [API_KEY, EXTRA_HEADER.split()[1], URL_PASSWORD, AUTH_TOKEN]


def test_redact_by_key_by_value_headers_and_url_credentials():
    config = {
        "policy_api_key": API_KEY,
        "max_tokens": 512,
        "return_token_id_information": True,
        "model": {
            "openai_default_headers": {"Authorization-Extra": EXTRA_HEADER},
            "note": f"key is {API_KEY}",
        },
        "urls": [f"http://user:{URL_PASSWORD}@host:1/v1", "http://plain.example/v1"],
        "copied": "hdr-secret-4242424242",
    }
    hidden = redact(config, secret_values(config))
    text = json.dumps(hidden)
    for secret in SECRETS[:3]:
        assert secret not in text
    assert hidden["max_tokens"] == 512 and hidden["return_token_id_information"] is True
    assert hidden["urls"] == [f"http://{REDACTED}@host:1/v1", "http://plain.example/v1"]
    assert hidden["model"]["note"] == f"key is {REDACTED}"
    assert hidden["copied"] == REDACTED  # found by value, under a harmless key
    assert (
        redact_text("upstream said: Authorization: Bearer abcdef123456")
        == f"upstream said: Authorization: Bearer {REDACTED}"
    )


def test_redact_by_shape_whatever_the_key():
    config = {
        "mcp": {
            "args": ["srv", "--api-key", "argv-value-1", "--max-tokens", "512", "--tokenizer", "gpt2"],
            "env": {"ANYTHING": "env-value-2"},
        },
        "url": "https://h.example/v1?key=query-value-3&model=m&api-key=query-value-4",
        "command": "agent --hf-token=flag-value-5 --token flag-value-6 --max-tokens 7",
        "tokens": "hf_abcdefghijklmnopqrstu ghp_abcdefghijklmnopqrstuvwxyz nvapi-abcdefghijklmnopqr",
        "header": "Authorization: Bearer ab",
    }
    hidden = redact(config)
    text = json.dumps(hidden)
    for value in ("argv-value-1", "env-value-2", "query-value-3", "query-value-4", "flag-value-5"):
        assert value not in text, value
    assert (
        "flag-value-6" not in text
        and "hf_abc" not in text
        and "ghp_abc" not in text
        and "nvapi-abc" not in text
    )
    assert hidden["mcp"]["args"] == [
        "srv",
        "--api-key",
        REDACTED,
        "--max-tokens",
        "512",
        "--tokenizer",
        "gpt2",
    ]
    assert hidden["url"] == f"https://h.example/v1?key={REDACTED}&model=m&api-key={REDACTED}"
    assert hidden["command"].endswith("--max-tokens 7")
    assert hidden["header"] == f"Authorization: Bearer {REDACTED}"
    # Remembered (hidden in every later log line): the shaped ones, not every env value.
    found = secret_values({**config, "env": {"PATH": "/usr/bin:/bin"}})
    assert {"argv-value-1", "query-value-3", "flag-value-5"} <= found and "/usr/bin:/bin" not in found


def echo_credentials_upstream() -> Starlette:
    async def refuse(request: Request) -> JSONResponse:
        seen = {k: v for k, v in request.headers.items() if k.lower().startswith(("authorization", "x-"))}
        return JSONResponse({"error": {"message": f"invalid credentials: {seen} at {request.url}"}}, 401)

    return Starlette(routes=[Route("/v1/{path:path}", refuse, methods=["POST"])])


@pytest.fixture(scope="module")
def stack_config(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets")
    with running_app(echo_credentials_upstream()) as upstream:
        port = upstream.rsplit(":", 1)[1]
        policy = root / "policy.yaml"
        policy.write_text(
            f"""
policy_base_url: http://127.0.0.1:{port}/v1
mirror_url: http://nguser:{URL_PASSWORD}@127.0.0.1:{port}/v1
policy_api_key: {API_KEY}
policy_model_name: test-model
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: ${{policy_base_url}}
      openai_api_key: ${{policy_api_key}}
      openai_model: ${{policy_model_name}}
      max_retries: 0
      openai_default_headers:
        Authorization-Extra: "{EXTRA_HEADER}"
"""
        )
        yield root, [f"+config_paths=[{ENV_CONFIG},{policy}]", "++head_server.port=0"]


@pytest.mark.slow
def test_no_secret_in_served_config_environments_errors_or_failures(stack_config, monkeypatch):
    root, argv = stack_config
    monkeypatch.setenv(ENV_AUTH_TOKEN, AUTH_TOKEN)
    handle = StackHandle.start(load_config(argv))
    try:
        with SyncClient() as client:
            status, served = client.get(handle.head_url + "/global_config_dict_yaml")
        assert status == 200 and "openai_default_headers" in served
        for secret in SECRETS:
            assert secret not in served, secret

        for proc in handle.stack.processes.values():
            with open(f"/proc/{proc.pid}/environ", "rb") as environ:
                variables = environ.read()
            for secret in SECRETS:
                assert secret.encode() not in variables, (proc.name, secret)

        out = root / "out.jsonl"
        config = {
            "head_server": handle.head_server_config,
            "agent_name": "example_single_tool_call_simple_agent",
            "input_jsonl_fpath": "resources_servers/example_single_tool_call/data/example.jsonl",
            "output_jsonl_fpath": str(out),
            "limit": 2,
        }
        asyncio.run(RolloutCollectionHelper().run_from_config(config, verbose=False))
    finally:
        handle.stop()
    failures = (root / "out_failures.jsonl").read_text()
    assert failures.count("\n") == 2 and "invalid credentials" in failures  # the upstream's echo arrived...
    for secret in SECRETS:
        assert secret not in failures, secret  # ...with every credential hidden


def test_ng_dump_config_hides_secrets(stack_config):
    _, argv = stack_config
    shown = subprocess.run(
        [sys.executable, "-c", "from nemo_gym.cli import ng_dump_config; ng_dump_config()", *argv],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Authorization-Extra" in shown and "nguser" not in shown
    for secret in SECRETS[:3]:
        assert secret not in shown, secret


class LeakyServer(BaseServer):
    """Errors that quote the server's own secret, as a careless handler or library might."""

    class Config(BaseServerConfig):
        judge_api_key: str

    config: Config

    def routes(self):
        return super().routes() + [self.route("/crash", self.crash), self.route("/refuse", self.refuse)]

    async def crash(self, body: dict) -> dict:
        raise RuntimeError(f"judge call failed with key {self.config.judge_api_key}")

    async def refuse(self, body: dict) -> dict:
        raise HTTPError(400, f"bad request for http://judge:{self.config.judge_api_key}@judge.local/v1")


def test_error_answers_and_logs_hide_remembered_secrets():
    secret = "plain-value-without-any-pattern-5150"
    remember_secret_values(secret_values({"judge_api_key": secret}))  # what from_env does at start-up
    with (
        running_server(LeakyServer({"name": "leaky", "judge_api_key": secret})) as url,
        SyncClient() as client,
    ):
        for route, status in (("/crash", 500), ("/refuse", 400)):
            got, answer = client.post(url + route, {})
            assert got == status and answer["error"], answer
            assert secret not in json.dumps(answer) and REDACTED in answer["error"], answer

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    log = logging.getLogger("nemo_gym.test_secrets")
    log.addHandler(handler)
    try:
        log.error("calling %s with Authorization: Bearer abcdef123456", f"http://u:{secret}@h/v1")
        try:
            raise ValueError(f"upstream echoed {secret}")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    logged = stream.getvalue()
    assert "upstream echoed" in logged and "abcdef123456" not in logged and secret not in logged
