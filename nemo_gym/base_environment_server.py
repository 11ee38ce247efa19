"""NeMo Gym's ``nemo_gym.base_environment_server`` (a contract environments subclass, implemented
here): a server running one typed episode per ``/run`` call, with admission limits, an episode deadline and bounded cleanup.

An environment server answers ``/run`` with a :class:`~nemo_gym.episode_types.BaseEpisodeResponse`
for a :class:`~nemo_gym.episode_types.BaseEpisodeRequest`. Subclasses set ``request_model`` and
``response_model`` and implement :meth:`BaseEnvironmentServer.run` and
:meth:`BaseEnvironmentServer.aggregate_metrics`; the base bounds how many episodes run at once
(``max_concurrent_episodes``, waiting at most ``queue_timeout_seconds``), how long one may take
(``default_episode_timeout_seconds``) and how long its cleanup callbacks may take
(``cleanup_timeout_seconds``). A failure becomes the response's ``failure``; only a
cancellation propagates. Built on this package's server base (``SimpleServer``) and rollout
correlation (every call an episode makes carries its attempt's rollout id).
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Self, TypeVar

from pydantic import ConfigDict, PositiveFloat, PositiveInt, model_validator

from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse, EpisodeFailure, EpisodeId
from nemo_gym.rollout_correlation import rollout_context
from nemo_gym.serving.server import BaseServer, BaseServerConfig

LOGGER = logging.getLogger(__name__)

EpisodeRequestT = TypeVar("EpisodeRequestT", bound=BaseEpisodeRequest[Any])
EpisodeResponseT = TypeVar("EpisodeResponseT", bound=BaseEpisodeResponse[Any])
CleanupCallback = Callable[[], Awaitable[None]]


class BaseEnvironmentServerConfig(BaseServerConfig):
    """An environment server's limits; unknown fields are a config error."""

    model_config = ConfigDict(extra="forbid")

    max_concurrent_episodes: PositiveInt | None = None
    queue_timeout_seconds: PositiveFloat | None = None
    default_episode_timeout_seconds: PositiveFloat | None = None
    cleanup_timeout_seconds: PositiveFloat

    @model_validator(mode="after")
    def _queue_timeout_with_a_limit(self) -> Self:
        if self.max_concurrent_episodes is not None and self.queue_timeout_seconds is None:
            raise ValueError("queue_timeout_seconds is required when max_concurrent_episodes is set")
        return self


@dataclass
class _Cleanup:
    name: str
    callback: CleanupCallback
    done: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def close(self) -> None:
        async with self.lock:
            if not self.done:
                await self.callback()
                self.done = True


@dataclass
class CleanupHandle:
    """Closes one registered callback early (at most once), within ``timeout_seconds``."""

    entry: _Cleanup
    timeout_seconds: float

    async def close(self) -> None:
        """Run the callback now unless it already ran."""
        async with asyncio.timeout(self.timeout_seconds):
            await self.entry.close()


@dataclass
class CleanupContext:
    """An episode's cleanup callbacks: run last-registered first, each at most once, all within
    ``cleanup_timeout_seconds``; a failing callback is logged and the others still run.

    Callbacks live in this process: a crash loses them, so what they release remotely needs
    its own expiry. They must tolerate running after a timed-out attempt that did succeed.
    """

    episode_id: EpisodeId
    cleanup_timeout_seconds: float
    _cleanups: list[_Cleanup] = field(default_factory=list)

    def register_cleanup(self, name: str, callback: CleanupCallback) -> CleanupHandle:
        """Register ``callback`` (an async function of no arguments) to run at the episode's end."""
        entry = _Cleanup(name, callback)
        self._cleanups.append(entry)
        return CleanupHandle(entry, self.cleanup_timeout_seconds)

    async def aclose(self) -> None:
        """Run every callback not yet run, newest first, within the cleanup timeout."""
        try:
            async with asyncio.timeout(self.cleanup_timeout_seconds):
                for entry in reversed(self._cleanups):
                    try:
                        await entry.close()
                    except Exception:
                        LOGGER.exception("episode cleanup %r failed", entry.name)
        except TimeoutError:
            LOGGER.error("episode cleanup timed out: episode_id=%s", self.episode_id)


class HandledEpisodeError(Exception):
    """Raised inside :meth:`BaseEnvironmentServer.run`: the episode ends with this ``failure``."""

    def __init__(self, failure: EpisodeFailure) -> None:
        super().__init__(failure.failure_reason)
        self.failure = failure


class BaseEnvironmentServer(BaseServer, Generic[EpisodeRequestT, EpisodeResponseT]):
    """Serves ``/run`` (one episode) and ``/aggregate_metrics`` for a typed episode protocol."""

    server_type: ClassVar[str] = "environment_servers"
    plain_bodies: ClassVar[bool] = False
    config: BaseEnvironmentServerConfig
    request_model: ClassVar[type[Any]]
    response_model: ClassVar[type[Any]]

    def _admission(self) -> asyncio.Semaphore | None:
        limit = self.config.max_concurrent_episodes
        if limit is None:
            return None
        semaphore = self.__dict__.get("_ng_admission")
        if semaphore is None:
            semaphore = asyncio.Semaphore(limit)
            object.__setattr__(self, "_ng_admission", semaphore)
        return semaphore

    def setup_webserver(self) -> Any:
        """A FastAPI app with ``/run`` (body: ``request_model``) and ``/aggregate_metrics``."""
        from fastapi import FastAPI

        app = FastAPI()

        async def run_endpoint(body: Any) -> Any:
            return await self.run_request(body)

        run_endpoint.__annotations__["body"] = self.request_model
        run_endpoint.__annotations__["return"] = self.response_model
        app.post("/run", response_model=self.response_model)(run_endpoint)

        async def aggregate_metrics_endpoint(body: AggregateMetricsRequest) -> AggregateMetrics:
            return await self.aggregate_metrics(body)

        app.post("/aggregate_metrics", response_model=AggregateMetrics)(aggregate_metrics_endpoint)
        return app

    async def run_request(self, request: EpisodeRequestT) -> EpisodeResponseT:
        """Admit, run with the deadline and cleanup, and check the response names this episode."""
        admission = self._admission()
        if admission is not None:
            try:
                await asyncio.wait_for(admission.acquire(), timeout=self.config.queue_timeout_seconds)
            except TimeoutError:
                failure = EpisodeFailure(
                    failure_reason="Episode admission timed out", terminal=False, stage="admission"
                )
                return self.failure_response(request, failure)
        cleanup = CleanupContext(request.episode_id, float(self.config.cleanup_timeout_seconds))
        deadline = asyncio.timeout(self.config.default_episode_timeout_seconds)
        try:
            with rollout_context(request.episode_id.capture_key):
                try:
                    async with deadline:
                        response = await self.run(request, cleanup)
                except TimeoutError as error:
                    response = (
                        self.failure_response(
                            request, EpisodeFailure(failure_reason="Episode timed out", terminal=False)
                        )
                        if deadline.expired()
                        else self._unhandled(request, error)
                    )
                except HandledEpisodeError as error:
                    response = self.failure_response(request, error.failure)
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    response = self._unhandled(request, error)
                finally:
                    # Cleanup runs even when the episode is cancelled: shield it from that.
                    await asyncio.shield(cleanup.aclose())
        finally:
            if admission is not None:
                admission.release()
        response = self.response_model.model_validate(response)
        self.validate_response_identity(request, response)
        return response

    @abstractmethod
    async def run(self, request: EpisodeRequestT, cleanup: CleanupContext) -> EpisodeResponseT:
        """Run one episode of this environment's protocol."""

    @abstractmethod
    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Aggregate per-rollout scores into task-level metrics."""

    def _unhandled(self, request: EpisodeRequestT, error: Exception) -> EpisodeResponseT:
        LOGGER.exception("unhandled environment server error: episode_id=%s", request.episode_id)
        reason = f"Unhandled environment server error: {type(error).__name__}: {error}"
        return self.failure_response(request, EpisodeFailure(failure_reason=reason[:2000], terminal=True))

    def failure_response(self, request: EpisodeRequestT, failure: EpisodeFailure) -> EpisodeResponseT:
        """This episode's response carrying ``failure``."""
        return self.response_model.model_validate(  # type: ignore[no-any-return]
            {
                "episode_id": request.episode_id,
                "task_id": request.task.task_id,
                "failure": failure.model_dump(mode="json"),
            }
        )

    @staticmethod
    def validate_response_identity(request: EpisodeRequestT, response: EpisodeResponseT) -> None:
        """A response must name the request's episode and task."""
        if response.episode_id != request.episode_id:
            raise ValueError("response episode_id does not match request")
        if response.task_id != request.task.task_id:
            raise ValueError("response task_id does not match request")
