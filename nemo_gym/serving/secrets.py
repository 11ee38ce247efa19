"""Secrets: finding them in a config, hiding them in everything shown, served or written.

A value is hidden when

- its key names a secret (contains ``key``, ``token``, ``secret``, ``password``, ``authorization``,
  ``cookie``, ``credential``; only string values: ``max_tokens: 512`` is a setting);
- it sits in a mapping of HTTP headers (a key ending in ``headers``: ``openai_default_headers``);
- it is a credential inside a URL (``http://user:pass@host`` → ``http://***REDACTED***@host``) or a
  ``Bearer``/``Basic`` credential;
- or it equals a secret value seen anywhere else: :func:`secret_values` collects them from a
  config and :func:`remember_secret_values` makes every later :func:`redact`/:func:`redact_text`
  in this process hide them too, wherever they turn up (an upstream's error echoing the API key,
  a secret interpolated into a URL).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***REDACTED***"
SECRET_KEY_PARTS = ("key", "token", "secret", "password", "passwd", "authorization", "cookie", "credential")
# Shorter values are not remembered: hiding every "abc" in every log line helps nobody.
MIN_SECRET_LENGTH = 6

_URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<cred>[^/\s@\"'<>]+)@")
_AUTH_SCHEME = re.compile(r"\b(?P<scheme>Bearer|Basic)\s+(?P<cred>[A-Za-z0-9._~+/=\-]{6,})")
_OPENAI_STYLE_KEY = re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}")

# Secret values this process learnt (its config's keys, its auth token, its registration secret).
_remembered: set[str] = set()


def is_secret_key(key: str) -> bool:
    """Whether a config key names a secret (contains key, token, secret, password, ...)."""
    lowered = key.lower()
    return any(part in lowered for part in SECRET_KEY_PARTS)


def is_headers_key(key: str) -> bool:
    """Whether a config key holds HTTP headers (``openai_default_headers``, ``extra_headers``)."""
    return key.lower().endswith("headers")


def remember_secret_values(values: Iterable[str | None]) -> None:
    """Hide these values in every later :func:`redact` and :func:`redact_text` of this process."""
    _remembered.update(v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET_LENGTH)


def remembered_secret_values() -> frozenset[str]:
    """The values :func:`remember_secret_values` has been given."""
    return frozenset(_remembered)


def secret_values(config: Any) -> set[str]:
    """Every secret string in a config: values under secret keys, header values, URL credentials."""
    found: set[str] = set()

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, Mapping):
            for key, child in value.items():
                walk(child, secret or is_secret_key(str(key)) or is_headers_key(str(key)))
        elif isinstance(value, list | tuple):
            for child in value:
                walk(child, secret)
        elif isinstance(value, str):
            if secret and len(value) >= MIN_SECRET_LENGTH:
                found.add(value)
            for match in _URL_CREDENTIALS.finditer(value):
                cred = match.group("cred")
                found.add(cred)
                password = cred.partition(":")[2]
                if len(password) >= MIN_SECRET_LENGTH:
                    found.add(password)
            for match in _AUTH_SCHEME.finditer(value):
                found.add(match.group("cred"))

    walk(config, False)
    return {v for v in found if len(v) >= MIN_SECRET_LENGTH}


def redact_text(text: str, extra_values: Iterable[str] = ()) -> str:
    """``text`` with known secret values, URL credentials and bearer credentials hidden."""
    values = _remembered.union(v for v in extra_values if v and len(v) >= MIN_SECRET_LENGTH)
    for value in sorted(values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    if "://" in text:
        text = _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + REDACTED + "@", text)
    if "Bearer" in text or "Basic" in text:
        text = _AUTH_SCHEME.sub(lambda m: m.group("scheme") + " " + REDACTED, text)
    if "sk-" in text:
        text = _OPENAI_STYLE_KEY.sub(REDACTED, text)
    return text


def redact(value: Any, extra_values: Iterable[str] = ()) -> Any:
    """A copy of a config (or any JSON-like value) with every secret hidden (see the module doc)."""
    extra = tuple(extra_values)

    def walk(item: Any, secret: bool) -> Any:
        if isinstance(item, Mapping):
            return {
                k: walk(v, secret or is_secret_key(str(k)) or is_headers_key(str(k))) for k, v in item.items()
            }
        if isinstance(item, list):
            return [walk(v, secret) for v in item]
        if isinstance(item, str):
            if secret and item:
                return REDACTED
            return redact_text(item, extra)
        return item

    return walk(value, False)


def redact_other_servers(
    config: Mapping[str, Any],
    own: str,
    server_names: Iterable[str],
    cache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A copy of a run config for server ``own``: every other server's block redacted, the rest whole.

    What a launched server receives as the run's global config. Its own block and the top-level
    keys (run-wide settings such as ``hf_token``, meant for every server) stay as they are; a
    secret kept only in another server's block (its ``api_key``, its headers) never reaches it.
    ``cache`` keeps each block's redacted copy for the next server's call (one redaction per
    block, not one per pair).
    """
    others = set(server_names) - {own}
    cache = {} if cache is None else cache
    result = {}
    for key, value in config.items():
        if key in others:
            if key not in cache:
                cache[key] = redact(value)
            value = cache[key]
        result[key] = value
    return result


def redact_bytes(raw: bytes, extra_values: Iterable[str] = ()) -> bytes:
    """:func:`redact_text` over UTF-8 bytes (an error answer, a log line); unchanged when clean."""
    text = raw.decode("utf-8", errors="replace")
    hidden = redact_text(text, extra_values)
    return raw if hidden == text else hidden.encode()


class RedactingFilter(logging.Filter):
    """A logging filter that hides secrets in each record's message and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = redact_text(message)
        if hidden != message:
            record.msg, record.args = hidden, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return True
