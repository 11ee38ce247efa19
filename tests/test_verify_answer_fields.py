"""A verify answer holds the fields its class declares, as NeMo Gym's does (0.7.0's
``math_with_judge`` test checks the exact key list of one built from ``**body.model_dump()``)."""

from __future__ import annotations

import pytest
from pydantic import ConfigDict, ValidationError

from nemo_gym.base_resources_server import (
    BaseMultiRewardVerifyResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
)
from nemo_gym.openai_utils import NeMoGymResponse

RESPONSE = NeMoGymResponse(
    id="r", created_at=1, model="m", object="response", output=[],
    parallel_tool_calls=False, tool_choice="auto", tools=[],
)  # fmt: skip


class MathRequest(BaseVerifyRequest):
    question: str
    expected_answer: str


class MathResponse(BaseVerifyResponse):
    expected_answer: str
    extracted_answer: str | None


def _request() -> MathRequest:
    return MathRequest(
        responses_create_params={"input": "1+1?"}, response=RESPONSE, question="1+1?",
        expected_answer="2", task_id=7,
    )  # fmt: skip


def test_an_answer_built_from_the_request_keeps_only_its_declared_fields() -> None:
    answer = MathResponse(**_request().model_dump(), reward=1.0, extracted_answer="2")
    assert sorted(answer.model_dump()) == [
        "expected_answer", "extracted_answer", "failure_kind", "failure_reason", "mask_sample",
        "response", "responses_create_params", "reward",
    ]  # fmt: skip
    assert "reward_components" not in BaseVerifyResponse(**_request().model_dump(), reward=0.0).model_dump()


def test_the_request_keeps_the_row_and_an_answer_may_opt_in_to_keep_it_too() -> None:
    assert _request().model_dump()["task_id"] == 7  # the server still reads the row's fields

    class KeepsRow(MathResponse):
        model_config = ConfigDict(extra="allow")

    kept = KeepsRow(**_request().model_dump(), reward=1.0, extracted_answer="2").model_dump()
    assert (kept["question"], kept["task_id"]) == ("1+1?", 7)


def test_multi_reward_answers_require_their_components() -> None:
    with pytest.raises(ValidationError, match="reward_components"):
        BaseMultiRewardVerifyResponse(**_request().model_dump(), reward=1.0)
    both = BaseMultiRewardVerifyResponse(**_request().model_dump(), reward=1.0, reward_components={"a": 1.0})
    assert both.model_dump()["reward_components"] == {"a": 1.0}
