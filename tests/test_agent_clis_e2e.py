"""[HARNESS] The npm coding-agent CLIs as agents of the stack, on the CPU engine, certified.

Each CLI (Claude Code over Anthropic Messages, Codex over Responses, OpenCode over Chat
Completions, Gemini CLI over the Gemini API, all streaming) runs through its agent folder inside harness_agent's confinement,
pointed at the capture proxy. The engine emits a scripted coding trajectory (write ``sol.py``
with the CLI's shell tool, run it, answer with the program) with the tiny model's real token IDs
and log-probs; code_gen verifies the answer against the row's unit tests in its sandbox.
``ng_collect_rollouts`` collects the rollout and ``ng_certify_harness`` certifies it (prefix,
loss mask, re-scored log-probs).

The CLIs come from npm (``scripts/test.sh`` installs them into ``$NEMO_GYM_AGENT_CLI_DIR`` or
``~/.cache/nemo_gym/agent_clis``); a test skips, naming what is missing, when one is not there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym.launch.config import project_root
from nemo_gym.rollout_collection import ng_collect_rollouts
from nemo_gym.testing import read_jsonl, running_stack
from responses_api_agents.harness_agent.cli_agent import NPM_PACKAGES, cli_executable, default_cli_dir

pytestmark = pytest.mark.slow

ROOT = project_root()
SOLUTION = (
    "import sys\ndata = sys.stdin.read().split()\nfor i in range(int(data[0])):\n"
    "    print(int(data[1 + 2 * i]) + int(data[2 + 2 * i]))\n"
)
# agent folder, executable, shell tool name, its command argument, config fields that keep the
# prompt small enough for the tiny CPU engine.
CLIS: dict[str, tuple[str, str, str, str, dict[str, Any]]] = {
    "claude": ("claude_code_agent", "claude", "Bash", "command", {"tools": "Bash", "max_turns": 6}),
    "codex": ("codex_agent", "codex", "exec_command", "cmd", {}),
    "opencode": ("opencode_agent", "opencode", "bash", "command", {}),
    "gemini": (
        "gemini_cli_agent",
        "gemini",
        "run_shell_command",
        "command",
        {"settings": {"tools": {"core": ["run_shell_command"]}}, "system_prompt": "You are a coding agent."},
    ),
}


def scripted_turns(tool: str, argument: str) -> list[str]:
    """The policy's three turns: write the program, run it on the example, answer with it."""

    def call(command: str) -> str:
        return (
            "<tool_call>\n" + json.dumps({"name": tool, "arguments": {argument: command}}) + "\n</tool_call>"
        )

    return [
        call("cat > sol.py << 'EOF'\n" + SOLUTION + "EOF"),
        call("printf '2\\n1 2\\n-5 5\\n' | python3 sol.py"),
        "It prints 3 and 0.\n```python\n" + SOLUTION + "```",
    ]


@pytest.mark.parametrize("cli", sorted(CLIS))
def test_a_cli_completes_a_certified_tool_using_rollout_on_the_cpu_engine(cli: str, tmp_path: Path):
    folder, executable, tool, argument, fields = CLIS[cli]
    if shutil.which("node") is None:
        pytest.skip("node is not installed (the CLIs need it; scripts/test.sh installs them with npm)")
    if cli_executable(executable) is None:
        pytest.skip(
            f"{NPM_PACKAGES[executable]} is not installed under {default_cli_dir()} "
            "(scripts/test.sh installs it when npm is available)"
        )
    agent = f"{cli}_agent"
    overrides = {
        "local_hf_engine": {
            "responses_api_models": {
                "local_hf_model": {
                    "forced_completions": scripted_turns(tool, argument),
                    "default_max_tokens": 200,
                }
            }
        },
        agent: {
            "responses_api_agents": {
                folder: {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": "code_gen"},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                    "timeout": 300,
                    **fields,
                }
            }
        },
    }
    config = tmp_path / "stack.yaml"
    config.write_text(yaml.safe_dump(overrides))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(read_jsonl(ROOT / "resources_servers/code_gen/data/example.jsonl")[0]) + "\n")
    out = tmp_path / "rollouts.jsonl"
    configs = [
        "resources_servers/code_gen/configs/code_gen.yaml",
        "responses_api_models/local_hf_model/configs/local_hf_model.yaml",
        str(config),
    ]
    with running_stack(configs) as stack:
        port = stack.head_server_config["port"]
        with pytest.raises(SystemExit) as exited:
            ng_collect_rollouts(
                [
                    f"++head_server.port={port}",
                    f"+agent_name={agent}",
                    f"+input_jsonl_fpath={rows}",
                    f"+output_jsonl_fpath={out}",
                    "+limit=1",
                ]  # fmt: skip
            )
        collected = read_jsonl(out) if out.exists() else []
        failures = tmp_path / "rollouts_failures.jsonl"
        assert int(exited.value.code or 0) == 0, read_jsonl(failures) if failures.exists() else collected
        certify = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from nemo_gym.tools.certify_harness import ng_certify_harness as c; "
                "c(sys.argv[1:])",
                f"++head_server.port={port}",
                f"+rollouts_jsonl_fpath={out}",
                "+engine_server=local_hf_engine",
                f"+harness={folder}",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=300,
        )
    (row,) = collected
    harness = row["harness"]
    assert row["reward"] == 1.0, harness
    assert harness["status"] == "ok" and harness["model_calls"] >= 3, harness
    output = row["response"]["output"]
    calls = [item for item in output if "prompt_token_ids" in item]
    # The CLI ran its tools itself: their outputs are the program's, kept for the record under
    # harness.program_items and never graded as the policy's (#34).
    assert not [item for item in output if item.get("type") == "function_call_output"], output
    own = [entry["item"] for entry in harness["program_items"]]
    tool_results = [item for item in own if item.get("type") == "function_call_output"]
    assert len(calls) >= 3 and len(tool_results) >= 2, [item.get("type") for item in own]
    assert "3\n0" in json.dumps(tool_results[1]).replace("\\n", "\n"), tool_results[1]
    assert certify.returncode == 0, certify.stdout + certify.stderr
    report = json.loads(out.with_suffix(".certificate.json").read_text())
    assert report["verdict"] in ("token-exact", "token-exact in split sequences"), report
    assert report["loss_mask_exact"] and report["rescored"] and report["max_logprob_diff"] <= 1e-3
    assert out.with_suffix(".certificate.html").read_text().count("Rollout 0") == 1
    # Every break is named with a cause and a token range; the sequences cover every call.
    (rollout,) = report["rollouts"]
    assert all(b["cause"] and b["token_range"][0] < b["token_range"][1] for b in rollout["breaks"])
    assert sorted(c for s in rollout["sequences"] for c in s["calls"]) == list(range(rollout["num_calls"]))
