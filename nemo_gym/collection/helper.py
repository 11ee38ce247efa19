"""``RolloutCollectionHelper`` and ``RolloutAggregationHelper``: what trainers and the commands call.

The helper's public methods are the trainer API (``run_examples``, ``run_from_config``,
``setup_server_client``); its underscore methods are the NeMo Gym names trainers and tools reach
for (``_preprocess_rows_from_config``, ``_load_from_cache``, ``_call_aggregate_metrics``), with
NeMo Gym's return shapes. Those hold rows in memory, as NeMo Gym's do; ``run_from_config``
itself streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections import deque
from collections.abc import Container, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collection.aggregation import aggregate_results_file, aggregate_shards
from nemo_gym.collection.collection_io import (
    AGENT_REF_KEY,
    ATTEMPT_INDEX_KEY,
    CollectionPaths,
    iter_jsonl,
    materialize_input,
    read_failure_attempts,
    row_key,
    scan_results,
)
from nemo_gym.collection.collector import CollectionRun, CollectionSummary
from nemo_gym.collection.nemo_gym_compat import terminal_failure_keys
from nemo_gym.collection.notices import warn
from nemo_gym.collection.output_lock import output_lock
from nemo_gym.collection.rollouts import RolloutFailedError, RolloutOutcome, run_one
from nemo_gym.collection.settings import RolloutAggregationConfig, RolloutCollectionConfig
from nemo_gym.failure_classes import AGENT_ERROR
from nemo_gym.launch.config import head_url_from_config
from nemo_gym.serving.secrets import remember_secret_values, secret_values
from nemo_gym.serving.server import ENV_HEAD_URL
from nemo_gym.serving.server_client import ServerClient

_Pair = tuple[dict[str, Any], dict[str, Any]]  # (row, result) of one rollout


def head_url_for(head_server_config: Any = None) -> str:
    """The head server URL of ``{host, port}``, an object with ``host``/``port``, or a config with a
    ``head_server`` block; default ``$NEMO_GYM_HEAD_URL``, else 127.0.0.1:11000."""
    if head_server_config is None:
        return os.environ.get(ENV_HEAD_URL) or head_url_from_config({})
    if isinstance(head_server_config, Mapping):
        head = head_server_config.get("head_server", head_server_config)
        return head_url_from_config({"head_server": head})
    return head_url_from_config(
        {"head_server": {"host": head_server_config.host, "port": head_server_config.port}}
    )


class RolloutCollectionHelper:
    """Runs rows through agents: :meth:`run_examples` for trainers, :meth:`run_from_config` for files.

    ``server_client`` (optional) replaces head-server lookup, e.g. ``ServerClient(static_urls=...)``;
    ``rollout_timeout_s`` is the deadline of one rollout (default ``NEMO_GYM_ROLLOUT_TIMEOUT_S``, 1,200 s).
    """

    def __init__(
        self, *, server_client: ServerClient | None = None, rollout_timeout_s: float | None = None
    ) -> None:
        self.server_client = server_client
        self.rollout_timeout_s = rollout_timeout_s
        self._clients: dict[str, ServerClient] = {}

    def setup_server_client(self, head_server_config: Any = None) -> ServerClient:
        """The client that reaches agents by name.

        ``head_server_config`` is ``{host, port}`` (``StackHandle.head_server_config``), an object
        with ``host`` and ``port`` attributes, or a whole config with a ``head_server`` block;
        default: ``$NEMO_GYM_HEAD_URL``, else 127.0.0.1:11000.
        """
        if self.server_client is not None:
            return self.server_client
        url = head_url_for(head_server_config)
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = ServerClient(url)
        return client

    async def close(self) -> None:
        """Close the HTTP sessions this helper opened on the running event loop."""
        for client in self._clients.values():
            await client.close()

    async def __aenter__(self) -> RolloutCollectionHelper:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run_one(
        self,
        row: dict[str, Any],
        *,
        client: ServerClient | None = None,
        agent_name: str | None = None,
        timeout_s: float | None = None,
    ) -> RolloutOutcome:
        """Send one row to its agent's ``/run``; never raises for a failed rollout."""
        return await run_one(
            row,
            client or self.setup_server_client(),
            agent_name=agent_name,
            timeout_s=timeout_s or self.rollout_timeout_s,
        )

    def run_examples(
        self,
        examples: Iterable[dict[str, Any]],
        head_server_config: Any = None,
        semaphore: asyncio.Semaphore | None = None,
    ) -> Iterator[asyncio.Future[_Pair]]:
        """Start every row now; yield one future per row, resolving to ``(row, result)`` in
        completion order. Call from inside a running event loop::

            for future in helper.run_examples(rows):
                row, result = await future

        ``row`` is the object passed in, with every key it had (``_rowidx``, ``agent_ref``, ``_ng_rollout_id``,
        unknown keys); ``result`` the agent's verify answer as it came (``reward``, ``reward_components``,
        ``response`` with token-ID fields when requested). A failed rollout makes its future raise
        :class:`RolloutFailedError`. ``semaphore`` bounds rollouts in flight.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "run_examples must be called inside a running event loop (from an async function)"
            ) from None
        client = self.setup_server_client(head_server_config)
        finished: deque[RolloutOutcome] = deque()
        waiting: deque[asyncio.Future[_Pair]] = deque()

        def settle(future: asyncio.Future[_Pair], outcome: RolloutOutcome) -> None:
            if future.done():
                return
            if outcome.result is not None:
                future.set_result((outcome.row, outcome.result))
            else:
                future.set_exception(
                    RolloutFailedError(
                        outcome.row,
                        outcome.failure_class or AGENT_ERROR,
                        outcome.error or "",
                        outcome.status,
                        outcome.response_content,
                    )
                )

        async def one(row: dict[str, Any]) -> None:
            if semaphore is not None:
                async with semaphore:
                    outcome = await self.run_one(row, client=client)
            else:
                outcome = await self.run_one(row, client=client)
            if waiting:
                settle(waiting.popleft(), outcome)
            else:
                finished.append(outcome)

        tasks = [loop.create_task(one(row)) for row in examples]

        def futures() -> Iterator[asyncio.Future[_Pair]]:
            for _ in tasks:
                future: asyncio.Future[_Pair] = loop.create_future()
                if finished:
                    settle(future, finished.popleft())
                else:
                    waiting.append(future)
                yield future

        return futures()

    async def run_from_config(
        self, config: Mapping[str, Any] | RolloutCollectionConfig, *, verbose: bool = True
    ) -> CollectionSummary:
        """Run a whole collection as ``ng_collect_rollouts`` does; returns its summary (iterating
        it streams the result rows, as NeMo Gym's list of results would give them).

        The head server comes from ``config['head_server']`` (or this helper's client).
        """
        settings = RolloutCollectionConfig.from_config(config)
        if isinstance(config, Mapping):
            remember_secret_values(secret_values(config))
        head = config.get("head_server") if isinstance(config, Mapping) else None
        client = self.setup_server_client({"head_server": head} if head else None)

        async def one(row: dict[str, Any], agent_name: str | None, timeout_s: float | None) -> RolloutOutcome:
            return await self.run_one(row, client=client, agent_name=agent_name, timeout_s=timeout_s)

        run = CollectionRun(one, settings, client, verbose, config if isinstance(config, Mapping) else None)
        if type(self)._call_aggregate_metrics is not RolloutCollectionHelper._call_aggregate_metrics:
            run.aggregate = self._aggregate_through_hook
        failures, materialized = run.paths.failures, run.paths.materialized_inputs
        failures_existed, materialized_existed = failures.exists(), materialized.exists()
        try:
            with output_lock(run.paths.output):
                return await run.run()
        except BaseException:
            # A rejected input file (or agent) leaves no empty failures file behind, and a run that
            # stopped before sending anything leaves no materialized inputs it created.
            with contextlib.suppress(OSError):  # the output path itself may be what is wrong
                if not failures_existed and failures.exists() and failures.stat().st_size == 0:
                    failures.unlink()
                if not materialized_existed and run.summary.dispatched == 0:
                    materialized.unlink(missing_ok=True)
            raise
        finally:
            if client is not self.server_client and isinstance(client, ServerClient):
                await client.close()  # a NeMo Gym-style client from an override closes itself

    # ---- NeMo Gym's lower-level names, with its return shapes --------------------------------
    def _preprocess_rows_from_config(self, config: RolloutCollectionConfig) -> list[dict[str, Any]]:
        """The materialized rollout rows of ``config``'s input (agent, overrides, prompt, repeats,
        seeds, ``_ng_task_index`` / ``_ng_rollout_index``), in memory, sorted by task then rollout.
        A malformed line raises, naming it."""
        config = RolloutCollectionConfig.from_config(config)
        materializer = config.row_materializer()
        with tempfile.TemporaryDirectory(prefix="ng_preprocess_") as tmp:
            out = Path(tmp) / "rows.jsonl"
            materialize_input(Path(config.input_jsonl_fpath), out, materializer, limit=config.limit)
            notice = materializer.override_notice()
            if notice is not None:
                warn(notice)
            return [row for _, row in iter_jsonl(out)]

    def _load_from_cache(
        self, config: RolloutCollectionConfig
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[list[bytes]]]:
        """What a resumed run starts from: ``(input_rows, rows, results, result_strs)``.

        ``input_rows``: materialized rows still to run (no result yet, attempts left; a retried
        row carries ``_ng_attempt_index``); ``results``: the rows of the results file, and
        ``result_strs`` each one's line as ``[bytes]``; ``rows``: the materialized row of each
        result, in the same order.
        """
        config = RolloutCollectionConfig.from_config(config)
        paths = config.collection_paths()
        done: Container[int] = (
            scan_results(paths.output, repair=False).done if paths.output.exists() else set()
        )
        attempts = read_failure_attempts(paths.failures, done) if paths.failures.exists() else {}
        terminal = terminal_failure_keys(
            paths.failures, done, retry_terminal_timeouts=config.retry_terminal_timeouts
        )
        by_key: dict[int, dict[str, Any]] = {}
        input_rows: list[dict[str, Any]] = []
        for _, row in iter_jsonl(paths.materialized_inputs):
            key = row_key(row)
            assert key is not None
            by_key[key] = row
            if key in done or key in terminal or attempts.get(key, 0) >= config.max_attempts:
                continue
            if attempts.get(key):
                row = {**row, ATTEMPT_INDEX_KEY: attempts[key]}
            input_rows.append(row)
        results: list[dict[str, Any]] = []
        result_strs: list[list[bytes]] = []
        rows: list[dict[str, Any]] = []
        if paths.output.exists():
            with paths.output.open("rb") as source:
                for line in source:
                    stripped = line.strip()
                    if not stripped:
                        continue
                    try:
                        result = orjson.loads(stripped)
                    except orjson.JSONDecodeError:
                        continue  # a torn last line: that rollout runs again
                    key = row_key(result)
                    if key is None or key not in by_key:
                        continue
                    results.append(result)
                    result_strs.append([stripped])
                    rows.append(by_key[key])
        return input_rows, rows, results, result_strs

    async def _aggregate_through_hook(self, results_path: Path) -> list[dict[str, Any]]:
        """The metrics step through an overridden ``_call_aggregate_metrics`` (NeMo Gym's hook,
        given the results as both rows and results): the summaries of the file it wrote, if any."""
        results = [row for _, row in iter_jsonl(results_path)]
        written = await self._call_aggregate_metrics(results, results, results_path)
        if written is None or not Path(written).is_file():
            return []
        entries = orjson.loads(Path(written).read_bytes())
        keys = (AGENT_REF_KEY, "agent_metrics", "key_metrics")
        return (
            [{k: e[k] for k in keys if k in e} for e in entries if isinstance(e, dict)]
            if isinstance(entries, list)
            else []
        )

    async def _call_aggregate_metrics(
        self, results: list[dict[str, Any]], rows: list[dict[str, Any]], output_fpath: Path | str
    ) -> Path | None:
        """Write ``<stem>_aggregate_metrics.json`` next to ``output_fpath`` for ``results`` (each
        grouped by its row's ``agent_ref``) through each agent's ``/aggregate_metrics``; returns
        the file's path, or None when there are no results."""
        if not results:
            return None
        metrics_path = CollectionPaths.for_output(output_fpath).aggregate_metrics
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="ng_metrics_", dir=metrics_path.parent) as tmp:
            spool = Path(tmp) / "results.jsonl"
            with spool.open("wb") as sink:
                for row, result in zip(rows, results, strict=True):
                    entry = (
                        result
                        if AGENT_REF_KEY in result
                        else {**result, AGENT_REF_KEY: row.get(AGENT_REF_KEY)}
                    )
                    sink.write(orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE))
            await aggregate_results_file(spool, metrics_path, self.setup_server_client())
        return metrics_path


class RolloutAggregationHelper:
    """Merges result shards and computes their metrics (``ng_aggregate_rollouts``).

    ``head_server_config`` says where agents are found for ``/aggregate_metrics`` (as for
    :meth:`RolloutCollectionHelper.setup_server_client`); with no head server there, the
    metrics are computed locally.
    """

    def __init__(self, head_server_config: Any = None) -> None:
        self.head_server_config = head_server_config

    async def run_from_config(self, config: Mapping[str, Any] | RolloutAggregationConfig) -> Path:
        """Merge the shards and write the metrics file; returns the metrics file's path."""
        settings = RolloutAggregationConfig.from_config(config)
        head = self.head_server_config
        if head is None and isinstance(config, Mapping) and config.get("head_server"):
            head = {"head_server": config["head_server"]}
        metrics_path, _ = await aggregate_shards(settings, head_url_for(head))
        return metrics_path
