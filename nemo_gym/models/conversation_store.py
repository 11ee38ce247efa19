"""Conversations a model server keeps for a rollout, so a long rollout's turns send only what is new.

A Responses request with ``store: true`` asks the model server to keep the conversation it
answered (the request's input items followed by the answer's output items) under the answer's
``id``; the answer then carries the header ``X-NeMo-Gym-Conversation: kept``. The next request may
send ``previous_response_id`` with only the items that are new since; the server puts the kept
items in front of them, so the engine sees exactly the request the full history would have made.
A continued conversation moves to the new answer's id (one entry per rollout, never one per
turn), ``DELETE /v1/responses/{id}`` drops it, and an unknown id is a 400
``previous_response_not_found`` (the caller then sends the full history again).

What is kept is bounded: at most ``max_conversations`` conversations and ``max_bytes`` of their
items (JSON-encoded size), the least recently used dropped first, and none older than
``ttl_s`` since last use. Entries are keyed by the rollout (the ``/ng-rollout/<id>`` prefix)
and the response id, so two rollouts never see each other's items.

Each kept conversation also holds what servers derived from its items (``derived``: the input
already encoded for an upstream, already converted to chat messages, ...) so a continued turn
extends that work by the new items instead of redoing it over the whole history.
"""

from __future__ import annotations

import contextvars
import time
from collections import OrderedDict
from typing import Any

import orjson

# The header a model server answers with when it kept the conversation (``store: true``).
KEPT_HEADER = "x-nemo-gym-conversation"
KEPT_VALUE = "kept"
KEPT_HEADER_LINE = (KEPT_HEADER.encode("latin-1"), KEPT_VALUE.encode("latin-1"))  # as sent
# OpenAI's error code for a ``previous_response_id`` the server does not hold.
NOT_FOUND_CODE = "previous_response_not_found"

DEFAULT_MAX_CONVERSATIONS = 8192
DEFAULT_MAX_BYTES = 512 * 2**20
DEFAULT_TTL_S = 1800.0


class KeptConversation:
    """One conversation: its items in order, their encoded sizes, and what servers derived from them.

    Once a server asks for it (:meth:`take_encoded`), each :meth:`extend` also keeps the JSON of
    the items it added until the server takes it: a server sending the items on as JSON (an
    upstream's ``input``) reuses these bytes instead of encoding each item again.
    """

    __slots__ = ("items", "nbytes", "derived", "touched", "parsed_output", "encoded_since")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.nbytes = 0
        self.derived: dict[str, Any] = {}
        self.touched = 0.0
        # Set by a handler answering the turn being served with an ``output`` list it parsed from
        # JSON itself and holds no reference to (a passthrough's upstream answer): that list is
        # kept as it is, not copied through JSON as a handler's own objects are.
        self.parsed_output: list[Any] | None = None
        # What take_encoded hands out (None until first asked for; a server on its hot path may
        # take it as take_encoded does: read it, then leave an empty list).
        self.encoded_since: list[tuple[int, bytes]] | None = None

    def take_encoded(self) -> list[tuple[int, bytes]]:
        """The JSON of the items added since the last call (none on the first, which starts
        keeping it), one entry per :meth:`extend`: ``(the number of items after it, their JSON)``,
        the JSON written as it continues an array (a comma, then the items joined by commas)."""
        taken = self.encoded_since
        self.encoded_since = []
        return taken or []

    def extend(self, items: list[Any], round_trip: bool = False, encoded: bytes | None = None) -> int:
        """Append items; the bytes they add (their JSON size). ``round_trip``: keep them as a
        client parsing the answer would see them (plain JSON values, whatever a handler built);
        ``encoded``: their JSON (``orjson.dumps(items)``) when the caller has it already."""
        if not items:
            return 0
        raw = orjson.dumps(items) if encoded is None else encoded
        self.items.extend(orjson.loads(raw) if round_trip else items)
        if self.encoded_since is not None:
            self.encoded_since.append((len(self.items), b"," + raw[1:-1]))
        size = len(raw)
        self.nbytes += size
        return size

    def truncate(self, count: int, nbytes: int) -> None:
        """Back to the first ``count`` items (a turn that failed is undone); derived work is dropped."""
        del self.items[count:]
        self.nbytes = nbytes
        self.derived.clear()
        encoded = self.encoded_since
        while encoded and encoded[-1][0] > count:
            encoded.pop()


class ConversationStore:
    """The bounded, per-rollout store of kept conversations (one per model server process)."""

    def __init__(
        self,
        max_conversations: int = DEFAULT_MAX_CONVERSATIONS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.max_conversations = max_conversations
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._entries: OrderedDict[tuple[str, str], KeptConversation] = OrderedDict()
        self.nbytes = 0
        # No entry expires before this time (entries are in the order they were kept, each kept
        # at its ``touched``): until then a call skips looking for expired entries.
        self._no_expiry_before = float("inf")

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, rollout: str | None, response_id: str) -> KeptConversation | None:
        """Remove and return the conversation kept under ``response_id`` (None when not held)."""
        now = time.monotonic()
        if now >= self._no_expiry_before:
            self._expire(now)
        found = self._entries.pop((rollout or "", response_id), None)
        if found is not None:
            self.nbytes -= found.nbytes
        return found

    def put(self, rollout: str | None, response_id: str, conversation: KeptConversation) -> bool:
        """Keep ``conversation`` under ``response_id``; whether it is kept (not when it alone is over
        a bound or the id is already taken). The least recently kept entries make room."""
        key = (rollout or "", response_id)
        if conversation.nbytes > self.max_bytes or key in self._entries:
            return False
        now = time.monotonic()
        if now >= self._no_expiry_before:
            self._expire(now)
        conversation.touched = now
        if not self._entries:
            self._no_expiry_before = now + self.ttl_s
        self._entries[key] = conversation
        self.nbytes += conversation.nbytes
        while self._entries and (self.nbytes > self.max_bytes or len(self._entries) > self.max_conversations):
            _, dropped = self._entries.popitem(last=False)
            self.nbytes -= dropped.nbytes
        return key in self._entries

    def drop(self, rollout: str | None, response_id: str) -> bool:
        """Forget the conversation kept under ``response_id``; whether there was one."""
        return self.take(rollout, response_id) is not None

    def stats(self) -> dict[str, int]:
        """``{"conversations", "bytes"}`` held now (served on ``GET /``)."""
        return {"conversations": len(self._entries), "bytes": self.nbytes}

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            key, oldest = next(iter(entries.items()))
            if now - oldest.touched < self.ttl_s:
                self._no_expiry_before = oldest.touched + self.ttl_s
                return
            del entries[key]
            self.nbytes -= oldest.nbytes
        self._no_expiry_before = float("inf")


_current: contextvars.ContextVar[KeptConversation | None] = contextvars.ContextVar(
    "nemo_gym_kept_conversation", default=None
)


# The kept conversation the request being handled continues (None for a full-history request):
# ``current_conversation()``. Its ``items`` are the request's whole input; a handler may cache
# what it derives from them in ``derived`` (keyed by its own name, with how many items it
# covered) and extend it next turn. ``set_current_conversation(conversation)`` sets it for the
# request (returning the token) and ``reset_current_conversation(token)`` undoes that: the
# context variable's own methods, one C call each on every kept turn.
current_conversation = _current.get
set_current_conversation = _current.set
reset_current_conversation = _current.reset
