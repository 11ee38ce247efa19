"""A reasoning item dumps ``content`` only when it holds something (NeMo Gym 0.4.0's item has
no ``content``; 0.6.0's and 0.7.0's agent tests compare dumps without their nulls)."""

from __future__ import annotations

from nemo_gym.models.openai_types import NeMoGymResponse, NeMoGymResponseReasoningItem


def test_a_reasoning_item_without_content_dumps_without_the_key() -> None:
    item = NeMoGymResponseReasoningItem(id="r", summary=[{"text": "t", "type": "summary_text"}])
    assert item.model_dump() == {
        "id": "r",
        "summary": [{"text": "t", "type": "summary_text"}],
        "type": "reasoning",
        "encrypted_content": None,
    }
    assert "content" not in item.model_dump(mode="json")


def test_content_given_is_dumped_and_a_response_round_trips() -> None:
    parts = [{"text": "step", "type": "reasoning_text"}]
    item = NeMoGymResponseReasoningItem(id="r", summary=[], content=parts)
    assert item.model_dump(mode="json")["content"] == parts
    response = NeMoGymResponse(
        id="x", created_at=1, model="m", object="response", output=[item, {"id": "s", "summary": [], "type": "reasoning"}],
        parallel_tool_calls=False, tool_choice="auto", tools=[],
    )  # fmt: skip
    dumped = response.model_dump(mode="json")
    assert dumped["output"][0]["content"] == parts
    assert "content" not in dumped["output"][1]
    assert NeMoGymResponse.model_validate(dumped) == response
