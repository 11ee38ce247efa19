"""code_gen on NeMo Gym's held-out verify test cases: every fifth case, never used to tune the code."""

import pytest

from nemo_gym.testing import ParityCase, check_parity, parity_cases
from resources_servers.code_gen.tests.nemo_gym_cases import CASES
from resources_servers.code_gen.tests.test_nemo_gym_parity import url  # noqa: F401 - the same server fixture


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=True), ids=lambda c: c.name)
def test_nemo_gym_held_out_case(url, case: ParityCase):  # noqa: F811 - the imported fixture
    check_parity(url, case, timeout_s=120)
