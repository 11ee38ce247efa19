"""``gym env schema`` (``ng_env_schema``): print a resources server's task-data schema as JSON Schema.

The schema is the ``TaskData`` a server ships in ``task_data.py`` beside its ``app.py``
(:mod:`nemo_gym.task_data`); a server without one gets exit code 1 and what to add, as in NeMo Gym.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.console.settings_command import settings_command
from nemo_gym.task_data import TaskDataSchemaError, load_task_data_schema
from nemo_gym.tools.authoring import find_server_folder


class SchemaSettings(BaseModel):
    """The arguments of ``gym env schema``."""

    model_config = ConfigDict(extra="ignore")

    entrypoint: str = Field(
        description="The resources server folder (resources_servers/NAME; gym: --resources-server NAME).",
        json_schema_extra={"metavar": "resources_servers/NAME"},
    )


def _show_schema(settings: SchemaSettings) -> int:
    folder = find_server_folder(settings.entrypoint)
    try:
        adapter = load_task_data_schema(folder)
    except TaskDataSchemaError as exc:
        print(f"ng_env_schema: {exc}")
        return 1
    if adapter is None:
        print(
            f"ng_env_schema: {settings.entrypoint} ships no task_data.py schema; add one exporting "
            "`TaskData` (a pydantic model of the row's task fields; see nemo_gym/task_data.py)"
        )
        return 1
    print(json.dumps(adapter.json_schema(), indent=2))
    return 0


ng_env_schema = settings_command(
    _show_schema,
    SchemaSettings,
    "ng_env_schema",
    "Print a resources server's task-data schema (its task_data.py TaskData) as JSON Schema.",
    examples=("ng_env_schema +entrypoint=resources_servers/example_multi_step",),
)
