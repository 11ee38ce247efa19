"""Secrets: finding them in a config, hiding them in everything shown, served or written.

A value is hidden when

- its key names a secret (contains ``key``, ``token``, ``secret``, ``password``, ``authorization``,
  ``cookie``, ``credential``; only string values: ``max_tokens: 512`` is a setting);
- it sits in a mapping of HTTP headers (a key ending in ``headers``: ``openai_default_headers``);
- it is a value in an ``env`` map (``env``, ``environment``, ``env_vars``: an MCP stdio server's or
  a harness's environment, where API keys go under any name);
- it has a credential's shape, whatever its key: a credential inside a URL
  (``http://user:pass@host`` → ``http://***REDACTED***@host``), a URL query parameter named like
  one (``?key=``, ``&api-key=``, ``access_token=``, ``sig=``), a ``Bearer``/``Basic`` credential of
  any length, the value after a command-line flag named like one (``--api-key X``,
  ``--hf-token=X``; in an argv list, the next item), or a token with a known prefix (``sk-``,
  ``hf_``, ``ghp_``/``gho_``/``ghs_``/``github_pat_``, ``nvapi-``, ``glpat-``, ``xox?-``, ``AKIA``,
  ``AIza``);
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
_AUTH_SCHEME = re.compile(r"\b(?P<scheme>Bearer|Basic)\s+(?P<cred>[A-Za-z0-9._~+/=\-]+)")
# Tokens whose prefix says what they are (OpenAI, Hugging Face, GitHub, NVIDIA, GitLab, Slack,
# AWS access key ids, Google API keys).
_PREFIXED_TOKEN = re.compile(
    r"(?<![A-Za-z0-9])(?:sk-[A-Za-z0-9_\-]{16,}|hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|nvapi-[A-Za-z0-9_\-]{16,}|glpat-[A-Za-z0-9_\-]{16,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_\-]{30,})"
)
_FLAG_STARTS = (" -", '"-', "'-", "[-", ",-", "=-")
# A name (of a flag or a query parameter) with one of these as a whole word is a credential's.
_SECRET_WORD = r"(?:api[-_]?key|key|apikey|token|secret|password|passwd|pwd|credentials?|auth|sig|signature)"
_NAMED = rf"(?:[A-Za-z0-9]+[-_.])*{_SECRET_WORD}(?:[-_.][A-Za-z0-9]+)*"
_QUERY_CREDENTIAL = re.compile(rf"(?P<name>[?&;]{_NAMED}=)(?P<cred>[^&#\s\"'<>]+)", re.IGNORECASE)
_FLAG_CREDENTIAL = re.compile(
    rf"(?P<name>(?<![\w-])--?{_NAMED}(?:=|\s+))(?P<cred>[^\s\"'&|;]+)", re.IGNORECASE
)
_SECRET_FLAG = re.compile(rf"--?{_NAMED}", re.IGNORECASE)
ENV_KEYS = frozenset({"env", "environment", "env_vars", "envs", "extra_env", "environment_variables"})

# Secret values this process learnt (its config's keys, its auth token, its registration secret).
_remembered: set[str] = set()


def is_secret_key(key: str) -> bool:
    """Whether a config key names a secret (contains key, token, secret, password, ...)."""
    lowered = key.lower()
    return any(part in lowered for part in SECRET_KEY_PARTS)


def is_env_key(key: str) -> bool:
    """Whether a config key holds a program's environment (``env`` of an MCP server or harness)."""
    return key.lower() in ENV_KEYS


def is_secret_flag(item: Any) -> bool:
    """Whether an argv item is a flag naming a credential, its value in the next item
    (``--api-key``, ``--hf-token``, ``-password``; not ``--max-tokens`` or ``--tokenizer``)."""
    return isinstance(item, str) and _SECRET_FLAG.fullmatch(item) is not None


def _hidden_key(key: Any) -> bool:
    key = str(key)
    return is_secret_key(key) or is_headers_key(key) or is_env_key(key)


def shaped_secrets(text: str) -> list[str]:
    """The credentials ``text`` holds by their shape (URL, query, flag, auth scheme, prefix)."""
    found = []
    for match in _URL_CREDENTIALS.finditer(text):
        cred = match.group("cred")
        found += [cred, cred.partition(":")[2]]
    for pattern in (_QUERY_CREDENTIAL, _FLAG_CREDENTIAL, _AUTH_SCHEME):
        found += [match.group("cred") for match in pattern.finditer(text)]
    found += _PREFIXED_TOKEN.findall(text)
    return [value for value in found if value]


def is_headers_key(key: str) -> bool:
    """Whether a config key holds HTTP headers (``openai_default_headers``, ``extra_headers``)."""
    return key.lower().endswith("headers")


def remember_secret_values(values: Iterable[str | None]) -> None:
    """Hide these values in every later :func:`redact` and :func:`redact_text` of this process."""
    _remembered.update(v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET_LENGTH)


def secret_values(config: Any) -> set[str]:
    """Every secret string in a config: values under secret keys, header values, URL credentials."""
    found: set[str] = set()

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, Mapping):
            for key, child in value.items():
                # Not every value of an env map: hiding "/usr/bin:/bin" in every log line helps
                # nobody; its secrets are named like secrets or shaped like them.
                walk(child, secret or is_secret_key(str(key)) or is_headers_key(str(key)))
        elif isinstance(value, list | tuple):
            for index, child in enumerate(value):
                walk(child, secret or (index > 0 and is_secret_flag(value[index - 1])))
        elif isinstance(value, str):
            if secret and len(value) >= MIN_SECRET_LENGTH:
                found.add(value)
            found.update(shaped_secrets(value))

    walk(config, False)
    return {v for v in found if len(v) >= MIN_SECRET_LENGTH}


def _maybe_secret(text: str) -> bool:
    """Whether ``text`` may hold a credential named or shaped like one (a cheap test: most log
    lines hold none, and then no pattern runs)."""
    low = text.lower()
    return (
        "key" in low
        or "token" in low
        or "secret" in low
        or "pass" in low
        or "pwd" in low
        or "credential" in low
        or "auth" in low
        or "sig" in low
        or "sk-" in text
        or "hf_" in text
        or "gh" in text
        or "nvapi-" in text
        or "glpat-" in text
        or "xox" in text
        or "AKIA" in text
        or "AIza" in text
    )


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
    if not _maybe_secret(text):
        return text
    if "=" in text and ("?" in text or "&" in text or ";" in text):
        text = _QUERY_CREDENTIAL.sub(lambda m: m.group("name") + REDACTED, text)
    if text.startswith("-") or any(start in text for start in _FLAG_STARTS):
        text = _FLAG_CREDENTIAL.sub(lambda m: m.group("name") + REDACTED, text)
    return _PREFIXED_TOKEN.sub(REDACTED, text)


def redact(value: Any, extra_values: Iterable[str] = ()) -> Any:
    """A copy of a config (or any JSON-like value) with every secret hidden (see the module doc)."""
    extra = tuple(extra_values)

    def walk(item: Any, secret: bool) -> Any:
        if isinstance(item, Mapping):
            return {k: walk(v, secret or _hidden_key(k)) for k, v in item.items()}
        if isinstance(item, list):
            return [
                walk(v, secret or (index > 0 and is_secret_flag(item[index - 1])))
                for index, v in enumerate(item)
            ]
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
