"""code_gen gives NeMo Gym's reward on NeMo Gym's own verify test cases (tuning set)."""

import pytest

from nemo_gym.testing import ParityCase, check_parity, parity_cases, running_server
from resources_servers.code_gen.app import CodeGenServer
from resources_servers.code_gen.tests.nemo_gym_cases import CASES


@pytest.fixture(scope="module")
def url():
    server = CodeGenServer({"name": "code_gen", "num_processes": 1, "unit_test_timeout_secs": 10})
    with running_server(server) as base:
        yield base


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=False), ids=lambda c: c.name)
def test_nemo_gym_case(url, case: ParityCase):
    check_parity(url, case, timeout_s=120)
