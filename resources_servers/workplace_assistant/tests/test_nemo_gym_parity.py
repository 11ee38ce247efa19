"""workplace_assistant gives NeMo Gym's reward on NeMo Gym's own verify test cases.

NeMo Gym's tests hold two verify cases, fewer than five, so none is held out by the every-fifth
rule. They verify a response whose calls were never run in the session: NeMo Gym replays the
response's calls (``verify_state: response`` here); our default compares the session's state,
which those calls never touched.
"""

import json

import pytest

from nemo_gym.testing import ParityCase, SyncClient, parity_cases, running_server
from resources_servers.workplace_assistant.app import WorkplaceAssistantServer
from resources_servers.workplace_assistant.tests.nemo_gym_cases import CASES


@pytest.fixture(scope="module")
def urls():
    with (
        running_server(WorkplaceAssistantServer({"name": "wa", "verify_state": "response"})) as nemo_gym,
        running_server(WorkplaceAssistantServer({"name": "wa"})) as ours,
    ):
        yield nemo_gym, ours


def seeded_verify(url: str, case: ParityCase) -> float:
    """Seed a session, then verify the case's response in it; returns the reward."""
    with SyncClient() as client:
        assert client.post(url + "/seed_session", case.row)[0] == 200
        status, body = client.post(url + "/verify", {**case.row, "response": {"output": case.output}})
    assert status == 200, body
    return body["reward"]


@pytest.mark.parametrize("case", parity_cases(CASES, held_out=False), ids=lambda c: c.name)
def test_nemo_gym_case(urls, case: ParityCase):
    nemo_gym, ours = urls
    assert seeded_verify(nemo_gym, case) == case.reward, f"{case.name}: NeMo Gym gives {case.reward}"
    # Default: the session's state, untouched here because the calls never ran through it.
    assert seeded_verify(ours, case) == 0.0


def test_calls_made_through_the_session_score_the_same_under_both_rules(urls):
    case = CASES[0]
    for url in urls:
        with SyncClient() as client:
            assert client.post(url + "/seed_session", case.row)[0] == 200
            call = case.output[0]
            assert client.post(url + "/" + call["name"], json.loads(call["arguments"]))[0] == 200
            status, body = client.post(url + "/verify", {**case.row, "response": {"output": case.output}})
        assert (status, body["reward"]) == (200, 1.0)
