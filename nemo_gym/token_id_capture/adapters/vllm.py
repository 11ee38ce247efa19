"""NeMo Gym's vLLM adapter for staged token capture: not implemented here."""

from __future__ import annotations

from nemo_gym.token_id_capture.config import CaptureComponent


class VLLMCaptureAdapter(CaptureComponent):
    """NeMo Gym's vLLM worker capture adapter (refuses every use: see :mod:`nemo_gym.token_id_capture`)."""
