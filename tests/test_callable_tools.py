"""callable_tools: the offered names checked once per rollout let exactly the same calls through."""

from __future__ import annotations

from nemo_gym.agents.agent_hops import CallableTools, callable_tools, is_callable_tool, offered_tools

NAMES = [
    "get_weather",
    "verify",
    "seed_session",
    "aggregate_metrics",
    "../../verify",
    "a/b",
    "",
    "v1",
    "ng-rollout",
    "tool.with:colon-dash",
    ".hidden",
    "x" * 129,
    "caf\u00e9",
    "100%",
    "not_offered",
]


def test_callable_tools_let_through_what_is_callable_tool_does() -> None:
    offered = offered_tools(
        {"tools": [{"type": "function", "name": name} for name in NAMES[:-1]]}, ["allowed_extra"]
    )
    checked = callable_tools(offered)
    assert isinstance(checked, CallableTools) and isinstance(checked, frozenset)
    for name in [*NAMES, "allowed_extra"]:
        assert (name in checked) == is_callable_tool(name, offered), name
    assert checked == {"get_weather", "tool.with:colon-dash", "allowed_extra"}
    assert callable_tools(frozenset()) == frozenset()
