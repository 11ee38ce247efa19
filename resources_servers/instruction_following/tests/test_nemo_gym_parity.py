"""instruction_following gives NeMo Gym's reward and per-instruction results on NeMo Gym's own
verify test cases (tuning set)."""

import pytest

from nemo_gym.testing import ParityCase, check_parity, parity_cases, running_server, verify_text
from resources_servers.instruction_following.app import InstructionFollowingServer
from resources_servers.instruction_following.tests.nemo_gym_cases import CASES, MISSING_FIELDS_ROW


@pytest.fixture(scope="module")
def url():
    with running_server(InstructionFollowingServer({"name": "instruction_following"})) as base:
        yield base


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=False), ids=lambda c: c.name)
def test_nemo_gym_case(url, case: ParityCase):
    check_parity(url, case)


def test_verifier_metadata_without_its_required_fields_is_refused(url):
    assert "instruction_id_list" in verify_text(url, MISSING_FIELDS_ROW, "x", status=422)["error"]
