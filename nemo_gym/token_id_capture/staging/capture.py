"""NeMo Gym's per-rollout staged token capture: not implemented here."""

from __future__ import annotations

from nemo_gym.token_id_capture.config import CaptureComponent


class RolloutTokenCapture(CaptureComponent):
    """NeMo Gym's staged capture of one rollout (refuses every use: see :mod:`nemo_gym.token_id_capture`)."""
