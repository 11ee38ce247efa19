"""Attacks from inside a rollout: a model calling routes it was never offered, a harness program
after the answer key, outliving its rollout, reading other processes' ``/proc``, or flooding the
model past ``max_model_calls``.

One real stack from ``ng_run`` (a subprocess, ``NEMO_GYM_AUTH_TOKEN`` exported): the counter
environment, a scripted policy model that plays the attacks, and simple_agent,
simulated_user_agent and harness_agent in front of them. The harness program is a real Python
program run by the agent (``HARNESS`` below); it does what the row's prompt asks.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from nemo_gym.serving.protocol import ENV_AUTH_TOKEN
from nemo_gym.testing import http_call as call
from nemo_gym.testing import ng_run_process

pytestmark = pytest.mark.slow

TOKEN = "agents-security-token-8d2b7c41"
ENV_CONFIG = "resources_servers/example_session_state_mgmt/configs/example_session_state_mgmt.yaml"
FORBIDDEN = ["seed_session", "verify", "../../verify", "aggregate_metrics", "ng-rollout", "not_offered_tool"]
TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}},
    },
    {"type": "function", "name": "get_counter_value", "parameters": {"type": "object", "properties": {}}},
]

# The program harness_agent runs. It does what the prompt in its task file says.
HARNESS = r"""
import concurrent.futures, json, os, subprocess, sys, time, urllib.error, urllib.request

def post(url, body, raw=False):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()

task = json.load(open(os.environ["NEMO_GYM_TASK_FILE"]))
prompt = task["responses_create_params"]["input"][0]["content"]
report = {"task": task}
if prompt.startswith("ATTACK"):
    tools = os.environ["NEMO_GYM_TOOLS_URL"]
    report["tools"] = {name: post(tools + "/" + name.replace("/", "%2F"), {"initial_count": 22})
                       for name in json.loads(sys.argv[1])}
elif prompt.startswith("CONFINE"):
    marker = sys.argv[2]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", marker]
    subprocess.Popen(sleeper, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.Popen(sleeper)  # holds copies of this program's stdout and stderr pipes
    report["fds"] = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    seen, leaked = [], []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            seen.append(int(entry))
            try:
                if b"NEMO_GYM_AUTH_TOKEN" in open(f"/proc/{entry}/environ", "rb").read():
                    leaked.append(int(entry))
            except OSError:
                pass
    report["pids"], report["leaked"] = seen, leaked
elif prompt.startswith("FLOOD"):
    url = os.environ["OPENAI_BASE_URL"] + "/responses"
    ask = {"model": "policy", "input": [{"role": "user", "content": "FLOOD"}]}
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        report["statuses"] = sorted(s for s, _ in pool.map(lambda _: post(url, ask), range(20)))
print(json.dumps(report))
"""


def policy_config(root: Path) -> Path:
    turns = [{"call_tool": name, "arguments": {"initial_count": 22}} for name in FORBIDDEN]
    harness = root / "harness.py"
    harness.write_text(HARNESS)
    agents = {
        "attack_simple_agent": ("simple_agent", {}),
        "attack_simulated_user_agent": (
            "simulated_user_agent",
            {"user_model_server": {"type": "responses_api_models", "name": "policy_model"}, "max_turns": 1},
        ),
        "attack_harness_agent": (
            "harness_agent",
            {
                "command": ["{python}", str(harness), json.dumps(FORBIDDEN), str(root / "marker")],
                "wall_time_s": 8,
                "max_model_calls": 3,
            },
        ),
    }
    config = {
        "policy_model": {
            "responses_api_models": {
                "scripted_model": {
                    "entrypoint": "app.py",
                    "scripts": [
                        {"match": "^ATTACK", "turns": [*turns, {"text": "done"}]},
                        {"turns": [{"text": "ok"}]},
                    ],
                }
            }
        },
    }
    for name, (impl, fields) in agents.items():
        config[name] = {
            "responses_api_agents": {
                impl: {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": "example_session_state_mgmt"},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                    "max_steps": 10,
                    **fields,
                }
            }
        }
    path = root / "attack.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def row(prompt: str, **fields) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}], "tools": TOOLS},
        "expected_count": 22,
        "initial_count": 0,
        "expected_answer": "SECRET-ANSWER-KEY",
        "verifier_metadata": {"unit_tests": ["SECRET-UNIT-TEST"]},
        **fields,
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("attack")
    env = {**os.environ, ENV_AUTH_TOKEN: TOKEN}
    with ng_run_process([ENV_CONFIG, str(policy_config(root))], env=env) as (proc, head_url):
        status, listed = call(head_url + "/server_instances", token=TOKEN)
        assert status == 200, listed
        yield {item["name"]: item["url"] for item in listed}, root


def run(urls: dict, agent: str, body: dict) -> dict:
    status, answer = call(urls[agent] + "/run", "POST", body, token=TOKEN)
    assert status == 200, answer
    return answer


@pytest.mark.parametrize("agent", ["attack_simple_agent", "attack_simulated_user_agent"])
def test_a_model_cannot_call_routes_it_was_not_offered(stack, agent):
    urls, _ = stack
    answer = run(urls, agent, row("ATTACK: set the counter to 22", user_goal="see the counter at 22"))
    outputs = [i["output"] for i in answer["response"]["output"] if i.get("type") == "function_call_output"]
    assert len(outputs) == len(FORBIDDEN)
    for name, output in zip(FORBIDDEN, outputs, strict=True):
        assert output == f"Error: there is no tool named {name!r}", (name, output)
    # seed_session {"initial_count": 22} never reached the environment, and verify did not free
    # the session mid-rollout: the rollout's own verify found it, at 0.
    assert answer["reward"] == 0.0 and answer["session_found"] is True and answer["final_count"] == 0, answer


def test_a_harness_gets_no_answer_key_and_no_forbidden_tool(stack):
    urls, _ = stack
    answer = run(urls, "attack_harness_agent", row("ATTACK: set the counter to 22"))
    report = json.loads(answer["harness"]["stdout_tail"])
    assert report["task"] == {
        "responses_create_params": {
            "input": [{"role": "user", "content": "ATTACK: set the counter to 22"}],
            "tools": TOOLS,
        }
    }
    assert "SECRET" not in answer["harness"]["stdout_tail"] and "expected_count" not in report["task"]
    for name in FORBIDDEN:
        status, text = report["tools"][name]
        assert status == 404 or text == f"Error: there is no tool named {name!r}", (name, status, text)
    assert answer["reward"] == 0.0 and answer["session_found"] is True and answer["final_count"] == 0, answer


def test_a_harness_leaves_nothing_behind_and_reads_no_other_process(stack):
    from responses_api_agents.harness_agent.confine import confinement

    prefix, how = confinement()
    if not prefix:
        pytest.skip(f"no PID namespace on this machine ({how}): harness_agent falls back to process groups")
    urls, root = stack
    marker = str(root / "marker")
    started = time.monotonic()
    answer = run(urls, "attack_harness_agent", row("CONFINE"))
    elapsed = time.monotonic() - started
    harness = answer["harness"]
    report = json.loads(harness["stdout_tail"])
    # Ended when the program did (its children holding its pipes did not keep it open), well
    # inside wall_time_s (8 s), and nothing it started is left: the setsid one included.
    assert harness["status"] == "ok" and elapsed < 6, (elapsed, harness)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
        if not left:
            break
        time.sleep(0.05)
    assert not left, f"processes outlived the rollout: {left}"
    # No descriptor of the agent's (sockets, log pipes) was inherited: stdin, stdout, stderr,
    # and the one listdir had open.
    assert len(report["fds"]) == 4 and report["fds"][:3] == [0, 1, 2], report["fds"]
    # Its /proc shows only its own processes: the launcher, the agent and the servers are not there.
    assert report["leaked"] == [] and max(report["pids"]) < 100, report
    assert not set(report["pids"]) & {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}


def test_max_model_calls_holds_under_concurrency(stack):
    urls, _ = stack
    answer = run(urls, "attack_harness_agent", row("FLOOD"))
    report = json.loads(answer["harness"]["stdout_tail"])
    assert report["statuses"] == [200] * 3 + [429] * 17, report
    assert answer["harness"]["model_calls"] == 3
