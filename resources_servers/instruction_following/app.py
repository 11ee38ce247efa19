"""instruction_following: IFEval-style verifiable instructions (see ``checks.py``).

Reward 1.0 when the final answer follows every instruction of the row (strict mode by
default), or, with ``grading_mode: fraction``, the fraction it follows.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    HTTPError,
    SimpleResourcesServer,
)
from nemo_gym.response_items import output_text
from resources_servers.instruction_following.checks import evaluate

GradingMode = Literal["binary", "fraction"]


class InstructionFollowingConfig(BaseResourcesServerConfig):
    """``strictness`` picks the mode that gives the reward; ``grading_mode`` is the default for rows."""

    strictness: Literal["strict", "loose"] = "strict"
    grading_mode: GradingMode = "binary"


class InstructionSpec(BaseModel):
    """What a row asks for: instruction ids, one kwargs object (or null) each, how to grade."""

    instruction_id_list: list[str]
    kwargs: list[dict[str, Any] | None] | None = None
    grading_mode: GradingMode | None = None

    @model_validator(mode="after")
    def _kwargs_per_instruction(self) -> InstructionSpec:
        if self.kwargs is None:
            self.kwargs = [None] * len(self.instruction_id_list)
        if len(self.kwargs) != len(self.instruction_id_list):
            raise ValueError(
                f"kwargs has {len(self.kwargs)} entries for {len(self.instruction_id_list)} instructions"
            )
        return self


class InstructionFollowingVerifyResponse(BaseVerifyResponse):
    """Strict and loose per-instruction results, the fraction followed, and instruction errors."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    follow_all_instructions: bool
    follow_instruction_list: list[bool]
    follow_all_instructions_loose: bool
    follow_instruction_list_loose: list[bool]
    fraction: float
    instruction_errors: dict[int, str] = {}


class InstructionFollowingServer(SimpleResourcesServer):
    """Checks the final answer against the row's verifiable instructions."""

    config: InstructionFollowingConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    async def verify(self, body: BaseVerifyRequest) -> InstructionFollowingVerifyResponse:
        """Strict and loose checks of every instruction; reward per ``grading_mode`` and ``strictness``."""
        spec = _instruction_spec(body.model_dump())
        text = output_text(body.response)
        assert spec.kwargs is not None
        result = await asyncio.to_thread(evaluate, spec.instruction_id_list, spec.kwargs, text)
        chosen = result.strict if self.config.strictness == "strict" else result.loose
        fraction = sum(chosen) / len(chosen) if chosen else 0.0
        all_followed = bool(chosen) and all(chosen)
        mode = spec.grading_mode or self.config.grading_mode
        return InstructionFollowingVerifyResponse(
            **body.model_dump(),
            reward=fraction if mode == "fraction" else float(all_followed),
            follow_all_instructions=bool(result.strict) and all(result.strict),
            follow_instruction_list=result.strict,
            follow_all_instructions_loose=bool(result.loose) and all(result.loose),
            follow_instruction_list_loose=result.loose,
            fraction=fraction,
            instruction_errors=result.errors,
        )


def _instruction_spec(row: dict[str, Any]) -> InstructionSpec:
    # Newer NeMo Gym rows keep these fields in verifier_metadata; older ones at the top level.
    metadata = row.get("verifier_metadata")
    source, where = (metadata, "verifier_metadata.") if isinstance(metadata, dict) else (row, "")
    if "instruction_id_list" not in source:
        raise HTTPError(422, f"invalid body: {where}instruction_id_list: field required")
    try:
        return InstructionSpec.model_validate(
            {k: source.get(k) for k in ("instruction_id_list", "kwargs", "grading_mode") if k in source}
        )
    except ValidationError as exc:
        fields = "; ".join(
            f"{(where + '.'.join(map(str, e['loc']))).rstrip('.') or 'body'}: {e['msg']}"
            for e in exc.errors()
        )
        raise HTTPError(422, f"invalid body: {fields}") from exc


if __name__ == "__main__":
    InstructionFollowingServer.run_webserver()
