"""example_mcp_weather: one `get_weather` tool served over MCP; reward for using it in the rollout's session.

The tool is an ordinary tool route (``POST /get_weather``); ``expose_tools_over_mcp`` (on by
default here) also serves it at ``/mcp``, and ``/seed_session`` answers the ``mcp`` key a client
needs to call it in this rollout's session. The reward checks the session's own record of the
calls, so a rollout scores only if the tool really ran in its session (over MCP or HTTP).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.response_items import content_text

DEFAULT_CITY = "Paris"


def weather_sentence(city: str) -> str:
    """The weather report `get_weather` gives for ``city`` (the same every time)."""
    return f"The weather in {city} is sunny and 72 F."


class ExampleMCPWeatherResourcesServerConfig(BaseResourcesServerConfig):
    """MCP exposure is on by default: a host that builds the config from a name and a port
    (verifiers' taskset does) still gets the tools over MCP."""

    expose_tools_over_mcp: bool = True


class ExampleMCPWeatherSeedSessionRequest(BaseSeedSessionRequest):
    """The row; ``verifier_metadata.expected_city`` is the city the task asks about."""

    verifier_metadata: dict[str, Any] | None = None


class ExampleMCPWeatherGetWeatherRequest(BaseModel):
    """Arguments of `get_weather`."""

    city: str


class ExampleMCPWeatherGetWeatherResponse(BaseModel):
    """What `get_weather` returns."""

    weather: str


class ExampleMCPWeatherVerifyRequest(BaseVerifyRequest):
    """The row plus the response; ``verifier_metadata.expected_city`` as in the seed."""

    verifier_metadata: dict[str, Any] | None = None


class ExampleMCPWeatherVerifyResponse(BaseVerifyResponse):
    """Diagnostics: the expected sentence, whether the tool ran for that city in this session,
    whether the final answer holds the sentence."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    expected_weather: str
    tool_call_seen: bool
    final_response_mentions_weather: bool


def assistant_text(response: dict[str, Any]) -> str:
    """The text of every assistant message of the response, one per line."""
    return "\n".join(
        content_text(item.get("content"))
        for item in response.get("output") or []
        if item.get("type") == "message" and item.get("role", "assistant") == "assistant"
    ).strip()


def _expected_city(metadata: dict[str, Any] | None) -> str:
    return str((metadata or {}).get("expected_city") or DEFAULT_CITY)


class ExampleMCPWeatherResourcesServer(SimpleResourcesServer):
    """A deterministic weather tool; each session records the cities it was asked about."""

    config: ExampleMCPWeatherResourcesServerConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    async def seed_session(self, body: ExampleMCPWeatherSeedSessionRequest) -> dict[str, Any]:
        """Open the session's record of weather calls."""
        self.session["expected_city"] = _expected_city(body.verifier_metadata)
        self.session["weather_calls"] = []
        return {}

    @tool
    async def get_weather(
        self, body: ExampleMCPWeatherGetWeatherRequest
    ) -> ExampleMCPWeatherGetWeatherResponse:
        """Get a deterministic weather report for a city."""
        weather = weather_sentence(body.city)
        self.session.setdefault("weather_calls", []).append({"city": body.city, "weather": weather})
        return ExampleMCPWeatherGetWeatherResponse(weather=weather)

    async def verify(self, body: ExampleMCPWeatherVerifyRequest) -> ExampleMCPWeatherVerifyResponse:
        """1.0 when this session called `get_weather` for the expected city (any letter case) and
        the final answer contains the tool's sentence (any letter case), else 0.0."""
        city = _expected_city(body.verifier_metadata)
        expected = weather_sentence(city)
        calls = self.session.get("weather_calls") or []
        tool_call_seen = any(str(call.get("city", "")).casefold() == city.casefold() for call in calls)
        mentions = expected.casefold() in assistant_text(body.response).casefold()
        return ExampleMCPWeatherVerifyResponse(
            **body.model_dump(),
            reward=float(tool_call_seen and mentions),
            expected_weather=expected,
            tool_call_seen=tool_call_seen,
            final_response_mentions_weather=mentions,
        )


if __name__ == "__main__":
    ExampleMCPWeatherResourcesServer.run_webserver()
