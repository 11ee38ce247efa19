"""``POST /aggregate_metrics`` over any number of verify answers, in bounded memory.

The wire is NeMo Gym's: ``{"verify_responses": [...]}`` in, ``{"agent_metrics", "key_metrics",
"group_level_metrics"}`` out. The body streams to a temporary file (never held in memory), the
metrics are computed by :class:`nemo_gym.collection.streaming_metrics.MetricsAccumulator` as rows are read,
and the answer is written to a file and streamed back.

A body in line layout is read a line at a time whatever its size: ``{"verify_responses":[`` on
the first line, then one verify response per line (each but the last followed by a comma), then
``]}``. That is still plain JSON; ``ng_collect_rollouts`` sends it so. A body in any other
layout is parsed whole, which it may only do up to the server's ``max_body_bytes``.

:func:`forward_aggregate_metrics` relays the same call to another server (an agent to its
resources server) without reading the rows.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from nemo_gym.collection.streaming_metrics import MetricsAccumulator, write_metrics_answer
from nemo_gym.failure_classes import UNREACHABLE
from nemo_gym.serving.server import HTTPError, json_response
from nemo_gym.serving.server_client import connection_error_text

LINE_LAYOUT_HEAD = b'{"verify_responses":['
LINE_LAYOUT_TAIL = b"]}"
_CHUNK = 1 << 16
logger = logging.getLogger(__name__)


def line_layout_chunks(rows_jsonl: Path) -> Iterator[bytes]:
    """The body ``{"verify_responses": [...]}`` in line layout, built from a JSONL file of rows
    (one JSON object per line, as orjson writes it: never a raw newline inside a value)."""
    yield LINE_LAYOUT_HEAD + b"\n"
    pending = b""
    with rows_jsonl.open("rb") as source:
        while block := source.read(_CHUNK):
            if pending:
                yield pending
            pending = block.replace(b"\n", b",\n")
    if pending.endswith(b",\n"):
        pending = pending[:-2] + b"\n"
    elif pending:
        pending += b"\n"
    yield pending + LINE_LAYOUT_TAIL


def iter_line_layout(body: Path) -> Iterator[dict[str, Any]] | None:
    """The verify responses of a body file in line layout, one at a time; ``None`` when the body
    is in another layout. Raises :class:`HTTPError` (400/422) naming the line at fault."""
    with body.open("rb") as source:
        if source.readline().rstrip(b"\r\n") != LINE_LAYOUT_HEAD:
            return None
    return _line_rows(body)


def _line_rows(body: Path) -> Iterator[dict[str, Any]]:
    with body.open("rb") as source:
        source.readline()
        line_number = 1
        for line in source:
            line_number += 1
            text = line.strip()
            if text == LINE_LAYOUT_TAIL:
                return
            if text.endswith(b","):
                text = text[:-1]
            if not text:
                continue
            try:
                row = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise HTTPError(
                    400, f"invalid body: line {line_number} is not one JSON verify response: {exc}"
                ) from exc
            if not isinstance(row, dict):
                raise HTTPError(
                    422, f"invalid body: verify_responses (line {line_number}): each entry must be an object"
                )
            yield row
    raise HTTPError(
        400, f"invalid body: the verify_responses array is not closed by {LINE_LAYOUT_TAIL.decode()!r}"
    )


def read_whole_body(body: Path, max_bytes: int) -> list[dict[str, Any]]:
    """``verify_responses`` of a body in any layout, parsed whole (only up to ``max_bytes``)."""
    size = body.stat().st_size
    if size > max_bytes:
        raise HTTPError(
            413,
            f"request body of {size} bytes exceeds the limit of {max_bytes} for a body parsed whole; "
            f"send one verify response per line (first line {LINE_LAYOUT_HEAD.decode()}, last line "
            f"{LINE_LAYOUT_TAIL.decode()}) to aggregate any number of rows",
        )
    raw = body.read_bytes()
    try:
        data = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise HTTPError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise HTTPError(422, "invalid body: expected an object {verify_responses: [...]}")
    rows = data.get("verify_responses", [])
    if not isinstance(rows, list):
        raise HTTPError(422, "invalid body: verify_responses: must be a list of objects")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise HTTPError(422, f"invalid body: verify_responses.{index}: must be an object")
    return rows


async def spool_request_body(request: Request, path: Path, max_bytes: int) -> None:
    """Write the request body to ``path`` as it arrives; 413 past ``max_bytes``."""
    written = 0
    with path.open("wb") as sink:
        async for chunk in request.stream():
            written += len(chunk)
            if written > max_bytes:
                raise HTTPError(413, f"request body exceeds the limit of {max_bytes} bytes")
            sink.write(chunk)


def stream_file(path: Path, cleanup: Path) -> StreamingResponse:
    """Stream ``path`` as a JSON answer. The directory ``cleanup`` is removed at once: the open
    handle keeps the data readable, and the space is freed when it closes, even if the client
    goes away before the answer starts."""
    source = path.open("rb")
    size = os.fstat(source.fileno()).st_size
    shutil.rmtree(cleanup, ignore_errors=True)

    async def chunks() -> AsyncIterator[bytes]:
        try:
            while block := source.read(1 << 20):
                yield block
        finally:
            source.close()

    return StreamingResponse(chunks(), media_type="application/json", headers={"Content-Length": str(size)})


def aggregate_endpoint(
    server_name: Callable[[], str],
    max_stream_bytes: Callable[[], int],
    max_whole_bytes: Callable[[], int],
    new_accumulator: Callable[[], MetricsAccumulator],
    key_metrics: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None,
    compute_whole: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
) -> Callable[[Request], Any]:
    """The starlette endpoint of ``/aggregate_metrics``.

    ``compute_whole`` (a server whose ``compute_metrics`` is its own) takes every row as a list
    instead of the accumulator; ``key_metrics(agent_metrics, default)`` picks the key metrics.
    """

    async def endpoint(request: Request) -> Response:
        work = Path(tempfile.mkdtemp(prefix="ng_metrics_"))
        try:
            body = work / "body.json"
            await spool_request_body(request, body, max_stream_bytes())
            answer = work / "answer.json"
            computed = await asyncio.to_thread(
                _compute, body, answer, max_whole_bytes(), new_accumulator, key_metrics, compute_whole
            )
        except HTTPError as exc:
            shutil.rmtree(work, ignore_errors=True)
            return json_response(
                {"error": exc.message, "server": server_name(), **exc.extra}, exc.status_code
            )
        except Exception as exc:  # noqa: BLE001 - a failure is a JSON error naming the server
            shutil.rmtree(work, ignore_errors=True)
            logger.exception("%s: POST /aggregate_metrics failed", server_name())
            return json_response({"error": f"{type(exc).__name__}: {exc}", "server": server_name()}, 500)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        if computed is not None:
            shutil.rmtree(work, ignore_errors=True)
            return json_response(computed)
        return stream_file(answer, work)

    return endpoint


def _compute(
    body: Path,
    answer: Path,
    max_whole_bytes: int,
    new_accumulator: Callable[[], MetricsAccumulator],
    key_metrics: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None,
    compute_whole: Callable[[list[dict[str, Any]]], dict[str, Any]] | None,
) -> dict[str, Any] | None:
    """Metrics of a spooled body: written to ``answer`` (``None`` returned), or returned whole
    by ``compute_whole``."""
    rows = iter_line_layout(body)
    if rows is not None:
        try:
            if compute_whole is not None:
                return compute_whole(list(rows))
            accumulator = new_accumulator()
            for row in rows:
                accumulator.add(row)
        except HTTPError:
            if body.stat().st_size > max_whole_bytes:
                raise
            rows = None  # JSON laid out otherwise after a first line like ours: parse it whole
    if rows is None:
        whole = read_whole_body(body, max_whole_bytes)
        if compute_whole is not None:
            return compute_whole(whole)
        accumulator = new_accumulator()
        for row in whole:
            accumulator.add(row)
        del whole
    os.unlink(body)  # the disk space goes back before the answer is written
    with answer.open("wb") as sink:
        write_metrics_answer(sink, accumulator, key_metrics)
    return None


async def forward_aggregate_metrics(
    request: Request, http: Any, url: str, headers: dict[str, str]
) -> Response:
    """Relay ``/aggregate_metrics`` to ``url`` with an aiohttp session: the body and the answer
    stream through, never held whole."""
    import aiohttp

    try:
        response = await http.post(
            url,
            data=request.stream(),
            headers={**headers, "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise HTTPError(502, f"{url}: {connection_error_text(exc)}", failure_class=UNREACHABLE) from exc

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for block in response.content.iter_chunked(1 << 20):
                yield block
        finally:
            response.release()

    return StreamingResponse(
        chunks(),
        status_code=response.status,
        media_type=response.headers.get("Content-Type", "application/json"),
    )
