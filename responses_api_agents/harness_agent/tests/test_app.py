"""harness_agent with real in-process servers and real child processes: the example black box
over both APIs, the program's failures and limits, model faults, and the capture bookkeeping."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from nemo_gym.launch.config import project_root
from nemo_gym.launch.launcher import free_port
from nemo_gym.testing import SyncClient, read_jsonl, running_agent, running_server
from resources_servers.example_session_state_mgmt.app import ExampleSessionStateMgmtServer
from responses_api_agents.harness_agent.app import HarnessAgent
from responses_api_agents.harness_agent.capture import RolloutCapture
from responses_api_models.scripted_model.app import ScriptedModel

ROOT = project_root()
ENV = ROOT / "resources_servers/example_session_state_mgmt"
ROWS = read_jsonl(ENV / "data/example.jsonl")
SCRIPTS = yaml.safe_load((ENV / "configs/scripted_policy.yaml").read_text())["policy_model"][
    "responses_api_models"
]["scripted_model"]["scripts"]
HARNESS = ["{python}", "{agent_dir}/example_harness.py", "--api"]


@contextmanager
def agent(command: list[str], model_url: str | None = None, **fields: Any) -> Iterator[str]:
    env = ExampleSessionStateMgmtServer({"name": "env"})
    model = ScriptedModel({"name": "model", "scripts": SCRIPTS})
    with running_agent(env, model, agent_class=HarnessAgent, command=command, **fields) as url:
        yield url


def run(url: str, row: dict[str, Any]) -> tuple[int, Any]:
    with SyncClient(timeout_s=120) as client:
        return client.post(url + "/run", row)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_example_harness_is_captured_and_verified(api: str):
    with agent([*HARNESS, api]) as url:
        status, body = run(url, ROWS[0])  # 10 + 5 + 7 = 22
    assert status == 200, body
    assert body["reward"] == 1.0 and body["final_count"] == 22
    harness = body["harness"]
    assert (harness["status"], harness["returncode"], harness["model_calls"], harness["tool_calls"]) == (
        "ok",
        0,
        4,
        3,
    )
    assert "22" in harness["stdout_tail"]
    shape = [item["type"] for item in body["response"]["output"]]
    assert shape == ["function_call", "function_call_output"] * 3 + ["message"]


def test_a_failing_program_is_reported_and_scored_on_what_it_did():
    with agent(["{python}", "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]) as url:
        status, body = run(url, ROWS[0])
    assert status == 200, body
    assert body["reward"] == 0.0 and body["response"]["output"] == []
    assert (body["harness"]["status"], body["harness"]["returncode"]) == ("failed", 3)
    assert "boom" in body["harness"]["stderr_tail"] and body["harness"]["model_calls"] == 0


def test_the_wall_limit_kills_the_program_and_its_children():
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    with agent(["{python}", "-c", code], wall_time_s=1.5) as url:
        status, body = run(url, ROWS[0])
    assert status == 200, body
    assert body["harness"]["status"] == "timeout" and body["harness"]["wall_s"] < 10


def test_the_output_cap_is_enforced():
    code = "import sys; sys.stdout.write('x' * 200000)"
    with agent(["{python}", "-c", code], max_output_bytes=4096) as url:
        status, body = run(url, ROWS[0])
    assert status == 200 and body["harness"]["status"] == "output_limit"


def test_a_policy_model_that_is_down_is_a_classified_failure_not_a_reward():
    env = ExampleSessionStateMgmtServer({"name": "env"})
    dead = f"http://127.0.0.1:{free_port()}"
    from nemo_gym.serving.server_client import ServerClient

    with running_server(env) as env_url:
        harness = HarnessAgent(
            {
                "name": "agent",
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "model"},
                "command": [*HARNESS, "responses"],
            },
            server_client=ServerClient(static_urls={"env": env_url, "model": dead}),
        )
        with running_server(harness) as url:
            status, body = run(url, ROWS[0])
    assert status >= 500 and body.get("failure_class") == "unreachable", body
    assert "reward" not in body


def test_capture_restores_token_fields_and_flags_a_prompt_that_does_not_extend():
    capture = RolloutCapture(rollout=None, model_server="m", resources_server="r", max_model_calls=5)  # type: ignore[arg-type]
    first = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    capture.record(
        [],
        {
            "output": [
                {
                    **first,
                    "prompt_token_ids": [1, 2],
                    "generation_token_ids": [3],
                    "generation_log_probs": [-0.1],
                }
            ]
        },
    )
    echoed = capture.restore_token_fields([{"role": "user", "content": "hi"}, dict(first)])
    assert echoed[1]["prompt_token_ids"] == [1, 2] and "prompt_token_ids" not in echoed[0]
    extends = {
        "type": "message",
        "role": "assistant",
        "content": "ok",
        "prompt_token_ids": [1, 2, 3, 9],
        "generation_token_ids": [4],
    }
    capture.record(echoed, {"output": [extends]})
    assert "token_ids_contiguous" not in extends
    restarted = {
        "type": "message",
        "role": "assistant",
        "content": "again",
        "prompt_token_ids": [7],
        "generation_token_ids": [8],
    }
    capture.record([], {"output": [restarted]})
    assert restarted["token_ids_contiguous"] is False
    assembled = capture.assembled_response()
    assert [item.get("content") or item["type"] for item in assembled["output"]] == [
        "function_call",
        "ok",
        "again",
    ]


PROBE = """
import json, os, urllib.error, urllib.request

def post(url, data):
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()

base = os.environ["OPENAI_BASE_URL"]
ask = {"input": "Increase the counter by 20 and report its value."}
results = {
    "bad_chat": post(base + "/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}'),
    "not_json": post(base + "/responses", b"{nope")[0],
    "unknown_rollout": post(base.rsplit("/", 2)[0] + "/wrong/v1/responses", b"{}")[0],
    "first": post(base + "/responses", json.dumps(dict(ask, stream=True)).encode()),
    "over_limit": post(base + "/responses", json.dumps(ask).encode())[0],
    "tool": post(os.environ["NEMO_GYM_TOOLS_URL"] + "/increment_counter", b'{"count": 20}'),
    "bad_tool_args": post(os.environ["NEMO_GYM_TOOLS_URL"] + "/increment_counter", b'{"count": "x"}')[1],
}
print(json.dumps(results))
"""


def test_the_proxy_answers_a_programs_mistakes_with_clear_errors(tmp_path):
    import json

    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    with agent(["{python}", str(script)], max_model_calls=1) as url:
        status, body = run(url, ROWS[1])  # 0 + 20 = 20: the probe's own tool call reaches the goal
    assert status == 200, body
    assert body["harness"]["status"] == "ok", body["harness"]
    seen = json.loads(body["harness"]["stdout_tail"])
    assert (seen["bad_chat"][0], seen["not_json"], seen["unknown_rollout"]) == (400, 400, 404)
    assert "wizard" in seen["bad_chat"][1]
    # A streamed call is answered with the Responses events, the whole response last.
    assert seen["first"][0] == 200 and seen["first"][1].startswith("event: response.created")
    assert "event: response.completed" in seen["first"][1] and seen["over_limit"] == 429
    assert seen["tool"] == [200, '{"success":true}']
    assert "count" in seen["bad_tool_args"] and "failed (HTTP 422)" in seen["bad_tool_args"]
    assert body["harness"]["model_calls"] == 1 and body["harness"]["tool_calls"] == 2
    assert body["reward"] == 1.0


def test_the_rollout_deadline_ends_the_program_as_a_timeout_failure(tmp_path):
    import os
    import time

    import psutil

    # In its own PID namespace the program cannot know its pid out here: it is found by a marker.
    marker = f"ng-harness-marker-{os.getpid()}-{time.monotonic_ns()}"
    code = "import sys, time; open(sys.argv[1], 'w').write('started'); time.sleep(60)"
    started = tmp_path / "started"
    with agent(["{python}", "-c", code, str(started), marker], rollout_timeout_s=1.5) as url:
        status, body = run(url, ROWS[0])
    assert status >= 500 and body.get("failure_class") == "timeout", body
    assert started.read_text() == "started"

    def left() -> list[int]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if marker in (proc.info["cmdline"] or []):
                found.append(proc.pid)
        return found

    deadline = time.monotonic() + 5
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left(), f"the program outlived its rollout: {left()}"


def test_only_tool_outputs_the_stack_returned_are_graded():
    capture = RolloutCapture(rollout=None, model_server="m", resources_server="r", max_model_calls=5)  # type: ignore[arg-type]
    calls = [
        {"type": "function_call", "call_id": c, "name": "lookup", "arguments": "{}"} for c in ("c1", "c2")
    ]
    capture.record([], {"output": calls})
    capture.record_tool_output("lookup", "42")
    between = [
        {"type": "function_call_output", "call_id": "c1", "output": "42"},  # what the stack returned
        {"type": "function_call_output", "call_id": "c2", "output": "42"},  # the same text again
        {"type": "function_call_output", "call_id": "c9", "output": "42"},  # no such policy call
        {"role": "user", "content": "the answer is 42"},
    ]
    capture.record(
        [*calls, *between], {"output": [{"type": "message", "role": "assistant", "content": "ok"}]}
    )
    graded = capture.assembled_response()["output"]
    assert [item.get("call_id") or item.get("content") for item in graded] == ["c1", "c2", "c1", "ok"]
    kept = capture.program_items()
    assert [entry["item"].get("call_id") or entry["item"]["role"] for entry in kept] == ["c2", "c9", "user"]
    assert {entry["before_call"] for entry in kept} == {1}
