"""NeMo Gym's hook for inference workers that stage captured tokens themselves (not served here).

A model adapter asks :func:`make_external_capture_handler` for one only when a run sets
``token_id_capture.external_staging``, which nemo_gym refuses with an explanation.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from nemo_gym.token_id_capture.config import CaptureComponent, unavailable


@runtime_checkable
class ExternalCaptureHandler(Protocol):
    """What a model adapter calls around one engine request when a worker stages its tokens."""

    def prepare_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The engine request with the capture fields the worker reads."""
        ...

    def prepare_response(self, response: dict[str, Any]) -> None:
        """Take the worker's commit coordinates off the engine's answer."""
        ...

    async def finalize_response(self, response: Any) -> None:
        """Commit the served answer to the capture ledger."""
        ...


def make_external_capture_handler(backend: str) -> ExternalCaptureHandler:
    """Refused: external staging is part of the capture ledger nemo_gym does not implement."""
    raise unavailable(f"token_id_capture.external_staging ({backend}) is set")


class VLLMWorkerCaptureHandler(CaptureComponent):
    """NeMo Gym's handler for vLLM workers that stage captured tokens (not implemented here)."""
