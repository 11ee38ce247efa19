"""NeMo Gym's own ``verifiers_agent`` folder, pulled by name with ``gym env pull
verifiers_agent==0.7.0``, runs a verifiers environment here through ``gym eval run``: verifiers
runs the rollout against our model server, and the reward is its rubric's.

The folder's example environment (``acereason-math``) is published on Prime Intellect's own
package index and its ``verifiers`` requirement names a git tag; CI reaches only the package
index, where ``verifiers`` 0.3.1 is (the ``verifiers_agent`` extra). So the pull is made with
``+install=false`` and the config's ``vf_env_id`` is pointed, by an override, at
``tests/verifiers_user_env/vf_first_letter.py``, a verifiers environment written as a user writes
one. The folder's files are not touched.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from nemo_gym.testing import gym_project

USER_ENV = Path(__file__).resolve().parent / "verifiers_user_env"
AGENT = "++verifiers_agent.responses_api_agents.verifiers_agent"
# The scripted policy answers each row with the letter it asks for, except E (answered A).
SCRIPT = """policy_model:
  responses_api_models:
    scripted_model:
      scripts:
        - {match: "letter E", turns: [{text: "A"}]}
        - {match: "letter ([A-E])", turns: [{text: "{match[1]}"}]}
"""

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("verifiers") is None,
    reason="verifiers is not installed (pip install -e '.[verifiers_agent]')",
)


@pytest.mark.slow
@pytest.mark.usefixtures("nemo_gym_wheel")
def test_pulled_verifiers_agent_runs_a_verifiers_environment(tmp_path: Path) -> None:
    project = gym_project(tmp_path / "project", ["responses_api_models"], [USER_ENV])
    pulled = project.pull("verifiers_agent==0.7.0", "+install=false")
    assert pulled.returncode == 0, pulled.stderr
    folder = project.root / "responses_api_agents" / "verifiers_agent"
    assert json.loads((folder / ".nemo_gym_source.json").read_text())["version"] == "0.7.0"
    assert "acereason-math" in pulled.stdout  # named as not installed

    rows = tmp_path / "rows.jsonl"
    with rows.open("w") as f:
        for index, letter in enumerate("ABCDE"):
            question = f"Reply with the letter {letter} only."
            f.write(json.dumps({
                "task_idx": index, "vf_env_id": "vf_first_letter", "question": question, "answer": letter,
                "responses_create_params": {"input": [{"role": "user", "content": question}]},
                "task": "vf_first_letter", "example_id": index, "info": {},
                "agent_ref": {"type": "responses_api_agents", "name": "verifiers_agent"},
            }) + "\n")  # fmt: skip
    (tmp_path / "script.yaml").write_text(SCRIPT)
    out = tmp_path / "out.jsonl"
    configs = [
        "responses_api_agents/verifiers_agent/configs/verifiers_agent.yaml",
        "responses_api_models/scripted_model/configs/scripted_model.yaml",
        str(tmp_path / "script.yaml"),
    ]
    run = project.gym(
        "eval", "run", f"+config_paths=[{','.join(configs)}]", f"+input_jsonl_fpath={rows}",
        f"+output_jsonl_fpath={out}", "head_server.port=0", f"{AGENT}.vf_env_id=vf_first_letter",
        f"{AGENT}.max_tokens=64",
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    results = {
        r["responses_create_params"]["input"][0]["content"][-7]: r
        for r in map(json.loads, out.read_text().splitlines())
    }
    assert sorted(results) == list("ABCDE")
    for letter, row in results.items():
        expected = 0.0 if letter == "E" else 1.0  # the rubric's own score of the scripted answer
        assert row["reward"] == expected, (letter, row["reward"])
        assert row["response"]["metrics"]["first_letter"] == expected
        texts = [c["text"] for o in row["response"]["output"] if o["type"] == "message" for c in o["content"]]
        assert texts[0] == ("A" if letter == "E" else letter)
