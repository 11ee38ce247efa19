"""Per-rollout records of model calls: where they are kept and what is read back from them.

A model server with observability on appends one JSON line per model call (its *exchange*:
request, response, status, timing) to ``<capture dir>/<rollout id>.capture.jsonl``; the collector
reads them back as :class:`ModelCallRecord` objects and totals them per rollout. The names and
file layout are NeMo Gym's (``nemo_gym.base_responses_api_model`` re-exports them), so captures
written by either project read the same. The middleware that writes exchanges is
:mod:`nemo_gym.models.call_capture`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field, model_validator

from nemo_gym.serving.server import ModelServerRef

logger = logging.getLogger(__name__)

CAPTURE_SUFFIX = ".capture.jsonl"
INCOMPLETE_SUFFIX = ".capture.incomplete"
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class ModelCallCaptureConfig(BaseModel):
    """The run-wide switch and directory for model-call capture (read from the global config)."""

    observability_enabled: bool = False
    model_call_capture_dir: Path | None = None

    @model_validator(mode="after")
    def _directory_when_on(self) -> ModelCallCaptureConfig:
        if self.observability_enabled:
            if self.model_call_capture_dir is None:
                raise ValueError("model_call_capture_dir is required when observability_enabled=true")
            if not self.model_call_capture_dir.is_absolute():
                raise ValueError(
                    f"model_call_capture_dir must be an absolute path, got {str(self.model_call_capture_dir)!r}"
                )
        return self


def checked_rollout_id(rollout_id: str) -> str:
    """``rollout_id`` when it is safe as a file name (ASCII letters, digits, ``.``, ``_``, ``-``)."""
    if not rollout_id or not set(rollout_id) <= _ID_CHARS or rollout_id.strip(".") == "":
        raise ValueError(f"Invalid rollout id: {rollout_id!r}")
    return rollout_id


class CaptureStore:
    """A directory of append-only JSONL files, one per rollout, one line per model call.

    Appends are locked (``flock``) and fsynced: several server processes may write the same
    rollout, and a finished call survives a killed machine. The file IO blocks, so servers call
    :meth:`record` off the event loop.
    """

    def __init__(self, root: str | Path) -> None:
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        """The capture directory."""
        return self._root

    def path_for(self, rollout_id: str) -> Path:
        """The JSONL file of one rollout's exchanges."""
        return self._root / (checked_rollout_id(rollout_id) + CAPTURE_SUFFIX)

    def incomplete_path_for(self, rollout_id: str) -> Path:
        """The marker file saying an exchange of this rollout could not be written."""
        return self._root / (checked_rollout_id(rollout_id) + INCOMPLETE_SUFFIX)

    def mark_incomplete(self, rollout_id: str) -> None:
        """Remember that this rollout's capture lost an exchange."""
        self.incomplete_path_for(rollout_id).touch(exist_ok=True)

    def is_incomplete(self, rollout_id: str) -> bool:
        """Whether an exchange of this rollout was lost."""
        return self.incomplete_path_for(rollout_id).exists()

    def record(self, rollout_id: str, exchange: dict[str, Any]) -> None:
        """Append one exchange as a line, durably (blocking: call it off the event loop)."""
        line = orjson.dumps(exchange, default=str, option=orjson.OPT_APPEND_NEWLINE)
        with self.path_for(rollout_id).open("ab") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _lines(self, rollout_id: str) -> Iterator[bytes]:
        path = self.path_for(rollout_id)
        if not path.exists():
            return
        with path.open("rb") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
            try:
                for line in handle:  # line by line: token IDs make captures large
                    if line.strip():
                        yield line
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def read(self, rollout_id: str) -> list[dict[str, Any]]:
        """Every exchange of a rollout in append order (a damaged line raises)."""
        return [orjson.loads(line) for line in self._lines(rollout_id)]

    def read_available(self, rollout_id: str) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """``([(line index, exchange)], number of unreadable lines)``: one bad line hides nothing else."""
        good: list[tuple[int, dict[str, Any]]] = []
        bad = 0
        for index, line in enumerate(self._lines(rollout_id)):
            try:
                exchange = orjson.loads(line)
            except orjson.JSONDecodeError:
                bad += 1
                continue
            if isinstance(exchange, dict):
                good.append((index, exchange))
            else:
                bad += 1
        return good, bad


class ModelCallRecord(BaseModel):
    """What one captured model call tells an observer (NeMo Gym's record; fields by its names).

    Token counts, reasoning tokens and cache figures are null when the provider did not say:
    null means unknown, never zero. ``call_index`` is the append order, not a causal order.
    """

    model_call_id: str | None = None
    response_id: str | None = None
    client_session_id: str | None = Field(
        default=None, description="The id a client declared in X-Session-Id: evidence for joins, not auth."
    )
    call_index: int
    model_ref: ModelServerRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    upstream_attempted: bool | None = None
    response_source: Literal["upstream", "local"] | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    request_raw: str | None = None
    response_raw: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    reasoning_content: str | None = None
    cache_hit: bool | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    error_category: str | None = None
    latency_total_ms: float | None = None
    latency_ttft_ms: float | None = None


def _count(value: Any) -> int | None:
    # bool is an int subclass: a True is not a token count.
    return value if type(value) is int and value >= 0 else None


def _first_count(usage: Mapping[str, Any], groups: tuple[str, ...], fields: tuple[str, ...]) -> int | None:
    for group in groups:
        details = usage.get(group)
        if isinstance(details, Mapping):
            for field in fields:
                if (value := _count(details.get(field))) is not None:
                    return value
    return None


def extract_token_stats(usage: Any) -> dict[str, int | None]:
    """Token totals of a Responses, Chat Completions or Anthropic Messages ``usage`` object.

    Anthropic's ``input_tokens`` leaves out cached prompt tokens, so its cache reads and writes
    are added back: ``tokens_in`` is the prompt's size in every dialect (OpenAI's counts already
    include cached tokens).
    """
    stats: dict[str, int | None] = dict.fromkeys(
        ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cache_creation_tokens")
    )
    if not isinstance(usage, Mapping):
        return stats
    tokens_in = _count(usage.get("input_tokens"))
    if tokens_in is None:
        tokens_in = _count(usage.get("prompt_tokens"))
    tokens_out = _count(usage.get("output_tokens"))
    if tokens_out is None:
        tokens_out = _count(usage.get("completion_tokens"))
    cache_read = _count(usage.get("cache_read_input_tokens"))
    cache_write = _count(usage.get("cache_creation_input_tokens"))
    cached = (cache_read or 0) + (cache_write or 0)
    if (cache_read is not None or cache_write is not None) and (tokens_in is not None or cached > 0):
        tokens_in = (tokens_in or 0) + cached
    total = _count(usage.get("total_tokens"))
    if total is None and tokens_in is not None and tokens_out is not None:
        total = tokens_in + tokens_out
    reasoning = _first_count(
        usage, ("output_tokens_details", "completion_tokens_details"), ("reasoning_tokens",)
    )
    if reasoning is None:
        reasoning = _count(usage.get("reasoning_output_tokens"))
    stats.update(
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        tokens_reasoning=reasoning,
        tokens_total=total,
        cache_creation_tokens=cache_write,
    )
    return stats


def _cache_figures(usage: Any) -> tuple[bool | None, int | None]:
    """(cache hit, cached prompt tokens) from OpenAI's or Anthropic's usage, when it says."""
    if not isinstance(usage, Mapping):
        return None, None
    cached = _first_count(
        usage, ("prompt_tokens_details", "input_tokens_details"), ("cached_tokens", "cached_input_tokens")
    )
    for key in ("cache_read_input_tokens", "cached_input_tokens"):
        if cached is None:
            cached = _count(usage.get(key))
    return (None, None) if cached is None else (cached > 0, cached)


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:
            return {"_raw": raw}
        return parsed if isinstance(parsed, dict) else {"_raw": raw}
    return {}


def _calls_and_reasoning(response: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """The tool calls ({call_id, name, arguments}) and reasoning text of a response in any dialect."""
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    output, choices, content = response.get("output"), response.get("choices"), response.get("content")
    if isinstance(output, list):  # Responses API
        for item in (i for i in output if isinstance(i, dict)):
            if item.get("type") == "function_call":
                call_id = item.get("call_id") or item.get("id")
                calls.append(
                    {
                        "call_id": call_id,
                        "name": item.get("name"),
                        "arguments": _arguments(item.get("arguments")),
                    }
                )
            elif item.get("type") == "reasoning":
                thoughts += [
                    s["text"] for s in item.get("summary") or [] if isinstance(s, dict) and s.get("text")
                ]
    elif isinstance(choices, list):  # Chat Completions
        for choice in (c for c in choices if isinstance(c, dict)):
            message = choice.get("message")
            if not isinstance(message, Mapping):
                continue
            for call in (c for c in message.get("tool_calls") or [] if isinstance(c, dict)):
                raw_function = call.get("function")
                function: Mapping[str, Any] = raw_function if isinstance(raw_function, Mapping) else {}
                calls.append(
                    {
                        "call_id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": _arguments(function.get("arguments")),
                    }
                )
            # vLLM writes ``reasoning``; older servers ``reasoning_content`` (preferred when both).
            text = message.get("reasoning_content") or message.get("reasoning")
            if isinstance(text, str) and text:
                thoughts.append(text)
    elif isinstance(content, list):  # Anthropic Messages
        for block in (b for b in content if isinstance(b, dict)):
            if block.get("type") == "tool_use":
                calls.append(
                    {
                        "call_id": block.get("id"),
                        "name": block.get("name"),
                        "arguments": block.get("input") or {},
                    }
                )
            elif block.get("type") in ("thinking", "redacted_thinking") and isinstance(
                block.get("thinking"), str
            ):
                thoughts.append(block["thinking"])
    return calls, "\n".join(thoughts) or None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def build_model_call_record(exchange: dict[str, Any], *, call_index: int) -> ModelCallRecord:
    """The record of one stored exchange."""
    response = exchange.get("response") if isinstance(exchange.get("response"), dict) else None
    request = exchange.get("request") if isinstance(exchange.get("request"), dict) else None
    body: Mapping[str, Any] = response or {}
    usage = body.get("usage")
    cache_hit, cached_tokens = _cache_figures(usage)
    tool_calls, reasoning = _calls_and_reasoning(body)
    choices = body.get("choices")
    first_choice = (
        choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    )
    raw_incomplete = body.get("incomplete_details")
    incomplete: Mapping[str, Any] = raw_incomplete if isinstance(raw_incomplete, dict) else {}
    finish = next(
        (
            reason
            for reason in (
                body.get("stop_reason"),
                first_choice.get("finish_reason"),
                incomplete.get("reason"),
            )
            if isinstance(reason, str)
        ),
        None,
    )
    return ModelCallRecord(
        model_call_id=exchange.get("model_call_id"),
        response_id=_text(body.get("id")),
        client_session_id=_text(exchange.get("client_session_id")),
        call_index=call_index,
        model_ref=exchange.get("model_ref"),
        model=_text(body.get("model") or (request or {}).get("model")),
        dialect=exchange.get("dialect"),
        status_code=exchange.get("status_code"),
        response_status=_text(body.get("status")),
        finish_reason=finish,
        upstream_attempted=exchange.get("upstream_attempted"),
        response_source=exchange.get("response_source"),
        upstream_status_code=exchange.get("upstream_status_code"),
        local_response_reason=exchange.get("local_response_reason"),
        started_at=exchange.get("started_at"),
        completed_at=exchange.get("completed_at"),
        request=request,
        response=response,
        request_raw=_text(exchange.get("request_raw")),
        response_raw=_text(exchange.get("response_raw")),
        tool_calls=tool_calls,
        reasoning_content=reasoning,
        cache_hit=cache_hit,
        cached_tokens=cached_tokens,
        error_category=exchange.get("error_category"),
        latency_total_ms=exchange.get("latency_ms"),
        latency_ttft_ms=exchange.get("latency_ttft_ms"),
        **extract_token_stats(usage),
    )


def read_model_call_records(store: CaptureStore, rollout_id: str) -> list[ModelCallRecord]:
    """A rollout's model calls in append order."""
    return [build_model_call_record(e, call_index=i) for i, e in enumerate(store.read(rollout_id))]


def read_available_model_call_records(
    store: CaptureStore, rollout_id: str
) -> tuple[list[ModelCallRecord], int]:
    """The readable records of a rollout and how many stored exchanges could not be read."""
    exchanges, bad = store.read_available(rollout_id)
    records: list[ModelCallRecord] = []
    for index, exchange in exchanges:
        try:
            records.append(build_model_call_record(exchange, call_index=index))
        except ValueError:  # pydantic's ValidationError: a line of the wrong shape
            bad += 1
    return records, bad


def aggregate_model_call_records(calls: list[ModelCallRecord]) -> dict[str, Any]:
    """Totals over records (a total is null when no record knows its figure) and ``num_calls``."""
    totals: dict[str, Any] = {}
    for field in (
        "tokens_in",
        "tokens_out",
        "tokens_reasoning",
        "tokens_total",
        "cached_tokens",
        "latency_total_ms",
    ):
        known = [value for call in calls if (value := getattr(call, field)) is not None]
        totals[field] = sum(known) if known else None
    totals["num_calls"] = len(calls)
    return totals


def aggregate_model_call_metrics(store: CaptureStore, rollout_id: str) -> dict[str, Any]:
    """Totals over one rollout's stored model calls."""
    return aggregate_model_call_records(read_model_call_records(store, rollout_id))


def exchange_for(
    *,
    dialect: str,
    model_server_name: str | None,
    request_bytes: bytes,
    model_call_id: str,
    started_at: float,
    completed_at: float,
    latency_ms: float,
    ttft_ms: float | None,
    status_code: int | None,
    error_category: str | None,
    response_body: dict[str, Any] | None,
    response_raw: str | None = None,
    client_session_id: str | None = None,
    execution: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The stored line of one model call: the request parsed when it is a JSON object, else kept raw."""
    request: dict[str, Any] | None = None
    request_raw: str | None = None
    if request_bytes:
        try:
            parsed = json.loads(request_bytes)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            request = parsed
        else:
            request_raw = request_bytes.decode("utf-8", errors="replace")
    exchange: dict[str, Any] = {
        "model_call_id": model_call_id,
        "dialect": dialect,
        "model_ref": {"type": "responses_api_models", "name": model_server_name}
        if model_server_name
        else None,
        "started_at": started_at,
        "completed_at": completed_at,
        "latency_ms": round(latency_ms, 2),
        "latency_ttft_ms": None if ttft_ms is None else round(ttft_ms, 2),
        "status_code": status_code,
        "error_category": error_category,
        "request": request,
        "response": response_body,
    }
    if client_session_id is not None:
        exchange["client_session_id"] = client_session_id
    if execution:
        exchange.update(execution)
        if execution.get("local_response_reason") == "context_length_exceeded":
            exchange["error_category"] = "context_length_exceeded"
    if request_raw is not None:
        exchange["request_raw"] = request_raw
    if response_raw is not None:
        exchange["response_raw"] = response_raw
    return exchange


def store_exchange(store: CaptureStore, rollout_id: str, exchange: dict[str, Any]) -> None:
    """Append an exchange; a failure marks the rollout's capture incomplete instead of raising."""
    try:
        store.record(rollout_id, exchange)
    except Exception:  # noqa: BLE001 - capture is best effort; the call itself already succeeded
        logger.warning(
            "model-call capture: could not store a %s call of rollout %s",
            exchange.get("dialect"),
            rollout_id,
            exc_info=True,
        )
        try:
            store.mark_incomplete(rollout_id)
        except OSError:
            logger.warning(
                "model-call capture: could not mark rollout %s incomplete", rollout_id, exc_info=True
            )
