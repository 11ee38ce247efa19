"""blackjack: NeMo Gym's Gymnasium-style blackjack, one hand per rollout.

``/reset`` deals two cards to the player and two to the dealer from an infinite deck (every
draw is a uniform rank; suits do not matter) and shows the player's hand and the dealer's
first card. Each ``/step`` reads ``<action>hit</action>`` or ``<action>stand</action>`` from
the model's text. Hitting past 21 ends the hand at -1. Standing lets the dealer draw to 17
(standing on every 17) and settles it: +1 for a win (dealer over 21 or a higher total), 0 for
equal totals, -1 for a loss. The reward is given on the final step, every other step pays 0.

An answer with no action tag stands, as in NeMo Gym; ``unparsed_action: ask_again`` in the
server config instead answers with an observation asking for a tag (reward 0, hand unchanged).
A row's optional ``seed`` makes the deal and every later draw reproducible.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from nemo_gym.base_resources_server import BaseResourcesServerConfig, HTTPError, validation_error_body
from nemo_gym.gymnasium_server import GymnasiumServer, StepResult, extract_text

RANKS = ("2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K", "A")
ACTION = re.compile(r"<action>\s*(hit|stand)\s*</action>", re.IGNORECASE)
PROMPT = "Respond with <action>hit</action> or <action>stand</action>."


def hand_value(hand: list[str]) -> int:
    """The best total of a hand: faces count 10, aces 11 unless that passes 21, then 1."""
    total = sum(11 if rank == "A" else 10 if rank in ("J", "Q", "K") else int(rank) for rank in hand)
    aces = hand.count("A")
    while total > 21 and aces:
        total -= 10
        aces -= 1
    return total


def show(hand: list[str]) -> str:
    """A hand as the model sees it: ``[10, A]``."""
    return "[" + ", ".join(hand) + "]"


@dataclass
class Hand:
    """One hand in play: both sides' cards and the random source for every later draw."""

    rng: random.Random
    player: list[str] = field(default_factory=list)
    dealer: list[str] = field(default_factory=list)

    @classmethod
    def deal(cls, seed: int | None) -> Hand:
        """Two cards to the player, then two to the dealer (NeMo Gym's order)."""
        hand = cls(rng=random.Random(seed))
        hand.player = [hand.draw(), hand.draw()]
        hand.dealer = [hand.draw(), hand.draw()]
        return hand

    def draw(self) -> str:
        """One card from an infinite deck."""
        return self.rng.choice(RANKS)

    def observation(self) -> str:
        """The player's hand and total, the dealer's first card, and the action format."""
        return f"Your hand: {show(self.player)} = {hand_value(self.player)}\nDealer shows: {self.dealer[0]}\n{PROMPT}"

    def hit(self) -> StepResult:
        """Take a card: over 21 ends the hand at -1, otherwise the hand goes on."""
        self.player.append(self.draw())
        value = hand_value(self.player)
        if value > 21:
            return None, -1.0, True, False, {"result": "bust", "player": show(self.player), "value": value}
        return self.observation(), 0.0, False, False, {}

    def stand(self) -> StepResult:
        """The dealer draws to 17 or more, then the totals settle the hand."""
        while hand_value(self.dealer) < 17:
            self.dealer.append(self.draw())
        player, dealer = hand_value(self.player), hand_value(self.dealer)
        if dealer > 21 or player > dealer:
            reward, result = 1.0, "win"
        elif player == dealer:
            reward, result = 0.0, "draw"
        else:
            reward, result = -1.0, "loss"
        info = {
            "result": result,
            "player": show(self.player),
            "player_value": player,
            "dealer": show(self.dealer),
            "dealer_value": dealer,
        }
        return None, reward, True, False, info


class BlackjackConfig(BaseResourcesServerConfig):
    """``unparsed_action``: ``stand`` (NeMo Gym's) or ``ask_again`` (an observation asking for a tag)."""

    unparsed_action: Literal["stand", "ask_again"] = "stand"


class BlackjackRow(BaseModel):
    """The row fields the game reads: an optional integer ``seed`` (no seed: a fresh random hand)."""

    model_config = ConfigDict(extra="ignore")

    seed: int | None = None


class BlackjackServer(GymnasiumServer):
    """A hand of blackjack per rollout; reward +1 win, 0 draw, -1 loss or bust."""

    config: BlackjackConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    async def reset(
        self, metadata: dict[str, Any], session_id: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        """Deal a hand (from the row's ``seed`` when it has one)."""
        try:
            row = BlackjackRow.model_validate(metadata)
        except ValidationError as exc:
            raise HTTPError(422, **_invalid_row(exc, self.name)) from None
        hand = Hand.deal(row.seed)
        self.session_state[session_id] = hand
        return hand.observation(), {}

    async def step(
        self, action: dict[str, Any], metadata: dict[str, Any], session_id: str | None = None
    ) -> StepResult:
        """Hit or stand as the answer's ``<action>`` tag says (no tag: stand, or ask again)."""
        hand: Hand | None = self.session_state.get(session_id)
        if hand is None:
            raise HTTPError(
                409,
                "no hand in this rollout: call /reset first (the hand may also be over, or have expired "
                "after session_ttl_s)",
            )
        found = ACTION.search(extract_text(action))
        if found is None and self.config.unparsed_action == "ask_again":
            note = "I could not find <action>hit</action> or <action>stand</action> in your answer."
            return f"{note}\n{hand.observation()}", 0.0, False, False, {"unparsed_action": True}
        if found is not None and found.group(1).lower() == "hit":
            return hand.hit()
        return hand.stand()


def _invalid_row(exc: ValidationError, server: str) -> dict[str, Any]:
    body = validation_error_body(exc, server, "row")
    return {"message": body["error"], "detail": body["detail"]}


if __name__ == "__main__":
    BlackjackServer.run_webserver()
