"""``ng_init_agent`` and ``ng_init_model``: scaffold a new agent or model adapter that passes ``ng_test``.

``ng_init_agent +entrypoint=responses_api_agents/<name>`` and
``ng_init_model +entrypoint=responses_api_models/<name>`` write, relative to the working
directory, the folder docs/WRITING_AGENTS_AND_MODELS.md describes::

    <kind>/<name>/
        __init__.py
        app.py               the agent (seed, one model call, verify) or the model (an echo engine)
        configs/<name>.yaml  the server, paired by instance name with the example environment
        tests/test_app.py    a rollout on loopback, and a dead server as a classified failure
        README.md

The same layout and checks as ``ng_init_resources_server`` (:mod:`nemo_gym.tools.scaffold`) for an
environment; the example is deliberately small: replace it with your own loop or engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from string import Template

from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, load_config
from nemo_gym.tools.scaffold import class_prefix, new_folder, write_files

AGENT_FOLDER = "responses_api_agents"
MODEL_FOLDER = "responses_api_models"

AGENT_APP = '''\
"""$name: one model call per rollout and no tools: seed the environment, ask the model, verify.

Replace ``run`` with your agent's loop; ``self.rollout_client(body)`` keeps the environment's
session and one replica of each server for the whole rollout.
"""

from typing import Any

from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
    row_create_params,
)
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef


class ${class_prefix}Config(BaseResponsesAPIAgentConfig):
    """The environment and the model this agent runs rows between."""

    resources_server: ResourcesServerRef
    model_server: ModelServerRef


class ${class_prefix}Agent(SimpleResponsesAPIAgent):
    """Asks the model once per row; whatever it answers is verified."""

    config: ${class_prefix}Config

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """Seed the environment's session, call the model once, return the verify answer.

        A call that fails raises, and the rollout becomes a classified failure: never catch it
        to return a reward.
        """
        rollout = self.rollout_client(body)
        env, model = self.config.resources_server.name, self.config.model_server.name
        await rollout.post_json(env, "/seed_session", body)
        response = await rollout.post_json(model, "/v1/responses", row_create_params(body))
        return await rollout.post_json(env, "/verify", {**body, "response": response})

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """The model's answer to a Responses request, as it is."""
        return await self.rollout_client().post_json(self.config.model_server.name, "/v1/responses", body)


if __name__ == "__main__":
    ${class_prefix}Agent.run_webserver()
'''

AGENT_CONFIG = """\
# The $name agent between the example environment and the policy model.
${name}_example:
  responses_api_agents:
    $name:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: example_single_tool_call
      model_server:
        type: responses_api_models
        name: policy_model
"""

MODEL_APP = '''\
"""$name: answers every request with the text of its last user message (an engine stand-in).

Replace ``responses`` with a call to your engine; an engine that fails raises ``HTTPError`` with
a failure class, so the rollout is a classified failure and never a reward of 0.
"""

import time
import uuid
from typing import Any

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.response_items import input_items, message_item


class ${class_prefix}Config(BaseResponsesAPIModelConfig):
    """Fields under ``responses_api_models.$name`` in configs/$name.yaml (add your engine's here)."""


class ${class_prefix}Model(SimpleResponsesAPIModel):
    """A model server whose engine repeats the user."""

    config: ${class_prefix}Config

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Responses object for one create request."""
        users = [item for item in input_items(body) if item.get("role") == "user"]
        content = users[-1]["content"] if users else ""
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        return {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model") or self.name,
            "status": "completed",
            "output": [message_item(f"You said: {text}")],
        }


if __name__ == "__main__":
    ${class_prefix}Model.run_webserver()
'''

MODEL_CONFIG = """\
# The $name model adapter, serving as the policy model.
policy_model:
  responses_api_models:
    $name:
      entrypoint: app.py
"""

AGENT_TEST = '''\
"""$name: a rollout between a tiny environment and model on loopback, and a dead model as a failure."""

from typing import Any

from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer
from nemo_gym.base_responses_api_model import SimpleResponsesAPIModel
from nemo_gym.response_items import message_item, output_text
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import SyncClient, running_server
from responses_api_agents.$name import app

ROW = {"responses_create_params": {"input": [{"role": "user", "content": "How is the weather?"}]}}
REFS = {
    "resources_server": {"type": "resources_servers", "name": "env"},
    "model_server": {"type": "responses_api_models", "name": "model"},
}


class SunnyEnvironment(SimpleResourcesServer):
    """Rewards an answer that says it is sunny."""

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        said = output_text(body.response).lower()
        return BaseVerifyResponse(**body.model_dump(), reward=float("sunny" in said))


class SunnyModel(SimpleResponsesAPIModel):
    """A model that always says it is sunny."""

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        output = [message_item("Sunny.")]
        return {"id": "resp_1", "object": "response", "created_at": 0, "model": "sunny", "output": output}


def agent(client: ServerClient) -> app.${class_prefix}Agent:
    return app.${class_prefix}Agent({"name": "agent", **REFS}, server_client=client)


def test_a_rollout_is_seeded_answered_and_verified():
    with (
        running_server(SunnyEnvironment({"name": "env"})) as env_url,
        running_server(SunnyModel({"name": "model"})) as model_url,
    ):
        client = ServerClient(static_urls={"env": env_url, "model": model_url})
        with running_server(agent(client)) as url, SyncClient() as http:
            status, body = http.post(url + "/run", ROW)
            assert status == 200, body
            assert (output_text(body["response"]), body["reward"]) == ("Sunny.", 1.0)
            status, answer = http.post(url + "/v1/responses", {"input": "hello"})
            assert status == 200 and output_text(answer) == "Sunny."


def test_a_dead_model_is_a_classified_failure_never_a_reward():
    with running_server(SunnyEnvironment({"name": "env"})) as env_url:
        client = ServerClient(static_urls={"env": env_url, "model": "http://127.0.0.1:9"}, connect_retries=0)
        with running_server(agent(client)) as url, SyncClient() as http:
            status, body = http.post(url + "/run", ROW)
    assert status == 502 and body["failure_class"] == "unreachable" and "reward" not in body
'''

MODEL_TEST = '''\
"""$name: the Responses answer to a request, and a malformed request refused with a 4xx."""

from nemo_gym.response_items import output_text
from nemo_gym.testing import SyncClient, running_server
from responses_api_models.$name import app


def test_responses_answers_with_the_last_user_message():
    with running_server(app.${class_prefix}Model({"name": "model"})) as url, SyncClient() as http:
        status, body = http.post(url + "/v1/responses", {"input": [{"role": "user", "content": "hi"}]})
    assert status == 200, body
    assert body["object"] == "response" and output_text(body) == "You said: hi"


def test_a_malformed_request_is_refused_naming_the_field():
    with running_server(app.${class_prefix}Model({"name": "model"})) as url, SyncClient() as http:
        status, body = http.post(url + "/v1/responses", {"input": 5})
    assert 400 <= status < 500 and "input" in str(body), body
'''

README = """\
# $name

$what Scaffolded by `$command` from docs/WRITING_AGENTS_AND_MODELS.md; replace the example with
your own.

## Check it

```bash
ng_test +entrypoint=$folder/$name
```
"""

KINDS = {
    AGENT_FOLDER: (
        "ng_init_agent",
        AGENT_APP,
        AGENT_CONFIG,
        AGENT_TEST,
        "An agent: seed, one model call, verify.",
    ),
    MODEL_FOLDER: ("ng_init_model", MODEL_APP, MODEL_CONFIG, MODEL_TEST, "A model adapter: an echo engine."),
}


def server_scaffold_files(kind_folder: str, name: str) -> dict[str, str]:
    """The generated files of an agent or model folder, by path relative to it."""
    command, app, config, test, what = KINDS[kind_folder]
    fields = {"name": name, "class_prefix": class_prefix(name), "command": command, "what": what}
    fields["folder"] = kind_folder
    return {
        "__init__.py": "",
        "app.py": Template(app).substitute(fields),
        f"configs/{name}.yaml": Template(config).substitute(fields),
        "tests/test_app.py": Template(test).substitute(fields),
        "README.md": Template(README).substitute(fields),
    }


def init_server(kind_folder: str, entrypoint: str, cwd: Path | None = None) -> Path:
    """Create ``<kind_folder>/<name>`` under ``cwd``; refuses to touch an existing folder."""
    folder, name = new_folder(kind_folder, entrypoint, cwd)
    write_files(folder, server_scaffold_files(kind_folder, name))
    return folder


def _command(kind_folder: str) -> Callable[[Sequence[str] | None], None]:
    def body(argv: list[str]) -> int:
        entrypoint = load_config(argv).get("entrypoint")
        if not entrypoint or not isinstance(entrypoint, str):
            raise ConfigError(f"+entrypoint={kind_folder}/<name> is required")
        folder = init_server(kind_folder, entrypoint)
        print(
            f"Created {kind_folder}/{folder.name}/ (app.py, configs/{folder.name}.yaml, tests/test_app.py, README.md).\n\n"
            f"Next steps:\n  1. Check it:    ng_test +entrypoint={kind_folder}/{folder.name}\n"
            f"  2. Make it yours: edit {kind_folder}/{folder.name}/app.py; see docs/WRITING_AGENTS_AND_MODELS.md.\n"
        )
        return 0

    return console_command(body, KINDS[kind_folder][0])


ng_init_agent = _command(AGENT_FOLDER)
ng_init_model = _command(MODEL_FOLDER)
