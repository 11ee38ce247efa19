"""instruction_following gives NeMo Gym's reward and per-instruction results on NeMo Gym's own
verify test cases (held-out set: every fifth case, never used to tune the code)."""

import pytest

from nemo_gym.testing import ParityCase, check_parity, parity_cases, running_server
from resources_servers.instruction_following.app import InstructionFollowingServer
from resources_servers.instruction_following.tests.nemo_gym_cases import CASES


@pytest.fixture(scope="module")
def url():
    with running_server(InstructionFollowingServer({"name": "instruction_following"})) as base:
        yield base


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=True), ids=lambda c: c.name)
def test_nemo_gym_case(url, case: ParityCase):
    check_parity(url, case)
