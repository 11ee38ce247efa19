"""example_multi_step: look values up with one tool, then submit them, in order, with another.

The model must find the term a user query is about, call ``get_synonym_value`` once per synonym
of that term, then submit the values through ``extract_synonym_values``. The reward is 1.0 when
the submitted list equals the row's ``expected_synonym_values`` (same values, same order).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.response_items import function_calls, output_text

SUBMIT_TOOL = "extract_synonym_values"
LOOKUP_TOOL = "get_synonym_value"
# The last bracketed list of integers in a text answer, e.g. "... are [711, 407]."
_TEXT_LIST = re.compile(r"\[\s*-?\d+(?:\s*,\s*-?\d+)*\s*\]|\[\s*\]")


class ExampleMultiStepConfig(BaseResourcesServerConfig):
    """``accept_text_answer``: with no submit call, read the last ``[n, m, ...]`` of the final text."""

    accept_text_answer: bool = False


class GetSynonymValueRequest(BaseModel):
    """Arguments of ``get_synonym_value``."""

    synonym: str


class GetSynonymValueResponse(BaseModel):
    """What ``get_synonym_value`` returns."""

    synonym_value: int


class ExtractSynonymValuesRequest(BaseModel):
    """Arguments of ``extract_synonym_values``: the submitted values, in order."""

    synonym_values: list[StrictInt]


class ExtractSynonymValuesResponse(BaseModel):
    """What ``extract_synonym_values`` returns (the submission is read from the response at verify)."""

    success: bool


class ExampleMultiStepVerifyRequest(BaseVerifyRequest):
    """The row's task fields (NeMo Gym's names)."""

    expected_synonym_values: list[int]
    expected_synonyms: list[str] = Field(default_factory=list)
    minefield_label: str | None = None
    minefield_label_value: int | None = None


class ExampleMultiStepVerifyResponse(ExampleMultiStepVerifyRequest, BaseVerifyResponse):
    """Reward plus diagnostics of the submission."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    parsed_synonym_values: list[int]
    accuracy: bool
    set_overlap: float
    original_term_minefield_hit: bool
    order_instruction_following_failure: bool
    answer_source: Literal["tool", "text", "none"]
    submission_error: str | None = None
    looked_up_synonyms: list[str]


def synonym_value(synonym: str) -> int:
    """The value of a synonym: the sum of its characters' code points (deterministic, no table)."""
    return sum(ord(ch) for ch in synonym)


def parse_submission(call: dict[str, Any]) -> tuple[list[int], str | None]:
    """The integer list a submit call carries, or ``([], why)`` when its arguments are unusable."""
    try:
        arguments = orjson.loads(call.get("arguments") or "{}")
    except orjson.JSONDecodeError as exc:
        return [], f"arguments are not valid JSON: {exc}"
    values = arguments.get("synonym_values") if isinstance(arguments, dict) else None
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        return [], "synonym_values must be a list of integers"
    return values, None


def score_submission(
    submitted: list[int], expected: list[int], minefield_value: int | None
) -> dict[str, Any]:
    """Accuracy and diagnostics of a submitted list against the expected list.

    - ``accuracy``: the lists are equal (values and order).
    - ``set_overlap``: share of the distinct expected values that were submitted.
    - ``original_term_minefield_hit``: the term itself (or its value) was submitted instead of a synonym's.
    - ``order_instruction_following_failure``: the right values in the wrong order.
    """
    accuracy = submitted == expected
    wanted = set(expected)
    overlap = len(wanted & set(submitted)) / len(wanted) if wanted else float(not submitted)
    # Submissions are integers, so the term is detected through its value (its label is text).
    minefield_hit = minefield_value is not None and minefield_value in submitted
    return {
        "accuracy": accuracy,
        "set_overlap": overlap,
        "original_term_minefield_hit": minefield_hit,
        "order_instruction_following_failure": not accuracy and sorted(submitted) == sorted(expected),
    }


class ExampleMultiStepServer(SimpleResourcesServer):
    """Synonym lookups and a submit tool; verify scores the last submission."""

    config: ExampleMultiStepConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    @tool
    async def get_synonym_value(self, body: GetSynonymValueRequest) -> GetSynonymValueResponse:
        """The value of one synonym."""
        return GetSynonymValueResponse(synonym_value=synonym_value(body.synonym))

    @tool
    async def extract_synonym_values(self, body: ExtractSynonymValuesRequest) -> ExtractSynonymValuesResponse:
        """Accept a submission; verify reads it back from the response's last submit call."""
        return ExtractSynonymValuesResponse(success=True)

    async def verify(self, body: ExampleMultiStepVerifyRequest) -> ExampleMultiStepVerifyResponse:  # type: ignore[override]
        """1.0 when the last submitted list equals ``expected_synonym_values``, else 0.0."""
        calls = function_calls(body.response.get("output") or [])
        submits = [c for c in calls if c.get("name") == SUBMIT_TOOL]
        submitted: list[int] = []
        error: str | None = None
        source: Literal["tool", "text", "none"] = "none"
        if submits:
            # The last submission counts: a model may correct itself.
            submitted, error = parse_submission(submits[-1])
            source = "tool"
        elif self.config.accept_text_answer:
            found = _TEXT_LIST.findall(output_text(body.response))
            if found:
                submitted, source = orjson.loads(found[-1]), "text"
        if source == "none":
            error = f"no {SUBMIT_TOOL} call"
            if self.config.accept_text_answer:
                error += " and no [n, ...] list in the final text"
        scores = score_submission(submitted, body.expected_synonym_values, body.minefield_label_value)
        looked_up = []
        for call in calls:
            if call.get("name") == LOOKUP_TOOL:
                try:
                    looked_up.append(str(orjson.loads(call.get("arguments") or "{}").get("synonym")))
                except (orjson.JSONDecodeError, AttributeError):
                    looked_up.append("<invalid arguments>")
        return ExampleMultiStepVerifyResponse(
            **body.model_dump(),
            reward=float(scores["accuracy"]),
            parsed_synonym_values=submitted,
            answer_source=source,
            submission_error=error,
            looked_up_synonyms=looked_up,
            **scores,
        )


if __name__ == "__main__":
    ExampleMultiStepServer.run_webserver()
