"""codebreaker: crack a seeded secret code from right-place / wrong-place feedback (a Mastermind-style text game).

``/reset`` draws a secret of ``length`` digits, each from 1 to ``symbols``, with
``random.Random(seed)``. Each ``/step`` reads the first ``<guess>DIGITS</guess>`` in the model's
text and answers how many digits are right and in the right place and how many are right but
in the wrong place. Cracking the code ends the episode with reward 1.0; using up
``max_guesses`` ends it with 0.0. An answer without a well-formed guess uses up a guess too
and is answered with what was wrong with it, so an episode always ends within ``max_guesses``
steps.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.base_resources_server import HTTPError
from nemo_gym.gymnasium_server import GymnasiumServer, StepResult, extract_text

GUESS = re.compile(r"<guess>\s*([^<]*?)\s*</guess>", re.IGNORECASE)


class GameRules(BaseModel):
    """The row fields that set up a game. ``seed`` is required: it makes the secret reproducible."""

    model_config = ConfigDict(extra="ignore")

    seed: int
    length: int = Field(4, ge=1, le=10)
    symbols: int = Field(6, ge=2, le=9)
    max_guesses: int = Field(10, ge=1, le=100)
    allow_repeats: bool = True

    @model_validator(mode="after")
    def _enough_symbols(self) -> GameRules:
        if not self.allow_repeats and self.symbols < self.length:
            raise ValueError(f"allow_repeats false needs symbols >= length ({self.symbols} < {self.length})")
        return self


def secret_code(rules: GameRules) -> str:
    """The secret for these rules: the same seed, the same code."""
    rng = random.Random(rules.seed)
    digits = [str(d) for d in range(1, rules.symbols + 1)]
    picked = rng.choices(digits, k=rules.length) if rules.allow_repeats else rng.sample(digits, rules.length)
    return "".join(picked)


def score(secret: str, guess: str) -> tuple[int, int]:
    """``(right place, wrong place)``: exact matches, then common digits not already matched."""
    exact = sum(s == g for s, g in zip(secret, guess, strict=True))
    common = sum((Counter(secret) & Counter(guess)).values())
    return exact, common - exact


@dataclass
class Game:
    """One game in play."""

    rules: GameRules
    secret: str
    guesses: list[str] = field(default_factory=list)  # every answer, well-formed or not ("" for none)

    @property
    def left(self) -> int:
        """Guesses left."""
        return self.rules.max_guesses - len(self.guesses)

    def problem(self, guess: str | None) -> str | None:
        """What is wrong with a guess, or None for a well-formed one."""
        top = self.rules.symbols
        if guess is None:
            return f"no <guess>...</guess> tag with {self.rules.length} digits"
        if len(guess) != self.rules.length or any(c not in "123456789"[:top] for c in guess):
            return f"{guess!r} is not {self.rules.length} digits from 1 to {top}"
        return None


def opening(rules: GameRules) -> str:
    """The first observation: the rules of this game."""
    repeats = "digits may repeat" if rules.allow_repeats else "no digit repeats"
    return (
        f"I picked a secret code of {rules.length} digits, each from 1 to {rules.symbols} ({repeats}). "
        f"Crack it in at most {rules.max_guesses} guesses. Answer with one guess per turn as "
        f"<guess>{'1234567890'[: rules.length]}</guess>. After each guess I say how many digits are right and in "
        "the right place, and how many are right but in the wrong place."
    )


class CodebreakerServer(GymnasiumServer):
    """A seeded secret code per rollout; reward 1.0 once cracked within ``max_guesses``, else 0.0."""

    plain_bodies = True  # handlers read response/responses_create_params as dicts

    async def reset(
        self, metadata: dict[str, Any], session_id: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        """Draw the secret from the row's ``seed`` and state the rules."""
        rules = self.parse_row(GameRules, metadata)
        self.session_state[session_id] = Game(rules, secret_code(rules))
        return opening(rules), {"max_guesses": rules.max_guesses}

    async def step(
        self, action: dict[str, Any], metadata: dict[str, Any], session_id: str | None = None
    ) -> StepResult:
        """Score the answer's guess; the game ends when it is cracked or no guesses are left."""
        game: Game | None = self.session_state.get(session_id)
        if game is None:
            raise HTTPError(409, "no game in this rollout: call /reset first (or it ended or expired)")
        found = GUESS.search(extract_text(action))
        guess = found.group(1).replace(" ", "") if found else None
        problem = game.problem(guess)
        game.guesses.append(guess or "")
        number = len(game.guesses)
        if problem is None and guess == game.secret:
            info = {"result": "cracked", "secret": game.secret, "guesses": number}
            return None, 1.0, True, False, info
        if game.left == 0:
            info = {"result": "out_of_guesses", "secret": game.secret, "guesses": number}
            return None, 0.0, True, False, info
        left = f"{game.left} guess{'es' if game.left != 1 else ''} left"
        if problem is not None:
            return (
                f"Guess {number} is not valid: {problem}. {left}.",
                0.0,
                False,
                False,
                {"invalid_guess": True},
            )
        assert guess is not None
        right, misplaced = score(game.secret, guess)
        feedback = (
            f"Guess {number}: {guess}: {right} right and in the right place, "
            f"{misplaced} right but in the wrong place. {left}."
        )
        return feedback, 0.0, False, False, {"right_place": right, "wrong_place": misplaced}


if __name__ == "__main__":
    CodebreakerServer.run_webserver()
