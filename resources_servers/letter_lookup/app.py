"""letter_lookup: one ``lookup`` tool that tells the answer; reward 1.0 when the model looked it up
and its final answer starts with that letter (either case).

The smallest tool-using task a tiny policy can learn on CPU (``scripts/train_trl_agent.py``):
the row's ``expected_answer`` (a letter) is not in the prompt; ``lookup`` returns it; the reward
needs both the call and an answer that leads with the letter. Multi-turn by construction: the
call, the tool's output, then the answer.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    HTTPError,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.response_items import function_calls, output_text

LETTER = Field(pattern=r"^[A-Z]$", description="the answer: one capital letter")


class LetterSeedSessionRequest(BaseSeedSessionRequest):
    """The row: ``expected_answer`` is what ``lookup`` will tell this rollout."""

    expected_answer: str = LETTER


class LookupRequest(BaseModel):
    """Arguments of ``lookup``: none needed (a ``key``, if given, is ignored: one answer per row)."""

    key: str = ""


class LookupResponse(BaseModel):
    """What ``lookup`` returns."""

    answer: str


class LetterVerifyRequest(BaseVerifyRequest):
    """The row plus response."""

    expected_answer: str = LETTER


class LetterVerifyResponse(LetterVerifyRequest, BaseVerifyResponse):
    """Reward plus what verify found."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    called_lookup: bool
    answer_letter: str | None = None


class LetterLookupServer(SimpleResourcesServer):
    """The answer is behind a tool: look it up, then say it."""

    config: BaseResourcesServerConfig
    plain_bodies = True  # verify reads the response as a dict

    async def seed_session(self, body: LetterSeedSessionRequest) -> BaseSeedSessionResponse:  # type: ignore[override]
        """Open this rollout's session holding its answer."""
        self.session["answer"] = body.expected_answer
        return BaseSeedSessionResponse()

    @tool
    async def lookup(self, body: LookupRequest) -> LookupResponse:
        """The answer of this rollout's task."""
        state = self.sessions.get(self.session_id or "", create=False)
        if state is None or "answer" not in state:
            raise HTTPError(409, "no answer for this rollout: call /seed_session with the row first")
        return LookupResponse(answer=state["answer"])

    async def verify(self, body: LetterVerifyRequest) -> LetterVerifyResponse:  # type: ignore[override]
        """1.0 when ``lookup`` was called and the final answer's first non-space character is the
        expected letter, in either case (``a`` names option A as well as ``A`` does); else 0.0."""
        called = any(
            call.get("name") == "lookup" for call in function_calls(body.response.get("output") or [])
        )
        text = output_text(body.response).strip()
        letter = text[:1] or None
        return LetterVerifyResponse(
            **body.model_dump(),
            reward=float(called and letter is not None and letter.upper() == body.expected_answer),
            called_lookup=called,
            answer_letter=letter,
        )


if __name__ == "__main__":
    LetterLookupServer.run_webserver()
