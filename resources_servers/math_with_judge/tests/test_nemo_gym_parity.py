"""math_with_judge gives NeMo Gym's reward on NeMo Gym's own verify test cases (tuning set)."""

import pytest

from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import ParityCase, check_parity, lazy_servers, parity_cases, running_server
from resources_servers.math_with_judge.app import MathWithJudgeServer
from resources_servers.math_with_judge.tests.nemo_gym_cases import CASES, JUDGE_SCRIPTS
from responses_api_models.scripted_model.app import ScriptedModel

CONFIGS = {
    "library": {},
    "judge": {"judge_model_server": {"type": "responses_api_models", "name": "judge"}},
    "judge_not_equal": {
        "judge_model_server": {"type": "responses_api_models", "name": "judge"},
        "judge_no_verdict": "not_equal",
    },
}


@pytest.fixture(scope="module")
def url_for():
    with running_server(ScriptedModel({"name": "judge", "scripts": JUDGE_SCRIPTS})) as judge:

        def make(name: str) -> MathWithJudgeServer:
            config = {"name": "math_with_judge", "library_verifier_max_concurrency": 1, **CONFIGS[name]}
            client = ServerClient(static_urls={"judge": judge}, connect_retries=1, timeout_s=30)
            return MathWithJudgeServer(
                {**config, "library_verifier_timeout_seconds": 60}, server_client=client
            )

        with lazy_servers(make) as url:
            yield url


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=False), ids=lambda c: c.name)
def test_nemo_gym_case(url_for, case: ParityCase):
    check_parity(url_for(case.server), case, timeout_s=120)
