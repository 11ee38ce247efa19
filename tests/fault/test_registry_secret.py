"""The head server's registry only takes /register and /deregister from holders of the stack's secret.

A real stack (child processes on 127.0.0.1) with no auth token: an impostor process that knows
the head's URL can neither register itself as a server nor remove the real one.
"""

from __future__ import annotations

import os

import pytest

from nemo_gym.serving.protocol import ENV_AUTH_TOKEN, ENV_LAUNCH_PAYLOAD, REGISTRATION_SECRET_HEADER
from nemo_gym.testing import SyncClient, running_stack

ONLY_ENV = """
example_single_tool_call:
  resources_servers:
    example_single_tool_call:
      entrypoint: app.py
"""


def post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
    import http.client
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request(
        "POST", parts.path, body=json.dumps(body), headers={"Content-Type": "application/json", **headers}
    )
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    conn.close()
    return resp.status, answer


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if os.environ.get(ENV_AUTH_TOKEN):
        pytest.skip("this test is about a stack without an auth token")
    config = tmp_path_factory.mktemp("registry") / "env.yaml"
    config.write_text(ONLY_ENV)
    with running_stack([str(config)]) as handle:
        yield handle


def test_impostors_cannot_register_or_deregister(stack):
    head = stack.head_url
    real = next(r for r in stack.stack.head.registry.all() if r.name == "example_single_tool_call")
    impostor = {
        "name": "example_single_tool_call",
        "server_type": "resources_servers",
        "host": "127.0.0.1",
        "port": 9,
    }
    for headers in ({}, {REGISTRATION_SECRET_HEADER: "guess"}, {REGISTRATION_SECRET_HEADER: ""}):
        status, answer = post(head + "/register", impostor, headers)
        assert status == 403 and "registration secret" in answer["error"], answer
        status, answer = post(
            head + "/deregister", {"name": real.name, "host": real.host, "port": real.port}, headers
        )
        assert status == 403, answer
    with SyncClient() as client:
        status, listed = client.get(head + "/server_instances")
    assert status == 200
    assert [(r["name"], r["port"]) for r in listed] == [(real.name, real.port)]
    # The servers the stack started registered themselves: they hold the secret, handed on stdin.
    assert real.pid in {p.pid for p in stack.stack.processes.values()}


def test_the_secret_holder_can_register(stack):
    head = stack.head_url
    secret = {REGISTRATION_SECRET_HEADER: stack.stack.registration_secret}
    extra = {"name": "extra", "server_type": "resources_servers", "host": "127.0.0.1", "port": 9}
    assert post(head + "/register", extra, secret)[0] == 200
    assert post(head + "/deregister", {"name": "extra", "host": "127.0.0.1", "port": 9}, secret)[0] == 200
    assert "extra" not in stack.stack.head.registry.replicas


def test_the_secret_is_not_in_any_child_environment(stack):
    secret = stack.stack.registration_secret.encode()
    for proc in stack.stack.processes.values():
        with open(f"/proc/{proc.pid}/environ", "rb") as environ:
            variables = environ.read()
        assert secret not in variables
        assert f"{ENV_LAUNCH_PAYLOAD}=stdin".encode() in variables
