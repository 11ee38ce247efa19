"""example_single_tool_call: the tool, verify on good/bad/empty responses, and the NeMo Gym rows."""

from pathlib import Path

import pytest

from nemo_gym.response_items import function_call_item, message_item
from nemo_gym.testing import SyncClient, compat_dir, post_verify, read_jsonl, replay_recorded, running_server
from resources_servers.example_single_tool_call.app import ExampleSingleToolCallServer

HERE = Path(__file__).resolve().parent.parent
COMPAT = compat_dir("example_single_tool_call")
ROW = read_jsonl(HERE / "data" / "example.jsonl")[0]


@pytest.fixture(scope="module")
def url():
    with running_server(ExampleSingleToolCallServer({"name": "example_single_tool_call"})) as base:
        yield base


def verify(url: str, output: list) -> dict:
    return post_verify(url, ROW, {"output": output})


def test_get_weather_and_bad_arguments(url: str):
    with SyncClient() as client:
        assert client.post(url + "/get_weather", {"city": "Oslo"}) == (
            200,
            {"city": "Oslo", "weather_description": "The weather in Oslo is cold."},
        )
        status, body = client.post(url + "/get_weather", {"town": "Oslo"})
        assert status == 422 and body["detail"][0]["field"] == "city"


def test_reward_needs_the_tool_call_and_an_answer(url: str):
    call = function_call_item("get_weather", '{"city": "Oslo"}')
    good = verify(
        url,
        [
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "{}"},
            message_item("Cold."),
        ],
    )
    assert (good["reward"], good["called_tool"], good["answered"]) == (1.0, True, True)
    assert good["responses_create_params"] == ROW["responses_create_params"]
    no_tool = verify(url, [message_item("It is probably cold.")])
    assert (no_tool["reward"], no_tool["called_tool"]) == (0.0, False)
    no_answer = verify(url, [call])
    assert (no_answer["reward"], no_answer["answered"]) == (0.0, False)
    assert verify(url, [])["reward"] == 0.0


@pytest.mark.skipif(not COMPAT.exists(), reason="compat corpus not present")
def test_nemo_gym_rows_run_unchanged_and_replay(url: str):
    for recorded, ours in replay_recorded(url, COMPAT):
        called = any(item["type"] == "function_call" for item in recorded["response"]["output"])
        # Deliberate difference (README): NeMo Gym always scores 1.0; we require the tool call.
        assert ours["reward"] == (recorded["reward"] if called else 0.0)


@pytest.mark.skipif(not COMPAT.exists(), reason="compat corpus not present")
def test_always_reward_gives_nemo_gym_scores(url: str):
    with running_server(ExampleSingleToolCallServer({"name": "s", "always_reward": True})) as nemo_gym:
        replayed = replay_recorded(nemo_gym, COMPAT)
        assert [ours["reward"] for _, ours in replayed] == [recorded["reward"] for recorded, _ in replayed]
        # Any response at all, even one with neither the call nor an answer.
        assert post_verify(nemo_gym, ROW, {"output": []})["reward"] == 1.0
    # The default still requires both.
    assert verify(url, [])["reward"] == 0.0
