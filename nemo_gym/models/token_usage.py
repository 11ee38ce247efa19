"""Token usage between Chat Completions (``prompt_tokens``, ...) and the Responses API (``input_tokens``, ...).

Engines and providers report cached and reasoning token counts in the nested details or under
their own top-level names; :func:`usage_detail` reads either, and a count nobody reported stays
unknown until the caller picks what unknown means (0 for our servers, ``None`` for NeMo Gym's
converter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def chat_usage_to_responses(usage: Any, unknown: int | None = 0) -> dict[str, Any] | None:
    """A chat ``usage`` (dict or object) as Responses ``usage``; counts the engine did not report are ``unknown``.

    Cached and reasoning token counts are read from their nested details, then from the
    top-level names some providers use instead (``cached_input_tokens``, ``cache_read_input_tokens``,
    ``reasoning_output_tokens``).
    """
    if not usage:
        return None
    input_tokens = usage_detail(usage, "", "prompt_tokens") or 0
    output_tokens = usage_detail(usage, "", "completion_tokens") or 0
    total = usage_detail(usage, "", "total_tokens")
    cached = usage_detail(
        usage, "prompt_tokens_details", "cached_tokens", "cached_input_tokens", "cache_read_input_tokens"
    )
    cache_write = usage_detail(usage, "prompt_tokens_details", "cache_write_tokens")
    reasoning = usage_detail(
        usage, "completion_tokens_details", "reasoning_tokens", "reasoning_output_tokens"
    )
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        # Provider totals may count differently from prompt + completion: keep theirs when given.
        "total_tokens": total or input_tokens + output_tokens,
        # Recent `openai` types require cache_write_tokens; an engine that does not report it wrote none.
        "input_tokens_details": {
            "cached_tokens": _default(cached, unknown),
            "cache_write_tokens": _default(cache_write, 0 if unknown is None else unknown),
        },
        "output_tokens_details": {"reasoning_tokens": _default(reasoning, unknown)},
    }


def usage_detail(usage: Any, group: str, name: str, *aliases: str) -> int | None:
    """A token count from ``usage[group][name]`` (``usage[name]`` for an empty group), then ``usage[alias]``.

    ``usage`` may be a dict or an object; only non-negative integers count, anything else is None.
    """

    def field(source: Any, key: str) -> Any:
        return source.get(key) if isinstance(source, Mapping) else getattr(source, key, None)

    details = field(usage, group) if group else usage
    for source, key in ((details, name), *((usage, alias) for alias in aliases)):
        value = field(source, key) if source is not None else None
        if type(value) is int and value >= 0:
            return value
    return None


def responses_usage_to_chat(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Responses ``usage`` as a chat ``usage`` (None stays None; unreported details count 0)."""
    if not usage:
        return None
    return {
        "prompt_tokens": usage.get("input_tokens") or 0,
        "completion_tokens": usage.get("output_tokens") or 0,
        "total_tokens": usage.get("total_tokens") or 0,
        "prompt_tokens_details": {
            "cached_tokens": _detail(usage, "input_tokens_details", "cached_tokens"),
            "cache_write_tokens": _detail(usage, "input_tokens_details", "cache_write_tokens"),
        },
        "completion_tokens_details": {
            "reasoning_tokens": _detail(usage, "output_tokens_details", "reasoning_tokens")
        },
    }


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _detail(usage: dict[str, Any], details: str, key: str) -> int:
    return (usage.get(details) or {}).get(key) or 0


# Usage counts whose fields NeMo Gym's pinned openai version lacks: left out of a dump while
# unknown, so a dump has NeMo Gym's keys.
NEWER_INPUT_DETAILS = ("cache_write_tokens", "cache_write_tokens_details")


def without_unknown(dumped: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """``dumped`` without those of ``keys`` whose value is ``None``."""
    for key in keys:
        if key in dumped and dumped[key] is None:
            del dumped[key]
    return dumped


def _add_counts(left: int | None, right: int | None) -> int | None:
    # An unknown count stays unknown rather than becoming a measurement.
    return None if left is None or right is None else left + right


def add_usage(total: Any, additional: Any) -> Any:
    """Add ``additional``'s counts (a Responses usage model) into ``total`` (one of the same
    shape), details included: a detail count unknown in either stays unknown. Returns ``total``."""
    total.input_tokens += additional.input_tokens
    total.output_tokens += additional.output_tokens
    total.total_tokens += additional.total_tokens
    for group, key in (
        ("input_tokens_details", "cached_tokens"),
        ("input_tokens_details", "cache_write_tokens"),
        ("output_tokens_details", "reasoning_tokens"),
    ):
        mine, theirs = getattr(total, group), getattr(additional, group)
        setattr(mine, key, _add_counts(getattr(mine, key, None), getattr(theirs, key, None)))
    return total
