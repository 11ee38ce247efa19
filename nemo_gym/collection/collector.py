"""A whole file collection (``ng_collect_rollouts``): resume state, pre-pass, dispatch, aggregation.

A collection streams: a pre-pass validates the input and writes the materialized rows (see
:mod:`nemo_gym.collection.collection_io`), then at most ``num_samples_in_parallel`` rows are read
and in flight at a time, and each finished rollout is appended to the results file at once. A
failed rollout becomes a classified record in the failures file, never a result and never reward 0.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import yaml

from nemo_gym.collection.aggregation import aggregate_results_file
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
    ResultsScan,
    compact_failures,
    drop_duplicate_results,
    iter_jsonl,
    materialize_input,
    read_failure_attempts,
    row_key,
    scan_results,
    warn,
)
from nemo_gym.collection.nemo_gym_compat import migrate_invalid_judge_main_rows, terminal_failure_keys
from nemo_gym.collection.rollouts import RolloutOutcome
from nemo_gym.collection.row_keys import ROLLOUT_ID_KEY
from nemo_gym.collection.run_lock import RunLock, check_or_write_lock
from nemo_gym.collection.settings import RolloutCollectionConfig
from nemo_gym.collection.trackers import log_collection, require_packages
from nemo_gym.failure_classes import AGENT_ERROR, NOT_FOUND
from nemo_gym.launch.config import ConfigError
from nemo_gym.serving.protocol import auth_headers
from nemo_gym.serving.secrets import redact_text
from nemo_gym.serving.server_client import ServerCallError, ServerClient

# Runs one row: (row, agent_name, timeout_s) -> outcome.
RunOne = Callable[[dict[str, Any], "str | None", "float | None"], Awaitable[RolloutOutcome]]


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

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # NeMo Gym's run_from_config returns the result rows: iterating a summary streams them.
        return self.results()

    def __len__(self) -> int:
        return self.results_in_file

    def __bool__(self) -> bool:
        return True  # a summary is a summary, even of an empty run


class CollectionRun:
    """One ``run_from_config`` call: resume state, pre-pass, dispatch, aggregation."""

    def __init__(
        self,
        run_one: RunOne,
        settings: RolloutCollectionConfig,
        client: ServerClient,
        verbose: bool,
        raw_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_one = run_one
        # Replaces the metrics step when set: ``aggregate(results_path)`` answers the summaries
        # (a helper subclass overriding NeMo Gym's ``_call_aggregate_metrics`` hook).
        self.aggregate: Callable[[Path], Awaitable[list[dict[str, Any]]]] | None = None
        self.raw_config = raw_config  # the whole config, for the trackers' own keys
        self.settings = settings
        self.client = client
        self.verbose = verbose
        self.paths = settings.collection_paths()
        self.summary = CollectionSummary(self.paths)
        self.done: IntTable = IntTable()
        self.attempts: dict[int, int] = {}
        self.terminal: set[int] = set()  # failures stamped final (NeMo Gym's _ng_failure_terminal)
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
        if self.attempts.get(key, 0) >= self.settings.max_attempts or key in self.terminal:
            return "exhausted"
        return "run"

    async def run(self) -> CollectionSummary:
        settings, paths = self.settings, self.paths
        require_packages(settings)  # before any work: a missing tracker package is a config error
        if settings.resume_from_cache:
            if settings.retry_invalid_judge_responses:
                migrate_invalid_judge_main_rows(paths.output)
            scan = scan_results(paths.output)
            if scan.torn_line_dropped:
                warn(
                    f"{paths.output}: dropped a cut-off last line (a write interrupted by a kill or a full disk); it is rerun"
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
            self.terminal = terminal_failure_keys(
                paths.failures, self.done, retry_terminal_timeouts=settings.retry_terminal_timeouts
            )
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

        materializer = settings.row_materializer()
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
            notice = materializer.override_notice()
            if notice is not None:
                warn(notice)
            self.summary.malformed_lines = report.bad_line_count
            self.summary.malformed_line_numbers = [bad.line_number for bad in report.bad_lines]
            self.summary.input_path = settings.input_jsonl_fpath
            expected = counts["done"] + counts["exhausted"] + counts["run"]  # this shard's rollouts
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
                await self._check_agents(report.agents, materializer.named_agents())
                if settings.write_lock:  # after the stack is known to answer; before any rollout
                    lock = RunLock.compute(await self._stack_config(), settings.input_jsonl_fpath)
                    check_or_write_lock(
                        paths.output,
                        lock,
                        resume=settings.resume_from_cache,
                        force=settings.force_resume,
                        warn=warn,
                    )
                await self._dispatch(counts["run"], failures)
        if settings.resume_from_cache and self.retried_ok:
            compact_failures(paths.failures, self.retried_ok, drop_malformed=False)
        self.summary.results_in_file = scan.rows + self.summary.succeeded
        if self.verbose:
            self._print_summary()
        if not settings.disable_aggregation and self.aggregate is not None:
            self.summary.metrics = await self.aggregate(paths.output)
        elif not settings.disable_aggregation:
            self.summary.metrics = await aggregate_results_file(
                paths.output, paths.aggregate_metrics, self.client, verbose=self.verbose
            )
        if settings.use_wandb or settings.use_mlflow:
            s = self.summary
            counts = {
                "succeeded": s.succeeded,
                "failed": s.failed,
                "malformed_lines": s.malformed_lines,
                "results_in_file": s.results_in_file,
            }
            log_collection(settings, s.metrics, counts, paths.output)
        # Checked once every file is written (NeMo Gym's order): the partial results survive.
        settings.check_completion(expected=expected, results=self.summary.results())
        return self.summary

    async def _stack_config(self) -> Mapping[str, Any]:
        """The running stack's merged config (secrets redacted) from its head server, for the lock;
        nothing (the data file alone is locked) when there is no head server to ask."""
        # A client a test built from ServerClient's spec (NeMo Gym's remote_agent) has no head_url.
        if getattr(self.client, "head_url", None) is None:
            return {}
        try:
            async with self.client.http().get(
                f"{self.client.head_url}/global_config_dict_yaml", headers=auth_headers()
            ) as answer:
                answer.raise_for_status()
                loaded = yaml.safe_load(await answer.text())
        except (aiohttp.ClientError, OSError, yaml.YAMLError) as exc:
            raise ConfigError(
                f"could not read the stack's config from the head server at {self.client.head_url} "
                f"for the run lock: {exc} (+write_lock=false skips the lock)"
            ) from exc
        return loaded if isinstance(loaded, Mapping) else {}

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

    async def _check_agents(self, agents: set[str], named: Mapping[str, str]) -> None:
        """Every agent the rows go to, and every agent the command line names (``named``: agent →
        the argument naming it, such as ``+agent_map.old``), is registered with the head server;
        else a ConfigError naming it and the argument. A NeMo Gym-style client (a helper's
        ``setup_server_client`` override) has no registry to ask: nothing is checked."""
        if not callable(getattr(self.client, "resolve", None)):
            return
        for agent in sorted(agents | set(named)):
            try:
                await self.client.resolve(agent)
            except ServerCallError as exc:
                if exc.kind == NOT_FOUND:
                    message = await self._unknown_agent_message(agent)
                    if agent in named:
                        message = f"{named[agent]}: {message}"
                    raise ConfigError(message) from exc
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
                outcome = await self.run_one(row, settings.agent_name, settings.rollout_timeout_s)
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
            if ROLLOUT_ID_KEY in row:  # the id its calls carried; agents leave it out of their answers
                out[ROLLOUT_ID_KEY] = row[ROLLOUT_ID_KEY]
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
        cls = outcome.failure_class or AGENT_ERROR
        failures.append(
            {
                **row,
                **{  # the answer's own text may echo a key or URL too
                    k: redact_text(v) if isinstance(v, str) else v
                    for k, v in (outcome.failure_fields or {}).items()
                },
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
