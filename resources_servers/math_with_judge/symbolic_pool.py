"""Symbolic answer checks with math-verify in killable worker processes, each with a CPU budget.

math-verify's own timeouts use ``SIGALRM``, which only works in a main thread and cannot stop
SymPy stuck in C code, so the server never runs it in-process. A :class:`SymbolicCheckPool` keeps
a few spawned worker processes; each check goes to an idle worker. A check may use ``cpu_s``
seconds of the worker's CPU time (``RLIMIT_CPU``: the kernel stops the worker when it is spent),
so whether a check finishes does not depend on how busy the machine is; a wall-clock deadline
(``wall_s``, far longer) is only a backstop for a worker that stops making progress. A worker
that runs out of either is killed and replaced in the background.

Whose fault it was decides the reason: a check that used up its CPU budget was made to by the
answer it was given (``cpu_budget_exhausted``: the policy's, a verdict of 0), while the
wall-clock backstop (``timeout``) and a worker that died (``worker_died``) are what the machine
did: the caller reports those as failures, never as a score. The event loop only waits on the
workers' pipes, so the server keeps answering while workers grind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import resource
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

logger = logging.getLogger("nemo_gym.math_with_judge")

READY = "ready"
CPU_BUDGET_EXHAUSTED = "cpu_budget_exhausted"
WORKER_DIED = "worker_died"
TIMEOUT = "timeout"
MAX_EXTRACTED_CHARS = 2000


@dataclass(frozen=True)
class SymbolicResult:
    """The outcome of one check.

    ``reason``: ``equivalent``, ``not_equivalent``, ``no_answer`` (nothing extractable in the
    answer), ``bad_expected_answer`` (the expected answer does not parse),
    ``cpu_budget_exhausted`` (the answer made the check use up its CPU seconds: a verdict of
    0), ``error`` (the check raised, or ran out of its memory), ``timeout`` (the wall-clock
    backstop: not a verdict) or ``worker_died`` (the worker was killed from outside or crashed:
    not a verdict).
    """

    reward: float
    extracted_answer: str | None
    reason: str
    detail: str | None = None


def strip_math_delimiters(text: str) -> str:
    r"""``\(x\)`` or ``$x$`` → ``x``: expected answers often carry them, and inside ``\boxed{}`` they break parsing."""
    text = text.strip()
    if text.startswith("\\(") and text.endswith("\\)"):
        text = text[2:-2].strip()
    if len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


def build_checker() -> Any:
    """The check: gold read as LaTeX, prediction as a plain expression or LaTeX.

    Same extraction and comparison as math-verify's ``math_metric`` (max over golds and
    predictions), but with math-verify's own SIGALRM timeouts off: the pool's per-check CPU
    budget governs, so a slow but finishing comparison on a loaded machine is not silently
    scored 0 after math-verify's fixed 5 s of wall time.
    """
    from math_verify.grader import verify
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, parse

    gold_targets = (LatexExtractionConfig(),)
    pred_targets = (ExprExtractionConfig(), LatexExtractionConfig())

    def checker(golds: list[str], predictions: list[str]) -> tuple[float, tuple[list[str], list[str]] | None]:
        extracted_predictions = [parse(p, pred_targets, parsing_timeout=None) for p in predictions]
        extracted_golds = [parse(g, gold_targets, parsing_timeout=None) for g in golds]
        if any(len(g) == 0 for g in extracted_golds):
            raise ValueError(f"no gold answer could be parsed from {golds!r}")
        score = max(
            1.0 if any(verify(g, p, timeout_seconds=None) for g in extracted_golds) else 0.0
            for p in extracted_predictions
        )
        strings = (
            [str(x) for g in extracted_golds for x in g],
            [str(x) for p in extracted_predictions for x in p],
        )
        return score, strings

    return checker


def check_equivalence(
    checker: Any, expected_answer: str, generated: str
) -> tuple[float, str | None, str, str | None]:
    """Run one check in this process: ``(reward, extracted_answer, reason, detail)``.

    The extracted answer is the first prediction that matches a gold form, else the first
    prediction (NeMo Gym's choice, so ``extracted_answer`` compares across).
    """
    from math_verify import grader

    gold = "\\boxed{" + strip_math_delimiters(expected_answer) + "}"
    try:
        score, extracted = checker([gold], [generated])
    except ValueError as exc:  # no gold answer parsed
        return 0.0, None, "bad_expected_answer", str(exc)[:300]
    except BaseException as exc:  # noqa: BLE001 - math-verify's TimeoutException is a BaseException
        return 0.0, None, "error", f"{type(exc).__name__}: {str(exc)[:300]}"
    answer: str | None = None
    if extracted is not None:
        golds, predictions = extracted
        try:
            answer = next(
                (p for p in predictions if any(grader.verify(g, p, timeout_seconds=None) for g in golds)),
                None,
            )
        except BaseException:  # noqa: BLE001 - the string forms can still defeat SymPy
            answer = None
        if answer is None and predictions:
            answer = predictions[0]
    if answer is not None and len(answer) > MAX_EXTRACTED_CHARS:
        answer = answer[:MAX_EXTRACTED_CHARS] + "...[truncated]"
    reward = float(score)
    if reward >= 1.0:
        return reward, answer, "equivalent", None
    return reward, answer, ("not_equivalent" if answer is not None else "no_answer"), None


def cpu_seconds_used() -> float:
    """This process's CPU time so far (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def limit_cpu_from_now(cpu_s: float) -> None:
    """Let this process use ``cpu_s`` more CPU seconds; past that the kernel's SIGXCPU ends it.

    Only the soft limit moves (the hard one stays unlimited, so it can be moved again for the
    next check); SIGXCPU's default action ends the process even inside SymPy's C code.
    """
    soft = math.ceil(cpu_seconds_used() + cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))


def worker_main(conn: Connection, memory_limit_mb: int | None, cpu_s: float | None = None) -> None:
    """A worker process: build the checker, say ready, then answer checks until the pipe closes."""
    if memory_limit_mb:
        limit = memory_limit_mb * 1024 * 1024
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU would otherwise dump core
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    checker = build_checker()
    # One throwaway check before saying ready: math-verify and SymPy import (and, on a fresh
    # install, byte-compile) most of their modules lazily on the first parse, which can take
    # longer than math-verify's own per-parse timeout and would score a right answer 0.
    check_equivalence(checker, "\\frac{1}{2}", "The answer is \\boxed{0.5}")
    conn.send(READY)
    while True:
        try:
            expected_answer, generated = conn.recv()
        except (EOFError, OSError):
            return  # the server closed the pipe or died
        if cpu_s is not None:
            limit_cpu_from_now(cpu_s)
        try:
            result = check_equivalence(checker, expected_answer, generated)
        except MemoryError:
            result = (0.0, None, "error", "the check ran out of memory")
        conn.send(result)


class _Worker:
    def __init__(self, process: Any, conn: Connection) -> None:
        self.process = process
        self.conn = conn

    def signal_kill(self) -> None:
        """SIGKILL the process and close our pipe end (does not wait)."""
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.conn.close()

    def kill(self) -> None:
        """SIGKILL the process and reap it (waits up to a second)."""
        self.signal_kill()
        with contextlib.suppress(Exception):
            self.process.join(1.0)


class SymbolicCheckPool:
    """``size`` worker processes running math-verify; each :meth:`check` may use ``cpu_s`` CPU
    seconds of its worker and ``wall_s`` seconds of wall time (default: ten times ``cpu_s``).

    Workers start on the first check (spawned, not forked: the server process has threads and
    an event loop a fork would copy). Use from one event loop; call :meth:`close` at shutdown.
    """

    def __init__(
        self,
        size: int,
        cpu_s: float,
        memory_limit_mb: int | None = None,
        startup_timeout_s: float = 120.0,
        wall_s: float | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"the symbolic check pool needs at least 1 worker, got {size}")
        if cpu_s <= 0 or (wall_s is not None and wall_s <= 0):
            raise ValueError(f"the symbolic check limits must be > 0 seconds, got {cpu_s} and {wall_s}")
        self.size = size
        self.cpu_s = cpu_s
        self.wall_s = wall_s if wall_s is not None else 10 * cpu_s
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout_s = startup_timeout_s
        self.replaced = 0
        self._context = multiprocessing.get_context("spawn")
        self._idle: asyncio.Queue[_Worker] | None = None
        self._start_lock: asyncio.Lock | None = None
        self._workers: set[_Worker] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False

    async def check(self, expected_answer: str, generated: str) -> SymbolicResult:
        """Whether ``generated`` is equivalent to ``expected_answer``.

        Takes at most ``cpu_s`` of the worker's CPU time (reason ``cpu_budget_exhausted``) and
        ``wall_s`` once a worker has the task (reason ``timeout``). A worker found dead before it got the
        task (killed from outside while idle) is replaced and the task goes to another.
        """
        idle = await self._started()
        while True:
            worker = await idle.get()
            try:
                worker.conn.send((expected_answer, generated))
            except (OSError, ValueError):
                self._replace(worker)
                continue
            break
        keep = False
        try:
            try:
                payload = await self._receive(worker, self.wall_s)
            except TimeoutError:
                return SymbolicResult(
                    0.0, None, TIMEOUT, f"no result within {self.wall_s:g}s of wall time; worker killed"
                )
            except (EOFError, OSError) as exc:
                await asyncio.to_thread(worker.process.join, 2.0)  # its exit code says why
                code = worker.process.exitcode
                if code == -signal.SIGXCPU:
                    return SymbolicResult(
                        0.0, None, CPU_BUDGET_EXHAUSTED, f"the check used up its {self.cpu_s:g} CPU seconds"
                    )
                return SymbolicResult(0.0, None, WORKER_DIED, f"worker died (exit code {code}): {exc!r}")
            keep = True
            return SymbolicResult(*payload)
        finally:
            if keep:
                idle.put_nowait(worker)
            else:
                self._replace(worker)  # timed out, died, or the request was cancelled mid-check

    async def close(self) -> None:
        """Kill every worker and stop replacing them."""
        self._closed = True
        for task in list(self._background):
            task.cancel()
        await asyncio.to_thread(self.close_now)

    def close_now(self) -> None:
        """Kill every worker, blocking (for callers without an event loop)."""
        self._closed = True
        workers, self._workers = list(self._workers), set()
        for worker in workers:
            worker.kill()

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the live workers."""
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    # ---- internals -----------------------------------------------------------------------
    async def _started(self) -> asyncio.Queue[_Worker]:
        if self._closed:
            raise RuntimeError("the symbolic check pool is closed")
        if self._idle is not None:
            return self._idle
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._idle is None:
                workers = await asyncio.gather(*(self._spawn() for _ in range(self.size)))
                idle: asyncio.Queue[_Worker] = asyncio.Queue()
                for worker in workers:
                    idle.put_nowait(worker)
                self._idle = idle
        return self._idle

    async def _spawn(self) -> _Worker:
        parent, child = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=worker_main,
            args=(child, self.memory_limit_mb, self.cpu_s),
            daemon=True,
            name="math-verify-worker",
        )
        await asyncio.to_thread(process.start)
        child.close()  # the worker holds its end; ours must close so the worker's death reads as EOF
        worker = _Worker(process, parent)
        self._workers.add(worker)
        try:
            message = await self._receive(worker, self.startup_timeout_s)
        except (TimeoutError, EOFError, OSError) as exc:
            self._workers.discard(worker)
            await asyncio.to_thread(worker.kill)
            raise RuntimeError(f"a math-verify worker failed to start: {exc!r}") from exc
        if message != READY:
            self._workers.discard(worker)
            await asyncio.to_thread(worker.kill)
            raise RuntimeError(f"a math-verify worker sent {message!r} instead of {READY!r}")
        return worker

    @staticmethod
    async def _receive(worker: _Worker, timeout_s: float) -> Any:
        """The worker's next message; waits on its pipe without blocking the event loop."""
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        fd = worker.conn.fileno()

        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, on_readable)
        try:
            await asyncio.wait_for(readable, timeout_s)
        finally:
            loop.remove_reader(fd)
        return worker.conn.recv()  # the message is small and already arriving; EOFError if it died

    def _replace(self, worker: _Worker) -> None:
        self._workers.discard(worker)
        worker.signal_kill()
        self.replaced += 1
        task = asyncio.get_running_loop().create_task(self._refill(worker))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _refill(self, dead: _Worker) -> None:
        await asyncio.to_thread(dead.process.join, 5.0)  # reap it off the event loop
        delay = 0.5
        while not self._closed:
            try:
                worker = await self._spawn()
            except RuntimeError:
                logger.exception("could not replace a math-verify worker; retrying in %.1fs", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if self._closed:
                await asyncio.to_thread(worker.kill)
                return
            assert self._idle is not None
            self._idle.put_nowait(worker)
            return
