"""reasoning_gym gives NeMo Gym's reward on NeMo Gym's own verify test cases (tuning set)."""

import pytest

from nemo_gym.testing import ParityCase, check_parity, parity_cases, running_server
from resources_servers.reasoning_gym.app import ReasoningGymServer
from resources_servers.reasoning_gym.tests.nemo_gym_cases import CASES


@pytest.fixture(scope="module")
def url():
    with running_server(ReasoningGymServer({"name": "reasoning_gym"})) as base:
        yield base


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=False), ids=lambda c: c.name)
def test_nemo_gym_case(url, case: ParityCase):
    check_parity(url, case)
