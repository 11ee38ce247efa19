"""ChatBridge: per-row engine settings from metadata.extra_body (how +num_repeats_add_seed reaches the engine)."""

import pytest

from nemo_gym.models.chat_backend import ChatBridge
from nemo_gym.serving.server import HTTPError


def test_seed_from_metadata_extra_body_reaches_the_chat_request():
    bridge = ChatBridge(model="m", extra_body={"temperature": 0.7})
    request = bridge.chat_request({"input": "hi", "metadata": {"extra_body": '{"seed": 3}'}})
    assert request["seed"] == 3 and request["temperature"] == 0.7
    assert "seed" not in bridge.chat_request({"input": "hi"})


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]"])
def test_bad_extra_body_is_a_422_naming_the_field(raw: str):
    with pytest.raises(HTTPError) as info:
        ChatBridge(model="m").chat_request({"input": "hi", "metadata": {"extra_body": raw}})
    assert info.value.status_code == 422 and "metadata.extra_body" in info.value.message
