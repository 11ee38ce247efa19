"""NeMo Gym's own ``openenv`` folder, pulled by name with ``gym env pull openenv==0.7.0``, runs its
Echo config here unchanged through ``gym eval run``.

OpenEnv's ``echo_env`` is published only in OpenEnv's git repository (the folder's requirements
name it ``@ git+https://...``; no package on the index carries it, and CI reaches only the index),
so the pull is made with ``+install=false`` and the config's ``env_class`` is pointed, by an
override, at ``tests/openenv_user_env/user_echo_env.py``: an Echo environment written against
openenv-core's public ``MCPEnvironment`` API with echo_env's two tools, as a user points the folder
at an environment of their own. The folder's ``app.py``, configs and rows are not touched.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from nemo_gym.testing import gym_project

USER_ENV = Path(__file__).resolve().parent / "openenv_user_env"
SCRIPTED = "responses_api_models/scripted_model/configs/scripted_model.yaml"
SERVER = "++openenv_echo_resources_server.resources_servers.openenv"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openenv") is None,
    reason="openenv-core is not installed (pip install -e '.[openenv]')",
)


def _echo_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.usefixtures("nemo_gym_wheel")
def test_pulled_openenv_folder_runs_its_echo_environment(tmp_path: Path) -> None:
    project = gym_project(tmp_path / "project", ["responses_api_models/scripted_model"], [USER_ENV])
    pulled = project.pull("openenv==0.7.0", "+install=false")
    assert pulled.returncode == 0, pulled.stderr
    folder = project.root / "resources_servers" / "openenv"
    assert json.loads((folder / ".nemo_gym_source.json").read_text())["version"] == "0.7.0"
    assert "openenv-echo-env @ git+" in pulled.stdout  # named as not installed, not silently dropped
    config = "resources_servers/openenv/configs/openenv_echo.yaml"
    assert "echo_env.server.echo_environment.EchoEnvironment" in (project.root / config).read_text()

    # 1. The Echo config as shipped (MCP: the folder lists the tools at start and serves one route
    #    per tool), its five rows; the scripted model calls the row's first tool, then answers.
    out = tmp_path / "echo.jsonl"
    run = project.gym(
        "eval", "run", f"+config_paths=[{config},{SCRIPTED}]",
        "+input_jsonl_fpath=resources_servers/openenv/data/echo/example.jsonl", f"+output_jsonl_fpath={out}",
        "head_server.port=0", f"{SERVER}.env_class=user_echo_env.UserEchoEnvironment",
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    results = _echo_rows(out)
    assert len(results) == 5
    for row in results:
        calls = [o for o in row["response"]["output"] if o["type"] == "function_call"]
        outputs = [o for o in row["response"]["output"] if o["type"] == "function_call_output"]
        assert calls and calls[0]["name"] == "echo_message"
        sent = json.loads(calls[0]["arguments"])["message"]
        # The environment's own answer came back through the folder's MCP route...
        assert json.loads(outputs[0]["output"])["result"]["structured_content"] == {"result": sent}
        # ...and its reward: an echo tool call earns 0.0 (as NeMo Gym's recorded Echo rollouts show).
        assert row["reward"] == 0.0

    # 2. The same folder, same environment class, through its non-MCP path (``is_mcp: false``: one
    #    ``/step`` route building the configured action class): a plain echo step earns 0.1 per
    #    character, summed by the folder's verify.
    rows = tmp_path / "step_rows.jsonl"
    step_tool = {
        "type": "function", "name": "step", "description": "Echo a message.", "strict": True,
        "parameters": {"type": "object", "properties": {"message": {"type": "string"}},
                       "required": ["message"], "additionalProperties": False},
    }  # fmt: skip
    rows.write_text(
        "".join(
            json.dumps(
                {
                    "responses_create_params": {
                        "input": [{"role": "user", "content": word}],
                        "tools": [step_tool],
                    }
                }
            )
            + "\n"
            for word in ("hello", "reinforcement")
        )
    )
    out = tmp_path / "step.jsonl"
    run = project.gym(
        "eval", "run", f"+config_paths=[{config},{SCRIPTED}]", f"+input_jsonl_fpath={rows}",
        f"+output_jsonl_fpath={out}", "head_server.port=0", f"{SERVER}.env_class=user_echo_env.UserEchoEnvironment",
        f"{SERVER}.action_class=user_echo_env.UserEchoAction", f"{SERVER}.is_mcp=false",
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    by_prompt = {r["responses_create_params"]["input"][0]["content"]: r for r in _echo_rows(out)}
    for word, row in by_prompt.items():
        sent = json.loads(
            next(o for o in row["response"]["output"] if o["type"] == "function_call")["arguments"]
        )
        assert row["reward"] == pytest.approx(0.1 * len(sent["message"])), word
        assert row["reward"] > 0
