"""The task fields of an example_multi_step row, for ``gym env schema`` and data validation."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TaskData(BaseModel):
    """One row's task: the synonyms to look up and the label the agent must not send."""

    model_config = ConfigDict(extra="allow")

    id: int = Field(description="Row id.", json_schema_extra={"consumed_by": ["provenance"]})
    expected_synonyms: list[str] = Field(
        description="Synonyms of the chosen term, in the order the values are expected.",
        json_schema_extra={"consumed_by": ["provenance"]},
    )
    expected_synonym_values: list[int] = Field(
        description="The values /verify expects, one per synonym.",
        json_schema_extra={"consumed_by": ["verify"]},
    )
    minefield_label: str = Field(
        description="The term itself, which must not be looked up.",
        json_schema_extra={"consumed_by": ["verify"]},
    )
    minefield_label_value: int = Field(
        description="The term's own value; sending it scores 0.",
        json_schema_extra={"consumed_by": ["verify"]},
    )
