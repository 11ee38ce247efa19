"""The token IDs of a model server's own answers, kept so that clients which drop them still splice.

A client of the Anthropic Messages or Gemini dialect (Claude Code, Gemini CLI) echoes the
conversation back without our token-ID fields: its SDK keeps only the fields it knows. Without
them the engine re-renders the history and call k+1's prompt no longer extends call k's prompt +
generation (docs/TOKEN_IDS.md). :class:`TokenIdMemory` remembers the token-ID fields of every
answer the server gave, by the key an echoed copy of the answer's last item can be recognised
by (:func:`item_key`: a function call by its call id, reasoning and messages by their text), and
puts them back on the echoed items before the engine renders the prompt.

Memories are kept per conversation scope: the rollout id of an ``/ng-rollout/<id>`` call, else a
client's session header, else one scope for the server. Both bounds are least-recently-used:
``max_scopes`` conversations, ``max_items`` answers each. Function calls are keyed by call ids
the server made unique, so they cannot be confused across conversations; two conversations of
one scope whose model wrote the very same text are the only way a text key can match the wrong
answer, which is why callers should send a rollout id (the splice then still refuses IDs whose
turn count does not fit the history).
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

    def __init__(self, max_scopes: int = 4096, max_items: int = 1024) -> None:
        self.max_scopes = max_scopes
        self.max_items = max_items
        self._scopes: OrderedDict[str, OrderedDict[tuple[str, str], dict[str, Any]]] = OrderedDict()

    def remember(self, scope: str, response: dict[str, Any]) -> None:
        """Keep the token-ID fields of ``response``'s last output item that carries them."""
        output = response.get("output") or []
        carrier = next((item for item in reversed(output) if "prompt_token_ids" in item), None)
        if carrier is None:
            return
        fields = {key: carrier[key] for key in _KEPT_FIELDS if key in carrier}
        items = self._scopes.get(scope)
        if items is None:
            items = self._scopes[scope] = OrderedDict()
            if len(self._scopes) > self.max_scopes:
                self._scopes.popitem(last=False)
        else:
            self._scopes.move_to_end(scope)
        key = item_key(carrier)
        items[key] = fields
        items.move_to_end(key)
        if len(items) > self.max_items:
            items.popitem(last=False)

    def restore(self, scope: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``items`` with the remembered token-ID fields put back on model items that lost them.

        Only the last model item of each run of model items (one call's output) can carry them,
        as on the Responses path; items that still have their fields are left as they are.
        """
        known = self._scopes.get(scope)
        if not known:
            return items
        restored = list(items)
        for index, item in enumerate(items):
            closes_call = index + 1 == len(items) or not is_model_item(items[index + 1])
            if not closes_call or not is_model_item(item) or "prompt_token_ids" in item:
                continue
            fields = known.get(item_key(item))
            if fields:
                restored[index] = {**item, **fields}
        return restored

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
        """Chat ``messages`` with remembered token-ID fields put back on assistant messages that lost them."""
        known = self._scopes.get(scope)
        if not known:
            return messages
        restored = []
        for message in messages:
            if (
                isinstance(message, dict)
                and message.get("role") == "assistant"
                and "prompt_token_ids" not in message
            ):
                fields = known.get(item_key(_chat_message_item(message)))
                if fields:
                    message = {**message, **{k: v for k, v in fields.items() if k != CONTIGUITY_FIELD}}
            restored.append(message)
        return restored

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
