"""structured_outputs gives NeMo Gym's reward and error_type on NeMo Gym's own verify test cases (tuning set)."""

import pytest

from nemo_gym.testing import ParityCase, check_parity, lazy_servers, parity_cases
from resources_servers.structured_outputs.app import StructuredOutputsServer
from resources_servers.structured_outputs.tests.nemo_gym_cases import CASES, SERVERS


@pytest.fixture(scope="module")
def url_for():
    with lazy_servers(
        lambda name: StructuredOutputsServer({"name": "structured_outputs", **SERVERS[name]})
    ) as url:
        yield url


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=False), ids=lambda c: c.name)
def test_nemo_gym_case(url_for, case: ParityCase):
    check_parity(url_for(case.server), case)
