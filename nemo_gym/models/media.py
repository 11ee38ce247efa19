"""Images, files and videos in prompts: Responses content parts → Chat Completions parts, and bounds.

Responses rows carry ``input_image`` (``image_url``: a URL or data URL; ``detail``) and
``input_file`` (``file_data`` / ``file_id`` / ``filename`` / ``file_url``) parts; NeMo RL sends video
parts as ``{"type": "input_video" | "video_url" | "video", "video_url" | "video" | "url": ...}``
(rewritten to ``file://`` URLs on its side). vLLM's Chat format takes ``image_url``, ``file`` and
``video_url`` parts. The sources pass through unchanged; only the part's shape changes.

:class:`MediaLimits` bounds the parts of one prompt per kind, as vLLM's ``limit_mm_per_prompt``
does, so an over-full prompt is refused by the model server (HTTP 400) before the engine sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MEDIA_KINDS = ("image", "video", "file")
VIDEO_PART_TYPES = ("input_video", "video_url", "video")
_VIDEO_SOURCE_KEYS = ("video_url", "video", "url")


class MediaLimitError(ValueError):
    """A prompt has more parts of one kind than the configured limit allows (answered with 400)."""


class MediaLimits:
    """Counts a prompt's media parts by kind and refuses one past ``limits[kind]``.

    ``limits`` maps ``image`` / ``video`` / ``file`` to the most parts one prompt may carry (a
    kind not listed is unbounded here; the engine may still have its own bound).
    """

    def __init__(self, limits: Mapping[str, int] | None = None) -> None:
        unknown = set(limits or {}) - set(MEDIA_KINDS)
        if unknown:
            raise ValueError(f"limit_mm_per_prompt has unknown kinds {sorted(unknown)}; use {MEDIA_KINDS}")
        self.limits = dict(limits or {})
        self.counts = dict.fromkeys(MEDIA_KINDS, 0)

    def add(self, kind: str, where: str) -> None:
        """Count one ``kind`` part found at ``where``; raise :class:`MediaLimitError` past the limit."""
        self.counts[kind] += 1
        limit = self.limits.get(kind)
        if limit is not None and self.counts[kind] > limit:
            raise MediaLimitError(
                f"{where} is {kind} part number {self.counts[kind]} of this prompt, over "
                f"limit_mm_per_prompt.{kind}={limit}; send at most {limit} {kind} part(s) per prompt"
            )


def _url_of(value: Any, where: str, field: str) -> str:
    if isinstance(value, Mapping):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where} needs {field} (a URL or data URL string, or {{url: ...}})")
    return value


def media_kind(part: Mapping[str, Any]) -> str | None:
    """``image``, ``video`` or ``file`` for a media part in Responses or Chat form, else None."""
    kind = part.get("type")
    if kind in ("input_image", "image_url", "image"):
        return "image"
    if kind in VIDEO_PART_TYPES:
        return "video"
    if kind in ("input_file", "file"):
        return "file"
    return None


def responses_part_to_chat(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The Chat Completions form of one Responses media part (its source unchanged).

    Raises ``ValueError`` naming ``where`` when the part has no usable source.
    """
    kind = part.get("type")
    if kind in ("input_image", "image_url"):
        if kind == "input_image" and part.get("image_url") is None and part.get("file_id"):
            raise ValueError(
                f"{where}: an input_image given only by file_id cannot reach a vLLM engine; send image_url"
            )
        source = part.get("image_url")
        image: dict[str, Any] = {"url": _url_of(source, where, "image_url")}
        detail = part.get("detail") or (source.get("detail") if isinstance(source, Mapping) else None)
        if detail:
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}
    if kind in VIDEO_PART_TYPES:
        source = next((part[key] for key in _VIDEO_SOURCE_KEYS if part.get(key) is not None), None)
        return {"type": "video_url", "video_url": {"url": _url_of(source, where, "video_url")}}
    if kind in ("input_file", "file"):
        nested = part.get("file")
        fields: Mapping[str, Any] = nested if kind == "file" and isinstance(nested, Mapping) else part
        file = {
            key: fields[key] for key in ("file_data", "file_id", "filename", "file_url") if fields.get(key)
        }
        if not file.keys() & {"file_data", "file_id", "file_url"}:
            raise ValueError(f"{where}: an input_file needs file_data, file_id or file_url")
        return {"type": "file", "file": file}
    raise ValueError(f"{where} has a content part of type {kind!r}, which is not a media part")


def check_chat_media(messages: Any, limits: Mapping[str, int] | None) -> None:
    """Apply ``limits`` to the media parts of Chat Completions ``messages`` (a pass-through request)."""
    if not limits or not isinstance(messages, list):
        return
    media = MediaLimits(limits)
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        for part_index, part in enumerate(content if isinstance(content, list) else []):
            kind = media_kind(part) if isinstance(part, Mapping) else None
            if kind is not None:
                media.add(kind, f"messages[{index}].content[{part_index}]")
