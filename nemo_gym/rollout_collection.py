"""Rollout collection: drive agents over a JSONL dataset and write verified rollouts.

Commands: ``ng_collect_rollouts`` (collect), ``ng_aggregate_rollouts`` (merge shards, compute
metrics) and ``ng_e2e_collect_rollouts`` (start the stack from config, collect, stop).
Trainers use :class:`RolloutCollectionHelper` (``run_examples``, ``run_from_config``).

A collection streams: a pre-pass validates the input and writes the materialized rows (see
:mod:`nemo_gym.collection.collection_io`), then at most ``num_samples_in_parallel`` rows are read and in
flight at a time, and each finished rollout is appended to the results file at once. A failed
rollout becomes a classified record in the failures file, never a result and never reward 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.agents.agent_hops import rollout_timeout_s as default_rollout_timeout_s
from nemo_gym.collection.aggregate_endpoint import line_layout_chunks
from nemo_gym.collection.collection_io import (
    AGENT_KIND,
    AGENT_REF_KEY,
    ATTEMPT_INDEX_KEY,
    ERROR_KEY,
    FAILURE_CLASS_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    CollectionPaths,
    IntTable,
    JsonlAppender,
    PromptConfig,
    ResultsScan,
    RowMaterializer,
    agent_name_of,
    compact_failures,
    drop_duplicate_results,
    expand_input_glob,
    iter_jsonl,
    materialize_input,
    merge_result_shards,
    read_failure_attempts,
    read_metrics_summary,
    row_key,
    scan_results,
    spool_results_by_agent,
    warn,
    write_metrics_file,
)
from nemo_gym.collection.metrics import is_percent_metric
from nemo_gym.collection.output_lock import output_lock
from nemo_gym.collection.streaming_metrics import MetricsAccumulator, write_metrics_answer
from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, head_url_from_config
from nemo_gym.serving.secrets import redact_text, remember_secret_values, secret_values
from nemo_gym.serving.server import ENV_HEAD_URL, auth_headers
from nemo_gym.serving.server_client import (
    ServerCallError,
    ServerClient,
    connection_error_text,
    raise_for_status,
)

MAX_ERROR_CHARS = 4000
# ng_collect_rollouts exits non-zero when more than this share of the rollouts it ran failed.
DEFAULT_MAX_FAILURE_RATIO = 0.1
EXIT_TOO_MANY_FAILURES = 3
AGGREGATE_TIMEOUT_S = 600.0
_Pair = tuple[dict[str, Any], dict[str, Any]]  # (row, result) of one rollout
_GENERIC_CLASSES = frozenset({"agent_error", "upstream_error", "upstream_5xx"})
_FAILURE_CLASS_IN_TEXT = re.compile(r"failure_class[\"']?\s*[:=]\s*[\"']?([a-z][a-z0-9_]*)")


class RolloutCollectionConfig(BaseModel):
    """The ``ng_collect_rollouts`` arguments (each given as ``+name=value``)."""

    model_config = ConfigDict(extra="ignore")

    input_jsonl_fpath: str
    output_jsonl_fpath: str
    agent_name: str | None = None
    limit: int | None = Field(default=None, ge=0)
    num_repeats: int | dict[str, int] = 1
    num_repeats_add_seed: bool = False
    num_samples_in_parallel: int | None = Field(default=None, ge=1)
    responses_create_params: dict[str, Any] = Field(default_factory=dict)
    prompt_config: str | None = None
    resume_from_cache: bool = False
    disable_aggregation: bool = False
    strict: bool = False
    rollout_timeout_s: float | None = Field(default=None, gt=0)
    max_failure_ratio: float = Field(default=DEFAULT_MAX_FAILURE_RATIO, ge=0, le=1)
    max_attempts: int = Field(default=3, ge=1)
    progress_interval_s: float = Field(default=30.0, gt=0)
    num_shards: int = Field(default=1, ge=1)
    shard_index: int = Field(default=0, ge=0)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | RolloutCollectionConfig) -> RolloutCollectionConfig:
        """Validate a config dict; errors name the ``+argument``."""
        if isinstance(config, RolloutCollectionConfig):
            return config
        try:
            parsed = cls.model_validate(dict(config))
        except ValidationError as exc:
            problems = "; ".join(
                f"+{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()[:5]
            )
            raise ConfigError(f"invalid collection arguments: {problems}") from exc
        repeats = parsed.num_repeats
        if any(n < 1 for n in ([repeats] if isinstance(repeats, int) else repeats.values())):
            raise ConfigError(f"+num_repeats must be >= 1 (or a map of agent name → n >= 1), got {repeats!r}")
        if parsed.shard_index >= parsed.num_shards:
            raise ConfigError(f"+shard_index={parsed.shard_index} must be < +num_shards={parsed.num_shards}")
        return parsed


# ---- one rollout -----------------------------------------------------------------------------
@dataclass
class RolloutOutcome:
    """What became of one row: ``result`` (the agent's verify answer) or a failure class and error."""

    row: dict[str, Any]
    result: dict[str, Any] | None = None
    failure_class: str | None = None
    error: str | None = None
    elapsed_s: float = 0.0
    status: int | None = None  # the agent's HTTP status, when it answered an error


# The HTTP status a failure without one stands for: 5xx for infrastructure, 4xx for the row itself.
_FAILURE_STATUS = {"timeout": 504, "unreachable": 503}


class RolloutFailedError(Exception):
    """A rollout failed; ``failure_class`` is timeout, unreachable, agent_error, judge_failed, ...

    ``status`` is an HTTP status, as trainers classify failures by it: the agent's own status
    when it answered an error (4xx: the row is at fault; 5xx: a server is), else 504 for a
    timeout, 503 for an unreachable server, 400 for a row that cannot be sent, 502 otherwise.
    The error pickles (it crosses Ray actor boundaries) with all of its fields.
    """

    def __init__(
        self, row: dict[str, Any], failure_class: str, error: str, status: int | None = None
    ) -> None:
        super().__init__(f"rollout failed ({failure_class}): {error}")
        self.row = row
        self.failure_class = failure_class
        self.error = error
        self.status = status if status is not None else _FAILURE_STATUS.get(failure_class, 502)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.row, self.failure_class, self.error, self.status))


def classify_error(body: Any, text: str) -> str:
    """The failure class of an agent's error answer.

    A specific class wins: the body's ``failure_class`` (servers set it, e.g. ``judge_failed``,
    or ``unreachable``/``timeout`` for a server the agent could not reach), else one named in the
    error text (where a resources server's error arrives) as ``failure_class: <name>``, else
    ``judge_failed`` if the text mentions it; then a generic body class (``upstream_error``),
    else ``agent_error``.
    """
    named = body.get("failure_class") if isinstance(body, Mapping) else None
    named = named if isinstance(named, str) and named else None
    if named is not None and named not in _GENERIC_CLASSES:
        return named
    found = _FAILURE_CLASS_IN_TEXT.search(text)
    if found and found.group(1) not in _GENERIC_CLASSES:
        return found.group(1)
    if "judge_failed" in text:
        return "judge_failed"
    return named or "agent_error"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "...[truncated]"


# ---- the helper trainers use -----------------------------------------------------------------
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
        if head_server_config is None:
            url = os.environ.get(ENV_HEAD_URL) or head_url_from_config({})
        elif isinstance(head_server_config, Mapping):
            head = head_server_config.get("head_server", head_server_config)
            url = head_url_from_config({"head_server": head})
        else:
            head = {"host": head_server_config.host, "port": head_server_config.port}
            url = head_url_from_config({"head_server": head})
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
        client = client or self.setup_server_client()
        timeout_s = timeout_s or self.rollout_timeout_s or default_rollout_timeout_s()
        started = time.monotonic()
        outcome = RolloutOutcome(row)
        agent = agent_name_of(row, agent_name)
        if agent is None:
            outcome.failure_class, outcome.error = "agent_error", "row has no agent_ref.name"
            outcome.status = 400
            return outcome
        key = row_key(row)
        rollout_id = (
            f"t{row[TASK_INDEX_KEY]}-r{row[ROLLOUT_INDEX_KEY]}-a{row.get(ATTEMPT_INDEX_KEY, 0)}-{uuid.uuid4().hex[:8]}"
            if key is not None
            else uuid.uuid4().hex
        )
        try:
            async with asyncio.timeout(timeout_s):
                resp = await client.post(agent, "/run", row, timeout_s=timeout_s, rollout_id=rollout_id)
            result = raise_for_status(resp, agent, "/run")
        except TimeoutError:
            outcome.failure_class = "timeout"
            outcome.error = f"{agent}/run: no result within the rollout deadline of {timeout_s:g}s"
        except ServerCallError as exc:
            if exc.kind == "http_error":
                outcome.failure_class = classify_error(exc.body, str(exc))
                outcome.status = exc.status
            else:
                outcome.failure_class = {"not_found": "unreachable"}.get(exc.kind, exc.kind)
            outcome.error = _clip(str(exc))
        except orjson.JSONDecodeError as exc:
            outcome.failure_class = "bad_upstream_body"
            outcome.error = _clip(
                f"{agent}/run answered HTTP {resp.status} with a body that is not JSON: {exc}"
            )
        except Exception as exc:  # noqa: BLE001 - one bad row never aborts the run
            outcome.failure_class, outcome.error = "agent_error", _clip(f"{type(exc).__name__}: {exc}")
        else:
            reward = result.get("reward") if isinstance(result, dict) else None
            named_failure = result.get(FAILURE_CLASS_KEY) if isinstance(result, dict) else None
            if isinstance(named_failure, str) and named_failure:
                # A verify answer that names its own failure (NeMo Gym's judge_failsafe row:
                # reward 0.0 with _ng_failure_class) is a failure, never a reward of 0.
                outcome.failure_class = named_failure
                reason = result.get("_ng_failure_judge_error") or result.get("failure_reason") or ""
                outcome.error = _clip(f"{agent}/run: the verifier reported {named_failure}: {reason}")
            elif isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
                outcome.failure_class = "agent_error"
                outcome.error = _clip(f"{agent}/run answered without a numeric reward: {str(result)[:500]}")
            else:
                outcome.result = result
        outcome.elapsed_s = time.monotonic() - started
        return outcome

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

        ``row`` is the object passed in; ``result`` the agent's verify answer (``reward``,
        ``response`` with token-ID fields when requested). A failed rollout makes its future
        raise :class:`RolloutFailedError`. ``semaphore`` bounds rollouts in flight.
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
                        outcome.failure_class or "agent_error",
                        outcome.error or "",
                        outcome.status,
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
        """Run a whole collection as ``ng_collect_rollouts`` does; returns its summary.

        The head server comes from ``config['head_server']`` (or this helper's client).
        """
        settings = RolloutCollectionConfig.from_config(config)
        if isinstance(config, Mapping):
            remember_secret_values(secret_values(config))
        head = config.get("head_server") if isinstance(config, Mapping) else None
        client = self.setup_server_client({"head_server": head} if head else None)
        run = _CollectionRun(self, settings, client, verbose)
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
            if client is not self.server_client:
                await client.close()


# ---- a whole collection ----------------------------------------------------------------------
@dataclass
class CollectionSummary:
    """The outcome of :meth:`RolloutCollectionHelper.run_from_config`."""

    paths: CollectionPaths
    dispatched: int = 0
    succeeded: int = 0
    failed: int = 0
    failures_by_class: dict[str, int] = field(default_factory=dict)
    already_done: int = 0
    attempts_exhausted: int = 0
    malformed_lines: int = 0
    malformed_line_numbers: list[int] = field(default_factory=list)  # the first few
    input_path: str = ""
    results_in_file: int = 0
    metrics: list[dict[str, Any]] | None = None

    @property
    def failure_ratio(self) -> float:
        """Failed rollouts and malformed input lines over everything this run tried (0 if nothing)."""
        failed = self.failed + self.malformed_lines
        tried = self.succeeded + failed
        return failed / tried if tried else 0.0

    def next_step(self) -> str | None:
        """The one thing to do next, or None when nothing is left to collect.

        Malformed lines keep their task index, so after fixing them a resume collects exactly
        them (and retries failed rollouts); every case ends in the same command.
        """
        retry = self.failed + self.attempts_exhausted
        if not self.malformed_lines and not retry:
            return None
        resume = "run the same command with +resume_from_cache=true (it collects only what is missing)"
        if not self.malformed_lines:
            return (
                f"see {self.paths.failures} for why {retry} rollout(s) failed, fix the cause, then {resume}"
            )
        lines = ", ".join(str(n) for n in self.malformed_line_numbers)
        if self.malformed_lines > len(self.malformed_line_numbers):
            lines += f" and {self.malformed_lines - len(self.malformed_line_numbers)} more"
        also = f" (it also retries the {retry} failed rollout(s))" if retry else ""
        plural = "s" if self.malformed_lines > 1 else ""
        return (
            f"fix input line{plural} {lines} of {self.input_path} (what is wrong with each is in {self.paths.failures}), "
            f"then {resume}{also}"
        )

    def results(self) -> Iterator[dict[str, Any]]:
        """Stream the rows of the results file."""
        if self.paths.output.exists():
            for _, row in iter_jsonl(self.paths.output):
                yield row


class _CollectionRun:
    """One ``run_from_config`` call: resume state, pre-pass, dispatch, aggregation."""

    def __init__(
        self,
        helper: RolloutCollectionHelper,
        settings: RolloutCollectionConfig,
        client: ServerClient,
        verbose: bool,
    ) -> None:
        self.helper = helper
        self.settings = settings
        self.client = client
        self.verbose = verbose
        self.paths = CollectionPaths.for_output(settings.output_jsonl_fpath)
        self.summary = CollectionSummary(self.paths)
        self.done: IntTable = IntTable()
        self.attempts: dict[int, int] = {}
        self.retried_ok: set[int] = set()
        self.rewards: dict[str, list[float]] = {}  # agent → [sum, count] of this run's rewards
        self.started = time.monotonic()

    def _progress_line(self, total: int) -> str:
        s, elapsed = self.summary, time.monotonic() - self.started
        finished = s.succeeded + s.failed
        means = ", ".join(f"{a}={t / n:.4f} (n={int(n)})" for a, (t, n) in sorted(self.rewards.items()))
        return (
            f"[ng_collect_rollouts] {elapsed:.0f}s: {finished}/{total} finished "
            f"({finished / max(elapsed, 1e-9):.2f}/s), {s.failed} failed; mean reward: {means or 'n/a'}"
        )

    def _decide(self, position: int, key: int) -> Literal["other_shard", "done", "exhausted", "run"]:
        if position % self.settings.num_shards != self.settings.shard_index:
            return "other_shard"
        if key in self.done:
            return "done"
        if self.attempts.get(key, 0) >= self.settings.max_attempts:
            return "exhausted"
        return "run"

    async def run(self) -> CollectionSummary:
        settings, paths = self.settings, self.paths
        if settings.resume_from_cache:
            scan = scan_results(paths.output)
            if scan.torn_line_dropped:
                warn(
                    f"{paths.output}: dropped a cut-off last line (a write interrupted by a kill); it is rerun"
                )
            if scan.duplicates:
                dropped = drop_duplicate_results(paths.output)
                scan.rows -= dropped
                warn(
                    f"{paths.output}: dropped {dropped} duplicate (task, rollout) row(s), kept the first of each"
                )
            self.done = scan.done
            compact_failures(paths.failures, self.done, drop_malformed=True)
            self.attempts = read_failure_attempts(paths.failures, self.done)
        else:
            if paths.output.exists() and paths.output.stat().st_size > 0:
                raise ConfigError(
                    f"{paths.output} already holds results; pass +resume_from_cache=true to finish that run, "
                    "or delete it / choose another +output_jsonl_fpath"
                )
            scan = ResultsScan()
            for stale in (paths.failures, paths.aggregate_metrics):
                stale.unlink(missing_ok=True)

        counts = {"other_shard": 0, "done": 0, "exhausted": 0, "run": 0}
        position = 0

        def count(row: dict[str, Any]) -> None:
            nonlocal position
            key = row_key(row)
            assert key is not None
            counts[self._decide(position, key)] += 1
            position += 1

        materializer = RowMaterializer(
            agent_name=settings.agent_name,
            num_repeats=settings.num_repeats,
            add_seed=settings.num_repeats_add_seed,
            responses_create_params=settings.responses_create_params,
            prompt=PromptConfig.load(settings.prompt_config) if settings.prompt_config else None,
        )
        with JsonlAppender(paths.failures) as failures:
            report = materialize_input(
                Path(settings.input_jsonl_fpath),
                paths.materialized_inputs,
                materializer,
                limit=settings.limit,
                strict=settings.strict,
                on_bad_line=lambda bad: failures.append(bad.failure_record()),
                on_row=count,
            )
            self.summary.malformed_lines = report.bad_line_count
            self.summary.malformed_line_numbers = [bad.line_number for bad in report.bad_lines]
            self.summary.input_path = settings.input_jsonl_fpath
            self.summary.already_done = counts["done"]
            self.summary.attempts_exhausted = counts["exhausted"]
            if report.bad_line_count:
                warn(f"skipped {report.bad_line_count} malformed input line(s), recorded in {paths.failures}")
            if counts["exhausted"]:
                warn(
                    f"{counts['exhausted']} rollout(s) failed {settings.max_attempts} times already and are not "
                    f"retried (raise +max_attempts to retry them); see {paths.failures}"
                )
            if counts["run"]:
                await self._check_agents(report.agents)
                await self._dispatch(counts["run"], failures)
        if settings.resume_from_cache and self.retried_ok:
            compact_failures(paths.failures, self.retried_ok, drop_malformed=False)
        self.summary.results_in_file = scan.rows + self.summary.succeeded
        if self.verbose:
            self._print_summary()
        if not settings.disable_aggregation:
            self.summary.metrics = await aggregate_results_file(
                paths.output, paths.aggregate_metrics, self.client, verbose=self.verbose
            )
        return self.summary

    async def _unknown_agent_message(self, agent: str) -> str:
        """Names only the registered agents, with a "did you mean" for a near miss."""
        import difflib

        try:
            instances = await self.client.server_instances()
        except ServerCallError:
            instances = []
        known = sorted({i.name for i in instances if i.server_type == AGENT_KIND})
        message = f"agent {agent!r} is not registered with the head server at {self.client.head_url}"
        close = difflib.get_close_matches(agent, known, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        return message + f" (registered agents: {', '.join(known) or 'none'})"

    async def _check_agents(self, agents: set[str]) -> None:
        for agent in sorted(agents):
            try:
                await self.client.resolve(agent)
            except ServerCallError as exc:
                if exc.kind == "not_found":
                    raise ConfigError(await self._unknown_agent_message(agent)) from exc
                raise ConfigError(
                    f"cannot reach the head server at {self.client.head_url} to find agent {agent!r} ({exc}); "
                    "start the servers with ng_run, or point ++head_server.port at a running head server"
                ) from exc

    async def _dispatch(self, total: int, failures: JsonlAppender) -> None:
        from tqdm import tqdm

        settings = self.settings
        parallel = settings.num_samples_in_parallel or 32
        slots = asyncio.Semaphore(parallel)
        in_flight: set[asyncio.Task[None]] = set()
        fatal: list[BaseException] = []
        bar = tqdm(
            total=total,
            desc="Collecting rollouts",
            unit="rollout",
            file=sys.stderr,
            disable=not self.verbose,
            mininterval=0.5,
        )

        async def report_periodically() -> None:
            while True:
                await asyncio.sleep(settings.progress_interval_s)
                if self.verbose:
                    bar.write(self._progress_line(total), file=sys.stderr)

        def finished(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            slots.release()
            if not task.cancelled() and task.exception() is not None:
                fatal.append(task.exception())  # type: ignore[arg-type]

        with JsonlAppender(self.paths.output) as results:

            async def one(row: dict[str, Any], key: int) -> None:
                outcome = await self.helper.run_one(
                    row,
                    client=self.client,
                    agent_name=settings.agent_name,
                    timeout_s=settings.rollout_timeout_s,
                )
                self._record(outcome, key, results, failures)
                bar.update(1)

            reporter = asyncio.create_task(report_periodically())
            try:
                position = -1
                for _, row in iter_jsonl(self.paths.materialized_inputs):
                    position += 1
                    key = row_key(row)
                    assert key is not None
                    if self._decide(position, key) != "run":
                        continue
                    await slots.acquire()  # read the next row only once a slot is free
                    if fatal:
                        break
                    attempt = self.attempts.get(key, 0)
                    if attempt:
                        row[ATTEMPT_INDEX_KEY] = attempt
                    task = asyncio.create_task(one(row, key))
                    in_flight.add(task)
                    task.add_done_callback(finished)
                    self.summary.dispatched += 1
                if in_flight:
                    await asyncio.wait(set(in_flight))
            finally:
                reporter.cancel()
                for task in list(in_flight):
                    task.cancel()
                bar.close()
        if fatal:
            raise fatal[0]
        if self.verbose:
            sys.stderr.write(self._progress_line(total) + "\n")

    def _record(
        self, outcome: RolloutOutcome, key: int, results: JsonlAppender, failures: JsonlAppender
    ) -> None:
        row = outcome.row
        attempt = row.get(ATTEMPT_INDEX_KEY, 0)
        if outcome.result is not None:
            out = {
                TASK_INDEX_KEY: row[TASK_INDEX_KEY],
                ROLLOUT_INDEX_KEY: row[ROLLOUT_INDEX_KEY],
                **outcome.result,
            }
            out[TASK_INDEX_KEY], out[ROLLOUT_INDEX_KEY] = row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY]
            if attempt:
                out[ATTEMPT_INDEX_KEY] = attempt
            out[AGENT_REF_KEY] = row[AGENT_REF_KEY]
            results.append(out)
            self.summary.succeeded += 1
            sums = self.rewards.setdefault(row[AGENT_REF_KEY]["name"], [0.0, 0.0])
            sums[0] += float(outcome.result["reward"])
            sums[1] += 1
            if attempt:
                self.retried_ok.add(key)
            return
        cls = outcome.failure_class or "agent_error"
        failures.append(
            {
                **row,
                ATTEMPT_INDEX_KEY: attempt,
                FAILURE_CLASS_KEY: cls,
                ERROR_KEY: redact_text(outcome.error or ""),  # an upstream may echo a key or URL
                "_ng_elapsed_s": round(outcome.elapsed_s, 3),
            }
        )
        self.summary.failed += 1
        self.summary.failures_by_class[cls] = self.summary.failures_by_class.get(cls, 0) + 1

    def _print_summary(self) -> None:
        s = self.summary
        notes = [f"{k}: {v}" for k, v in sorted(s.failures_by_class.items())]
        notes += [f"{s.already_done} already done"] if s.already_done else []
        notes += [f"{s.attempts_exhausted} out of attempts"] if s.attempts_exhausted else []
        notes += [f"{s.malformed_lines} malformed input lines skipped"] if s.malformed_lines else []
        print(
            f"Rollouts: {s.succeeded} finished, {s.failed} failed this run"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
        print(f"Results: {s.paths.output} ({s.results_in_file} rows)")
        if s.failed or s.attempts_exhausted or s.malformed_lines:
            print(f"Failures: {s.paths.failures} (not scored)")
        step = s.next_step()
        if step:
            print(f"Next: {step}")
        sys.stdout.flush()


# ---- aggregate metrics -----------------------------------------------------------------------
async def aggregate_results_file(
    results_path: Path, metrics_path: Path, client: ServerClient | None, *, verbose: bool = True
) -> list[dict[str, Any]]:
    """Write the metrics file of a results file; returns ``{agent_ref, agent_metrics, key_metrics}``
    per agent (``group_level_metrics`` is in the file only: one entry per task).

    Each agent's rows (heavy fields stripped) are streamed to its ``/aggregate_metrics``
    (simple_agent forwards to its resources server, so environment-specific metrics apply) and
    the answer is streamed to disk and copied into the file, so the collector's memory does not
    grow with the run. Without a ``client``, or when that call fails, the metrics are computed
    here by :class:`nemo_gym.collection.streaming_metrics.MetricsAccumulator` (a few numbers per row in
    flat arrays) and a notice says so.
    """
    import tempfile

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
                raise ServerCallError(
                    "http_error", agent, "/aggregate_metrics", f"HTTP {resp.status}: {text}"
                )
            with answer_path.open("wb") as sink:
                async for chunk in resp.content.iter_chunked(1 << 16):
                    sink.write(chunk)
    except aiohttp.ClientError as exc:
        raise ServerCallError("unreachable", agent, "/aggregate_metrics", connection_error_text(exc)) from exc


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


# ---- commands --------------------------------------------------------------------------------
def _run_async(coro: Any) -> Any:
    from nemo_gym.serving.server import _loop_factory

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(coro)


def failure_exit_code(summary: CollectionSummary, max_failure_ratio: float) -> int:
    """0, or :data:`EXIT_TOO_MANY_FAILURES` (with a line on stderr) when more than
    ``max_failure_ratio`` of this run's rollouts failed."""
    ratio = summary.failure_ratio
    if ratio <= max_failure_ratio:
        return 0
    classes = ", ".join(f"{k}: {v}" for k, v in sorted(summary.failures_by_class.items()))
    if summary.malformed_lines:
        classes += (", " if classes else "") + f"malformed input lines: {summary.malformed_lines}"
    sys.stderr.write(
        f"ng_collect_rollouts: {ratio:.1%} of what this run tried failed ({classes}), above "
        f"+max_failure_ratio={max_failure_ratio:g}. Next: {summary.next_step()}.\n"
    )
    return EXIT_TOO_MANY_FAILURES


def _collect_command(argv: list[str]) -> int:
    from nemo_gym.launch.config import load_config

    config = load_config(argv)
    settings = RolloutCollectionConfig.from_config(config)
    summary = _run_async(RolloutCollectionHelper().run_from_config(config))
    return failure_exit_code(summary, settings.max_failure_ratio)


def _aggregate_command(argv: list[str]) -> int:
    from nemo_gym.launch.config import load_config

    config = load_config(argv)
    if not config.get("input_glob") or not config.get("output_jsonl_fpath"):
        raise ConfigError(
            "ng_aggregate_rollouts needs +input_glob='results/shard*.jsonl' and +output_jsonl_fpath=..."
        )
    output = Path(str(config["output_jsonl_fpath"]))
    inputs = expand_input_glob(str(config["input_glob"]))
    if any(p.resolve() == output.resolve() for p in inputs):
        raise ConfigError(
            f"+output_jsonl_fpath {output} is also one of the inputs; write the merge elsewhere"
        )
    report = merge_result_shards(inputs, output)
    for torn in report.torn_lines:
        warn(f"{torn}: skipped a cut-off last line")
    print(
        f"Merged {report.files} file(s): {report.rows_read} rows read, {report.duplicates} duplicate(s) dropped, "
        f"{report.rows_written} rows written to {output}",
        flush=True,
    )

    async def metrics() -> None:
        client = ServerClient(head_url_from_config(config), timeout_s=5, connect_retries=1)
        try:
            await client.server_instances()
            reachable = True
        except ServerCallError:
            print(f"No head server at {client.head_url}: computing metrics locally.", flush=True)
            reachable = False
        try:
            metrics_path = CollectionPaths.for_output(output).aggregate_metrics
            await aggregate_results_file(output, metrics_path, client if reachable else None)
        finally:
            await client.close()

    _run_async(metrics())
    return 0


def _e2e_command(argv: list[str]) -> int:
    from nemo_gym.launch.config import load_config, server_instances
    from nemo_gym.launch.launcher import StackHandle

    config = load_config(argv)
    agents = [i.name for i in server_instances(config).values() if i.kind == AGENT_KIND]
    if not config.get("agent_name") and len(agents) == 1:
        config["agent_name"] = agents[0]  # rows without agent_ref go to the only agent
    settings = RolloutCollectionConfig.from_config(config)  # fail on bad arguments before starting anything
    head = dict(config.get("head_server") or {})
    head.setdefault("port", 0)  # a one-shot stack takes a free port unless told otherwise
    config["head_server"] = head
    handle = StackHandle.start(config)
    try:
        config["head_server"] = handle.head_server_config
        summary = _run_async(RolloutCollectionHelper().run_from_config(config))
    finally:
        handle.stop()
    return failure_exit_code(summary, settings.max_failure_ratio)


ng_collect_rollouts = console_command(_collect_command, "ng_collect_rollouts")
ng_aggregate_rollouts = console_command(_aggregate_command, "ng_aggregate_rollouts")
ng_e2e_collect_rollouts = console_command(_e2e_command, "ng_e2e_collect_rollouts")


if __name__ == "__main__":
    ng_collect_rollouts(None)
