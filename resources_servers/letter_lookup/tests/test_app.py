"""letter_lookup: the tool tells each rollout its own answer; verify needs the call and the letter."""

from pathlib import Path

import pytest

from nemo_gym.response_items import function_call_item, message_item
from nemo_gym.testing import SyncClient, post_verify, read_jsonl, running_server
from resources_servers.letter_lookup.app import LetterLookupServer

HERE = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(HERE / "data" / "example.jsonl")


@pytest.fixture(scope="module")
def url():
    with running_server(LetterLookupServer({"name": "letter_lookup"})) as base:
        yield base


def test_lookup_answers_each_session_its_rows_letter(url: str):
    with SyncClient() as first, SyncClient() as second:
        assert first.post(url + "/seed_session", ROWS[0])[0] == 200
        assert second.post(url + "/seed_session", ROWS[1])[0] == 200
        assert first.post(url + "/lookup", {}) == (200, {"answer": ROWS[0]["expected_answer"]})
        assert second.post(url + "/lookup", {"key": "x"}) == (200, {"answer": ROWS[1]["expected_answer"]})
    with SyncClient() as unseeded:
        status, body = unseeded.post(url + "/lookup", {"key": "answer"})
        assert status == 409 and "seed_session" in str(body)
        status, _ = unseeded.post(url + "/seed_session", {**ROWS[0], "expected_answer": "ab"})
        assert status == 422


def test_reward_needs_the_lookup_and_the_letter(url: str):
    row = ROWS[1]
    letter = row["expected_answer"]
    call = function_call_item("lookup", "{}")
    output = {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": f'{{"answer": "{letter}"}}',
    }
    good = post_verify(url, row, {"output": [call, output, message_item(f" {letter}, looked up")]})
    assert (good["reward"], good["called_lookup"], good["answer_letter"]) == (1.0, True, letter)
    lower = post_verify(url, row, {"output": [call, output, message_item(letter.lower())]})
    assert lower["reward"] == 1.0
    wrong = post_verify(url, row, {"output": [call, output, message_item("Z")]})
    assert (wrong["reward"], wrong["answer_letter"]) == (0.0, "Z")
    guessed = post_verify(url, row, {"output": [message_item(letter)]})
    assert (guessed["reward"], guessed["called_lookup"]) == (0.0, False)
    empty = post_verify(url, row, {"output": [call, output]})
    assert (empty["reward"], empty["answer_letter"]) == (0.0, None)
