"""Overhead per harness turn: a model call through harness_agent's capture proxy vs the same call
straight to the model server, as a harness program in the confinement sees it.

The policy is scripted_model (no inference: what remains is our cost). A program run by
harness_agent times N calls of each kind with one keep-alive-free ``urllib`` request per call
(as CLIs open connections) and prints p50/p95 in milliseconds: direct Responses, through the
proxy (Responses, then streamed Responses, Chat Completions streamed and Anthropic Messages
streamed). The proxy's overhead per turn is the difference of the medians.

    python scripts/bench_harness_turn.py [--calls 200]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROGRAM = r"""
import json, os, statistics, sys, time, urllib.request
N = int(sys.argv[1])
def post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        data = answer.read()
    # Every answer must be a whole one: a completed response, a [DONE] chat stream, message_stop.
    assert any(m in data for m in (b'"completed"', b"[DONE]", b"message_stop")), data[:300]
def timed(url, body):
    times = []
    for _ in range(N):
        start = time.perf_counter(); post(url, body); times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"p50_ms": round(statistics.median(times), 3), "p95_ms": round(times[int(0.95 * len(times)) - 1], 3)}
ask = {"input": [{"role": "user", "content": "Increase the counter by 3."}]}
base, direct = os.environ["OPENAI_BASE_URL"], os.environ["BENCH_MODEL_URL"]
root = base[: -len("/v1")]
chat = {"messages": [{"role": "user", "content": "Increase the counter by 3."}], "stream": True}
messages = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Increase the counter by 3."}], "stream": True}
print(json.dumps({
    "direct responses": timed(direct + "/v1/responses", ask),
    "proxy responses": timed(base + "/responses", ask),
    "proxy responses streamed": timed(base + "/responses", dict(ask, stream=True)),
    "proxy chat streamed": timed(base + "/chat/completions", chat),
    "proxy messages streamed": timed(root + "/v1/messages", messages),
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    import yaml

    from nemo_gym.serving.server_client import ServerClient
    from nemo_gym.testing import SyncClient, read_jsonl, running_server
    from resources_servers.example_session_state_mgmt.app import ExampleSessionStateMgmtServer
    from responses_api_agents.harness_agent.app import HarnessAgent
    from responses_api_models.scripted_model.app import ScriptedModel

    env_dir = ROOT / "resources_servers/example_session_state_mgmt"
    scripts = yaml.safe_load((env_dir / "configs/scripted_policy.yaml").read_text())["policy_model"][
        "responses_api_models"
    ]["scripted_model"]["scripts"]
    program = Path("/tmp") / f"bench_harness_turn_{__import__('os').getpid()}.py"
    program.write_text(PROGRAM)
    try:
        env = ExampleSessionStateMgmtServer({"name": "env"})
        model = ScriptedModel({"name": "model", "scripts": scripts})
        with running_server(env) as env_url, running_server(model) as model_url:
            agent = HarnessAgent(
                {
                    "name": "agent",
                    "resources_server": {"type": "resources_servers", "name": "env"},
                    "model_server": {"type": "responses_api_models", "name": "model"},
                    "command": ["{python}", str(program), str(args.calls)],
                    "env": {"BENCH_MODEL_URL": model_url},
                    "max_model_calls": 10 * args.calls,
                    "wall_time_s": 600,
                    "cpu_time_s": 600,
                },
                server_client=ServerClient(static_urls={"env": env_url, "model": model_url}),
            )
            with running_server(agent) as agent_url, SyncClient(timeout_s=900) as client:
                row = read_jsonl(env_dir / "data/example.jsonl")[0]
                status, body = client.post(agent_url + "/run", row)
        assert status == 200, body
        timings = json.loads(body["harness"]["stdout_tail"].strip().splitlines()[-1])
    finally:
        program.unlink(missing_ok=True)
    direct = timings["direct responses"]["p50_ms"]
    for name, numbers in timings.items():
        extra = "" if name.startswith("direct") else f"  overhead p50 {numbers['p50_ms'] - direct:+.3f} ms"
        print(f"{name:28s} p50 {numbers['p50_ms']:8.3f} ms  p95 {numbers['p95_ms']:8.3f} ms{extra}")


if __name__ == "__main__":
    main()
