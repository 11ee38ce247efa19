"""The token IDs of a model server's own answers, kept so that clients which drop them still splice.

A client of the Anthropic Messages or Gemini dialect (Claude Code, Gemini CLI) echoes the
conversation back without our token-ID fields: its SDK keeps only the fields it knows. Without
them the engine re-renders the history and call k+1's prompt no longer extends call k's prompt +
generation (docs/TOKEN_IDS.md). :class:`TokenIdMemory` remembers the token-ID fields of every
answer the server gave, by the key an echoed copy of the answer's last item can be recognised
by (:func:`item_key`: a function call by its call id, reasoning and messages by their text), and
puts them back on the echoed items before the engine renders the prompt.

Memories are kept per conversation scope: the rollout id of an ``/ng-rollout/<id>`` call, else a
client's session header, else one scope for the server. The bounds drop the least recently used:
``max_scopes`` conversations, ``max_items`` answers each (only the latest answer a history
echoes is ever needed; the one before covers a retried call), ``max_tokens`` token IDs in all (the default 8 million, kept as tuples that share the answer's
own numbers: at most about 300 MB).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from nemo_gym.models.conversion import TOKEN_ID_FIELDS
from nemo_gym.response_items import content_text, is_model_item

CONTIGUITY_FIELD = "token_ids_contiguous"
_KEPT_FIELDS = (*TOKEN_ID_FIELDS, CONTIGUITY_FIELD)


def item_key(item: dict[str, Any]) -> tuple[str, str]:
    """How an echoed copy of a model item is recognised: its call id, or its text."""
    if item.get("type") == "function_call":
        return ("call", str(item.get("call_id") or ""))
    if item.get("type") == "reasoning":
        summary = item.get("summary") or item.get("content") or []
        return (
            "reasoning",
            "".join(str(part.get("text") or "") for part in summary if isinstance(part, dict)),
        )
    # Clients may trim the text they echo; the trimmed text still names the same answer.
    return ("message", content_text(item.get("content")).strip())


class TokenIdMemory:
    """Token-ID fields of a server's answers, per conversation scope (see the module docstring)."""

    def __init__(self, max_scopes: int = 4096, max_items: int = 2, max_tokens: int = 8_000_000) -> None:
        self.max_scopes = max_scopes
        self.max_items = max_items
        self.max_tokens = max_tokens
        self._scopes: OrderedDict[str, OrderedDict[tuple[str, str], dict[str, Any]]] = OrderedDict()
        self._tokens = 0

    def remember(self, scope: str, response: dict[str, Any]) -> None:
        """Keep the token-ID fields of ``response``'s last output item that carries them."""
        output = response.get("output") or []
        carrier = next((item for item in reversed(output) if "prompt_token_ids" in item), None)
        if carrier is None:
            return
        try:
            fields = _packed(carrier)
        except (TypeError, ValueError, OverflowError):
            return  # not lists of numbers: nothing the splice could use
        items = self._scopes.get(scope)
        if items is None:
            items = self._scopes[scope] = OrderedDict()
        else:
            self._scopes.move_to_end(scope)
        key = item_key(carrier)
        if key in items:
            self._tokens -= _size(items.pop(key))
        items[key] = fields
        self._tokens += _size(fields)
        if len(items) > self.max_items:
            self._tokens -= _size(items.popitem(last=False)[1])
        while self._scopes and (len(self._scopes) > self.max_scopes or self._tokens > self.max_tokens):
            _, dropped = self._scopes.popitem(last=False)
            self._tokens -= sum(_size(entry) for entry in dropped.values())

    def restore(self, scope: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``items`` with the remembered token-ID fields put back on the latest call that lost them.

        The splice reads only the last model item that carries IDs (its prompt already holds
        every earlier turn), so only the latest call's last item (a run of model items is one
        call's output) is given them back, which keeps a turn's cost flat in the history's
        length; when that item still carries its fields, nothing changes.
        """
        known = self._scopes.get(scope)
        if not known:
            return items
        for index in range(len(items) - 1, -1, -1):
            item = items[index]
            closes_call = index + 1 == len(items) or not is_model_item(items[index + 1])
            if not closes_call or not is_model_item(item):
                continue
            if "prompt_token_ids" in item:
                return items
            fields = known.get(item_key(item))
            if fields:
                restored = list(items)
                restored[index] = {**item, **_as_lists(fields)}
                return restored
        return items

    def remember_chat(self, scope: str, completion: dict[str, Any]) -> None:
        """Keep the token-ID fields of a vLLM-flavoured chat completion (``prompt_token_ids``,
        ``choices[0].token_ids`` and its logprobs), by its assistant message's key."""
        choices = completion.get("choices") or [{}]
        choice = choices[0]
        prompt = completion.get("prompt_token_ids") or choice.get("prompt_token_ids")
        generated = choice.get("token_ids")
        entries = (choice.get("logprobs") or {}).get("content")
        if prompt is None or generated is None or entries is None or len(entries) != len(generated):
            return
        carrier = {
            **_chat_message_item(choice.get("message") or {}),
            "prompt_token_ids": list(prompt),
            "generation_token_ids": list(generated),
            "generation_log_probs": [entry.get("logprob") for entry in entries],
        }
        if completion.get(CONTIGUITY_FIELD) is False:
            carrier[CONTIGUITY_FIELD] = False
        self.remember(scope, {"output": [carrier]})

    def restore_chat(self, scope: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Chat ``messages`` with remembered token-ID fields put back on the latest assistant
        message that lost them (see :meth:`restore`)."""
        known = self._scopes.get(scope)
        if not known:
            return messages
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            if "prompt_token_ids" in message:
                return messages
            fields = known.get(item_key(_chat_message_item(message)))
            if fields:
                restored = list(messages)
                restored[index] = {**message, **_as_lists(fields, drop=(CONTIGUITY_FIELD,))}
                return restored
        return messages

    def forget(self, scope: str) -> None:
        """Drop one scope's memory (a finished rollout)."""
        self._scopes.pop(scope, None)

    def __len__(self) -> int:
        return len(self._scopes)


def _chat_message_item(message: dict[str, Any]) -> dict[str, Any]:
    """A chat assistant message as the Responses item :func:`item_key` recognises: its last tool
    call (the call id is the same on both paths), else its text."""
    calls = message.get("tool_calls") or []
    if calls:
        return {"type": "function_call", "call_id": calls[-1].get("id")}
    return {"type": "message", "role": "assistant", "content": message.get("content") or ""}


def _packed(carrier: dict[str, Any]) -> dict[str, Any]:
    # Tuples share the answer's own numbers (restoring copies pointers, not numbers), and tuples of
    # numbers are untracked by the garbage collector after its first pass over them.
    fields: dict[str, Any] = {
        key: tuple(carrier.get(key) or ())
        for key in ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
    }
    if CONTIGUITY_FIELD in carrier:
        fields[CONTIGUITY_FIELD] = carrier[CONTIGUITY_FIELD]
    return fields


def _size(fields: dict[str, Any]) -> int:
    return len(fields["prompt_token_ids"]) + len(fields["generation_token_ids"])


def _as_lists(fields: dict[str, Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    # A list of the same numbers: a copy of pointers, no new numbers made.
    return {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in fields.items()
        if key not in drop
    }
