"""equivalence_llm_judge gives NeMo Gym's reward on NeMo Gym's own verify test cases (tuning set)."""

import pytest

from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import ParityCase, check_parity, lazy_servers, parity_cases, running_server
from resources_servers.equivalence_llm_judge.app import EquivalenceLLMJudgeServer
from resources_servers.equivalence_llm_judge.tests.nemo_gym_cases import (
    CASES,
    JUDGE_ANSWERS,
    SERVERS,
    SequenceJudge,
)


@pytest.fixture(scope="module")
def url_for():
    with running_server(SequenceJudge({"name": "judge", "answers": JUDGE_ANSWERS})) as judge:

        def make(name: str) -> EquivalenceLLMJudgeServer:
            client = ServerClient(static_urls={"judge": judge}, connect_retries=1, timeout_s=30)
            config = {
                "name": "equivalence_llm_judge",
                "judge_model_server": {"type": "responses_api_models", "name": "judge"},
            }
            return EquivalenceLLMJudgeServer({**config, **SERVERS[name]}, server_client=client)

        with lazy_servers(make) as url:
            yield url


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=False), ids=lambda c: c.name)
def test_nemo_gym_case(url_for, case: ParityCase):
    check_parity(url_for(case.server), case)
