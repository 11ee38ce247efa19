"""A rollout's prompt tokenization reused from call to call: call t tokenizes only what is new.

Every model call of a rollout renders the whole conversation through the chat template and, with
token IDs on, the splice renders it twice (the history up to the last assistant turn, and the
whole of it). Tokenizing those texts from scratch makes a rollout of K calls tokenize K growing
prefixes: quadratic in K. The text of call t starts with the text of call t-1 up to (at least) its
last turn-end marker, and a turn-end marker is a special token, where a tokenizer splits its input
before anything else: the IDs up to and including that marker are call t-1's, unchanged.

:class:`PromptTokenCache` keeps, per rollout, the last renders' text and IDs with the places where
turn-end markers sit in both. Encoding a new text finds the longest kept text it extends up to a
marker (a ``startswith`` per probe, binary search over the markers), takes those IDs as they are,
and tokenizes only ``marker + rest``: the marker is included so the rest is tokenized in the
context it has in the whole text (a pre-tokenizer that treats the start of the input apart, an
added token that strips the whitespace beside it, see the same neighbours), and its own ID,
which must come out first, is dropped. Anything that does not line up (the marker's ID does not
come out first, the markers in the text and in the IDs differ in number) falls back to tokenizing
the whole text. The IDs are those of ``tokenizer.encode(text, add_special_tokens=False)``
(``tests/test_prompt_token_cache.py`` compares both over many-turn rollouts of every tiny
template); a tokenizer that fails a check of that on a few texts at start-up is never cached.

Bounds: ``max_renders`` renders per rollout (2: a call's prefix and full renders), ``max_scopes``
rollouts and ``max_tokens`` token IDs in all, least recently used dropped first; :meth:`free`
drops a rollout's state when it ends.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Render:
    text: str
    ids: array[int]
    # (character offset just after a marker, the number of IDs up to and including it, its ID).
    cuts: tuple[tuple[int, int, int], ...]


class PromptTokenCache:
    """Per-rollout reuse of prompt tokenization (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        turn_end_token_ids: Iterable[int],
        *,
        max_scopes: int = 1024,
        max_renders: int = 2,
        max_tokens: int = 16_000_000,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_scopes = max_scopes
        self.max_renders = max_renders
        self.max_tokens = max_tokens
        self._markers = _marker_strings(tokenizer, turn_end_token_ids)
        self._scopes: OrderedDict[str, list[_Render]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.reused_tokens = 0
        self.encoded_chars = 0
        self.enabled = bool(self._markers) and self._agrees_on_samples()
        self.reused_tokens = 0  # the check's own work is not counted
        self.encoded_chars = 0

    # ---- the encoder a render uses -------------------------------------------------------------
    def plain_encode(self, text: str) -> list[int]:
        """What every cached encoding must equal: the tokenizer's own IDs for ``text``."""
        self.encoded_chars += len(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encoder(self, scope: str | None) -> Callable[[str], list[int]]:
        """``encode(text)`` for one rollout (``scope``), or the plain encoding without one."""
        if scope is None or not self.enabled:
            return self.plain_encode
        return lambda text: self.encode(scope, text)

    def encode(self, scope: str, text: str) -> list[int]:
        """The IDs of ``text``, reusing what this rollout's earlier renders tokenized."""
        with self._lock:
            renders = list(self._scopes.get(scope, ()))
            if renders:
                self._scopes.move_to_end(scope)
        ids, cuts = self._encode_reusing(text, renders)
        self._keep(scope, _Render(text, array("i", ids), cuts))
        return ids

    def free(self, scope: str) -> None:
        """Forget a rollout (it ended)."""
        with self._lock:
            for render in self._scopes.pop(scope, ()):
                self._tokens -= len(render.ids)

    def __len__(self) -> int:
        return len(self._scopes)

    @property
    def kept_tokens(self) -> int:
        """Token IDs held over all rollouts."""
        return self._tokens

    # ---- internals ------------------------------------------------------------------------------
    def _encode_reusing(
        self, text: str, renders: list[_Render]
    ) -> tuple[list[int], tuple[tuple[int, int, int], ...]]:
        best: tuple[_Render, int] | None = None
        for render in renders:
            index = _longest_shared_cut(render, text)
            if index >= 0 and (best is None or render.cuts[index][0] > best[0].cuts[best[1]][0]):
                best = (render, index)
        if best is not None:
            render, index = best
            offset, count, marker_id = render.cuts[index]
            marker = self._markers[marker_id]
            tail = self.plain_encode(marker + text[offset:])
            if tail and tail[0] == marker_id:
                ids = render.ids[:count].tolist() + tail[1:]
                cuts = _cuts(text, ids, self._markers, render.cuts[: index + 1], offset, count)
                if cuts is not None:
                    self.reused_tokens += count
                    return ids, cuts
        ids = self.plain_encode(text)
        return ids, _cuts(text, ids, self._markers, (), 0, 0) or ()

    def _keep(self, scope: str, render: _Render) -> None:
        with self._lock:
            kept = self._scopes.setdefault(scope, [])
            kept.append(render)
            self._tokens += len(render.ids)
            while len(kept) > self.max_renders:
                self._tokens -= len(kept.pop(0).ids)
            self._scopes.move_to_end(scope)
            while self._scopes and (len(self._scopes) > self.max_scopes or self._tokens > self.max_tokens):
                _, dropped = self._scopes.popitem(last=False)
                self._tokens -= sum(len(r.ids) for r in dropped)

    def _agrees_on_samples(self) -> bool:
        """Whether cached encodings equal plain ones on a few texts built around the markers."""
        markers = list(self._markers.values())
        pieces = ["system: be brief.", " user  says hi\n", '\n\nassistant: {"a": 1}', "ünïcödé  ", "  tail"]
        text, agrees = "", True
        for i, piece in enumerate(pieces):
            text += piece + markers[i % len(markers)]
            sample = text + "\nnext "
            if self.encode(_PROBE, sample) != list(self.tokenizer.encode(sample, add_special_tokens=False)):
                agrees = False
                break
        self.free(_PROBE)
        return agrees


_PROBE = "\x00nemo_gym.prompt_token_cache.probe"


def _marker_strings(tokenizer: Any, turn_end_token_ids: Iterable[int]) -> dict[int, str]:
    """Turn-end ID -> its text, for the IDs that are special tokens (split on before anything else)."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    out = {}
    for token_id in turn_end_token_ids:
        added = decoder.get(token_id)
        content = getattr(added, "content", None)
        if content and (token_id in special or getattr(added, "special", False)):
            out[int(token_id)] = str(content)
    return out


def _longest_shared_cut(render: _Render, text: str) -> int:
    """Index of the last cut of ``render`` up to which ``text`` equals its text, or -1."""
    offsets = [cut[0] for cut in render.cuts]
    if not offsets:
        return -1
    # Sharing the prefix up to a cut holds for every cut before it: binary search for the last one.
    lo, hi, found = 0, len(offsets) - 1, -1
    if text.startswith(render.text[: offsets[hi]]):
        return hi
    while lo <= hi:
        mid = (lo + hi) // 2
        if text.startswith(render.text[: offsets[mid]]):
            found, lo = mid, mid + 1
        else:
            hi = mid - 1
    return found


def _cuts(
    text: str,
    ids: list[int],
    markers: dict[int, str],
    kept: tuple[tuple[int, int, int], ...],
    offset: int,
    count: int,
) -> tuple[tuple[int, int, int], ...] | None:
    """The marker cuts of ``text``/``ids``: ``kept`` (those up to ``offset``/``count``) plus the
    ones after, or None when the markers in the text and in the IDs do not pair up."""
    found: list[tuple[int, int]] = []  # (end offset in text, marker id)
    for marker_id, marker in markers.items():
        start = text.find(marker, offset)
        while start >= 0:
            found.append((start + len(marker), marker_id))
            start = text.find(marker, start + len(marker))
    found.sort()
    positions = [i for i in range(count, len(ids)) if ids[i] in markers]
    if len(positions) != len(found):
        return None
    cuts = list(kept)
    for (end, marker_id), position in zip(found, positions, strict=True):
        if ids[position] != marker_id:
            return None
        cuts.append((end, position + 1, marker_id))
    return tuple(cuts)
