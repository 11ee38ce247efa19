"""``ng_init_resources_server``: scaffold a new environment that passes ``ng_test`` as generated.

``ng_init_resources_server +entrypoint=resources_servers/<name> "+description=..."`` writes,
relative to the working directory (the description goes into the config and README)::

    resources_servers/<name>/
        __init__.py
        app.py                        one example tool (add_numbers) and a verify
        configs/<name>.yaml           the resources server + its <name>_simple_agent
        configs/scripted_policy.yaml  scripted-model rules that solve the example rows
        data/example.jsonl            five rows
        data/example_metrics.json     their statistics, as ng_prepare_data computes them
        tests/test_app.py             tool, verify and data tests
        README.md

The example is deliberately small: replace the tool, the rows and ``verify`` with your own.
"""

from __future__ import annotations

import json
import keyword
import re
from pathlib import Path
from string import Template
from typing import Any

from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, load_config

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
# Longer names would push generated lines past the project's line length (110).
MAX_NAME_CHARS = 40
KIND_FOLDER = "resources_servers"

APP_TEMPLATE = '''\
"""$name: an example environment. The model adds numbers with a tool and states the sum.

Replace the tool, the request/response models and ``verify`` with your environment's own.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.response_items import function_calls, output_text


class ${class_prefix}Config(BaseResourcesServerConfig):
    """Fields under ``resources_servers.$name`` in configs/$name.yaml (add your settings here)."""


class AddNumbersRequest(BaseModel):
    """Arguments of the ``add_numbers`` tool; keep in step with the JSON schema in the rows' ``tools``."""

    a: int
    b: int


class AddNumbersResponse(BaseModel):
    """What ``add_numbers`` returns to the model."""

    sum: int


class ${class_prefix}VerifyRequest(BaseVerifyRequest):
    """A dataset row plus the model's ``response``; ``expected_answer`` comes from the row."""

    expected_answer: str


class ${class_prefix}VerifyResponse(BaseVerifyResponse):
    """The verdict's diagnostics, saved with every rollout."""

    extracted_answer: str | None
    used_tool: bool


class ${class_prefix}Server(SimpleResourcesServer):
    """Rewards a final answer whose last integer equals the row's ``expected_answer``."""

    config: ${class_prefix}Config
    # ``response`` and ``responses_create_params`` stay plain dicts in handlers (read them as
    # ``body.response["output"]``): the faster path, as every bundled environment uses.
    plain_bodies = True

    @tool
    async def add_numbers(self, body: AddNumbersRequest) -> AddNumbersResponse:
        """Add two integers (served at ``POST /add_numbers``)."""
        return AddNumbersResponse(sum=body.a + body.b)

    async def verify(
        self,
        body: ${class_prefix}VerifyRequest,
    ) -> ${class_prefix}VerifyResponse:
        """1.0 when the last integer of the final answer is ``expected_answer``, else 0.0."""
        numbers = re.findall(r"-?\\d+", output_text(body.response))
        extracted = numbers[-1] if numbers else None
        used_tool = any(
            call.get("name") == "add_numbers" for call in function_calls(body.response.get("output") or [])
        )
        return ${class_prefix}VerifyResponse(
            **body.model_dump(),
            reward=float(extracted == body.expected_answer.strip()),
            extracted_answer=extracted,
            used_tool=used_tool,
        )


if __name__ == "__main__":
    ${class_prefix}Server.run_webserver()
'''

CONFIG_TEMPLATE = """\
# The $name environment and the agent that runs it against the policy model.
$name:
  resources_servers:
    $name:
      entrypoint: app.py
      domain: other
      description: $description_yaml
${name}_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: $name
      model_server:
        type: responses_api_models
        name: policy_model
      max_steps: 10
      datasets:
        - name: example
          type: example
          jsonl_fpath: resources_servers/$name/data/example.jsonl
"""

SCRIPTED_POLICY_TEMPLATE = """\
# A scripted policy that solves the example rows, for tests and demos without a real model.
# Add it after responses_api_models/scripted_model/configs/scripted_model.yaml in +config_paths.
policy_model:
  responses_api_models:
    scripted_model:
      scripts:
        - match: 'What is (-?\\d+) plus (-?\\d+)\\?'
          turns:
            - call_tool: add_numbers
              arguments: {a: "{match[1]}", b: "{match[2]}"}
            - text: "The tool says {tool_output}, so the answer is the sum."
"""

TEST_TEMPLATE = '''\
"""$name: the tool, verify on right/wrong/missing answers, and the example rows."""

import json
from pathlib import Path

import pytest

from nemo_gym.response_items import function_call_item, message_item
from nemo_gym.testing import SyncClient, running_server
from resources_servers.$name import app

HERE = Path(__file__).resolve().parent.parent
EXAMPLES = HERE / "data" / "example.jsonl"
ROWS = [json.loads(line) for line in EXAMPLES.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def url():
    with running_server(app.${class_prefix}Server({"name": HERE.name})) as base:
        yield base


def verify(url: str, row: dict, output: list) -> dict:
    with SyncClient() as client:
        status, body = client.post(url + "/verify", {**row, "response": {"output": output}})
    assert status == 200, body
    return body


def test_add_numbers_and_bad_arguments(url: str):
    with SyncClient() as client:
        assert client.post(url + "/add_numbers", {"a": 2, "b": -5}) == (200, {"sum": -3})
        status, body = client.post(url + "/add_numbers", {"a": 2})
        assert status == 422 and body["detail"][0]["field"] == "b"


def test_reward_follows_the_final_answer(url: str):
    row = ROWS[0]
    call = function_call_item("add_numbers", json.dumps({"a": 1, "b": 2}))
    right = verify(url, row, [call, message_item(f"The sum is {row['expected_answer']}.")])
    assert (right["reward"], right["used_tool"]) == (1.0, True)
    assert right["extracted_answer"] == row["expected_answer"]
    wrong = verify(url, row, [message_item("The sum is 999999.")])
    assert (wrong["reward"], wrong["used_tool"]) == (0.0, False)
    assert verify(url, row, [])["reward"] == 0.0


def test_example_rows_are_solvable():
    assert len(ROWS) == 5
    for row in ROWS:
        question = row["responses_create_params"]["input"][-1]["content"]
        a, b = (int(n) for n in question.removeprefix("What is ").removesuffix("?").split(" plus "))
        assert str(a + b) == row["expected_answer"]
'''

README_TEMPLATE = """\
# $name

$description

Scaffolded by `ng_init_resources_server` with an example to replace: the model gets two
integers, may call the `add_numbers` tool, and must state the sum.

- **Tools**: `add_numbers(a, b)` → `{"sum": a + b}`.
- **Reward**: 1.0 when the last integer in the final assistant message equals the row's
  `expected_answer`, else 0.0. Diagnostics: `extracted_answer`, `used_tool`.
- **Rows** (`data/example.jsonl`): `responses_create_params` (the prompt and the tool schema) and
  `expected_answer`.

## Run

```bash
ng_test +entrypoint=resources_servers/$name
ng_run "+config_paths=[resources_servers/$name/configs/$name.yaml,responses_api_models/scripted_model/configs/scripted_model.yaml,resources_servers/$name/configs/scripted_policy.yaml]"
ng_collect_rollouts +agent_name=${name}_simple_agent +input_jsonl_fpath=resources_servers/$name/data/example.jsonl +output_jsonl_fpath=results/$name.jsonl
```

`configs/scripted_policy.yaml` scripts the test model so that every example row succeeds; use
`responses_api_models/openai_model` or `vllm_model` for a real policy.
"""

EXAMPLE_PAIRS = [(17, 25), (120, -45), (3, 4), (999, 1), (-8, -13)]


def example_rows() -> list[dict[str, Any]]:
    """The five example rows: a question, the tool schema and the expected sum."""
    tool_schema = {
        "type": "function",
        "name": "add_numbers",
        "description": "Add two integers and return their sum.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "The first addend."},
                "b": {"type": "integer", "description": "The second addend."},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        "strict": True,
    }
    return [
        {
            "responses_create_params": {
                "input": [
                    {
                        "role": "developer",
                        "content": "Use the add_numbers tool for arithmetic, then state the result.",
                    },
                    {"role": "user", "content": f"What is {a} plus {b}?"},
                ],
                "tools": [tool_schema],
            },
            "expected_answer": str(a + b),
        }
        for a, b in EXAMPLE_PAIRS
    ]


def class_prefix(name: str) -> str:
    """``my_env`` → ``MyEnv`` (the prefix of the generated class names)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def validate_name(name: str) -> None:
    """An environment name is a lowercase Python identifier (it becomes a package name)."""
    if not NAME_PATTERN.match(name) or keyword.iskeyword(name):
        raise ConfigError(
            f"environment name {name!r} must be a lowercase Python identifier "
            "(letters, digits and underscores, starting with a letter), e.g. my_env"
        )
    if len(name) > MAX_NAME_CHARS:
        raise ConfigError(
            f"environment name {name!r} has {len(name)} characters; use at most {MAX_NAME_CHARS}"
        )


DEFAULT_DESCRIPTION = "Add two numbers with a tool; reward 1.0 when the final answer is the sum."


def scaffold_files(name: str, description: str | None = None) -> dict[str, str]:
    """The generated files, by path relative to the environment folder.

    ``description`` (what the new environment does) goes into its config and README.
    """
    text = " ".join((description or DEFAULT_DESCRIPTION).split())
    fields = {
        "name": name,
        "class_prefix": class_prefix(name),
        "description": text,
        "description_yaml": json.dumps(text),
    }
    rows = "".join(json.dumps(row) + "\n" for row in example_rows())
    return {
        "__init__.py": "",
        "app.py": Template(APP_TEMPLATE).substitute(fields),
        f"configs/{name}.yaml": Template(CONFIG_TEMPLATE).substitute(fields),
        "configs/scripted_policy.yaml": SCRIPTED_POLICY_TEMPLATE,
        "data/example.jsonl": rows,
        "tests/test_app.py": Template(TEST_TEMPLATE).substitute(fields),
        "README.md": Template(README_TEMPLATE).substitute(fields),
    }


def new_folder(kind_folder: str, entrypoint: str, cwd: Path | None = None) -> tuple[Path, str]:
    """The folder ``<kind_folder>/<name>`` under ``cwd`` that ``entrypoint`` names, and the name;
    ``ConfigError`` for an entrypoint of another shape, a bad name, or a folder that exists."""
    relative = Path(entrypoint.rstrip("/"))
    if relative.is_absolute() or len(relative.parts) != 2 or relative.parts[0] != kind_folder:
        raise ConfigError(f"+entrypoint must look like {kind_folder}/<name>, got {entrypoint!r}")
    name = relative.parts[1]
    validate_name(name)
    folder = (cwd or Path.cwd()) / relative
    if folder.exists():
        raise ConfigError(f"{folder} already exists; pick another name or remove it first")
    return folder, name


def write_files(folder: Path, files: dict[str, str]) -> None:
    """Write ``files`` (text by path relative to ``folder``), making their directories."""
    for path, text in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def init_resources_server(entrypoint: str, cwd: Path | None = None, description: str | None = None) -> Path:
    """Create ``resources_servers/<name>`` under ``cwd``; refuses to touch an existing folder.

    ``description`` says what the environment does (its config's and README's description).
    """
    folder, name = new_folder(KIND_FOLDER, entrypoint, cwd)
    write_files(folder, scaffold_files(name, description))
    _write_example_metrics(folder, name)
    return folder


def _write_example_metrics(folder: Path, name: str) -> None:
    """``data/example_metrics.json``, so ``ng_prepare_data`` reports any later change to the rows."""
    from nemo_gym.tools.prepare_data import AgentDataset, DatasetConfig, check_dataset

    config = DatasetConfig(
        name="example", type="example", jsonl_fpath=f"{KIND_FOLDER}/{name}/data/example.jsonl"
    )
    report = check_dataset(AgentDataset(f"{name}_simple_agent", config, folder / "data" / "example.jsonl"))
    (folder / "data" / "example_metrics.json").write_text(json.dumps(report.metrics, indent=4) + "\n")


def next_steps(name: str) -> str:
    """What to do after scaffolding, as printed by the command."""
    folder = f"{KIND_FOLDER}/{name}"
    configs = (
        f"{folder}/configs/{name}.yaml,responses_api_models/scripted_model/configs/scripted_model.yaml,"
        f"{folder}/configs/scripted_policy.yaml"
    )
    return f"""Created {folder}/ (app.py, configs/{name}.yaml, configs/scripted_policy.yaml, data/example.jsonl, data/example_metrics.json, tests/test_app.py, README.md).

Next steps:
  1. Check it:         ng_test +entrypoint={folder}
  2. Run it:           ng_run "+config_paths=[{configs}]"
  3. Collect rollouts: ng_collect_rollouts +agent_name={name}_simple_agent +input_jsonl_fpath={folder}/data/example.jsonl +output_jsonl_fpath=results/{name}_rollouts.jsonl
  4. Make it yours:    edit the tool and verify() in {folder}/app.py, the rows in data/example.jsonl,
                       the scripts in configs/scripted_policy.yaml; see docs/WRITING_ENVIRONMENTS.md.
"""


def _init_command(argv: list[str]) -> int:
    config = load_config(argv)
    entrypoint = config.get("entrypoint")
    if not entrypoint or not isinstance(entrypoint, str):
        raise ConfigError(f"+entrypoint={KIND_FOLDER}/<name> is required")
    # The text as typed: a YAML reading would turn "Units: convert km" into a mapping.
    typed = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("description=")]
    description = typed[-1] if typed else config.get("description")
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise ConfigError(f"+description must be a non-empty text, got {description!r}")
    folder = init_resources_server(entrypoint, description=description)
    print(next_steps(folder.name), end="")
    return 0


ng_init_resources_server = console_command(_init_command, "ng_init_resources_server")
