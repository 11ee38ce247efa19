"""equivalence_llm_judge on NeMo Gym's held-out verify test cases: every fifth case, never used to tune the code."""

import pytest

from nemo_gym.testing import ParityCase, check_parity, parity_cases
from resources_servers.equivalence_llm_judge.tests.nemo_gym_cases import CASES
from resources_servers.equivalence_llm_judge.tests.test_nemo_gym_parity import url_for  # noqa: F401 - the same server fixture


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=True), ids=lambda c: c.name)
def test_nemo_gym_held_out_case(url_for, case: ParityCase):  # noqa: F811 - the imported fixture
    check_parity(url_for(case.server), case)
