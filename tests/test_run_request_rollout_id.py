"""``BaseRunRequest.capture_rollout_id``: NeMo Gym's field for a row's ``_ng_rollout_id``.

NeMo Gym 0.7.0's miniswe_sandboxed_agent names a rollout ``rollout_id or body.capture_rollout_id
or ...``, sets it with ``model_copy(update=...)`` and compares bodies rebuilt from their dumps,
which leave it out."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body


class TaskRunRequest(BaseRunRequest):
    instance_id: str = "task"


def test_the_rows_rollout_id_reads_under_nemo_gyms_name() -> None:
    body = TaskRunRequest.model_validate(
        {"responses_create_params": {"input": "hi"}, "_ng_rollout_id": "r-7"}
    )
    assert body.capture_rollout_id == "r-7"
    assert maybe_rollout_id_from_run_body(body) == "r-7"
    assert "_ng_rollout_id" not in body.model_dump() and "capture_rollout_id" not in body.model_dump()
    assert TaskRunRequest.model_validate(body.model_dump()) == TaskRunRequest.model_validate(
        {"responses_create_params": {"input": "hi"}}
    )
    assert TaskRunRequest().capture_rollout_id is None
    assert body.model_copy(update={"capture_rollout_id": "r-8"}).capture_rollout_id == "r-8"


def test_a_bad_rollout_id_is_a_validation_error_naming_it() -> None:
    with pytest.raises(ValidationError, match="_ng_rollout_id"):
        BaseRunRequest.model_validate({"_ng_rollout_id": 7})
