"""simulated_user_agent against real in-process servers: the alternation, the stop marker,
max_turns, the user's view of the conversation, bad rows and a user model that is down."""

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from nemo_gym.launch.config import project_root
from nemo_gym.launch.launcher import free_port
from nemo_gym.response_items import function_call_item, function_call_output_item, message_item
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import SyncClient, read_jsonl, running_server
from resources_servers.retail_service.app import RetailServiceServer
from responses_api_agents.simulated_user_agent.app import SimulatedUserAgent, user_view
from responses_api_models.scripted_model.app import ScriptedModel

ROW = read_jsonl(project_root() / "resources_servers/retail_service/data/example.jsonl")[0]
# The policy returns W1001 when asked about it, then keeps asking what else it can do.
POLICY = [
    {
        "match": "W1001",
        "turns": [
            {"call_tool": "return_order", "arguments": {"order_id": "W1001"}},
            {"text": "Order W1001 is returned."},
            {"text": "Anything else about W1001?"},
        ],
    }
]
# The customer opens, then says thanks and stops on its third message.
USER = [
    {"turns": [{"text": "Please return W1001."}, {"text": "And W1001 again?"}, {"text": "Bye ###STOP###"}]}
]
# A customer who never stops.
CHATTY = [{"turns": [{"text": "Tell me about W1001."}]}]


@contextmanager
def agent_url(
    user_scripts: list[dict[str, Any]], user_url: str | None = None, **fields: Any
) -> Iterator[str]:
    env = RetailServiceServer({"name": "env"})
    policy = ScriptedModel({"name": "model", "scripts": POLICY})
    user = ScriptedModel({"name": "user", "scripts": user_scripts})
    with ExitStack() as stack:
        urls = {
            "env": stack.enter_context(running_server(env)),
            "model": stack.enter_context(running_server(policy)),
            "user": user_url or stack.enter_context(running_server(user)),
        }
        agent = SimulatedUserAgent(
            {
                "name": "agent",
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "model"},
                "user_model_server": {"type": "responses_api_models", "name": "user"},
                **fields,
            },
            server_client=ServerClient(static_urls=urls),
        )
        yield stack.enter_context(running_server(agent))


def run(url: str, row: dict[str, Any]) -> tuple[int, Any]:
    with SyncClient() as client:
        return client.post(url + "/run", row)


def test_turns_alternate_until_the_user_stops_and_verify_sees_everything():
    with agent_url(USER) as url:
        status, body = run(url, ROW)
    assert status == 200, body
    assert body["reward"] == 1.0 and body["ended_by"] == "user_stop" and body["num_user_turns"] == 3
    output = body["response"]["output"]
    shape = [item.get("role") or item["type"] for item in output]
    assert shape == [
        "user",
        "function_call",
        "function_call_output",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert [output[i]["content"] for i in (0, 4, 6)] == [
        "Please return W1001.",
        "And W1001 again?",
        "Bye ###STOP###",
    ]
    # verify saw the conversation: its counts come from the response it was given.
    assert body["num_tool_calls"] == 1


def test_max_turns_caps_the_policy_answers():
    with agent_url(CHATTY, max_turns=2) as url:
        status, body = run(url, ROW)
    assert status == 200, body
    assert body["ended_by"] == "max_turns"
    output = body["response"]["output"]
    assert sum(item.get("role") == "assistant" for item in output) == 2
    assert body["num_user_turns"] == 2  # the opening and one reply; none after the last answer


def test_a_row_with_its_own_opening_message_skips_the_users_opening():
    row = {
        **ROW,
        "responses_create_params": {
            **ROW["responses_create_params"],
            "input": [*ROW["responses_create_params"]["input"], {"role": "user", "content": "Return W1001."}],
        },
    }
    with agent_url(USER) as url:
        status, body = run(url, row)
    assert status == 200, body
    output = body["response"]["output"]
    assert output[0]["type"] == "function_call"  # the policy answers the row's message first
    # The row's message counts as the customer's first: the scripted customer goes on from its turn 1.
    assert [item["content"] for item in output if item.get("role") == "user"] == [
        "And W1001 again?",
        "Bye ###STOP###",
    ]
    assert body["ended_by"] == "user_stop" and body["reward"] == 1.0


def test_user_view_swaps_roles_and_hides_tools():
    conversation = [
        {"role": "system", "content": "policy secrets"},
        {"type": "message", "role": "user", "content": "hi"},
        function_call_item("get_order", "{}", call_id="c1"),
        function_call_output_item("c1", "{}"),
        {**message_item("hello, customer"), "prompt_token_ids": [1, 2]},
    ]
    view = user_view("be a customer", conversation)
    assert [
        (item["role"], item["content"] if isinstance(item["content"], str) else item["content"][0]["text"])
        for item in view
    ] == [
        ("user", "be a customer"),
        ("assistant", "hi"),
        ("user", "hello, customer"),
    ]
    assert all("prompt_token_ids" not in item for item in view)


def test_a_row_without_a_goal_is_a_422_naming_the_field():
    row = {key: value for key, value in ROW.items() if key != "user_goal"}
    with agent_url(USER) as url:
        status, body = run(url, row)
        assert status == 422 and "user_goal" in body["error"]
        status, body = run(url, {**ROW, "user_persona": 5})
        assert status == 422 and "user_persona" in body["error"]


def test_a_user_model_that_is_down_is_a_classified_failure_not_a_reward():
    with agent_url(USER, user_url=f"http://127.0.0.1:{free_port()}") as url:
        status, body = run(url, ROW)
    assert status >= 500 and body.get("failure_class") == "unreachable", body
    assert "reward" not in body
