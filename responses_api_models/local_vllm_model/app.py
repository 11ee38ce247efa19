"""local_vllm_model: starts a vLLM server itself and serves the Responses API in front of it.

On start it checks the installed vLLM version (:mod:`.vllm_compat`, the one module that knows
vLLM's internals), launches ``vllm serve`` as a child process with the token-ID splice
installed, waits for its ``/health``, and only then binds and registers with the head server.
Requests are handled by ``vllm_model``'s logic in-process (:class:`VLLMModel`), pointed at the
child. The child is stopped with this server; if it dies, this server exits too, so ``ng_run``
reports it.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import os
import signal
import sys
import time
from typing import Any

import aiohttp
from pydantic import Field, model_validator

from nemo_gym.base_responses_api_model import vllm_compat
from nemo_gym.global_config import find_open_port
from nemo_gym.server_utils import default_scheduling
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig, check_on_policy_settings

logger = logging.getLogger(__name__)
_PORT_IN_USE = "address already in use"
_START_ATTEMPTS = 3


def _die_with_parent() -> None:
    # vLLM gets SIGTERM if this server dies, even by SIGKILL, so no GPU process outlives it.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    # The engine is scheduled as any process is, not under this server's SCHED_BATCH.
    default_scheduling()


class LocalVLLMModelConfig(VLLMModelConfig):
    """Config of ``local_vllm_model`` (see README.md); ``vllm_model``'s fields apply as well."""

    model: str = Field(description="hub name or local path of the model vLLM serves")  # type: ignore[assignment]
    vllm_host: str = "127.0.0.1"
    vllm_serve_args: dict[str, Any] = Field(default_factory=dict)
    vllm_env: dict[str, str] = Field(default_factory=dict)
    splice_token_ids: bool = True
    turn_end_token_ids: list[int] | None = None
    startup_timeout_s: float = Field(default=1800.0, gt=0)
    allow_unsupported_vllm_version: bool = False

    @model_validator(mode="after")
    def _check(self) -> LocalVLLMModelConfig:  # replaces VLLMModelConfig's check: no base_url here
        if self.base_url is not None or self.backend_server is not None:
            raise ValueError("local_vllm_model starts its own vLLM; remove base_url / backend_server")
        if self.return_token_id_information:
            check_on_policy_settings(self.extra_body or {}, "extra_body")
            overrides = self.vllm_serve_args.get("override_generation_config") or {}
            check_on_policy_settings(overrides, "vllm_serve_args.override_generation_config")
        return self

    def serve_args(self) -> dict[str, Any]:
        """``vllm_serve_args``, plus ``generation_config: vllm`` when token IDs are on and it is unset.

        By default vLLM applies the model's ``generation_config.json`` sampling defaults (often a
        ``top_k``) to requests that leave them unset, which silently breaks on-policy sampling.
        """
        args = dict(self.vllm_serve_args)
        if self.return_token_id_information:
            args.setdefault("generation_config", "vllm")
        return args


class LocalVLLMModel(VLLMModel):
    """``vllm_model`` over a vLLM child process this server owns."""

    config: LocalVLLMModelConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.vllm_process: asyncio.subprocess.Process | None = None
        self.vllm_url: str | None = None
        self.vllm_log: collections.deque[str] = collections.deque(maxlen=60)

    async def replica_urls(self) -> list[str]:
        """The child vLLM server's ``/v1`` URL."""
        if self.vllm_url is None:
            raise RuntimeError("the vLLM child process is not running")
        return [self.vllm_url + "/v1"]

    async def serve(self, *args: Any, **kwargs: Any) -> None:
        """Start vLLM, wait until healthy, then serve; stop vLLM on the way out."""
        vllm_compat.check_vllm_version(allow_unsupported=self.config.allow_unsupported_vllm_version)
        try:
            await self.start_vllm()
            watcher = asyncio.create_task(self._exit_when_vllm_dies())
            try:
                await super().serve(*args, **kwargs)
            finally:
                watcher.cancel()
        finally:
            await self.stop_vllm()

    async def start_vllm(self) -> None:
        """Launch ``vllm serve`` and wait for ``/health``; retries on a port taken meanwhile."""
        config = self.config
        for attempt in range(_START_ATTEMPTS):
            # vLLM binds its own port, so a free one is picked here; if another process takes
            # it first, vLLM exits with "address already in use" and a new port is tried.
            port = find_open_port(config.vllm_host)
            command = vllm_compat.vllm_serve_command(
                config.model,
                host=config.vllm_host,
                port=port,
                serve_args=config.serve_args(),
                splice=config.splice_token_ids,
                turn_end_token_ids=config.turn_end_token_ids,
                allow_unsupported=config.allow_unsupported_vllm_version,
            )
            env = {**os.environ, **config.vllm_env}
            self.vllm_log.clear()
            self.vllm_process = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
            pump = asyncio.create_task(self._pump_log(self.vllm_process))
            url = f"http://{config.vllm_host}:{port}"
            if await self._wait_healthy(url):
                self.vllm_url = url
                return
            await pump
            tail = "\n".join(self.vllm_log)
            if _PORT_IN_USE in tail.lower() and attempt + 1 < _START_ATTEMPTS:
                continue
            raise RuntimeError(
                f"{self.name}: vLLM exited with code {self.vllm_process.returncode} before becoming healthy; "
                f"last log lines:\n{tail}"
            )

    async def _wait_healthy(self, url: str) -> bool:
        """True once ``GET /health`` answers 200; False if the process exits first."""
        assert self.vllm_process is not None
        deadline = time.monotonic() + self.config.startup_timeout_s
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self.vllm_process.returncode is not None:
                    return False
                try:
                    async with http.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        if resp.status == 200:
                            return True
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(1.0)
        await self.stop_vllm()
        raise TimeoutError(
            f"{self.name}: vLLM did not answer GET /health within startup_timeout_s={self.config.startup_timeout_s:g}"
        )

    async def _pump_log(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while line := await process.stdout.readline():
            text = line.decode(errors="replace").rstrip()
            self.vllm_log.append(text)
            sys.stderr.write(f"[vllm] {text}\n")

    async def _exit_when_vllm_dies(self) -> None:
        assert self.vllm_process is not None
        code = await self.vllm_process.wait()
        logger.error("%s: the vLLM child process exited with code %s; stopping", self.name, code)
        uvicorn_server = getattr(self, "uvicorn_server", None)
        if uvicorn_server is not None:
            uvicorn_server.should_exit = True

    async def stop_vllm(self, grace_s: float = 30.0) -> None:
        """SIGTERM the vLLM process group, SIGKILL after ``grace_s``."""
        process = self.vllm_process
        if process is None or process.returncode is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                await asyncio.wait_for(process.wait(), wait_s)
                return
            except TimeoutError:
                continue


if __name__ == "__main__":
    LocalVLLMModel.run_webserver()
