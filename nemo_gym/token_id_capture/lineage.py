"""NeMo Gym's lineage stores (which captured call a request continues): not implemented here."""

from __future__ import annotations

from nemo_gym.token_id_capture.config import CaptureComponent


class InMemoryLineageStore(CaptureComponent):
    """NeMo Gym's per-process lineage index (refuses every use: see :mod:`nemo_gym.token_id_capture`)."""


class FileLineageStore(CaptureComponent):
    """NeMo Gym's file-backed lineage index (refuses every use: see :mod:`nemo_gym.token_id_capture`)."""
