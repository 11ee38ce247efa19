"""Aggregate metrics of a results file, and the merge of result shards (``ng_aggregate_rollouts``).

Each agent's rows (heavy fields stripped) are streamed to its ``/aggregate_metrics`` and the answer
is streamed to disk, so memory does not grow with the run; without a head server, or when that
call fails, the metrics are computed locally by :class:`MetricsAccumulator`.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from nemo_gym.collection.aggregate_endpoint import line_layout_chunks
from nemo_gym.collection.collection_io import (
    AGENT_REF_KEY,
    CollectionPaths,
    expand_input_glob,
    iter_jsonl,
    merge_result_shards,
    read_metrics_summary,
    spool_results_by_agent,
    warn,
    write_metrics_file,
)
from nemo_gym.collection.metrics import is_percent_metric
from nemo_gym.collection.settings import RolloutAggregationConfig
from nemo_gym.collection.streaming_metrics import MetricsAccumulator, write_metrics_answer
from nemo_gym.failure_classes import HTTP_ERROR, UNREACHABLE
from nemo_gym.launch.config import ConfigError
from nemo_gym.serving.server import auth_headers
from nemo_gym.serving.server_client import ServerCallError, ServerClient, connection_error_text

AGGREGATE_TIMEOUT_S = 600.0


async def aggregate_results_file(
    results_path: Path, metrics_path: Path, client: ServerClient | None, *, verbose: bool = True
) -> list[dict[str, Any]]:
    """Write the metrics file of a results file; returns ``{agent_ref, agent_metrics, key_metrics}``
    per agent (``group_level_metrics`` is in the file only: one entry per task).

    Each agent's rows (heavy fields stripped) are streamed to its ``/aggregate_metrics``
    (simple_agent forwards to its resources server, so environment-specific metrics apply) and
    the answer is streamed to disk and copied into the file. Without a ``client``, or when that
    call fails, the metrics are computed here and a notice says so.
    """
    summaries: list[dict[str, Any]] = []
    answers: list[tuple[dict[str, Any], Path]] = []
    with tempfile.TemporaryDirectory(prefix="ng_aggregate_", dir=metrics_path.parent) as tmp_dir:
        spools = spool_results_by_agent(results_path, Path(tmp_dir))
        for index, (name, (ref, spool)) in enumerate(sorted(spools.items())):
            answer_path = Path(tmp_dir) / f"answer{index}.json"
            summary: dict[str, Any] | None = None
            if client is not None:
                try:
                    await _post_aggregate(client, name, spool, answer_path)
                    summary = read_metrics_summary(answer_path)
                except (ServerCallError, OSError, ValueError, TimeoutError) as exc:
                    warn(
                        f"agent {name!r}: /aggregate_metrics failed ({str(exc)[:300]}); computed metrics locally"
                    )
            if summary is None:
                accumulator = MetricsAccumulator()
                for _, row in iter_jsonl(spool):
                    accumulator.add(row)
                with answer_path.open("wb") as sink:
                    write_metrics_answer(sink, accumulator)
                del accumulator
                summary = read_metrics_summary(answer_path)
            summaries.append({AGENT_REF_KEY: ref, **summary})
            answers.append((ref, answer_path))
        write_metrics_file(metrics_path, answers)
    if verbose:
        print(format_key_metrics(summaries, metrics_path), flush=True)
    return summaries


async def _post_aggregate(client: ServerClient, agent: str, spool: Path, answer_path: Path) -> None:
    """POST ``{"verify_responses": [...]}`` streamed from a JSONL spool; save the answer to a file."""
    import aiohttp

    async def body() -> AsyncIterator[bytes]:
        # One verify response per line: the server reads it a line at a time, whatever its size.
        for chunk in line_layout_chunks(spool):
            yield chunk

    base = await client.base_url(agent)
    headers = {**auth_headers(), "Content-Type": "application/json"}
    try:
        async with client.http().post(
            base + "/aggregate_metrics",
            data=body(),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=AGGREGATE_TIMEOUT_S),
        ) as resp:
            if not 200 <= resp.status < 300:
                text = (await resp.content.read(300)).decode(errors="replace")
                raise ServerCallError(HTTP_ERROR, agent, "/aggregate_metrics", f"HTTP {resp.status}: {text}")
            with answer_path.open("wb") as sink:
                async for chunk in resp.content.iter_chunked(1 << 16):
                    sink.write(chunk)
    except aiohttp.ClientError as exc:
        raise ServerCallError(UNREACHABLE, agent, "/aggregate_metrics", connection_error_text(exc)) from exc


def _as_fraction(key: str, value: float) -> float:
    """NeMo Gym's metrics files hold pass@k, majority@k and their standard error in percent and
    means as fractions; printed on one line, all are fractions."""
    return value / 100.0 if is_percent_metric(key) else float(value)


def format_key_metrics(entries: list[dict[str, Any]], metrics_path: Path) -> str:
    """The key metrics of each agent, one line each."""
    lines = [f"Key metrics ({metrics_path}; fractions 0-1, the file keeps pass@k and majority@k in percent):"]
    for entry in entries:
        shown = "  ".join(
            f"{k}={_as_fraction(k, v):.4f}"
            if isinstance(v, int | float) and not isinstance(v, bool)
            else f"{k}={v}"
            for k, v in entry["key_metrics"].items()
        )
        lines.append(f"  {entry[AGENT_REF_KEY].get('name')}: {shown or '(none)'}")
    if not entries:
        lines.append("  (no results)")
    return "\n".join(lines)


async def aggregate_shards(
    config: RolloutAggregationConfig, head_url: str
) -> tuple[Path, list[dict[str, Any]]]:
    """Merge the shards ``config.input_glob`` matches and write their metrics file.

    Returns the metrics file's path and the per-agent summaries. The metrics come from each
    agent's ``/aggregate_metrics`` when a head server answers at ``head_url``, else they are computed locally (and a line says so). Without
    ``merge_shards`` the merged rows go to a temporary file next to the output, removed after.
    """
    output = Path(config.output_jsonl_fpath)
    inputs = expand_input_glob(config.input_glob)
    if any(p.resolve() == output.resolve() for p in inputs):
        raise ConfigError(
            f"+output_jsonl_fpath {output} is also one of the inputs; write the merge elsewhere"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    merged = output if config.merge_shards else output.with_name(f".{output.name}.merging")
    report = merge_result_shards(inputs, merged)
    for torn in report.torn_lines:
        warn(f"{torn}: skipped a cut-off last line")
    where = str(merged) if config.merge_shards else "(not kept: +merge_shards=false)"
    print(
        f"Merged {report.files} file(s): {report.rows_read} rows read, {report.duplicates} duplicate(s) dropped, "
        f"{report.rows_written} rows written to {where}",
        flush=True,
    )
    client = ServerClient(head_url, timeout_s=5, connect_retries=1)
    try:
        try:
            await client.server_instances()
            reachable = True
        except ServerCallError:
            print(f"No head server at {client.head_url}: computing metrics locally.", flush=True)
            reachable = False
        metrics_path = CollectionPaths.for_output(output).aggregate_metrics
        summaries = await aggregate_results_file(merged, metrics_path, client if reachable else None)
    finally:
        await client.close()
        if merged != output:
            merged.unlink(missing_ok=True)
    return metrics_path, summaries
