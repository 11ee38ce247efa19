"""example_single_tool_call: one `get_weather` tool; reward 1.0 when the model called it and answered.

NeMo Gym's environment of this name scores every response 1.0 (it only exercises the plumbing);
``always_reward: true`` gives that behaviour.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.response_items import function_calls, output_text


class GetWeatherRequest(BaseModel):
    """Arguments of `get_weather`."""

    city: str


class GetWeatherResponse(BaseModel):
    """What `get_weather` returns."""

    city: str
    weather_description: str


class ExampleSingleToolCallVerifyResponse(BaseVerifyResponse):
    """Diagnostics: whether the tool was called and whether a final answer was given."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    called_tool: bool
    answered: bool


class ExampleSingleToolCallConfig(BaseResourcesServerConfig):
    """``always_reward``: score every response 1.0, as NeMo Gym does (default: the call and an answer count)."""

    always_reward: bool = False


class ExampleSingleToolCallServer(SimpleResourcesServer):
    """A weather lookup that is always cold, to exercise one tool call end to end."""

    config: ExampleSingleToolCallConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    @tool
    async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse:
        """The weather in a city (always the same: this environment is about the mechanics)."""
        return GetWeatherResponse(city=body.city, weather_description=f"The weather in {body.city} is cold.")

    async def verify(self, body: BaseVerifyRequest) -> ExampleSingleToolCallVerifyResponse:
        """1.0 if the response holds a `get_weather` call and a non-empty final answer (or
        ``always_reward``), else 0.0."""
        called = any(
            call.get("name") == "get_weather" for call in function_calls(body.response.get("output") or [])
        )
        answered = bool(output_text(body.response).strip())
        return ExampleSingleToolCallVerifyResponse(
            **body.model_dump(),
            reward=float(self.config.always_reward or (called and answered)),
            called_tool=called,
            answered=answered,
        )


if __name__ == "__main__":
    ExampleSingleToolCallServer.run_webserver()
