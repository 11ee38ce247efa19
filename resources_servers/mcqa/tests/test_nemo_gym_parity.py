"""mcqa gives NeMo Gym's reward and letter on NeMo Gym's own verify test cases (tuning set)."""

import pytest

from nemo_gym.testing import ParityCase, check_parity, lazy_servers, parity_cases
from resources_servers.mcqa.app import MCQAServer
from resources_servers.mcqa.tests.nemo_gym_cases import CASES, SERVER_MODES


def make(name: str) -> MCQAServer:
    mode = SERVER_MODES[name]
    return MCQAServer({"name": "mcqa", **({"grading_mode": mode} if mode else {})})


@pytest.fixture(scope="module")
def url_for():
    with lazy_servers(make) as url:
        yield url


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=False), ids=lambda c: c.name)
def test_nemo_gym_case(url_for, case: ParityCase):
    check_parity(url_for(case.server), case)
