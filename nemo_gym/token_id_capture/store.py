"""NeMo Gym's file store of captured token entries: not implemented here."""

from __future__ import annotations

from nemo_gym.token_id_capture.config import CaptureComponent


class TokenCaptureStore(CaptureComponent):
    """NeMo Gym's local token sink and source (refuses every use: see :mod:`nemo_gym.token_id_capture`)."""
