"""``BaseRunRequest.capture_rollout_id``: NeMo Gym's name for a row's ``_ng_rollout_id``.

NeMo Gym 0.7.0's miniswe_sandboxed_agent names a rollout ``rollout_id or body.capture_rollout_id
or ...``; here the row keeps its ``_ng_rollout_id`` key (a body dumps as it came) and the
attribute reads it."""

from __future__ import annotations

import pytest

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body


class TaskRunRequest(BaseRunRequest):
    instance_id: str = "task"


def test_the_rows_rollout_id_reads_under_nemo_gyms_name() -> None:
    body = TaskRunRequest.model_validate(
        {"responses_create_params": {"input": "hi"}, "_ng_rollout_id": "r-7"}
    )
    assert body.capture_rollout_id == "r-7"
    assert body.model_dump()["_ng_rollout_id"] == "r-7"  # the row is passed on as it came
    assert maybe_rollout_id_from_run_body(body) == "r-7"
    assert TaskRunRequest().capture_rollout_id is None


def test_a_bad_rollout_id_is_still_named() -> None:
    body = BaseRunRequest.model_validate({"_ng_rollout_id": 7})
    with pytest.raises(ValueError, match="_ng_rollout_id must be letters"):
        maybe_rollout_id_from_run_body(body)
