"""code_gen: competitive-programming style code generation, verified by running the tests.

The model answers in text; the last ```python block is run against the row's
``verifier_metadata.unit_tests`` in a confined child process per test case (see
``sandbox.py``). Reward 1.0 when every test passes, else 0.0.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import ConfigDict, ValidationError

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    HTTPError,
    SimpleResourcesServer,
)
from nemo_gym.failure_classes import SANDBOX_FAILED, VERIFIER_TIMEOUT
from nemo_gym.response_items import content_text
from resources_servers.code_gen.judge import UnitTests, extract_python_code, grade
from resources_servers.code_gen.sandbox import CodeSandbox, RunStatus, SandboxLimits

logger = logging.getLogger("nemo_gym.code_gen")


class CodeGenConfig(BaseResourcesServerConfig):
    """Sandbox and grading settings (field names follow NeMo Gym's where it has one)."""

    num_processes: int = 4
    unit_test_timeout_secs: float = 6.0
    wall_time_limit_secs: float | None = None
    memory_limit_mb: int = 1024
    file_size_limit_mb: int = 16
    process_limit: int = 64
    max_output_mb: int = 16
    disk_limit_mb: int = 64
    sandbox_uid: int | Literal["auto", "keep"] = "auto"
    stop_on_first_failure: bool = True
    extra_read_roots: list[str] = []
    require_sandbox_layers: list[str] = []
    sandbox_work_root: str | None = None
    debug: bool = False


class CodeGenVerifyRequest(BaseVerifyRequest):
    """The row's tests live in ``verifier_metadata.unit_tests`` (kept as sent, parsed in verify)."""

    verifier_metadata: dict[str, Any] | None = None


class CodeGenVerifyResponse(BaseVerifyResponse):
    """Diagnostics: the text and code judged, per-test codes, the first failure, and why."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    extracted_model_output: str | None = None
    extracted_model_code: str | None = None
    result: list[bool | int] | None = None
    metadata: dict[str, Any] | None = None
    unit_tests_time_taken: float | None = None
    reason: str = ""


class CodeGenServer(SimpleResourcesServer):
    """Runs the model's program on the row's test cases; 1.0 if all pass."""

    config: CodeGenConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts
    answer_field = "extracted_model_code"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.config
        limits = SandboxLimits(
            cpu_time_s=cfg.unit_test_timeout_secs,
            wall_time_s=cfg.wall_time_limit_secs,
            memory_mb=cfg.memory_limit_mb,
            file_size_mb=cfg.file_size_limit_mb,
            processes=cfg.process_limit,
            max_output_bytes=cfg.max_output_mb * 1024 * 1024,
            disk_mb=cfg.disk_limit_mb,
        )
        self.sandbox = CodeSandbox(
            limits,
            cfg.num_processes,
            work_root=cfg.sandbox_work_root,
            extra_read_roots=cfg.extra_read_roots,
            require=cfg.require_sandbox_layers,
            uid=cfg.sandbox_uid,
        )
        self._layers_logged = False

    async def verify(self, body: CodeGenVerifyRequest) -> CodeGenVerifyResponse:  # type: ignore[override]
        """Extract the last python block, run it on every test case, reward 1.0 if all pass."""
        tests = _unit_tests(body.verifier_metadata)
        if not self._layers_logged:
            self._layers_logged = True
            logger.info("%s: sandbox layers on this machine: %s", self.name, await self.sandbox.probe())
        text = assistant_text(body.response)
        row = body.model_dump()
        if not text.strip():
            return CodeGenVerifyResponse(**row, reward=0.0, reason="the response has no answer text")
        code = extract_python_code(text)
        if code is None:
            return CodeGenVerifyResponse(
                **row,
                reward=0.0,
                extracted_model_output=text,
                reason="no ```python code block in the answer",
            )
        report = await grade(
            self.sandbox, code, tests, stop_on_first_failure=self.config.stop_on_first_failure
        )
        if report.infrastructure is not None:
            # What the machine did is no verdict on the code: the collector files a failure row.
            run = report.infrastructure
            if run.status is RunStatus.STARVED:
                raise HTTPError(
                    504, f"{run.message} (failure_class: {VERIFIER_TIMEOUT})", failure_class=VERIFIER_TIMEOUT
                )
            raise HTTPError(
                502, f"{run.message} (failure_class: {SANDBOX_FAILED})", failure_class=SANDBOX_FAILED
            )
        return CodeGenVerifyResponse(
            **row,
            reward=1.0 if report.passed else 0.0,
            extracted_model_output=text,
            extracted_model_code=code,
            result=report.result,
            metadata=report.metadata,
            unit_tests_time_taken=round(report.time_s, 4),
            reason=report.reason,
        )


def assistant_text(response: dict[str, Any]) -> str:
    """All assistant message text of a response, joined (reasoning items are not included)."""
    parts = [
        content_text(item.get("content"))
        for item in response.get("output") or []
        if item.get("type") == "message" and item.get("role", "assistant") == "assistant"
    ]
    return "".join(parts)


def _unit_tests(verifier_metadata: dict[str, Any] | None) -> UnitTests:
    if not isinstance(verifier_metadata, dict) or "unit_tests" not in verifier_metadata:
        raise HTTPError(
            422, "invalid body: verifier_metadata.unit_tests: field required ({inputs, outputs, fn_name})"
        )
    try:
        return UnitTests.model_validate(verifier_metadata["unit_tests"])
    except (ValidationError, ValueError) as exc:
        raise HTTPError(422, f"invalid body: verifier_metadata.unit_tests: {exc}") from exc


if __name__ == "__main__":
    CodeGenServer.run_webserver()
